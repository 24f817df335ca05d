# The latent cache of integer training (issue 22): when every trained parameter lies after a
# frozen prefix (the classifier alone, or the last block: pack --int8 without
# --train-biases), the prefix computes the same int8 codes for a sample in every epoch. The
# cache keeps, the first time a sample trains, the tensors alive across the step where the
# trained part begins (the prefix's output, the labels; the input too where the loss reads
# it, an autoencoder's) - the host finds that step and those tensors at pack time
# (pipeline/plan.py mark_latent) - and every later epoch writes them back and runs only the
# steps from there on: the prefix runs once per sample, not once per epoch. The steps are
# the train program's own, so the parameters end bit for bit as without the cache.
#
# Per sample, not per batch (every kept tensor is batch-major): batches drawn in a new order
# each epoch (microtrain.fit's shuffle) are served as well. Where the values live: in RAM
# (allocated once, within max_bytes) or, with `path`, in a file of fixed-size records on the
# board's flash (nothing but one sample's record in RAM). The file is scratch: it is
# rewritten by the first epoch of every run.
from array import array

from microtrain.blob import INT8, INT32, ROLE_LABEL, UINT8
from microtrain.errors import BlobError, InputError
from microtrain import files
from microtrain.intparams import integer_loss


class LatentCache:
    """module: a Module of an integer training blob with a frozen prefix; batches: how many
    batches of the blob's batch size m the cache holds (samples 0 .. batches * m - 1);
    path: keep them in that file instead of RAM; max_bytes: refuse a RAM cache larger than
    that (an InputError naming the bytes; a file takes any size).

    step(slot, x, labels, order=None) trains one batch: the samples slot * m .. slot * m +
    m - 1, or with `order` (a sequence of sample indices) the samples order[slot * m + k].
    With x, the whole train program runs and what the later steps read of the prefix's work
    is kept for each sample, with its label; with x None, the samples' values are written
    back and only the later steps run (labels is then not read). Returns the loss (as
    Module's call does)."""

    def __init__(self, module, batches, path=None, max_bytes=None):
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
        m = self.m = b.shapes[program.inputs[0]][0]
        # per sample, where each kept tensor's part lives: bytes in the int8 arena, ints in
        # the int32 one (the labels last: checked when read back from a file)
        self._bytes = []
        self._ints = []
        labels = []
        for tid in program.latent:
            if tid >= len(b.names) or tid in b.in_place or b.dtypes[tid] not in (
                    INT8, UINT8, INT32) or not b.shapes[tid] or b.shapes[tid][0] != m:
                raise BlobError("the train program's latent cache keeps tensor %d, which is "
                                "no batch-major int8 or int32 tensor of the arenas" % tid)
            span = (b.offsets[tid], b.sizes[tid] // m)
            if b.dtypes[tid] != INT32:
                self._bytes.append(span)
            elif b.roles[tid] == ROLE_LABEL:
                labels.append(span)
            else:
                self._ints.append(span)
        self._labels_from = sum(n for _, n in self._ints)
        self._ints += labels
        self.n_bytes = sum(n for _, n in self._bytes)      # per sample
        self.n_ints = sum(n for _, n in self._ints)
        self.module = module
        self.prefix = program.steps[:start]
        self.suffix = program.steps[start:]
        self.batches = int(batches)
        if self.batches < 1:
            raise InputError("a latent cache holds at least one batch")
        self.samples = self.batches * m
        self.record = self.n_bytes + 4 * self.n_ints   # per sample: the codes, then the ints
        self.bytes = self.samples * self.record        # what the cache keeps (RAM or file)
        if path is None and max_bytes is not None and self.bytes > max_bytes:
            raise InputError("a latent cache of %d samples takes %d bytes in RAM, more than "
                             "the %d allowed: keep it in a file (path)"
                             % (self.samples, self.bytes, max_bytes))
        self.filled = bytearray((self.samples + 7) >> 3)
        self._classes = b.num_classes
        self._file = None
        held = 1 if path is not None else self.samples   # one record, or every sample's
        self._codes = bytearray(self.n_bytes * held)
        self._values = array("i", bytes(4 * self.n_ints * held))
        if path is not None:
            self._file = open(path, "w+b")

    def step(self, slot, x, labels=None, order=None):
        m = self.m
        last = slot * m + m - 1
        if slot < 0 or last >= (self.samples if order is None else len(order)):
            raise InputError("batch %d outside the cache's %d batches" % (slot, self.batches)
                             if order is None else
                             "batch %d of the order outside its %d samples" % (slot, len(order)))
        module = self.module
        program = module._train
        F, I = module.F, module.I
        if x is not None:
            module._load_inputs(program, (x,) if len(program.inputs) == 1 else (x, labels))
            for kernel, args in self.prefix:
                kernel(F, I, args)
        for k in range(m):
            s = self._sample(slot, k, order)
            if not 0 <= s < self.samples:
                raise InputError("sample %d outside the cache's %d" % (s, self.samples))
            if x is not None:
                self._keep(s, k)
                self.filled[s >> 3] |= 1 << (s & 7)
            elif not (self.filled[s >> 3] >> (s & 7)) & 1:
                raise InputError("sample %d of the latent cache was never trained with its "
                                 "input" % s)
            else:
                self._restore(s, k)
        for kernel, args in self.suffix:
            kernel(F, I, args)
        return integer_loss(module, program)

    def holds(self, slot, order=None):
        """Whether every sample of the batch (as step takes it) is in the cache."""
        for k in range(self.m):
            s = self._sample(slot, k, order)
            if not (0 <= s < self.samples and (self.filled[s >> 3] >> (s & 7)) & 1):
                return False
        return True

    def _sample(self, slot, k, order):
        # row k of batch slot: its sample index (in order, or counted from the batch)
        at = slot * self.m + k
        return at if order is None else order[at]

    def _keep(self, sample, k):
        in_file = self._file is not None
        self._copy(sample, k, in_file, True)
        if in_file:
            files.seek(self._file, sample * self.record)
            self._file.write(self._codes)
            self._file.write(self._values)

    def _restore(self, sample, k):
        in_file = self._file is not None
        if in_file:
            files.seek(self._file, sample * self.record)
            if (self._file.readinto(self._codes) != self.n_bytes
                    or self._file.readinto(self._values) != 4 * self.n_ints):
                raise InputError("the latent cache file lost sample %d" % sample)
            if self._classes:
                self._check_labels(sample)
        self._copy(sample, k, in_file, False)

    def _copy(self, sample, k, in_file, keep):
        # the sample's part of the kept tensors (it is row k of the batch) between the
        # arenas and its record (in RAM: its place in the cache; with a file: the one
        # record buffer)
        at = 0 if in_file else sample * self.n_bytes
        for off, n in self._bytes:
            if keep:
                _move(self.module.blob.Q, off + k * n, self._codes, at, n)
            else:
                _move(self._codes, at, self.module.blob.Q, off + k * n, n)
            at += n
        at = 0 if in_file else sample * self.n_ints
        for off, n in self._ints:
            if keep:
                _move(self.module.I, off + k * n, self._values, at, n)
            else:
                _move(self._values, at, self.module.I, off + k * n, n)
            at += n

    def _check_labels(self, sample):
        # a file is outside our memory: its labels are class indices again before a kernel
        # indexes with them
        values = self._values
        for i in range(self._labels_from, self.n_ints):
            if not 0 <= values[i] < self._classes:
                raise InputError("the latent cache file holds label %d for sample %d"
                                 % (values[i], sample))

    def close(self):
        if self._file is not None:
            self._file.close()
            self._file = None


def _move(src, src_at, dst, dst_at, n):
    # (an element loop, not a slice: a step allocates nothing)
    for i in range(n):
        dst[dst_at + i] = src[src_at + i]
