"""Instructions (valgrind --tool=callgrind, Ir) of the integer kernels on the MicroPython Unix
port: the KWS DS-CNN (examples/kws, calibrated on two batches) in int8, one forward, and one
integer train step of three configurations: "block" (classifier + last 1x1 conv:
kernels/inttrain.py), "sparse" (every bias + the last block: kernels/intgrad.py),
"momentum" (classifier with SGD momentum). Each figure is Ir(N runs) - Ir(0 runs), divided
by N, so loading the blob is not counted; callgrind counts are deterministic, so a change of
a few thousand instructions is real. Measure before and after a change to the viper
kernels (a fold that costs more than about 1 % is not worth it).

  python bench/int8_callgrind.py [--micropython BIN]... [--build DIR] [--pure]

--micropython may be given more than once (e.g. the 64-bit port and a 32-bit build:
make -C ports/unix MICROPY_FORCE_32BIT=1 MICROPY_PY_FFI=0, whose viper code takes the
12-bit limbs of a board); --pure counts the pure-Python kernels instead."""
import argparse
import os
import pathlib
import re
import subprocess
import sys

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent
WORKLOADS = (("infer", 5), ("train block", 5), ("train sparse", 3), ("train momentum", 5))
CONFIGS = {"block": {"train_conv": True},
           "sparse": {"train_biases": True, "train_conv": True, "train_depthwise": True},
           "momentum": {"momentum": 0.9}}


def build(out):
    """The int8 blob, x.f32 and the three integer-training configurations in out (once)."""
    if (out / "momentum" / "data.bin").exists():
        return
    sys.path[:0] = [str(ROOT / "examples" / "kws"), str(ROOT / "host"), str(ROOT / "device")]
    import numpy as np
    import make_data
    import quantize
    from microtrain_host.quant.inttrain import int8_training_artifacts, quantize_input
    qdq, int8 = quantize.calibrate(out / "backbone", steps=2)
    (out / "int8.mtb").write_bytes(pathlib.Path(int8).read_bytes())
    data = make_data.pretraining_set()
    x, y = data["x_train"], data["y_train"]
    (out / "x.f32").write_bytes(x[:1].astype("<f4").tobytes())
    for name, options in CONFIGS.items():
        info = int8_training_artifacts(qdq, out / name, 0.01, **options)
        m = info["batch_size"]
        (out / name / "data.bin").write_bytes(b"".join(
            quantize_input(x[i:i + m].reshape(-1), info).tobytes()
            + np.asarray(y[i:i + m], "<i4").tobytes() for i in range(0, 4 * m, m)))


def callgrind(binary, script, args, env):
    """(instructions, the last word printed) of `binary script args...` under callgrind
    (also bench/float_callgrind.py's)."""
    proc = subprocess.run(["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null",
                           binary, str(script)] + args, capture_output=True, text=True, env=env)
    found = re.search(r"Collected : (\d+)", proc.stderr)
    if proc.returncode != 0 or not found:
        raise SystemExit(f"{binary} {' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}")
    return int(found.group(1)), proc.stdout.split()[-1]


def instructions(binary, out, words, runs, pure):
    env = dict(os.environ, MICROPYPATH=str(ROOT / "device"))
    args = [str(out)] + words.split() + [str(runs)] + (["pure"] if pure else [])
    return callgrind(binary, HERE / "int8_workload.py", args, env)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--micropython", action="append")
    parser.add_argument("--build", default=str(ROOT / ".cache" / "bench-int8"))
    parser.add_argument("--pure", action="store_true")
    options = parser.parse_args()
    binaries = options.micropython or [os.environ.get("MICROTRAIN_MICROPYTHON")
                                       or str(ROOT / ".cache" / "micropython" / "micropython")]
    out = pathlib.Path(options.build)
    build(out)
    for binary in binaries:
        for words, runs in WORKLOADS:
            base, _ = instructions(binary, out, words, 0, options.pure)
            total, checksum = instructions(binary, out, words, runs, options.pure)
            print(f"{os.path.basename(binary):14s} {words:15s} {(total - base) // runs:>13,d} "
                  f"instructions per run (checksum {checksum})", flush=True)


if __name__ == "__main__":
    main()
