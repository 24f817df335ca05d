"""Every configuration of scripts/fingerprint_artifacts.py (the digits MLP under several
optimizer settings and a frozen parameter, a layout-op model with the loss outside the graph,
every reference model with SGD and AdamW, the DS-CNN's sparse updates with the memory moves)
and QAT blobs of the digits MLP, LeNet and the DS-CNN: the model's minimal runtime alone
(tools/runtime.py minimal_sources, what deploy ships: the modules it imports, kernels cut to
the ops the blob uses) loads it and trains two steps. A module the runtime leaves out that
some path imports (kept.py's kernels/norm.py for a QAT blob's observers, once) fails here
by name."""
import importlib.util
import os
import subprocess
import sys

import pytest
import torch

import microtrain_host as mh
from conftest import ROOT
from microtrain_host.tools import runtime
from reference_models import ds_cnn, lenet
from torch_reference import export

_spec = importlib.util.spec_from_file_location(
    "fingerprint_artifacts", ROOT / "scripts" / "fingerprint_artifacts.py")
fingerprint = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fingerprint)

# two steps with the minimal runtime first on the path (fingerprint_artifacts' inputs)
TRAIN = """
import sys
# the runtime alone: without the editable install's finder (pip install -e), a module the
# runtime leaves out would be found in that install's device package instead of failing
sys.meta_path[:] = [f for f in sys.meta_path
                    if not getattr(f, "__module__", "").startswith("__editable__")]
import numpy as np
import microtrain
from microtrain import CheckpointState, Module, Optimizer
assert microtrain.__file__.startswith(sys.argv[3]), microtrain.__file__
import fingerprint_artifacts as fa      # (puts device/ on the path: after the runtime's)
directory, vocabulary = sys.argv[1], int(sys.argv[2])
state = CheckpointState.load_checkpoint(directory + "/checkpoint")
module = Module(directory + "/model.mtb", state)
optimizer = Optimizer(directory + "/model.mtb", module)
rng = np.random.default_rng(0)
for step in range(2):
    inputs = fa._inputs(module, module._train or module._forward, rng, vocabulary)
    if module._forward is not None:
        outputs = module.forward(*inputs)
        outputs = outputs if isinstance(outputs, list) else [outputs]
        module.backward(*[[0.5 * float(v) for v in out] for out in outputs])
    else:
        module(*inputs)
    optimizer.step()
    module.lazy_reset_grad()
print("trained")
"""


def _cases():
    yield from fingerprint.cases()
    yield ("digits-qat", str(ROOT / "examples" / "digits" / "mlp.onnx"),
           dict(batch_size=8, quantization=True), 0)
    for build in (lenet, ds_cnn):
        ref = build()
        yield (f"{ref.name}-qat", export(ref.module, torch.zeros((ref.batch,) + ref.inputs)),
               dict(batch_size=ref.batch, loss=ref.loss, quantization=True), 0)


CASES = list(_cases())


@pytest.mark.parametrize("name,model,options,vocabulary", CASES, ids=[c[0] for c in CASES])
def test_the_minimal_runtime_alone_trains_the_model(name, model, options, vocabulary,
                                                    tmp_path):
    build = tmp_path / "build"
    mh.generate_artifacts(model, artifact_directory=str(build), **options)
    rt = runtime.write_sources(runtime.minimal_sources(build / "model.mtb"), tmp_path / "rt")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(rt), str(ROOT / "host"), str(ROOT / "scripts"), str(ROOT / "tests")]))
    proc = subprocess.run([sys.executable, "-c", TRAIN, str(build), str(vocabulary), str(rt)],
                          capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0 and proc.stdout.split()[-1:] == ["trained"], \
        proc.stderr[-3000:]
