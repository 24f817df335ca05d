"""The Unix port with the device package frozen in (scripts/build_micropython_frozen.sh): it
imports microtrain from the binary, its cache is rebuilt when a device module changes, and
a training step then needs less heap than with the bytecode in the heap (scripts/
measure_heap.py bisects -X heapsize)."""
import os
import shutil
import subprocess
import sys

import pytest
import torch

import microtrain_host as mh
from conftest import ROOT
from torch_reference import export, make_batches, mlp

sys.path.insert(0, str(ROOT / "scripts"))
import measure_heap  # noqa: E402

SCRIPT = ROOT / "scripts" / "build_micropython_frozen.sh"
PERSONALISE = ROOT / "examples" / "kws" / "personalise_device.py"


@pytest.fixture(scope="module")
def frozen(micropython):
    """The frozen build (built on first use, about a minute; cached in .cache/)."""
    sources = list((ROOT / ".cache" / "micropython" / "src").glob("micropython_*.orig.tar.*"))
    if not sources and os.environ.get("MICROTRAIN_REQUIRE_MICROPYTHON") != "1":
        pytest.skip("MicroPython's source package is not in .cache/: run "
                    "scripts/build_micropython.sh")
    proc = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip().splitlines()[-1]


def run(binary, code, tmp_path, path=None):
    env = {"PATH": "/usr/bin:/bin"}
    if path:
        env["MICROPYPATH"] = str(path)
    return subprocess.run([binary, "-c", code], capture_output=True, text=True, env=env,
                          cwd=tmp_path)


def test_frozen_interpreter_imports_microtrain_from_the_binary(frozen, micropython, tmp_path):
    code = "import microtrain, sys; print(microtrain.__version__, '.frozen' in sys.path)"
    out = run(frozen, code, tmp_path)
    assert out.returncode == 0 and out.stdout.split() == ["0.1.0", "True"], out.stderr
    plain = run(micropython, "import microtrain", tmp_path)
    assert plain.returncode != 0 and "microtrain" in plain.stderr   # not frozen there


def test_viper_int8_kernels_are_frozen_and_used(frozen, tmp_path):
    # qlinear.py and inttrain.py fall back to their pure-Python kernels when their viper module
    # cannot be imported: the frozen build must carry those (machine code) and use them.
    code = ("from microtrain.kernels import qlinear, qlinear_viper, inttrain, inttrain_viper\n"
            "print(qlinear.FAST, qlinear.qlinear_conv is qlinear_viper.qlinear_conv,"
            " qlinear.qlinear_gemm is qlinear_viper.qlinear_gemm, inttrain.FAST,"
            " inttrain.int_gemm_update is inttrain_viper.int_gemm_update)")
    out = run(frozen, code, tmp_path)
    assert out.returncode == 0 and out.stdout.split() == ["True"] * 5, out.stderr
    manifest = (ROOT / ".cache" / "micropython-frozen" / "manifest.py").read_text()
    assert '"microtrain/kernels/qlinear_viper.py",' in manifest
    assert '"microtrain/kernels/inttrain_viper.py",' in manifest


def test_cache_key_follows_every_device_module(tmp_path):
    # A copy of the parts the key reads, with a stand-in source tarball: no build needed.
    for part in ("scripts", "device"):
        shutil.copytree(ROOT / part, tmp_path / part,
                        ignore=shutil.ignore_patterns("__pycache__"))
    src = tmp_path / ".cache" / "micropython" / "src"
    src.mkdir(parents=True)
    (src / "micropython_1.25.0+ds.orig.tar.xz").write_bytes(b"stand-in")
    script = tmp_path / "scripts" / "build_micropython_frozen.sh"

    def key():
        out = subprocess.run(["bash", str(script), "--key"], capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        return out.stdout.strip()
    first = key()
    assert key() == first
    module = tmp_path / "device" / "microtrain" / "kernels" / "dense.py"
    module.write_text(module.read_text() + "\n# changed\n")
    second = key()
    assert second != first
    (tmp_path / "device" / "microtrain" / "kernels" / "extra.py").write_text("X = 1\n")
    assert key() != second


def test_a_training_run_needs_less_heap_frozen(frozen, tmp_path):
    # The digits-sized MLP at batch 1, run by the KWS example's device script (load, accuracy,
    # two epochs of SGD, accuracy, save: what a board does), data streamed from raw files.
    model = mlp(64, 10, hidden=(32,), activations=("Relu",))
    mh.generate_artifacts(export(model, torch.zeros(1, 64)), loss="CrossEntropyLoss",
                          optimizer="SGD", artifact_directory=tmp_path, batch_size=1)
    for part, n in (("train", 6), ("test", 4)):
        xs, ys = make_batches("CrossEntropyLoss", n, 1, 64, 10, seed=n)
        (tmp_path / f"x_{part}.f32").write_bytes(xs.astype("<f4").tobytes())
        (tmp_path / f"y_{part}.i32").write_bytes(ys.astype("<i4").tobytes())
    args = [str(tmp_path), "2", "0.01"]
    heap_frozen, out = measure_heap.needed_heap(PERSONALISE, args, frozen=True, low=4096,
                                                high=1024 * 1024, resolution=512)
    heap_files, out_files = measure_heap.needed_heap(PERSONALISE, args, frozen=False,
                                                     low=4096, high=1024 * 1024,
                                                     resolution=512)
    assert heap_frozen is not None and heap_files is not None
    assert out.split("peak")[0] == out_files.split("peak")[0]   # the same run
    # The runtime's bytecode (about 100 KB here) no longer takes heap.
    assert heap_frozen + 50 * 1024 < heap_files, (heap_frozen, heap_files)
    live = int(out.split("peak heap")[1])
    assert 0 < live < heap_frozen   # the largest live heap fits in what the run needs
    code, _ = measure_heap.run(measure_heap.interpreter(True), heap_frozen - 2048, PERSONALISE,
                               args, True, 120)
    assert code != 0    # the bisection's answer is tight: less does not run
