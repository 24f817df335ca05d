# The latent cache of integer training (issue 22): when every trained parameter lies after a
# frozen prefix (the classifier alone, or the last block: pack --int8 without
# --train-biases), the prefix computes the same int8 codes for a sample in every epoch. The
# cache keeps, the first time a batch trains, the tensors alive across the step where the
# trained part begins (the prefix's output, the labels; the input too where the loss reads
# it, an autoencoder's) - the host finds that step and those tensors at pack time
# (pipeline/plan.py mark_latent) - and every later epoch writes them back and runs only the
# steps from there on: the prefix runs once per sample, not once per epoch. The steps are
# the train program's own, so the parameters end bit for bit as without the cache.
#
# Where the values live: in RAM (allocated once, `batches` records) or, with `path`, in a
# file of fixed-size records on the board's flash (nothing but one record in RAM). The
# file is scratch: it is rewritten by the first epoch of every run.
from array import array

from microtrain.blob import INT8, INT32, ROLE_LABEL, UINT8
from microtrain.errors import BlobError, InputError
from microtrain import files
from microtrain.intparams import integer_loss


class LatentCache:
    """module: a Module of an integer training blob with a frozen prefix; batches: how many
    training batches the cache holds (slot 0 .. batches - 1); path: keep them in that file
    instead of RAM.

    step(slot, x, labels) trains one batch: with x, the whole train program runs and what
    the later steps read of the prefix's work is kept in the slot, with the labels; with x
    None, the slot's values are written back and only the later steps run (labels is then
    not read). Returns the loss (as Module's call does)."""

    def __init__(self, module, batches, path=None):
        b = module.blob
        program = b.programs.get("train")
        if program is None or not b.integer_parameters:
            raise InputError("a latent cache needs an integer training blob (pack --int8)")
        start = program.latent_from
        if not start:
            raise InputError("a latent cache needs a blob whose trained layers all come after "
                             "frozen ones (pack --int8 with the classifier or --train-last N, "
                             "not --train-biases: the first layer's bias trains)")
        if start >= len(program.steps):
            raise BlobError("the train program's latent cache starts at step %d of %d"
                            % (start, len(program.steps)))
        # where each kept tensor lives: bytes in the int8 arena, ints in the int32 one
        self._bytes = []
        self._ints = []
        self._labels = []
        for tid in program.latent:
            if tid >= len(b.names) or tid in b.in_place or b.dtypes[tid] not in (
                    INT8, UINT8, INT32):
                raise BlobError("the train program's latent cache keeps tensor %d, which is "
                                "no int8 or int32 tensor of the arenas" % tid)
            span = (b.offsets[tid], b.sizes[tid])
            if b.dtypes[tid] != INT32:
                self._bytes.append(span)
            elif b.roles[tid] == ROLE_LABEL:
                self._labels.append(span)     # (checked again when read back from a file)
            else:
                self._ints.append(span)
        self._labels_from = sum(n for _, n in self._ints)   # the record's last ints
        self._ints += self._labels
        self.n_bytes = sum(n for _, n in self._bytes)
        self.n_ints = sum(n for _, n in self._ints)
        self.module = module
        self.prefix = program.steps[:start]
        self.suffix = program.steps[start:]
        self.batches = int(batches)
        if self.batches < 1:
            raise InputError("a latent cache holds at least one batch")
        self.record = self.n_bytes + 4 * self.n_ints   # per batch: the codes, then the ints
        self.bytes = self.batches * self.record     # what the cache keeps (RAM or file)
        self.filled = bytearray((self.batches + 7) >> 3)
        self._classes = b.num_classes
        self._file = None
        if path is None:
            self._codes = bytearray(self.n_bytes * self.batches)
            self._values = array("i", bytes(4 * self.n_ints * self.batches))
        else:
            self._codes = bytearray(self.n_bytes)       # one record's
            self._values = array("i", bytes(4 * self.n_ints))
            self._file = open(path, "w+b")

    def step(self, slot, x, labels=None):
        if not 0 <= slot < self.batches:
            raise InputError("slot %d outside the cache's %d batches" % (slot, self.batches))
        module = self.module
        program = module._train
        F, I = module.F, module.I
        if x is not None:
            module._load_inputs(program, (x,) if len(program.inputs) == 1 else (x, labels))
            for kernel, args in self.prefix:
                kernel(F, I, args)
            self._keep(slot)
            self.filled[slot >> 3] |= 1 << (slot & 7)
        else:
            if not (self.filled[slot >> 3] >> (slot & 7)) & 1:
                raise InputError("slot %d of the latent cache was never trained with its "
                                 "input" % slot)
            self._restore(slot)
        for kernel, args in self.suffix:
            kernel(F, I, args)
        return integer_loss(module, program)

    def _keep(self, slot):
        in_file = self._file is not None
        self._copy(slot, in_file, True)
        if in_file:
            files.seek(self._file, slot * self.record)
            self._file.write(self._codes)
            self._file.write(self._values)

    def _restore(self, slot):
        in_file = self._file is not None
        if in_file:
            files.seek(self._file, slot * self.record)
            if (self._file.readinto(self._codes) != self.n_bytes
                    or self._file.readinto(self._values) != 4 * self.n_ints):
                raise InputError("the latent cache file lost slot %d" % slot)
            if self._classes:
                self._check_labels(slot)
        self._copy(slot, in_file, False)

    def _copy(self, slot, in_file, keep):
        # the kept tensors between the arenas and the slot's record (in RAM: the slot's
        # place in the cache; with a file: the one record buffer)
        at = 0 if in_file else slot * self.n_bytes
        for off, n in self._bytes:
            if keep:
                _move(self.module.blob.Q, off, self._codes, at, n)
            else:
                _move(self._codes, at, self.module.blob.Q, off, n)
            at += n
        at = 0 if in_file else slot * self.n_ints
        for off, n in self._ints:
            if keep:
                _move(self.module.I, off, self._values, at, n)
            else:
                _move(self._values, at, self.module.I, off, n)
            at += n

    def _check_labels(self, slot):
        # a file is outside our memory: its labels are class indices again before a kernel
        # indexes with them
        values = self._values
        for i in range(self._labels_from, self.n_ints):
            if not 0 <= values[i] < self._classes:
                raise InputError("the latent cache file holds label %d in slot %d"
                                 % (values[i], slot))

    def close(self):
        if self._file is not None:
            self._file.close()
            self._file = None


def _move(src, src_at, dst, dst_at, n):
    # (an element loop, not a slice: a step allocates nothing)
    for i in range(n):
        dst[dst_at + i] = src[src_at + i]
