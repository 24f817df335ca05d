"""int8 inference ops: the lowerings of the ai.microtrain ops pipeline/int8.py turns a QDQ
model into (what onnxruntime's QDQ fusion turns it into: QGemm, QLinearConv, ...), and the
integer requantization parameters. Device kernels: kernels/qlinear.py.

  Quantize(X) -> T              float -> int8/uint8 (scale, zero_point, dtype attributes)
  Dequantize(T) -> X            int8/uint8 -> float
  QLinearGemm(T, W[, B]) -> Y   Gemm of int8 operands, int32 bias, requantized output
  QLinearConv(T, W[, B]) -> Y   Conv likewise (ONNX Conv attributes)
  QLinearGlobalAveragePool(T) -> Y
  QLinearMaxPool(T) -> Y        the scale and zero point stay

Every quantized op carries x_scale, x_zero_point, y_scale, y_zero_point, the output type
(y_type, ONNX's enum), the clamp bounds lo / hi in the output's quantized domain (a fused
Relu or Clip, or the type's range); QLinearGemm / QLinearConv also w_scales (per output
channel). The lowering turns the scales into integer multipliers (requant_multiplier)."""
import math

import numpy as np
from onnx import TensorProto

from .. import opcodes as op
from ..errors import UnsupportedOpError
from ..graph import attr
from ..pipeline.lower import ACTIVATION, CONSTANT, FLOAT, INT32, INT8, NO_TENSOR, UINT8, Tensor
from ..registry import lowering
from .conv import conv_attributes, device_geometry
from .pool import pool_kernel_ints

MULTIPLIER_BITS = 24   # m0 in [2**23, 2**24]: float32's precision, as onnxruntime's multiplier
DEVICE_TYPES = {TensorProto.UINT8: UINT8, TensorProto.INT8: INT8}


def requant_multiplier(real):
    """(m0, shift) with real ~= m0 / 2**shift, m0 < 2**24 + 1, 1 <= shift <= 62."""
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
    """numpy mirror of kernels/qlinear.py _requant: round half to even of acc * m0 / 2**shift."""
    p = np.asarray(acc, np.int64).astype(object) * int(m0)
    q = np.vectorize(lambda v: _round_shift(v, shift), otypes=[np.int64])(p)
    return q


def _round_shift(p, shift):
    q = p >> shift
    r = p - (q << shift)
    half = 1 << (shift - 1)
    return q + 1 if r > half or (r == half and q & 1) else q


def _byte_tensor(ctx, name, dtype, shape):
    tid = ctx.add(Tensor(name, dtype, ACTIVATION, tuple(shape), program=ctx.program_name))
    ctx.local[name] = tid
    return tid


def _constant(ctx, name, dtype, value):
    """A constant tensor of the given device dtype (placed once per blob)."""
    if name in ctx.persistent:
        ctx.local[name] = ctx.persistent[name]
        return ctx.persistent[name]
    numpy_type = {FLOAT: "<f4", INT32: "<i4", INT8: "i1", UINT8: "u1"}[dtype]
    value = np.asarray(value)
    tid = ctx.add(Tensor(name, dtype, CONSTANT, tuple(value.shape) or (1,),
                         data=np.ascontiguousarray(value, numpy_type).tobytes()))
    ctx.persistent[name] = ctx.local[name] = tid
    return tid


def _output(ctx, node):
    elem = attr(node, "y_type", TensorProto.UINT8)
    return _byte_tensor(ctx, node.output[0], DEVICE_TYPES[elem], ctx.shape(node.output[0]))


def _signed(ctx, name):
    return int(ctx.tensors[ctx.t(name)].dtype == INT8)


def _requant_tensor(ctx, node, channel_multipliers):
    header = [attr(node, "x_zero_point", 0), attr(node, "y_zero_point", 0), attr(node, "lo", 0),
              attr(node, "hi", 255)]
    pairs = [v for real in channel_multipliers for v in requant_multiplier(real)]
    return _constant(ctx, f"{node.name}.requant", INT32, np.array(header + pairs, np.int32))


def _weights(ctx, node):
    w = ctx.value(node.input[1])
    if w is None or w.dtype != np.int8:
        raise UnsupportedOpError(f"{ctx.where(node)}: the weight must be an int8 constant")
    wid = _constant(ctx, node.input[1], INT8, w)
    bias = NO_TENSOR
    if len(node.input) > 2 and node.input[2]:
        b = ctx.value(node.input[2])
        if b is None or b.dtype != np.int32:
            raise UnsupportedOpError(f"{ctx.where(node)}: the bias must be an int32 constant")
        bias = _constant(ctx, node.input[2], INT32, b)
    x_scale, y_scale = attr(node, "x_scale"), attr(node, "y_scale")
    reals = [float(np.float64(x_scale) * np.float64(s) / np.float64(y_scale))
             for s in attr(node, "w_scales")]
    return w, wid, bias, reals


@lowering("QLinearGemm")
def lower_qlinear_gemm(ctx, node):
    x = node.input[0]
    m, k = ctx.shape(x)
    w, wid, bias, reals = _weights(ctx, node)
    if attr(node, "transB", 0):
        n, sw_k, sw_n = w.shape[0], 1, w.shape[1]
    else:
        n, sw_k, sw_n = w.shape[1], w.shape[1], 1
    if len(reals) != n:
        raise UnsupportedOpError(f"{ctx.where(node)}: {len(reals)} weight scales for {n} "
                                 f"output channels")
    y = _output(ctx, node)
    ctx.step(op.QLINEAR_GEMM, [y, ctx.t(x), wid, bias, _requant_tensor(ctx, node, reals)],
             [m, k, n, k, 1, sw_k, sw_n, _signed(ctx, x), int(ctx.tensors[y].dtype == INT8)])


@lowering("QLinearConv")
def lower_qlinear_conv(ctx, node):
    x = node.input[0]
    w, wid, bias, reals = _weights(ctx, node)
    attrs = conv_attributes(node, ctx.shape(x), w.shape, ctx.where(node))
    y = _output(ctx, node)
    out_plane = int(np.prod(ctx.shape(node.output[0])[2:], dtype=np.int64))
    scratch = ctx.add(Tensor(f"{node.name}.accumulators", INT32, ACTIVATION, (out_plane,),
                             program=ctx.program_name))
    ctx.step(op.QLINEAR_CONV, [y, ctx.t(x), wid, bias, _requant_tensor(ctx, node, reals),
                               scratch],
             device_geometry(attrs, ctx.shape(x), w.shape)
             + [_signed(ctx, x), int(ctx.tensors[y].dtype == INT8)])


@lowering("QLinearGlobalAveragePool")
def lower_qlinear_global_average_pool(ctx, node):
    x = node.input[0]
    shape = ctx.shape(x)
    planes, count = shape[0] * shape[1], int(np.prod(shape[2:], dtype=np.int64))
    real = float(np.float64(attr(node, "x_scale")) / (np.float64(attr(node, "y_scale")) * count))
    y = _output(ctx, node)
    ctx.step(op.QLINEAR_GLOBAL_AVERAGE_POOL,
             [y, ctx.t(x), _requant_tensor(ctx, node, [real])],
             [planes, count, _signed(ctx, x), int(ctx.tensors[y].dtype == INT8)])


@lowering("QLinearMaxPool")
def lower_qlinear_max_pool(ctx, node):
    x = node.input[0]
    ints = pool_kernel_ints(node, ctx.shape(x), ctx.shape(node.output[0]), ctx.where(node))
    if ints[11:] != [1, 1]:
        raise UnsupportedOpError(f"{ctx.where(node)}: int8 MaxPool with dilations")
    geometry = ints[:11]
    y = _byte_tensor(ctx, node.output[0], ctx.tensors[ctx.t(x)].dtype,
                     ctx.shape(node.output[0]))
    ctx.step(op.QLINEAR_MAX_POOL, [y, ctx.t(x)], geometry + [_signed(ctx, x)])


def _qparams(ctx, node):
    scale, zp = attr(node, "scale"), attr(node, "zero_point", 0)
    return _constant(ctx, f"{node.name}.qparams", FLOAT, np.array([scale, zp, 0.0], np.float32))


@lowering("Quantize")
def lower_quantize_int8(ctx, node):
    x = node.input[0]
    elem = attr(node, "y_type", TensorProto.UINT8)
    y = _byte_tensor(ctx, node.output[0], DEVICE_TYPES[elem], ctx.shape(x))
    qmin, qmax = (0, 255) if elem == TensorProto.UINT8 else (-128, 127)
    ctx.step(op.QUANTIZE_LINEAR, [y, ctx.t(x), _qparams(ctx, node)],
             [ctx.tensors[y].size, qmin, qmax])


@lowering("Dequantize")
def lower_dequantize_int8(ctx, node):
    x = node.input[0]
    y = ctx.define(node.output[0])
    ctx.step(op.DEQUANTIZE_LINEAR, [y, ctx.t(x), _qparams(ctx, node)],
             [ctx.tensors[y].size, _signed(ctx, x)])
