# Labelled samples captured on the board, kept in a file of fixed-size records within a byte
# budget: raw float32 inputs, or the int8 latent codes of a frozen prefix. Built to survive a
# power cut at any moment: a torn record is detected by its CRC-32 and dropped (counted, never
# misread), and a torn overwrite loses that one slot only. Once the budget is full a
# replacement policy decides what stays: reservoir sampling (every sample offered so far has
# the same chance to be kept) or class-balanced (a record of the most frequent class goes).
#
# File layout, all little-endian (docs/design.md, "Sample store"):
#   header   28 B   "MTSS", u16 version, u8 dtype, u8 policy, u32 record values,
#                   u16 classes (0: any label), u16 0, u32 budget, u32 seed, u32 CRC
#   state  2x12 B   u32 samples seen, u32 generator state, u32 CRC (two copies, written
#                   alternately, so that a torn one leaves the other)
#   records         u32 sequence number, u16 label, u16 0, the values, zero padding to 4 B,
#                   u32 CRC, each in a slot of its own, at most the budget's worth
# Every CRC is seeded with the header's, so a record or a state of another store (another
# geometry, another seed) does not pass as one of this store's.
# Appending writes the state (with the sample already counted) before the record: a power cut
# between the two loses only the sample being appended, and the state is never behind the
# records. Everything a resumed store needs (count, generator) is in the file, so a store
# reopened after a reboot continues as the uninterrupted one would have.
# Nothing is allocated per append or per record read: the file stays open, the record's head
# and tail are buffers allocated once, the values go from and to the caller's buffer.
import struct
from microtrain.crc32 import crc32
from microtrain.errors import MicrotrainError, InputError, const
from microtrain import files


class SampleError(MicrotrainError):
    """The sample file is not a sample store this runtime reads, or not the one asked for."""


MAGIC = b"MTSS"
VERSION = 1
HEADER_BYTES = const(28)
STATE_BYTES = const(12)
DATA_START = const(52)            # header + two state copies
RECORD_OVERHEAD = const(12)       # sequence, label, reserved, CRC
DTYPES = ("float32", "int8")
ITEM_BYTES = (4, 1)
POLICIES = ("reservoir", "balanced")
MAX_LABEL = const(65534)          # u16 labels; 65535 marks an empty slot in memory
_EMPTY = const(65535)
_MAX_BUDGET = const(16777216)     # 16 MiB: the index in RAM (2 bytes a slot) stays small
MAX_SEEN = const(1073741788)      # samples one store counts: the generator's span

# The generator: a Lehmer generator with a prime modulus below 2**30, stepped with Schrage's
# method so that no intermediate reaches 2**30 (a small int on 32-bit MicroPython: nothing is
# allocated), as Dropout's (kernels/norm.py). Integers only: the same draws on every port.
_M = const(1073741789)            # 2**30 - 35, prime; 31999 is a primitive root
_A = const(31999)
_Q = const(33555)                 # _M // _A
_R = const(15344)                 # _M % _A


def _step(s):
    s = _A * (s % _Q) - _R * (s // _Q)
    return s + _M if s < 0 else s


def seed_generator(seed):
    """The generator state a store created with `seed` starts from (in [1, _M - 1]). The
    seed's bytes go through a CRC first: a Lehmer generator started from 1, 2, 3... would
    draw correlated streams on boards given consecutive seeds."""
    s = 1 + crc32(struct.pack("<I", seed & 0xFFFFFFFF)) % (_M - 1)
    for _ in range(8):   # move small seeds away from small first draws
        s = _step(s)
    return s


def draw(s, n):
    """The generator's state after a uniform draw in [0, n) (n <= _M - 1): the draw is
    (state - 1) % n. By rejection: exact, with no modulo bias."""
    limit = (_M - 1) - (_M - 1) % n
    s = _step(s)
    while s - 1 >= limit:
        s = _step(s)
    return s


def _put32(buf, at, v):
    buf[at] = v & 0xFF
    buf[at + 1] = (v >> 8) & 0xFF
    buf[at + 2] = (v >> 16) & 0xFF
    buf[at + 3] = (v >> 24) & 0xFF


def _get32(buf, at):
    # Values of this store stay below 2**30, and so a small int, whenever the file is intact.
    return buf[at] | (buf[at + 1] << 8) | (buf[at + 2] << 16) | (buf[at + 3] << 24)


def _crc_matches(crc, buf, at):
    # Byte by byte: the stored CRC read as an int could be a long int on a 32-bit port.
    return (buf[at] == crc & 0xFF and buf[at + 1] == (crc >> 8) & 0xFF
            and buf[at + 2] == (crc >> 16) & 0xFF and buf[at + 3] == (crc >> 24) & 0xFF)


def record_bytes(record_values, dtype):
    """Bytes of one record: 12 of overhead, the values, padding to a multiple of 4."""
    values = record_values * ITEM_BYTES[DTYPES.index(dtype)]
    return 8 + (values + 3) // 4 * 4 + 4


def header(record_values, dtype, budget_bytes, policy, classes, seed):
    """The 28-byte header of a store of this geometry (its last 4 bytes are its CRC)."""
    h = struct.pack("<4sHBBIHHII", MAGIC, VERSION, DTYPES.index(dtype),
                    POLICIES.index(policy), record_values, classes, 0, budget_bytes, seed)
    return h + struct.pack("<I", crc32(h))


def _check_arguments(record_values, dtype, budget_bytes, policy, classes, seed):
    # The creator's arguments, in words, before anything is written.
    if dtype not in DTYPES:
        raise InputError("dtype must be 'float32' (raw inputs) or 'int8' (latent codes), "
                         "not %r" % (dtype,))
    if policy not in POLICIES:
        raise InputError("policy must be 'reservoir' or 'balanced', not %r" % (policy,))
    for name, value, low, high in (("record_values", record_values, 1, _MAX_BUDGET),
                                   ("budget_bytes", budget_bytes, 1, _MAX_BUDGET),
                                   ("seed", seed, 0, 0xFFFFFFFF)):
        if not isinstance(value, int) or not low <= value <= high:
            raise InputError("%s must be an integer from %d to %d, not %r"
                             % (name, low, high, value))
    if classes is not None and (not isinstance(classes, int) or not 1 <= classes <= 65535):
        raise InputError("classes must be None or an integer from 1 to 65535, not %r"
                         % (classes,))
    if policy == "balanced" and classes is None:
        raise InputError("the balanced policy needs the number of classes (classes=N)")
    need = DATA_START + record_bytes(record_values, dtype)
    if budget_bytes < need:
        raise InputError("a budget of %d bytes holds no record of %d %s values (it needs at "
                         "least %d bytes)" % (budget_bytes, record_values, dtype, need))


class SampleStore:
    """A sample store in the file `path`: created (atomically: header and state, no record)
    when the file is missing, opened when it exists - its header must then describe the same
    store. `record_values` values per sample, `dtype` 'float32' (array('f') buffers) or
    'int8' (array('b') or bytearray buffers); the whole file stays within `budget_bytes`.
    Labels are integers from 0 to 65534 (below `classes` when given).

    Open with load(path) to read a store without knowing its geometry, or to read it only."""

    def __init__(self, path, record_values=None, dtype="float32", budget_bytes=16384,
                 policy="reservoir", classes=None, seed=1, writable=True):
        self.path = files.path_of(path, InputError, "the sample store")
        if record_values is None:   # load(): the geometry is the header's
            self._open(writable)
            return
        _check_arguments(record_values, dtype, budget_bytes, policy, classes, seed)
        wanted = header(record_values, dtype, budget_bytes, policy, classes or 0, seed)
        if writable and not files.exists(self.path):
            first = bytearray(DATA_START)
            first[:HEADER_BYTES] = wanted
            self._salt = crc32(memoryview(first)[:24])
            s = seed_generator(seed)
            for copy in range(2):
                self._fill_state(first, HEADER_BYTES + copy * STATE_BYTES, 0, s)
            files.write_atomically(self.path, lambda f: f.write(first), SampleError,
                                   "sample store")
        self._open(writable)
        if self._header != wanted:
            found = _describe(self.record_values, self.dtype, self.budget_bytes,
                              self.policy, self.classes or 0, self.seed)
            self.close()
            raise SampleError("'%s' is a store of %s, not of %s" % (
                self.path, found, _describe(record_values, dtype, budget_bytes, policy,
                                            classes or 0, seed)))

    # -- opening ------------------------------------------------------------------------

    def _open(self, writable):
        self.writable = writable
        try:
            self.f = files.open_regular(self.path)   # not a directory, FIFO or device
            if writable:
                self.f.close()
                self.f = open(self.path, "r+b")
        except OSError as e:
            raise SampleError("cannot open sample store '%s': %s" % (self.path,
                                                                    files.reason(e)))
        try:
            self._read_header()
            self._scan()
        except BaseException:
            self.close()
            raise

    def _read_header(self):
        f, path = self.f, self.path
        size = f.seek(0, 2)
        h = bytearray(DATA_START)
        f.seek(0)
        got = f.readinto(h) if size else 0
        if got < 4 or h[0:4] != MAGIC:
            raise SampleError("'%s' is not a sample store (it does not start with MTSS)" % path)
        if got < DATA_START:
            raise SampleError("'%s' is %d bytes, shorter than a sample store's header and "
                              "state (%d bytes)" % (path, size, DATA_START))
        self._salt = crc32(memoryview(h)[:24])
        if not _crc_matches(self._salt, h, 24):
            raise SampleError("'%s': the sample store's header is corrupt (CRC mismatch)" % path)
        version = h[4] | h[5] << 8
        if version != VERSION:
            raise SampleError("'%s' is a sample store of version %d; this runtime reads version "
                              "%d" % (path, version, VERSION))
        for at, what, limit in ((6, "value type (0 float32, 1 int8)", 2),
                                (7, "replacement policy (0 reservoir, 1 balanced)", 2),
                                (14, "reserved byte (0)", 1), (15, "reserved byte (0)", 1)):
            if h[at] >= limit:
                raise SampleError("'%s': header byte %d is %d, not a %s" % (path, at, h[at],
                                                                          what))
        self.dtype, self.policy = DTYPES[h[6]], POLICIES[h[7]]
        values, classes, _, self.budget_bytes, self.seed = struct.unpack_from("<IHHII", h, 8)
        self.record_values, self.classes = values, classes or None
        try:
            _check_arguments(self.record_values, self.dtype, self.budget_bytes, self.policy,
                             self.classes, self.seed)
        except InputError as e:
            raise SampleError("'%s': the header describes no store this runtime keeps: %s"
                              % (path, e))
        self._header = bytes(h[:HEADER_BYTES])
        self.record_size = record_bytes(self.record_values, self.dtype)
        self.values_bytes = self.record_values * ITEM_BYTES[h[6]]
        self.capacity = (self.budget_bytes - DATA_START) // self.record_size
        self.seen, self.generator, self.state_copies = self._read_state(h)
        self._size = size

    def _read_state(self, h):
        # The newer of the two intact state copies: (seen, generator, copies intact).
        best, copies = None, 0
        for at in (HEADER_BYTES, HEADER_BYTES + STATE_BYTES):
            if not _crc_matches(crc32(memoryview(h)[at:at + 8], self._salt), h, at + 8):
                continue
            seen, s = _get32(h, at), _get32(h, at + 4)
            if seen > MAX_SEEN or not 1 <= s < _M:
                continue
            copies += 1
            if best is None or seen > best[0]:
                best = (seen, s)
        if best is None:
            return 0, 0, 0    # _scan takes the count from the records, the seed restarts
        return best[0], best[1], copies

    def _scan(self):
        # Every slot once: its label in memory (_EMPTY for an empty, torn or corrupt one).
        cap, rs = self.capacity, self.record_size
        from array import array
        try:
            self.labels = array("H", b"\xff\xff" * cap)    # all _EMPTY
            self.counts_by_label = array("i", bytes(4 * (self.classes or 0)))
        except MemoryError:
            raise SampleError("'%s': no room in RAM for the index of a store of %d records "
                              "(%d bytes)" % (self.path, cap, 2 * cap))
        self._head = bytearray(8)
        self._tail = bytearray(self.record_size - 8 - self.values_bytes)
        self._pad = memoryview(self._tail)[:len(self._tail) - 4]   # zeros the CRC covers
        self._state = bytearray(STATE_BYTES)
        self._state_body = memoryview(self._state)[:8]
        self._values = bytearray(self.values_bytes)   # scanning: values read here
        self._checked = None
        self.seq = -1
        stored = (self._size - DATA_START + rs - 1) // rs
        self.slots = min(stored, cap)     # slots holding bytes; the next appends use the rest
        self.dropped = stored - self.slots   # bytes past the budget: never records of ours
        self.count, self.holes, top = 0, 0, -1
        for slot in range(self.slots):
            label = self._read_record(slot, self._values)
            if label < 0:
                self.dropped += 1
                self.holes += 1
                continue
            self._keep(slot, label)
            if self.seq > top:
                top = self.seq
        if self.state_copies == 0 or top >= self.seen:
            # No intact state (both copies crafted or damaged) or one behind its records (a
            # crafted one; appending writes the state first): count from the records.
            self.seen = top + 1 if top >= self.seen else self.seen
            if self.state_copies == 0:
                self.generator = seed_generator(self.seed + self.seen)

    # -- records ------------------------------------------------------------------------

    def _read_record(self, slot, x):
        # The record in `slot` into x (values) and self.seq; its label, or -1 when the slot
        # is empty, torn or corrupt (x then holds whatever was read).
        f, head, tail = self.f, self._head, self._tail
        files.seek(f, DATA_START + slot * self.record_size)   # (not f.seek: littlefs)
        if f.readinto(head) != 8 or f.readinto(x) != self.values_bytes \
                or f.readinto(tail) != len(tail):
            return -1
        crc = crc32(x, crc32(head, self._salt))
        n = len(tail) - 4
        if n:
            crc = crc32(self._pad, crc)
        if not _crc_matches(crc, tail, n):
            return -1
        label = head[4] | (head[5] << 8)
        if head[6] or head[7] or label >= (self.classes or _EMPTY) or head[3] >= 64:
            return -1    # a reserved byte set, a label or a sequence number out of range
        for i in range(n):
            if tail[i]:
                return -1
        self.seq = _get32(head, 0)
        return label

    def _keep(self, slot, label):
        self.labels[slot] = label
        self.count += 1
        if self.classes is not None:
            self.counts_by_label[label] += 1

    def _fill_state(self, buf, at, seen, s, view=None):
        # view: buf[at:at + 8] made once (the appends' own state buffer)
        _put32(buf, at, seen)
        _put32(buf, at + 4, s)
        view = memoryview(buf)[at:at + 8] if view is None else view
        _put32(buf, at + 8, crc32(view, self._salt))

    def _check_buffer(self, x):
        # Once per buffer object (the caller reuses one): its bytes are one record's values.
        if x is self._checked:
            return
        if not isinstance(x, (bytes, bytearray)) and type(x).__name__ != "array" \
                or len(bytes(x)) != self.values_bytes:
            raise InputError("a sample of this store is %d %s values: give %s" % (
                self.record_values, self.dtype,
                "array('f') of %d" % self.record_values if self.dtype == "float32"
                else "array('b') or a bytearray of %d" % self.record_values))
        self._checked = x

    # -- appending ----------------------------------------------------------------------

    def append(self, label, x):
        """Offer one sample (label, values x): the slot it is written to, or -1 when the
        policy does not keep it. The file is flushed before this returns."""
        if not isinstance(label, int) or not 0 <= label <= MAX_LABEL \
                or (self.classes is not None and label >= self.classes):
            raise InputError("a label of this store is an integer from 0 to %d, not %r"
                             % ((self.classes or MAX_LABEL + 1) - 1, label))
        if not self.writable:
            raise SampleError("sample store '%s' is open for reading only" % self.path)
        self._check_buffer(x)
        if self.seen >= MAX_SEEN:
            raise SampleError("sample store '%s' has counted %d samples, as many as one store "
                              "counts: start a new one" % (self.path, self.seen))
        slot = self._choose(label)
        n = self.seen
        try:
            # The state first: a power cut before the record is written then costs this
            # sample only, and the count never falls behind the records.
            self.seen = n + 1
            self._fill_state(self._state, 0, n + 1, self.generator, self._state_body)
            f = self.f
            f.seek(HEADER_BYTES + (n & 1) * STATE_BYTES)
            f.write(self._state)
            f.flush()
            if slot < 0:
                return -1
            self._forget(slot)
            head, tail = self._head, self._tail
            _put32(head, 0, n)
            head[4] = label & 0xFF
            head[5] = label >> 8
            head[6] = head[7] = 0
            k = len(tail) - 4
            for i in range(k):
                tail[i] = 0
            crc = crc32(x, crc32(head, self._salt))
            _put32(tail, k, crc32(self._pad, crc) if k else crc)
            f.seek(DATA_START + slot * self.record_size)
            f.write(head)
            f.write(x)
            f.write(tail)
            f.flush()
        except OSError as e:
            raise SampleError("cannot write sample store '%s': %s" % (self.path,
                                                                     files.reason(e)))
        self.holes -= 1
        self._keep(slot, label)
        return slot

    def _forget(self, slot):
        # The slot is a hole until its new record is written whole.
        old = self.labels[slot]
        if old != _EMPTY:
            self.labels[slot] = _EMPTY
            self.count -= 1
            if self.classes is not None:
                self.counts_by_label[old] -= 1
            self.holes += 1
        elif slot >= self.slots:
            self.slots = slot + 1
            self.holes += 1

    def _choose(self, label):
        # The slot the next sample goes to, or -1. First a slot that holds nothing readable
        # (a torn or corrupt record), then the free ones, then the policy's choice.
        if self.holes:
            labels = self.labels
            for slot in range(self.slots):
                if labels[slot] == _EMPTY:
                    return slot
        if self.slots < self.capacity:
            return self.slots
        if self.policy == "reservoir":
            # Algorithm R: the n-th sample (from 0) is kept with probability capacity/(n+1),
            # in a slot drawn uniformly: every sample offered stays with the same chance.
            j = self._below(self.seen + 1)
            return j if j < self.capacity else -1
        counts = self.counts_by_label
        largest = 0
        for c in range(len(counts)):
            if counts[c] > counts[largest]:
                largest = c
        if counts[label] == counts[largest]:
            # The sample's class is one of the largest: it stays with the reservoir's chance,
            # in place of a record of its own class, so that its class does not grow.
            if self._below(self.seen + 1) >= self.capacity:
                return -1
            largest = label
        # In place of a record, drawn uniformly, of the largest class.
        k = self._below(counts[largest])
        labels = self.labels
        for slot in range(self.capacity):
            if labels[slot] == largest:
                if k == 0:
                    return slot
                k -= 1
        return -1  # not reached: the counts are those of the slots

    def _below(self, n):
        # A uniform draw in [0, n) (n <= _M - 1)
        self.generator = draw(self.generator, n)
        return (self.generator - 1) % n

    # -- reading ------------------------------------------------------------------------

    def read(self, slot, x):
        """The label of the record in `slot` (0 <= slot < capacity) with its values read into
        x, or -1 when the slot holds no intact record (x then holds whatever was there).
        self.seq is the record's sequence number: the how-many-th sample it was."""
        self._check_buffer(x)
        if not 0 <= slot < self.slots:
            return -1
        return self._read_record(slot, x)

    def records(self, x):
        """Every intact record, slot by slot: yields its label, its values in x, its sequence
        number in self.seq. Reads the file again, checking each CRC; allocates nothing per
        record."""
        self._check_buffer(x)
        for slot in range(self.slots):
            label = self._read_record(slot, x)
            if label >= 0:
                yield label

    def counts(self):
        """Records kept per label: a list indexed by label (its length: classes, or the
        largest label + 1)."""
        if self.classes is not None:
            return list(self.counts_by_label)
        out = []
        for slot in range(self.slots):
            label = self.labels[slot]
            if label != _EMPTY:
                while len(out) <= label:
                    out.append(0)
                out[label] += 1
        return out

    def __len__(self):
        return self.count

    def close(self):
        f, self.f = getattr(self, "f", None), None
        if f is not None:
            f.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


def load(path, writable=False):
    """The sample store in the file `path`, its geometry from its header: to read it (the
    host, a program that does not know the geometry), or with writable=True to append."""
    return SampleStore(path, writable=writable)


def _describe(record_values, dtype, budget_bytes, policy, classes, seed):
    return "%d %s values per record, %d bytes, %s%s, seed %d" % (
        record_values, dtype, budget_bytes, policy,
        " over %d classes" % classes if classes else "", seed)
