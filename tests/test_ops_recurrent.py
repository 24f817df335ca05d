"""GRU and LSTM (ops/recurrent.py, kernels/recurrent.py): one training step of hand-built models
(X, W, R, B, initial states and peepholes trainable) against float64 torch autograd of the
ONNX equations within 1e-5, also for the training graph in onnx.reference with the numpy
GRUGrad / LSTMGrad; the eval forward against onnxruntime (layout 0; onnxruntime refuses
layout 1, whose oracle is onnx's reference evaluator) within 1e-5; torch.nn.GRU / LSTM as
torch.onnx exports them (batch_first, bidirectional, learned initial states, opsets 14 and
17) against the modules themselves; what is refused, with the exact message; the load-time
checkers; the memory the gates cost; MicroPython against CPython."""
import copy
import zlib

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import microtrain_host as mh
from conftest import ROOT, run_micropython
from microtrain import CheckpointState, InferenceSession, Module
from microtrain.errors import BlobError
from microtrain import parser as device_blob_parser
from microtrain.kernels import recurrent
from test_hardening import Check
from test_ops import (GRAD_TOLERANCE, build_model, check_exported_module,
                      check_micropython_training, const, node, relative_error, torch_reference)
from test_ops_layout import reference_training_step
from torch_reference import parse_run, run_device_cpython, write_batches

TOLERANCE = 1e-5
GATES = {"GRU": 3, "LSTM": 4}


# -- the ONNX equations in torch (the oracle whose gradients autograd computes) -----------

def torch_recurrent(kind, x, p, direction, layout, hidden):
    """Y [T, D, N, H], Y_h, Y_c [D, N, H] (or layout 1's [N, T, D, H], [N, D, H]) of ONNX's
    GRU (linear_before_reset = 1) or LSTM, gates z r h / i o f c, from parameters p (W, R,
    optional B, h0, c0, P)."""
    if layout:
        x = x.transpose(0, 1)
    steps, batch, _ = x.shape
    dirs = p["W"].shape[0]
    h, g = hidden, GATES[kind]
    states = []
    for name in ("h0", "c0"):
        s = p.get(name)
        states.append(None if s is None else (s.transpose(0, 1) if layout else s))
    ys, hs, cs = [], [], []
    for d in range(dirs):
        back = d == 1 or direction == "reverse"
        order = range(steps - 1, -1, -1) if back else range(steps)
        hp = states[0][d] if states[0] is not None else torch.zeros(batch, h, dtype=x.dtype)
        cp = states[1][d] if states[1] is not None else torch.zeros(batch, h, dtype=x.dtype)
        bias = p["B"][d] if "B" in p else torch.zeros(2 * g * h, dtype=x.dtype)
        pi, po, pf = (p["P"][d][k * h:(k + 1) * h] for k in range(3)) if "P" in p \
            else (0.0, 0.0, 0.0)
        out = [None] * steps
        for t in order:
            xw = x[t] @ p["W"][d].T + bias[:g * h]
            hr = hp @ p["R"][d].T + bias[g * h:]
            if kind == "GRU":
                z = torch.sigmoid(xw[:, :h] + hr[:, :h])
                r = torch.sigmoid(xw[:, h:2 * h] + hr[:, h:2 * h])
                candidate = torch.tanh(xw[:, 2 * h:] + r * hr[:, 2 * h:])
                hp = (1 - z) * candidate + z * hp
            else:
                a = xw + hr
                i = torch.sigmoid(a[:, :h] + pi * cp)
                f = torch.sigmoid(a[:, 2 * h:3 * h] + pf * cp)
                cp = f * cp + i * torch.tanh(a[:, 3 * h:])
                o = torch.sigmoid(a[:, h:2 * h] + po * cp)
                hp = o * torch.tanh(cp)
            out[t] = hp
        ys.append(torch.stack(out))
        hs.append(hp)
        cs.append(cp)
    y, y_h, y_c = torch.stack(ys, 1), torch.stack(hs), torch.stack(cs)
    if layout:
        return y.permute(2, 0, 1, 3), y_h.transpose(0, 1), y_c.transpose(0, 1)
    return y, y_h, y_c


def rnn_case(kind, direction="forward", layout=0, shape=(5, 3, 4), hidden=6, initial=False,
             peephole=False, bias=True, use="Y", sequence_lens=False):
    """Y = op(input * w, W, R[, B][, ...]) with everything trainable; `use` says which outputs
    make the model's output: "Y", "Y_h", "Y_c" alone (Y then unnamed), or "all"
    (Y + Unsqueeze(Y_h [* Y_c])). shape = (T, N, I)."""
    steps, batch, n_in = shape
    dirs = 2 if direction == "bidirectional" else 1
    g = GATES[kind]
    x_shape = (batch, steps, n_in) if layout else shape
    state = (batch, dirs, hidden) if layout else (dirs, batch, hidden)
    params = {"w": x_shape, "W": (dirs, g * hidden, n_in), "R": (dirs, g * hidden, hidden)}
    inputs = ["h", "W", "R", "B" if bias else "", "lens" if sequence_lens else ""]
    if bias:
        params["B"] = (dirs, 2 * g * hidden)
    if initial:
        params["h0"] = state
    inputs.append("h0" if initial else "")
    if kind == "LSTM":
        if initial:
            params["c0"] = state
        inputs.append("c0" if initial else "")
        if peephole:
            params["P"] = (dirs, 3 * hidden)
        inputs.append("P" if peephole else "")
    while inputs[-1] == "":
        inputs.pop()
    names = {"Y": ["output", "Y_h", "Y_c"], "Y_h": ["", "output", "Y_c"],
             "Y_c": ["", "Y_h", "output"], "all": ["Y", "Y_h", "Y_c"]}[use]
    outputs = names[:3 if kind == "LSTM" else 2]
    nodes = [node("Mul", ["input", "w"], "h")]
    if sequence_lens:
        nodes.append(const("lens", np.full(batch, steps, np.int32)))
    nodes.append(node(kind, inputs, outputs, hidden_size=hidden, layout=layout,
                      direction=direction, **({"linear_before_reset": 1} if kind == "GRU"
                                              else {})))
    if use == "all":
        last = "Y_h"
        if kind == "LSTM":
            nodes.append(node("Mul", ["Y_h", "Y_c"], "hc"))
            last = "hc"
        nodes += [const("axes", np.array([1 if layout else 0], np.int64)),
                  node("Unsqueeze", [last, "axes"], "states"),
                  node("Add", ["Y", "states"], "output")]

    def reference(x, p):
        y, y_h, y_c = torch_recurrent(kind, x * p["w"], p, direction, layout, hidden)
        if use == "all":
            last = y_h * y_c if kind == "LSTM" else y_h
            return y + last.unsqueeze(1 if layout else 0)
        return {"Y": y, "Y_h": y_h, "Y_c": y_c}[use]

    label = (f"{kind}_{direction}_layout{layout}_{'x'.join(map(str, shape))}_H{hidden}_{use}"
             + ("_initial" if initial else "") + ("_peephole" if peephole else "")
             + ("" if bias else "_nobias") + ("_lens" if sequence_lens else ""))
    return label, x_shape, params, nodes, reference, hidden


def random_shape(seed):
    rng = np.random.default_rng(seed)
    return tuple(int(v) for v in rng.integers(1, 8, size=3)), int(rng.integers(1, 8))


SHAPES = [random_shape(seed) for seed in range(4)]
CASES = []
for kind in ("GRU", "LSTM"):
    CASES += [rnn_case(kind),
              rnn_case(kind, "reverse", initial=True, use="Y_h"),
              rnn_case(kind, "bidirectional", initial=True, use="all"),
              rnn_case(kind, "bidirectional", layout=1, use="Y"),
              rnn_case(kind, "forward", layout=1, initial=True, use="all"),
              rnn_case(kind, "reverse", layout=1, initial=True,
                       use="Y_c" if kind == "LSTM" else "Y_h"),
              rnn_case(kind, bias=False, use="all", shape=(4, 2, 3), hidden=5),
              rnn_case(kind, shape=(1, 2, 3), hidden=4, initial=True, use="all"),
              rnn_case(kind, "bidirectional", shape=(3, 1, 1), hidden=1, use="all")]
    CASES += [rnn_case(kind, direction, layout, shape, hidden, initial=bool(k % 2), use="all")
              for k, ((shape, hidden), direction, layout) in enumerate(zip(
                  SHAPES, ("bidirectional", "forward", "reverse", "bidirectional"),
                  (0, 1, 0, 1)))]
CASES += [rnn_case("LSTM", initial=True, peephole=True, use="all"),
          rnn_case("LSTM", "bidirectional", layout=1, peephole=True, use="Y_c"),
          rnn_case("LSTM", "reverse", peephole=True, use="Y_h", shape=(6, 2, 3), hidden=3),
          rnn_case("GRU", sequence_lens=True, use="all")]


def values(name, input_shape, param_shapes):
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    draw = lambda s: rng.uniform(-1.0, 1.0, s).astype(np.float32)  # noqa: E731
    return draw(input_shape), {k: draw(s) for k, s in param_shapes.items()}, rng


def forward_oracle(model, x, layout):
    """The model's output by onnxruntime, or by onnx's reference evaluator for layout 1
    (onnxruntime: "Batchwise recurrent operations (layout == 1) are not supported")."""
    if layout:
        return ReferenceEvaluator(model).run(None, {"input": x})[0]
    return ort.InferenceSession(model.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, {"input": x})[0]


@pytest.mark.parametrize("name,input_shape,params,nodes,fn,hidden", CASES,
                         ids=[c[0] for c in CASES])
def test_recurrent_gradient(tmp_path, name, input_shape, params, nodes, fn, hidden):
    x, values_, rng = values(name, input_shape, params)
    loss, out, grads, target = torch_reference(
        fn, x, values_, lambda shape: rng.standard_normal(shape).astype(np.float32))
    model = build_model(input_shape, values_, nodes, out.shape)
    target = target.numpy().astype(np.float32)
    mh.generate_artifacts(model, loss="MSELoss", optimizer="SGD", artifact_directory=tmp_path)
    state = CheckpointState.load_checkpoint(str(tmp_path / "checkpoint"))
    device = Module(str(tmp_path / "model.mtb"), state)
    x_flat, target_flat = x.reshape(-1).tolist(), target.reshape(-1).tolist()
    assert relative_error(device(x_flat, target_flat), loss) <= TOLERANCE
    for param, expected in grads.items():
        actual = np.array(state.parameters[param].grad.tolist())
        assert relative_error(actual, expected) <= TOLERANCE, param
    # The training graph in onnx.reference: GRUGrad / LSTMGrad's numpy references (float64
    # inside, float32 between the graph's ops: 1e-8 absolute, so the suite's 1e-4 here).
    reference_loss, reference_grads = reference_training_step(tmp_path, x, target)
    assert relative_error(reference_loss, loss) <= GRAD_TOLERANCE
    for param, expected in grads.items():
        assert relative_error(reference_grads[param], expected) <= GRAD_TOLERANCE, param
    # Forward: the eval program against float64 torch and the independent oracle.
    device.eval()
    device_out = device(x_flat, target_flat)[1].tolist()
    oracle = forward_oracle(model, x, "layout1" in name)
    assert oracle.shape == out.shape
    # Against the output's scale, as check_exported_module: an output that cancels O(1)
    # float32 terms (Y + Y_h near 0) carries ~1e-7 absolute rounding in any float32
    # implementation, onnxruntime's included.
    for expected in (out, oracle):
        assert scaled_error(device_out, expected) <= TOLERANCE
    assert scaled_error(out, oracle) <= TOLERANCE   # the torch transcription is ONNX's op


def scaled_error(actual, expected):
    expected = np.asarray(expected, np.float64).reshape(-1)
    error = np.max(np.abs(np.asarray(actual, np.float64).reshape(-1) - expected))
    return float(error / max(1.0, float(np.max(np.abs(expected)))))


# -- torch.nn.GRU / LSTM as torch.onnx exports them ------------------------------------------

class Recurrent(torch.nn.Module):
    """A GRU or LSTM on x, its output sequence and final states mixed into the output so
    that every output carries gradient; `learned_initial`: h0 (and c0) are parameters."""

    def __init__(self, kind, batch_first, bidirectional, learned_initial=False, inputs=4,
                 hidden=5, batch=2):
        super().__init__()
        torch.manual_seed(3)
        self.rnn = getattr(torch.nn, kind)(inputs, hidden, batch_first=batch_first,
                                          bidirectional=bidirectional)
        dirs = 2 if bidirectional else 1
        self.initial = torch.nn.ParameterList(
            [torch.nn.Parameter(torch.randn(dirs, batch, hidden) * 0.5)
             for _ in range(2 if kind == "LSTM" else 1)] if learned_initial else [])

    def forward(self, x):
        if len(self.initial) == 2:
            y, (h, c) = self.rnn(x, (self.initial[0], self.initial[1]))
        elif len(self.initial) == 1:
            y, h = self.rnn(x, self.initial[0])
            c = h
        else:
            y, h = self.rnn(x)
            h, c = h if isinstance(h, tuple) else (h, h)
        return torch.tanh(y) * (h.sum(0) * c.sum(0)).unsqueeze(1 if self.rnn.batch_first
                                                                else 0).repeat(
            1, 1, y.shape[-1] // h.shape[-1])


EXPORTS = [(kind, bf, bi, learned, opset)
           for kind in ("GRU", "LSTM") for bf in (False, True) for bi in (False, True)
           for learned, opset in ((False, 17), (True, 14))]


@pytest.mark.parametrize("kind,batch_first,bidirectional,learned,opset", EXPORTS,
                         ids=[f"{k}_bf{int(b)}_bi{int(d)}{'_h0' if h else ''}_opset{o}"
                              for k, b, d, h, o in EXPORTS])
def test_torch_exports(tmp_path, kind, batch_first, bidirectional, learned, opset):
    module = Recurrent(kind, batch_first, bidirectional, learned)
    shape = (2, 7, 4) if batch_first else (7, 2, 4)
    x = np.random.default_rng(4).standard_normal(shape).astype(np.float32)
    model = check_exported_module(tmp_path, module, x, opset=opset, grad_tolerance=TOLERANCE)
    assert kind in {n.op_type for n in model.graph.node}


# -- refused at pack time, naming node and attribute ---------------------------------------

def refused_model(kind, attrs, lens=None, hidden=3, inputs=2, steps=4, batch=2, dirs=1):
    """One GRU / LSTM node 'rnn' over input [T, N, I], built without onnx's checker."""
    g = GATES[kind]
    initializers = [numpy_helper.from_array(np.ones((dirs, g * hidden, inputs), np.float32),
                                            "W"),
                    numpy_helper.from_array(np.ones((dirs, g * hidden, hidden), np.float32),
                                            "R")]
    names = ["input", "W", "R"]
    graph_inputs = [helper.make_tensor_value_info("input", TensorProto.FLOAT,
                                                  [steps, batch, inputs])]
    if lens is not None:
        names += ["", "lens"]
        if isinstance(lens, str):
            graph_inputs.append(helper.make_tensor_value_info("lens", TensorProto.INT32,
                                                              [batch]))
        else:
            initializers.append(numpy_helper.from_array(np.array(lens, np.int32), "lens"))
    graph = helper.make_graph(
        [helper.make_node(kind, names, ["output"], name="rnn", hidden_size=hidden, **attrs)],
        "refused", graph_inputs,
        [helper.make_tensor_value_info("output", TensorProto.FLOAT,
                                       [steps, dirs, batch, hidden])],
        initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


REFUSED = [
    ("GRU", {"linear_before_reset": 1, "clip": 3.0}, None,
     "GRU node 'rnn': attribute clip is not supported"),
    ("GRU", {}, None, "GRU node 'rnn': attribute linear_before_reset = 0 is not supported; "
                      "only 1 (torch.nn.GRU's form)"),
    ("GRU", {"linear_before_reset": 1, "activations": ["Relu", "Tanh"]}, None,
     "GRU node 'rnn': attribute activations = ['Relu', 'Tanh'] is not supported; only the "
     "defaults ['Sigmoid', 'Tanh']"),
    ("LSTM", {"activations": ["Sigmoid", "Tanh", "Tanh"], "activation_alpha": [1.0]}, None,
     "LSTM node 'rnn': attribute activation_alpha is not supported"),
    ("LSTM", {"input_forget": 1}, None,
     "LSTM node 'rnn': attribute input_forget = 1 is not supported"),
    ("LSTM", {}, [4, 3], "LSTM node 'rnn': input sequence_lens is supported only as a constant "
                         "equal to the sequence length 4"),
    ("GRU", {"linear_before_reset": 1}, "input", "GRU node 'rnn': input sequence_lens is "
                                                 "supported only as a constant equal to the "
                                                 "sequence length 4"),
]


@pytest.mark.parametrize("kind,attrs,lens,message", REFUSED,
                         ids=[f"{k}_{'_'.join(a) or 'lens'}" for k, a, _, _ in REFUSED])
def test_refused_at_pack_time_naming_node_and_attribute(tmp_path, kind, attrs, lens, message):
    model = refused_model(kind, attrs, lens)
    with pytest.raises(mh.UnsupportedOpError) as error:
        mh.generate_artifacts(model, loss="MSELoss", optimizer="SGD", artifact_directory=tmp_path)
    assert str(error.value) == message
    assert not (tmp_path / "model.mtb").exists()


def test_the_default_activations_spelled_out_are_accepted(tmp_path):
    model = refused_model("GRU", {"linear_before_reset": 1, "direction": "bidirectional",
                                  "activations": ["Sigmoid", "Tanh"] * 2}, dirs=2)
    mh.generate_artifacts(model, loss="MSELoss", optimizer="SGD", artifact_directory=tmp_path)


def test_inference_export_and_the_callers_model_is_left_alone(tmp_path):
    # Y unnamed: the gradient rule names it in the training graph, not in the caller's model;
    # the device's inference blob (one slot, one step of Y) runs like onnxruntime.
    name, shape, params, nodes, fn, _ = rnn_case("LSTM", "bidirectional", initial=True,
                                                 use="Y_h")
    x, values_, _ = values(name, shape, params)
    out = fn(torch.tensor(x, dtype=torch.float64),
             {k: torch.tensor(v, dtype=torch.float64) for k, v in values_.items()})
    model = build_model(shape, values_, nodes, tuple(out.shape))
    before = model.SerializeToString()
    mh.generate_artifacts(model, loss="MSELoss", optimizer="SGD", artifact_directory=tmp_path)
    assert model.SerializeToString() == before
    training = onnx.load(str(tmp_path / "training_model.onnx"))
    (lstm,) = [n for n in training.graph.node if n.op_type == "LSTM"]
    assert lstm.output[0] and lstm.output[0] in {i for n in training.graph.node for i in n.input}
    module = Module(str(tmp_path / "model.mtb"),
                    CheckpointState.load_checkpoint(str(tmp_path / "checkpoint")))
    module.export_model_for_inferencing(str(tmp_path / "inference.mtb"), ["output"])
    device_out = InferenceSession(str(tmp_path / "inference.mtb")).run(x.reshape(-1).tolist())
    assert scaled_error(device_out.tolist(), forward_oracle(model, x, 0)) <= TOLERANCE


# -- what the gates cost, and the load-time checkers ---------------------------------------

def test_gates_are_kept_per_step_only_for_training(tmp_path):
    # GRU, T 5, N 3, I 4, H 6, one direction: training keeps 4H per step and sample (z, r,
    # h~, hn) and Y; eval keeps one step's slots and, as nothing reads Y there beyond Y_h,
    # one step of Y.
    name, shape, params, nodes, _, _ = rnn_case("GRU", use="Y_h")
    rng = np.random.default_rng(0)
    model = build_model(shape, {k: rng.uniform(-1, 1, s).astype(np.float32)
                                for k, s in params.items()}, nodes, (1, 3, 6))
    mh.generate_artifacts(model, loss="MSELoss", optimizer="SGD", artifact_directory=tmp_path)
    b = device_blob_parser.load(str(tmp_path / "model.mtb"), keep_steps=True)
    sizes = {}
    for program in ("train", "eval"):
        for code, tensors, _, _ in b.step_records[program]:
            if code == mh.opcodes.GRU:
                sizes[program] = (b.sizes[tensors[2]], b.sizes[tensors[0]])  # saved, Y
    assert sizes == {"train": (1 * 5 * 3 * 4 * 6, 5 * 1 * 3 * 6),
                     "eval": (1 * 1 * 3 * 4 * 6, 1 * 3 * 6)}


GEOMETRY = (4, 2, 3, 5, 1, 0, 6, 3, 10, 10, 5, 10, 5, 1)   # T N I H D rev, layout-0 strides, keep


def gru_check_sizes(**sizes):
    # y, y_h, saved, x, w, r, b, h0 of GEOMETRY, or other sizes
    default = dict(y=40, y_h=10, saved=4 * 2 * 4 * 5, x=4 * 2 * 3, w=15 * 3, r=15 * 5, b=30,
                   h0=10)
    default.update(sizes)
    return Check(list(default.values()))


def test_checkers_accept_a_consistent_step():
    c = gru_check_sizes()
    c.check(recurrent.gru_check, c.tensor_offsets() + GEOMETRY)


@pytest.mark.parametrize("sizes,change,message", [
    ({}, {8: 11}, r"elements \[0, 42\] lie outside tensor 't0' \[0, 40\)$"),   # Y's T stride
    ({}, {7: 0}, r"a dimension of 2 elements is walked with stride 0$"),        # X along N
    ({}, {4: 2, 5: 1}, r"reverse is 1, outside \[0, 0\]$"),          # two directions, reverse
    ({}, {0: 1000}, r"elements \[0, 5999\] lie outside tensor 't3' \[0, 24\)$"),   # T past X
    ({"w": 44}, {}, r"tensor 't4' holds 44 elements, the step reads or writes 45$"),
    ({"saved": 159}, {}, r"tensor 't2' holds 159 elements, the step reads or writes 160$"),
    ({"h0": 9}, {}, r"elements \[0, 9\] lie outside tensor 't7' \[0, 9\)$"),
    ({}, {13: 2}, r"keep is 2, outside \[0, 1\]$"),
])
def test_crafted_forward_geometry_is_refused(sizes, change, message):
    c = gru_check_sizes(**sizes)
    geometry = list(GEOMETRY)
    for k, v in change.items():
        geometry[k] = v
    with pytest.raises(BlobError, match="^crafted step: " + message):
        c.check(recurrent.gru_check, c.tensor_offsets() + tuple(geometry))


def test_crafted_backward_needs_every_step_kept():
    # dx, dw, dr, db, dh0, dh, saved, x, w, r, h0, y, dy, dy_h
    c = Check([24, 45, 75, 30, 10, 10, 160, 24, 45, 75, 10, 40, 40, 10])
    c.check(recurrent.gru_grad_check, c.tensor_offsets() + GEOMETRY)
    with pytest.raises(BlobError, match=r"^crafted step: keep is 0; the backward pass needs "
                                        r"every step's slot$"):
        c.check(recurrent.gru_grad_check, c.tensor_offsets() + GEOMETRY[:-1] + (0,))
    small = Check([24, 45, 75, 30, 10, 10, 159, 24, 45, 75, 10, 40, 40, 10])
    with pytest.raises(BlobError, match=r"^crafted step: tensor 't6' holds 159 elements, the "
                                        r"step reads or writes 160$"):
        small.check(recurrent.gru_grad_check, small.tensor_offsets() + GEOMETRY)
    # dx, dw, dr, db, dh0, dc0, dp, scratch, saved, x, w, r, h0, c0, p, y, dy, dy_h, dy_c
    c = Check([24, 60, 100, 40, 10, 10, 15, 19, 200, 24, 60, 100, 10, 10, 15, 40, 40, 10, 10])
    with pytest.raises(BlobError, match=r"^crafted step: tensor 't7' holds 19 elements, the "
                                        r"step reads or writes 20$"):
        c.check(recurrent.lstm_grad_check, c.tensor_offsets() + GEOMETRY)


# -- MicroPython against CPython ---------------------------------------------------------------

def check_micropython_model(tmp_path, micropython, model, input_shape, output_shape, steps=4,
                            lr=0.05):
    """A hand-built ONNX model (MSELoss, SGD) trained a few steps on one batch by the device
    runtime under CPython and MicroPython: losses, parameters and eval loss within 1e-5."""
    mh.generate_artifacts(model, loss="MSELoss", optimizer="SGD", artifact_directory=tmp_path)
    rng = np.random.default_rng(9)
    xs = np.repeat(rng.uniform(-1, 1, (1,) + tuple(input_shape)).astype(np.float32), steps, 0)
    ys = np.repeat(rng.standard_normal((1,) + tuple(output_shape)).astype(np.float32), steps, 0)
    write_batches(tmp_path / "data.bin", xs, ys)
    losses, params, eval_loss = run_device_cpython(tmp_path, tmp_path / "data.bin", steps, lr)
    out = run_micropython(micropython, ROOT / "tests" / "device_scripts" / "train_steps.py",
                          tmp_path, tmp_path / "data.bin", steps, repr(lr))
    mp_losses, mp_params, mp_eval = parse_run(out)
    assert relative_error(mp_losses, losses) <= 1e-5
    assert relative_error(mp_params, params) <= 1e-5
    assert relative_error(mp_eval, eval_loss) <= 1e-5
    assert losses[-1] < losses[0]


MICROPYTHON_CASES = [rnn_case("LSTM", "bidirectional", layout=1, shape=(5, 2, 3), hidden=4,
                              initial=True, peephole=True, use="all"),
                     rnn_case("GRU", "reverse", layout=1, shape=(5, 2, 3), hidden=4,
                              initial=True, use="all"),
                     rnn_case("GRU", "bidirectional", shape=(5, 2, 3), hidden=4, use="Y_h")]


@pytest.mark.parametrize("name,input_shape,params,nodes,fn,hidden", MICROPYTHON_CASES,
                         ids=[c[0] for c in MICROPYTHON_CASES])
def test_micropython_matches_cpython(tmp_path, micropython, name, input_shape, params, nodes,
                                     fn, hidden):
    x, values_, _ = values(name, input_shape, params)
    out = fn(torch.tensor(x, dtype=torch.float64),
             {k: torch.tensor(v, dtype=torch.float64) for k, v in values_.items()})
    model = build_model(input_shape, values_, nodes, tuple(out.shape))
    check_micropython_model(tmp_path, micropython, model, input_shape, tuple(out.shape))


@pytest.mark.parametrize("kind", ["GRU", "LSTM"])
def test_torch_module_micropython_matches_cpython_and_torch(tmp_path, micropython, kind):
    module = Recurrent(kind, batch_first=True, bidirectional=True, inputs=3, hidden=4,
                       batch=2)
    check_micropython_training(tmp_path, micropython, copy.deepcopy(module), (2, 6, 3),
                               (2, 6, 8))
