# Dense layers: one strided GEMM serves Gemm, MatMul and their gradients.


def gemm(F, I, args):
    # Y[m, n] = alpha * sum_k A[i, k] * B[k, j] + beta * C[i, j]
    # A, B and C are addressed through strides, so transposed operands (transA/transB, the
    # dA = dY.B^T and dB = A^T.dY of the backward pass) and a broadcast bias cost nothing.
    # c < 0 means no C.
    y, a, b, c, m, k, n, sa_m, sa_k, sb_k, sb_n, sc_m, sc_n, alpha, beta = args
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
