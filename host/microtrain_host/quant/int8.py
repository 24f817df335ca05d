"""int8 inference blobs from QDQ models: what onnxruntime's QDQ fusion does, for the device.

`int8_graph(model)` rewrites a QDQ model (microtrain export --qdq, or onnxruntime's
quantizer) into ai.microtrain int8 ops (ops/qlinear.py):
  * DequantizeLinear(activation) -> Conv / Gemm / MatMul (weight: DequantizeLinear of an
    int8 initializer, bias: of an int32 one) -> [Relu | Clip] -> QuantizeLinear
    becomes QLinearConv / QLinearGemm, the Relu / Clip fused as clamp bounds;
  * DequantizeLinear -> GlobalAveragePool / AveragePool -> QuantizeLinear:
    QLinearGlobalAveragePool / QLinearAveragePool;
  * DequantizeLinear(A), DequantizeLinear(B) -> Add -> [Relu | Clip] -> QuantizeLinear, A
    and B of one shape: QLinearAdd (onnxruntime's QLinearAdd; the residual connections of
    ResNet and MobileNetV2 blocks);
  * DequantizeLinear of every input -> Concat -> QuantizeLinear: QLinearConcat, each input
    requantized to the output's scale and zero point (copied where it has them);
  * DequantizeLinear -> Relu / Clip -> QuantizeLinear where no producer takes them in, and
    DequantizeLinear -> Sigmoid / Tanh / LeakyRelu / HardSigmoid / HardSwish ->
    QuantizeLinear: QLinearLookup, a 256-entry table computed as onnxruntime computes the
    float chain (dequantize, the activation, quantize; ops/intlookup.py);
  * DequantizeLinear -> MaxPool -> QuantizeLinear (same scale and zero point):
    QLinearMaxPool; DequantizeLinear -> Flatten / Reshape -> QuantizeLinear (same): the
    view of the int8 tensor;
  * a QuantizeLinear of a float tensor: Quantize; an int8 tensor a float op or the graph
    output reads: Dequantize. Everything else stays float.
`pack_inference_model(model, path)` lowers the result into an inference blob (program
"infer") that microtrain.InferenceSession runs."""
import os

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper, shape_inference

from ..errors import ArtifactError
from ..graph import DOMAIN, attr, links, optional_input
from ..ops.intlookup import SMOOTH_LOOKUPS, lookup_alpha_beta, smooth_activation
from ..ops.quant import requant_head
from ..formats.blob import serialize
from ..formats.files import write_atomically
from ..ir import INPUT
from ..pipeline.lower import Lowering
from ..pipeline.plan import assign_offsets

FUSED_OPS = ("Conv", "Gemm", "MatMul")
VIEW_OPS = ("Flatten", "Reshape", "Squeeze", "Unsqueeze")
CLAMP_OPS = ("Relu", "Clip")
INT8_OPS = FUSED_OPS + ("GlobalAveragePool", "AveragePool", "MaxPool", "Add", "Concat") \
    + VIEW_OPS + CLAMP_OPS + SMOOTH_LOOKUPS


def _scalar(values, name):
    v = values.get(name)
    if v is None:
        return None
    return np.asarray(v).reshape(-1)


def int8_graph(model, float_weights=(), training=False, structural=False):
    """The QDQ model `model` with its quantized ops fused; a new model.

    float_weights: names of weights or biases (a weight's name is its DequantizeLinear's
    output with a trailing ".fake_quant" dropped, e.g. "classifier.weight"; a bias keeps its
    float name; one BatchNormalization folded in gives the weight's name with "bias" for
    "weight", e.g. "blocks.3.bias") whose ops stay float: their int8 weights and int32
    biases become float initializers of that name (the trainable layers of a fine-tune). training=True keeps a QuantizeLinear ->
    DequantizeLinear pair between float ops as fake quantization (constant scale and zero
    point, as Constant nodes) instead of real int8 tensors, so gradients pass; initializers
    no node reads any more are dropped. structural=True: decide from names alone, never from
    values (a MaxPool / view keeps int8 when its pairs share their scale initializers), and
    give each fused node what its constants are made of (scales: q_scales, the names of the
    input (and second input) and output scale initializers; clamp_min / clamp_max of a fused
    Relu / Clip): the template of the int8 blob a device exports (quant/qat_export.py)."""
    model = shape_inference.infer_shapes(model)
    graph = model.graph
    values = {i.name: numpy_helper.to_array(i) for i in graph.initializer}
    for n in graph.node:   # Clip's bounds as Constant nodes (torch's export)
        if n.op_type == "Constant" and n.attribute and n.attribute[0].name == "value":
            values[n.output[0]] = numpy_helper.to_array(n.attribute[0].t)
    shapes = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim]
              for v in list(graph.value_info) + list(graph.input) + list(graph.output)}
    nodes = list(graph.node)
    producers, consumers = links(nodes)
    outputs = {o.name for o in graph.output}

    def qparams(node):
        """(scale, zero point, elem type) of a Q/DQ node with constant parameters."""
        scale = _scalar(values, node.input[1])
        zp_name = optional_input(node, 2)
        zp = _scalar(values, zp_name) if zp_name else np.zeros(1, np.uint8)
        if scale is None or zp is None:
            return None
        for v in np.ravel(scale):
            if not (np.isfinite(v) and v > 0):     # the device refuses it at load
                raise ArtifactError(f"{node.op_type} node '{node.name}': scale "
                                    f"'{node.input[1]}' is {float(v)!r}; a quantization "
                                    f"scale must be a positive finite number")
        return scale, zp, onnx.helper.np_dtype_to_tensor_dtype(zp.dtype)

    def single(name):
        c = consumers.get(name, [])
        return c[0] if len(c) == 1 and name not in outputs else None

    dq_source = {}   # float output of an activation DequantizeLinear -> (int8 tensor, params)
    for n in nodes:
        if n.op_type == "DequantizeLinear" and n.input[0] not in values:
            p = qparams(n)
            if p is None or p[0].size != 1:
                raise ArtifactError(f"DequantizeLinear node '{n.name}': an activation needs a "
                                    f"constant per-tensor scale and zero point")
            dq_source[n.output[0]] = (n.input[0], p)

    def weight_of(name):
        n = producers.get(name)
        if n is None or n.op_type != "DequantizeLinear" or n.input[0] not in values:
            return None
        return values[n.input[0]], qparams(n)

    new, done = [], set()
    materialized = set()

    def dequantize(name):
        if name in materialized:
            return
        t, (scale, zp, _) = dq_source[name]
        new.append(helper.make_node("Dequantize", [t], [name], name=name + ".int8_to_float",
                                    domain=DOMAIN, scale=float(scale[0]),
                                    zero_point=int(zp[0])))
        materialized.add(name)

    def clip_range(c):
        """(min, max) of a Relu or Clip (None: unbounded)."""
        if c.op_type == "Relu":
            return 0.0, None
        if len(c.input) > 1 or not c.attribute:
            cmin = _scalar(values, c.input[1]) if len(c.input) > 1 and c.input[1] else None
            cmax = _scalar(values, c.input[2]) if len(c.input) > 2 and c.input[2] else None
            return (None if cmin is None else float(cmin[0]),
                    None if cmax is None else float(cmax[0]))
        return attr(c, "min", None), attr(c, "max", None)   # Clip-6 attributes

    def constant_clip(c):
        return c.op_type == "Relu" or all(
            i in values for i in c.input[1:] if i)

    def clamps(chain):
        """The tightest (min, max) of a fused Relu / Clip chain (None: unbounded)."""
        lo = hi = None
        for c in chain:
            cmin, cmax = clip_range(c)
            if cmin is not None:
                lo = cmin if lo is None else max(lo, cmin)
            if cmax is not None:
                hi = cmax if hi is None else min(hi, cmax)
        return lo, hi

    def bounds(y_params, chain):
        # the bounds' quantized values, float32 as onnxruntime's QuantizeLinear
        qmin, qmax = (0, 255) if y_params[2] == TensorProto.UINT8 else (-128, 127)
        return requant_head([y_params[1][0]], y_params[0][0], qmin, qmax, *clamps(chain))[1:]

    def names(*nodes_):
        """structural=True: the scale initializer names of the given Q / DQ nodes, and the
        fused clamp, as attributes"""
        return {"q_scales": [n.input[1] for n in nodes_]} if structural else {}

    def lookup_table(x_params, c, y_params):
        """Y's byte for each byte of X: dequantize, the activation, quantize in float32."""
        f = np.float32
        byte = np.arange(256)
        q = byte - 256 * (byte > 127) if x_params[2] == TensorProto.INT8 else byte
        real = ((q - int(x_params[1][0])).astype(f) * f(x_params[0][0])).astype(f)
        if c.op_type in SMOOTH_LOOKUPS:
            real = smooth_activation(c.op_type, c, real)
        else:
            cmin, cmax = clip_range(c)
            if cmin is not None:
                real = np.maximum(real, f(cmin))
            if cmax is not None:
                real = np.minimum(real, f(cmax))
        lo, hi = (0, 255) if y_params[2] == TensorProto.UINT8 else (-128, 127)
        out = np.rint((real / f(y_params[0][0])).astype(f)) + int(y_params[1][0])
        return [int(v) for v in np.clip(out, lo, hi)]

    def common(x_params, y_q, y_params):
        return dict(x_scale=float(x_params[0][0]), x_zero_point=int(x_params[1][0]),
                    y_scale=float(y_params[0][0]), y_zero_point=int(y_params[1][0]),
                    y_type=y_params[2])

    for n in nodes:
        if n.name in done:
            continue
        if n.op_type == "DequantizeLinear" and (n.output[0] in dq_source or n.input[0] in values):
            continue   # materialized where a float op reads it, folded into a fused op
        fused = None
        x_in = n.input[0] if n.input else None
        if x_in in dq_source and n.op_type in INT8_OPS and (
                n.op_type not in ("Add", "Concat") or all(i in dq_source for i in n.input)) and (
                n.op_type not in CLAMP_OPS or constant_clip(n)):
            chain, end = [], n.output[0]
            while n.op_type in FUSED_OPS + ("Add",) and single(end) is not None and \
                    single(end).op_type in CLAMP_OPS and constant_clip(single(end)):
                chain.append(single(end))
                end = chain[-1].output[0]
            q = single(end)
            if q is not None and q.op_type == "QuantizeLinear" and qparams(q) is not None:
                fused = (chain, q, qparams(q))
        if fused is not None:
            chain, q, y_params = fused
            x_t, x_params = dq_source[x_in]
            y_t = q.output[0]
            x_dq = producers[x_in]
            if structural:
                same = list(x_dq.input[1:]) == list(q.input[1:])
            else:
                same = (x_params[0][0] == y_params[0][0] and x_params[1][0] == y_params[1][0]
                        and x_params[2] == y_params[2])
            extra_attrs = names(x_dq, q)
            if structural:
                cmin, cmax = clamps(chain)
                extra_attrs.update({k: v for k, v in (("clamp_min", cmin), ("clamp_max", cmax))
                                    if v is not None})
            made = None
            if n.op_type in FUSED_OPS and weight_name(n.input[1]) not in float_weights and not (
                    len(n.input) > 2 and n.input[2] in float_weights):
                w = weight_of(n.input[1])
                b = weight_of(n.input[2]) if len(n.input) > 2 and n.input[2] else None
                transposed = n.op_type == "Gemm" and attr(n, "transB", 0)
                if w is not None and w[0].dtype == np.int8 and (b is None or b[0].dtype ==
                                                                np.int32) and \
                        not (n.op_type == "Gemm" and (attr(n, "transA", 0)
                                                      or attr(n, "alpha", 1.0) != 1.0)):
                    lo, hi = bounds(y_params, chain)
                    w_dq = producers[n.input[1]]
                    inputs = [x_t, w_dq.input[0]] + ([producers[n.input[2]].input[0]] if b else [])
                    extra = {k: a for k, a in ((a.name, helper.get_attribute_value(a))
                                               for a in n.attribute)
                             if n.op_type == "Conv"}
                    made = helper.make_node(
                        "QLinearConv" if n.op_type == "Conv" else "QLinearGemm", inputs, [y_t],
                        name=n.name, domain=DOMAIN, w_scales=[float(v) for v in w[1][0]],
                        lo=lo, hi=hi, transB=int(bool(transposed)),
                        **common(x_params, q, y_params), **extra, **extra_attrs)
            elif n.op_type in ("GlobalAveragePool", "AveragePool"):
                lo, hi = bounds(y_params, [])
                made = helper.make_node("QLinear" + n.op_type, [x_t], [y_t], name=n.name,
                                        domain=DOMAIN, lo=lo, hi=hi,
                                        **common(x_params, q, y_params), **extra_attrs,
                                        **{a.name: helper.get_attribute_value(a)
                                           for a in n.attribute})
            elif n.op_type == "Add" and shapes.get(n.input[0]) == shapes.get(n.input[1]) \
                    == shapes.get(n.output[0]) and shapes.get(n.input[0]):
                b_t, b_params = dq_source[n.input[1]]
                lo, hi = bounds(y_params, chain)
                if structural:
                    extra_attrs["q_scales"] = [x_dq.input[1], producers[n.input[1]].input[1],
                                               q.input[1]]
                made = helper.make_node(
                    "QLinearAdd", [x_t, b_t], [y_t], name=n.name, domain=DOMAIN,
                    a_scale=float(x_params[0][0]), a_zero_point=int(x_params[1][0]),
                    b_scale=float(b_params[0][0]), b_zero_point=int(b_params[1][0]),
                    y_scale=float(y_params[0][0]), y_zero_point=int(y_params[1][0]),
                    y_type=y_params[2], lo=lo, hi=hi, **extra_attrs)
            elif n.op_type == "Concat":
                ins = [dq_source[i][1] for i in n.input]
                if structural:
                    extra_attrs["q_scales"] = [producers[i].input[1] for i in n.input] + [
                        q.input[1]]
                lo, hi = bounds(y_params, [])
                made = helper.make_node(
                    "QLinearConcat", [dq_source[i][0] for i in n.input], [y_t], name=n.name,
                    domain=DOMAIN, axis=attr(n, "axis", 0),
                    x_scales=[float(p[0][0]) for p in ins],
                    x_zero_points=[int(p[1][0]) for p in ins], y_scale=float(y_params[0][0]),
                    y_zero_point=int(y_params[1][0]), y_type=y_params[2], lo=lo, hi=hi,
                    **extra_attrs)
            elif n.op_type in CLAMP_OPS + (() if structural else SMOOTH_LOOKUPS):
                # (structural: the template of a device export, which has no lookup
                # tables - quant/qat_export.py - keeps the smooth ones float, as before)
                # the activation and X's quantization recorded for the integer backward
                # (ops/intlookup.py: its slope per byte); the blob reads only the table
                cmin, cmax = clip_range(n) if n.op_type in CLAMP_OPS else (None, None)
                if n.op_type in SMOOTH_LOOKUPS:
                    extra_attrs.update(zip(("alpha", "beta"), lookup_alpha_beta(n)))
                made = helper.make_node("QLinearLookup", [x_t], [y_t], name=n.name,
                                        domain=DOMAIN, y_type=y_params[2],
                                        y_scale=float(y_params[0][0]),
                                        y_zero_point=int(y_params[1][0]),
                                        table=lookup_table(x_params, n, y_params),
                                        activation=n.op_type, x_type=x_params[2],
                                        x_scale=float(x_params[0][0]),
                                        x_zero_point=int(x_params[1][0]), **extra_attrs,
                                        **{k: float(v) for k, v in (("clamp_min", cmin),
                                                                    ("clamp_max", cmax))
                                           if v is not None})
            elif same and n.op_type == "MaxPool":
                made = helper.make_node("QLinearMaxPool", [x_t], [y_t], name=n.name,
                                        domain=DOMAIN, **{a.name: helper.get_attribute_value(a)
                                                          for a in n.attribute})
            elif same and n.op_type in VIEW_OPS:
                made = helper.make_node(n.op_type, [x_t] + list(n.input[1:]), [y_t],
                                        name=n.name, **{a.name: helper.get_attribute_value(a)
                                                        for a in n.attribute})
            if made is not None:
                new.append(made)
                done.update(c.name for c in chain)
                done.add(q.name)
                continue
        if n.op_type == "QuantizeLinear":
            p = qparams(n)
            if p is None or p[0].size != 1:
                raise ArtifactError(f"QuantizeLinear node '{n.name}': an activation needs a "
                                    f"constant per-tensor scale and zero point")
            if n.input[0] in dq_source:
                dequantize(n.input[0])
            new.append(helper.make_node("Quantize", [n.input[0]], [n.output[0]], name=n.name,
                                        domain=DOMAIN, scale=float(p[0][0]),
                                        zero_point=int(p[1][0]), y_type=p[2]))
            continue
        for i in n.input:
            if i in dq_source:
                dequantize(i)
            elif i and producers.get(i) is not None and producers[i].op_type == \
                    "DequantizeLinear" and producers[i].input[0] in values:
                # a float op reading a dequantized constant: the float value, an
                # initializer named as the weight (a parameter of a fine-tune)
                w_dq = producers[i]
                p = qparams(w_dq)
                axis = attr(w_dq, "axis", 1)
                q = values[w_dq.input[0]].astype(np.float64)
                view = [1] * q.ndim
                if p[0].size > 1:
                    view[axis % q.ndim] = -1
                name = weight_name(i)
                if name not in values:
                    values[name] = ((q - p[1].reshape(view)) * p[0].reshape(view)
                                    ).astype(np.float32)
                    graph.initializer.append(numpy_helper.from_array(values[name], name))
                n.input[list(n.input).index(i)] = name
        new.append(n)
    for o in graph.output:
        if o.name in dq_source:
            dequantize(o.name)
    if training:
        new = _fake_quant_pairs(new)
    read = {i for n in new for i in n.input}
    result = helper.make_graph(new, graph.name, list(graph.input), list(graph.output),
                               initializer=[i for i in graph.initializer if i.name in read],
                               value_info=list(graph.value_info))
    opsets = [o for o in model.opset_import if o.domain != DOMAIN]
    opsets.append(helper.make_opsetid(DOMAIN, 1))
    return helper.make_model(result, opset_imports=opsets, ir_version=model.ir_version)


class _Everything:
    def __contains__(self, name):
        return True


ALL_WEIGHTS = _Everything()   # float_weights that keeps every layer float


def weight_name(dequantized):
    """The parameter name of a dequantized weight: 'w.fake_quant' -> 'w'."""
    return dequantized[:-len(".fake_quant")] if dequantized.endswith(".fake_quant") \
        else dequantized


def _fake_quant_pairs(nodes):
    """Quantize -> Dequantize between float ops back to a standard QDQ pair (fake
    quantization with the straight-through gradient), its scale and zero point Constants."""
    readers = {}
    for n in nodes:
        for i in n.input:
            readers.setdefault(i, []).append(n)
    result = []
    for n in nodes:
        if n.op_type == "Quantize" and n.domain == DOMAIN and readers.get(n.output[0]) and all(
                r.op_type == "Dequantize" for r in readers[n.output[0]]):
            scale, zp = n.name + ".scale", n.name + ".zero_point"
            elem = attr(n, "y_type", TensorProto.UINT8)
            result += [
                helper.make_node("Constant", [], [scale], name=scale, value=numpy_helper.from_array(
                    np.array(attr(n, "scale"), np.float32))),
                helper.make_node("Constant", [], [zp], name=zp, value=numpy_helper.from_array(
                    np.array(attr(n, "zero_point"), np.uint8 if elem == TensorProto.UINT8
                             else np.int8))),
                helper.make_node("QuantizeLinear", [n.input[0], scale, zp], list(n.output),
                                 name=n.name)]
            for r in readers[n.output[0]]:
                r.op_type, r.domain = "DequantizeLinear", ""
                del r.attribute[:]
                r.input.extend([scale, zp])
            continue
        result.append(n)
    return result


def is_qdq_model(model):
    """True when some DequantizeLinear reads an int8 initializer (a quantized weight)."""
    ints = {i.name for i in model.graph.initializer if i.data_type == TensorProto.INT8}
    return any(n.op_type == "DequantizeLinear" and n.input[0] in ints for n in model.graph.node)


def pack_inference_model(model, path):
    """Lower a QDQ model (ModelProto or path) into an int8 inference blob at `path` for
    microtrain.InferenceSession. Returns the blob's bytes."""
    if not isinstance(model, onnx.ModelProto):
        model = onnx.load(os.fspath(model))
    fused = int8_graph(model)
    initializers = {i.name for i in fused.graph.initializer}
    roles = {i.name: INPUT for i in fused.graph.input if i.name not in initializers}
    lowering = Lowering(roles)
    lowering.lower("infer", fused)
    # the layout of a QAT blob's device export (quant/qat_export.py): values not shared
    data = serialize(lowering, [], assign_offsets(lowering), "", 0, None, None,
                     share_quantization=False)
    try:
        write_atomically(os.fspath(path), data)
    except OSError as e:
        raise ArtifactError(f"cannot write '{path}': {e}") from e
    return data
