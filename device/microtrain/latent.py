# The latent cache of an integer classifier's training (issue 22): when only the classifier
# trains (an integer training blob packed without --train-last / --train-biases), the frozen
# layers before it compute the same int8 features for a sample in every epoch. The cache
# keeps them - m * k bytes per batch, with its labels - the first time a batch is trained,
# and every later epoch runs only the classifier's steps on them: the backbone runs once per
# sample, not once per epoch. The steps are the train program's own, so the parameters end
# bit for bit as without the cache.
#
# Where the codes live: in RAM (a bytearray allocated once, `batches` records) or, with
# `path`, in a file of fixed-size records on the board's flash (nothing but one record in
# RAM). The file is scratch: it is rewritten by the first epoch of every run.
from array import array

from microtrain import files
from microtrain.errors import InputError
from microtrain.intparams import integer_loss
from microtrain.kernels import inttrain


class LatentCache:
    """module: a Module of an integer training blob whose classifier alone trains; batches:
    how many training batches the cache holds (slot 0 .. batches - 1); path: keep them in
    that file instead of RAM.

    step(slot, x, labels) trains one batch: with x, the whole train program runs and the
    classifier's input is kept in the slot; with x None, the slot's features and labels are
    written where the classifier reads them and only its steps run. Returns the loss (as
    Module's call does)."""

    def __init__(self, module, batches, path=None):
        b = module.blob
        steps = b.programs["train"].steps
        start = -1
        for i in range(len(steps)):
            if steps[i][0] is inttrain.int_gemm_logits:
                start = i
                break
        if start < 0 or not b.integer_parameters:
            raise InputError("a latent cache needs an integer training blob (pack --int8)")
        # (a model's minimal runtime carries only the kernels its blob uses)
        head = [getattr(inttrain, name, None) for name in (
            "int_gemm_logits", "int_softmax_ce", "int_gemm_update", "int_gemm_update_momentum")]
        for kernel, _ in steps[start:]:
            if kernel not in head:
                raise InputError("a latent cache needs a blob whose classifier alone trains "
                                 "(packed without --train-last / --train-biases)")
        if start + 1 >= len(steps) or steps[start + 1][0] is not head[1]:
            raise InputError("a latent cache needs a softmax cross-entropy classifier")
        args = steps[start][1]
        self.m, self.k = args[6], args[7]
        self._x = args[2]
        self._labels = steps[start + 1][1][3]   # int_softmax_ce: its labels
        self.module = module
        self.prefix = steps[:start]
        self.suffix = steps[start:]
        self.batches = int(batches)
        if self.batches < 1:
            raise InputError("a latent cache holds at least one batch")
        self.record = self.m * self.k + 2 * self.m      # codes, then 16-bit labels
        self.bytes = self.batches * self.record     # what the cache keeps (RAM or file)
        self.filled = bytearray((self.batches + 7) >> 3)
        self._classes = b.num_classes
        self._file = None
        if path is None:
            self._codes = bytearray(self.m * self.k * self.batches)
            self._label_values = array("H", bytes(2 * self.m * self.batches))
        else:
            self._codes = None
            self._file = open(path, "w+b")
            self._row = bytearray(self.record)

    def step(self, slot, x, labels):
        if not 0 <= slot < self.batches:
            raise InputError("slot %d outside the cache's %d batches" % (slot, self.batches))
        module = self.module
        program = module._train
        if x is not None:
            module._load_inputs(program, (x, labels))
            F, I = module.F, module.I
            for kernel, args in self.prefix:
                kernel(F, I, args)
            self._keep(slot)
            self.filled[slot >> 3] |= 1 << (slot & 7)
        else:
            if not (self.filled[slot >> 3] >> (slot & 7)) & 1:
                raise InputError("slot %d of the latent cache was never trained with its "
                                 "input" % slot)
            self._restore(slot)
        F, I = module.F, module.I
        for kernel, args in self.suffix:
            kernel(F, I, args)
        return integer_loss(module, program)

    # (byte loops, not slices: a step allocates nothing)
    def _keep(self, slot):
        Q, I = self.module.blob.Q, self.module.I    # (pairs: no tuple is made)
        m, x = self.m, self._x
        size = m * self.k
        if self._file is None:
            codes, at = self._codes, slot * size
            for i in range(size):
                codes[at + i] = Q[x + i]
            for i in range(m):
                self._label_values[slot * m + i] = I[self._labels + i]
            return
        row = self._row
        for i in range(size):
            row[i] = Q[x + i]
        for i in range(m):
            v = I[self._labels + i]         # (a label Module took: 0 <= v < classes)
            row[size + 2 * i] = v & 255
            row[size + 2 * i + 1] = v >> 8
        files.seek(self._file, slot * self.record)
        self._file.write(row)

    def _restore(self, slot):
        Q, I = self.module.blob.Q, self.module.I
        m, x = self.m, self._x
        size = m * self.k
        if self._file is None:
            codes, at = self._codes, slot * size
            for i in range(size):
                Q[x + i] = codes[at + i]
            for i in range(m):
                I[self._labels + i] = self._label_values[slot * m + i]
            return
        row = self._row
        files.seek(self._file, slot * self.record)
        if self._file.readinto(row) != self.record:
            raise InputError("the latent cache file lost slot %d" % slot)
        for i in range(size):
            Q[x + i] = row[i]
        for i in range(m):
            v = row[size + 2 * i] | (row[size + 2 * i + 1] << 8)
            if v >= self._classes:
                raise InputError("the latent cache file holds label %d in slot %d" % (v, slot))
            I[self._labels + i] = v

    def close(self):
        if self._file is not None:
            self._file.close()
            self._file = None
