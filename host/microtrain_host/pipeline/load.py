"""Load an ONNX model and fix every shape: the first stage of the packager."""
import copy
import numbers
import os

import numpy as np
import onnx
from onnx import helper, numpy_helper, shape_inference

from ..errors import (UNNAMED_PREFIX, ArtifactError, DynamicShapeError, UnsupportedOpError,
                      node_label, node_name)
from ..graph import DOMAIN
from ..registry import LOWERINGS, SHAPED_LIKE_INPUT
from .fold import fold_constants
from .upgrade import upgrade

MIN_OPSET = 13  # ReduceSum takes axes as an input, Softmax works on one axis; older
                # models are upgraded on load (upgrade.py)
# Ops on sequences of tensors: no fixed shape to plan memory for.
SEQUENCE_OPS = ("SequenceConstruct", "SequenceEmpty", "SequenceInsert", "SequenceErase",
                "SequenceAt", "SequenceLength", "SplitToSequence", "ConcatFromSequence",
                "SequenceMap")
# The standard ops, and microtrain's own (graph.DOMAIN) that its artifacts hold.
KNOWN_DOMAINS = ("", "ai.onnx", DOMAIN)
# The trainer's one float type: kernels, arenas and checkpoints hold float32 parameters.
PARAMETER_TYPE = onnx.TensorProto.FLOAT


def _load(model):
    if isinstance(model, onnx.ModelProto):
        return copy.deepcopy(model)
    if isinstance(model, (str, os.PathLike)):
        try:
            return onnx.load(os.fspath(model))
        except Exception as e:  # protobuf raises several types for a bad file
            raise ArtifactError(f"cannot read ONNX model '{model}': {e}") from e
    raise ArtifactError(f"model must be an onnx.ModelProto or a path, not {type(model).__name__}")


def name_unnamed_nodes(graph):
    """Give every node without a name its index in the graph ("#12"), so that messages and
    the steps of the blob can tell it apart from the others (errors.node_label)."""
    taken = {n.name for n in graph.node}
    for index, node in enumerate(graph.node):
        if not node.name:
            name, k = f"{UNNAMED_PREFIX}{index}", 1
            while name in taken:  # a node named "#12" already: "#12_2" (printed quoted)
                k += 1
                name = f"{UNNAMED_PREFIX}{index}_{k}"
            node.name = name
            taken.add(name)


def opset_of(model):
    for imp in model.opset_import:
        if imp.domain in ("", "ai.onnx"):
            return imp.version
    return 1


def load_model(model, batch_size=None):
    """Returns (ModelProto with all shapes static and inferred, {name: (elem_type, shape)}).

    Every dynamic dimension of a graph input is set to batch_size; without batch_size a
    dynamic dimension is an error that names the input and the dimension."""
    check_batch_size(batch_size)
    model = _load(model)
    try:
        onnx.checker.check_model(model)
    except onnx.checker.ValidationError as e:
        raise ArtifactError(f"the ONNX model does not pass onnx.checker: {e}") from e
    name_unnamed_nodes(model.graph)
    for node in model.graph.node:
        if node.op_type in SEQUENCE_OPS:
            raise UnsupportedOpError(f"{node_label(node)}: sequence ops are not supported; "
                                     f"microtrain trains on tensors of fixed shapes")
        if node.domain not in KNOWN_DOMAINS:
            # onnx infers no shapes for it (a custom op, ai.onnx.preview.training's
            # Gradient), which would otherwise surface as a shape that cannot be fixed
            raise UnsupportedOpError(
                f"node {node_name(node)} ({node.op_type} of domain '{node.domain}'): microtrain "
                f"runs the standard ONNX ops (domain ai.onnx) and has no lowering for "
                f"another domain's op; express it with standard ops")
    check_parameter_types(model.graph)
    opset = opset_of(model)
    if opset < MIN_OPSET:
        model = upgrade(model, opset)
        name_unnamed_nodes(model.graph)  # nodes the converter added
    graph = model.graph
    params = {i.name for i in graph.initializer}
    for inp in graph.input:
        if inp.name in params:
            continue
        for axis, dim in enumerate(inp.type.tensor_type.shape.dim):
            if dim.HasField("dim_value") and dim.dim_value > 0:
                continue
            label = dim.dim_param or "?"
            if batch_size is None:
                raise DynamicShapeError(
                    f"input '{inp.name}' has a dynamic dimension '{label}' (axis {axis}); "
                    f"microtrain needs fixed shapes: pass batch_size (--batch-size) to fix it")
            dim.Clear()
            dim.dim_value = int(batch_size)
    # Forget shapes computed for the dynamic model, then infer them again.
    del graph.value_info[:]
    for out in graph.output:
        out.type.tensor_type.ClearField("shape")
    try:
        model = shape_inference.infer_shapes(model, strict_mode=True, data_prop=True)
    except Exception as e:
        raise ArtifactError(f"shape inference failed: {e}") from e
    # With every shape fixed, shape arithmetic is constant: fold it, then infer again so
    # the shapes it fed (Reshape, Expand, Pad...) are read off constants; repeat while that
    # makes more shapes static (Shape of an Expand whose target shape was just folded, as
    # torch writes x.expand(-1, x.shape[1], -1) feeding an LSTM's zero initial state; a
    # Resize to folded sizes, then a Shape of its output).
    while fold_constants(model, tensor_shapes(model.graph)):
        del model.graph.value_info[:]
        try:
            model = shape_inference.infer_shapes(model, strict_mode=True, data_prop=True)
        except Exception as e:
            raise ArtifactError(f"shape inference failed after constant folding: {e}") from e
    model = _infer_shaped_like_input(model)
    shapes = tensor_shapes(model.graph)
    for node in model.graph.node:
        for out in node.output:
            if out and (out not in shapes or any(d is None for d in shapes[out][1])):
                if node.op_type == "BatchNormalization" and out != node.output[0]:
                    # onnx infers only Y of the opset 9-13 form, whose extra outputs imply
                    # training mode
                    raise UnsupportedOpError(
                        f"BatchNormalization node {node_name(node)}: the outputs "
                        f"{', '.join(o for o in node.output[1:] if o)} of the opset 9-13 form "
                        f"(running, saved mean and variance) are not supported; export with "
                        f"opset >= 15 (training_mode attribute, three outputs)")
                if node.op_type not in LOWERINGS:
                    # an op microtrain has no kernel for (and onnx no shape for): that is
                    # what to say
                    raise UnsupportedOpError(f"op '{node.op_type}' (node {node_name(node)}) "
                                             f"is not supported")
                raise DynamicShapeError(
                    f"cannot fix the shape of '{out}' produced by {node_label(node)}; pass "
                    f"batch_size or export with static shapes")
    return model, shapes


def check_batch_size(batch_size):
    """None (the model's shapes are static) or a positive int; anything else would reach
    the blob as a dimension the device refuses, or one the writer cannot store."""
    if batch_size is None:
        return
    if isinstance(batch_size, bool) or not isinstance(batch_size, numbers.Integral):
        raise ArtifactError(f"batch_size must be a positive integer, got {batch_size!r} "
                            f"({type(batch_size).__name__})")
    if batch_size < 1:
        raise ArtifactError(f"batch_size must be a positive integer, got {batch_size}")


def check_parameter_types(graph):
    """Float initializers are the parameters, and microtrain trains float32 ones: a model
    whose weights are float16, bfloat16 or float64 is refused naming the type (rather than
    finding no parameter to train), and so is one that computes in integers (integer
    initializers, no float32 input)."""
    kinds = {}
    for init in graph.initializer:
        kinds.setdefault(init.data_type, []).append(init.name)
    others = {t: names for t, names in kinds.items() if t != PARAMETER_TYPE and _is_float(t)}
    if others:
        raise ArtifactError(f"the model's parameters must be float32 (microtrain trains "
                            f"float32 only); it has {_listing(others)}. Convert the model to "
                            f"float32 before export (PyTorch: model.float())")
    float_inputs = any(i.type.tensor_type.elem_type == PARAMETER_TYPE for i in graph.input)
    if kinds and PARAMETER_TYPE not in kinds and not float_inputs:
        # integer weights on integer inputs: an integer model, not one with nothing to
        # train (integer initializers beside float inputs are shapes, axes, indices)
        raise ArtifactError(f"the model has no float32 initializer to train; its initializers "
                            f"are {_listing(kinds)}. microtrain trains float32 parameters: "
                            f"export the model's weights as float32")


def _is_float(elem_type):
    return onnx.TensorProto.DataType.Name(elem_type).startswith(
        ("FLOAT", "BFLOAT", "DOUBLE", "COMPLEX"))


def _listing(names_by_type, count=3):
    """`float64 (double) 'w', 'b' and 2 more; int64 'shape'`"""
    parts = []
    for elem_type, names in names_by_type.items():
        kind = onnx.TensorProto.DataType.Name(elem_type).lower()
        kind = {"double": "float64 (double)", "float": "float32"}.get(kind, kind)
        more = f" and {len(names) - count} more" if len(names) > count else ""
        parts.append(f"{kind} {', '.join(repr(n) for n in names[:count])}{more}")
    return "; ".join(parts)


def _infer_shaped_like_input(model):
    """onnx infers no shape for some function ops (GroupNormalization); for the op types in
    registry.SHAPED_LIKE_INPUT, Y has X's shape: record it and infer the rest again."""
    while True:
        shapes = tensor_shapes(model.graph)
        added = False
        for node in model.graph.node:
            out = node.output[0] if node.output else ""
            x = shapes.get(node.input[0]) if node.input else None
            if (node.op_type in SHAPED_LIKE_INPUT and out and x and None not in x[1]
                    and (out not in shapes or None in shapes[out][1])):
                model.graph.value_info.append(helper.make_tensor_value_info(out, x[0], x[1]))
                added = True
        if not added:
            return model
        try:
            model = shape_inference.infer_shapes(model, strict_mode=True, data_prop=True)
        except Exception as e:
            raise ArtifactError(f"shape inference failed: {e}") from e


def tensor_shapes(graph):
    """{name: (elem_type, shape tuple)} for every tensor whose type is known."""
    shapes = {}
    for vi in list(graph.input) + list(graph.value_info) + list(graph.output):
        tt = vi.type.tensor_type
        if not tt.HasField("shape"):
            continue
        dims = tuple(d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim)
        shapes[vi.name] = (tt.elem_type, dims)
    for init in graph.initializer:
        shapes[init.name] = (init.data_type, tuple(init.dims))
    for node in graph.node:
        if node.op_type == "Constant" and node.output[0] not in shapes:
            value = constant_value(node)
            if value is not None:
                shapes[node.output[0]] = (helper.np_dtype_to_tensor_dtype(value.dtype), value.shape)
    return shapes


def constant_value(node):
    """The value of a Constant node as a numpy array (None for sparse constants)."""
    for attr in node.attribute:
        if attr.name == "value":
            return numpy_helper.to_array(attr.t)
        if attr.name == "value_float":
            return np.array(attr.f, dtype=np.float32)
        if attr.name == "value_floats":
            return np.array(list(attr.floats), dtype=np.float32)
        if attr.name == "value_int":
            return np.array(attr.i, dtype=np.int64)
        if attr.name == "value_ints":
            return np.array(list(attr.ints), dtype=np.int64)
    return None
