# Reader for the .mtb blob written by the host (schema: host/microtrain_host/schema/
# microtrain.fbs). File layout: u32 N, then an N-byte FlatBuffer whose identifier is
# "MTRB", then the CRC-32 of those N bytes. Everything is validated here, once, so that
# kernels can trust their arguments.
import gc
import struct
from array import array
from microtrain.crc32 import crc32
from microtrain.errors import BlobError, InputError, OutOfMemoryError
from microtrain.flatbuf import Reader
from microtrain.opcodes import SIGNATURES, kernel_module
from microtrain.stepcheck import NO_TENSOR, StepCheck

IDENTIFIER = b"MTRB"
FORMAT_VERSION = 1
FLOAT = 0
INT32 = 1
INT8 = 2                   # int8 and uint8 tensors live in the byte arena (a bytearray)
UINT8 = 3
ITEM_BYTES = (4, 4, 1, 1)  # by dtype
_HUGE = 3e38               # about float32's largest
_BELOW_ONE = 0.99999994    # float32's largest value below 1
ROLE_NAMES = ("input", "label", "param", "grad", "activation", "optimizer_state",
              "constant", "control")
_LABEL = 1                 # ROLE_NAMES.index("label")
_PARAM = 2
_COPY = 0x80000000         # inference template cut kind: copy bytes of the training blob


class Program:
    def __init__(self, name, steps, inputs, outputs):
        self.name = name
        self.steps = steps      # [(kernel, args)]
        self.inputs = inputs    # tensor ids
        self.outputs = outputs  # tensor ids


class Blob:
    """A parsed model: tensor table, parameters, programs and hyperparameters."""

    def __init__(self):
        self.names = []
        self.dtypes = []
        self.roles = []
        self.shapes = []
        self.offsets = []
        self.sizes = []
        self.constants = []     # (tensor id, raw little-endian bytes or, read by
                                # load_into_arenas, the data's place in the file); None
                                # once in the arena
        self.parameters = []    # (param tensor id, grad tensor id or -1, state tensor ids)
        self.updated_in_backward = ()  # param tensor ids trained without a gradient
                                       # buffer (program backward_update updates them)
        self.programs = {}
        self.float_arena = 0
        self.int_arena = 0
        self.byte_arena = 0     # bytes of the int8 / uint8 arena (0 in blobs without one)
        self.Q = None           # that arena once allocated (load_into_arenas)
        self.loss = ""
        self.num_classes = 0
        self.optimizer = {}
        self.naive_size = 0     # float elements without arena sharing (for inspect)
        self.lower_bound = 0    # float elements no plan can go below (for inspect)
        self.full_training_arena = 0  # with frozen parameters: the arena if all trained
        self.full_training_steps = 0  # ... and its train program's step count (inspect)
        self.source_opset = 0   # the opset of a model upgraded on load (0: not upgraded)
        self.step_records = {}  # program -> [(op, tensor ids, ints, floats)] when kept
        self.alias_of = []      # per tensor, with the steps: -1 or the tensor it aliases
        self.inference = None   # InferenceTemplate: (position in the file, length, cuts,
                                # [(output name, tensor id)], copies), for microtrain.export
        self.quant = {}         # tensor id -> (scales, zero points, axis) of a quantized
                                # INT8 / UINT8 tensor (blobs that store them)
        self.derived = {}       # tensor id -> its given first elements, of a CONSTANT whose
                                # rest the step reading it computes at load (then removed)
        self.crc = 0            # the file's CRC-32, to notice a blob replaced since load
        self._file = None       # the file's bytes while it is parsed (constant_data)
        self.integer_parameters = False  # int8 / int32 parameters trained in integers: the
                                         # train / eval loss is then int32 (kernels/inttrain.py)
        self.int_rates = []     # the inttrain update steps' multipliers (set_learning_rate)
        self.int_derived = {}   # inttrain's derived tensors computed so far -> their size
        self.int_units = {}     # inttrain: gradient tensor -> its real unit (at load)
        self.in_place = set()   # int8 constants the kernels read where the blob is (the
                                # weights of int8 Gemm / Conv: no arena space); their offsets
                                # index self.weights
        self.weights = None     # that buffer: the blob itself when it was given as a buffer
                                # (in flash), else a bytearray of those constants
        self.weights_size = 0   # ... of weights_size bytes (a blob loaded from a file)
        self._arenas = None     # (F, I, Q) while a blob given as a buffer is parsed (derive)

    def is_trainable(self, tensor, grad):
        # A parameter entry trains when it has a gradient buffer or is updated in the
        # backward pass (update_in_backward: no buffer), or is an integer one (updated by
        # the train program's inttrain steps).
        return grad >= 0 or tensor in self.updated_in_backward or self.dtypes[tensor] != FLOAT

    def constant_data(self, tid):
        """The little-endian bytes of constant tid, or None: for the kernels' checks, which
        run while the blob is parsed (load_into_arenas notes the place of a constant in
        the file and reads it into the arena only after the checks)."""
        for t, raw in self.constants:
            if t == tid:
                if isinstance(raw, int):
                    return bytes(self._file[raw:raw + ITEM_BYTES[self.dtypes[t]] * self.sizes[t]])
                return raw
        return None

    def derive(self, tid, raw):
        """Constant tid's contents, computed by a kernel's check at load: straight into its
        arena when the arenas are there already (a blob given as a buffer), else kept until
        they are (the file's second pass)."""
        if self._arenas is None:
            self.constants.append((tid, raw))
        else:
            F, I, Q = self._arenas
            _put(self, tid, 0, raw, len(raw), F, I, Q)

    def tensor_id(self, name):
        try:
            return self.names.index(name)
        except ValueError:
            raise BlobError("the blob has no tensor named '%s'" % name)


def zeros(typecode, n):
    """A zeroed array of n elements, e.g. an arena. array(typecode, bytes(4 * n)) would
    briefly need twice the memory; an iterable with a length is allocated once at its
    final size, then zeroed."""
    a = array(typecode, range(n))
    zero = 0.0 if typecode == "f" else 0
    for i in range(n):
        a[i] = zero
    return a


def read_file(path, padded=False):
    """(bytes, the path read): `path`, or path.bak when `path` cannot be read. A board
    whose filesystem cannot rename over a file moves the previous file to path.bak while it
    replaces it (checkpoint.write_atomically); a power cut there leaves only path.bak.
    Raises the OSError of `path` when neither can be read. padded (load_into_arenas): a view
    of a buffer as large as the arenas the blob states, if the heap has that room."""
    try:
        with open(path, "rb") as f:
            return _read_whole(f, padded), path
    except OSError as e:
        try:
            with open(path + ".bak", "rb") as f:
                return _read_whole(f, padded), path + ".bak"
        except OSError:
            raise e


def _read_whole(f, padded=False):
    # One buffer of the file's size. f.read() grows its buffer while reading: on a board's
    # small heap the copies it leaves behind put the bytes mid-hole, where the arena that
    # Module allocates next no longer fits.
    size = f.seek(0, 2)
    room = _stated_arenas(f, size) if padded else 0
    f.seek(0)
    try:
        data = bytearray(max(size, room))
    except MemoryError:     # no hole that large: the arenas will not fit either, which
        room = 0            # load_into_arenas then reports with the bytes they need
        data = bytearray(size)
    view = memoryview(data)
    got = 0
    while got < size:
        n = f.readinto(view[got:size])
        if not n:
            return data[:got]  # the file shrank while being read
        got += n
    return view[:size] if room > size else data


def _stated_arenas(f, size):
    # The bytes of arenas the blob's root table states, read from the file's first bytes
    # (a FlatBuffer's root table is written last: it is near the front), capped by the free
    # heap; 0 when unknown, and on CPython. Only where to put the file (load_into_arenas):
    # the stated sizes are checked once the blob is parsed.
    if not hasattr(gc, "mem_free"):
        return 0
    try:
        f.seek(0)
        r = Reader(memoryview(f.read(min(size, 512))), BlobError, start=4)
        root = r.root()
        room = 4 * (r.scalar(root, 5, "I", 0) + r.scalar(root, 6, "I", 0)) \
            + r.scalar(root, 16, "I", 0) + r.scalar(root, 17, "I", 0)
    except Exception:   # a hint only: a broken file is reported by the parse
        return 0
    gc.collect()
    return min(room, gc.mem_free())


def read(path):
    try:
        return read_file(path)[0]
    except OSError as e:
        raise BlobError("cannot read blob '%s': %s" % (path, e))


def load(path_or_bytes, keep_steps=False):
    data = path_or_bytes if is_buffer(path_or_bytes) else read(path_or_bytes)
    return parse(data, keep_steps)


def is_buffer(source):
    """True for a blob given as a buffer (bytes, bytearray, memoryview: in flash), False for
    a path (a str, or on CPython any path-like object)."""
    if isinstance(source, str):
        return False
    try:
        memoryview(source)
    except TypeError:
        return False
    return True


def describe(source):
    """How messages name a blob: its path, or the buffer it was given as."""
    return "the %d-byte blob buffer" % len(source) if is_buffer(source) else source


def load_into_arenas(source):
    """(blob, float arena, int arena) of the blob at source, its constants copied in.
    source is the blob file's path, or the blob itself as a buffer - bytes, or a memoryview
    of a file in a board's ROM filesystem or of a frozen bytes object: the blob in flash,
    whose int8 weights the kernels then read in place, taking no heap.
    The file and the arenas are never in the heap together (on a board they would not fit:
    the int8 DS-CNN is a 32 KB file for 47 KB of arenas): the file is read, checked and
    parsed, its constants noted by their place in the file; the file's bytes are dropped,
    the arenas allocated - the largest blocks, before the blob's many small objects can
    fragment a small heap any further - and the file read again in small chunks straight
    into them, its CRC-32 checked again so that a file replaced in between is refused."""
    if is_buffer(source):
        return _load_buffer(source)
    path = source
    b, size, floats, ints, nbytes = _parse_file(path)
    b.quant = {}        # the scales served the checks (derived multipliers); not needed now
    F, I, Q, b.weights = _arenas(path, floats, ints, nbytes, b.weights_size)
    _read_constants(path, b, size, F, I, Q)
    _arenas_into_steps(b, Q)
    return b, F, I


def _load_buffer(data):
    # The blob as a buffer: parsed where it is (no copy), its int8 weights left there, the
    # other constants copied into the arenas. The arenas are allocated first, at the bottom
    # of a collected heap, before the parse's garbage can leave no hole as large as them.
    view = memoryview(data)
    what = describe(data)
    try:
        r, root = _root(view)
        floats, ints, nbytes = _arena_sizes(r, root)
    except MemoryError:
        raise OutOfMemoryError("%s: no room to check its frame" % what)
    F, I, Q, _ = _arenas(what, floats, ints, nbytes, 0)
    try:
        b = _parse_root(r, root, view, False, Q, True, view, (F, I, Q))
    except MemoryError:
        raise OutOfMemoryError("the blob parsed from %s needs more than the %s bytes the heap "
                               "has free besides its arenas" % (what, _mem_free()))
    r = root = None
    b.quant = {}        # the scales served the checks (derived multipliers); not needed now
    b._arenas = None
    for tid, pos in b.constants:    # each noted by its place in the buffer
        n = ITEM_BYTES[b.dtypes[tid]] * b.sizes[tid]
        for at in range(0, n, _CHUNK):
            _put(b, tid, at, view[pos + at:pos + min(n, at + _CHUNK)], min(_CHUNK, n - at),
                 F, I, Q)
    b.Q = Q
    b.constants = None  # in the arenas now
    return b, F, I


def _arenas(what, floats, ints, nbytes, weights):
    # The float, int and byte arenas and the buffer of `weights` bytes of int8 weights (a
    # blob file's), each allocated once, the largest first (into the file's place).
    _compact()
    made = [None, None, None, None]
    try:
        # largest first (a small heap has few holes that large): F, I, Q, W by their
        # bytes, the kind in the two low bits
        for key in sorted((4 * floats * 4, 4 * ints * 4 + 1, nbytes * 4 + 2, weights * 4 + 3),
                          reverse=True):
            kind = key & 3
            made[kind] = (zeros("f", floats) if kind == 0 else zeros("i", ints) if kind == 1
                          else bytearray(nbytes if kind == 2 else weights))
    except MemoryError:
        raise OutOfMemoryError("'%s' needs %d bytes of arenas (%d floats, %d ints%s%s) "
                               "besides the parsed blob; the heap has %s bytes free (each "
                               "arena needs one contiguous block)"
                               % (what, 4 * (floats + ints) + nbytes + weights, floats, ints,
                                  ", %d int8 bytes" % nbytes if nbytes else "",
                                  ", %d bytes of int8 weights (a blob given as a buffer in "
                                  "flash reads them in place)" % weights if weights else "",
                                  _mem_free()))
    return made


def _arenas_into_steps(b, Q):
    # The byte kernels' args were parsed with stand-ins for the byte arena (first, and last
    # for a weight in the arena) and the weights' buffer of a blob file (last).
    for steps in b.programs.values():
        steps = steps.steps
        for k in range(len(steps)):
            kernel, args = steps[k]
            if args and args[0] is _LATER:
                args = list(args)
                args[0] = Q
                if args[-1] is _LATER:
                    args[-1] = Q
                elif args[-1] is _WEIGHTS:
                    args[-1] = b.weights
                steps[k] = (kernel, tuple(args))
    b.Q = Q
    b.constants = None  # in the arenas now


# MicroPython: a collection restarts allocation at the heap's bottom, so the parsed blob's
# objects pack together there instead of spreading over the heap with the garbage parsing
# makes, which would leave no hole as large as an arena. CPython needs no help.
_compact = gc.collect if hasattr(gc, "mem_alloc") else (lambda: None)


def _parse_file(path):
    # (blob, file size, arena sizes) of the file at path, its constants noted by their place
    # in the file. A function of its own: once it returns, no stale slot of a running
    # frame can keep the file's bytes from the garbage collector (MicroPython scans frames
    # conservatively).
    try:
        # the file is read into a buffer as large as the arenas (when the heap has the
        # room), at the bottom of the heap: the parsed blob's objects then pack above it,
        # and the arenas take its place once it is dropped, instead of looking for holes
        # between those objects.
        _compact()
        try:
            data = read_file(path, True)[0]
        except OSError as e:
            raise BlobError("cannot read blob '%s': %s" % (path, e))
        r, root = _root(data)
        floats, ints, nbytes = _arena_sizes(r, root)
        return (_parse_root(r, root, data, False, _LATER, True), len(data), floats, ints,
                nbytes)
    except MemoryError:
        data = r = root = None
        raise OutOfMemoryError("'%s' does not fit in the heap: its %s-byte file and the blob "
                               "parsed from it need more than %s bytes free"
                               % (path, _file_size(path), _mem_free()))


_LATER = bytearray(0)   # the byte arena until it is allocated (load_into_arenas)
_WEIGHTS = bytearray(0)  # the weights' buffer of a blob file until it is allocated
_CHUNK = 256            # bytes read at a time in the second pass


def _read_constants(path, b, size, F, I, Q):
    # Second pass over the file: CRC-32 of the FlatBuffer as it streams by through a small
    # chunk, each constant - noted by its place in the file - copied into its arena on the
    # way (int8 ones read straight into the byte arena), in file order.
    places = []
    for tid, raw in b.constants:
        if isinstance(raw, int):
            places.append((raw, tid))
        else:           # computed at load (derived requantization multipliers)
            _put(b, tid, 0, raw, len(raw), F, I, Q)
    places.sort()
    end = 0
    for pos, tid in places:     # one pass over the file: no constant can read another's data
        if pos < end:
            raise BlobError("'%s': constant '%s' shares its data with another constant (the "
                            "loader reads a blob file's constants in one pass)"
                            % (path, b.names[tid]))
        end = pos + ITEM_BYTES[b.dtypes[tid]] * b.sizes[tid]
    chunk = bytearray(_CHUNK)
    view = memoryview(chunk)
    try:
        with open(path, "rb") as f:
            if f.seek(0, 2) != size:
                raise BlobError("'%s' changed while it was being loaded" % path)
            f.seek(4)
            crc, at = 0, 4
            for pos, tid in places:
                crc = _stream(f, view, crc, at, pos, None)
                at = pos + ITEM_BYTES[b.dtypes[tid]] * b.sizes[tid]
                if b.dtypes[tid] in (INT8, UINT8):
                    into = memoryview(b.weights if tid in b.in_place else Q)[
                        b.offsets[tid]:b.offsets[tid] + b.sizes[tid]]
                    if f.readinto(into) != len(into):
                        raise BlobError("'%s' changed while it was being loaded" % path)
                    crc = crc32(into, crc)
                else:
                    crc = _stream(f, view, crc, pos, at, (b, tid, F, I, Q))
            crc = _stream(f, view, crc, at, size - 4, None)
            if f.readinto(view[:4]) != 4:
                raise BlobError("'%s' changed while it was being loaded" % path)
    except OSError as e:
        raise BlobError("cannot read blob '%s': %s" % (path, e))
    if crc & 0xFFFFFFFF != b.crc or struct.unpack_from("<I", chunk, 0)[0] != b.crc:
        raise BlobError("'%s' changed while it was being loaded" % path)


def _stream(f, view, crc, at, end, into):
    # CRC-32 of the file's bytes [at, end), read through view; with into = (blob, tensor
    # id, arenas): those bytes are the tensor's constant, copied into its arena (chunks are
    # multiples of 4 bytes from its start: whole elements).
    start = at
    while at < end:
        got = f.readinto(view[:min(len(view), end - at)])
        if not got or (into and got % 4):
            raise BlobError("the blob file changed while it was being loaded")
        crc = crc32(view[:got], crc)
        if into:
            _put(into[0], into[1], at - start, view[:got], got, into[2], into[3], into[4])
        at += got
    return crc


def _put(b, tid, at, raw, nbytes, F, I, Q):
    # Little-endian bytes raw (nbytes of them) into tensor tid's arena slice from byte at
    off = b.offsets[tid] + at // ITEM_BYTES[b.dtypes[tid]]
    dtype = b.dtypes[tid]
    if dtype == FLOAT:
        F[off:off + nbytes // 4] = array("f", bytes(raw))
    elif dtype == INT32:
        I[off:off + nbytes // 4] = array("i", bytes(raw))
    else:
        Q[off:off + nbytes] = raw


def _file_size(path):
    try:
        with open(path, "rb") as f:
            return f.seek(0, 2)
    except (OSError, MemoryError):
        return "?"


def _mem_free():
    try:
        import gc
        return gc.mem_free()
    except AttributeError:  # CPython
        return "an unknown number of"


def _arena_sizes(r, root):
    """The arena sizes (floats, ints, bytes) the root table states, checked against what its
    tensor table needs before anything that large is allocated: a blob whose size fields
    were altered must not make the device allocate whatever they say."""
    floats = r.scalar(root, 5, "I", 0)
    ints = r.scalar(root, 6, "I", 0)
    nbytes = r.scalar(root, 16, "I", 0)
    weights = r.scalar(root, 17, "I", 0)
    need = [0, 0, 0]
    in_place = 0
    for t in r.tables(root, 2, "tensor"):
        if r.scalar(t, 13, "B", 0):
            in_place += r.scalar(t, 5, "I", 0)
            continue    # in place: in no arena
        dtype = r.scalar(t, 1, "B", 0)
        end = r.scalar(t, 4, "I", 0) + r.scalar(t, 5, "I", 0)
        arena = 2 if dtype in (INT8, UINT8) else dtype
        if dtype <= UINT8 and end > need[arena]:
            need[arena] = end
    for stated, needed, kind in ((floats, need[0], "float"), (ints, need[1], "int"),
                                 (nbytes, need[2], "byte")):
        if stated != needed:
            raise BlobError("the %s arena is %d elements, its tensors need %d"
                            % (kind, stated, needed))
    if weights != in_place:
        raise BlobError("the blob states %d bytes of weights read in place, its tensors hold "
                        "%d" % (weights, in_place))
    return floats, ints, nbytes


def copy_inputs(b, F, I, program, inputs, classes):
    """Copy one flat sequence per input of `program` into the arenas. With classes > 0,
    labels must be class indices in [0, classes); other int inputs (Gather's indices) are
    checked by the kernels that read them."""
    tids = program.inputs
    if len(inputs) != len(tids):
        raise InputError("the %s program takes %d inputs (%s), got %d"
                         % (program.name, len(tids), ", ".join(b.names[t] for t in tids),
                            len(inputs)))
    for k in range(len(tids)):  # an index loop: zip() would allocate a tuple per input
        tid = tids[k]
        values = inputs[k]
        off, n = b.offsets[tid], b.sizes[tid]
        if len(values) != n:
            raise InputError("input '%s' needs %d values (shape %r), got %d"
                             % (b.names[tid], n, b.shapes[tid], len(values)))
        if b.dtypes[tid] == INT32:
            label = classes if b.roles[tid] == _LABEL else 0
            for i in range(n):
                v = values[i]
                if label and not 0 <= v < label:
                    raise InputError("label %r at position %d of '%s' is not a class index "
                                     "in [0, %d)" % (v, i, b.names[tid], classes))
                I[off + i] = int(v)
        elif b.dtypes[tid] != FLOAT:
            # an int8 / uint8 input (already quantized: integer training) into the byte arena
            Q = b.Q
            low = -128 if b.dtypes[tid] == INT8 else 0
            for i in range(n):
                v = values[i]
                if not low <= v <= low + 255:
                    raise InputError("value %r at position %d of '%s' is outside the %s range"
                                     % (v, i, b.names[tid], "int8" if low else "uint8"))
                Q[off + i] = v & 255
        else:
            for i in range(n):
                F[off + i] = values[i]


def program(b, uri, name, default_uri):
    """Program `name` of blob b, or of the blob at uri when it is another file; that file
    must have been packed from the same model (same tensor table)."""
    if uri is not None and uri is not default_uri and uri != default_uri:
        other = load(uri)
        if other.names != b.names or other.offsets != b.offsets:
            raise BlobError("'%s' and '%s' were not packed from the same model"
                            % (describe(uri), describe(default_uri)))
        b = other
    if name not in b.programs:
        raise BlobError("'%s' has no %s program" % (describe(uri or default_uri), name))
    return b.programs[name]


def _root(data):
    # Check the frame (size, identifier, CRC-32) and the format version; return the reader
    # and the root table. The CRC is computed once per load: the fallback crc32 is slow.
    _check_frame(data)
    r = Reader(memoryview(data)[:len(data) - 4], BlobError, start=4)
    root = r.root()
    version = r.scalar(root, 0, "H", 0)
    if version != FORMAT_VERSION:
        raise BlobError("blob format version %d is not supported by this runtime (it reads %d);"
                        " repack the model with a matching microtrain" % (version, FORMAT_VERSION))
    return r, root


def _check_frame(data):
    if len(data) < 12:
        raise BlobError("truncated: a blob is at least 12 bytes, this one has %d" % len(data))
    size = struct.unpack_from("<I", data, 0)[0]
    if bytes(data[8:12]) != IDENTIFIER:
        raise BlobError("not a microtrain blob: identifier %r, expected %r"
                        % (bytes(data[8:12]), IDENTIFIER))
    if 4 + size + 4 != len(data):
        raise BlobError("truncated or padded: header says %d bytes, file has %d"
                        % (4 + size + 4, len(data)))
    stored = struct.unpack_from("<I", data, 4 + size)[0]
    if crc32(memoryview(data)[4:4 + size]) & 0xFFFFFFFF != stored:
        raise BlobError("corrupt: CRC-32 of the blob does not match")


def parse(data, keep_steps=False):
    """Validate and parse a blob. keep_steps also keeps each step's tensor ids (for tools).
    Its steps get an empty byte arena: run a blob loaded with load_into_arenas."""
    r, root = _root(data)
    return _parse_root(r, root, data, keep_steps, bytearray(0))


def _parse_root(r, root, data, keep_steps, Q, in_file=False, weights=None, arenas=None):
    # weights: the buffer int8 weights are read from in place (the blob's own, as a buffer),
    # or None: one bytearray of them (load_into_arenas allocates it). arenas: (F, I, Q)
    # when they are allocated already (Blob.derive)
    b = Blob()
    b._file = data
    b.weights = weights
    b._arenas = arenas
    b.float_arena, b.int_arena, b.byte_arena = _arena_sizes(r, root)
    b.loss = r.string(root, 7, "loss")
    b.num_classes = r.scalar(root, 8, "I", 0)
    b.naive_size = r.scalar(root, 10, "I", 0)
    b.lower_bound = r.scalar(root, 11, "I", 0)
    b.full_training_arena = r.scalar(root, 12, "I", 0)
    b.full_training_steps = r.scalar(root, 13, "I", 0)
    b.source_opset = r.scalar(root, 15, "H", 0)
    _read_tensors(r, root, b, keep_steps, in_file)
    _read_parameters(r, root, b)
    _read_optimizer(r, root, b)
    _read_inference(r, root, b)
    b.crc = struct.unpack_from("<I", data, len(data) - 4)[0]
    for t in r.tables(root, 4, "program"):
        name = r.string(t, 0, "program name")
        records = [] if keep_steps else None
        if keep_steps:
            b.step_records[name] = records
        b.programs[name] = Program(name, _read_steps(r, t, b, name, records, Q),
                                   _ids(r, t, 2, b, name + " inputs"),
                                   _ids(r, t, 3, b, name + " outputs"))
    b._file = None      # let the file's bytes go
    if b.derived:
        raise BlobError("derived constant '%s' is computed by no step"
                        % b.names[list(b.derived)[0]])
    if bool(b.updated_in_backward) != ("backward_update" in b.programs) or (
            "backward_update" in b.programs and "train" not in b.programs):
        raise BlobError("parameters updated in the backward pass need the programs train and "
                        "backward_update, and those programs need such parameters")
    for name in ("train", "eval"):
        # Module reads the loss from the first output of these programs.
        p = b.programs.get(name)
        loss_type = INT32 if b.integer_parameters else FLOAT
        if p is not None and (not p.outputs or b.dtypes[p.outputs[0]] != loss_type):
            raise BlobError("the %s program has no %s loss as its first output"
                            % (name, "int" if loss_type else "float"))
    return b


def _read_tensors(r, root, b, keep_steps, in_file):
    # keep_steps (tools): also each tensor's alias_of (-1, or the tensor whose space an alias
    # shares), which only the memory plan needs. in_file: constants are noted by their place
    # in the file (load_into_arenas reads them from there into the arenas), not copied.
    for t in r.tables(root, 2, "tensor"):
        _compact()
        name = r.string(t, 0, "tensor name")
        dtype = r.scalar(t, 1, "B", 0)
        role = r.scalar(t, 2, "B", 0)
        shape = r.scalars(t, 3, "i", "tensor shape")
        offset = r.scalar(t, 4, "I", 0)
        size = r.scalar(t, 5, "I", 0)
        count = 1
        for d in shape:
            if d < 0:
                raise BlobError("tensor '%s' has a negative dimension %r" % (name, shape))
            count *= d
        if dtype > UINT8 or role >= len(ROLE_NAMES):
            raise BlobError("tensor '%s' has unknown dtype %d or role %d" % (name, dtype, role))
        if count != size:
            raise BlobError("tensor '%s': shape %r holds %d elements, size says %d"
                            % (name, shape, count, size))
        in_place = r.scalar(t, 13, "B", 0)
        arena = (b.float_arena, b.int_arena, b.byte_arena, b.byte_arena)[dtype]
        if in_place:
            if (ROLE_NAMES[role] != "constant" or dtype not in (INT8, UINT8) or offset
                    or r.scalar(t, 12, "B", 0)):
                raise BlobError("tensor '%s' is read in place but is not a given int8 "
                                "constant at offset 0" % name)
        elif offset + size > arena:
            raise BlobError("tensor '%s' [%d, %d) lies outside its %d-element arena"
                            % (name, offset, offset + size, arena))
        if ROLE_NAMES[role] == "constant":
            pos, nbytes = r.vector(t, 6, 1, "constant data")
            if r.scalar(t, 12, "B", 0):
                # derived: the given head; the step reading it computes the rest
                if dtype > INT32 or nbytes > 4 * size or nbytes % 4:
                    raise BlobError("derived constant '%s' has %d data bytes for %d elements"
                                    % (name, nbytes, size))
                b.derived[len(b.names)] = struct.unpack_from(
                    "<%d%s" % (nbytes // 4, "fi"[dtype]), r.buf, pos) if nbytes else ()
            elif nbytes != ITEM_BYTES[dtype] * size:
                raise BlobError("constant '%s' has %d data bytes, expected %d"
                                % (name, nbytes, ITEM_BYTES[dtype] * size))
            elif in_place and b.weights is not None:
                b.in_place.add(len(b.names))
                offset = pos    # read where it is in the blob's buffer
            else:
                if in_place:    # one after another in the weights' buffer
                    b.in_place.add(len(b.names))
                    offset = b.weights_size
                    b.weights_size += size
                b.constants.append((len(b.names), pos if in_file
                                    else bytes(r.buf[pos:pos + nbytes])))
        pos, n = r.vector(t, 9, 4, "tensor scales")
        if n:
            # an array: no float object per scale (per-channel scales are many)
            scales = array("f", bytes(r.buf[pos:pos + 4 * n]))
            zero_points = r.scalars(t, 10, "i", "tensor zero points")
            if dtype not in (INT8, UINT8) or len(zero_points) not in (1, len(scales)):
                raise BlobError("tensor '%s': %d scales and %d zero points for a tensor of "
                                "dtype %d" % (name, len(scales), len(zero_points), dtype))
            b.quant[len(b.names)] = (scales, zero_points, r.scalar(t, 11, "i", 0))
        b.names.append(name)
        b.dtypes.append(dtype)
        b.roles.append(role)
        b.shapes.append(tuple(shape))
        b.offsets.append(offset)
        b.sizes.append(size)
        if keep_steps:
            b.alias_of.append(r.scalar(t, 8, "i", -1))
    _check_fed_ints(b)


def _check_fed_ints(b):
    # Labels and int inputs are checked when they are copied in (class indices in range);
    # the int tensors kernels write (dropout masks and generator states) must then never
    # share their place, or a mask could turn a label into an index outside its row.
    fed = [t for t in range(len(b.names))
           if b.dtypes[t] == INT32 and ROLE_NAMES[b.roles[t]] in ("input", "label")]
    for t in range(len(b.names)):
        if b.dtypes[t] != INT32 or t in fed:
            continue
        for f in fed:
            if b.offsets[t] < b.offsets[f] + b.sizes[f] and b.offsets[f] < b.offsets[t] + b.sizes[t]:
                raise BlobError("int tensor '%s' overlaps the fed tensor '%s'"
                                % (b.names[t], b.names[f]))


def _read_parameters(r, root, b):
    n = len(b.names)
    in_backward = []
    for t in r.tables(root, 3, "parameter"):
        tensor = r.scalar(t, 0, "I", NO_TENSOR)
        grad = r.scalar(t, 1, "i", -1)
        state = r.scalars(t, 2, "I", "parameter state")
        if tensor < n and b.dtypes[tensor] != FLOAT and b.roles[tensor] == _PARAM and (
                grad < 0 and not state and not r.scalar(t, 3, "B", 0)):
            # an int8 weight or int32 bias trained in integers: the train program's update
            # steps (kernels/inttrain.py) change it; no gradient buffer, no optimizer state
            b.integer_parameters = True
            b.parameters.append((tensor, grad, ()))
            continue
        for tid in (tensor,) + tuple(state) + ((grad,) if grad >= 0 else ()):
            if tid >= n or b.dtypes[tid] != FLOAT:
                raise BlobError("parameter entry names tensor %d, which is not a float tensor" % tid)
        if r.scalar(t, 3, "B", 0):
            if grad >= 0:
                raise BlobError("parameter '%s' has a gradient buffer and is updated in the "
                                "backward pass" % b.names[tensor])
            in_backward.append(tensor)
        b.parameters.append((tensor, grad, tuple(state)))
    b.updated_in_backward = tuple(in_backward)


def _read_optimizer(r, root, b):
    t = r.table(root, 9, "optimizer")
    if t is None:
        return
    b.optimizer = {
        "kind": r.string(t, 0, "optimizer kind"),
        "learning_rate": r.scalar(t, 1, "f", 0.001),
        "beta1": r.scalar(t, 2, "f", 0.9),
        "beta2": r.scalar(t, 3, "f", 0.999),
        "epsilon": r.scalar(t, 4, "f", 1e-6),
        "weight_decay": r.scalar(t, 5, "f", 0.0),
        "bias_correction": bool(r.scalar(t, 6, "B", 1)),
        "momentum": r.scalar(t, 7, "f", 0.0),
        "dampening": r.scalar(t, 8, "f", 0.0),
        "nesterov": bool(r.scalar(t, 9, "B", 0)),
        "l1_penalty": r.scalar(t, 10, "f", 0.0),
        "l2_penalty": r.scalar(t, 11, "f", 0.0),
        "clip_grad_norm": r.scalar(t, 12, "f", 0.0),  # 0: no clipping
    }
    # The fields are float32: a value equal to its default is not written, and the default
    # must then be the same float32 (0.9 is 0.89999997615...), or the bias correction the
    # Optimizer computes would use other betas than the kernels, which take them from the
    # steps' float32 attributes.
    for name, value in b.optimizer.items():
        if isinstance(value, float):
            b.optimizer[name] = struct.unpack("<f", struct.pack("<f", value))[0]
    # Optimizer.step divides by 1 - beta1**t and takes sqrt(1 - beta2**t): the betas must
    # lie in [0, 1); the rest must be finite (NaN fails every comparison).
    for name, low, high in (("learning_rate", 0.0, _HUGE), ("beta1", 0.0, _BELOW_ONE),
                            ("beta2", 0.0, _BELOW_ONE), ("epsilon", 1e-30, _HUGE),
                            ("weight_decay", 0.0, _HUGE), ("momentum", 0.0, _HUGE),
                            ("dampening", -_HUGE, _HUGE), ("l1_penalty", 0.0, _HUGE),
                            ("l2_penalty", 0.0, _HUGE), ("clip_grad_norm", 0.0, _HUGE)):
        value = b.optimizer[name]
        if not low <= value <= high:
            raise BlobError("optimizer %s is %r, outside [%r, %r]" % (name, value, low, high))


def _read_inference(r, root, b):
    t = r.table(root, 14, "inference template")
    if t is None:
        return
    pos, length = r.vector(t, 0, 1, "inference template")
    cuts = r.scalars(t, 1, "I", "inference template cuts")
    outputs = [(r.string(o, 0, "output name"), r.scalar(o, 1, "I", 0))
               for o in r.tables(t, 2, "inference output")]
    at = 0
    copied = []   # cut index -> bytes it copies (0: not a copy)
    output_cuts = 0
    for i in range(0, len(cuts) - 1, 2):
        cut, kind = cuts[i], cuts[i + 1]
        if cut < at or cut > length:
            raise BlobError("inference template: cut at byte %d is out of order or outside "
                            "its %d bytes" % (cut, length))
        at = cut
        n = 0
        if kind == NO_TENSOR:
            output_cuts += 1
        elif kind & _COPY:
            # a string (e 0) or a vector of 4-byte elements (e 1) of this blob, d bytes
            # before its end: its length from its count, inside the blob
            distance = kind & 0x0FFFFFFF
            e = (kind >> 28) & 7
            count = r.u32(len(r.buf) - distance) if 4 <= distance <= len(r.buf) - 4 else -1
            n = 5 + count if e == 0 else 4 + 4 * count
            if e > 1 or count < 0 or n > distance:
                raise BlobError("inference template: cut %d copies bytes outside the blob"
                                % (i // 2))
        elif kind >= len(b.names):
            raise BlobError("inference template: cut names tensor %d, which does not exist"
                            % kind)
        copied.append(n)
    if len(cuts) % 2 or output_cuts != 1 or not outputs:
        raise BlobError("inference template: %d cut values with %d output-id cuts, %d outputs"
                        % (len(cuts), output_cuts, len(outputs)))
    b.inference = (pos, length, cuts, outputs, copied)


def _ids(r, table, index, b, what):
    ids = r.scalars(table, index, "I", what)
    for tid in ids:
        if tid >= len(b.names):
            raise BlobError("%s: tensor id %d out of range" % (what, tid))
        if tid in b.in_place:
            raise BlobError("%s: '%s' is an int8 weight read in place, in no arena"
                            % (what, b.names[tid]))
    return list(ids)


# Tensor kinds in a signature: "f" float, "i" int32, "b" int8 / uint8 (byte arena), "?" a
# float tensor or none, "k" an int32 tensor or none, "w" an int8 weight (in the byte arena or
# read in place). A kernel with byte tensors gets the byte arena as the first element of its
# args; one with a weight, that weight's buffer as the last.
_KIND_DTYPES = {"f": (FLOAT,), "?": (FLOAT,), "i": (INT32,), "k": (INT32,), "b": (INT8, UINT8),
                "w": (INT8, UINT8)}


def _count(n):
    return "any number of" if n < 0 else str(n)  # < 0: the kernel's checker checks it


def _read_steps(r, program, b, program_name, records, Q):
    steps = []
    modules = {}
    check = StepCheck(b)
    for index, t in enumerate(r.tables(program, 1, "step")):
        _compact()
        op = r.scalar(t, 0, "H", 0)
        where = "%s step %d (op %d)" % (program_name, index, op)
        if op not in SIGNATURES:
            raise BlobError("%s: unknown op code; this runtime is older than the blob or "
                            "was trimmed for another model" % where)
        family, function, dtypes, n_ints, n_floats = SIGNATURES[op]
        tensors = r.scalars(t, 1, "I", where)
        ints = r.scalars(t, 2, "i", where)
        floats = r.scalars(t, 3, "f", where)
        if (len(tensors) != len(dtypes) or (n_ints >= 0 and len(ints) != n_ints)
                or (n_floats >= 0 and len(floats) != n_floats)):
            raise BlobError("%s: expected %d tensors, %s ints, %s floats; got %d, %d, %d"
                            % (where, len(dtypes), _count(n_ints), _count(n_floats),
                               len(tensors), len(ints), len(floats)))
        offsets = []
        for tid, kind in zip(tensors, dtypes):
            if tid == NO_TENSOR and kind in "?k":
                offsets.append(-1)
                continue
            if tid in b.in_place and kind != "w":
                raise BlobError("%s: tensor '%s' is an int8 weight read in place, which only "
                                "a weight argument can be" % (where, b.names[tid]))
            if tid >= len(b.names) or b.dtypes[tid] not in _KIND_DTYPES[kind]:
                raise BlobError("%s: tensor argument %d is not a valid %s tensor"
                                % (where, tid, {"i": "int", "k": "int", "b": "int8",
                                                "w": "int8"}.get(
                                    kind, "float")))
            offsets.append(b.offsets[tid])
        if family not in modules:
            modules[family] = kernel_module(family)
        args = tuple(offsets) + ints + floats
        if "w" in dtypes:
            # the weight's buffer last: in place, or the byte arena
            w = tensors[dtypes.index("w")]
            args += ((_WEIGHTS if b.weights is None else b.weights) if w in b.in_place
                     else Q,)
        if "b" in dtypes or "w" in dtypes:
            args = (Q,) + args
        check.where = "%s step %d (%s)" % (program_name, index, function)
        check.tensors = tensors
        check.counts = (len(ints), len(floats))
        getattr(modules[family], function + "_check")(args, check)
        steps.append((getattr(modules[family], function), args))
        if records is not None:
            records.append((op, tensors, ints, floats))
    return steps
