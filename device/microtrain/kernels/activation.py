# Activations, forward and backward side by side. Backward kernels take the forward
# *output* y, so the input need not be kept alive for the backward pass.
import math


def relu(F, I, args):
    y, x, n = args
    for i in range(n):
        v = F[x + i]
        F[y + i] = 0.0 if v <= 0.0 else v  # NaN passes through, as in PyTorch


def relu_grad(F, I, args):
    # dx = dy where y > 0 (relu(x) > 0 exactly when x > 0)
    dx, dy, y, n = args
    for i in range(n):
        F[dx + i] = F[dy + i] if F[y + i] > 0.0 else 0.0


def sigmoid(F, I, args):
    y, x, n = args
    e = math.exp
    for i in range(n):
        v = F[x + i]
        if v >= 0.0:
            F[y + i] = 1.0 / (1.0 + e(-v))
        else:  # written this way exp never overflows
            z = e(v)
            F[y + i] = z / (1.0 + z)


def sigmoid_grad(F, I, args):
    # dx = dy * y * (1 - y)
    dx, dy, y, n = args
    for i in range(n):
        s = F[y + i]
        F[dx + i] = F[dy + i] * s * (1.0 - s)


def softplus(F, I, args):
    # log(1 + exp(x)) = max(x, 0) + log(1 + exp(-|x|)): exp never overflows.
    y, x, n = args
    e = math.exp
    ln = math.log
    for i in range(n):
        v = F[x + i]
        if v > 0.0:
            F[y + i] = v + ln(1.0 + e(-v))
        else:
            F[y + i] = ln(1.0 + e(v))


def tanh(F, I, args):
    y, x, n = args
    t = math.tanh
    for i in range(n):
        F[y + i] = t(F[x + i])


def tanh_grad(F, I, args):
    # dx = dy * (1 - y^2)
    dx, dy, y, n = args
    for i in range(n):
        t = F[y + i]
        F[dx + i] = F[dy + i] * (1.0 - t * t)


# Softmax family over one axis of a tensor viewed as (outer, n, inner): element (o, j, i)
# is at o * n * inner + j * inner + i.

def largest(F, p, n, stride):
    # Largest of n elements from p on, stride apart (the shift that keeps exp from
    # overflowing). One call per row, not per element.
    top = F[p]
    for j in range(1, n):
        v = F[p + j * stride]
        if v > top:
            top = v
    return top


def softmax(F, I, args):
    y, x, outer, n, inner = args
    e = math.exp
    for o in range(outer):
        for i in range(inner):
            base = o * n * inner + i
            px = x + base
            top = largest(F, px, n, inner)
            total = 0.0
            py = y + base
            for j in range(n):
                z = e(F[px + j * inner] - top)
                F[py + j * inner] = z
                total += z
            for j in range(n):
                F[py + j * inner] /= total


def softmax_grad(F, I, args):
    # dx = y * (dy - sum_j dy_j * y_j)
    dx, dy, y, outer, n, inner = args
    for o in range(outer):
        for i in range(inner):
            base = o * n * inner + i
            dot = 0.0
            for j in range(n):
                dot += F[dy + base + j * inner] * F[y + base + j * inner]
            for j in range(n):
                at = base + j * inner
                F[dx + at] = F[y + at] * (F[dy + at] - dot)


def log_softmax(F, I, args):
    y, x, outer, n, inner = args
    e = math.exp
    for o in range(outer):
        for i in range(inner):
            base = o * n * inner + i
            px = x + base
            top = largest(F, px, n, inner)
            total = 0.0
            for j in range(n):
                total += e(F[px + j * inner] - top)
            shift = top + math.log(total)
            py = y + base
            for j in range(n):
                F[py + j * inner] = F[px + j * inner] - shift


def log_softmax_grad(F, I, args):
    # dx = dy - exp(y) * sum_j dy_j
    dx, dy, y, outer, n, inner = args
    e = math.exp
    for o in range(outer):
        for i in range(inner):
            base = o * n * inner + i
            total = 0.0
            for j in range(n):
                total += F[dy + base + j * inner]
            for j in range(n):
                at = base + j * inner
                F[dx + at] = F[dy + at] - e(F[y + at]) * total
