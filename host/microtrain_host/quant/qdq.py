"""The QDQ inference model of a quantization-aware trained model: standard ONNX with int8
weights and the learned activation ranges as constants, which onnxruntime fuses into its
quantized kernels (QLinearConv, QGemm, QLinearGlobalAveragePool, ...).

From the inference graph of the eval model (parameters as initializers, pipeline/inference.py):
  * each observer (QuantParams of a frozen range) becomes its scale and zero point;
  * each quantized Conv / Gemm / MatMul: a BatchNormalization right after it (inference
    form) is folded into its weight and bias (W' = W * a, B' = beta + (B - mean) * a per
    output channel, a = gamma / sqrt(var + eps), float32 after every operation); the
    weight becomes an int8 initializer with its per-channel scale max|W'| / 127 (DQ of it
    stays in the graph); the bias an int32 initializer round(B' / (x_scale * w_scale)) (the
    float32 quotient) behind a DequantizeLinear, as onnxruntime's quantizer writes it;
  * nothing else changes: Relu and Clip stay (onnxruntime drops a Relu before a
    QuantizeLinear whose zero point is the bottom of the range).

Every constant is the float32 computation of the device's export kernels (kernels/quant.py,
numpy mirrors in ops/quant.py), so the int8 blob a device exports from its QAT training blob
equals the one the host packs from this model (quant/qat_export.py). `layers`, when
given, receives per quantized weight what went into its constants.
`strip_quantization` turns a QAT graph back into a float one (for a float export)."""
import numpy as np
from onnx import TensorProto, helper, numpy_helper

from ..errors import ArtifactError
from ..graph import DOMAIN, attr, links, optional_input
from ..ops.quant import FLOAT32_EPS, NUMPY_TYPES, WEIGHT_QMAX, \
    abs_max_scale_values, fold_batch_norm_values, qparams_values, quantize_bias_values, \
    quantize_values
from .quantize import quantization_metadata

fold_batch_norm = fold_batch_norm_values
quantize_bias = quantize_bias_values


def quantize_weight(w, axis):
    """(int8 weight, float32 per-channel scale) of symmetric int8 per-channel quantization."""
    scale = abs_max_scale_values(w, axis)
    q, _ = quantize_values(w, scale, np.zeros(len(scale), np.int64), -WEIGHT_QMAX, WEIGHT_QMAX,
                           axis)
    return q.astype(np.int8), scale


def _bias_name(node, weight, taken):
    """The name of the bias a folded BatchNormalization gives a layer that had none: the
    weight's with "bias" for "weight" (blocks.3.weight -> blocks.3.bias), else
    "<node>.bias"."""
    if weight.endswith("weight") and weight[:-6] + "bias" not in taken:
        return weight[:-6] + "bias"
    return f"{node.name}.bias"


def strip_quantization(model):
    """The float model behind a QAT graph: every QDQ pair becomes an Identity of its float
    input; observers and weight scales go."""
    graph = model.graph
    producers = {o: n for n in graph.node for o in n.output}
    kept = []
    for node in graph.node:
        if node.domain == DOMAIN and node.op_type in ("QuantParams", "MinMaxObserver",
                                                      "AbsMaxScale"):
            continue
        if node.op_type == "QuantizeLinear":
            continue
        if node.op_type == "DequantizeLinear" and node.input[0] in producers:
            source = producers[node.input[0]]
            node = helper.make_node("Identity", [source.input[0]], [node.output[0]],
                                    name=node.name)
        kept.append(node)
    del graph.node[:]
    graph.node.extend(kept)
    _drop_unused(graph)
    return model


def _drop_unused(graph):
    used = {i for n in graph.node for i in n.input} | {o.name for o in graph.output}
    keep = [i for i in graph.initializer if i.name in used]
    del graph.initializer[:]
    graph.initializer.extend(keep)
    inputs = [i for i in graph.input if i.name in used]
    del graph.input[:]
    graph.input.extend(inputs)
    infos = [v for v in graph.value_info if v.name in used or v.name in
             {o for n in graph.node for o in n.output}]
    del graph.value_info[:]
    graph.value_info.extend(infos)


def qdq_model(model, eval_model, layers=None):
    """Turn the inference graph `model` (parameters as initializers) of a QAT eval model
    into the QDQ inference model (in place). layers: a dict that receives, per int8 weight
    initializer, {weight, axis, bn (gamma, beta, mean, var, eps) or None, bias (float
    parameter or None), bias_q (int32 initializer or None), x_scale (its input's scale)}."""
    record = quantization_metadata(eval_model)
    if record is None:
        raise ArtifactError("the artifacts were not packed for quantization-aware training "
                            "(pack with --qat / quantization=True) so there is no QDQ model")
    graph = model.graph
    values = {i.name: numpy_helper.to_array(i) for i in graph.initializer}
    nodes = list(graph.node)
    producers, consumers = links(nodes)
    new_inits = {}
    drop = set()
    bias_nodes = set()

    def constant(name, value):
        new_inits[name] = numpy_helper.from_array(value, name)

    # Observers: scale and zero point of the frozen range.
    for n in nodes:
        if n.op_type == "QuantParams" and n.domain == DOMAIN:
            qmin, qmax = attr(n, "qmin", 0), attr(n, "qmax", 255)
            low, high = values[n.input[0]]
            scale, zp = qparams_values(low, high, qmin, qmax, attr(n, "eps", FLOAT32_EPS))
            constant(n.output[0], np.array(scale, np.float32))
            elem = TensorProto.UINT8 if qmin == 0 else TensorProto.INT8
            constant(n.output[1], np.array(zp, NUMPY_TYPES[elem]))
            drop.add(n.name)
    scales = {name: numpy_helper.to_array(t) for name, t in new_inits.items()}

    for layer in record["layers"]:
        node = next(n for n in nodes if n.name == layer)
        dq = producers[node.input[1]]              # DequantizeLinear of the weight
        q = producers[dq.input[0]]
        scale_node = producers[q.input[1]]
        w_name = q.input[0]
        axis = attr(q, "axis", 1)
        w = values[w_name]
        bias_index = 2 if node.op_type in ("Conv", "Gemm") else None
        b = values.get(node.input[2]) if bias_index and len(node.input) > 2 and \
            node.input[2] else None
        if node.op_type == "Gemm" and b is not None and b.shape != (w.shape[axis],):
            raise ArtifactError(f"Gemm node '{node.name}': a bias of shape {list(b.shape)} "
                                f"cannot be quantized per output channel")
        after = consumers.get(node.output[0], [])
        detail = {"weight": w_name, "axis": axis, "bn": None, "bias_q": None, "x_scale": None,
                  "bias": node.input[2] if b is not None else None}
        if len(after) == 1 and after[0].op_type == "BatchNormalization" and bias_index:
            bn = after[0]
            gamma, beta, mean, var = (values[i] for i in bn.input[1:5])
            w, b = fold_batch_norm(w, b, gamma, beta, mean, var, attr(bn, "epsilon", 1e-5), axis)
            detail["bn"] = list(bn.input[1:5]) + [float(attr(bn, "epsilon", 1e-5))]
            node.output[0] = bn.output[0]
            drop.add(bn.name)
        if layers is not None:
            layers[dq.input[0]] = detail
        w_q, w_scale = quantize_weight(w, axis)
        constant(dq.input[0], w_q)
        constant(dq.input[1], w_scale)
        drop.update((q.name, scale_node.name))
        if b is not None:
            x_dq = producers.get(node.input[0])
            while x_dq is not None and x_dq.op_type != "DequantizeLinear":
                x_dq = producers.get(x_dq.input[0])   # through Flatten / Reshape views
            if x_dq is None or x_dq.input[1] not in scales:
                raise ArtifactError(f"{node.op_type} node '{node.name}': its input is not "
                                    f"quantized, so its bias cannot be")
            b_q, b_scale = quantize_bias(b, scales[x_dq.input[1]], w_scale)
            base = optional_input(node, 2) or \
                _bias_name(node, w_name, set(values) | set(new_inits))
            constant(base + ".quantized", b_q)
            detail["bias_q"], detail["x_scale"] = base + ".quantized", x_dq.input[1]
            constant(base + ".scale", b_scale)
            constant(base + ".zero_point", np.zeros(len(b_q), np.int32))
            nodes.append(helper.make_node(
                "DequantizeLinear", [base + ".quantized", base + ".scale", base + ".zero_point"],
                [base], name=base + ".dequantize", axis=0))
            bias_nodes.add(base + ".dequantize")
            if len(node.input) > 2:
                node.input[2] = base
            else:
                node.input.append(base)
    order = [n for n in nodes if n.name not in drop]
    # the bias DequantizeLinear nodes were appended: put them first (their inputs are
    # constants), so the graph stays topologically sorted
    order.sort(key=lambda n: 0 if n.name in bias_nodes else 1)
    del graph.node[:]
    graph.node.extend(order)
    replaced = set(new_inits) | {o for n in order for o in n.output}
    keep = [i for i in graph.initializer if i.name not in replaced]
    del graph.initializer[:]
    graph.initializer.extend(keep + list(new_inits.values()))
    _drop_unused(graph)
    return model
