# Per-sample normalisation, forward and backward side by side: LayerNormalization,
# InstanceNormalization and GroupNormalization are one kernel.
#
# X is `rows` blocks of cpb * inner contiguous elements; each block is normalised with its
# own mean and (biased) variance. Block r holds channels (r % groups) * cpb + c, c < cpb,
# each `inner` elements long, and channel ch has scale[ch] and bias[ch]:
#   LayerNormalization:     rows = prod(shape[:axis]), groups 1, cpb = prod(shape[axis:]),
#                           inner 1 (every normalised element its own scale)
#   InstanceNormalization:  rows = N * C, groups = C, cpb 1, inner = spatial size
#   GroupNormalization:     rows = N * G, groups = G, cpb = C / G, inner = spatial size
# The backward pass recomputes each block's statistics from X (two passes) instead of
# keeping saved mean and inverse deviation tensors alive.
import math


def _statistics(F, p, m, eps):
    # (mean, 1 / sqrt(var + eps)) of F[p:p + m]; the two-pass variance stays accurate when
    # |mean| >> deviation. var + eps > 0 (eps > 0 is checked) unless X holds NaN or inf,
    # where float math gives NaN (no exception).
    total = 0.0
    for j in range(p, p + m):
        total += F[j]
    mean = total / m
    squares = 0.0
    for j in range(p, p + m):
        d = F[j] - mean
        squares += d * d
    v = squares / m + eps
    return mean, 1.0 / math.sqrt(v) if v > 0.0 else math.nan


def _view_check(c, rows, groups, cpb, inner, eps, blocks, channels):
    # Tensor arguments `blocks` hold rows * cpb * inner elements, `channels` (when present)
    # groups * cpb.
    c.positive(rows, groups, cpb, inner)
    for k in blocks:
        c.holds(k, rows * cpb * inner)
    for k in channels:
        if c.present(k):
            c.holds(k, groups * cpb)
    c.within(eps, 1e-30, 3e38, "epsilon")


def group_norm(F, I, args):
    # y = (x - mean) / sqrt(var + eps) * scale[ch] + bias[ch]; scale, bias = -1: 1 and 0.
    y, x, scale, bias, rows, groups, cpb, inner, eps = args
    m = cpb * inner
    for r in range(rows):
        base = r * m
        mean, inv_std = _statistics(F, x + base, m, eps)
        first = (r % groups) * cpb
        for c in range(cpb):
            a = inv_std * F[scale + first + c] if scale >= 0 else inv_std
            b = F[bias + first + c] if bias >= 0 else 0.0
            p = base + c * inner
            for j in range(p, p + inner):
                F[y + j] = (F[x + j] - mean) * a + b


def group_norm_check(args, c):
    rows, groups, cpb, inner = c.ints
    _view_check(c, rows, groups, cpb, inner, c.floats[0], (0, 1), (2, 3))


def group_norm_grad(F, I, args):
    # With xhat = (x - mean) * inv_std and g = dy * scale[ch], per block of m elements:
    #   dx = inv_std * (g - sum(g) / m - xhat * sum(g * xhat) / m)
    #   dscale[ch] = sum over its elements of dy * xhat, dbias[ch] = sum of dy
    # (summed over every block that holds the channel). Absent outputs (-1) are not needed.
    dx, dscale, dbias, dy, x, scale, rows, groups, cpb, inner, eps = args
    m = cpb * inner
    for out in (dscale, dbias):
        if out >= 0:
            for ch in range(out, out + groups * cpb):
                F[ch] = 0.0
    for r in range(rows):
        base = r * m
        mean, inv_std = _statistics(F, x + base, m, eps)
        first = (r % groups) * cpb
        sum_g = 0.0
        sum_g_xhat = 0.0
        for c in range(cpb):
            p = base + c * inner
            sum_dy = 0.0
            sum_dy_xhat = 0.0
            for j in range(p, p + inner):
                d = F[dy + j]
                sum_dy += d
                sum_dy_xhat += d * (F[x + j] - mean)
            sum_dy_xhat *= inv_std
            if dbias >= 0:
                F[dbias + first + c] += sum_dy
            if dscale >= 0:
                F[dscale + first + c] += sum_dy_xhat
            k = F[scale + first + c] if scale >= 0 else 1.0
            sum_g += k * sum_dy
            sum_g_xhat += k * sum_dy_xhat
        if dx < 0:
            continue
        shift = sum_g / m
        slope = sum_g_xhat / m * inv_std
        for c in range(cpb):
            k = F[scale + first + c] if scale >= 0 else 1.0
            p = base + c * inner
            for j in range(p, p + inner):
                F[dx + j] = inv_std * (k * F[dy + j] - shift - (F[x + j] - mean) * slope)


def group_norm_grad_check(args, c):
    rows, groups, cpb, inner = c.ints
    _view_check(c, rows, groups, cpb, inner, c.floats[0], (3, 4), (1, 2, 5))
    if c.present(0):
        c.holds(0, rows * cpb * inner)
