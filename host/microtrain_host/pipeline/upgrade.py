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
"""
import onnx
from onnx import helper, version_converter

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
