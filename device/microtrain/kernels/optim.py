# Gradient accumulation and parameter updates, in place.
import math


def accumulate(F, I, args):
    # ORT's InPlaceAccumulatorV2: buf = value if lazy_reset_grad else buf + value
    buf, value, reset, n = args
    if F[reset] != 0.0:
        for i in range(n):
            F[buf + i] = F[value + i]
    else:
        for i in range(n):
            F[buf + i] += F[value + i]


def sgd(F, I, args):
    # p -= lr * g
    p, g, lr, n = args
    rate = F[lr]
    for i in range(n):
        F[p + i] -= rate * F[g + i]


def adamw(F, I, args):
    # ORT's AdamW, adam_mode=1 (the Hugging Face rule):
    #   m = b1*m + (1-b1)*g;  v = b2*v + (1-b2)*g^2
    #   p -= step_size * m / (sqrt(v) + eps)   with step_size = lr*sqrt(1-b2^t)/(1-b1^t)
    #   p -= lr * weight_decay * p
    # step_size is computed once per step by the Optimizer and passed in the arena.
    p, g, m, v, lr, step_size, n, beta1, beta2, eps, weight_decay = args
    root = math.sqrt
    size = F[step_size]
    decay = 1.0 - F[lr] * weight_decay
    c1 = 1.0 - beta1
    c2 = 1.0 - beta2
    for i in range(n):
        grad = F[g + i]
        F[m + i] = beta1 * F[m + i] + c1 * grad
        F[v + i] = beta2 * F[v + i] + c2 * grad * grad
        F[p + i] = (F[p + i] - size * F[m + i] / (root(F[v + i]) + eps)) * decay
