# Dense layers: one strided GEMM serves Gemm, MatMul and their gradients.


def _gemm(F, y, a, b, c, m, k, n, sa_m, sa_k, sb_k, sb_n, sc_m, sc_n, alpha, beta):
    # Y[m, n] = alpha * sum_k A[i, k] * B[k, j] + beta * C[i, j]
    # A, B and C are addressed through strides, so transposed operands (transA/transB, the
    # dA = dY.B^T and dB = A^T.dY of the backward pass) and a broadcast bias cost nothing.
    # c < 0 means no C. C may be Y itself (each element is read before it is written).
    for i in range(m):
        a_row = a + i * sa_m
        c_row = c + i * sc_m
        for j in range(n):
            pa = a_row
            pb = b + j * sb_n
            s = 0.0
            for _ in range(k):
                s += F[pa] * F[pb]
                pa += sa_k
                pb += sb_k
            if c >= 0:
                F[y] = alpha * s + beta * F[c_row + j * sc_n]
            else:
                F[y] = alpha * s
            y += 1


def _gemm_check(c, y, a, b, m, k, n, sa_m, sa_k, sb_k, sb_n):
    c.span(0, y, (m, n), (n, 1))
    c.span(1, a, (m, k), (sa_m, sa_k))
    c.span(2, b, (k, n), (sb_k, sb_n))
    c.moving((k,), (sa_k,))  # k bounds the inner loop: A must walk along it


def gemm(F, I, args):
    y, a, b, c, m, k, n, sa_m, sa_k, sb_k, sb_n, sc_m, sc_n, alpha, beta = args
    _gemm(F, y, a, b, c, m, k, n, sa_m, sa_k, sb_k, sb_n, sc_m, sc_n, alpha, beta)


def gemm_check(args, c):
    y, a, b, bias = c.offsets
    m, k, n, sa_m, sa_k, sb_k, sb_n, sc_m, sc_n = c.ints
    _gemm_check(c, y, a, b, m, k, n, sa_m, sa_k, sb_k, sb_n)
    if c.present(3):
        c.span(3, bias, (m, n), (sc_m, sc_n))


def gemm_accumulate(F, I, args):
    # A weight gradient computed straight into its accumulation buffer Y:
    #   Y = alpha * A B            after lazy_reset_grad (F[reset] != 0)
    #   Y = alpha * A B + Y        otherwise
    # This saves a temporary the size of the weight (ORT's InPlaceAccumulatorV2, fused).
    y, a, b, reset, m, k, n, sa_m, sa_k, sb_k, sb_n, alpha = args
    _gemm(F, y, a, b, -1 if F[reset] != 0.0 else y, m, k, n, sa_m, sa_k, sb_k, sb_n, n, 1,
          alpha, 1.0)


def gemm_accumulate_check(args, c):
    y, a, b, reset = c.offsets
    m, k, n, sa_m, sa_k, sb_k, sb_n = c.ints
    _gemm_check(c, y, a, b, m, k, n, sa_m, sa_k, sb_k, sb_n)
    c.holds(3, 1)


def batched_gemm(F, I, args):
    # Y[i] = alpha * A[i] B[i] for every index i of up to three (host-collapsed) batch
    # dimensions: N-D MatMul. An operand broadcast along a batch dimension has stride 0
    # there; Y is contiguous. Each matrix is the strided GEMM above, so transposed
    # operands of the backward pass cost nothing here either.
    (y, a, b, d0, d1, d2, sa0, sa1, sa2, sb0, sb1, sb2, m, k, n, sa_m, sa_k, sb_k, sb_n,
     alpha) = args
    size = m * n
    for i0 in range(d0):
        for i1 in range(d1):
            pa = a + i0 * sa0 + i1 * sa1
            pb = b + i0 * sb0 + i1 * sb1
            for _ in range(d2):
                _gemm(F, y, pa, pb, -1, m, k, n, sa_m, sa_k, sb_k, sb_n, 0, 0, alpha, 0.0)
                y += size
                pa += sa2
                pb += sb2


def batched_gemm_check(args, c):
    y, a, b = c.offsets
    d0, d1, d2, sa0, sa1, sa2, sb0, sb1, sb2, m, k, n, sa_m, sa_k, sb_k, sb_n = c.ints
    c.positive(d0, d1, d2, m, n)
    c.span(0, y, (d0, d1, d2, m, n), (d1 * d2 * m * n, d2 * m * n, m * n, n, 1))
    c.span(1, a, (d0, d1, d2, m, k), (sa0, sa1, sa2, sa_m, sa_k))
    c.span(2, b, (d0, d1, d2, k, n), (sb0, sb1, sb2, sb_k, sb_n))
    c.moving((k,), (sa_k,))


# The native forms of the Gemm kernels (device/native/float: machine code for the board's
# architecture, kernels/float_native.mpy where the runtime carries it) replace these when it
# imports: the same bits, no allocation. use_fast(False): the pure-Python kernels. A
# minimal runtime keeps this switch only when it carries the module (tools/runtime.py).
_FAST_NAMES = ("gemm", "gemm_accumulate", "batched_gemm")


def use_fast(on=True):
    from microtrain.kernels import fastpath
    return fastpath.use_fast(globals(), _FAST_NAMES, on, None, "float_native")


FAST = use_fast()
