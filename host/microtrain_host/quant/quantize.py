"""Quantization-aware training: insert fake quantization into the forward graph as standard
QuantizeLinear -> DequantizeLinear (QDQ) pairs, before the loss and the backward pass are
built, so that training, eval and the exported QDQ model see the same rounding.

What gets quantized (QuantizationConfig):
  * weights of Conv, Gemm and MatMul whose weight is an initializer: symmetric int8 per
    output channel, scale = max|W| / 127 of the current weights at every step (AbsMaxScale),
    zero point 0;
  * activations, asymmetric per tensor (uint8 by default, what onnxruntime's CPU QDQ kernels
    prefer; int8 as an option): the input of every quantized op, the output of every
    quantized op after the BatchNormalization / Relu / Clip chain that follows it (where an
    int8 kernel writes it), the output of average pooling, of Add and of Concat whose
    inputs are quantized (a Concat's own range: its inputs are requantized to it), and of a
    Sigmoid / Tanh / LeakyRelu / HardSigmoid / HardSwish whose input is quantized (an int8
    lookup table) and which a pool or an Add reads. MaxPool of a quantized tensor gets a QDQ
    pair with its input's scale and zero point (max commutes with rounding, so training is
    unchanged; onnxruntime needs the pair to run MaxPool in int8); so does a Flatten /
    Reshape view of a quantized tensor read by a
    quantized op. Ranges are tracked by a moving average of min/max
    (MinMaxObserver, PyTorch's MovingAverageMinMaxObserver, momentum 0.01), kept in a
    frozen parameter `<tensor>.observer_range` = [min, max] (so the checkpoint saves and
    restores them), frozen in the eval graph (QuantParams);
  * gradients: straight-through (ops/quant.py).

The per-layer choice: `layers` (node or weight names to quantize, default: every Conv, Gemm
and MatMul with an initializer weight) and `skip` (names kept float, e.g. the first conv or
the classifier). Naming a node whose op has no int8 kernel is an error."""
import dataclasses
import json

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from ..contract import facts
from ..errors import ArtifactError, UnsupportedOpError
from ..graph import DOMAIN, attr, links
from ..ops.quant import FLOAT32_EPS, QUANT_RANGES, WEIGHT_QMAX

QUANTIZED_OPS = ("Conv", "Gemm", "MatMul")
# Ops an int8 kernel follows through (folded into the quantized op's output at export).
OUTPUT_CHAIN = ("BatchNormalization", "Relu", "Clip")
VIEW_OPS = ("Flatten", "Reshape", "Squeeze", "Unsqueeze", "Identity")
SHARED_RANGE_OPS = ("MaxPool", "GlobalMaxPool")
OWN_RANGE_OPS = ("AveragePool", "GlobalAveragePool", "Add", "Concat")
# Activations an int8 lookup table computes (quant/int8.py QLinearLookup): observed at their
# output when their input is and a pool or an Add reads it (a quantized op reading it
# observes it anyway).
LOOKUP_OPS = ("Sigmoid", "Tanh", "LeakyRelu", "HardSigmoid", "HardSwish")
ACTIVATION_TYPES = {"uint8": TensorProto.UINT8, "int8": TensorProto.INT8}
RANGE_SUFFIX = facts.OBSERVER_RANGE_SUFFIX
METADATA_KEY = "quantization"


@dataclasses.dataclass
class QuantizationConfig:
    """activation_dtype "uint8" (default) or "int8"; momentum of the min/max moving average;
    layers: node or weight names to quantize (None: all Conv / Gemm / MatMul with an
    initializer weight); skip: node or weight names kept float."""
    activation_dtype: str = "uint8"
    momentum: float = 0.01
    layers: list = None
    skip: list = dataclasses.field(default_factory=list)

    @classmethod
    def of(cls, value):
        if value is None or value is False:
            return None
        if value is True:
            return cls()
        if isinstance(value, cls):
            return value
        if isinstance(value, dict):
            unknown = set(value) - {f.name for f in dataclasses.fields(cls)}
            if unknown:
                raise ArtifactError(f"unknown quantization option(s) {sorted(unknown)}; known:"
                                    f" activation_dtype, momentum, layers, skip")
            return cls(**value)
        raise ArtifactError(f"quantization must be True, a dict or a QuantizationConfig, "
                            f"not {type(value).__name__}")

    def check(self):
        if self.activation_dtype not in ACTIVATION_TYPES:
            raise ArtifactError(f"activation_dtype {self.activation_dtype!r}: choose uint8 or "
                                f"int8")
        if not 0.0 < float(self.momentum) <= 1.0:
            raise ArtifactError(f"quantization momentum {self.momentum} is outside (0, 1]")


def weight_axis(node, weight_shape):
    """The output-channel axis of a quantized op's weight."""
    if node.op_type == "Gemm":
        return 0 if attr(node, "transB", 0) else 1
    if node.op_type == "MatMul":
        return len(weight_shape) - 1
    return 0


def _selected(nodes, initializers, config, shapes):
    names = set(config.layers) if config.layers is not None else None
    skip = set(config.skip or ())
    chosen, seen = [], set()
    for node in nodes:
        keys = {node.name} | ({node.input[1]} if len(node.input) > 1 else set())
        if names is not None and keys & names:
            seen |= keys & names
            if node.op_type not in QUANTIZED_OPS or node.input[1] not in initializers:
                raise UnsupportedOpError(
                    f"{node.op_type} node '{node.name}' was asked to be quantized, but it has "
                    f"no int8 kernel: quantizable are Conv, Gemm and MatMul with an "
                    f"initializer weight")
        elif names is not None:
            continue
        if keys & skip:
            seen |= keys & skip
            continue
        if node.op_type in QUANTIZED_OPS and node.input[1] in initializers \
                and len(shapes[node.input[1]][1]) >= 2:
            chosen.append(node)
    unknown = ((names or set()) | skip) - seen
    if unknown:
        raise ArtifactError(f"quantization names {sorted(unknown)} are neither node nor weight "
                            f"names of the model")
    return chosen


def quantize_model(model, shapes, config):
    """Insert QDQ pairs into model's graph (in place). Returns (shapes with the new tensors,
    names of the new frozen parameters (the observer ranges), the record for the artifacts'
    metadata microtrain.quantization: JSON of the config, the quantized layers, weights and
    activations)."""
    config.check()
    graph = model.graph
    nodes = list(graph.node)
    initializers = {i.name for i in graph.initializer}
    shapes = dict(shapes)
    chosen = _selected(nodes, initializers, config, shapes)
    if not chosen:
        raise ArtifactError("quantization: the model has no Conv, Gemm or MatMul with an "
                            "initializer weight to quantize")
    producer, consumers = links(nodes)
    outputs = {o.name for o in graph.output}

    def source(name):
        # Through shape-only views back to the tensor that holds the values.
        while name in producer and producer[name].op_type in VIEW_OPS:
            name = producer[name].input[0]
        return name

    def chain_end(name):
        while len(consumers.get(name, [])) == 1 and name not in outputs:
            nxt = consumers[name][0]
            if nxt.op_type not in OUTPUT_CHAIN or nxt.input[0] != name:
                break
            name = nxt.output[0]
        return name

    observed = {}       # tensor -> the tensor whose observer gives its scale and zero point
    order = []          # tensors to fake-quantize, in the order they were found
    chosen_names = {n.name for n in chosen}
    for node in nodes:
        if node.name in chosen_names:
            x = source(node.input[0])
            for t in (x, chain_end(node.output[0])):
                if t not in observed:
                    observed[t] = t
                    order.append(t)
            if node.input[0] != x and node.input[0] not in observed:
                # A view (Flatten, Reshape) of a quantized tensor: a pair with the source's
                # scale right before the op (a no-op in training), so that onnxruntime finds
                # DequantizeLinear -> op and fuses them.
                observed[node.input[0]] = observed[x]
                order.append(node.input[0])
        elif node.op_type in SHARED_RANGE_OPS + OWN_RANGE_OPS:
            ins = [source(i) for i in (node.input if node.op_type == "Concat" else
                                       node.input[:2 if node.op_type == "Add" else 1])]
            if all(i in observed for i in ins):
                # (no int8 Concat takes in a Relu / Clip after it)
                out = node.output[0] if node.op_type in SHARED_RANGE_OPS + ("Concat",) else \
                    chain_end(node.output[0])
                if out not in observed:
                    observed[out] = observed[ins[0]] if node.op_type in SHARED_RANGE_OPS else out
                    order.append(out)
        elif node.op_type in LOOKUP_OPS and node.input[0] in observed and \
                node.output[0] not in outputs and node.output[0] not in observed and any(
                    r.op_type in SHARED_RANGE_OPS + OWN_RANGE_OPS
                    for r in consumers.get(node.output[0], [])):
            # (a quantized op reading it observes it anyway; a float op needs no pair)
            observed[node.output[0]] = node.output[0]
            order.append(node.output[0])

    qtype = ACTIVATION_TYPES[config.activation_dtype]
    qmin, qmax = QUANT_RANGES[qtype]
    new_inits, ranges = [], []
    before, after = {}, {}   # node name -> nodes to insert before / after it
    rename = {}              # old tensor name -> new name, for producers' outputs
    rewire = {}              # graph input -> its fake-quantized name (for its consumers)
    for t in order:
        owner = observed[t]
        float_name = t + ".float"
        if t in producer:
            rename[t] = float_name
            anchor, y = producer[t].name, t
        else:                                   # a graph input
            float_name, y = t, t + ".fake_quant"
            rewire[t] = y
            anchor = None
        new = []
        if owner == t:
            r = t + RANGE_SUFFIX
            new_inits.append(numpy_helper.from_array(np.array([np.inf, -np.inf], np.float32), r))
            ranges.append(r)
            shapes[r] = (TensorProto.FLOAT, (2,))
            new.append(helper.make_node(
                "MinMaxObserver", [float_name, r], [t + ".scale", t + ".zero_point", r + ".out"],
                name=t + ".observer", domain=DOMAIN, momentum=float(config.momentum),
                qmin=qmin, qmax=qmax, eps=FLOAT32_EPS))
            shapes[t + ".scale"] = (TensorProto.FLOAT, ())
            shapes[t + ".zero_point"] = (qtype, ())
            shapes[r + ".out"] = (TensorProto.FLOAT, (2,))
        scale, zp = owner + ".scale", owner + ".zero_point"
        new += [helper.make_node("QuantizeLinear", [float_name, scale, zp], [t + ".quantized"],
                                 name=t + ".quantize"),
                helper.make_node("DequantizeLinear", [t + ".quantized", scale, zp], [y],
                                 name=t + ".dequantize")]
        shapes[t + ".quantized"] = (qtype, shapes[t][1])
        shapes[float_name] = shapes[t]
        shapes[y] = shapes[t]
        if anchor is None:
            before.setdefault(nodes[0].name, []).extend(new)
        else:
            after.setdefault(anchor, []).extend(new)

    weights = {}
    for node in chosen:
        w = node.input[1]
        wshape = shapes[w][1]
        axis = weight_axis(node, wshape)
        if w in weights:
            if weights[w]["axis"] != axis:
                raise UnsupportedOpError(f"weight '{w}' is shared by ops that quantize it "
                                         f"along different axes")
            weights[w]["nodes"].append(node.name)
            continue
        channels = wshape[axis]
        zp = w + ".zero_point"
        new_inits.append(numpy_helper.from_array(np.zeros(channels, np.int8), zp))
        shapes[zp] = (TensorProto.INT8, (channels,))
        shapes[w + ".scale"] = (TensorProto.FLOAT, (channels,))
        shapes[w + ".quantized"] = (TensorProto.INT8, wshape)
        shapes[w + ".fake_quant"] = (TensorProto.FLOAT, wshape)
        before.setdefault(node.name, []).extend([
            helper.make_node("AbsMaxScale", [w], [w + ".scale"], name=w + ".scale_node",
                             domain=DOMAIN, axis=axis, qmax=float(WEIGHT_QMAX), eps=FLOAT32_EPS),
            helper.make_node("QuantizeLinear", [w, w + ".scale", zp], [w + ".quantized"],
                             name=w + ".quantize", axis=axis),
            helper.make_node("DequantizeLinear", [w + ".quantized", w + ".scale", zp],
                             [w + ".fake_quant"], name=w + ".dequantize", axis=axis)])
        weights[w] = {"axis": axis, "nodes": [node.name]}

    result = []
    for node in nodes:
        result += before.get(node.name, [])
        for k, name in enumerate(node.input):
            if name in rewire:
                node.input[k] = rewire[name]
            elif node.name in {n for w in weights.values() for n in w["nodes"]} and k == 1 \
                    and name in weights:
                node.input[k] = name + ".fake_quant"
        for k, name in enumerate(node.output):
            if name in rename:
                node.output[k] = rename[name]
        result.append(node)
        result += after.get(node.name, [])
    del graph.node[:]
    graph.node.extend(result)
    graph.initializer.extend(new_inits)
    record = {"activation_dtype": config.activation_dtype, "momentum": float(config.momentum),
              "layers": [n.name for n in chosen], "weights": weights,
              "activations": {t: observed[t] for t in order}}
    return shapes, ranges, json.dumps(record, sort_keys=True)


def quantization_metadata(model):
    """The quantization record quantize_model left in a model's metadata (None: not QAT)."""
    for p in model.metadata_props:
        if p.key == f"microtrain.{METADATA_KEY}":
            return json.loads(p.value)
    return None


def eval_form(nodes):
    """The forward nodes as the eval graph runs them: observers frozen (QuantParams of the
    stored range instead of MinMaxObserver)."""
    result = []
    for node in nodes:
        if node.op_type == "MinMaxObserver" and node.domain == DOMAIN:
            frozen = helper.make_node("QuantParams", [node.input[1]], list(node.output[:2]),
                                      name=node.name, domain=DOMAIN)
            frozen.attribute.extend(a for a in node.attribute if a.name != "momentum")
            node = frozen
        result.append(node)
    return result
