"""The integer backward of a fused int8 graph (issue 22): which layers train, and the nodes
that carry the classifier input's gradient back to them through any graph of the ops with
int8 kernels - convolutions (1-D, 2-D, depthwise, grouped) and hidden Gemms with their fused
ReLU / Clip, residual Adds, Concats (along any axis), max and average pools,
GlobalAveragePool before the classifier, Flatten / Reshape views, tensors read by several
layers, lookup-table activations (a Relu / Clip the int8 conversion could not fuse, or a
smooth activation: QLinearLookup, ops/intlookup.py).

A layer is a QLinearConv or a hidden QLinearGemm. Every layer the gradient passes trains its
int32 bias (ops/intgrad.py IntClampBiasGrad masks the gradient by the layer's clamp, steps
the bias and folds the per-channel weight scale in one pass); the layers named in `weights`
also train their int8 weights (IntConvUpdate, a Gemm as a 1x1 convolution). With a named
parameter set (`biases`), a layer whose bias is not named masks and folds the gradient only
(ops/intlookup.py IntClampGrad), so exactly the named parameters train. The gradient
stops at the earliest layer that trains something: nothing before it is computed.

Gradients are ops/intgrad.py's tensors [exponent, mantissas]; the gradient of layer i's output
(i: its position among the graph's layers) is named "intgrad.grad.<i>", as the chain-only
backward named them, so a DS-CNN's blob is byte for byte what it was."""
import numpy as np
from onnx import TensorProto, helper

from ..errors import UnsupportedOpError
from ..graph import DOMAIN, attr
from ..ops.intlookup import lookup_slopes

LAYERS = ("QLinearConv", "QLinearGemm")
VIEWS = ("Flatten", "Reshape", "Squeeze", "Unsqueeze", "Identity")
POOL_GRADS = {"QLinearMaxPool": "IntMaxPoolGrad", "QLinearAveragePool": "IntAveragePoolGrad"}
# the products an element of a layer's input gradient sums (outputs per group x taps) that
# the device's int_conv_grad_input takes (kernels/intgrad.py MAX_TERMS)
MAX_TERMS = 4096


class Graph:
    """Producers, readers and layer order of a fused graph, the classifier excluded."""

    def __init__(self, fused, gemm):
        self.gemm = gemm
        self.nodes = [n for n in fused.graph.node if n is not gemm]
        self.producers = {o: n for n in self.nodes for o in n.output}
        self.readers = {}
        for n in fused.graph.node:
            for i in n.input:
                self.readers.setdefault(i, []).append(n)
        self.layers = [n for n in self.nodes if n.op_type in LAYERS]
        self.index = {n.name: i for i, n in enumerate(self.layers)}
        self.shapes = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim]
                       for v in list(fused.graph.value_info) + list(fused.graph.input)
                       + list(fused.graph.output)}

    def last_layers(self, count):
        """The names of the `count` layers nearest the classifier (topological order)."""
        if count > len(self.layers):
            raise UnsupportedOpError(f"integer training of the last {count + 1} layers: the "
                                     f"model has {len(self.layers) + 1} (the classifier "
                                     f"included)")
        return [n.name for n in self.layers[len(self.layers) - count:]]


def _needs(graph, trained):
    """{tensor: True when a trained layer is behind it} (its gradient is needed)."""
    needs = {}
    for n in graph.nodes:
        behind = n.name in trained or any(needs.get(i, False) for i in n.input)
        for o in n.output:
            needs[o] = behind
    return needs


def _refuse(node, why):
    raise UnsupportedOpError(f"integer training: node '{node.name}' ({node.op_type}) {why}")


def backward_nodes(graph, feature_grad, weights, all_biases, stochastic, inits, params,
                   quantization, inputs, taken, constants, biases=None):
    """(replaced {id(layer node): the node reading its trained parameters}, the backward
    nodes from the classifier input's gradient `feature_grad` (IntGemmGradInput's D),
    {layer name: its IntClampMask node}, which the train graph runs right after the layer).
    weights: names of the layers whose weights train; all_biases: every layer trains its
    bias (else only those the gradient passes). biases (a named parameter set): the names
    of exactly the layers whose biases train - a layer the gradient passes with its bias
    not among them only masks and scales the gradient (ops/intlookup.py IntClampGrad).
    Fills params, quantization, inputs, taken and constants (new frozen int8 constants: a
    Gemm's weight transposed to [n, k])."""
    if biases is not None:
        trained = set(weights) | set(biases)
    else:
        trained = set(weights) | ({n.name for n in graph.layers} if all_biases else set())
    if not trained:
        raise UnsupportedOpError("integer training: no layer before the classifier trains")
    needs = _needs(graph, trained)
    head = graph.gemm.input[0]
    if not needs.get(head, False):
        raise UnsupportedOpError(f"integer training: no trained layer lies behind the "
                                 f"classifier's input '{head}'")
    grads = {}           # tensor -> [gradient tensor names]: the contributions of its readers
    nodes = []
    _head_gradient(graph, feature_grad, head, grads, nodes)
    replaced, masks = {}, {}
    for n in reversed(graph.nodes):
        if not any(grads.get(o) for o in n.output):
            continue
        if len(n.output) != 1:
            _refuse(n, "has several outputs: no integer backward")
        g = _gathered(graph, n.output[0], grads, nodes)
        if n.op_type in LAYERS:
            _layer(graph, n, g, needs, weights, biases is None or n.name in biases,
                   stochastic, inits, params, quantization, inputs, taken, constants,
                   replaced, masks, grads, nodes)
        elif n.op_type in VIEWS:
            grads.setdefault(n.input[0], []).append(g)
        elif n.op_type == "QLinearAdd":
            wanted = [i for i in n.input[:2] if needs.get(i, False)]
            if len(wanted) == 2 and wanted[0] == wanted[1]:
                _refuse(n, "adds a tensor to itself (no integer backward)")
            names = [_contribution(graph, i, n) for i in wanted]
            nodes.append(helper.make_node("IntAddGrad", [g, n.output[0]], names,
                                          name=n.name + ".grad", domain=DOMAIN,
                                          lo=attr(n, "lo", 0), hi=attr(n, "hi", 255)))
            for i, name in zip(wanted, names):
                grads.setdefault(i, []).append(name)
        elif n.op_type == "QLinearConcat":
            _concat(graph, n, g, needs, grads, nodes)
        elif n.op_type in POOL_GRADS and needs.get(n.input[0], False):
            if n.output[0] not in graph.shapes:
                _refuse(n, "has no known output shape")
            name = _contribution(graph, n.input[0], n)
            node = helper.make_node(POOL_GRADS[n.op_type], [g, n.input[0]], [name],
                                    name=n.name + ".grad", domain=DOMAIN,
                                    output_shape=graph.shapes[n.output[0]])
            node.attribute.extend(a for a in n.attribute if a.name in (
                "kernel_shape", "strides", "pads", "auto_pad", "ceil_mode",
                "count_include_pad", "dilations"))
            nodes.append(node)
            grads.setdefault(n.input[0], []).append(name)
        elif n.op_type == "QLinearLookup" and needs.get(n.input[0], False):
            # a Relu / Clip the conversion could not fuse: the gradient times the
            # activation's slope at each input byte (ops/intlookup.py)
            name = _contribution(graph, n.input[0], n)
            nodes.append(helper.make_node("IntLookupGrad", [g, n.input[0]], [name],
                                          name=n.name + ".grad", domain=DOMAIN,
                                          slopes=[float(v) for v in lookup_slopes(n)]))
            grads.setdefault(n.input[0], []).append(name)
        elif any(needs.get(i, False) for i in n.input):
            source = graph.producers.get(n.input[0]) if n.op_type == "Quantize" else None
            if source is not None:     # a float op between int8 layers
                n = source
            _refuse(n, "has no integer backward, and a trained layer lies behind it (train "
                       "only the layers after it)")
    return replaced, nodes, masks


def _concat(graph, n, g, needs, grads, nodes):
    # each input that needs a gradient gets its part of G, masked where its requantization
    # to the output saturated (ops/intflow.py IntConcatGrad)
    wanted = [i for i in n.input if needs.get(i, False)]
    if len(set(wanted)) != len(wanted):
        _refuse(n, "concatenates a tensor with itself (no integer backward)")
    rank = len(graph.shapes.get(n.output[0], ()))
    if not rank or not all(i in graph.shapes for i in n.input):
        _refuse(n, "has no known input or output shape")
    axis, start = attr(n, "axis", 0) % rank, 0
    for i in n.input:
        if i in wanted:
            name = _contribution(graph, i, n)
            nodes.append(helper.make_node("IntConcatGrad", [g, i, n.output[0]], [name],
                                          name=f"{n.name}.grad.{i}", domain=DOMAIN,
                                          axis=axis, start=start))
            grads.setdefault(i, []).append(name)
        start += graph.shapes[i][axis]


def _head_gradient(graph, feature_grad, head, grads, nodes):
    # D (per classifier input) becomes a gradient tensor: broadcast over the positions of a
    # GlobalAveragePool's input when views lead to one, else one position per input
    t = head
    node = graph.producers.get(t)
    while node is not None and node.op_type in VIEWS:
        t = node.input[0]
        node = graph.producers.get(t)
    pooled = node is not None and node.op_type == "QLinearGlobalAveragePool"
    target = node.input[0] if pooled else head
    name = _contribution(graph, target, node if pooled else graph.gemm)
    nodes.append(helper.make_node("IntPoolGrad", [feature_grad, target], [name],
                                  name=graph.gemm.name + ".pool_grad", domain=DOMAIN))
    grads[target] = [name]


def _grad_name(graph, tensor):
    producer = graph.producers.get(tensor)
    if producer is not None and producer.name in graph.index:
        return "intgrad.grad.%d" % graph.index[producer.name]
    return "intgrad.grad." + tensor


def _contribution(graph, tensor, reader):
    # the name of reader's gradient of tensor: the tensor's gradient when nothing else reads
    # it, else one of the parts IntGradSum adds
    name = _grad_name(graph, tensor)
    return name if len(graph.readers.get(tensor, ())) == 1 else name + ".from." + reader.name


def _gathered(graph, tensor, grads, nodes):
    # the gradient of tensor: its one contribution, or their sum
    parts = grads.pop(tensor)
    total = parts[0]
    for k, part in enumerate(parts[1:], 1):
        name = _grad_name(graph, tensor) + ("" if k == len(parts) - 1 else ".sum%d" % k)
        nodes.append(helper.make_node("IntGradSum", [total, part], [name],
                                      name=f"{tensor}.grad_sum{k}", domain=DOMAIN))
        total = name
    return total


def _layer(graph, n, g, needs, weights, train_bias, stochastic, inits, params, quantization,
           inputs, taken, constants, replaced, masks, grads, nodes):
    if len(n.input) < 3 or not n.input[2]:
        _refuse(n, "has no bias: every layer the integer backward passes trains its bias")
    w = inits.get(n.input[1])
    if w is None or w.dtype != np.int8:
        _refuse(n, "has no int8 constant weight")
    gemm = n.op_type == "QLinearGemm"
    w_input = n.input[1]
    if gemm and not attr(n, "transB", 0):
        w = np.ascontiguousarray(w.T)        # [n, k]: the layout of a 1x1 convolution
        w_input = n.input[1] + ".transposed"
    channels = w.shape[0]
    scales = [float(v) for v in attr(n, "w_scales")]
    b_name = n.input[2]     # (a frozen bias: the int32 constant)
    if train_bias:
        b_name = _param_name(n.input[2], n.name + ".bias")
        params[b_name] = inits[n.input[2]].astype(np.int32)
        inputs.append(helper.make_tensor_value_info(b_name, TensorProto.INT32, [channels]))
        taken.add(n.input[2])
    w_name = w_input
    if n.name in weights:
        w_name = _param_name(n.input[1], n.name + ".weight")
        params[w_name] = w
        quantization[w_name] = (scales * channels if len(scales) == 1 else scales,
                                [0] * channels, 0)
        inputs.append(helper.make_tensor_value_info(w_name, TensorProto.INT8, list(w.shape)))
        taken.add(n.input[1])
    elif w_input != n.input[1]:
        constants[w_input] = w       # the frozen weight, transposed
        taken.add(n.input[1])
    trained = helper.make_node(n.op_type, [n.input[0], w_name, b_name], list(n.output),
                               name=n.name, domain=n.domain)
    trained.attribute.extend(a for a in n.attribute if not (gemm and a.name == "transB"))
    if gemm:
        trained.attribute.append(helper.make_attribute("transB", 1))
    replaced[id(n)] = trained
    y = n.output[0]
    masks[n.name] = helper.make_node("IntClampMask", [y, n.input[0]], [y + ".mask"],
                                     name=n.name + ".mask", domain=DOMAIN, conv=n.name)
    masked = g + ".masked"
    if train_bias:
        nodes.append(helper.make_node(
            "IntClampBiasGrad", [g, y, y + ".mask", b_name, w_name],
            [masked, b_name + ".updated"], name=n.name + ".bias_grad", domain=DOMAIN,
            conv=n.name, stochastic=int(bool(stochastic))))
    else:
        nodes.append(helper.make_node("IntClampGrad", [g, y, y + ".mask", w_name], [masked],
                                      name=n.name + ".clamp_grad", domain=DOMAIN))
    geometry = [a for a in n.attribute if a.name in
                ("kernel_shape", "strides", "pads", "dilations", "group")]
    x = n.input[0]
    if needs.get(x, False):
        terms = channels // attr(n, "group", 1) * int(np.prod(attr(n, "kernel_shape", [1])))
        if terms > MAX_TERMS:
            _refuse(n, f"sums {terms} products per element of its input's gradient (outputs "
                       f"per group x kernel taps); the integer backward takes at most "
                       f"{MAX_TERMS}")
        name = _contribution(graph, x, n)
        node = helper.make_node("IntConvGradInput", [masked, w_name, x], [name],
                                name=n.name + ".grad_input", domain=DOMAIN)
        node.attribute.extend(geometry)
        nodes.append(node)
        grads.setdefault(x, []).append(name)
    if n.name in weights:
        node = helper.make_node("IntConvUpdate", [w_name, x, masked], [w_name + ".updated"],
                                name=n.name + ".update", domain=DOMAIN,
                                stochastic=int(bool(stochastic)))
        node.attribute.extend(geometry)
        nodes.append(node)


def _param_name(name, fallback):
    return name.removesuffix(".quantized") if name else fallback


def named_choice(graph, classifier, requires_grad, frozen, weights, all_biases):
    """(layers whose weights train, layers whose biases train) of a named parameter set, as
    the float pack's --requires-grad / --frozen name them: the float model's initializer
    names (a BatchNormalization folded into a convolution: the convolution's weight and
    bias names). requires_grad: exactly these train; else the choice `weights` /
    `all_biases` made (with the biases of the layers the gradient passes), or every
    parameter when that choice is the classifier alone, less the `frozen` names. The
    classifier's weight and bias (`classifier`) always train."""
    owner = {}      # parameter name -> (layer name, "weight" or "bias")
    for n in graph.layers:
        owner[_param_name(n.input[1], n.name + ".weight")] = (n.name, "weight")
        if len(n.input) > 2 and n.input[2]:
            owner[_param_name(n.input[2], n.name + ".bias")] = (n.name, "bias")
    known = list(classifier) + list(owner)
    unknown = sorted((set(requires_grad or ()) | set(frozen or ())) - set(known))
    if unknown:
        raise UnsupportedOpError(f"integer training: {', '.join(unknown)} name(s) no "
                                 f"parameter of the int8 model; its parameters are "
                                 f"{', '.join(known)}")
    if requires_grad is not None:
        chosen = set(requires_grad)
    elif weights or all_biases:
        passed = _needs(graph, set(weights))
        chosen = set(classifier) | {p for p, (layer, kind) in owner.items() if (
            layer in weights if kind == "weight" else all_biases or passed[layer_output(
                graph, layer)])}
    else:
        chosen = set(known)
    chosen -= set(frozen or ())
    missing = [p for p in classifier if p not in chosen]
    if missing:
        raise UnsupportedOpError(f"integer training always trains the classifier: "
                                 f"{', '.join(missing)} must train (remove it from --frozen "
                                 f"/ add it to --requires-grad)")
    return ([layer for p, (layer, kind) in owner.items() if kind == "weight" and p in chosen],
            [layer for p, (layer, kind) in owner.items() if kind == "bias" and p in chosen])


def layer_output(graph, name):
    return graph.layers[graph.index[name]].output[0]
