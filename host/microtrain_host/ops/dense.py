"""Dense layers: Gemm, MatMul (numpy's rules: 1-D operands, broadcast batch dimensions) and
ai.microtrain FusedMatMul (a MatMul reading an operand transposed: the gradients of a
batched MatMul). One strided GEMM kernel serves them all (device kernels/dense.py):
transposed operands, a broadcast bias and a batch folded into rows cost no copy."""
import numpy as np

from .. import opcodes as op
from ..errors import UnsupportedOpError
from ..graph import DOMAIN, attr, optional_input, reshaped, unbroadcast
from ..ir import NO_TENSOR, broadcast_strides, collapse, contiguous_strides
from ..reference import MicrotrainOp
from ..registry import gradient, lowering
from .conv import layer_inputs, layer_tensors


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


# -- Gemm ---------------------------------------------------------------------------------

def _gemm_operand_grad(g, first, second, trans_first, trans_second, alpha, shape, hint):
    return g.node("Gemm", [first, second], shape, hint=hint, alpha=alpha,
                  transA=int(trans_first), transB=int(trans_second))


@gradient("Gemm")
def grad_gemm(g, node, dys, needs):
    # Y = alpha * op(A) op(B) + beta * C, op = transpose when transA / transB.
    a, b = node.input[0], node.input[1]
    dy = dys[0]
    alpha = attr(node, "alpha", 1.0)
    beta = attr(node, "beta", 1.0)
    ta, tb = attr(node, "transA", 0), attr(node, "transB", 0)
    grads = [None] * len(node.input)
    if needs[0]:
        # dA = alpha * dY op(B)^T, or its transpose when A was transposed.
        if not ta:
            grads[0] = _gemm_operand_grad(g, dy, b, 0, not tb, alpha, g.shape(a), "dA")
        else:
            grads[0] = _gemm_operand_grad(g, b, dy, tb, 1, alpha, g.shape(a), "dA")
    if needs[1]:
        # dB = alpha * op(A)^T dY, or its transpose when B was transposed.
        if not tb:
            grads[1] = _gemm_operand_grad(g, a, dy, not ta, 0, alpha, g.shape(b), "dB")
        else:
            grads[1] = _gemm_operand_grad(g, dy, a, 1, ta, alpha, g.shape(b), "dB")
    if optional_input(node, 2) and needs[2]:
        dc = unbroadcast(g, dy, g.shape(node.input[2]))
        if beta != 1.0:
            dc = g.node("Mul", [dc, g.constant("beta", np.float32(beta))], g.shape(node.input[2]),
                        hint="dC")
        grads[2] = dc
    return grads


@lowering("Gemm")
def lower_gemm(ctx, node):
    names, sa, sb = layer_inputs(ctx, node)
    c = names[2]
    if len(sa) != 2 or len(sb) != 2:
        raise UnsupportedOpError(f"{ctx.where(node)}: only 2-D operands are supported, got "
                                 f"{list(sa)} x {list(sb)}")
    ta, tb = attr(node, "transA", 0), attr(node, "transB", 0)
    m, k = (sa[1], sa[0]) if ta else sa
    n = sb[0] if tb else sb[1]
    sa_m, sa_k = (1, sa[1]) if ta else (sa[1], 1)
    sb_k, sb_n = (1, sb[1]) if tb else (sb[1], 1)
    sc = broadcast_strides((m, n), ctx.shape(c)) if c else [0, 0]
    y = ctx.define(node.output[0])
    ctx.step(op.GEMM, layer_tensors(ctx, y, names), [m, k, n, sa_m, sa_k, sb_k, sb_n, sc[0], sc[1]],
             [attr(node, "alpha", 1.0), attr(node, "beta", 1.0) if c else 0.0])


# -- MatMul and FusedMatMul ------------------------------------------------------------

@gradient("MatMul")
def grad_matmul(g, node, dys, needs):
    # Y = A @ B with numpy's rules (1-D operands, broadcast batch dimensions). When B is a
    # matrix, A's batch folds into its rows and both gradients are 2-D Gemms (dB can then
    # accumulate in place). Otherwise each gradient is a FusedMatMul with one operand
    # transposed, summed over the batch dimensions its operand was broadcast along.
    a, b = node.input
    view_a, view_b, view_y = matmul_views(g.shape(a), g.shape(b), f"MatMul node '{node.name}'")
    dy = reshaped(g, dys[0], view_y, "dMatMul")
    da = db = None
    if len(view_b) == 2:
        rows = (int(np.prod(view_a[:-1])), view_a[-1])
        dy_rows = reshaped(g, dy, (rows[0], view_b[1]), "dMatMul")
        if needs[0]:
            da = _gemm_operand_grad(g, dy_rows, reshaped(g, b, view_b, "dMatMul"), 0, 1, 1.0, rows,
                                    "dA")
        if needs[1]:
            db = _gemm_operand_grad(g, reshaped(g, a, rows, "dMatMul"), dy_rows, 1, 0, 1.0, view_b,
                                    "dB")
    else:
        batch = view_y[:-2]
        if needs[0]:
            da = unbroadcast(g, g.node("FusedMatMul", [dy, reshaped(g, b, view_b, "dMatMul")],
                                       batch + view_a[-2:], domain=DOMAIN, hint="dA", transB=1),
                             view_a)
        if needs[1]:
            db = unbroadcast(g, g.node("FusedMatMul", [reshaped(g, a, view_a, "dMatMul"), dy],
                                       batch + view_b[-2:], domain=DOMAIN, hint="dB", transA=1),
                             view_b)
    return [reshaped(g, da, g.shape(a), "dA") if da else None,
            reshaped(g, db, g.shape(b), "dB") if db else None]


@lowering("MatMul")
def lower_matmul(ctx, node):
    # numpy's rules: 1-D operands get a unit dimension, batch dimensions broadcast.
    a, b = node.input
    view_a, view_b, _ = matmul_views(ctx.shape(a), ctx.shape(b), ctx.where(node))
    _matmul(ctx, node, view_a, view_b, 0, 0, 1.0)


def _matmul(ctx, node, shape_a, shape_b, trans_a, trans_b, alpha):
    """Y = alpha * op(A) op(B) over the broadcast batch dimensions, op = transpose of the
    last two. One GEMM when there is one product, or when B is shared by the whole batch
    (A's batch then folds into its rows); otherwise BATCHED_GEMM."""
    a, b = node.input
    rows_a, cols_a = shape_a[-2:]
    rows_b, cols_b = shape_b[-2:]
    m, k = (cols_a, rows_a) if trans_a else (rows_a, cols_a)
    n = rows_b if trans_b else cols_b
    sa_m, sa_k = (1, cols_a) if trans_a else (cols_a, 1)
    sb_k, sb_n = (1, cols_b) if trans_b else (cols_b, 1)
    batch = tuple(np.broadcast_shapes(shape_a[:-2], shape_b[:-2]))
    count = int(np.prod(batch, dtype=np.int64))
    y = ctx.define(node.output[0])
    if count == 1 or (not trans_a and np.prod(shape_b[:-2], dtype=np.int64) == 1
                      and np.prod(shape_a[:-2], dtype=np.int64) == count):
        ctx.step(op.GEMM, [y, ctx.t(a), ctx.t(b), NO_TENSOR],
                 [count * m, k, n, sa_m, sa_k, sb_k, sb_n, 0, 0], [alpha, 0.0])
        return
    strides = [[s * m * n for s in contiguous_strides(batch)],
               [s * rows_a * cols_a for s in broadcast_strides(batch, shape_a[:-2])],
               [s * rows_b * cols_b for s in broadcast_strides(batch, shape_b[:-2])]]
    dims, (_, s_a, s_b) = collapse(batch, strides, ctx.where(node))
    ctx.step(op.BATCHED_GEMM, [y, ctx.t(a), ctx.t(b)],
             dims + s_a + s_b + [m, k, n, sa_m, sa_k, sb_k, sb_n], [alpha])


@lowering("FusedMatMul")
def lower_fused_matmul(ctx, node):
    # ai.microtrain FusedMatMul (ORT's op of that name, without its transBatch options):
    # the gradients of a batched MatMul read their operands transposed.
    a, b = node.input
    if len(ctx.shape(a)) < 2 or len(ctx.shape(b)) < 2:
        raise UnsupportedOpError(f"{ctx.where(node)}: operands must have rank >= 2")
    _matmul(ctx, node, ctx.shape(a), ctx.shape(b), attr(node, "transA", 0),
            attr(node, "transB", 0), attr(node, "alpha", 1.0))


class FusedMatMul(MicrotrainOp):
    """Y = alpha * op(A) @ op(B), op = swapping the last two axes where transA / transB
    (ORT's com.microsoft op of that name, without transBatch)."""

    def _run(self, a, b, alpha=1.0, transA=0, transB=0):
        a = np.swapaxes(a, -1, -2) if transA else a
        b = np.swapaxes(b, -1, -2) if transB else b
        return ((alpha * np.matmul(a, b)).astype(a.dtype),)
