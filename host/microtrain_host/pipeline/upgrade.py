"""Older exports: models at opsets 7-12 brought to the opset microtrain works in.

onnx.version_converter does the work. Two training-mode forms it cannot carry over are
fixed around it, the way an exporter at the new opset writes them:
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
"""
import numpy as np
import onnx
from onnx import helper, version_converter
from onnx.reference import ReferenceEvaluator

from ..errors import ArtifactError, UnsupportedOpError

TARGET_OPSET = 17   # the opset the lowerings are written against
OLDEST_OPSET = 7    # the converter's adapters start there
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
                    f"BatchNormalization node '{node.name}': its saved mean and variance "
                    f"outputs are used by the graph, which opset {TARGET_OPSET} cannot express")
            del node.output[3:]
        if node.op_type == "BatchNormalization" and len(node.output) > 1:
            training_norms.add(node.output[0])
    dropouts = {n.output[0] for n in graph.node if n.op_type == "Dropout"} if opset < 12 else set()
    try:
        converted = version_converter.convert_version(model, TARGET_OPSET)
    except Exception as e:  # the converter raises RuntimeError or IndexError from C++
        node = _first_unconvertible(model)
        what = f"node '{node.name}' ({node.op_type})" if node is not None else "the model"
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
                    f"Resize node '{node.name}' (opset {opset}, nearest): its scales must be a "
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
    for node in model.graph.node:
        values = [helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, None)
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
