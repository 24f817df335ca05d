"""The native float module (device/native/float) on float models other than the digits MLP
(tests/test_board_float_native.py, test_board_m4.py): `microtrain deploy` trains each on
the emulated Cortex-M3 with the module it ships there (the armv7m build), with the armv7m
build swapped for the armv6m one (the RP2040's) and with --no-native (the bytecode
kernels), and the three runs leave the same losses and checkpoint bytes. The models reach the kernels the digits MLP does not: a batched MatMul
(batched_gemm) and SGD with momentum, nesterov, weight decay and gradient clipping
(sgd_general and its clip coefficient); AdamW with an L2 penalty and clipping
(adamw_general) behind Tanh and Sigmoid layers the module leaves to bytecode. Needs the M3
firmware (skipped without it, failed when MICROTRAIN_REQUIRE_QEMU=1)."""
import numpy as np
import onnx
import pytest
import torch
from torch import nn

from microtrain_host import generate_artifacts
from microtrain_host.tools import deploy, runtime
from torch_reference import export

M3 = "qemu-mps2-an385"
BATCH, STEPS = 3, 4


class TokenMixer(nn.Module):
    """[batch, 5 tokens, 12 features]: one weight shared by the tokens (a Gemm over all
    tokens), Relu, the tokens mixed by their scaled dot products (h h^T h: two batched
    MatMuls of activations), the mean over tokens, a classifier of 6 classes."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(12, 16) * 0.3)
        self.classifier = nn.Linear(16, 6)

    def forward(self, x):
        h = torch.relu(torch.matmul(x, self.w))
        mixed = torch.matmul(torch.matmul(h, h.transpose(1, 2)) * 0.1, h)
        return self.classifier(mixed.mean(1))


class SquashNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(20, 24), nn.Tanh(), nn.Linear(24, 12),
                                    nn.Sigmoid(), nn.Linear(12, 4))

    def forward(self, x):
        return self.layers(x)


MODELS = {
    "token_mixer": (TokenMixer, (5, 12), 6, "SGD",
                    {"learning_rate": 0.05, "momentum": 0.9, "nesterov": True,
                     "weight_decay": 1e-3, "clip_grad_norm": 1.0}),
    "squash_net": (SquashNet, (20,), 4, "AdamW",
                   {"learning_rate": 0.01, "weight_decay": 0.02, "l2_penalty": 1e-3,
                    "clip_grad_norm": 0.5}),
}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_deploy_with_the_float_module_equals_the_boards_bytecode_run(firmware, tmp_path, name):
    build, inputs, classes, optimizer, options = MODELS[name]
    torch.manual_seed(7)
    path = tmp_path / f"{name}.onnx"
    onnx.save(export(build(), torch.zeros((2,) + inputs)), path)
    artifacts = tmp_path / "build"
    generate_artifacts(str(path), loss="CrossEntropyLoss", optimizer=optimizer,
                       artifact_directory=str(artifacts), batch_size=BATCH,
                       optimizer_options=options)
    rng = np.random.default_rng(3)
    x = rng.standard_normal((STEPS * BATCH,) + inputs).astype(np.float32)
    y = (x.reshape(len(x), -1)[:, :classes].argmax(1)).astype(np.int64)
    np.savez(tmp_path / "data.npz", x_train=x, y_train=y, x_val=x[:BATCH], y_val=y[:BATCH])
    results = {}
    for build in ("armv7m", "armv6m", None):
        plan = deploy.plan(artifacts, M3, steps=STEPS, native=build is not None)
        if build == "armv7m":     # what deploy ships to the M3
            assert plan.native == {runtime.NATIVE_FLOAT_MODULE: runtime.native_build(
                "armv7m", "float_native")}
        elif build == "armv6m":   # the RP2040's build, which the M3 loads too
            plan.native = {runtime.NATIVE_FLOAT_MODULE: runtime.native_build(
                "armv6m", "float_native")}
        result = deploy.run(plan, tmp_path / "data.npz", firmware=firmware)
        assert len(result.losses) == STEPS
        results[build] = (result.losses, result.checkpoint.read_bytes())
    print(f"\n{name}: losses {results[None][0]}")
    assert results["armv7m"] == results[None]
    assert results["armv6m"] == results[None]
