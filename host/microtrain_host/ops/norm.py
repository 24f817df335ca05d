"""BatchNormalization and Dropout on the host: which initializers are running statistics,
which BatchNormalization layers fold into constants, the inference form of a forward graph,
and how a node is configured (shared by autodiff and lowering).

Running statistics are initializers BatchNormalization reads as its mean and variance. The
training-mode forward pass updates them (in place on the device); nothing trains them, so
they are frozen by default and naming one in requires_grad is an error. (ORT's
generate_artifacts makes them trainable unless frozen by hand, and then does not update
them.)"""
import numpy as np
from onnx import helper

from ..errors import ArtifactError, UnsupportedOpError
from ..graph import attr

# The device's dropout generator draws integers in [1, RANDOM_SPAN] (kernels/norm.py: the
# first Lehmer modulus 2**30 - 35, minus one); an element is dropped when its draw is at
# most ratio * RANDOM_SPAN.
RANDOM_SPAN = 2**30 - 36


def batch_norm_training(node):
    """True when a BatchNormalization node normalizes with batch statistics: training_mode=1
    (opset 14+), or more than one output (opset 9-13, where the mode is implied)."""
    mode = attr(node, "training_mode", None)
    if mode is not None:
        return bool(mode)
    return sum(1 for o in node.output if o) > 1


def running_statistics(graph):
    """{initializer name: BatchNormalization node name} of every running mean and variance."""
    initializers = {i.name for i in graph.initializer}
    return {name: node.name for node in graph.node if node.op_type == "BatchNormalization"
            for name in node.input[3:5] if name in initializers}


def check_requires_grad(graph, requires_grad):
    statistics = running_statistics(graph)
    for name in requires_grad:
        if name in statistics:
            raise ArtifactError(f"'{name}' is a running statistic of BatchNormalization node "
                                f"'{statistics[name]}': the forward pass updates it, nothing "
                                f"trains it; leave it out of requires_grad")


def folded_parameters(graph, frozen):
    """Frozen parameters that become constants of the model: the scale, bias, mean and var of
    every inference-form BatchNormalization whose four inputs are all frozen parameters or
    constants and that no other node reads. The lowering then folds the layer into one
    per-channel multiply-add; the checkpoint no longer carries them (repack to change them)."""
    frozen = set(frozen)
    constants = {o for node in graph.node if node.op_type == "Constant" for o in node.output}
    readers = {}
    for node in graph.node:
        for name in node.input:
            readers[name] = readers.get(name, 0) + 1
    folded = []
    for node in graph.node:
        if node.op_type != "BatchNormalization" or batch_norm_training(node):
            continue
        inputs = node.input[1:5]
        if all(name in frozen or name in constants for name in inputs):
            folded += [name for name in inputs if name in frozen and readers[name] == 1
                       and name not in folded]
    return folded


def inference_form(nodes):
    """The forward nodes as the eval graph runs them: BatchNormalization with its running
    statistics (training_mode=0, one output) and Dropout as Identity."""
    read = {name for node in nodes for name in node.input if name}
    result = []
    for node in nodes:
        if node.op_type == "BatchNormalization" and batch_norm_training(node):
            extra, kind = node.output[1:], "running statistics outputs"
            inference = helper.make_node("BatchNormalization", node.input[:5], node.output[:1],
                                         name=node.name, domain=node.domain)
            inference.attribute.extend(a for a in node.attribute if a.name != "training_mode")
        elif node.op_type == "Dropout":
            extra, kind = node.output[1:], "mask output"
            inference = helper.make_node("Identity", node.input[:1], node.output[:1],
                                         name=node.name)
        else:
            result.append(node)
            continue
        used = [o for o in extra if o in read]
        if used:
            raise UnsupportedOpError(f"{node.op_type} node '{node.name}': its {kind} "
                                     f"{', '.join(used)} feed other nodes; the eval graph runs "
                                     f"the node in inference form, which has no such outputs")
        result.append(inference)
    return result


def dropout_config(node, value_of, where):
    """(ratio, training) of a Dropout node (opset 12+: ratio and training_mode inputs,
    defaults 0.5 and false); value_of(name) gives a constant's value or None."""
    def constant(index, default, what):
        if len(node.input) <= index or not node.input[index]:
            return default
        value = value_of(node.input[index])
        if value is None:
            raise UnsupportedOpError(f"{where}: {what} must be a constant")
        return np.asarray(value).reshape(-1)[0]

    ratio = float(constant(1, 0.5, "ratio"))
    training = bool(constant(2, False, "training_mode"))
    if not 0.0 <= ratio < 1.0:
        raise UnsupportedOpError(f"{where}: ratio {ratio} is outside [0, 1)")
    return ratio, training
