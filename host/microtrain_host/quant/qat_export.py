"""The int8 inference blob a device exports from its quantization-aware training blob
(Module.export_model_for_inferencing), equal to the one the host packs from the same
checkpoint (`microtrain export --qdq --int8-blob`).

At pack time the QDQ model of the eval graph is built with placeholder values (zeros: only
its structure counts), fused and lowered as pack_inference_model does: that blob, cut, is
the inference template. The training blob gets a program "export" computing from the current
parameters every value that blob holds, with the float32 arithmetic of quant/qdq.py
(ops/quant.py): the observers' scales and zero points (QuantParams, ZeroPointInt), each
quantized layer's BatchNorm folded in (FoldBatchNorm), its per-channel weight scales
(AbsMaxScale), int8 weights (QuantizeWeight) and int32 bias (QuantizeBias), and each int8
step's requantization head (RequantHeader); the template's cuts take them from the training
arenas: weights and biases as tensor data, scales and zero points as the quantized tensors'
parameters. The device derives the multipliers at load, as for any int8 blob.

The export program's results stay in the arenas until the template is streamed: the int8
weights in the byte arena (a quarter of the quantized layers' float weights), biases, heads
and zero points in the int arena, scales in the float arena."""
import functools

import numpy as np
from onnx import TensorProto, helper

from ..errors import ArtifactError, UnsupportedOpError
from ..graph import DOMAIN, attr
from ..ops.quant import FLOAT32_EPS, QUANT_RANGES, WEIGHT_QMAX
from ..ir import BYTE_TYPES, CONSTANT, INPUT, PARAM
from ..pipeline.inference import inference_model
from ..pipeline.lower import Lowering, meta_names
from .int8 import int8_graph
from .qdq import qdq_model
from .quantize import quantization_metadata

EXPORT_PROGRAM = "export"
HEADED = ("QLinearConv", "QLinearGemm", "QLinearGlobalAveragePool", "QLinearAveragePool",
          "QLinearAdd")
ZERO_POINT_INT = ".int"     # suffix of an observer zero point's int32 copy


def skeleton(eval_model):
    """(the QAT eval model's QDQ model with zeros for every parameter, its fused int8 graph,
    the layers qdq_model quantized, the eval graph's observers: {scale name: QuantParams
    node}), or None when the device cannot export it as int8 (a quantized weight its op does
    not take in as int8, a lookup table)."""
    if quantization_metadata(eval_model) is None:
        return None
    meta = {p.key: p.value for p in eval_model.metadata_props}
    shapes = {vi.name: tuple(d.dim_value for d in vi.type.tensor_type.shape.dim)
              for vi in eval_model.graph.input}
    values = {p: np.zeros(shapes[p], np.float32) for p in meta_names(meta, "params")}
    layers = {}
    try:
        qdq = qdq_model(inference_model(eval_model, None, values), eval_model, layers)
        fused = int8_graph(qdq, structural=True)
    except (ArtifactError, UnsupportedOpError):
        return None
    floats = {i.name for i in fused.graph.initializer if i.data_type == TensorProto.FLOAT}
    if any(d["weight"] in floats for d in layers.values()) or any(
            n.op_type == "QLinearLookup" for n in fused.graph.node):
        return None
    observers = {n.output[0]: n for n in eval_model.graph.node
                 if n.op_type == "QuantParams" and n.domain == DOMAIN}
    return qdq, fused, layers, observers


def export_graph(eval_model, fused, layers, observers):
    """The ONNX graph of the export program: parameters in, every value of the int8 blob
    out (named as in the fused graph: weights `<w>.quantized`, biases, weight scales
    `<w>.scale`, observer scales, `<zero point>.int`, `<node>.header`)."""
    inputs = {vi.name: vi for vi in eval_model.graph.input}
    shape_of = {n: tuple(d.dim_value for d in vi.type.tensor_type.shape.dim)
                for n, vi in inputs.items()}
    nodes, outputs, infos, used = [], [], {}, set()

    def info(name, elem, shape):
        infos[name] = helper.make_tensor_value_info(name, elem, list(shape))

    def param(name):
        if name not in inputs:
            raise ArtifactError(f"int8 export: '{name}' is not a parameter of the eval model")
        used.add(name)
        return name

    for scale, node in observers.items():
        zero_point = node.output[1]
        nodes.append(helper.make_node("QuantParams", [param(node.input[0])], [scale, zero_point],
                                      name=scale + ".export", domain=DOMAIN,
                                      **{a.name: helper.get_attribute_value(a)
                                         for a in node.attribute}))
        nodes.append(helper.make_node("ZeroPointInt", [zero_point], [zero_point + ZERO_POINT_INT],
                                      name=zero_point + ".export", domain=DOMAIN))
        info(scale, TensorProto.FLOAT, ())
        info(zero_point, TensorProto.FLOAT, ())
        info(zero_point + ZERO_POINT_INT, TensorProto.INT32, (1,))
        outputs += [scale, zero_point + ZERO_POINT_INT]
    for quantized, d in layers.items():
        w, axis = d["weight"], d["axis"]
        shape = shape_of[param(w)]
        channels = shape[axis % len(shape)]
        folded, bias = w, d["bias"]
        if d["bn"] is not None:
            gamma, beta, mean, var, eps = d["bn"]
            folded, bias = quantized + ".folded", quantized + ".folded_bias"
            nodes.append(helper.make_node(
                "FoldBatchNorm", [w, param(d["bias"]) if d["bias"] else "", param(gamma),
                                  param(beta), param(mean), param(var)], [folded, bias],
                name=quantized + ".fold", domain=DOMAIN, axis=axis, epsilon=eps))
            info(folded, TensorProto.FLOAT, shape)
            info(bias, TensorProto.FLOAT, (channels,))
        elif bias:
            param(bias)
        w_scale = w + ".scale"
        nodes.append(helper.make_node("AbsMaxScale", [folded], [w_scale], name=w_scale + ".export",
                                      domain=DOMAIN, axis=axis, qmax=float(WEIGHT_QMAX),
                                      eps=FLOAT32_EPS))
        nodes.append(helper.make_node("QuantizeWeight", [folded, w_scale], [quantized],
                                      name=quantized + ".export", domain=DOMAIN, axis=axis))
        info(w_scale, TensorProto.FLOAT, (channels,))
        info(quantized, TensorProto.INT8, shape)
        outputs += [w_scale, quantized]
        if d["bias_q"]:
            nodes.append(helper.make_node("QuantizeBias", [bias, d["x_scale"], w_scale],
                                          [d["bias_q"]], name=d["bias_q"] + ".export",
                                          domain=DOMAIN))
            info(d["bias_q"], TensorProto.INT32, (channels,))
            outputs.append(d["bias_q"])
    zero_points = {scale: node.output[1] for scale, node in observers.items()}
    for node in fused.graph.node:
        if node.op_type not in HEADED + ("QLinearConcat",):
            continue
        scales = [v.decode() if isinstance(v, bytes) else v for v in attr(node, "q_scales")]
        qmin, qmax = QUANT_RANGES[attr(node, "y_type", TensorProto.UINT8)]
        # a Concat: one header per input ([x_zp, y_zp, lo, hi], ops/qlinear.py)
        parts = [(node.name, scales)] if node.op_type in HEADED else [
            (f"{node.name}:{k}", [s, scales[-1]]) for k, s in enumerate(scales[:-1])]
        for part, used_scales in parts:
            header = part + ".header"
            nodes.append(helper.make_node(
                "RequantHeader", [zero_points[s] for s in used_scales] + [scales[-1]],
                [header], name=header, domain=DOMAIN, qmin=qmin, qmax=qmax,
                **{k: attr(node, k) for k in ("clamp_min", "clamp_max")
                   if attr(node, k, None) is not None}))
            info(header, TensorProto.INT32, (len(used_scales) + 2,))
            outputs.append(header)
    graph = helper.make_graph(nodes, EXPORT_PROGRAM, [inputs[n] for n in sorted(used)],
                              [infos[o] for o in outputs],
                              value_info=[v for k, v in infos.items() if k not in outputs])
    opsets = [o for o in eval_model.opset_import if o.domain != DOMAIN]
    return helper.make_model(graph, opset_imports=opsets + [helper.make_opsetid(DOMAIN, 1)],
                             ir_version=eval_model.ir_version)


def lower_export(training, eval_model):
    """Lower the export program into the training blob's Lowering (before its arenas are
    planned). Returns the int8 template's lowering, template(training lowering) ->
    (its Lowering, spliced tensors) (pipeline/inference.py inference_template), or None
    (the blob keeps a float inference template)."""
    parts = skeleton(eval_model)
    if parts is None:
        return None
    qdq, fused, layers, observers = parts
    training.lower(EXPORT_PROGRAM, export_graph(eval_model, fused, layers, observers))
    meta = {p.key: p.value for p in eval_model.metadata_props}
    parts = qdq, fused, layers, dict(training.local), set(meta_names(meta, "params"))
    return functools.partial(lower_int8_template, parts)


def lower_int8_template(parts, training):
    """(the template's Lowering, spliced [(template tensor id, field, training tensor id)]):
    the fused skeleton lowered as pack_inference_model lowers a QDQ model; what the export
    program computes is cut out (Tensor.data 6, Tensor.scale 8, Tensor.zero_point 9), and
    the float parameters of layers that stay float are taken from the training arena (they
    are lowered as parameters, so that no lowering folds their placeholder values)."""
    qdq, fused, layers, exported, params = parts
    graph = fused.graph
    floats = [i for i in graph.initializer if i.name in params]
    for init in floats:
        graph.input.append(helper.make_tensor_value_info(init.name, init.data_type,
                                                         list(init.dims)))
    keep = [i for i in graph.initializer if i.name not in params]
    del graph.initializer[:]
    graph.initializer.extend(keep)
    roles = {i.name: INPUT for i in graph.input}
    roles.update({i.name: PARAM for i in floats})
    infer = Lowering(roles)
    infer.lower("infer", fused)
    observer_of = {n.output[0]: (n.input[1], n.input[2]) for n in qdq.graph.node
                   if n.op_type == "QuantizeLinear"}
    weight_scales = {q: d["weight"] + ".scale" for q, d in layers.items()}
    spliced = []
    for key, tid in infer.persistent.items():
        t = infer.tensors[tid]
        if t.role == PARAM:                                # a float parameter
            source = training.persistent.get(key)
            if source is None or training.tensors[source].size != t.size:
                raise ArtifactError(f"inference tensor '{key}' has no counterpart in the "
                                    f"training blob to take its values from")
            t.role, t.data = CONSTANT, bytes(4 * t.size)
            spliced.append((tid, "data", source))
        elif key.endswith(".requant"):
            spliced.append((tid, "data", exported[key[:-len(".requant")] + ".header"]))
        elif key in exported and t.role == CONSTANT:       # int8 weights, int32 biases
            spliced.append((tid, "data", exported[key]))
        if key in weight_scales:
            spliced.append((tid, "scale", exported[weight_scales[key]]))
    for tid, t in enumerate(infer.tensors):
        if t.dtype in BYTE_TYPES and t.role != CONSTANT and len(t.scale):
            if t.name not in observer_of:
                raise ArtifactError(f"int8 export: no QuantizeLinear makes '{t.name}'")
            scale, zero_point = observer_of[t.name]
            spliced.append((tid, "scale", exported[scale]))
            spliced.append((tid, "zero_point", exported[zero_point + ZERO_POINT_INT]))
    return infer, spliced
