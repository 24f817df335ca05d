"""Convolution geometry, shared by the gradient rule, the lowering and the numpy references.

An ONNX Conv node (or our ConvGradInput / ConvGradWeight) on a 1-D (N, C, L) or 2-D
(N, C, H, W) input is resolved once into explicit attributes: kernel_shape, strides, pads
(begins then ends), dilations and group. auto_pad is turned into pads here, so gradient nodes
and kernels never see it.

Rules (onnxruntime and torch agree on all of them):
  * output o along a dimension reads the input at o * stride - pad_begin + k * dilation for
    every kernel tap k; positions outside the input are zero padding;
  * output size = floor((in + pad_begin + pad_end - ((kernel - 1) * dilation + 1)) / stride) + 1;
  * auto_pad as in windows.py (SAME with a stride larger than the kernel pads nothing);
  * W is (M, C / group, *kernel); output channel m reads the input channels of group
    m // (M / group)."""
from ..errors import UnsupportedOpError
from ..graph import attr
from .windows import window_attributes

def conv_attributes(node, x_shape, w_shape, where):
    """Explicit attributes of a convolution of an input of x_shape with a weight of w_shape.
    Raises UnsupportedOpError, naming the node and the attribute, for what the kernels
    cannot do."""
    if len(x_shape) not in (3, 4):
        raise UnsupportedOpError(f"{where}: only 1-D (N, C, L) and 2-D (N, C, H, W) convolution "
                                 f"is supported, got input shape {list(x_shape)}")
    spatial = list(x_shape[2:])
    rank = len(spatial)
    if len(w_shape) != rank + 2:
        raise UnsupportedOpError(f"{where}: the weight has shape {list(w_shape)}; for input "
                                 f"{list(x_shape)} it must be (M, C / group, *kernel_shape)")
    kernel = list(w_shape[2:])
    if list(attr(node, "kernel_shape", kernel)) != kernel:
        raise UnsupportedOpError(f"{where}: attribute kernel_shape="
                                 f"{list(attr(node, 'kernel_shape', kernel))} does not match the "
                                 f"weight's spatial shape {kernel}")
    strides, dilations, pads = window_attributes(node, kernel, spatial, where, "clamp")
    group = attr(node, "group", 1)
    channels, out_channels = x_shape[1], w_shape[0]
    if group < 1 or channels % group or out_channels % group or w_shape[1] * group != channels:
        raise UnsupportedOpError(f"{where}: attribute group={group} does not fit input channels "
                                 f"{channels} and weight shape {list(w_shape)} (group must "
                                 f"divide both channel counts, weight dim 1 = C / group)")
    attrs = {"kernel_shape": kernel, "strides": strides, "pads": pads, "dilations": dilations,
             "group": group}
    if min(output_spatial(spatial, attrs)) < 1:
        raise UnsupportedOpError(f"{where}: kernel_shape={kernel} with dilations={dilations} "
                                 f"and pads={pads} is larger than the input {list(x_shape)}")
    return attrs


def output_spatial(spatial, attrs):
    """Output size along each spatial dimension of an input of that spatial shape."""
    rank = len(spatial)
    return [(spatial[i] + attrs["pads"][i] + attrs["pads"][i + rank]
             - (attrs["kernel_shape"][i] - 1) * attrs["dilations"][i] - 1)
            // attrs["strides"][i] + 1 for i in range(rank)]


def device_geometry(attrs, x_shape, w_shape):
    """The ints of the device's conv kernels (kernels/conv.py): the geometry of a 2-D
    convolution, a 1-D one being a 2-D one of height 1."""
    group = attrs["group"]
    spatial = list(x_shape[2:])
    out = output_spatial(spatial, attrs)
    rank = len(spatial)

    def two_d(values, fill):
        return [fill] * (2 - len(values)) + list(values)

    in_h, in_w = two_d(spatial, 1)
    out_h, out_w = two_d(out, 1)
    k_h, k_w = two_d(attrs["kernel_shape"], 1)
    s_h, s_w = two_d(attrs["strides"], 1)
    d_h, d_w = two_d(attrs["dilations"], 1)
    pad_t, pad_l = two_d(attrs["pads"][:rank], 0)
    return [x_shape[0], group, x_shape[1] // group, w_shape[0] // group, in_h, in_w, out_h,
            out_w, k_h, k_w, s_h, s_w, d_h, d_w, pad_t, pad_l]
