"""Integer backward through frozen int8 convolutions (issue 11's sparse update in integers;
device kernels: kernels/intgrad.py, which documents the fixed point). quant/inttrain.py
builds the graphs that use them.

  IntPoolGrad(D, Y) -> G               GlobalAveragePool's backward: D [m, C] (the
                                       classifier input's gradient, IntGemmGradInput)
                                       broadcast over the P positions of the pooled Y; G is
                                       a gradient tensor [1 + m * C * P] (exponent, then
                                       mantissas)
  IntClampMask(Y, X) -> M              (in the forward, right after the conv) 1 bit per
                                       element of the conv's quantized output Y: inside its
                                       clamp (the QLinearConv node named by attribute
                                       `conv`: its bounds), so Y's plane can be reused; M
                                       carries the scale of the conv's input X
  IntClampBiasGrad(G, Y, M, B, W) -> (G', B')
                                       in place: G masked by M, the int32 bias B's SGD
                                       step, then G scaled by s_w[c] / max(s_w); Y gives the
                                       shape (no step reads it), M and W the scales (bias
                                       quanta s_x * s_w[c])
  IntConvGradInput(G, W, X) -> GX      the input gradient of the conv (its attributes copied
                                       on the node; X for the input's shape)
  IntConvUpdate(W, X, G) -> W'         the int8 weights' SGD step (QAS), in place

Each update has attribute `stochastic` (the generator state "<param>.dither")."""
import numpy as np

from .. import opcodes as op
from ..errors import UnsupportedOpError
from ..graph import attr
from ..ir import ACTIVATION, INT32, INT8, PARAM, UINT8, Tensor
from ..registry import lowering
from .conv import conv_attributes, device_geometry
from .inttrain import _byte, _derived, _dither


def _grad_tensor(ctx, name, count):
    # [exponent, then count mantissas] (kernels/intgrad.py)
    tid = ctx.add(Tensor(name, INT32, ACTIVATION, (1 + count,), program=ctx.program_name))
    ctx.local[name] = tid
    return tid


def _geometry(ctx, node, wid, xid):
    w = ctx.tensors[wid]
    x_shape = ctx.tensors[xid].shape
    if len(x_shape) == 2 and len(w.shape) == 2:
        # a hidden Gemm (weight [n, k], quant/intbackward.py): a 1x1 convolution of a 1x1 plane
        if x_shape[1] != w.shape[1]:
            raise UnsupportedOpError(f"{ctx.where(node)}: input {list(x_shape)} and weight "
                                     f"{list(w.shape)} do not match")
        return [x_shape[0], 1, x_shape[1], w.shape[0]] + [1] * 10 + [0, 0]
    attrs = conv_attributes(node, x_shape, w.shape, ctx.where(node))
    return device_geometry(attrs, x_shape, w.shape)


@lowering("IntPoolGrad")
def lower_int_pool_grad(ctx, node):
    d = ctx.t(node.input[0])
    m, channels = ctx.tensors[d].shape
    y = ctx.tensors[ctx.t(node.input[1])]
    if tuple(y.shape[:2]) != (m, channels):
        raise UnsupportedOpError(f"{ctx.where(node)}: gradient {[m, channels]} and pooled "
                                 f"tensor {list(y.shape)} do not match")
    plane = int(np.prod(y.shape[2:], dtype=np.int64))
    g = _grad_tensor(ctx, node.output[0], m * channels * plane)
    ctx.step(op.INT_POOL_GRAD, [g, d], [m, channels, plane])


@lowering("IntClampMask")
def lower_int_clamp_mask(ctx, node):
    # IntClampMask(Y, X) -> M: the mask carries the scale of the conv's input X (the bias
    # quanta s_x * s_w[c] of IntClampBiasGrad's rates), so that no backward step has to keep
    # X alive for its scale
    yid, y = _byte(ctx, node.input[0], node)
    _, x = _byte(ctx, node.input[1], node)
    name = node.output[0]
    tid = ctx.add(Tensor(name, UINT8, ACTIVATION, ((y.size + 7) // 8,),
                         program=ctx.program_name, scale=tuple(x.scale),
                         zero_point=(0,) * len(x.scale)))
    ctx.local[name] = tid
    req = ctx.local[f"{attr(node, 'conv')}.requant"]
    ctx.step(op.INT_CLAMP_MASK, [tid, yid, req], [y.size, int(y.dtype == INT8)])


@lowering("IntClampBiasGrad")
def lower_int_clamp_bias_grad(ctx, node):
    g_name, y_name, mask_name, b_name, w_name = node.input
    g = ctx.t(g_name)
    y = ctx.tensors[ctx.t(y_name)]
    mask, _ = _byte(ctx, mask_name, node)
    wid, w = _byte(ctx, w_name, node)
    bid = ctx.t(b_name)
    bias = ctx.tensors[bid]
    m, channels = y.shape[:2]
    plane = int(np.prod(y.shape[2:], dtype=np.int64))
    if bias.role != PARAM or bias.dtype != INT32 or bias.size != channels or \
            ctx.tensors[g].size != 1 + y.size or w.shape[0] != channels or \
            ctx.tensors[mask].size * 8 < y.size:
        raise UnsupportedOpError(f"{ctx.where(node)}: B must be an int32 parameter of "
                                 f"{channels} values, G the gradient of Y {list(y.shape)}, M "
                                 f"its mask")
    rates = _derived(ctx, f"{b_name}.bias_rates", 4 * channels)
    ctx.step(op.INT_CLAMP_BIAS_GRAD, [g, mask, bid, rates, _dither(ctx, node, b_name), wid],
             [m, channels, plane])
    ctx.alias_in_place(node.output[0], g_name)
    ctx.alias_in_place(node.output[1], b_name)


@lowering("IntConvGradInput")
def lower_int_conv_grad_input(ctx, node):
    g = ctx.t(node.input[0])
    wid, _ = _byte(ctx, node.input[1], node)
    xid, x = _byte(ctx, node.input[2], node)
    geometry = _geometry(ctx, node, wid, xid)
    gx = _grad_tensor(ctx, node.output[0], x.size)
    ctx.step(op.INT_CONV_GRAD_INPUT, [gx, g, wid], geometry)


@lowering("IntConvUpdate")
def lower_int_conv_update(ctx, node):
    w_name, x_name, g_name = node.input
    wid, w = _byte(ctx, w_name, node)
    xid, x = _byte(ctx, x_name, node)
    if w.role != PARAM or w.dtype != INT8 or len(w.scale) != w.shape[0]:
        raise UnsupportedOpError(f"{ctx.where(node)}: W must be an int8 parameter with one "
                                 f"scale per output channel")
    geometry = _geometry(ctx, node, wid, xid)
    rates = _derived(ctx, f"{w_name}.conv_rates", 1 + 2 * w.shape[0])
    ctx.step(op.INT_CONV_UPDATE, [wid, xid, ctx.t(g_name), rates,
                                  _dither(ctx, node, w_name)],
             geometry + [int(x.dtype == INT8)])
    ctx.alias_in_place(node.output[0], w_name)
