"""The integer backward of lookup-table activations (issue 22; device kernel:
kernels/intlookup.py). quant/intbackward.py builds the node, quant/int8.py the forward's
QLinearLookup, which records the activation it tabulates (attribute `activation`, the op
type, with `clamp_min` / `clamp_max` of a Clip) and its input's quantization (`x_scale`,
`x_zero_point`, `x_type`), so that the slopes are computed here from the activation itself.

  IntLookupGrad(G, X) -> GX   GX = G times the activation's slope at X's dequantized value
                              (attribute `slopes`: 256 floats by X's raw byte, lookup_slopes)
  IntClampGrad(G, Y, M, W) -> G'
                              ops/intgrad.py's IntClampBiasGrad without the bias step, for a
                              layer the gradient passes whose bias does not train (a named
                              parameter set): G masked by M, then scaled by s_w[c] / max(s_w)

The slope of byte b is the float activation's derivative at x_b = s_x * (q_b - z_x), times
the output quantizer's straight-through gradient (1 where the unclipped quantized output
round(f(x_b) / s_y) + z_y lies inside the output type's range, else 0: QAT's fake
quantization). A Relu's derivative is 1 for x > 0, a Clip's for min < x < max (strictly, as
torch's relu and hardtanh); Sigmoid, Tanh, LeakyRelu (1 for x > 0, else alpha), HardSigmoid
(alpha inside 0 < alpha x + beta < 1) and HardSwish (torch's: x / 3 + 1/2 on [-3, 3]) as
torch computes them. The forward tables of the last five: smooth_activation, which
quant/int8.py's lookup_table uses."""
import numpy as np
from onnx import TensorProto

from .. import opcodes as op
from ..errors import UnsupportedOpError
from ..graph import attr
from ..ir import INT32
from ..registry import lowering
from .intflow import _gradient, gradient_of
from .intgrad import _grad_tensor
from .inttrain import _byte, _derived
from .qlinear import _constant

SLOPE_BITS = 13         # kernels/intlookup.py: |slope| <= 2**13, products within 2**29


def _clamp_slope(node, x):
    lo = attr(node, "clamp_min", None)
    hi = attr(node, "clamp_max", None)
    if attr(node, "activation") == "Relu":
        lo, hi = 0.0, None
    inside = np.ones(x.shape, bool)
    if lo is not None:
        inside &= x > np.float32(lo)
    if hi is not None:
        inside &= x < np.float32(hi)
    return inside.astype(np.float64)


def _hard_sigmoid_slope(node, x):
    # alpha where 0 < alpha * x + beta < 1 (strictly: torch's hardtanh of the line)
    alpha, beta = lookup_alpha_beta(node)
    z = np.float32(alpha) * x + np.float32(beta)
    return np.where((z > 0) & (z < 1), alpha, 0.0)


def _hard_swish_slope(node, x):
    # torch's hardswish backward: 0 below -3, x / 3 + 1/2 up to 3 (both ends included), 1
    x = x.astype(np.float64)
    return np.where(x < -3, 0.0, np.where(x <= 3, x / 3 + 0.5, 1.0))


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x.astype(np.float64)))


# activation -> its derivative at the dequantized input bytes x (float32), in float64
DERIVATIVES = {
    "Relu": _clamp_slope, "Clip": _clamp_slope,
    "Sigmoid": lambda node, x: _sigmoid(x) * (1.0 - _sigmoid(x)),
    "Tanh": lambda node, x: 1.0 - np.tanh(x.astype(np.float64)) ** 2,
    "LeakyRelu": lambda node, x: np.where(x > 0, 1.0, lookup_alpha_beta(node)[0]),
    "HardSigmoid": _hard_sigmoid_slope, "HardSwish": _hard_swish_slope}
# the activations a QLinearLookup tabulates besides Relu / Clip (quant/int8.py)
SMOOTH_LOOKUPS = ("Sigmoid", "Tanh", "LeakyRelu", "HardSigmoid", "HardSwish")
DEFAULTS = {"LeakyRelu": (0.01, 0.0), "HardSigmoid": (0.2, 0.5),
            "HardSwish": (1.0 / 6.0, 0.5)}


def lookup_alpha_beta(node):
    """(alpha, beta) of a LeakyRelu / HardSigmoid / HardSwish node (ONNX's defaults; the
    QLinearLookup carries them as attributes of the same names)."""
    kind = attr(node, "activation", node.op_type)
    alpha, beta = DEFAULTS.get(kind, (0.0, 0.0))
    if kind == "HardSwish":     # (no attributes in ONNX)
        return alpha, beta
    return float(attr(node, "alpha", alpha)), float(attr(node, "beta", beta))


def smooth_activation(kind, node, x):
    """The float32 value of activation `kind` (one of SMOOTH_LOOKUPS; `node` gives alpha /
    beta) at the float32 values x: the function correctly rounded to float32 (Sigmoid,
    Tanh), or the float32 arithmetic of its ONNX definition."""
    f = np.float32
    if kind == "Sigmoid":
        return _sigmoid(x).astype(f)
    if kind == "Tanh":
        return np.tanh(x.astype(np.float64)).astype(f)
    alpha, beta = lookup_alpha_beta(node)
    if kind == "LeakyRelu":
        return np.where(x >= 0, x, (f(alpha) * x).astype(f)).astype(f)
    line = np.clip((f(alpha) * x + f(beta)).astype(f), f(0), f(1)).astype(f)
    return line if kind == "HardSigmoid" else (x * line).astype(f)


def lookup_slopes(node):
    """The 256 slopes (by X's raw byte) of a QLinearLookup node (see the module docstring),
    or an UnsupportedOpError when the node does not say which activation it tabulates."""
    kind = attr(node, "activation", None)
    if kind is None or attr(node, "x_scale", None) is None:
        raise UnsupportedOpError(f"integer training: node '{node.name}' (QLinearLookup) does "
                                 f"not say which activation it tabulates (no integer "
                                 f"backward)")
    if kind not in DERIVATIVES:
        raise UnsupportedOpError(f"integer training: node '{node.name}' (QLinearLookup of "
                                 f"{kind}) has no integer backward")
    f = np.float32
    byte = np.arange(256)
    q = byte - 256 * (byte > 127) if attr(node, "x_type", TensorProto.UINT8) == \
        TensorProto.INT8 else byte
    x = ((q - attr(node, "x_zero_point", 0)).astype(f) * f(attr(node, "x_scale"))).astype(f)
    # the output quantizer's straight-through gradient, from the unclipped value the table
    # was rounded from (a Relu / Clip: x clamped; its saturation decides)
    y_type = attr(node, "y_type", TensorProto.UINT8)
    qmin, qmax = (0, 255) if y_type == TensorProto.UINT8 else (-128, 127)
    y = _float_activation(node, kind, x)
    u = np.rint((y / f(attr(node, "y_scale"))).astype(f)) + attr(node, "y_zero_point", 0)
    inside = ((u >= qmin) & (u <= qmax)).astype(np.float64)
    return DERIVATIVES[kind](node, x) * inside


def _float_activation(node, kind, x):
    if kind in ("Relu", "Clip"):
        lo = 0.0 if kind == "Relu" else attr(node, "clamp_min", None)
        hi = None if kind == "Relu" else attr(node, "clamp_max", None)
        y = x if lo is None else np.maximum(x, np.float32(lo))
        return y if hi is None else np.minimum(y, np.float32(hi))
    return smooth_activation(kind, node, x)


def fixed_point_slopes(slopes):
    """(int32 slopes, slope_unit): slopes = ints * slope_unit, |ints| <= 2**SLOPE_BITS (the
    largest slope at 2**SLOPE_BITS; all zero: unit 1)."""
    slopes = np.asarray(slopes, np.float64)
    top = float(np.abs(slopes).max())
    if top == 0.0:
        return np.zeros(256, np.int32), 1.0
    unit = float(np.float32(top / (1 << SLOPE_BITS)))
    ints = np.clip(np.rint(slopes / unit), -(1 << SLOPE_BITS), 1 << SLOPE_BITS)
    return ints.astype(np.int32), unit


def lookup_grad_reference(g, x_bytes, slopes):
    """numpy mirror of the real gradient: g (real) times the slope of each input byte."""
    return np.asarray(g, np.float64) * np.asarray(slopes)[np.asarray(x_bytes) & 255]


@lowering("IntLookupGrad")
def lower_int_lookup_grad(ctx, node):
    g, count = _gradient(ctx, node.input[0], node)
    xid, x = gradient_of(ctx, node, count, node.input[1], "input")
    slopes = attr(node, "slopes", None)
    if slopes is None or len(slopes) != 256:
        raise UnsupportedOpError(f"{ctx.where(node)}: needs its 256 slopes")
    ints, unit = fixed_point_slopes(slopes)
    table = _constant(ctx, f"{node.name}.slopes", INT32, ints)
    gx = _grad_tensor(ctx, node.output[0], count)
    ctx.step(op.INT_LOOKUP_GRAD, [gx, g, xid, table], [count], [unit])


@lowering("IntClampGrad")
def lower_int_clamp_grad(ctx, node):
    g_name, y_name, mask_name, w_name = node.input
    g = ctx.t(g_name)
    y = ctx.tensors[ctx.t(y_name)]
    mask, _ = _byte(ctx, mask_name, node)
    wid, w = _byte(ctx, w_name, node)
    m, channels = y.shape[:2]
    plane = int(np.prod(y.shape[2:], dtype=np.int64))
    if ctx.tensors[g].size != 1 + y.size or w.shape[0] != channels or \
            ctx.tensors[mask].size * 8 < y.size:
        raise UnsupportedOpError(f"{ctx.where(node)}: G must be the gradient of Y "
                                 f"{list(y.shape)}, M its mask, W {channels} channels")
    folds = _derived(ctx, f"{node.name}.folds", 2 * channels)
    ctx.step(op.INT_CLAMP_GRAD, [g, mask, folds, wid], [m, channels, plane])
    ctx.alias_in_place(node.output[0], g_name)
