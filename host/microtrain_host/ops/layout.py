"""Index arithmetic of the layout ops (Slice, Pad) and of N-D MatMul on static shapes,
shared by their gradient rules (autodiff.py) and their lowerings (lower.py)."""
import numpy as np

from ..errors import UnsupportedOpError


def _ints(value, what, where):
    if value is None:
        raise UnsupportedOpError(f"{where}: {what} must be a constant (computed on the host)")
    return [int(v) for v in np.asarray(value).reshape(-1)]


def _axes(axes, rank, what, where):
    out = []
    for a in axes:
        if not -rank <= a < rank:
            raise UnsupportedOpError(f"{where}: {what} {a} out of range for rank {rank}")
        if a % rank in out:
            raise UnsupportedOpError(f"{where}: {what} names axis {a} twice")
        out.append(a % rank)
    return out


def slice_windows(shape, starts, ends, axes, steps, where):
    """ONNX Slice on a static shape: per dimension (first index, step, count), with ONNX's
    rules for negative and out-of-range starts / ends (the same as Python's slices).
    starts, ends, axes, steps: numpy values (axes and steps may be None)."""
    starts = _ints(starts, "starts", where)
    ends = _ints(ends, "ends", where)
    axes = _axes(_ints(axes, "axes", where) if axes is not None else range(len(starts)),
                 len(shape), "axes", where)
    steps = _ints(steps, "steps", where) if steps is not None else [1] * len(starts)
    if not len(starts) == len(ends) == len(axes) == len(steps):
        raise UnsupportedOpError(f"{where}: starts, ends, axes and steps differ in length")
    windows = [(0, 1, d) for d in shape]
    for start, end, axis, step in zip(starts, ends, axes, steps):
        if step == 0:
            raise UnsupportedOpError(f"{where}: steps must not be 0 (axis {axis})")
        picked = range(*slice(start, end, step).indices(shape[axis]))
        windows[axis] = (picked.start, step, len(picked))
    return windows


def pad_amounts(rank, pads, axes, where):
    """ONNX Pad: (begins, ends) per dimension from the pads input and the optional axes
    input (opset 18). Negative amounts crop."""
    pads = _ints(pads, "pads", where)
    axes = _axes(_ints(axes, "axes", where) if axes is not None else range(rank), rank,
                 "axes", where)
    if len(pads) != 2 * len(axes):
        raise UnsupportedOpError(f"{where}: pads has {len(pads)} values for {len(axes)} axes")
    begins, ends = [0] * rank, [0] * rank
    for i, axis in enumerate(axes):
        begins[axis], ends[axis] = pads[i], pads[i + len(axes)]
    return begins, ends


def matmul_views(shape_a, shape_b, where):
    """MatMul with numpy's rules: a 1-D A is a row (1, K), a 1-D B a column (K, 1), and the
    unit dimension is dropped from Y again; batch dimensions broadcast. Returns the views
    of A, B and Y in which both operands have at least two dimensions."""
    if not shape_a or not shape_b:
        raise UnsupportedOpError(f"{where}: MatMul needs operands of rank >= 1, got "
                                 f"{list(shape_a)} x {list(shape_b)}")
    a = (1,) + tuple(shape_a) if len(shape_a) == 1 else tuple(shape_a)
    b = tuple(shape_b) + (1,) if len(shape_b) == 1 else tuple(shape_b)
    if a[-1] != b[-2]:
        raise UnsupportedOpError(f"{where}: inner dimensions differ: {list(shape_a)} x "
                                 f"{list(shape_b)}")
    try:
        batch = tuple(np.broadcast_shapes(a[:-2], b[:-2]))
    except ValueError:
        raise UnsupportedOpError(f"{where}: batch dimensions of {list(shape_a)} and "
                                 f"{list(shape_b)} do not broadcast") from None
    return a, b, batch + (a[-2], b[-1])
