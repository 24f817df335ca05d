# The load-time checks of one step's arguments, which each kernel's checker asks for
# (`<kernel>_check(args, c)` beside the kernel in kernels/<family>.py). parser.py runs them
# once per step; kernels then trust their arguments.
from microtrain.blob import ROLE_NAMES
from microtrain.errors import BlobError

# contract: private
# (generated from host/microtrain_host/contract/ by `python -m microtrain_host.contract.generate`; do not edit)
from microtrain.errors import const
_NO_TENSOR = const(0xFFFFFFFF)  # the id of an absent optional tensor
# end of contract


class StepCheck:
    """What a kernel's checker (`<kernel>_check(args, c)` beside each kernel in kernels/)
    asserts about one step's arguments at load, so that kernels can trust them: every
    index lands inside its tensor, every loop is bounded by the tensors' sizes, no
    hyperparameter makes a kernel raise. Each failure is a BlobError naming the step."""

    def __init__(self, b):
        self.blob = b
        self.where = ""
        self.tensors = ()   # the step's tensor ids (_NO_TENSOR when absent)
        self.counts = (0, 0)  # how many ints and floats the step carries (args after the
                              # tensor offsets: ints first, then floats)
        # What the checkers read, by name (`y, x = c.offsets`, `n, = c.ints`): the offsets of
        # the step's tensors (-1 for an absent one), its ints and its floats.
        self.offsets = ()
        self.ints = ()
        self.floats = ()

    def fail(self, what):
        raise BlobError("%s: %s" % (self.where, what))

    def positive(self, *values):
        for v in values:
            if v < 1:
                self.fail("count %d must be at least 1" % v)

    def each_holds(self, count, n):
        # tensor arguments 0 .. count-1 each hold n elements
        for k in range(count):
            self.holds(k, n)

    def equal(self, value, expected, what):
        if value != expected:
            self.fail("%s is %r, expected %r" % (what, value, expected))

    def present(self, k):
        return self.tensors[k] != _NO_TENSOR

    def _extent(self, k):
        tid = self.tensors[k]
        if tid == _NO_TENSOR:
            self.fail("tensor argument %d is required" % k)
        return self.blob.offsets[tid], self.blob.offsets[tid] + self.blob.sizes[tid]

    def holds(self, k, n):
        start, end = self._extent(k)
        if n < 0 or start + n > end:
            self.fail("tensor '%s' holds %d elements, the step reads or writes %d"
                      % (self.blob.names[self.tensors[k]], end - start, n))

    def apart(self, k, *others):
        # tensor argument k, which the step writes while it reads the others, shares no
        # element with them (same arena: float, int, or the int8 / uint8 bytes)
        start, end = self._extent(k)
        b = self.blob
        arena = (0, 1, 2, 2)
        for j in others:
            low, high = self._extent(j)
            t, u = self.tensors[k], self.tensors[j]
            if arena[b.dtypes[t]] == arena[b.dtypes[u]] and low < end and start < high:
                self.fail("tensor '%s' [%d, %d) overlaps tensor '%s' [%d, %d), which the "
                          "step reads while it writes the first" % (b.names[t], start, end,
                                                                    b.names[u], low, high))

    def span(self, k, base, counts, strides):
        # The lowest and highest element the index walk reaches, against tensor k's extent.
        start, end = self._extent(k)
        low = high = base
        for i in range(len(counts)):
            n = counts[i]
            if n < 1:
                self.fail("count %d must be at least 1" % n)
            reach = (n - 1) * strides[i]
            if reach < 0:
                low += reach
            else:
                high += reach
        if low < start or high >= end:
            self.fail("elements [%d, %d] lie outside tensor '%s' [%d, %d)"
                      % (low - start, high - start, self.blob.names[self.tensors[k]], 0,
                         end - start))

    def moving(self, counts, strides):
        for i in range(len(counts)):
            if counts[i] > 1 and strides[i] == 0:
                self.fail("a dimension of %d elements is walked with stride 0" % counts[i])

    def within(self, value, low, high, what):
        if not low <= value <= high:  # NaN fails too
            self.fail("%s is %r, outside [%r, %r]" % (what, value, low, high))

    def kept(self, k):
        # tensor argument k (when present) is state a training forward pass updates in
        # place (running statistics, an observer's range, a generator): the Module keeps a
        # copy before each train call and puts it back when the call is refused
        tid = self.tensors[k]
        if tid != _NO_TENSOR and tid not in self.blob.kept:
            self.blob.kept.append(tid)

    def nonnegative(self, k):
        # tensor argument k, when it is a parameter, must never hold a negative value (a
        # variance): the Module checks what a checkpoint brings into it
        tid = self.tensors[k]
        if tid != _NO_TENSOR and ROLE_NAMES[self.blob.roles[tid]] == "param":
            self.blob.nonnegative.add(tid)

    def role(self, k, *names):
        tid = self.tensors[k]
        if tid == _NO_TENSOR or ROLE_NAMES[self.blob.roles[tid]] not in names:
            self.fail("tensor argument %d must be a %s tensor" % (k, " or ".join(names)))
