"""Issue 22, integer training beyond a chain of convolutions (quant/intbackward.py,
kernels/intflow.py): one integer step of the biases of every layer and the weights of the
last ones, through residual Adds (a strided shortcut conv; a tensor read by two layers),
padded average pools that do not count their padding, max pools, Flatten heads, hidden Gemms
and 1-D convolutions, against torch float64 autograd on the dequantized model: the fused
int8 graph replayed node by node, each tensor carrying the device's forward value and the
float op's gradient through its clamp (the straight-through estimator of QAT). Then the
same blobs on MicroPython under heap_lock equal CPython, and what cannot be trained in
integers is refused at pack time naming the node."""
import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, numpy_helper
from torch import nn

from microtrain import CheckpointState, Module
from microtrain import blob as device_blob
from microtrain import parser as device_blob_parser
from microtrain.feed import copy_inputs
from microtrain_host.errors import UnsupportedOpError
from microtrain_host.graph import attr
from microtrain_host.quant.int8 import int8_graph
from microtrain_host.quant.inttrain import int8_training_artifacts, quantize_input
from reference_models import ReferenceModel, lenet, mobilenet_v2_block, resnet_block
from test_int_limits import _viper_pure_cpython

F = torch.nn.functional
INT_GEMM_LOGITS, INT_SOFTMAX_CE = 242, 243
LOSS_STEPS = (INT_SOFTMAX_CE, 194, 195)    # and kernels/intloss.py's INT_MSE, INT_BCE_LOGITS
QLINEAR_CONCAT = 196


class Conv1dNet(nn.Module):
    # an IMU-style 1-D conv net: Conv1d + ReLU, MaxPool1d, Conv1d + ReLU, Flatten, Gemm
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Conv1d(3, 6, 5, padding=2), nn.ReLU(), nn.MaxPool1d(2),
                                  nn.Conv1d(6, 8, 3, stride=2, padding=1), nn.ReLU())
        self.head = nn.Linear(8 * 4, 4)

    def forward(self, x):
        return self.head(self.body(x).flatten(1))


def conv1d_net():
    torch.manual_seed(4)
    return ReferenceModel("conv1d_net", Conv1dNet(), (3, 16), "CrossEntropyLoss", 4,
                          {"SGD": 0.05})


def mlp():
    # (the hidden layer of 160 outputs: its input gradient sums 160 products, beyond the 127
    # taken at full width - kernels/intgrad.py _pre_shift)
    torch.manual_seed(5)
    module = nn.Sequential(nn.Linear(20, 24), nn.ReLU(), nn.Linear(24, 160), nn.ReLU(),
                           nn.Linear(160, 5))
    return ReferenceModel("mlp", module, (20,), "CrossEntropyLoss", 4, {"SGD": 0.05})


def wide_cnn():
    # input gradients of 576 and 288 products per element (3x3 convs of 64 and 32 outputs,
    # one strided, one dilated) and 160 (a 1x1 conv): kernels/intwide.py's exact sums
    torch.manual_seed(8)
    module = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(),
                           nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.ReLU(),
                           nn.Conv2d(32, 64, 3, padding=2, dilation=2), nn.ReLU(),
                           nn.Conv2d(64, 160, 1), nn.ReLU(), nn.Conv2d(160, 16, 1), nn.ReLU(),
                           nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 4))
    return ReferenceModel("wide_cnn", module, (3, 8, 8), "CrossEntropyLoss", 4, {"SGD": 0.05})


# a QLinearLookup's activation in torch (tests/test_intlookup.py)
LOOKUP_ACTIVATIONS = {
    "Relu": lambda x, n: F.relu(x),
    "Clip": lambda x, n: F.hardtanh(x, attr(n, "clamp_min", -1e30), attr(n, "clamp_max", 1e30)),
    "Sigmoid": lambda x, n: torch.sigmoid(x),
    "Tanh": lambda x, n: torch.tanh(x),
    "LeakyRelu": lambda x, n: F.leaky_relu(x, attr(n, "alpha")),
    "HardSigmoid": lambda x, n: F.hardtanh(attr(n, "alpha") * x + attr(n, "beta"), 0.0, 1.0),
    "HardSwish": lambda x, n: F.hardswish(x),
}
MODELS = {"resnet_block": resnet_block, "lenet": lenet, "conv1d_net": conv1d_net, "mlp": mlp,
          "wide_cnn": wide_cnn}
CONFIGS = {"biases": dict(train_biases=True), "last3": dict(train_last=3),
           "biases_last2": dict(train_biases=True, train_last=2)}


@pytest.fixture(scope="module", params=list(MODELS))
def qdq(request, tmp_path_factory):
    from torch_reference import qat_qdq_model
    tmp = tmp_path_factory.mktemp(request.param)
    xs, ys = qat_qdq_model(MODELS[request.param](), tmp, 8)
    return request.param, tmp, xs, ys


def _bytes(model, tid):
    signed = model.blob.dtypes[tid] == device_blob.INT8
    return np.frombuffer(bytes(model.output(tid)), np.int8 if signed else np.uint8
                         ).astype(np.int64)


def _forward(model, info, x, y):
    """Run the train program's steps by hand up to the loss (y None: a program whose only
    input is x), keeping every byte tensor a step writes (the planner reuses their space later); returns {tensor name:
    int values} and the trained parameters' values before the step."""
    b = model.blob
    program = model._train
    copy_inputs(b, model.F, model.I, program, (x,) if y is None else (x, y), b.num_classes)
    records = device_blob_parser.load(info["blob"], keep_steps=True).step_records["train"]
    values = {info["input"]: _bytes(model, b.tensor_id(info["input"]))}
    before = {}
    for name in info["parameters"]:
        tid = b.tensor_id(name)
        before[name] = (_bytes(model, tid) if b.dtypes[tid] == device_blob.INT8 else
                        np.array(model.output(tid), np.int64))
    for (kernel, args), (op, tensors, ints, _) in zip(program.steps, records):
        kernel(model.F, model.I, args)
        if 220 <= op <= 228 or op == QLINEAR_CONCAT:
            values[b.names[tensors[0]]] = _bytes(model, tensors[0])
        if op in LOSS_STEPS:
            values["inttrain.grad"] = np.array(model.output(tensors[1]), np.int64)
            break
    return values, before


def torch_step(fused, quant_of, values, before, info, y, lr, loss):
    """{parameter name: expected step in quanta} of torch float64 SGD on the dequantized
    model, replayed over the fused graph: of the classifier's cross-entropy, or (loss
    "device") of the logits times the device's own loss gradient (the integer softmax's
    p - onehot, whose logits are fixed point with 8 fractional bits: this isolates the
    backward from that rounding)."""
    inits = {i.name: numpy_helper.to_array(i) for i in fused.graph.initializer}
    m = info["batch_size"]
    shapes = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim]
              for v in list(fused.graph.value_info) + list(fused.graph.input)}
    vals, leaves = {}, {}

    def deq(name):
        s, z = quant_of(name)
        shape = shapes.get(name, [m, -1])
        return torch.tensor((values[name] - z) * s).reshape([m] + list(shape[1:]))

    def straight(node, z, masked=True):
        name = node.output[0]
        y_q = values[name].reshape(z.shape)
        keep = np.ones(z.shape) if not masked else (
            (y_q > attr(node, "lo", 0)) & (y_q < attr(node, "hi", 255))).astype(np.float64)
        vals[name] = deq(name).reshape(z.shape) + (z - z.detach()) * torch.tensor(keep)

    gemm = None
    for n in fused.graph.node:
        op = n.op_type
        if op == "Quantize":
            vals[n.output[0]] = deq(n.output[0])
        elif op in ("QLinearConv", "QLinearGemm") and n.output[0] not in values:
            gemm = n                                  # the classifier
        elif op in ("QLinearConv", "QLinearGemm"):
            x = vals[n.input[0]]
            sx = quant_of(n.input[0])[0]
            sw = np.array(attr(n, "w_scales"), np.float64)
            w = inits[n.input[1]].astype(np.float64)
            if op == "QLinearGemm" and not attr(n, "transB", 0):
                w = w.T
            wname, bname = n.input[1].removesuffix(".quantized"), n.input[2].removesuffix(
                ".quantized")
            if wname in before:
                w = before[wname].reshape(w.shape).astype(np.float64)
            b = before[bname] if bname in before else inits[n.input[2]]
            sw = sw if sw.size > 1 else np.full(w.shape[0], sw[0])
            W = torch.tensor(w * sw.reshape([-1] + [1] * (w.ndim - 1)), requires_grad=True)
            B = torch.tensor(b * sx * sw, requires_grad=True)
            leaves[bname] = (B, sx * sw)
            leaves[wname] = (W, sw.reshape([-1] + [1] * (w.ndim - 1)))
            if op == "QLinearGemm":
                z = x.reshape(m, -1) @ W.T + B
            else:
                conv = F.conv1d if x.dim() == 3 else F.conv2d
                pads = list(attr(n, "pads", [0] * (2 * (x.dim() - 2))))
                rank = x.dim() - 2
                if pads[:rank] != pads[rank:]:      # asymmetric: pad explicitly
                    x = F.pad(x, sum(([pads[rank + i], pads[i]] for i in
                                      reversed(range(rank))), []))
                    pads = [0] * (2 * rank)
                z = conv(x, W, B, list(attr(n, "strides", [1] * rank)), pads[:rank],
                         list(attr(n, "dilations", [1] * rank)), attr(n, "group", 1))
            straight(n, z)
        elif op == "QLinearAdd":
            straight(n, vals[n.input[0]] + vals[n.input[1]])
        elif op == "QLinearConcat":
            # each input fake-quantized to the output's scale: PyTorch's straight-through
            # mask, the requantized value (float64) inside the output type's range
            sy, zy = quant_of(n.output[0])
            qmin, qmax = (-128, 127) if attr(n, "y_type", TensorProto.UINT8) == \
                TensorProto.INT8 else (0, 255)
            parts = []
            for i in n.input:
                sx, zx = quant_of(i)
                q = np.rint((values[i] - zx) * sx / sy) + zy
                keep = torch.tensor(((q >= qmin) & (q <= qmax)).reshape(vals[i].shape)
                                    .astype(np.float64))
                parts.append(vals[i].detach() + (vals[i] - vals[i].detach()) * keep)
            straight(n, torch.cat(parts, attr(n, "axis") % vals[n.input[0]].dim()),
                     masked=False)
        elif op == "QLinearLookup":       # the float activation, then the output's fake
            z = LOOKUP_ACTIVATIONS[attr(n, "activation")](vals[n.input[0]], n)    # quantizer
            qmin, qmax = (-128, 127) if attr(n, "y_type", 2) == onnx.TensorProto.INT8 else (
                0, 255)
            u = np.rint(z.detach().numpy() / attr(n, "y_scale")) + attr(n, "y_zero_point", 0)
            keep = torch.tensor(((u >= qmin) & (u <= qmax)).astype(np.float64))
            vals[n.output[0]] = deq(n.output[0]).reshape(z.shape) + (z - z.detach()) * keep
        elif op in ("QLinearMaxPool", "QLinearAveragePool"):
            x = vals[n.input[0]]
            rank = x.dim() - 2
            kernel = list(attr(n, "kernel_shape"))
            strides = list(attr(n, "strides", [1] * rank))
            pads = list(attr(n, "pads", [0] * (2 * rank)))[:rank]
            ceil = bool(attr(n, "ceil_mode", 0))
            if op == "QLinearMaxPool":
                pool = F.max_pool1d if rank == 1 else F.max_pool2d
                z = pool(x, kernel, strides, pads, ceil_mode=ceil)
            else:
                pool = F.avg_pool1d if rank == 1 else F.avg_pool2d
                z = pool(x, kernel, strides, pads, ceil_mode=ceil,
                         count_include_pad=bool(attr(n, "count_include_pad", 0)))
            straight(n, z, masked=False)
        elif op == "QLinearGlobalAveragePool":
            x = vals[n.input[0]]
            straight(n, x.mean(dim=tuple(range(2, x.dim())), keepdim=True), masked=False)
        elif op in ("Flatten", "Reshape", "Squeeze", "Unsqueeze"):
            values.setdefault(n.output[0], values[n.input[0]])      # a view: the same bytes
            vals[n.output[0]] = vals[n.input[0]].reshape(m, -1) if op == "Flatten" else \
                vals[n.input[0]].reshape([m] + shapes[n.output[0]][1:])
    feature = gemm.input[0]
    prev = vals[feature].reshape(m, -1)
    sf, zf = quant_of(feature)
    feat = torch.tensor((values[feature].reshape(m, -1) - zf) * sf) + prev - prev.detach()
    swc = np.array(info["weight_scales"], np.float64)
    Wc = torch.tensor(before[info["weight"]].reshape(len(swc), -1) * swc[:, None])
    Bc = torch.tensor(before[info["bias"]] * sf * swc)
    if loss == "device":
        g = torch.tensor(values["inttrain.grad"].reshape(m, -1) / 16384.0 / m)
        ((feat @ Wc.T + Bc) * g).sum().backward()
    else:
        F.cross_entropy(feat @ Wc.T + Bc, torch.tensor(y)).backward()
    return {name: lr * leaf.grad.numpy() / unit for name, (leaf, unit) in leaves.items()
            if name in before and leaf.grad is not None}


# how far beyond half a quantum a step may be, in parts of its layer's largest step: the
# integer backward alone (16-bit mantissas, measured at most 4.7e-5; 9.9e-4 with the 13-bit
# ones before), and with torch's cross-entropy against the integer softmax (logits with 12
# fractional bits: measured at most 1.7e-4; 4.6e-3 with 8)
TOLERANCE = {"device": 2 ** -12, "cross_entropy": 1e-3}


def step_errors(model, expected, before):
    """{parameter: (|the device's step - torch's| per element, torch's largest step)} after
    one device step from `before`, for each parameter torch stepped (`expected`, in quanta);
    an int8 weight stops at +-127: those elements are left out."""
    errors = {}
    for param, step in expected.items():
        tid = model.blob.tensor_id(param)
        weight = model.blob.dtypes[tid] == device_blob.INT8
        after = _bytes(model, tid) if weight else np.array(model.output(tid), np.int64)
        got = (before[param] - after).reshape(step.shape)
        free = np.abs(before[param].reshape(step.shape) - np.round(step)) <= (
            127 if weight else 1 << 23)
        errors[param] = (np.abs(got - step)[free], float(np.abs(step).max()))
    return errors


@pytest.mark.parametrize("loss", list(TOLERANCE))
@pytest.mark.parametrize("config", list(CONFIGS))
def test_integer_backward_equals_torch_float64(qdq, config, loss, tmp_path):
    name, tmp, xs, ys = qdq
    lr = 4.0        # steps of several quanta
    info = int8_training_artifacts(tmp / "qdq.onnx", tmp_path, lr, stochastic=False,
                                   **CONFIGS[config])
    fused = int8_graph(onnx.load(tmp / "qdq.onnx"))
    b = device_blob_parser.load(info["blob"])

    def quant_of(tensor):
        scales, zps, _ = b.quant[b.tensor_id(tensor)]
        return scales[0], zps[0]

    rng = np.random.default_rng(3)
    worst = 0.0
    checked = set()
    for trial in range(2):
        model = Module(info["blob"], CheckpointState.load_checkpoint(info["checkpoint"]))
        x = quantize_input(xs[trial] + rng.standard_normal(xs[trial].shape).astype(np.float32)
                           * 0.1, info).reshape(-1).tolist()
        y = [int(v) for v in ys[trial]]
        values, before = _forward(model, info, x, y)
        expected = torch_step(fused, quant_of, values, before, info, y, lr, loss)
        model = Module(info["blob"], CheckpointState.load_checkpoint(info["checkpoint"]))
        model(x, y)
        for param, (err, largest) in step_errors(model, expected, before).items():
            worst = max(worst, float((err.max() - 0.5) / largest) if largest else 0.0)
            # half a quantum of rounding plus 1e-3 of the layer's largest step
            assert np.all(err <= 0.5 + TOLERANCE[loss] * largest + 1e-9), (
                param, err.max(), largest)
            if largest > 1:
                checked.add(param)
    trained = set(info["parameters"]) - {info["weight"], info["bias"]}
    assert checked == trained, (sorted(trained - checked), sorted(checked))
    print(f"{name} {config} ({loss} gradient): {len(trained)} parameters vs torch float64, "
          f"beyond half a quantum at most {worst:.1e} of the layer's largest step")


@pytest.mark.parametrize("config", ["biases_last2"])
def test_integer_backward_micropython_heap_lock_equals_cpython(qdq, config, micropython,
                                                                tmp_path):
    name, tmp, xs, ys = qdq
    info = int8_training_artifacts(tmp / "qdq.onnx", tmp_path / "int", 0.5, **CONFIGS[config])
    rng = np.random.default_rng(6)
    (tmp_path / "data.bin").write_bytes(b"".join(
        quantize_input(x + rng.standard_normal(x.shape).astype(np.float32) * 0.1,
                       info).tobytes() + np.asarray(y, "<i4").tobytes()
        for x, y in zip(xs[:3], ys[:3])))
    moved = _viper_pure_cpython(micropython, info, tmp_path / "data.bin", 4, tmp_path)
    assert all(moved.values()), moved


def test_what_has_no_integer_backward_is_refused_naming_the_node(tmp_path):
    from torch_reference import qat_qdq_model
    qat_qdq_model(mobilenet_v2_block(), tmp_path, 2)      # a float ReduceMean before the head
    for kwargs in (dict(train_biases=True), dict(train_last=2)):
        with pytest.raises(UnsupportedOpError, match="node '.*ReduceMean.*' .* no integer "
                                                     "backward"):
            int8_training_artifacts(tmp_path / "qdq.onnx", tmp_path / "int", 0.05, **kwargs)
    # its classifier alone trains
    info = int8_training_artifacts(tmp_path / "qdq.onnx", tmp_path / "int", 0.05)
    assert info["parameters"] == [info["weight"], info["bias"]]
    with pytest.raises(UnsupportedOpError, match="last 9 layers: the model has"):
        int8_training_artifacts(tmp_path / "qdq.onnx", tmp_path / "int", 0.05, train_last=9)


def test_an_input_gradient_of_too_many_products_is_refused_naming_the_node(tmp_path):
    # 512 outputs x 3x3 taps = 4608 products per element of the input's gradient: beyond
    # int_conv_grad_input's 4096, refused at pack time (the device would refuse the blob)
    from torch_reference import qat_qdq_model
    torch.manual_seed(9)
    module = nn.Sequential(nn.Conv2d(1, 2, 1), nn.ReLU(), nn.Conv2d(2, 512, 3, padding=1),
                           nn.ReLU(), nn.Conv2d(512, 4, 1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                           nn.Flatten(), nn.Linear(4, 3))
    xs, ys = qat_qdq_model(ReferenceModel("wide", module, (1, 4, 4), "CrossEntropyLoss", 2,
                                          {"SGD": 0.05}), tmp_path, 2)
    with pytest.raises(UnsupportedOpError, match=r"node '.*' \(QLinearConv\) sums 4608 "
                                                 r"products .* at most 4096"):
        int8_training_artifacts(tmp_path / "qdq.onnx", tmp_path / "int", 0.05,
                                train_biases=True)
    # the classifier and the last two layers train (no gradient through that input)
    info = int8_training_artifacts(tmp_path / "qdq.onnx", tmp_path / "int", 0.05,
                                   train_last=3)
    model = Module(info["blob"], CheckpointState.load_checkpoint(info["checkpoint"]))
    loss = model(quantize_input(xs[0], info).reshape(-1).tolist(), [int(v) for v in ys[0]])
    assert len(info["parameters"]) == 6 and np.isfinite(float(loss))
