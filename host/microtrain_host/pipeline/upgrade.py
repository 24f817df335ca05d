"""Older exports: models at opsets 1-12 brought to the opset microtrain works in.

onnx.version_converter does the work (its adapters go back to opset 1: the broadcast and
axis attributes of opset 1-6 arithmetic, BatchNormalization's is_test and spatial, Pad's
paddings). What it cannot carry over is fixed around it, the way an exporter at the new
opset writes it:
* BatchNormalization in training mode had five outputs before opset 14 (Y, running mean and
  variance, saved mean and variance). The converter refuses the saved statistics, and gives
  the node no training_mode attribute; here the unused saved statistics are dropped first and
  training_mode=1 is set after, so the running statistics keep updating as before.
* Dropout before opset 12 had no training_mode input: whether it dropped was the runtime's
  choice, and exporters only write it for training (torch omits it from eval exports). The
  converter's Dropout defaults to inference (the identity); here it gets training_mode=True.
* Resize before opset 11 (and Upsample, which becomes it) sampled at x / scale and, in
  nearest mode, rounded down when upsampling and up when downsampling (onnxruntime's and
  onnx's backend tests). The converter leaves opset 11's defaults in place (half_pixel,
  round_prefer_floor), which sample elsewhere; here the node gets asymmetric and floor or
  ceil as its constant scales say.
* Arithmetic before opset 7 broadcast B only with broadcast=1, and `axis` put B's first
  dimension on A's dimension `axis`. The converter asserts (wrongly) when B does not also
  end on A's last dimension (a bias of shape [C] added at axis 1 of an (N, C, H, W) input,
  as Caffe2-era exporters wrote it); here B is unsqueezed to end there first, which is the
  numpy broadcasting opset 7 has.
* PRelu before opset 7 took a slope of one value or one per channel: a slope of shape [C]
  on an (N, C, ...) input scaled channel c by slope[c]. From opset 7 the slope broadcasts
  numpy-style from the last axis, and the converter leaves it as it was, so it would meet
  the last axis instead; here it is unsqueezed to (C, 1, ..., 1), which broadcasts as the
  old opset meant. The slope keeps its shape in the checkpoint (torch's PReLU weight).
"""
import numpy as np
import onnx
from onnx import helper, numpy_helper, version_converter
from onnx.reference import ReferenceEvaluator

from ..errors import ArtifactError, UnsupportedOpError, node_label, node_name

TARGET_OPSET = 17   # the opset the lowerings are written against
OLDEST_OPSET = 1    # the converter's adapters start there
SOURCE_OPSET_KEY = "microtrain.source_opset"  # metadata of an upgraded model


def upgrade(model, opset):
    """The model converted from `opset` to TARGET_OPSET, with metadata SOURCE_OPSET_KEY."""
    if opset < OLDEST_OPSET:
        raise ArtifactError(f"the model uses opset {opset}; microtrain upgrades models from "
                            f"opset {OLDEST_OPSET} on (re-export with opset_version={TARGET_OPSET})")
    graph = model.graph
    training_norms = set()
    for node in graph.node:
        if node.op_type == "BatchNormalization" and len(node.output) > 3:
            if any(o and _consumed(graph, o) for o in node.output[3:]):
                raise UnsupportedOpError(
                    f"BatchNormalization node {node_name(node)}: its saved mean and variance "
                    f"outputs are used by the graph, which opset {TARGET_OPSET} cannot express")
            del node.output[3:]
        if node.op_type == "BatchNormalization" and len(node.output) > 1:
            training_norms.add(node.output[0])
    dropouts = {n.output[0] for n in graph.node if n.op_type == "Dropout"} if opset < 12 else set()
    prelus = {n.output[0] for n in graph.node if n.op_type == "PRelu"} if opset < 7 else set()
    try:
        converted = model
        if opset < 6:
            # Opset 6 first: onnx infers no shapes at opsets 1-5, and the step to opset 7
            # needs the shapes of every broadcasting node's inputs.
            converted = version_converter.convert_version(model, 6)
        if opset < 7:
            converted = onnx.shape_inference.infer_shapes(converted)
            _axis_broadcasts_as_trailing(converted)
        converted = version_converter.convert_version(converted, TARGET_OPSET)
    except Exception as e:  # the converter raises RuntimeError or IndexError from C++
        node = _first_unconvertible(model)
        what = node_label(node) if node is not None else "the model"
        raise UnsupportedOpError(f"cannot upgrade {what} from opset {opset} to "
                                 f"{TARGET_OPSET} with onnx.version_converter: {e}") from e
    for node in converted.graph.node:
        if node.op_type == "BatchNormalization" and node.output[0] in training_norms:
            node.attribute.append(helper.make_attribute("training_mode", 1))
        if node.op_type == "Dropout" and node.output[0] in dropouts:
            _train_dropout(converted.graph, node)
    if opset < 11:
        _resize_as_before_opset_11(converted, opset)
    _parameters_out_of_inputs(converted.graph)
    if prelus:
        _per_channel_slopes(converted, prelus, opset)
    converted.ir_version = max(converted.ir_version, 8)  # opset 17 needs IR version 8
    entry = converted.metadata_props.add()
    entry.key, entry.value = SOURCE_OPSET_KEY, str(opset)
    return converted


def source_opset(model):
    """The opset an upgraded model was exported with; None when it was not upgraded."""
    for entry in model.metadata_props:
        if entry.key == SOURCE_OPSET_KEY:
            return int(entry.value)
    return None


def _parameters_out_of_inputs(graph):
    # Before IR version 4 every initializer was also a graph input; microtrain's inputs are
    # the data a step is fed.
    params = {i.name for i in graph.initializer}
    inputs = [i for i in graph.input if i.name not in params]
    del graph.input[:]
    graph.input.extend(inputs)


# Ops whose broadcast=1 / axis attributes opset 7 replaced with numpy broadcasting.
AXIS_BROADCAST_OPS = ("Add", "Sub", "Mul", "Div", "Pow", "And", "Or", "Xor", "Equal",
                      "Greater", "Less")


def _axis_broadcasts_as_trailing(model):
    """B of an opset 1-6 axis broadcast unsqueezed to end on A's last dimension, and the
    axis attribute dropped: the same broadcast, in the form the converter takes."""
    shapes = _known_shapes(model)
    graph = model.graph
    nodes = []
    for node in graph.node:
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        if (node.op_type in AXIS_BROADCAST_OPS and attrs.get("broadcast") == 1
                and "axis" in attrs and len(node.input) == 2):
            a_shape, b_shape = shapes.get(node.input[0]), shapes.get(node.input[1])
            if a_shape is None or b_shape is None:
                nodes.append(node)  # the converter names it if it cannot do without
                continue
            axis = attrs["axis"] + (len(a_shape) if attrs["axis"] < 0 else 0)
            trailing = len(a_shape) - axis - len(b_shape)
            if trailing > 0:
                ends = _unused(graph, f"{node.input[1]}.to_last_axis")
                nodes.append(helper.make_node(
                    "Unsqueeze", [node.input[1]], [ends], name=f"{node.name}.to_last_axis",
                    axes=list(range(len(b_shape), len(b_shape) + trailing))))
                node.input[1] = ends
            kept = [a for a in node.attribute if a.name != "axis"]
            del node.attribute[:]
            node.attribute.extend(kept)
        nodes.append(node)
    del graph.node[:]
    graph.node.extend(nodes)


def _known_shapes(model):
    """{name: [dim or None]} of every tensor whose rank shape inference knows."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:  # an inconsistent model: the callers name the node they need
        inferred = model
    shapes = {vi.name: [d.dim_value if d.HasField("dim_value") else None
                        for d in vi.type.tensor_type.shape.dim]
              for vi in list(inferred.graph.input) + list(inferred.graph.value_info)
              if vi.type.tensor_type.HasField("shape")}
    shapes.update({i.name: list(i.dims) for i in model.graph.initializer})
    return shapes


def _per_channel_slopes(model, prelus, opset):
    """Unsqueeze the [C] slope of each PRelu from before opset 7 (output names `prelus`) to
    (C, 1, ..., 1) against its (N, C, ...) input, so it broadcasts over channels."""
    shapes = _known_shapes(model)
    graph = model.graph
    nodes = []
    for node in graph.node:
        if node.op_type == "PRelu" and node.output[0] in prelus:
            x, slope = node.input
            x_shape, slope_shape = shapes.get(x), shapes.get(slope)
            if x_shape is None or slope_shape is None:
                raise UnsupportedOpError(
                    f"{node_label(node)} (opset {opset}): its slope holds one value or one "
                    f"per channel, and the shapes of its input and slope are not known to "
                    f"tell which; give them shapes, or re-export at opset {TARGET_OPSET}")
            if len(slope_shape) == 1 and slope_shape[0] != 1 and len(x_shape) > 2:
                axes = _unused(graph, f"{slope}.channel_axes")
                graph.initializer.append(numpy_helper.from_array(
                    np.arange(1, len(x_shape) - 1, dtype=np.int64), axes))
                per_channel = _unused(graph, f"{slope}.per_channel")
                nodes.append(helper.make_node("Unsqueeze", [slope, axes], [per_channel],
                                              name=f"{node.name}.slope_per_channel"))
                node.input[1] = per_channel
        nodes.append(node)
    del graph.node[:]
    graph.node.extend(nodes)


def _unused(graph, name):
    """name, or name with a number added, so that no tensor of the graph has it."""
    taken = ({i.name for i in graph.initializer} | {i.name for i in graph.input}
             | {o for n in graph.node for o in n.output})
    candidate, k = name, 1
    while candidate in taken:
        k += 1
        candidate = f"{name}_{k}"
    return candidate


def _consumed(graph, name):
    return any(name in n.input for n in graph.node) or any(o.name == name for o in graph.output)


def _train_dropout(graph, node):
    inputs = list(node.input) + [""] * (3 - len(node.input))
    if not inputs[1]:
        inputs[1] = node.output[0] + ".ratio"
        graph.initializer.append(helper.make_tensor(inputs[1], onnx.TensorProto.FLOAT, [], [0.5]))
    inputs[2] = node.output[0] + ".training_mode"
    graph.initializer.append(helper.make_tensor(inputs[2], onnx.TensorProto.BOOL, [], [True]))
    del node.input[:]
    node.input.extend(inputs)


def _constant_value(model, name):
    """The value of tensor `name` when it follows from Constant nodes and initializers alone
    (torch writes scales as a Concat of Constants), else None."""
    graph = model.graph
    producers = {o: n for n in graph.node for o in n.output}
    initializers = {i.name: i for i in graph.initializer}
    needed, used, todo = set(), set(), [name]
    while todo:
        tensor = todo.pop()
        if tensor in initializers:
            used.add(tensor)
            continue
        node = producers.get(tensor)
        if node is None or node.op_type in ("Shape", "Size") or node.op_type.startswith("Random"):
            return None
        if id(node) not in needed:
            needed.add(id(node))
            todo.extend(i for i in node.input if i)
    nodes = [n for n in graph.node if id(n) in needed]
    sub = helper.make_model(
        helper.make_graph(nodes, "constant", [], [helper.make_empty_tensor_value_info(name)],
                          [initializers[i] for i in sorted(used)]),
        opset_imports=model.opset_import)
    return np.asarray(ReferenceEvaluator(sub).run(None, {})[0])


def _resize_as_before_opset_11(model, opset):
    for node in model.graph.node:
        if node.op_type != "Resize":
            continue
        settings = {"coordinate_transformation_mode": "asymmetric"}
        mode = next((helper.get_attribute_value(a) for a in node.attribute if a.name == "mode"),
                    b"nearest")
        if mode == b"nearest":
            scales = _constant_value(model, node.input[2]) if len(node.input) > 2 else None
            if scales is None or (np.min(scales) < 1 < np.max(scales)):
                raise UnsupportedOpError(
                    f"Resize node {node_name(node)} (opset {opset}, nearest): its scales must be a "
                    f"constant, all at least 1 or all at most 1 (opset {opset} rounds down "
                    f"when upsampling and up when downsampling, which opset 11 can only say "
                    f"for the whole node); re-export at opset 11 or later")
            settings["nearest_mode"] = "floor" if np.min(scales) >= 1 else "ceil"
        kept = [a for a in node.attribute if a.name not in settings]
        del node.attribute[:]
        node.attribute.extend(kept + [helper.make_attribute(k, v) for k, v in settings.items()])


def _first_unconvertible(model):
    # The converter's message names its adapter, not the node: convert each node alone to
    # find the first one it refuses.
    opsets = list(model.opset_import)
    shapes = _known_shapes(model)  # the broadcasting adapters need their inputs' shapes
    for node in model.graph.node:
        values = [helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, shapes.get(n))
                  for n in node.input if n]
        outputs = [helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, None)
                   for n in node.output if n]
        single = helper.make_model(helper.make_graph([node], "one", values, outputs),
                                   opset_imports=opsets, ir_version=model.ir_version)
        try:
            version_converter.convert_version(single, TARGET_OPSET)
        except Exception:
            return node
    return None
