"""microtrain/moduleextra.py (Module's methods a training loop does not call: the reload
Module.load_checkpoint, input_names, output_names) ships with the digits MLP's minimal
runtime, bundled as deploy ships it to a board's files, and is imported only when one of
them is called: a training run (train, save) on the MicroPython Unix port leaves it out of
sys.modules, the reload then imports it and gives the same state back."""
import os
import subprocess

from conftest import ROOT
from microtrain_host.cli import main
from microtrain_host.tools import runtime

SCRIPT = """
import sys
from array import array
from microtrain import CheckpointState, Module, Optimizer
d = sys.argv[1]
state = CheckpointState.load_checkpoint(d + "/checkpoint")
module = Module(d + "/model.mtb", state)
optimizer = Optimizer(d + "/model.mtb", module)
x = array("f", [((i * 7) % 17) / 17.0 for i in range(8 * 64)])
y = array("i", [i % 10 for i in range(8)])
print("loss", module(x, y))
optimizer.step()
module.lazy_reset_grad()
CheckpointState.save_checkpoint(state, d + "/saved", include_optimizer_state=True)
print("after training", "microtrain.moduleextra" in sys.modules)
again = module.load_checkpoint(d + "/saved")
print("after reload", "microtrain.moduleextra" in sys.modules, again is module.state)
print("inputs", " ".join(module.input_names()), "outputs", " ".join(module.output_names()))
print("loss", module(x, y))
"""


def test_moduleextra_is_imported_only_by_a_reload(micropython, tmp_path):
    build = tmp_path / "build"
    assert main(["pack", str(ROOT / "examples" / "digits" / "mlp.onnx"), "-o", str(build),
                 "--batch-size", "8", "--optimizer", "adamw"]) == 0
    sources = runtime.minimal_sources(build / "model.mtb", bundled=True)
    assert "microtrain/moduleextra.py" in sources
    # the reload's body is not in the bundle a training run imports
    assert "old.is_nominal = True" in sources["microtrain/moduleextra.py"]
    assert "old.is_nominal = True" not in sources["microtrain/_core.py"]
    rt = runtime.write_sources(sources, tmp_path / "rt")
    (tmp_path / "run.py").write_text(SCRIPT)
    proc = subprocess.run([micropython, "-X", "heapsize=4M", str(tmp_path / "run.py"),
                           str(build)], capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, MICROPYPATH=str(rt)))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.split("\n")
    assert lines[1] == "after training False"
    assert lines[2] == "after reload True True"
    assert lines[3].startswith("inputs ") and " outputs " in lines[3]
    # the reloaded state is the saved one: the same batch trains from it (a finite loss)
    first, second = float(lines[0].split()[1]), float(lines[4].split()[1])
    assert second == second and second != first
