# Gradient accumulation and parameter updates, in place.
import math

_HUGE = 3e38  # about float32's largest: hyperparameters must be finite
_INF = math.inf
# The updates never store an infinity or a NaN: an element whose update would is left as it
# was and counted here, for the Optimizer to report after the step (the state stays finite).
refused = 0


def _state_check(c, first, count):
    # Tensor arguments first .. first+count-1 are the optimizer state of the parameter in
    # argument 0, in the order of its parameter entry: AdamW's v is its second moment
    # (which the Optimizer keeps >= 0 when it restores one), never its first or another's.
    p = c.tensors[0]
    for tensor, grad, state in c.blob.parameters:
        if tensor == p:
            if tuple(c.tensors[first:first + count]) != tuple(state[:count]):
                c.fail("the optimizer state arguments are not the state of parameter '%s'"
                       % c.blob.names[p])
            return
    c.fail("tensor argument 0 is not a parameter")


def _adam_check(c, n, beta1, beta2, eps, weight_decay):
    # p, g, m, v, lr, step_size, ...
    c.each_holds(4, n)
    c.holds(4, 1)
    c.holds(5, 1)
    _state_check(c, 2, 2)
    c.within(beta1, 0.0, 1.0, "beta1")
    c.within(beta2, 0.0, 1.0, "beta2")
    c.within(eps, 1e-30, _HUGE, "epsilon")
    c.within(weight_decay, 0.0, _HUGE, "weight decay")


def _penalty_check(c, l1, l2):
    c.within(l1, 0.0, _HUGE, "L1 penalty")
    c.within(l2, 0.0, _HUGE, "L2 penalty")


def accumulate(F, I, args):
    # ORT's InPlaceAccumulatorV2: buf = value if lazy_reset_grad else buf + value
    buf, value, reset, n = args
    if F[reset] != 0.0:
        for i in range(n):
            F[buf + i] = F[value + i]
    else:
        for i in range(n):
            F[buf + i] += F[value + i]


def accumulate_check(args, c):
    c.each_holds(2, c.ints[0])
    c.holds(2, 1)


def sgd(F, I, args):
    # p -= lr * g
    global refused
    p, g, lr, n = args
    rate = F[lr]
    for i in range(n):
        x = F[p + i]
        F[p + i] = x - rate * F[g + i]
        if not -_INF < F[p + i] < _INF:
            F[p + i] = x
            refused += 1


def sgd_check(args, c):
    c.each_holds(2, c.ints[0])
    c.holds(2, 1)


def adamw(F, I, args):
    # ORT's AdamW, adam_mode=1 (the Hugging Face rule):
    #   m = b1*m + (1-b1)*g;  v = b2*v + (1-b2)*g^2
    #   p -= step_size * m / (sqrt(v) + eps)   with step_size = lr*sqrt(1-b2^t)/(1-b1^t)
    #   p -= lr * weight_decay * p
    # step_size is computed once per step by the Optimizer and passed in the arena.
    global refused
    p, g, m, v, lr, step_size, n, beta1, beta2, eps, weight_decay = args
    root = math.sqrt
    nan = math.nan
    size = F[step_size]
    decay = 1.0 - F[lr] * weight_decay
    c1 = 1.0 - beta1
    c2 = 1.0 - beta2
    for i in range(n):
        grad = F[g + i]
        x, old_m, old_v = F[p + i], F[m + i], F[v + i]
        F[m + i] = beta1 * old_m + c1 * grad
        F[v + i] = beta2 * old_v + c2 * grad * grad
        s = F[v + i]  # >= 0 unless something wrote into it: NaN then, not a domain error
        F[p + i] = (x - size * F[m + i] / ((root(s) if s >= 0.0 else nan) + eps)) * decay
        if not (-_INF < F[p + i] < _INF and -_INF < F[m + i] < _INF and s < _INF):
            F[p + i], F[m + i], F[v + i] = x, old_m, old_v
            refused += 1


def adamw_check(args, c):
    _adam_check(c, c.ints[0], *c.floats)


# -- the general forms: elastic penalty, global-norm clipping, momentum ---------------------
# The gradient an update uses is d = (g + l1*sign(p) + 2*l2*p) * c, where c is the clipping
# factor (1 without clipping). The accumulated gradient buffer itself is never changed, so
# gradients keep accumulating correctly when the caller does not reset them.

def grad_norm_squared(F, I, args):
    # Adds sum(d^2) of one parameter (before clipping) into F[total]; `first` overwrites it,
    # so the optimizer program needs no separate zeroing step.
    total, g, p, n, first, l1, l2 = args
    # In blocks of 64 terms, as reduce.reduce_sum: on a float32 build a running sum over a
    # large parameter drifts (50,000 terms: relative error 1e-5 -> 5e-7).
    two_l2 = 2.0 * l2
    acc = 0.0
    for start in range(0, n, 64):
        block = 0.0
        for i in range(start, start + 64 if start + 64 < n else n):
            x = F[p + i]
            d = F[g + i] + two_l2 * x + (l1 if x > 0.0 else (-l1 if x < 0.0 else 0.0))
            block += d * d
        acc += block
    F[total] = acc if first else F[total] + acc


def grad_norm_squared_check(args, c):
    n, first = c.ints
    l1, l2 = c.floats
    c.holds(0, 1)
    c.holds(1, n)
    c.holds(2, n)
    _penalty_check(c, l1, l2)


def clip_coef(F, I, args):
    # torch.nn.utils.clip_grad_norm_: c = min(1, max_norm / (norm + 1e-6)), in place of the
    # sum of squares grad_norm_squared left in F[at].
    at, max_norm = args
    total = F[at]
    c = max_norm / (math.sqrt(total) + 1e-6) if total >= 0.0 else math.nan
    F[at] = c if c < 1.0 else 1.0


def clip_coef_check(args, c):
    c.holds(0, 1)
    c.within(c.floats[0], 0.0, _HUGE, "max norm")


def sgd_general(F, I, args):
    # torch.optim.SGD: d += weight_decay*p; with momentum (buf >= 0) buf = d on the first step
    # (F[step] == 1), else momentum*buf + (1-dampening)*d; then d = d + momentum*buf
    # (nesterov) or buf; p -= lr*d.
    global refused
    p, g, lr, step, buf, coef, n, nesterov, momentum, dampening, weight_decay, l1, l2 = args
    rate = F[lr]
    c = F[coef] if coef >= 0 else 1.0
    two_l2 = 2.0 * l2
    if buf < 0:
        for i in range(n):
            x = F[p + i]
            d = (F[g + i] + two_l2 * x + (l1 if x > 0.0 else (-l1 if x < 0.0 else 0.0))) * c
            F[p + i] = x - rate * (d + weight_decay * x)
            if not -_INF < F[p + i] < _INF:
                F[p + i] = x
                refused += 1
        return
    # First step: buf = d, i.e. keep 0*buf + 1*d.
    first = F[step] == 1.0
    keep = 0.0 if first else momentum
    take = 1.0 if first else 1.0 - dampening
    for i in range(n):
        x = F[p + i]
        d = (F[g + i] + two_l2 * x + (l1 if x > 0.0 else (-l1 if x < 0.0 else 0.0))) * c
        d += weight_decay * x
        old_b = F[buf + i]
        b = keep * old_b + take * d
        F[buf + i] = b
        F[p + i] = x - rate * (d + momentum * b if nesterov else b)
        if not (-_INF < F[p + i] < _INF and -_INF < F[buf + i] < _INF):
            F[p + i], F[buf + i] = x, old_b
            refused += 1


def sgd_general_check(args, c):
    n, nesterov = c.ints
    momentum, dampening, weight_decay, l1, l2 = c.floats
    c.each_holds(2, n)
    c.holds(2, 1)
    if c.present(4):  # momentum: the kernel also reads the step number
        c.holds(4, n)
        _state_check(c, 4, 1)
        c.holds(3, 1)
    if c.present(5):
        c.holds(5, 1)
    c.within(momentum, 0.0, _HUGE, "momentum")
    c.within(dampening, -_HUGE, _HUGE, "dampening")
    c.within(weight_decay, 0.0, _HUGE, "weight decay")
    _penalty_check(c, l1, l2)


def adamw_general(F, I, args):
    # adamw (above) on the penalized, clipped gradient.
    global refused
    p, g, m, v, lr, step_size, coef, n, beta1, beta2, eps, weight_decay, l1, l2 = args
    root = math.sqrt
    nan = math.nan
    size = F[step_size]
    decay = 1.0 - F[lr] * weight_decay
    c = F[coef] if coef >= 0 else 1.0
    two_l2 = 2.0 * l2
    c1 = 1.0 - beta1
    c2 = 1.0 - beta2
    for i in range(n):
        x, old_m, old_v = F[p + i], F[m + i], F[v + i]
        grad = (F[g + i] + two_l2 * x + (l1 if x > 0.0 else (-l1 if x < 0.0 else 0.0))) * c
        F[m + i] = beta1 * old_m + c1 * grad
        F[v + i] = beta2 * old_v + c2 * grad * grad
        s = F[v + i]
        F[p + i] = (x - size * F[m + i] / ((root(s) if s >= 0.0 else nan) + eps)) * decay
        if not (-_INF < F[p + i] < _INF and -_INF < F[m + i] < _INF and s < _INF):
            F[p + i], F[m + i], F[v + i] = x, old_m, old_v
            refused += 1


def adamw_general_check(args, c):
    n, = c.ints
    beta1, beta2, eps, weight_decay, l1, l2 = c.floats
    _adam_check(c, n, beta1, beta2, eps, weight_decay)
    if c.present(6):
        c.holds(6, 1)
    _penalty_check(c, l1, l2)


# The native forms of the float updates and the accumulation (device/native/float: machine
# code for the board's architecture, kernels/float_native.mpy where the runtime carries it)
# replace these when it imports: the same bits, `refused` counted alike, no allocation.
# use_fast(False): the pure-Python kernels. A minimal runtime keeps this switch only when it
# carries the module (tools/runtime.py).
_FAST_NAMES = ("sgd", "adamw", "sgd_general", "adamw_general", "accumulate")


def use_fast(on=True):
    from microtrain.kernels import fastpath
    return fastpath.use_fast(globals(), _FAST_NAMES, on, None, "float_native")


FAST = use_fast()
