"""Sparse update: which parameters to train when only some can be (MIT's "On-Device Training
Under 256KB Memory": the biases of every layer and the weights of the last few).

A *layer* here is a node with weights: Conv, ConvTranspose, Gemm, MatMul or Gather (an
embedding) reading a parameter, in the graph's topological order. The parameters of the
nodes between it and the next such node (a BatchNormalization's scale and bias, a
LayerNormalization's, a PRelu slope, the Add of a MatMul's bias) belong to it, so "the last
N layers" of a DS-CNN are its last N convolutions or dense layers with their normalisations.
A parameter reached through a layout node (Transpose, Reshape, ...) belongs to the layer that
reads the layout node's output. A parameter used by several layers belongs to the first.

A *bias* is an additive per-channel parameter: input 2 of Conv, ConvTranspose and Gemm
(C), the bias of BatchNormalization, LayerNormalization, InstanceNormalization and
GroupNormalization, and a parameter added (Add) to the output of a layer. Everything else a
layer reads is a weight. BatchNormalization running statistics are neither: the forward pass
updates them and nothing trains them."""
import dataclasses

import onnx

from ..errors import ArtifactError
from ..ops.norm import running_statistics

WEIGHT_OPS = ("Conv", "ConvTranspose", "Gemm", "MatMul", "Gather")
# Input index of the bias of the ops that have one.
BIAS_INPUT = {"Conv": 2, "ConvTranspose": 2, "Gemm": 2, "BatchNormalization": 2,
              "LayerNormalization": 2, "InstanceNormalization": 2, "GroupNormalization": 2}
# Nodes that pass a parameter on unchanged in value (their output stands for it).
LAYOUT_OPS = ("Transpose", "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Cast")


@dataclasses.dataclass
class Layer:
    node: str              # the name of the node with weights (or of the first node)
    op_type: str
    weights: list          # parameter names
    biases: list

    @property
    def parameters(self):
        return self.weights + self.biases


def _graph(model):
    return (onnx.load(model) if not isinstance(model, onnx.ModelProto) else model).graph


def layers(model):
    """The model's layers with parameters, in topological order (see the module's doc)."""
    graph = _graph(model)
    statistics = running_statistics(graph)
    vectors = set()         # parameters with one non-1 dimension at most: bias candidates
    params = set()
    for i in graph.initializer:
        if i.data_type == onnx.TensorProto.FLOAT and i.name not in statistics:
            params.add(i.name)
            if sum(1 for d in i.dims if d != 1) <= 1:
                vectors.add(i.name)
    stands_for = {}         # output of a layout node -> the parameter it passes on
    owner = {}              # parameter -> its Layer
    found = []
    weighted_outputs = set()  # outputs of the current layer's node with weights
    for node in graph.node:
        inputs = [stands_for.get(i, i) for i in node.input]
        read = [(k, p) for k, p in enumerate(inputs) if p in params]
        if node.op_type in LAYOUT_OPS and read and read[0][0] == 0:
            stands_for[node.output[0]] = read[0][1]
            continue
        if not read:
            continue
        if node.op_type in WEIGHT_OPS or not found:
            found.append(Layer(node.name or node.op_type, node.op_type, [], []))
            weighted_outputs = set(node.output) if node.op_type in WEIGHT_OPS else set()
        layer = found[-1]
        for k, p in read:
            if p in owner:
                continue
            added = (node.op_type == "Add" and p in vectors
                     and any(i in weighted_outputs for i in node.input))
            bias = BIAS_INPUT.get(node.op_type) == k or added
            (layer.biases if bias else layer.weights).append(p)
            owner[p] = layer
    return [layer for layer in found if layer.parameters]


def sparse_update(model, train_biases=False, train_last=0):
    """Parameter names for requires_grad: the biases of every layer (train_biases) and all
    parameters of the last `train_last` layers, in initializer order. For example
    generate_artifacts(model, requires_grad=sparse_update(model, True, 2), ...)."""
    if isinstance(train_last, bool) or not isinstance(train_last, int) or train_last < 0:
        raise ArtifactError(f"train_last={train_last!r} must be a layer count >= 0")
    found = layers(model)
    if train_last > len(found):
        raise ArtifactError(f"train_last={train_last}: the model has {len(found)} layers with "
                            f"parameters (last first: {describe(found)})")
    chosen = set()
    if train_biases:
        chosen.update(p for layer in found for p in layer.biases)
    for layer in found[len(found) - train_last:]:
        chosen.update(layer.parameters)
    if not chosen:
        raise ArtifactError("the sparse update selects no parameter: give train_last > 0 or "
                            "train_biases (the model's layers have no bias)"
                            if train_biases else "the sparse update selects no parameter: give "
                            "train_last > 0 and/or train_biases")
    return [i.name for i in _graph(model).initializer if i.name in chosen]


def describe(found, limit=None):
    """'1 classifier (Gemm: classifier.weight, classifier.bias), 2 ...': layers counted from
    the last, as train_last counts them."""
    items = []
    for n, layer in enumerate(reversed(found), 1):
        if limit is not None and n > limit:
            items.append("...")
            break
        items.append(f"{n} {layer.node} ({layer.op_type}: {', '.join(layer.parameters)})")
    return "; ".join(items)


def describe_choice(model, train_biases, train_last):
    """One line saying what sparse_update(model, train_biases, train_last) trains."""
    found = layers(model)
    parts = [f"the biases of all {len(found)} layers"] if train_biases else []
    if train_last:
        parts.append(f"every parameter of the last {train_last}: "
                     f"{describe(found, train_last)}")
    return "sparse update: " + ", and ".join(parts)
