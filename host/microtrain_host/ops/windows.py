"""Sliding-window attributes shared by convolution, transposed convolution and pooling:
the input's rank, strides, dilations and pads read and checked once, auto_pad resolved into
explicit pads (ConvTranspose resolves its own auto_pad, whose SAME means the opposite size
rule: conv.py).

SAME_UPPER / SAME_LOWER: output size ceil(in / stride), total padding
(out - 1) * stride + kernel - in, its odd element at the end (UPPER) or the beginning (LOWER);
VALID: no padding. With dilations onnxruntime does not follow the spec's padding rule, so
SAME with dilations is refused."""
from ..errors import UnsupportedOpError
from ..graph import attr

AUTO_PADS = ("NOTSET", "VALID", "SAME_UPPER", "SAME_LOWER")


def check_rank(shape, where, what, depth=False):
    """Refuses an input of a rank the kernels lack: they slide over 1-D (N, C, L) and 2-D
    (N, C, H, W) inputs, and 3-D (N, C, D, H, W) ones where depth is set. what names the
    op in the message: "convolution", "pooling", ..."""
    if len(shape) not in ((3, 4, 5) if depth else (3, 4)):
        raise UnsupportedOpError(
            f"{where}: only 1-D (N, C, L)" + (", 2-D (N, C, H, W) and 3-D (N, C, D, H, W)"
                                              if depth else " and 2-D (N, C, H, W)")
            + f" {what} is supported, got input shape {list(shape)}")


def window_values(node, rank, where):
    """(strides, dilations, pads) as the node gives them (defaults 1, 1, 0), validated."""
    strides = list(attr(node, "strides", [1] * rank))
    dilations = list(attr(node, "dilations", [1] * rank))
    pads = list(attr(node, "pads", [0] * (2 * rank)))
    for name, values, count, least in (("strides", strides, rank, 1),
                                       ("dilations", dilations, rank, 1),
                                       ("pads", pads, 2 * rank, 0)):
        if len(values) != count or min(values) < least:
            raise UnsupportedOpError(f"{where}: attribute {name}={values} is not valid for "
                                     f"{rank} spatial dimensions (need {count} values >= {least})")
    return strides, dilations, pads


def window_attributes(node, kernel, spatial, where, negative_same):
    """(strides, dilations, pads) of a node sliding `kernel` over `spatial`, validated.

    negative_same: what SAME does when a stride larger than the kernel asks for negative
    padding: "clamp" to no padding (onnxruntime's Conv) or "refuse" (its pools error)."""
    rank = len(spatial)
    strides, dilations, pads = window_values(node, rank, where)
    auto_pad = attr(node, "auto_pad", "NOTSET")
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        if dilations != [1] * rank:
            raise UnsupportedOpError(f"{where}: attribute auto_pad={auto_pad} with dilations="
                                     f"{dilations} is not supported (onnxruntime pads these "
                                     f"differently from the ONNX spec); give explicit pads")
        begins, ends = [], []
        for size, k, stride in zip(spatial, kernel, strides):
            total = (-(-size // stride) - 1) * stride + k - size
            if total < 0 and negative_same == "refuse":
                raise UnsupportedOpError(f"{where}: attribute auto_pad with strides larger than "
                                         f"the kernel asks for negative pads ({total}), which "
                                         f"onnxruntime does not run the same for every pool; "
                                         f"give explicit pads")
            total = max(0, total)
            small = total // 2
            begins.append(small if auto_pad == "SAME_UPPER" else total - small)
            ends.append(total - begins[-1])
        pads = begins + ends
    elif auto_pad == "VALID":
        pads = [0] * (2 * rank)
    elif auto_pad != "NOTSET":
        raise UnsupportedOpError(f"{where}: attribute auto_pad={auto_pad!r} is not valid; "
                                 f"use one of {', '.join(AUTO_PADS)}")
    return strides, dilations, pads
