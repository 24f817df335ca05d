# The native float module's reduce_sum, relu and relu_grad (device/native/float/
# float_reduce.c) against kernels/reduce.py's and kernels/activation.py's pure-Python kernels,
# its largest_abs against the loop of module.py's Module._largest_gradient (the train
# call's gradient check; 1 to 4 spans, the later ones starting from a larger worst) and its
# load_floats against feed.py's loop (copy_inputs of a float input), on
# the same board (single-precision floats): random geometries (reduce_sum: every choice of
# reduced dimensions, rows past reduce.py's 64-term blocks, a scale or none; relu, relu_grad:
# in place or not; a few calls reaching past F's end, which both refuse alike) and data of
# several magnitudes with subnormals, zeros, infinities and NaNs (edge()). F compared byte
# for byte after each call (a NaN equals any NaN, as in float_native.py), the exception
# type when one is raised, largest_abs's result bit for bit. CASES cases in turn over the
# five. Prints "fast B", then "cases N different D raised R".
import random
from array import array
from microtrain import feed, module
from microtrain.kernels import activation, reduce
from microtrain.kernels import float_native as native

random.seed(2411)
print("fast", reduce.reduce_sum is native.reduce_sum and activation.relu is native.relu
      and activation.relu_grad is native.relu_grad and module.largest_abs is native.largest_abs
      and feed._LOAD is native.load_floats)
pure = dict(reduce._pure, **activation._pure)


def edge():
    # a subnormal, a zero, an infinity, a NaN (any payload), the largest finite, the
    # smallest normal; either sign
    kind = random.randint(0, 5)
    w = (random.getrandbits(23) or 1, 0, 0x7F800000, 0x7F800000 | (random.getrandbits(22) or 1)
         | random.getrandbits(1) << 22, 0x7F7FFFFF, 0x00800000)[kind]
    return random.getrandbits(1) << 31 | w


def arena(size):
    # random float32 words of one magnitude (sums that round), with zeros and, in one case
    # of three, edge values: 1 in 4, 16 or 64
    scale = random.choice((-130, -20, 0, 20, 120))
    every = random.choice((4, 16, 64)) if random.randint(0, 2) == 0 else 0
    words = array("I", bytes(4 * size))
    for i in range(size):
        e = 127 + scale + random.randint(-3, 3)
        e = 1 if e < 1 else (254 if e > 254 else e)
        w = random.getrandbits(1) << 31 | e << 23 | random.getrandbits(23)
        if random.getrandbits(3) == 0:
            w &= 0x80000000
        if every and random.randrange(every) == 0:
            w = edge()
        words[i] = w
    return array("f", bytes(words))


def same(F1, F2):
    if bytes(F1) == bytes(F2):
        return True
    for i in range(len(F1)):
        x, y = F1[i], F2[i]
        if not (x == y or (x != x and y != y)) or (x == 0.0 and bytes(F1[i:i + 1])
                                                      != bytes(F2[i:i + 1])):
            return False
    return True


raised = 0


def check(kernel, F, args):
    global raised
    F1 = array("f", F)
    F2 = array("f", F)
    e1 = e2 = None
    try:
        pure[kernel](F1, None, args)
    except IndexError as e:
        e1 = type(e)
    try:
        getattr(native, kernel)(F2, None, args)
    except IndexError as e:
        e2 = type(e)
    raised += e1 is not None
    return not same(F1, F2) or e1 is not e2


def past_end():
    # one call in 30 reaches past F's end
    return random.randint(0, 29) == 0


def reduce_case():
    d = [random.randint(1, 3), random.randint(1, 4), random.choice((1, 2, 5, 63, 64, 65, 130))]
    reduced = [random.getrandbits(1) for _ in range(3)]
    sy, ny = [0, 0, 0], 1
    for i in (2, 1, 0):         # Y contiguous over the dimensions kept
        if not reduced[i]:
            sy[i] = ny
            ny *= d[i]
    x = ny + random.randint(0, 3)
    size = x + d[0] * d[1] * d[2] + random.randint(0, 3)
    if past_end():
        size -= random.randint(1, 3)
    scale = random.choice((1.0, 1.0, 0.125, array("f", arena(1))[0]))
    F = arena(max(size, 1))
    return check("reduce_sum", F, (0, x, d[0], d[1], d[2], sy[0], sy[1], sy[2], ny, scale))


def relu_case():
    n = random.choice((0, 1, 7, 30, 100, 257))
    x = random.randint(0, 3)
    y = x if random.getrandbits(1) else x + n + random.randint(0, 3)
    size = max(x, y) + n + (-random.randint(1, 2) if past_end() else random.randint(0, 2))
    return check("relu", arena(max(size, 1)), (y, x, n))


def relu_grad_case():
    n = random.choice((0, 1, 7, 30, 100, 257))
    dy = random.randint(0, 3)
    y = dy + n + random.randint(0, 3)
    dx = dy if random.getrandbits(1) else y + n + random.randint(0, 3)
    size = max(dx, y) + n + (-random.randint(1, 2) if past_end() else random.randint(0, 2))
    return check("relu_grad", arena(max(size, 1)), (dx, dy, y, n))


class Spans:
    # what Module._largest_gradient reads: the arena and the gradient buffers' spans
    def __init__(self, F, spans):
        self.F, self._grads = F, spans


def largest_case():
    # Module._largest_gradient over 1 to 4 spans inside F with the native largest_abs and
    # with its own loop (module.largest_abs None), the result bit for bit
    size = random.choice((1, 5, 64, 300))
    spans = []
    for _ in range(random.randint(1, 4)):
        off = random.randrange(size)
        spans.append((off, random.randint(0, size - off)))
    grads = Spans(arena(size), spans)
    module.largest_abs = None
    r1 = module.Module._largest_gradient(grads)
    module.largest_abs = native.largest_abs
    r2 = module.Module._largest_gradient(grads)
    return bytes(array("f", [r1])) != bytes(array("f", [r2]))


class Blob:
    # what feed.copy_inputs reads of a blob with one float input of n values at off
    def __init__(self, off, n):
        self.offsets, self.sizes, self.shapes = [off], [n], [(n,)]
        self.dtypes, self.roles, self.names = [0], [0], ["x"]      # FLOAT, ROLE_INPUT


class Program:
    inputs, name = [0], "train"


def load_case():
    # feed.copy_inputs of one float input with load_floats (an array('f'): copied by the
    # module; a list or a wrong-sized array: refused by it, the loop copies or raises) and
    # with its loop alone (feed._LOAD None): F byte for byte, the exception type alike
    n = random.choice((0, 1, 7, 64, 300))
    size = n + random.randint(0, 5)
    off = random.randint(0, size - n)
    kind = random.randint(0, 9)
    values = arena(n) if n else array("f")
    if kind == 0:
        values = list(values)
    elif kind == 1:
        values = arena(n + 1)        # the wrong count: both raise InputError
    F = arena(max(size, 1))
    results = []
    for load in (None, native.load_floats):
        feed._LOAD = load
        F1 = array("f", F)
        try:
            feed.copy_inputs(Blob(off, n), F1, None, Program, [values], 0)
            results.append(bytes(F1))
        except Exception as e:
            results.append(type(e))
    return (results[0] != results[1]
            or (kind > 1) != native.load_floats(array("f", F), off, values, n))


different = 0
kinds = (reduce_case, relu_case, relu_grad_case, largest_case, load_case)
for case in range(CASES):  # noqa: F821 (prepended by the test)
    different += kinds[case % len(kinds)]()
print("cases", CASES, "different", different, "raised", raised)  # noqa: F821
