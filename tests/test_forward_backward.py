"""Module.forward / Module.backward: training with a loss computed outside the graph (the
TrainingAgent style of onnxcustom). A model packed with loss=None whose output is not a
scalar gets forward and backward programs; backward takes d loss / d output.

Oracles: torch autograd (float64) for the outputs and parameter gradients of an external
Huber loss, torch.optim.SGD for a short training run, and the device's own __call__ with an
in-graph MSE loss, itself checked against torch in test_parity.py."""
import subprocess
import sys
from array import array

import numpy as np
import pytest
import torch

import microtrain_host as mh
from conftest import ROOT, run_micropython
from microtrain import CheckpointState, InputError, Module, Optimizer, TrainingError
from microtrain import parser as device_blob_parser
from test_memory import assert_steps_do_not_grow_the_heap
from test_ops import relative_error
from torch_reference import export, mlp

BATCH, N_IN, N_OUT = 6, 7, 3
GRAD_TOLERANCE = 1e-4


def pack(tmp_path, net, loss=None, optimizer="SGD", **kwargs):
    return mh.generate_artifacts(export(net, torch.zeros(2, N_IN)), loss=loss, optimizer=optimizer,
                                 artifact_directory=tmp_path, batch_size=BATCH, **kwargs)


def load(artifacts):
    state = CheckpointState.load_checkpoint(artifacts.checkpoint)
    module = Module(artifacts.blob, state)
    return state, module, Optimizer(artifacts.blob, module)


def batches(steps, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((steps, BATCH, N_IN)).astype(np.float32),
            2 * rng.standard_normal((steps, BATCH, N_OUT)).astype(np.float32))


def huber_grad(outputs, target):
    """d huber_loss(outputs, target) / d outputs, computed by torch (the external loss)."""
    out = torch.tensor(np.asarray(outputs, np.float64).reshape(target.shape), requires_grad=True)
    loss = torch.nn.functional.huber_loss(out, torch.tensor(target, dtype=torch.float64))
    return torch.autograd.grad(loss, out)[0].numpy()


def grads_of(state, net):
    return {name: np.array(state.parameters[name].grad) for name, _ in net.named_parameters()}


def test_blob_has_forward_and_backward_programs(tmp_path):
    artifacts = pack(tmp_path, mlp(N_IN, N_OUT))
    b = device_blob_parser.load(artifacts.blob)
    assert "train" not in b.programs
    forward, backward = b.programs["forward"], b.programs["backward"]
    assert [b.names[t] for t in forward.inputs] == ["input"]
    assert [b.names[t] for t in forward.outputs] == ["output"]
    assert [b.names[t] for t in backward.inputs] == ["output_grad"]
    assert backward.outputs == []


def test_huber_gradients_match_torch(tmp_path):
    net = mlp(N_IN, N_OUT)
    state, module, _ = load(pack(tmp_path, net))
    xs, ys = batches(1)
    outputs = module.forward(xs[0].reshape(-1))
    net64 = net.double()
    expected = net64(torch.from_numpy(xs[0]).double())
    assert relative_error(outputs, expected.detach().numpy()) <= 1e-5
    module.backward(array("f", huber_grad(outputs, ys[0]).reshape(-1)))
    torch.nn.functional.huber_loss(expected, torch.from_numpy(ys[0]).double()).backward()
    device = grads_of(state, net64)
    for name, p in net64.named_parameters():
        assert relative_error(device[name], p.grad.numpy()) <= GRAD_TOLERANCE, name


def test_batch_norm_model_gradients_match_torch(tmp_path):
    # Training-mode forward (batch statistics) kept alive for backward.
    torch.manual_seed(3)
    net = torch.nn.Sequential(torch.nn.Linear(N_IN, 8), torch.nn.BatchNorm1d(8), torch.nn.Tanh(),
                              torch.nn.Linear(8, N_OUT))
    state, module, _ = load(pack(tmp_path, net))
    xs, ys = batches(1, seed=5)
    outputs = module.forward(xs[0].reshape(-1))
    net64 = net.double().train()
    expected = net64(torch.from_numpy(xs[0]).double())
    assert relative_error(outputs, expected.detach().numpy()) <= 1e-5
    module.backward(huber_grad(outputs, ys[0]).reshape(-1))
    torch.nn.functional.huber_loss(expected, torch.from_numpy(ys[0]).double()).backward()
    device = grads_of(state, net64)
    for name, p in net64.named_parameters():
        assert relative_error(device[name], p.grad.numpy()) <= GRAD_TOLERANCE, name


class TwoHeads(torch.nn.Module):
    """Two outputs of the same shape from a shared trunk: a swap of their gradients would
    not be caught by a length check."""

    def __init__(self, seed=11):
        super().__init__()
        torch.manual_seed(seed)
        self.trunk = torch.nn.Linear(N_IN, 8)
        self.head_a = torch.nn.Linear(8, N_OUT)
        self.head_b = torch.nn.Linear(8, N_OUT)

    def forward(self, x):
        h = torch.tanh(self.trunk(x))
        return self.head_a(h), torch.sigmoid(self.head_b(h)) * x[:, :N_OUT]


def test_two_outputs_gradients_match_torch(tmp_path):
    import io
    import onnx
    net = TwoHeads()
    buf = io.BytesIO()
    torch.onnx.export(net, torch.zeros(BATCH, N_IN), buf, input_names=["input"],
                      output_names=["out_a", "out_b"], dynamo=False, opset_version=17,
                      training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False)
    artifacts = mh.generate_artifacts(onnx.load_from_string(buf.getvalue()), loss=None,
                                      optimizer="SGD", artifact_directory=tmp_path,
                                      loss_input_names=["out_a", "out_b"])
    b = device_blob_parser.load(artifacts.blob)
    assert [b.names[t] for t in b.programs["forward"].outputs] == ["out_a", "out_b"]
    assert [b.names[t] for t in b.programs["backward"].inputs] == ["out_a_grad", "out_b_grad"]
    state, module, _ = load(artifacts)
    net64 = net.double()
    xs, ys = batches(2, seed=13)
    for step, (x, y) in enumerate(zip(xs, ys)):
        out_a, out_b = (np.array(v, np.float64) for v in module.forward(x.reshape(-1)))
        expected_a, expected_b = net64(torch.from_numpy(x).double())
        assert relative_error(out_a, expected_a.detach().numpy()) <= 1e-5
        assert relative_error(out_b, expected_b.detach().numpy()) <= 1e-5
        # d loss / d outputs of an external loss of both outputs, from the device's outputs:
        # Huber on out_a, 3 * MSE on out_b (of another scale, so a swap shows).
        d_a = huber_grad(out_a, y)
        d_b = 6.0 * (out_b.reshape(y.shape) - 0.5 * y) / y.size
        module.backward(d_a.reshape(-1), array("f", d_b.reshape(-1)))
        torch.autograd.backward([expected_a, expected_b],
                                [torch.from_numpy(d_a), torch.from_numpy(d_b)])
        device = grads_of(state, net64)
        for name, p in net64.named_parameters():   # step 1: the sum of both steps
            assert relative_error(device[name], p.grad.numpy()) <= GRAD_TOLERANCE, (step, name)
    # Each output's gradient matters: without d_b, head_b gets none.
    module.lazy_reset_grad()
    module.forward(xs[0].reshape(-1))
    module.backward(d_a.reshape(-1), np.zeros(BATCH * N_OUT))
    assert not np.any(grads_of(state, net64)["head_b.weight"])
    assert np.any(grads_of(state, net64)["head_a.weight"])


def test_training_with_sgd_matches_torch(tmp_path):
    net = mlp(N_IN, N_OUT, seed=4)
    state, module, opt = load(pack(tmp_path, net))
    opt.set_learning_rate(0.1)
    reference = mlp(N_IN, N_OUT, seed=4).double()
    torch_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    xs, ys = batches(5, seed=2)
    for x, y in zip(xs, ys):
        outputs = module.forward(x.reshape(-1))
        module.backward(huber_grad(outputs, y).reshape(-1))
        opt.step()
        module.lazy_reset_grad()
        torch_opt.zero_grad()
        torch.nn.functional.huber_loss(reference(torch.from_numpy(x).double()),
                                       torch.from_numpy(y).double()).backward()
        torch_opt.step()
    for name, p in reference.named_parameters():
        assert relative_error(state.parameters[name].data, p.detach().numpy()) <= GRAD_TOLERANCE


def test_gradients_accumulate_until_lazy_reset_grad(tmp_path):
    net = mlp(N_IN, N_OUT, seed=6)
    state, module, _ = load(pack(tmp_path, net))
    xs, ys = batches(3, seed=3)
    net64 = net.double()
    for x, y in zip(xs[:2], ys[:2]):          # summed, as torch sums .grad across backwards
        module.backward(huber_grad(module.forward(x.reshape(-1)), y).reshape(-1))
        torch.nn.functional.huber_loss(net64(torch.from_numpy(x).double()),
                                       torch.from_numpy(y).double()).backward()
    for name, p in net64.named_parameters():
        assert relative_error(grads_of(state, net64)[name], p.grad.numpy()) <= GRAD_TOLERANCE
    module.lazy_reset_grad()                   # the next backward overwrites
    net64.zero_grad()
    module.backward(huber_grad(module.forward(xs[2].reshape(-1)), ys[2]).reshape(-1))
    torch.nn.functional.huber_loss(net64(torch.from_numpy(xs[2]).double()),
                                   torch.from_numpy(ys[2]).double()).backward()
    for name, p in net64.named_parameters():
        assert relative_error(grads_of(state, net64)[name], p.grad.numpy()) <= GRAD_TOLERANCE


def test_matches_call_with_the_same_loss_in_the_graph(tmp_path):
    # MSE outside the graph (d/d out = 2 (out - y) / n) against MSELoss inside it.
    net = mlp(N_IN, N_OUT, seed=8)
    in_graph = pack(tmp_path / "call", net, loss="MSELoss")
    outside = pack(tmp_path / "fb", net)
    state_a, module_a, opt_a = load(in_graph)
    state_b, module_b, opt_b = load(outside)
    xs, ys = batches(3, seed=9)
    for x, y in zip(xs, ys):
        loss = module_a(x.reshape(-1), y.reshape(-1))
        outputs = np.array(module_b.forward(x.reshape(-1)), np.float64)
        assert abs(np.mean((outputs - y.reshape(-1)) ** 2) - loss) <= 1e-5 * abs(loss)
        module_b.backward(2.0 * (outputs - y.reshape(-1)) / outputs.size)
        for name in state_a.parameters:
            assert relative_error(state_b.parameters[name].grad,
                                  state_a.parameters[name].grad) <= GRAD_TOLERANCE, name
        for opt, module in ((opt_a, module_a), (opt_b, module_b)):
            opt.step()
            module.lazy_reset_grad()


def test_eval_mode_forward_runs_the_eval_program(tmp_path):
    net = mlp(N_IN, N_OUT, seed=1)
    state, module, _ = load(pack(tmp_path, net))
    xs, _ = batches(1)
    outputs = module.eval().forward(xs[0].reshape(-1))
    expected = net.double()(torch.from_numpy(xs[0]).double()).detach().numpy()
    assert relative_error(outputs, expected) <= 1e-5
    with pytest.raises(TrainingError, match="train-mode forward"):
        module.backward(np.zeros(BATCH * N_OUT))


def test_misuse_is_refused(tmp_path):
    state, module, opt = load(pack(tmp_path / "fb", mlp(N_IN, N_OUT)))
    x = np.zeros(BATCH * N_IN)
    with pytest.raises(TrainingError, match="forward"):
        module.backward(np.zeros(BATCH * N_OUT))           # no forward yet
    with pytest.raises(TrainingError, match="outside the graph"):
        module(x)                                           # __call__ has no loss to return
    module.forward(x)
    with pytest.raises(InputError, match="1 inputs"):
        module.backward(np.zeros(BATCH * N_OUT), np.zeros(BATCH * N_OUT))
    with pytest.raises(InputError, match="needs 18 values"):
        module.backward(np.zeros(5))
    module.forward(x)
    opt.step()
    with pytest.raises(TrainingError, match="optimizer step"):
        module.backward(np.zeros(BATCH * N_OUT))            # activations of another step
    _, with_loss, _ = load(pack(tmp_path / "call", mlp(N_IN, N_OUT), loss="MSELoss"))
    with pytest.raises(TrainingError, match="no forward program"):
        with_loss.forward(x)


def scalar_outputs_model():
    """Three outputs of shape [1], like onnx's test_operator_symbolic_override_nested with
    its inputs after the first made parameters: s = x + a + b, n = -x, m = -a."""
    from onnx import TensorProto, helper, numpy_helper
    graph = helper.make_graph(
        [helper.make_node("Sum", ["x", "a", "b"], ["s"]), helper.make_node("Neg", ["x"], ["n"]),
         helper.make_node("Neg", ["a"], ["m"])], "nested",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, [1]) for o in "snm"],
        [numpy_helper.from_array(np.array([0.25], np.float32), "a"),
         numpy_helper.from_array(np.array([-1.5], np.float32), "b")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_scalar_first_output_is_the_loss_and_forward_says_what_to_do(tmp_path):
    # loss=None with a scalar first output: that output is the loss (the model computes
    # it), the others are returned by eval; forward() explains how to get the other form.
    artifacts = mh.generate_artifacts(scalar_outputs_model(), loss=None, optimizer="SGD",
                                      artifact_directory=tmp_path)
    state, module, _ = load(artifacts)
    with pytest.raises(TrainingError, match=r"has no forward program: it was packed with "
                                            r"loss=None and its output 's' is a scalar, so that "
                                            r"output is the loss\. .*loss_input_names=\['s', "
                                            r"'n', 'm'\] \(microtrain pack --loss none "
                                            r"--loss-inputs s,n,m\)$"):
        module.forward([2.0])
    loss, n, m = module.eval()([2.0])
    assert (loss, list(n), list(m)) == (0.75, [-2.0], [-0.25])


def test_several_loss_inputs_give_forward_and_backward_even_for_scalars(tmp_path):
    artifacts = mh.generate_artifacts(scalar_outputs_model(), loss=None, optimizer="SGD",
                                      artifact_directory=tmp_path,
                                      loss_input_names=["s", "n", "m"])
    b = device_blob_parser.load(artifacts.blob)
    assert [b.names[t] for t in b.programs["backward"].inputs] == ["s_grad", "n_grad", "m_grad"]
    state, module, _ = load(artifacts)
    assert [list(v) for v in module.forward([2.0])] == [[0.75], [-2.0], [-0.25]]
    module.backward([3.0], [5.0], [7.0])
    # d/da = d_s - d_m, d/db = d_s: torch float64 on the same arithmetic
    x = torch.tensor([2.0], dtype=torch.float64)
    a = torch.tensor([0.25], dtype=torch.float64, requires_grad=True)
    b_ = torch.tensor([-1.5], dtype=torch.float64, requires_grad=True)
    torch.autograd.backward([x + a + b_, -a], [torch.tensor([3.0]).double(),
                                               torch.tensor([7.0]).double()])
    assert list(state.parameters["a"].grad) == a.grad.tolist()
    assert list(state.parameters["b"].grad) == b_.grad.tolist()


def test_steps_do_not_grow_the_heap(tmp_path):
    state, module, opt = load(pack(tmp_path, mlp(N_IN, N_OUT)))
    xs, ys = batches(1)
    x, grad = array("f", xs[0].reshape(-1)), array("f", ys[0].reshape(-1))

    def steps(n):
        for _ in range(n):
            module.forward(x)
            module.backward(grad)
            opt.step()
            module.lazy_reset_grad()

    assert_steps_do_not_grow_the_heap(steps)


def test_micropython_matches_cpython(tmp_path, micropython):
    pack(tmp_path, mlp(N_IN, N_OUT, seed=2))
    xs, ys = batches(3, seed=4)
    with open(tmp_path / "data.bin", "wb") as f:
        for x, y in zip(xs, ys):
            f.write(x.astype("<f4").tobytes() + y.astype("<f4").tobytes())
    script = ROOT / "tests" / "device_scripts" / "forward_backward.py"
    args = (tmp_path, tmp_path / "data.bin", 3)
    on_micropython = np.array(run_micropython(micropython, script, *args).split(), np.float64)
    on_cpython = np.array(run_cpython(script, *args).split(), np.float64)
    assert on_micropython.size == on_cpython.size > 3 * BATCH * N_OUT
    assert relative_error(on_micropython, on_cpython) <= 1e-5


def run_cpython(script, *args):
    """Run a device script under CPython with only the device package on its path."""
    proc = subprocess.run([sys.executable, str(script), *map(str, args)], capture_output=True,
                          text=True, env={"PYTHONPATH": str(ROOT / "device"), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr
    return proc.stdout
