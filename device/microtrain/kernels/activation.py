# Activations, forward and backward side by side. Backward kernels take the forward
# *output* y, so the input need not be kept alive for the backward pass.
import math

# The largest x (rounded down) whose exp float32 holds (exp(88.7228) = 3.40270e38, the
# float32 maximum 3.40282e38): on single-precision boards math.exp raises ValueError past
# it, so the kernels whose exp could reach it saturate to inf above it themselves (NaN
# still gives NaN: `not x > EXP_LIMIT`). Exp, the log-softmax and cross-entropy gradients.
EXP_LIMIT = 88.7228


def _same_size_check(args, c):
    # Every tensor argument (y, x; or dx, dy and y or x) holds n elements.
    n, = c.ints
    c.each_holds(len(c.offsets), n)


def _axis_check(args, c):
    # Every tensor argument (y, x; or dx, dy, y) holds the (outer, n, inner) view.
    outer, n, inner = c.ints
    c.positive(outer, n, inner)
    c.each_holds(len(c.offsets), outer * n * inner)


def relu(F, I, args):
    y, x, n = args
    for i in range(n):
        v = F[x + i]
        F[y + i] = 0.0 if v <= 0.0 else v  # NaN passes through, as in PyTorch


relu_check = _same_size_check


def relu_grad(F, I, args):
    # dx = dy where y > 0 (relu(x) > 0 exactly when x > 0)
    dx, dy, y, n = args
    for i in range(n):
        F[dx + i] = F[dy + i] if F[y + i] > 0.0 else 0.0


relu_grad_check = _same_size_check


# The same two with a 1-bit mask: when ReluGrad is the only backward reader of a ReLU output
# the packer keeps this mask instead of the float tensor: 1/30 of the memory, and the same
# bits, since relu(x) > 0 exactly when x > 0. Dropout (kernels/norm.py) keeps its mask the
# same way and shares the checker and the gradient's walk below.
# A mask: 30 elements per int of the int arena, bit j of int w for element 30*w + j (small
# ints on every port). The kernels walk it a word at a time, an inner loop of up to 30
# elements each, so no element pays for noticing the end of a word.

def relu_masked(F, I, args):
    # y = relu(x), as relu; the mask records x > 0 (NaN: 0, as relu_grad's NaN > 0)
    y, x, mask, n = args
    word = mask
    for start in range(0, n, 30):
        bits = 0
        bit = 1
        for i in range(start, min(start + 30, n)):
            v = F[x + i]
            if v > 0.0:
                F[y + i] = v
                bits |= bit
            else:
                F[y + i] = 0.0 if v <= 0.0 else v
            bit <<= 1
        I[word] = bits
        word += 1


def mask_check(c, n):
    # tensor arguments 0 and 1 hold n floats, argument 2 their mask: n bits, 30 per int,
    # which a kernel writes (never a label or an input)
    c.positive(n)
    c.each_holds(2, n)
    c.holds(2, (n + 29) // 30)
    c.role(2, "activation")


def relu_masked_check(args, c):
    n, = c.ints
    mask_check(c, n)


def masked_copy(F, I, dx, dy, mask, n, scale):
    # dx = dy where the mask's bit is set, else 0; times scale unless it is None (Dropout's
    # gradient). The branch is taken once per word, not per element.
    word = mask
    for start in range(0, n, 30):
        bits = I[word]
        word += 1
        stop = min(start + 30, n)
        if scale is None:
            for i in range(start, stop):
                F[dx + i] = F[dy + i] if bits & 1 else 0.0
                bits >>= 1
        else:
            for i in range(start, stop):
                F[dx + i] = F[dy + i] * scale if bits & 1 else 0.0
                bits >>= 1


def relu_mask_grad(F, I, args):
    # dx = dy where the forward input was > 0, else 0 (relu_grad from the mask)
    dx, dy, mask, n = args
    masked_copy(F, I, dx, dy, mask, n, None)


relu_mask_grad_check = relu_masked_check


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


sigmoid_check = _same_size_check


def sigmoid_grad(F, I, args):
    # dx = dy * y * (1 - y)
    dx, dy, y, n = args
    for i in range(n):
        s = F[y + i]
        F[dx + i] = F[dy + i] * s * (1.0 - s)


sigmoid_grad_check = _same_size_check


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


softplus_check = _same_size_check


def tanh(F, I, args):
    y, x, n = args
    t = math.tanh
    for i in range(n):
        F[y + i] = t(F[x + i])


tanh_check = _same_size_check


def tanh_grad(F, I, args):
    # dx = dy * (1 - y^2)
    dx, dy, y, n = args
    for i in range(n):
        t = F[y + i]
        F[dx + i] = F[dy + i] * (1.0 - t * t)


tanh_grad_check = _same_size_check


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


def _softmax_rows(F, args, log):
    # Softmax, or with log LogSoftmax, of every row along the axis: each row is shifted by
    # its largest element first, so exp never overflows. One branch per row.
    y, x, outer, n, inner = args
    e = math.exp
    for o in range(outer):
        for i in range(inner):
            base = o * n * inner + i
            px = x + base
            py = y + base
            top = largest(F, px, n, inner)
            total = 0.0
            if log:
                for j in range(n):
                    total += e(F[px + j * inner] - top)
                shift = top + math.log(total)
                for j in range(n):
                    F[py + j * inner] = F[px + j * inner] - shift
            else:
                for j in range(n):
                    z = e(F[px + j * inner] - top)
                    F[py + j * inner] = z
                    total += z
                for j in range(n):
                    F[py + j * inner] /= total


def softmax(F, I, args):
    _softmax_rows(F, args, False)


softmax_check = _axis_check


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


softmax_grad_check = _axis_check


def log_softmax(F, I, args):
    _softmax_rows(F, args, True)


log_softmax_check = _axis_check


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
                v = F[y + at]  # <= 0 from log_softmax; guarded all the same
                F[dx + at] = F[dy + at] - (e(v) if not v > EXP_LIMIT else math.inf) * total


log_softmax_grad_check = _axis_check


# Piecewise-linear activations. Their backward kernels take the forward *input* x: y alone
# cannot tell x = min from x < min for Clip, and HardSwish is not monotonic. The kinks
# follow torch's autograd (checked in tests/test_ops_pool.py).

def leaky_relu(F, I, args):
    y, x, n, alpha = args
    for i in range(n):
        v = F[x + i]
        F[y + i] = v if v > 0.0 else v * alpha


leaky_relu_check = _same_size_check


def leaky_relu_grad(F, I, args):
    # slope 1 where x > 0, alpha where x <= 0 (torch takes alpha at x = 0)
    dx, dy, x, n, alpha = args
    for i in range(n):
        F[dx + i] = F[dy + i] if F[x + i] > 0.0 else F[dy + i] * alpha


leaky_relu_grad_check = _same_size_check


def shrink(F, I, args):
    # ONNX Shrink: x - bias above lambd, x + bias below -lambd, 0 in between (bounds
    # included; a NaN too, as onnxruntime's comparisons give)
    y, x, n, lambd, bias = args
    for i in range(n):
        v = F[x + i]
        F[y + i] = v - bias if v > lambd else (v + bias if v < -lambd else 0.0)


shrink_check = _same_size_check


def shrink_grad(F, I, args):
    # slope 1 outside [-lambd, lambd], 0 inside and at the bounds (torch's shrinks)
    dx, dy, x, n, lambd = args
    for i in range(n):
        v = F[x + i]
        F[dx + i] = F[dy + i] if v > lambd or v < -lambd else 0.0


shrink_grad_check = _same_size_check


def clip(F, I, args):
    # min(max(x, lo), hi): with lo > hi every element becomes hi, as in ONNX; NaN stays.
    y, x, n, lo, hi = args
    for i in range(n):
        v = F[x + i]
        if v < lo:
            v = lo
        if v > hi:
            v = hi
        F[y + i] = v


clip_check = _same_size_check


def clip_grad(F, I, args):
    # dx = dy where lo <= x <= hi: the bounds themselves pass the gradient, as in
    # torch.clamp and onnxruntime's Clip gradient (torch's relu6 / hardtanh give 0 there).
    dx, dy, x, n, lo, hi = args
    for i in range(n):
        v = F[x + i]
        F[dx + i] = F[dy + i] if lo <= v <= hi else 0.0


clip_grad_check = _same_size_check


def hard_sigmoid(F, I, args):
    y, x, n, alpha, beta = args
    for i in range(n):
        t = alpha * F[x + i] + beta
        F[y + i] = 0.0 if t <= 0.0 else (1.0 if t >= 1.0 else t)


hard_sigmoid_check = _same_size_check


def hard_sigmoid_grad(F, I, args):
    # dx = alpha * dy strictly inside 0 < alpha * x + beta < 1 (torch: 0 at the kinks)
    dx, dy, x, n, alpha, beta = args
    for i in range(n):
        t = alpha * F[x + i] + beta
        F[dx + i] = F[dy + i] * alpha if 0.0 < t < 1.0 else 0.0


hard_sigmoid_grad_check = _same_size_check


def hard_swish(F, I, args):
    # x * clamp(x / 6 + 1 / 2, 0, 1) = x * relu6(x + 3) / 6
    y, x, n = args
    for i in range(n):
        v = F[x + i]
        F[y + i] = 0.0 if v <= -3.0 else (v if v >= 3.0 else v * (v + 3.0) / 6.0)


hard_swish_check = _same_size_check


def hard_swish_grad(F, I, args):
    # dx = dy * (x / 3 + 1 / 2) strictly inside -3 < x < 3, 0 below, dy above (torch: 0
    # at x = -3 and 1 at x = 3)
    dx, dy, x, n = args
    for i in range(n):
        v = F[x + i]
        if v <= -3.0:
            F[dx + i] = 0.0
        elif v >= 3.0:
            F[dx + i] = F[dy + i]
        else:
            F[dx + i] = F[dy + i] * (v / 3.0 + 0.5)


hard_swish_grad_check = _same_size_check


def thresholded_relu(F, I, args):
    # ONNX ThresholdedRelu: x above alpha, else 0 (a NaN gives 0, as onnxruntime's compare)
    y, x, n, alpha = args
    for i in range(n):
        v = F[x + i]
        F[y + i] = v if v > alpha else 0.0


def thresholded_relu_check(args, c):
    # y, x (or dx, dy, x) of n elements; alpha finite
    _same_size_check(args, c)
    alpha, = c.floats
    c.within(alpha, -3e38, 3e38, "alpha")


def thresholded_relu_grad(F, I, args):
    # slope 1 above alpha, 0 at and below it
    dx, dy, x, n, alpha = args
    for i in range(n):
        F[dx + i] = F[dy + i] if F[x + i] > alpha else 0.0


thresholded_relu_grad_check = thresholded_relu_check


# The native forms of relu and relu_grad (device/native/float: machine code for the board's
# architecture, kernels/float_native.mpy where the runtime carries it) replace these when it
# imports: the same bits, no allocation. use_fast(False): the pure-Python kernels. A minimal
# runtime keeps this switch only when it carries the module (tools/runtime.py).
_FAST_NAMES = ('relu', 'relu_grad')


def use_fast(on=True):
    from microtrain.kernels import fastpath
    return fastpath.use_fast(globals(), _FAST_NAMES, on, None, "float_native")


FAST = use_fast()
