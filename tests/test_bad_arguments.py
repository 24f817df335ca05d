"""Nothing lost, nothing silent: every bad input is a clear error.

First a table of bad arguments, files and data for every subcommand, each run as its own
`python -m microtrain_host.cli` process: exit status 2, exactly one line on stderr naming
the problem, no traceback. Then, per item of the issue, the exact error type and message
at the API (generate_artifacts, load_data, train, deploy.plan, federate), the MicroPython
failures reduced to their last line with errno numbers in words, and the fold limit."""
import importlib.util
import math
import os
import re
import resource
import subprocess
import sys
import zipfile

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

import microtrain_host as mh
from conftest import ROOT
from microtrain_host.pipeline import fold
from microtrain_host.tools import deploy, devices
from microtrain_host.tools.train import TrainError, device_error, load_data, train
from torch_reference import export, mlp

EXAMPLE = ROOT / "examples" / "digits"
MODEL = EXAMPLE / "mlp.onnx"
DIGITS = EXAMPLE / "digits.npz"
HAS_FLOWER = (importlib.util.find_spec("flwr") is not None
              and importlib.util.find_spec("ray") is not None)
needs_flower = pytest.mark.skipif(not HAS_FLOWER, reason="the flower extra is not installed")
needs_proc = pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="no /proc")


# -- models and files the table refers to ------------------------------------------------

def _model(nodes, initializers, input_shape, output_shape, opsets=(("", 17),)):
    graph = helper.make_graph(
        nodes, "bad", [helper.make_tensor_value_info("input", TensorProto.FLOAT, input_shape)],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, output_shape)],
        initializers)
    return helper.make_model(graph, ir_version=8, opset_imports=[
        helper.make_opsetid(domain, version) for domain, version in opsets])


def conv_model(strides):
    w = numpy_helper.from_array(np.ones((2, 1, 3, 3), np.float32), "w")
    conv = helper.make_node("Conv", ["input", "w"], ["output"], name="conv", strides=strides)
    return _model([conv], [w], [2, 1, 8, 8], [2, 2, None, None])


def typed_mlp(elem_type):
    """The 6-16-8-3 MLP with every initializer (and the graph's input and output) of
    elem_type: what a model exported in half or double precision looks like."""
    model = export(mlp(6, 3), torch.zeros(1, 6))
    dtype = helper.tensor_dtype_to_np_dtype(elem_type)
    for init in model.graph.initializer:
        init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init).astype(dtype),
                                              init.name))
    for value in list(model.graph.input) + list(model.graph.output):
        value.type.tensor_type.elem_type = elem_type
    return model


def custom_domain_model():
    w = numpy_helper.from_array(np.ones((4, 3), np.float32), "w")
    nodes = [helper.make_node("MatMul", ["input", "w"], ["h"], name="dense"),
             helper.make_node("FancyAct", ["h"], ["output"], name="fancy",
                              domain="com.example")]
    return _model(nodes, [w], ["N", 4], ["N", 3], (("", 17), ("com.example", 1)))


def huge_constant_model(op_type="ConstantOfShape"):
    """input * w + sum(a 1e9-element constant): the constant is shape arithmetic that
    pack-time folding would compute (ConstantOfShape([1e9]), or Range(0, 1e9, 1))."""
    if op_type == "ConstantOfShape":
        nodes = [helper.make_node("Constant", [], ["shape"], name="shape",
                                  value=numpy_helper.from_array(np.array([10**9], np.int64))),
                 helper.make_node("ConstantOfShape", ["shape"], ["big"], name="huge",
                                  value=numpy_helper.from_array(np.array([0.0])))]
    else:
        nodes = [helper.make_node("Constant", [], [name], name=name,
                                  value=numpy_helper.from_array(np.array(v, np.int64)))
                 for name, v in (("start", 0), ("limit", 10**9), ("delta", 1))]
        nodes.append(helper.make_node("Range", ["start", "limit", "delta"], ["big"],
                                      name="huge"))
    nodes += [helper.make_node("ReduceSum", ["big"], ["total"], name="total", keepdims=0),
              helper.make_node("Cast", ["total"], ["total_f"], name="cast", to=1),
              helper.make_node("Mul", ["input", "w"], ["h"], name="scale"),
              helper.make_node("Add", ["h", "total_f"], ["output"], name="add")]
    w = numpy_helper.from_array(np.ones(4, np.float32), "w")
    return _model(nodes, [w], [2, 4], [2, 4])


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """Paths the table's arguments name: a packed digits MLP, bad models, bad data."""
    tmp = tmp_path_factory.mktemp("bad_arguments")
    build = tmp / "build"
    mh.generate_artifacts(str(MODEL), artifact_directory=str(build), batch_size=8)
    paths = {"model": MODEL, "digits": DIGITS, "build": build, "tmp": tmp,
             "ckpt": build / "checkpoint", "missing": tmp / "missing"}
    paths["file"] = tmp / "plain.txt"
    paths["file"].write_text("not a model, not data, not a checkpoint\n")
    for name, model in (("strides_model", conv_model([2**62, 2**62])),
                        ("half_model", typed_mlp(TensorProto.FLOAT16)),
                        ("custom_model", custom_domain_model()),
                        ("huge_model", huge_constant_model())):
        paths[name] = tmp / f"{name}.onnx"
        onnx.save(model, paths[name])
    digits = dict(np.load(DIGITS))
    paths["truncated_npz"] = tmp / "truncated.npz"
    paths["truncated_npz"].write_bytes(DIGITS.read_bytes()[:5000])
    paths["npy"] = tmp / "x.npy"
    np.save(paths["npy"], digits["x_train"])
    paths["objects_npz"] = tmp / "objects.npz"
    np.savez(paths["objects_npz"], x=np.array([[1, 2], [3]], dtype=object), y=np.arange(2))
    paths["features_npz"] = tmp / "features.npz"
    np.savez(paths["features_npz"], x_train=digits["x_train"][:, :60],
             y_train=digits["y_train"], x_val=digits["x_val"][:, :60], y_val=digits["y_val"])
    return paths


# -- the table: argv (with {names} of files), the words stderr must hold ----------------

B = "{build}"
D = ["--data", "{digits}"]
CASES = [
    ([], "the following arguments are required: command"),
    (["fly"], "argument command: invalid choice: 'fly'"),
    # pack
    (["pack", "{model}"], "the following arguments are required: -o/--output"),
    (["pack", "{model}", "-o", "{tmp}/p", "--batch-size", "-4"],
     "argument --batch-size: must be a positive integer, got -4"),
    (["pack", "{model}", "-o", "{tmp}/p", "--batch-size", "0"],
     "argument --batch-size: must be a positive integer, got 0"),
    (["pack", "{model}", "-o", "{tmp}/p", "--batch-size", "eight"],
     "argument --batch-size: 'eight' is not an integer"),
    (["pack", "{model}", "-o", "{tmp}/p", "--lr", "nan"],
     "argument --lr: must be a finite number >= 0, got nan"),
    (["pack", "{model}", "-o", "{tmp}/p", "--lr", "-1"],
     "argument --lr: must be a finite number >= 0, got -1"),
    (["pack", "{model}", "-o", "{tmp}/p", "--weight-decay", "inf"],
     "argument --weight-decay: must be a finite number >= 0, got inf"),
    (["pack", "{model}", "-o", "{tmp}/p", "--clip-grad-norm", "0"],
     "argument --clip-grad-norm: must be a finite number > 0, got 0"),
    (["pack", "{model}", "-o", "{tmp}/p", "--train-last", "-1"],
     "argument --train-last: must be an integer >= 0, got -1"),
    (["pack", "{model}", "-o", "{tmp}/p", "--qat", "--observer-momentum", "2"],
     "argument --observer-momentum: must be a number in (0, 1], got 2"),
    (["pack", "{model}", "-o", "{file}", "--batch-size", "8"],
     "artifact directory '{file}' is an existing file; give a directory (created when "
     "missing)"),
    (["pack", "{model}", "-o", "{file}/sub", "--batch-size", "8"],
     "cannot create or write the artifact directory '{file}/sub': Not a directory"),
    pytest.param(["pack", "{model}", "-o", "/proc/microtrain/x", "--batch-size", "8"],
                 "cannot create or write the artifact directory '/proc/microtrain/x': No such "
                 "file or directory", marks=needs_proc, id="pack-o-proc"),
    (["pack", "{missing}.onnx", "-o", "{tmp}/p"], "cannot read ONNX model '{missing}.onnx'"),
    (["pack", "{file}", "-o", "{tmp}/p"], "cannot read ONNX model '{file}'"),
    (["pack", "{strides_model}", "-o", "{tmp}/p", "--loss", "mse"],
     "Conv node 'conv': attribute strides=[4611686018427387904, 4611686018427387904] does "
     "not fit the device's int32 step arguments"),
    (["pack", "{half_model}", "-o", "{tmp}/p", "--batch-size", "2", "--loss", "mse"],
     "the model's parameters must be float32 (microtrain trains float32 only); it has "
     "float16 '0.weight'"),
    (["pack", "{custom_model}", "-o", "{tmp}/p", "--batch-size", "2", "--loss", "mse"],
     "node 'fancy' (FancyAct of domain 'com.example')"),
    (["pack", "{huge_model}", "-o", "{tmp}/p", "--loss", "mse"],
     "ConstantOfShape node 'huge' computes a constant of 1,000,000,000 elements"),
    # inspect
    (["inspect", "{missing}.mtb"], "BlobError: cannot read blob '{missing}.mtb'"),
    (["inspect", "{file}"], "BlobError:"),
    (["inspect", "{model}", "--batch-size", "0"],
     "argument --batch-size: must be a positive integer, got 0"),
    (["inspect", "{model}", "--max-layers", "0"],
     "argument --max-layers: must be a positive integer, got 0"),
    (["inspect", "{build}/model.mtb", "--board", "nope"], "no board profile 'nope'"),
    # train
    (["train", B, *D, "--epochs", "0"], "argument --epochs: must be a positive integer, got 0"),
    (["train", B, *D, "--epochs", "-1"], "argument --epochs: must be a positive integer, got -1"),
    (["train", B, *D, "--lr", "nan"], "argument --lr: must be a finite number >= 0, got nan"),
    (["train", B, *D, "--lr", "-0.1"], "argument --lr: must be a finite number >= 0, got -0.1"),
    (["train", B, *D, "--seed", "-1"], "argument --seed: must be an integer >= 0, got -1"),
    (["train", B, *D, "--heap", "lots"],
     "argument --heap: must be a size like 8M, 512K or 65536, got 'lots'"),
    (["train", B, *D, "--max-arena-bytes", "0"],
     "argument --max-arena-bytes: must be a positive integer, got 0"),
    (["train", B, *D, "--max-arena-bytes", "20000"],
     "OutOfMemoryError: '{build}/model.mtb' needs 43772 bytes of arenas, over the budget of "
     "20000 bytes (max_arena_bytes)"),
    (["train", B, *D, "--max-arena-bytes", "20000", "--runtime", "micropython"],
     "OutOfMemoryError: '{build}/model.mtb' needs 43772 bytes of arenas, over the budget of "
     "20000 bytes (max_arena_bytes)"),
    (["train", B], "the following arguments are required: --data"),
    (["train", B, "--data", "{missing}.npz"], "data file '{missing}.npz' does not exist"),
    (["train", B, "--data", "{tmp}"], "data '{tmp}' is a directory; give an .npz file"),
    (["train", B, "--data", "{file}"], "data '{file}' is not an .npz file (it does not start "
                                       "as a zip archive)"),
    (["train", B, "--data", "{truncated_npz}"],
     "cannot read data '{truncated_npz}': a damaged or truncated .npz (File is not a zip "
     "file)"),
    (["train", B, "--data", "{npy}"], "data '{npy}' holds a single array (an .npy file)"),
    (["train", B, "--data", "{objects_npz}"],
     "'{objects_npz}': array 'x' holds Python objects (dtype object)"),
    (["train", B, "--data", "{features_npz}"],
     "'{features_npz}': train inputs have 60 values per sample, the model's input 'input' "
     "[8, 64] needs 64"),
    (["train", B, *D, "--output", B],
     "--output '{build}' is a directory; give the path of the file to write"),
    (["train", B, *D, "--output", "{missing}/ckpt"],
     "--output '{missing}/ckpt': directory '{missing}' does not exist"),
    (["train", "{missing}", *D], "'{missing}' holds no packed model: model.mtb and checkpoint"),
    # deploy
    (["deploy", B, "--board", "qemu-mps2-an385", *D, "--steps", "0"],
     "argument --steps: must be a positive integer, got 0"),
    (["deploy", B, "--board", "qemu-mps2-an385", *D, "--steps", "-1"],
     "argument --steps: must be a positive integer, got -1"),
    (["deploy", B, "--board", "qemu-mps2-an385", *D, "--epochs", "0"],
     "argument --epochs: must be a positive integer, got 0"),
    (["deploy", B, "--board", "qemu-mps2-an385", *D, "--epochs", "-1"],
     "argument --epochs: must be a positive integer, got -1"),
    (["deploy", B, "--board", "qemu-mps2-an385", *D, "--steps", "2", "--epochs", "1"],
     "argument --epochs: not allowed with argument --steps"),
    (["deploy", B, "--board", "qemu-mps2-an385", *D, "--lr", "nan"],
     "argument --lr: must be a finite number >= 0, got nan"),
    (["deploy", B, "--board", "nope", *D, "--dry-run"], "no board profile 'nope'"),
    (["deploy", B, "--board", "qemu-mps2-an385", "--data", "{npy}", "--dry-run"],
     "data '{npy}' holds a single array (an .npy file)"),
    (["deploy", B, "--board", "qemu-mps2-an385", "--data", "{features_npz}", "--dry-run"],
     "'{features_npz}': train inputs have 60 values per sample"),
    (["deploy", B, "--board", "qemu-mps2-an385", *D, "--output", B, "--dry-run"],
     "--output '{build}' is a directory"),
    (["deploy", B, "--board", "qemu-mps2-an385", *D, "--resume", "{missing}", "--dry-run"],
     "--resume '{missing}' does not exist"),
    (["deploy", B, "--board", "qemu-mps2-an385", *D, "--resume", "{tmp}", "--dry-run"],
     "--resume '{tmp}' is not a file; give a checkpoint"),
    (["deploy", B, "--board", "qemu-mps2-an385", *D, "--resume", "{file}", "--dry-run"],
     "--resume '{file}': CheckpointError: '{file}' is not a training checkpoint"),
    (["deploy", B, "--board", "qemu-mps2-an385", *D, "--resume", "{ckpt}", "--dry-run"],
     "--resume '{ckpt}' has no optimizer state: save it with --with-optimizer-state"),
    # export
    (["export", B, "--checkpoint", "{ckpt}", "-o", B],
     "-o/--output '{build}' is a directory; give the path of the file to write"),
    (["export", B, "--checkpoint", "{ckpt}", "-o", "{missing}/m.onnx"],
     "-o/--output '{missing}/m.onnx': directory '{missing}' does not exist"),
    (["export", B, "--checkpoint", "{missing}", "-o", "{tmp}/m.onnx"],
     "cannot read checkpoint '{missing}'"),
    (["export", B, "--checkpoint", "{ckpt}", "-o", "{tmp}/m.onnx", "--int8-blob", "{tmp}/m.mtb"],
     "--int8-blob needs --qdq"),
    (["export", B, "--checkpoint", "{ckpt}", "-o", "{tmp}/m.onnx", "--int8-lr", "0"],
     "argument --int8-lr: must be a finite number > 0, got 0"),
    (["export", B, "--checkpoint", "{ckpt}", "-o", "{tmp}/m.onnx", "--int8-momentum", "1"],
     "argument --int8-momentum: must be a number in [0, 1), got 1"),
    # aggregate
    (["aggregate", "{ckpt}", "{ckpt}", "--weights", "1", "-o", "{tmp}/g"],
     "1 weights for 2 checkpoints"),
    (["aggregate", "{ckpt}", "{ckpt}", "--weights", "-1", "1", "-o", "{tmp}/g"],
     "argument --weights: must be a finite number >= 0, got -1"),
    (["aggregate", "{ckpt}", "{ckpt}", "--weights", "nan", "1", "-o", "{tmp}/g"],
     "argument --weights: must be a finite number >= 0, got nan"),
    (["aggregate", "{ckpt}", "{ckpt}", "--weights", "0", "0", "-o", "{tmp}/g"],
     "weights must be finite, non-negative and not all zero"),
    (["aggregate", "{ckpt}", "{missing}", "-o", "{tmp}/g"], "cannot read checkpoint '{missing}'"),
    (["aggregate", "{ckpt}", "{file}", "-o", "{tmp}/g"], "not a training checkpoint"),
    (["aggregate", "{ckpt}", "{ckpt}", "-o", B], "-o/--output '{build}' is a directory"),
    # samples
    (["samples", "{missing}"], "SampleError: cannot open sample store '{missing}': No such file"),
    (["samples", "{file}"], "'{file}' is not a sample store (it does not start with MTSS)"),
    (["samples", B], "cannot open sample store '{build}': is a directory"),
    (["samples", "{file}", "--npz", B], "--npz '{build}' is a directory"),
    # federate
    (["federate", B, *D, "--lr", "nan"], "argument --lr: must be a finite number >= 0, got nan"),
    (["federate", B, *D, "--lr", "-1"], "argument --lr: must be a finite number >= 0, got -1"),
    (["federate", B, *D, "--workers", "0"],
     "argument --workers: must be a positive integer, got 0"),
    (["federate", B, *D, "--clients", "0"],
     "argument --clients: must be a positive integer, got 0"),
    (["federate", B, *D, "--rounds", "0"], "argument --rounds: must be a positive integer, got 0"),
    (["federate", B, *D, "--epochs", "-1"],
     "argument --epochs: must be a positive integer, got -1"),
    (["federate", B, *D, "--alpha", "0"], "argument --alpha: must be a finite number > 0, got 0"),
    (["federate", B, *D, "--fraction", "1.5"],
     "argument --fraction: must be a number in (0, 1], got 1.5"),
    (["federate", B, *D, "--seed", "-3"], "argument --seed: must be an integer >= 0, got -3"),
    pytest.param(["federate", B, *D, "--clients", "4", "--keep-updates", "{file}"],
                 "cannot keep the updates in '{file}': it is a file, not a directory",
                 marks=needs_flower, id="federate-keep-updates-file"),
    pytest.param(["federate", B, "--data", "{features_npz}", "--clients", "4"],
                 "'{features_npz}': train inputs have 60 values per sample",
                 marks=needs_flower, id="federate-feature-count"),
    pytest.param(["federate", B, "--data", "{npy}", "--clients", "4"],
                 "data '{npy}' holds a single array", marks=needs_flower, id="federate-npy"),
    pytest.param(["federate", B, *D, "--clients", "4", "-o", B],
                 "-o/--output '{build}' is a directory", marks=needs_flower,
                 id="federate-o-directory"),
]


def run_cli(argv, **kwargs):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(ROOT / "host"), str(ROOT / "device"), os.environ.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, "-m", "microtrain_host.cli", *map(str, argv)],
                          capture_output=True, text=True, env=env, timeout=600, **kwargs)


def _case_id(case):
    argv, _ = case
    return "_".join(a.replace("{", "").replace("}", "") for a in argv) or "no-command"


@pytest.mark.parametrize("argv, words", CASES, ids=[
    c.id if hasattr(c, "id") else _case_id(c) for c in CASES])
def test_bad_argument_is_one_line_and_exit_2(files, argv, words):
    # the huge constant, were it computed, needs 7.45 GiB: fail on an address-space limit
    # rather than push the machine into its OOM killer
    limit = (lambda: resource.setrlimit(resource.RLIMIT_AS, (4 * 2**30, 4 * 2**30))) \
        if "{huge_model}" in argv else None
    argv = [a.format(**files) for a in argv]
    proc = run_cli(argv, preexec_fn=limit)
    command = argv[0] if argv and not argv[0].startswith("-") and argv[0] != "fly" else ""
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr, proc.stderr
    assert len(proc.stderr.splitlines()) == 1, proc.stderr
    prefix = f"microtrain {command}: error: " if command else "microtrain: error: "
    assert proc.stderr.startswith(prefix), proc.stderr
    assert words.format(**files) in proc.stderr, proc.stderr


def test_the_table_covers_every_subcommand():
    from microtrain_host.cli_parser import build_parser
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    covered = {c.values[0][0] if hasattr(c, "values") else c[0][0]
               for c in CASES if (c.values[0] if hasattr(c, "values") else c[0])}
    assert set(sub.choices) <= covered, set(sub.choices) - covered


# -- item 13: pack validates its arguments and the model ----------------------------------

@pytest.fixture(scope="module")
def small_mlp():
    return export(mlp(6, 3), torch.zeros(1, 6))


@pytest.mark.parametrize("batch_size, shown", [(-4, "-4"), (0, "0")])
def test_pack_refuses_a_batch_size_below_one(small_mlp, tmp_path, batch_size, shown):
    # before: TypeError: bad number -256 for type uint32; 0 wrote a blob the device refused
    with pytest.raises(mh.ArtifactError) as e:
        mh.generate_artifacts(small_mlp, artifact_directory=tmp_path / "a",
                              batch_size=batch_size)
    assert str(e.value) == f"batch_size must be a positive integer, got {shown}"
    assert not (tmp_path / "a").exists()


@pytest.mark.parametrize("batch_size, shown", [(2.0, "2.0 (float)"), (True, "True (bool)"),
                                               ("8", "'8' (str)")])
def test_pack_refuses_a_batch_size_that_is_no_int(small_mlp, tmp_path, batch_size, shown):
    with pytest.raises(mh.ArtifactError) as e:
        mh.generate_artifacts(small_mlp, artifact_directory=tmp_path, batch_size=batch_size)
    assert str(e.value) == f"batch_size must be a positive integer, got {shown}"


def test_pack_accepts_a_numpy_batch_size(small_mlp, tmp_path):
    result = mh.generate_artifacts(small_mlp, artifact_directory=tmp_path,
                                   batch_size=np.int64(4))
    from microtrain import parser
    b = parser.load(result.blob)
    assert b.shapes[b.programs["train"].inputs[0]][0] == 4


@pytest.mark.parametrize("strides", [[2**62, 2**62], [2**31, 1]])
def test_pack_refuses_an_attribute_outside_int32(tmp_path, strides):
    # before: OverflowError: Python integer 4611686018427387904 out of bounds for int32
    with pytest.raises(mh.UnsupportedOpError) as e:
        mh.generate_artifacts(conv_model(strides), artifact_directory=tmp_path, loss="MSELoss")
    assert str(e.value) == (f"Conv node 'conv': attribute strides={strides} does not fit the "
                            f"device's int32 step arguments (-2**31 .. 2**31 - 1)")


def test_an_attribute_the_lowering_reduces_may_exceed_int32(tmp_path):
    """A Dropout seed is taken modulo the device generator's span: 2**40 is fine."""
    w = numpy_helper.from_array(np.ones((4, 3), np.float32), "w")
    nodes = [helper.make_node("Constant", [], ["ratio"], name="ratio",
                              value=numpy_helper.from_array(np.array(0.5, np.float32))),
             helper.make_node("Constant", [], ["training"], name="training",
                              value=numpy_helper.from_array(np.array(True))),
             helper.make_node("Mul", ["input", "w"], ["h"], name="scale"),
             helper.make_node("Dropout", ["h", "ratio", "training"], ["output", "mask"],
                              name="drop", seed=2**40)]
    result = mh.generate_artifacts(_model(nodes, [w], [4, 3], [4, 3]),
                                   artifact_directory=tmp_path, loss="MSELoss")
    assert os.path.getsize(result.blob) > 0


@pytest.mark.parametrize("elem_type, kind", [(TensorProto.FLOAT16, "float16"),
                                             (TensorProto.DOUBLE, "float64 (double)"),
                                             (TensorProto.BFLOAT16, "bfloat16")])
def test_pack_names_a_parameter_dtype_other_than_float32(tmp_path, elem_type, kind):
    # before: "no trainable parameters: requires_grad is empty or every parameter is frozen"
    with pytest.raises(mh.ArtifactError) as e:
        mh.generate_artifacts(typed_mlp(elem_type), artifact_directory=tmp_path, batch_size=2,
                              loss="MSELoss")
    assert str(e.value) == (
        f"the model's parameters must be float32 (microtrain trains float32 only); it has "
        f"{kind} '0.weight', '0.bias', '2.weight' and 3 more. Convert the model to float32 "
        f"before export (PyTorch: model.float())")


def test_pack_names_the_types_of_an_integer_model(tmp_path):
    with pytest.raises(mh.ArtifactError) as e:
        mh.generate_artifacts(typed_mlp(TensorProto.INT64), artifact_directory=tmp_path,
                              batch_size=2, loss="MSELoss")
    assert str(e.value) == (
        "the model has no float32 initializer to train; its initializers are int64 "
        "'0.weight', '0.bias', '2.weight' and 3 more. microtrain trains float32 parameters: "
        "export the model's weights as float32")


def test_pack_names_the_op_of_a_custom_domain_node(tmp_path):
    # before: DynamicShapeError: cannot fix the shape of 'output' produced by node 'fancy'
    # (FancyAct); pass batch_size or export with static shapes - with the batch size given
    with pytest.raises(mh.UnsupportedOpError) as e:
        mh.generate_artifacts(custom_domain_model(), artifact_directory=tmp_path, batch_size=2,
                              loss="MSELoss")
    assert str(e.value) == (
        "node 'fancy' (FancyAct of domain 'com.example'): microtrain runs the standard ONNX "
        "ops (domain ai.onnx) and has no lowering for another domain's op; express it with "
        "standard ops")


# -- item 14: files, data, epochs, MicroPython's errors -----------------------------------

def test_pack_refuses_an_existing_file_as_artifact_directory(small_mlp, tmp_path):
    # before: FileExistsError, after the whole pack
    target = tmp_path / "model.mtb"
    target.write_bytes(b"keep me")
    with pytest.raises(mh.ArtifactError) as e:
        mh.generate_artifacts(small_mlp, artifact_directory=target, batch_size=2)
    assert str(e.value) == (f"artifact directory '{target}' is an existing file; give a "
                            f"directory (created when missing)")
    assert target.read_bytes() == b"keep me"


@needs_proc
def test_pack_refuses_a_directory_it_cannot_create(small_mlp):
    # before: FileNotFoundError: [Errno 2] No such file or directory: '/proc/x'
    with pytest.raises(mh.ArtifactError) as e:
        mh.generate_artifacts(small_mlp, artifact_directory="/proc/x", batch_size=2)
    assert str(e.value) == ("cannot create or write the artifact directory '/proc/x': "
                            "No such file or directory")


def test_pack_probe_leaves_no_directory_behind(small_mlp, tmp_path):
    """The directory check makes the missing directories to see that it can; a pack that
    fails afterwards leaves none of them."""
    target = tmp_path / "new" / "build"
    with pytest.raises(mh.ArtifactError, match="unknown loss"):
        mh.generate_artifacts(small_mlp, artifact_directory=target, batch_size=2,
                              loss="Hinge")
    assert not (tmp_path / "new").exists()


def test_pack_writes_into_an_existing_directory(small_mlp, tmp_path):
    """The documented behaviour of `pack -o EXISTING_DIRECTORY`: the artifacts are replaced,
    other files are left alone."""
    (tmp_path / "notes.txt").write_text("mine")
    (tmp_path / "model.mtb").write_bytes(b"old")
    result = mh.generate_artifacts(small_mlp, artifact_directory=tmp_path, batch_size=2)
    assert (tmp_path / "notes.txt").read_text() == "mine"
    assert open(result.blob, "rb").read() != b"old"


def _write_npz_with_member(path, name, payload):
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(name + ".npy", payload)


@pytest.mark.parametrize("case, message", [
    ("missing", "data file '{path}' does not exist"),
    ("text", "data '{path}' is not an .npz file (it does not start as a zip archive); save "
             "the arrays with numpy.savez"),
    ("truncated", "cannot read data '{path}': a damaged or truncated .npz (File is not a zip "
                  "file)"),
    ("npy", "data '{path}' holds a single array (an .npy file); training needs an .npz with "
            "arrays x_train, y_train (and x_val, y_val) or x, y: numpy.savez(path, "
            "x_train=..., y_train=...)"),
    ("objects", "'{path}': array 'x' holds Python objects (dtype object); save numbers, e.g. "
                "numpy.asarray(values, numpy.float32)"),
    ("strings", "'{path}': array 'x' has dtype <U1; training needs numbers (int or float)"),
    ("damaged member", "cannot read array 'x' of '{path}': the file is corrupt"),
    ("lengths", "'{path}': x has 10 samples, y 9"),
    ("nan", "'{path}': x_train holds NaN or infinite values (2 of 40)"),
    ("keys", "'{path}' needs arrays x_train, y_train (and x_val, y_val) or x, y; it has "
             "['inputs', 'labels']"),
])
def test_load_data_names_the_file_and_the_problem(tmp_path, case, message):
    # before: BadZipFile, AttributeError ('numpy.ndarray' object has no attribute 'files'),
    # ValueError (Object arrays cannot be loaded when allow_pickle=False)
    path = tmp_path / "data.npz"
    if case == "text":
        path.write_text("1,2,3\n")
    elif case == "truncated":
        path.write_bytes(DIGITS.read_bytes()[:5000])
    elif case == "npy":
        path = tmp_path / "data.npy"
        np.save(path, np.zeros((4, 2), np.float32))
    elif case == "objects":
        np.savez(path, x=np.array([[1, 2], [3]], dtype=object), y=np.arange(2))
    elif case == "strings":
        np.savez(path, x=np.array(["a", "b"]), y=np.arange(2))
    elif case == "damaged member":
        _write_npz_with_member(path, "x", b"\x93NUMPY\x01\x00garbage")
        with zipfile.ZipFile(path, "a") as z:
            z.writestr("y.npy", b"")
    elif case == "lengths":
        np.savez(path, x=np.zeros((10, 4), np.float32), y=np.zeros(9))
    elif case == "nan":
        x = np.zeros((10, 4), np.float32)
        x[3, 1], x[5, 2] = np.nan, np.inf
        np.savez(path, x_train=x, y_train=np.zeros(10), x_val=x[:2] * 0, y_val=np.zeros(2))
    elif case == "keys":
        np.savez(path, inputs=np.zeros(3), labels=np.zeros(3))
    with pytest.raises(TrainError) as e:
        load_data(path)
    assert str(e.value).startswith(message.format(path=path)), str(e.value)


@pytest.mark.parametrize("epochs", [0, -1])
def test_train_refuses_epochs_below_one(files, tmp_path, epochs):
    # before: `microtrain train --epochs 0` trained nothing, wrote a checkpoint, exit 0
    with pytest.raises(TrainError) as e:
        train(files["build"], DIGITS, epochs, 0.01, tmp_path / "ckpt")
    assert str(e.value) == f"epochs must be a positive integer, got {epochs}"
    assert not (tmp_path / "ckpt").exists()


@pytest.mark.parametrize("lr", [math.nan, -0.5, math.inf])
def test_train_refuses_a_learning_rate_that_is_not_finite_and_non_negative(files, tmp_path, lr):
    with pytest.raises(TrainError) as e:
        train(files["build"], DIGITS, 1, lr, tmp_path / "ckpt")
    assert str(e.value) == f"learning rate must be a finite number >= 0, got {lr!r}"


def test_train_output_on_the_artifact_directory_is_refused(files):
    """Before, `train --output ARTIFACTS` moved the artifact directory aside to
    ARTIFACTS.bak and wrote the checkpoint in its place (the device's atomic save)."""
    proc = run_cli(["train", files["build"], "--data", DIGITS, "--epochs", "1", "--output",
                    files["build"]])
    assert proc.returncode == 2 and len(proc.stderr.splitlines()) == 1, proc.stderr
    assert (files["build"] / "model.mtb").is_file()
    assert not os.path.exists(f"{files['build']}.bak")


@pytest.fixture(scope="module")
def small_digits(tmp_path_factory):
    """16 training and 8 validation digits: a MicroPython epoch is quick, and every data
    file the run writes is smaller than the checkpoint (10,028 bytes)."""
    data = np.load(DIGITS)
    path = tmp_path_factory.mktemp("small") / "digits16.npz"
    np.savez(path, x_train=data["x_train"][:16], y_train=data["y_train"][:16],
             x_val=data["x_val"][:8], y_val=data["y_val"][:8])
    return path


def test_micropython_failure_is_its_last_line_in_words(files, small_digits, tmp_path,
                                                       micropython):
    # before: "MicroPython run failed:" and the traceback, "[Errno 2] ENOENT"
    out = tmp_path / "no_such_directory" / "ckpt"
    with pytest.raises(TrainError) as e:
        train(files["build"], small_digits, 1, 0.01, out, runtime="micropython",
              micropython=micropython)
    assert str(e.value) == (f"MicroPython run failed: CheckpointError: cannot write checkpoint "
                            f"'{out}': no such file or directory (errno 2)")


def test_micropython_bare_errno_becomes_words(files, small_digits, tmp_path, micropython):
    """MicroPython prints an errno its port has no name for as the bare number ("28" for
    a full disk); the device runtime's file errors spell the ones a save meets
    (files.reason), the CLI any other (errno_in_words, below). Here MicroPython runs under a
    file size limit of 8 KiB (ulimit -f 16, SIGXFSZ ignored, set by a wrapper given as
    --micropython): writing the 10,028-byte checkpoint fails with EFBIG, errno 27."""
    out = tmp_path / "ckpt"
    wrapper = tmp_path / "micropython-8k"
    wrapper.write_text(f"#!/bin/sh\nulimit -f 16\ntrap '' XFSZ\nexec '{micropython}' \"$@\"\n")
    wrapper.chmod(0o755)
    proc = run_cli(["train", files["build"], "--data", small_digits, "--epochs", "1",
                    "--runtime", "micropython", "--micropython", wrapper, "--output", out])
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr == (f"microtrain train: error: MicroPython run failed: CheckpointError: "
                           f"cannot write checkpoint '{out}': file too large (errno 27)\n")


@pytest.mark.parametrize("output, line", [
    ("Traceback (most recent call last):\n  File \"microtrain/fit.py\", line 174, in <module>\n"
     "  File \"microtrain/checkpoint.py\", line 134, in write_atomically\n"
     "CheckpointError: cannot write checkpoint '/sd/ckpt': 28\n",
     "CheckpointError: cannot write checkpoint '/sd/ckpt': [Errno 28] No space left on device"),
    ("OSError: [Errno 13] EACCES\n", "OSError: [Errno 13] Permission denied"),
    ("OSError: 5\n", "OSError: [Errno 5] Input/output error"),
    ("step 1 0.5\nTraceback (most recent call last):\n  File \"<stdin>\", line 3\n"
     "MemoryError: memory allocation failed, allocating 4096 bytes\n",
     "MemoryError: memory allocation failed, allocating 4096 bytes"),
    # a number that is not an errno after a path is left alone
    ("BlobError: train step 0 (gemm): count 0 must be at least 1",
     "BlobError: train step 0 (gemm): count 0 must be at least 1"),
    ("", "killed by signal SIGKILL"),
])
def test_device_error_takes_the_last_exception_line(output, line):
    assert device_error(output, -9 if not output else 1) == line


# -- item 15: deploy and federate check everything before they start ----------------------

@pytest.mark.parametrize("kwargs, message", [
    ({"steps": 0}, "steps must be a positive integer, got 0"),
    ({"steps": -1}, "steps must be a positive integer, got -1"),
    ({"epochs": 0}, "epochs must be a positive integer, got 0"),
    ({"epochs": -1}, "epochs must be a positive integer, got -1"),
    ({"steps": 2.5}, "steps must be a positive integer, got 2.5"),
])
def test_deploy_plan_refuses_counts_below_one(files, kwargs, message):
    # before: --steps 0: ValueError: cannot reshape array of size 0 into shape (0,newaxis);
    # --steps -1, --epochs 0 / -1: a dry run that reported success
    with pytest.raises(deploy.DeployError) as e:
        deploy.plan(files["build"], "qemu-mps2-an385", **kwargs)
    assert str(e.value) == message


@pytest.fixture
def no_simulation(monkeypatch):
    """Flower's simulation must not start: the refusals come first."""
    if not HAS_FLOWER:
        pytest.skip("the flower extra is not installed")
    import flwr.simulation

    def refuse(*args, **kwargs):
        raise AssertionError("the simulation started")
    monkeypatch.setattr(flwr.simulation, "run_simulation", refuse)
    from microtrain_host import flower
    return flower


@pytest.mark.parametrize("kwargs, message", [
    ({"lr": math.nan}, "lr must be a finite number, got nan"),
    ({"lr": -1.0}, "the learning rate must be >= 0, got -1.0"),
    ({"workers": 0}, "workers must be an integer >= 1, got 0"),
    ({"clients": 0}, "clients must be an integer >= 1, got 0"),
    ({"rounds": 0}, "rounds must be an integer >= 1, got 0"),
    ({"epochs": -1}, "epochs must be an integer >= 1, got -1"),
    ({"alpha": 0.0}, "the Dirichlet concentration alpha must be > 0, got 0.0"),
    ({"fraction": 0.0}, "fraction of devices sampled per round must be in (0, 1], got 0.0"),
    ({"seed": -1}, "seed must be an integer >= 0, got -1"),
])
def test_federate_refuses_bad_settings_before_the_simulation(files, no_simulation, kwargs,
                                                             message):
    # before: --lr nan failed in round 1 with a 34-line ClientAppException; --lr -1 and
    # --workers 0 ran and exited 0
    with pytest.raises(devices.FederateError) as e:
        no_simulation.federate(files["build"], DIGITS, **{"clients": 4, **kwargs})
    assert str(e.value) == message


def test_federate_refuses_data_of_the_wrong_feature_count(files, no_simulation):
    # before: ValueError: 336 samples of x but 359 labels/targets, a traceback from Flower
    with pytest.raises(TrainError) as e:
        no_simulation.federate(files["build"], files["features_npz"], clients=4)
    assert str(e.value) == (f"'{files['features_npz']}': train inputs have 60 values per "
                            f"sample, the model's input 'input' [8, 64] needs 64")


def test_federate_refuses_a_file_as_keep_updates(files, no_simulation, tmp_path):
    # before: NotADirectoryError after round 1
    with pytest.raises(devices.FederateError) as e:
        no_simulation.federate(files["build"], DIGITS, clients=4, updates_dir=files["file"])
    assert str(e.value) == (f"cannot keep the updates in '{files['file']}': it is a file, "
                            f"not a directory")
    with pytest.raises(devices.FederateError) as e:
        no_simulation.federate(files["build"], DIGITS, clients=4,
                               updates_dir=files["file"] / "sub")
    assert str(e.value) == (f"cannot keep the updates in '{files['file'] / 'sub'}': "
                            f"Not a directory")


@needs_flower
def test_a_failed_device_is_its_own_message():
    """What Flower hands the strategy for a device that raised (abridged from a run with
    --lr nan): the device's words follow the last "Message: "."""
    from microtrain_host.flower import _device_failure
    reason = (
        "<class 'ray.exceptions.RayTaskError(ClientAppException)'>:<'ray::ClientAppActor.run()"
        " (pid=20439, ip=192.0.2.2)\n  File \"flwr/clientapp/client_app.py\", line 161, in "
        "__call__\n    return self._registered_funcs[full_name](message, context)\n"
        "microtrain.errors.TrainingError: the loss is nan: training diverged\n\nThe above "
        "exception was the direct cause of the following exception:\n\n"
        "flwr.clientapp.client_app.ClientAppException: \nException ClientAppException "
        "occurred. Message: the loss is nan: training diverged'>")
    assert _device_failure(reason) == "the loss is nan: training diverged"


@needs_flower
def test_a_device_failing_in_the_simulation_is_one_line(files):
    """Diverging devices (a finite but absurd learning rate) fail in round 1: the CLI says
    what the first device said, in one line; Flower's own logging of the 4 failures (30-odd
    lines each) stays off without --verbose."""
    proc = run_cli(["federate", files["build"], "--data", DIGITS, "--clients", "4",
                    "--rounds", "1", "--epochs", "1", "--lr", "1e30"])
    assert proc.returncode == 2, proc.stderr
    assert re.fullmatch(r"microtrain federate: error: 4 of 4 devices failed in round 1; the "
                        r"first said: the loss is (nan|inf): training diverged \(lower the "
                        r"learning rate or check the inputs\); parameters were not updated "
                        r"and the accumulated gradients are dropped\n", proc.stderr), proc.stderr


# -- item 9, pack-time part: folding refuses huge constants before computing them ---------

@pytest.mark.parametrize("op_type, elements, mib", [
    ("ConstantOfShape", "1,000,000,000", "7,629.4"), ("Range", "1,000,000,000", "7,629.4")])
def test_folding_refuses_a_huge_constant_before_computing_it(tmp_path, monkeypatch, op_type,
                                                             elements, mib):
    # before: ConstantOfShape [1e9] tried to allocate 7.45 GiB
    original = fold._evaluate

    def evaluate(node, *args):
        # were it evaluated, the test would take gigabytes (or the OOM killer) to fail
        assert node.name != "huge", "the huge constant was computed"
        return original(node, *args)
    monkeypatch.setattr(fold, "_evaluate", evaluate)
    with pytest.raises(mh.ArtifactError) as e:
        mh.generate_artifacts(huge_constant_model(op_type), artifact_directory=tmp_path,
                              loss="MSELoss")
    assert str(e.value) == (
        f"{op_type} node 'huge' computes a constant of {elements} elements ({mib} MiB); "
        f"pack-time constant folding refuses values over 64 MiB (no microcontroller holds one)")
