"""int8 inference ops: the lowerings of the ai.microtrain ops quant/int8.py turns a QDQ
model into (what onnxruntime's QDQ fusion turns it into: QGemm, QLinearConv, ...), and the
integer requantization parameters. Device kernels: kernels/qlinear.py.

  Quantize(X) -> T              float -> int8/uint8 (scale, zero_point, dtype attributes)
  Dequantize(T) -> X            int8/uint8 -> float
  QLinearGemm(T, W[, B]) -> Y   Gemm of int8 operands, int32 bias, requantized output
  QLinearConv(T, W[, B]) -> Y   Conv likewise (ONNX Conv attributes)
  QLinearGlobalAveragePool(T) -> Y
  QLinearAveragePool(T) -> Y    AveragePool attributes (kernel, strides, pads, ceil_mode,
                                count_include_pad)
  QLinearAdd(A, B) -> Y         a_scale, a_zero_point, b_scale, b_zero_point, ...
  QLinearMaxPool(T) -> Y        the scale and zero point stay
  QLinearLookup(T) -> Y         a standalone Relu / Clip: `table` (256 bytes, by X's byte)
  QLinearConcat(T1, T2, ...) -> Y   Concat (axis); each input requantized to Y's scale and
                                zero point (x_scales, x_zero_points), one step per input

Every quantized op carries x_scale, x_zero_point, y_scale, y_zero_point, the output type
(y_type, ONNX's enum), the clamp bounds lo / hi in the output's quantized domain (a fused
Relu or Clip, or the type's range); QLinearGemm / QLinearConv also w_scales (per output
channel). Every int8 / uint8 tensor of the blob carries its scale(s) and zero point(s)
(Tensor.scale, zero_point, axis); a step's requantization tensor stores only its zero points
and bounds, the device derives the integer multipliers from those scales at load
(kernels/qlinear.py), in float32 as onnxruntime computes its multipliers.
`channel_reals` / `requant_multiplier` / `add_multipliers` mirror that derivation."""
import math

import numpy as np
from onnx import TensorProto

from .. import opcodes as op
from ..errors import UnsupportedOpError
from ..graph import attr, optional_input
from ..ir import (ACTIVATION, CONSTANT, FLOAT, INT32, INT8, NO_TENSOR, PARAM, UINT8,
                              Tensor)
from ..registry import lowering
from .conv import conv_attributes, device_geometry
from .pool import pool_kernel_ints

MULTIPLIER_BITS = 24   # m0 in [2**23, 2**24]: float32's precision, as onnxruntime's multiplier
DEVICE_TYPES = {TensorProto.UINT8: UINT8, TensorProto.INT8: INT8}


def channel_reals(x_scale, w_scales, y_scale):
    """float32(float32(x_scale * w_scale) / y_scale) per channel (onnxruntime's multiplier)."""
    f = np.float32
    return [float(f(f(f(x_scale) * f(w)) / f(y_scale))) for w in np.ravel(w_scales)]


def pool_reals(x_scale, y_scale, counts):
    """float32(x_scale / float32(y_scale * count)) for each count (MLAS's average pool)."""
    f = np.float32
    return [float(f(f(x_scale) / f(f(y_scale) * f(n)))) for n in counts]


ADD_BITS = 21


def add_multipliers(a_scale, b_scale, y_scale):
    """(MA, MB, S) of QLinearAdd (kernels/qlinear.py add_multipliers): the float32 ratios
    a_scale / y_scale and b_scale / y_scale as MA / 2**S, MB / 2**S with 21 bits."""
    f = np.float32
    ra, rb = float(f(f(a_scale) / f(y_scale))), float(f(f(b_scale) / f(y_scale)))
    s = min(max(ADD_BITS - math.frexp(max(ra, rb))[1], 1), 30)
    top = 1 << ADD_BITS
    return (min(round(ra * (1 << s)), top) if ra < 1e30 else top,
            min(round(rb * (1 << s)), top) if rb < 1e30 else top, s)


def requant_multiplier(real):
    """(m0, shift) with real ~= m0 / 2**shift, m0 < 2**24 + 1, 1 <= shift <= 62 (exactly
    for a float32 real: m0 is its mantissa)."""
    if not real > 0.0 or not math.isfinite(real):
        return 0, 1
    mantissa, exponent = math.frexp(real)           # real = mantissa * 2**exponent
    m0 = round(mantissa * 2 ** MULTIPLIER_BITS)
    shift = MULTIPLIER_BITS - exponent
    if shift < 1:                                    # real >= 2**23: saturates anyway
        return 2 ** 24, 1
    if shift > 62:                                   # real < 2**-38: always the zero point
        return 0, 1
    return m0, shift


def requant_values(acc, m0, shift):
    """numpy mirror of kernels/fixedpoint.py requant: round half to even of acc * m0 / 2**shift,
    saturated at +-2**29 (as on every port)."""
    p = np.asarray(acc, np.int64).astype(object) * int(m0)
    q = np.vectorize(lambda v: _round_shift(v, shift), otypes=[np.int64])(p)
    return np.clip(q, -(1 << 29), 1 << 29)


def _round_shift(p, shift):
    q = p >> shift
    r = p - (q << shift)
    half = 1 << (shift - 1)
    return q + 1 if r > half or (r == half and q & 1) else q


def _byte_tensor(ctx, name, dtype, shape, scale=(), zero_point=()):
    tid = ctx.add(Tensor(name, dtype, ACTIVATION, tuple(shape), program=ctx.program_name,
                         scale=tuple(float(v) for v in scale),
                         zero_point=tuple(int(v) for v in zero_point)))
    ctx.local[name] = tid
    return tid


def _constant(ctx, name, dtype, value, **quantization):
    """A constant tensor of the given device dtype (placed once per blob); quantization:
    scale, zero_point, axis of an int8 one."""
    if name in ctx.persistent:
        ctx.local[name] = ctx.persistent[name]
        return ctx.persistent[name]
    numpy_type = {FLOAT: "<f4", INT32: "<i4", INT8: "i1", UINT8: "u1"}[dtype]
    value = np.asarray(value)
    tid = ctx.add(Tensor(name, dtype, CONSTANT, tuple(value.shape) or (1,),
                         data=np.ascontiguousarray(value, numpy_type).tobytes(),
                         **quantization))
    ctx.persistent[name] = ctx.local[name] = tid
    return tid


def _output(ctx, node):
    elem = attr(node, "y_type", TensorProto.UINT8)
    return _byte_tensor(ctx, node.output[0], DEVICE_TYPES[elem], ctx.shape(node.output[0]),
                        [attr(node, "y_scale")], [attr(node, "y_zero_point", 0)])


def _signed(ctx, name):
    return int(ctx.tensors[ctx.t(name)].dtype == INT8)


def _derived_requant(ctx, node, head, size, part=""):
    """A requantization tensor of `size` int32 whose blob data is only `head` (zero points,
    clamp bounds): the device derives the multipliers from the tensors' scales at load.
    It has no name in the blob (nothing looks it up; inspect shows the step using it).
    part: which of a node's requantizations (a Concat has one per input)."""
    key = f"{node.name}{part}.requant"
    data = np.asarray(head, "<i4").tobytes()
    if key in ctx.persistent:     # the same node in the train and the eval graph
        tid = ctx.persistent[key]
        if ctx.tensors[tid].data != data or ctx.tensors[tid].size != size:
            raise UnsupportedOpError(f"{ctx.where(node)}: node name used twice")
        ctx.local[key] = tid
        return tid
    tid = ctx.add(Tensor("", INT32, CONSTANT, (size,), data=data, derived=True))
    ctx.persistent[key] = ctx.local[key] = tid
    return tid


def _header(node):
    return [attr(node, "x_zero_point", 0), attr(node, "y_zero_point", 0), attr(node, "lo", 0),
            attr(node, "hi", 255)]


def _weights(ctx, node, axis):
    tid = ctx.local.get(node.input[1])
    b = optional_input(node, 2)
    if tid is not None and ctx.tensors[tid].role == PARAM and ctx.tensors[tid].dtype == INT8:
        # an int8 weight trained in integers (quant/inttrain.py): a parameter with its
        # scales, its int32 bias a parameter too, or a constant (a named parameter set)
        w = ctx.tensors[tid]
        bias = NO_TENSOR
        if b and b not in ctx.local and ctx.value(b) is not None:
            bias = _constant(ctx, b, INT32, ctx.value(b).astype(np.int32))
        elif b:
            bias = ctx.t(b)
        return np.zeros(w.shape, np.int8), tid, bias, len(w.scale)
    w = ctx.value(node.input[1])
    if w is None or w.dtype != np.int8:
        raise UnsupportedOpError(f"{ctx.where(node)}: the weight must be an int8 constant")
    w_scales = [float(v) for v in attr(node, "w_scales")]
    wid = _constant(ctx, node.input[1], INT8, w, scale=tuple(w_scales),
                    zero_point=(0,) * len(w_scales), axis=axis)
    bias = NO_TENSOR
    trained = ctx.local.get(b) if b else None
    if trained is not None and ctx.tensors[trained].role == PARAM:
        # an int32 bias trained in integers beside a frozen weight (the sparse update)
        return w, wid, trained, len(w_scales)
    if b:
        value = ctx.value(b)
        if value is None or value.dtype != np.int32:
            raise UnsupportedOpError(f"{ctx.where(node)}: the bias must be an int32 constant")
        bias = _constant(ctx, b, INT32, value)
    return w, wid, bias, len(w_scales)


SCRATCH = "qlinear.accumulators"


def _scratch(ctx, size):
    """The program's int32 accumulator plane (one for all its int8 convolutions, as large
    as the largest output plane)."""
    tid = ctx.local.get(SCRATCH)
    if tid is None:
        twin = ctx.twins.get(SCRATCH) if ctx.program_name == "eval" else None
        tid = twin if twin is not None else ctx.add(
            Tensor(SCRATCH, INT32, ACTIVATION, (size,), program=ctx.program_name))
        ctx.local[SCRATCH] = tid
        if ctx.tensors[tid].size < size:
            ctx.tensors[tid].shape = (size,)
    elif ctx.tensors[tid].size < size:
        ctx.tensors[tid].shape = (size,)
    return tid


@lowering("QLinearGemm")
def lower_qlinear_gemm(ctx, node):
    x = node.input[0]
    m, k = ctx.shape(x)
    transposed = attr(node, "transB", 0)
    w, wid, bias, channels = _weights(ctx, node, 0 if transposed else 1)
    if transposed:
        n, sw_k, sw_n = w.shape[0], 1, w.shape[1]
    else:
        n, sw_k, sw_n = w.shape[1], w.shape[1], 1
    if channels != n:
        raise UnsupportedOpError(f"{ctx.where(node)}: {channels} weight scales for {n} "
                                 f"output channels")
    y = _output(ctx, node)
    ctx.step(op.QLINEAR_GEMM, [y, ctx.t(x), wid, bias,
                               _derived_requant(ctx, node, _header(node), 4 + 2 * n)],
             [m, k, n, k, 1, sw_k, sw_n, _signed(ctx, x), int(ctx.tensors[y].dtype == INT8)])


@lowering("QLinearConv")
def lower_qlinear_conv(ctx, node):
    x = node.input[0]
    w, wid, bias, channels = _weights(ctx, node, 0)
    if channels != w.shape[0]:
        raise UnsupportedOpError(f"{ctx.where(node)}: {channels} weight scales for "
                                 f"{w.shape[0]} output channels")
    attrs = conv_attributes(node, ctx.shape(x), w.shape, ctx.where(node))
    y = _output(ctx, node)
    out_plane = int(np.prod(ctx.shape(node.output[0])[2:], dtype=np.int64))
    scratch = _scratch(ctx, out_plane)
    ctx.step(op.QLINEAR_CONV, [y, ctx.t(x), wid, bias,
                               _derived_requant(ctx, node, _header(node), 4 + 2 * channels),
                               scratch],
             device_geometry(attrs, ctx.shape(x), w.shape)
             + [_signed(ctx, x), int(ctx.tensors[y].dtype == INT8)])


@lowering("QLinearGlobalAveragePool")
def lower_qlinear_global_average_pool(ctx, node):
    x = node.input[0]
    shape = ctx.shape(x)
    planes, count = shape[0] * shape[1], int(np.prod(shape[2:], dtype=np.int64))
    y = _output(ctx, node)
    ctx.step(op.QLINEAR_GLOBAL_AVERAGE_POOL,
             [y, ctx.t(x), _derived_requant(ctx, node, _header(node), 6)],
             [planes, count, _signed(ctx, x), int(ctx.tensors[y].dtype == INT8)])


@lowering("QLinearMaxPool")
def lower_qlinear_max_pool(ctx, node):
    x = node.input[0]
    ints = pool_kernel_ints(node, ctx.shape(x), ctx.shape(node.output[0]), ctx.where(node))
    if ints[11:] != [1, 1]:
        raise UnsupportedOpError(f"{ctx.where(node)}: int8 MaxPool with dilations")
    geometry = ints[:11]
    source = ctx.tensors[ctx.t(x)]
    y = _byte_tensor(ctx, node.output[0], source.dtype, ctx.shape(node.output[0]),
                     source.scale, source.zero_point)
    ctx.step(op.QLINEAR_MAX_POOL, [y, ctx.t(x)], geometry + [_signed(ctx, x)])


def _qparams(ctx, node):
    """[scale, zero point, scratch] floats of a Quantize / Dequantize step: derived at load
    from the byte tensor's quantization parameters (kernels/qlinear.py)."""
    key = f"{node.name}.qparams"
    if key in ctx.persistent:
        ctx.local[key] = ctx.persistent[key]
        return ctx.persistent[key]
    tid = ctx.add(Tensor("", FLOAT, CONSTANT, (3,), derived=True))
    ctx.persistent[key] = ctx.local[key] = tid
    return tid


@lowering("Quantize")
def lower_quantize_int8(ctx, node):
    x = node.input[0]
    elem = attr(node, "y_type", TensorProto.UINT8)
    y = _byte_tensor(ctx, node.output[0], DEVICE_TYPES[elem], ctx.shape(x),
                     [attr(node, "scale")], [attr(node, "zero_point", 0)])
    qmin, qmax = (0, 255) if elem == TensorProto.UINT8 else (-128, 127)
    ctx.step(op.QUANTIZE_LINEAR, [y, ctx.t(x), _qparams(ctx, node)],
             [ctx.tensors[y].size, qmin, qmax])


@lowering("Dequantize")
def lower_dequantize_int8(ctx, node):
    x = node.input[0]
    y = ctx.define(node.output[0])
    ctx.step(op.DEQUANTIZE_LINEAR, [y, ctx.t(x), _qparams(ctx, node)],
             [ctx.tensors[y].size, _signed(ctx, x)])


@lowering("QLinearAveragePool")
def lower_qlinear_average_pool(ctx, node):
    x = node.input[0]
    ints = pool_kernel_ints(node, ctx.shape(x), ctx.shape(node.output[0]), ctx.where(node))
    k_h, k_w = ints[5], ints[6]
    y = _output(ctx, node)
    ctx.step(op.QLINEAR_AVERAGE_POOL,
             [y, ctx.t(x), _derived_requant(ctx, node, _header(node), 4 + 2 * k_h * k_w)],
             ints + [_signed(ctx, x), int(ctx.tensors[y].dtype == INT8)])


@lowering("QLinearAdd")
def lower_qlinear_add(ctx, node):
    a, b = node.input[:2]
    if ctx.shape(a) != ctx.shape(b) or ctx.shape(a) != ctx.shape(node.output[0]):
        raise UnsupportedOpError(f"{ctx.where(node)}: int8 Add of shapes {list(ctx.shape(a))} "
                                 f"and {list(ctx.shape(b))} (only equal shapes)")
    y = _output(ctx, node)
    head = [attr(node, "a_zero_point", 0), attr(node, "b_zero_point", 0),
            attr(node, "y_zero_point", 0), attr(node, "lo", 0), attr(node, "hi", 255)]
    ctx.step(op.QLINEAR_ADD, [y, ctx.t(a), ctx.t(b), _derived_requant(ctx, node, head, 8)],
             [ctx.tensors[y].size, _signed(ctx, a), _signed(ctx, b),
              int(ctx.tensors[y].dtype == INT8)])


@lowering("QLinearLookup")
def lower_qlinear_lookup(ctx, node):
    x = node.input[0]
    table = np.asarray(attr(node, "table"), np.int64)
    elem = attr(node, "y_type", TensorProto.UINT8)
    y = _output(ctx, node)
    tid = _constant(ctx, f"{node.name}.table", DEVICE_TYPES[elem],
                    table.astype(np.uint8 if elem == TensorProto.UINT8 else np.int8))
    ctx.step(op.QLINEAR_LOOKUP, [y, ctx.t(x), tid], [ctx.tensors[y].size])


def concat_geometry(x_shape, y_shape, axis, start, where):
    """(blocks, size, stride, offset) of input X of a Concat into Y along axis, X's part
    beginning at index `start` of that axis: Y is `blocks` slices of `stride` elements
    (everything from the axis on), X's part of each `size` elements at `offset`."""
    rank = len(y_shape)
    if len(x_shape) != rank or not 0 <= axis < rank or any(
            a != b for i, (a, b) in enumerate(zip(x_shape, y_shape)) if i != axis) or \
            start + x_shape[axis] > y_shape[axis]:
        raise UnsupportedOpError(f"{where}: input of shape {list(x_shape)} does not fit "
                                 f"output {list(y_shape)} at {start} along axis {axis}")
    inner = int(np.prod(y_shape[axis + 1:], dtype=np.int64))
    blocks = int(np.prod(y_shape[:axis], dtype=np.int64))
    return blocks, x_shape[axis] * inner, y_shape[axis] * inner, start * inner


def concat_axis(node, rank, where):
    axis = attr(node, "axis", 0)
    if not -rank <= axis < rank:
        raise UnsupportedOpError(f"{where}: axis {axis} of a rank-{rank} output")
    return axis % rank


@lowering("QLinearConcat")
def lower_qlinear_concat(ctx, node):
    y = _output(ctx, node)
    shape = ctx.shape(node.output[0])
    axis = concat_axis(node, len(shape), ctx.where(node))
    y_zp, lo, hi = attr(node, "y_zero_point", 0), attr(node, "lo", 0), attr(node, "hi", 255)
    zero_points = list(attr(node, "x_zero_points", []))
    if len(zero_points) != len(node.input):
        raise UnsupportedOpError(f"{ctx.where(node)}: {len(zero_points)} x_zero_points for "
                                 f"{len(node.input)} inputs")
    start = 0
    for k, (x, x_zp) in enumerate(zip(node.input, zero_points)):
        x_shape = ctx.shape(x)
        geometry = concat_geometry(x_shape, shape, axis, start, ctx.where(node))
        req = _derived_requant(ctx, node, [x_zp, y_zp, lo, hi], 6, f":{k}")
        ctx.step(op.QLINEAR_CONCAT, [y, ctx.t(x), req],
                 list(geometry) + [_signed(ctx, x), int(ctx.tensors[y].dtype == INT8)])
        start += x_shape[axis]
    if start != shape[axis]:
        raise UnsupportedOpError(f"{ctx.where(node)}: inputs of {start} along axis {axis} "
                                 f"for an output of {shape[axis]}")


def concat_values(inputs, y_scale, y_zero_point, y_type, axis):
    """numpy mirror of kernels/qlinear.py qlinear_concat: the int values of Y for inputs
    [(int values, scale, zero point), ...], each requantized by float32(x_scale / y_scale)
    as the kernel does (rounded half to even, saturated to Y's type)."""
    f = np.float32
    lo, hi = (-128, 127) if y_type == TensorProto.INT8 else (0, 255)
    parts = []
    for q, scale, zero_point in inputs:
        m0, shift = requant_multiplier(float(f(f(scale) / f(y_scale))))
        acc = np.asarray(q, np.int64) - int(zero_point)
        parts.append(np.clip(requant_values(acc, m0, shift) + int(y_zero_point), lo, hi))
    return np.concatenate(parts, axis)
