"""Conformance (issue 26): every float model of the onnx package's backend test data
(onnx/backend/test/data/{pytorch-converted,pytorch-operator,simple}: models other people's
tools exported, most at opset 6, with their inputs and expected outputs) is packed as a new
user would pack it - the inputs after the first made initializers, loss=None, SGD - and
either runs forward on the device runtime matching the model's own expected outputs within
1e-4 relative, or is refused with microtrain's own error naming the op.

Oracles: the expected outputs stored beside each model (computed by the exporting
framework), and for the gradients of the models that pass, central finite differences of
onnxruntime running the packed eval graph in float64 on a sample of parameter elements.
onnxruntime's CPU provider has no float64 Conv, ConvTranspose or InstanceNormalization:
for the models with one of those the float64 runs are onnx's reference evaluator's, whose
float64 forward pass is first checked against onnxruntime's float32 one.

A float model is one whose first input is float32: 125 of the 140 (the others take
strings, int64 indices or doubles)."""
import glob
import os
import pathlib

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import microtrain_host as mh
from microtrain import CheckpointState, Module
from microtrain import parser as device_blob_parser

BACKEND_DATA = pathlib.Path(onnx.__file__).parent / "backend" / "test" / "data"
FOLDERS = ("pytorch-converted", "pytorch-operator", "simple")
FLOAT_MODELS = 125
FORWARD_TOLERANCE = 1e-4       # relative, as the issue asks: |a - b| / max(|b|, 1e-3)
GRADIENT_TOLERANCE = 1e-5      # |device - central difference| over max(1, max |gradient|):
                               # measured at most 2e-7 (float32 sums on the device)
SAMPLED_ELEMENTS = 6           # parameter elements checked per parameter
FD_STEP = 1e-6

# What microtrain refuses, by model, with the op its message must name. A model that
# starts passing, or a refusal that moves elsewhere, fails the test: update the table.
EXPECTED_REFUSALS = {
    "test_sequence_model1": "SequenceEmpty",
    "test_sequence_model2": "SequenceConstruct",
    "test_sequence_model3": "SequenceConstruct",
    "test_sequence_model4": "SequenceConstruct",
    "test_sequence_model5": "SequenceConstruct",
    "test_sequence_model6": "SplitToSequence",
    "test_sequence_model8": "SplitToSequence",
    "test_gradient_of_add": "Gradient",              # ai.onnx.preview.training
    "test_gradient_of_add_and_mul": "Gradient",
}


def read_tensor(path):
    tensor = TensorProto()
    tensor.ParseFromString(pathlib.Path(path).read_bytes())
    return numpy_helper.to_array(tensor)


def numbered(directory, prefix):
    paths = glob.glob(os.path.join(directory, f"{prefix}_*.pb"))
    return [read_tensor(p) for p in sorted(paths, key=lambda p: int(p.rsplit("_", 1)[1][:-3]))]


def float_models():
    """(name, model, inputs, expected outputs) of every model whose first input is float."""
    for folder in FOLDERS:
        for case in sorted(os.listdir(BACKEND_DATA / folder)):
            model = onnx.load(BACKEND_DATA / folder / case / "model.onnx")
            initializers = {i.name for i in model.graph.initializer}
            inputs = [i for i in model.graph.input if i.name not in initializers]
            if inputs[0].type.tensor_type.elem_type != TensorProto.FLOAT:
                continue
            data = BACKEND_DATA / folder / case / "test_data_set_0"
            yield case, model, numbered(data, "input"), numbered(data, "output")


def as_a_user_would(model, inputs):
    """The model with its inputs after the first made initializers holding the test data
    (parameters to train); before IR version 4 an initializer is also a graph input."""
    initializers = {i.name for i in model.graph.initializer}
    graph_inputs = [i for i in model.graph.input if i.name not in initializers]
    for vi, value in zip(graph_inputs[1:], inputs[1:]):
        model.graph.initializer.append(numpy_helper.from_array(value, vi.name))
        if model.ir_version >= 4:
            model.graph.input.remove(vi)
    return model


def elementwise_error(actual, expected):
    """max |a - b| / max(|b|, 1e-3) over the elements; NaN where exactly one is NaN."""
    actual = np.asarray(actual, np.float64).reshape(-1)
    expected = np.asarray(expected, np.float64).reshape(-1)
    if actual.shape != expected.shape:
        return np.inf
    if not np.array_equal(np.isnan(actual), np.isnan(expected)):
        return np.nan
    both = ~np.isnan(expected)
    if not both.any():
        return 0.0
    same_infinity = np.isinf(expected) & (actual == expected)
    difference = np.where(same_infinity, 0.0, np.abs(actual - expected))
    return float(np.max((difference / np.maximum(np.abs(expected), 1e-3))[both]))


def run_eval(artifacts, x):
    """The device runtime's eval outputs as flat float64 arrays: forward() of a blob whose
    loss is computed outside the graph, a call (the loss, then the other outputs) of one
    whose scalar first output is its loss."""
    module = Module(artifacts.blob, CheckpointState.load_checkpoint(artifacts.checkpoint)).eval()
    flat = x.astype(np.float32).reshape(-1)
    if "forward" in device_blob_parser.load(artifacts.blob).programs:
        results = module.forward(flat)
    else:
        results = module(flat)
    results = results if isinstance(results, list) else [results]
    return [np.array(r, np.float64).reshape(-1) for r in results]


def check(name, model, inputs, expected, directory):
    """("pass", artifacts) or ("refused", message) or ("wrong" / "crash", what)."""
    model = as_a_user_would(model, inputs)
    try:
        artifacts = mh.generate_artifacts(model, loss=None, optimizer="SGD",
                                          artifact_directory=directory)
    except mh.MicrotrainHostError as e:
        return "refused", f"{type(e).__name__}: {e}"
    except Exception as e:  # noqa: BLE001 - what the test must report
        return "crash", f"{type(e).__name__} at pack time: {e}"
    try:
        outputs = run_eval(artifacts, inputs[0])
    except Exception as e:  # noqa: BLE001
        return "crash", f"{type(e).__name__} on the device: {e}"
    if len(outputs) != len(expected):
        return "wrong", f"{len(outputs)} outputs, expected {len(expected)}"
    errors = [elementwise_error(o, e) for o, e in zip(outputs, expected)]
    if not all(error <= FORWARD_TOLERANCE for error in errors):  # NaN fails too
        return "wrong", f"relative errors {errors}"
    return "pass", artifacts


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """name -> (kind, artifacts or message, the model's inputs) for every float model."""
    found = {}
    for name, model, inputs, expected in float_models():
        kind, detail = check(name, model, inputs, expected, tmp_path_factory.mktemp(name))
        found[name] = (kind, detail, inputs)
    return found


def report(capsys, line):
    """A line on the terminal even though pytest captures the tests' output."""
    with capsys.disabled():
        print(f"\n{line}")


def test_every_float_model_passes_or_is_refused_by_name(results, capsys):
    kinds = {}
    for name, (kind, _, _) in results.items():
        kinds.setdefault(kind, []).append(name)
    refused = {name: results[name][1] for name in kinds.get("refused", [])}
    report(capsys, f"onnx backend test models: {len(results)} float models, "
                    f"{len(kinds.get('pass', []))} pass, {len(refused)} refused by name "
                    f"({', '.join(sorted({EXPECTED_REFUSALS.get(n, '?') for n in refused}))}), "
                    f"{len(kinds.get('wrong', []))} wrong, {len(kinds.get('crash', []))} crash")
    assert len(results) == FLOAT_MODELS
    problems = {name: results[name][1] for kind in ("wrong", "crash")
                for name in kinds.get(kind, [])}
    assert not problems, problems
    assert sorted(refused) == sorted(EXPECTED_REFUSALS), refused
    for name, message in refused.items():
        op = EXPECTED_REFUSALS[name]
        assert f"'{op}'" in message or f"({op})" in message or f"({op} of domain" in message, \
            (name, message)
        assert message.startswith("UnsupportedOpError"), (name, message)
    assert len(kinds["pass"]) >= 115


# -- gradients: the device's against finite differences of onnxruntime in float64 ---------

def float64_model(model):
    """The model with every float32 tensor (inputs, outputs, initializers, constants, value
    infos) made float64, for onnxruntime's double kernels."""
    model = onnx.ModelProto.FromString(model.SerializeToString())
    graph = model.graph
    for vi in list(graph.input) + list(graph.output) + list(graph.value_info):
        if vi.type.tensor_type.elem_type == TensorProto.FLOAT:
            vi.type.tensor_type.elem_type = TensorProto.DOUBLE
    for i, init in enumerate(graph.initializer):
        if init.data_type == TensorProto.FLOAT:
            graph.initializer[i].CopyFrom(numpy_helper.from_array(
                numpy_helper.to_array(init).astype(np.float64), init.name))
    for node in graph.node:
        for a in node.attribute:
            if a.type == onnx.AttributeProto.TENSOR and a.t.data_type == TensorProto.FLOAT:
                a.t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(a.t).astype(np.float64),
                                                     a.t.name))
    return model


def loss_of_outputs(outputs, seeds):
    """sum over the seeded outputs of seed * output, NaN outputs left out."""
    return sum(float(np.sum(np.where(np.isnan(s), 0.0, s * np.nan_to_num(o.reshape(-1)))))
               for o, s in zip(outputs, seeds))


def gradient_cases(results):
    """(name, artifacts, first input) of the passing models that train something."""
    for name, (kind, artifacts, inputs) in sorted(results.items()):
        if kind == "pass" and artifacts.trainable:
            yield name, artifacts, inputs[0]


def float64_runner(eval_model, feeds):
    """(run(feeds) -> outputs, which) for the eval model in float64: onnxruntime, or where
    it lacks a float64 kernel onnx's reference evaluator, checked against onnxruntime's
    float32 forward pass first."""
    model = float64_model(eval_model)
    try:
        session = ort.InferenceSession(model.SerializeToString(),
                                       providers=["CPUExecutionProvider"])
        return (lambda f: session.run(None, f)), "onnxruntime"
    except ort.capi.onnxruntime_pybind11_state.NotImplemented:
        pass
    from onnx.reference import ReferenceEvaluator
    evaluator = ReferenceEvaluator(model)
    float32 = ort.InferenceSession(eval_model.SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    for ours, theirs in zip(evaluator.run(None, feeds),
                            float32.run(None, {k: v.astype(np.float32) for k, v in feeds.items()})):
        assert elementwise_error(ours, theirs) <= FORWARD_TOLERANCE
    return (lambda f: evaluator.run(None, f)), "onnx reference"


def test_gradients_match_finite_differences_of_onnxruntime(results, capsys):
    rng = np.random.default_rng(26)
    checked = 0
    oracles = {}
    for name, artifacts, x in gradient_cases(results):
        eval_model = onnx.load(artifacts.eval_model)
        state = CheckpointState.load_checkpoint(artifacts.checkpoint)
        params = {p: np.array(state.parameters[p].data, np.float64).reshape(
            state.parameters[p].shape) for p in artifacts.trainable + artifacts.frozen}
        feeds = {eval_model.graph.input[0].name: x.astype(np.float64), **params}
        run, oracle = float64_runner(eval_model, feeds)
        oracles[oracle] = oracles.get(oracle, 0) + 1
        base = [np.asarray(o, np.float64) for o in run(feeds)]
        # The device's gradient of sum(seed * output) over the outputs the loss is computed
        # from: forward/backward blobs take one seed per loss input (the first output by
        # default); a blob whose first output is a scalar loss trains on that output.
        b = device_blob_parser.load(artifacts.blob)
        module = Module(artifacts.blob, state).train()
        flat = x.astype(np.float32).reshape(-1)
        if "forward" in b.programs:
            seeds = [np.where(np.isnan(o.reshape(-1)), 0.0, rng.standard_normal(o.size))
                     for o in base[:len(b.programs["backward"].inputs)]]
            module.forward(flat)
            module.backward(*[s.astype(np.float32) for s in seeds])
        else:
            seeds = [np.ones(1)]
            module(flat)
        undefined = any(np.isnan(o).any() for o in base)
        for p in artifacts.trainable:
            device_grad = np.array(state.parameters[p].grad, np.float64)
            picks = rng.choice(params[p].size, min(SAMPLED_ELEMENTS, params[p].size),
                               replace=False)
            for k in picks:
                if undefined and np.isnan(device_grad[k]):
                    # a NaN output (Pow of a negative base) left out of the loss: its zero
                    # seed times its NaN local derivative is NaN, as in torch
                    continue
                shifted = []
                for step in (FD_STEP, -FD_STEP):
                    moved = params[p].copy().reshape(-1)
                    moved[k] += step
                    outputs = run({**feeds, p: moved.reshape(params[p].shape)})
                    shifted.append(loss_of_outputs(outputs, seeds))
                expected = (shifted[0] - shifted[1]) / (2 * FD_STEP)
                scale = max(1.0, float(np.max(np.abs(device_grad))))
                assert abs(device_grad[k] - expected) <= GRADIENT_TOLERANCE * scale, \
                    (name, p, int(k), device_grad[k], expected)
                checked += 1
    report(capsys, f"gradients: {checked} parameter elements of {sum(oracles.values())} "
                    f"models against central differences in float64 ("
                    + ", ".join(f"{oracle}: {count} models" for oracle, count in oracles.items())
                    + ")")
    assert oracles.get("onnxruntime", 0) >= 20 and sum(oracles.values()) >= 50


# -- a model with nothing to train packs for its forward pass --------------------------------

def softmax_model():
    graph = helper.make_graph([helper.make_node("Softmax", ["x"], ["y"], axis=1)], "softmax",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 5])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 5])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_model_without_parameters_runs_forward_and_trains_nothing(tmp_path):
    # Many of the backend models are one parameter-free op (Softmax, a pooling, a Pad): they
    # pack, their blob computes the output, and a train step or an optimizer step changes
    # nothing and raises nothing. Oracle: onnxruntime.
    artifacts = mh.generate_artifacts(softmax_model(), loss=None, optimizer="SGD",
                                      artifact_directory=tmp_path)
    assert artifacts.trainable == [] and artifacts.frozen == []
    x = np.random.default_rng(1).standard_normal((2, 5)).astype(np.float32)
    (expected,) = ort.InferenceSession(softmax_model().SerializeToString(),
                                       providers=["CPUExecutionProvider"]).run(None, {"x": x})
    from microtrain import Optimizer
    state = CheckpointState.load_checkpoint(artifacts.checkpoint)
    module = Module(artifacts.blob, state)
    optimizer = Optimizer(artifacts.blob, module)
    assert elementwise_error(module.forward(x.reshape(-1)), expected) <= 1e-6
    module.backward(np.ones(10, np.float32))
    optimizer.step()
    assert elementwise_error(module.eval().forward(x.reshape(-1)), expected) <= 1e-6
    assert module.get_parameters_size() == 0


def test_model_whose_parameters_are_all_frozen_is_still_refused(tmp_path):
    # Nothing to train because the user froze everything is a mistake worth naming.
    model = softmax_model()
    model.graph.initializer.append(numpy_helper.from_array(np.ones(5, np.float32), "w"))
    model.graph.node.insert(0, helper.make_node("Mul", ["x", "w"], ["h"]))
    model.graph.node[1].input[0] = "h"
    with pytest.raises(mh.ArtifactError, match="no trainable parameters"):
        mh.generate_artifacts(model, loss=None, optimizer="SGD", frozen_params=["w"],
                              artifact_directory=tmp_path)


def test_pack_and_inspect_report_opset_6_and_nothing_to_train(tmp_path):
    import subprocess
    import sys
    model = BACKEND_DATA / "pytorch-converted" / "test_Softmax" / "model.onnx"
    packed = subprocess.run([sys.executable, "-m", "microtrain_host.cli", "pack", str(model),
                             "-o", str(tmp_path), "--loss", "none", "--optimizer", "sgd"],
                            capture_output=True, text=True, check=True).stdout.splitlines()
    line = "  exported at opset 6, upgraded on load to opset 17 with onnx.version_converter"
    assert packed[1] == line
    assert "trainable: none (nothing in the model trains: the blob runs its forward pass, " \
           "and training changes nothing)" in packed
    inspected = subprocess.run([sys.executable, "-m", "microtrain_host.cli", "inspect",
                                str(tmp_path / "model.mtb")],
                               capture_output=True, text=True, check=True).stdout
    assert inspected.splitlines()[1] == line
