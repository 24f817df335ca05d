"""Instructions (valgrind --tool=callgrind, Ir) of the float kernels, before and after a
change: the device runtime of a git revision (`--base`, default HEAD; its device/ tree taken
with git archive) against this checkout's, on CPython (the interpreter running this script)
and on any MicroPython binary given. The work: one train step (forward, backward, AdamW) of
the digits MLP (examples/digits/mlp.onnx, batch 8) and of reference models of the test suite
(tests/reference_models.py): the DS-CNN (conv, BatchNorm, ReLU, global average pooling; and
packed sparse, with 1-bit ReLU masks), LeNet (conv, max pooling), the ResNet block (average
pooling, Add), the Upsample net (Resize nearest and bilinear), the LSTM autoencoder, the GRU
classifier, the tiny transformer (LayerNorm, Softmax, layout, Erf), the keyword classifier
(Gather), the ConvTranspose autoencoder, a mix of the activations and elementwise ops no
reference model has (Mix); and the float kernel families alone (only the train program's
steps of one family, kernels/<family>.py, in the models that use it most). Each figure is
Ir(N runs) - Ir(0 runs), divided by N, so loading and the warm-up step are not counted;
callgrind counts are deterministic, so a change of a few thousand instructions is real. A
fold that costs more than about 0.5 % of a train step is not worth it.

  python bench/float_callgrind.py [--base REV] [--micropython BIN]... [--no-cpython]
                                  [--build DIR] [--only NAME]...

Each line prints the two counts, their ratio (after / before) and whether the checksums of
the arenas' bits after the runs agree ("same bits"): they must, for a change that must not
change a result."""
import argparse
import os
import pathlib
import subprocess
import sys
import tarfile
import tempfile

from int8_callgrind import callgrind

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent
# (model, runs of a train step, {family: runs of that family's steps alone})
WORKLOADS = (
    ("digits_mlp", 5, {"activation": 20}),
    ("ds_cnn_sparse", 2, {"activation": 10}),
    ("mix", 5, {"activation": 20, "elementwise": 20, "norm": 20}),
    ("ds_cnn", 2, {"conv": 2, "norm": 10, "pool": 20}),
    ("lenet", 3, {"pool": 10}),
    ("resnet_block", 2, {"pool": 20}),
    ("upsample_net", 2, {"resize": 10}),
    ("lstm_autoencoder", 2, {"recurrent": 2, "layout": 10, "elementwise": 10}),
    ("imu_gru_classifier", 2, {"recurrent": 2}),
    ("tiny_transformer", 3, {"activation": 10, "layout": 10, "elementwise": 10}),
    ("keyword_classifier", 5, {"gather": 50}),
    ("deconv_autoencoder", 2, {"conv": 2}),
)


class Mix:
    """Built in build() (torch is imported there): the activations and elementwise ops no
    reference model has, a PReLU, Max and Min, Div, Dropout."""

    @staticmethod
    def module():
        import torch
        from torch import nn

        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                torch.manual_seed(21)
                self.a = nn.Linear(16, 24)
                self.prelu = nn.PReLU(24)
                self.b = nn.Linear(24, 24)
                self.c = nn.Linear(24, 4)
                self.drop = nn.Dropout(0.2)

            def forward(self, x):
                h = self.prelu(self.a(x))
                g = torch.maximum(h, self.b(h)) - torch.minimum(h, torch.sigmoid(h))
                g = (nn.functional.leaky_relu(g, 0.1)
                     + nn.functional.softplus(h) * torch.tanh(g) / (1.0 + h * h))
                g = (nn.functional.hardsigmoid(g) + torch.clamp(g, -1.0, 1.0)
                     + nn.functional.hardswish(h))
                return self.c(self.drop(g) + torch.log_softmax(g, dim=1))
        return Net()


def build(out):
    """The artifacts of every workload's model in out/<model> (once)."""
    sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "host"), str(ROOT / "device")]
    for name, _, _ in WORKLOADS:
        directory = out / name
        if (directory / "model.mtb").exists():
            continue
        import torch
        import reference_models
        from microtrain_host import generate_artifacts
        from torch_reference import export
        if name == "digits_mlp":
            generate_artifacts(str(ROOT / "examples" / "digits" / "mlp.onnx"),
                               artifact_directory=str(directory), batch_size=8)
            continue
        if name == "mix":
            generate_artifacts(export(Mix.module(), torch.zeros(8, 16)), loss="CrossEntropyLoss",
                               optimizer="AdamW", artifact_directory=str(directory),
                               batch_size=8)
            continue
        ref = getattr(reference_models, name.replace("_sparse", ""))()
        example = torch.zeros((ref.batch,) + ref.inputs,
                              dtype=torch.int64 if ref.vocabulary else None)
        model = export(ref.module, example)
        options = {}
        if name.endswith("_sparse"):
            # biases and the last block, recomputed: the ReLUs keep 1-bit masks for their
            # gradients (pipeline/moves.py), as tests/test_memory_moves.py packs it
            from microtrain_host.pipeline.sparse import sparse_update
            options = dict(requires_grad=sparse_update(model, True, 1), recompute=True,
                           update_in_backward=True)
        generate_artifacts(model, loss=ref.loss, optimizer="AdamW",
                           artifact_directory=str(directory), batch_size=ref.batch, **options)


def instructions(binary, device, directory, runs, family):
    # PYTHONHASHSEED: CPython's string hashes (and so its dicts' work) the same every run
    env = dict(os.environ, MICROPYPATH=device, PYTHONPATH=device, PYTHONHASHSEED="0")
    args = [str(directory), str(runs)] + ([family] if family else [])
    return callgrind(binary, HERE / "float_workload.py", args, env)


def per_run(binary, device, directory, runs, family):
    """(instructions per run, checksum) of the workload with the device tree `device`."""
    base, _ = instructions(binary, device, directory, 0, family)
    total, checksum = instructions(binary, device, directory, runs, family)
    return (total - base) // runs, checksum


def device_tree(revision, into):
    """The device/ tree of a git revision, unpacked below `into`; its path."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", revision,
                              "device"], capture_output=True, check=True).stdout
    path = pathlib.Path(into) / "archive.tar"
    path.write_bytes(archive)
    with tarfile.open(path) as tar:
        tar.extractall(into)
    return str(pathlib.Path(into) / "device")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", default="HEAD", help="the revision to compare against")
    parser.add_argument("--micropython", action="append", default=[],
                        help="a MicroPython binary to measure as well (repeatable)")
    parser.add_argument("--no-cpython", action="store_true")
    parser.add_argument("--build", default=str(ROOT / ".cache" / "bench-float"))
    parser.add_argument("--only", action="append", help="a model's name (repeatable)")
    options = parser.parse_args()
    binaries = ([] if options.no_cpython else [sys.executable]) + options.micropython
    out = pathlib.Path(options.build)
    build(out)
    after = str(ROOT / "device")
    with tempfile.TemporaryDirectory() as scratch:
        before = device_tree(options.base, scratch)
        print(f"{'runtime':10s} {'workload':36s} {options.base[:12]:>14s} {'working tree':>14s}"
              f"  ratio", flush=True)
        for binary in binaries:
            runtime = "cpython" if binary == sys.executable else os.path.basename(binary)
            for name, runs, families in WORKLOADS:
                if options.only and name not in options.only:
                    continue
                for family, n in [(None, runs)] + sorted(families.items()):
                    old, old_sum = per_run(binary, before, out / name, n, family)
                    new, new_sum = per_run(binary, after, out / name, n, family)
                    what = name + " " + (family or "train step")
                    bits = "same bits" if old_sum == new_sum else "BITS DIFFER"
                    print(f"{runtime:10s} {what:36s} {old:>14,d} {new:>14,d}  "
                          f"{new / old:.4f}  {bits}", flush=True)


if __name__ == "__main__":
    main()
