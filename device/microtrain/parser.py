# The blob parser and step binder: checks a blob once, at load, and turns each step into
# (kernel, args) after its kernel's checker (kernels/<family>.py <kernel>_check, through a
# StepCheck) has asserted every index the kernel can compute. Every read is bounds-checked
# (flatbuf.Reader); every problem is a BlobError with a reason. File layout: u32 N, then an
# N-byte FlatBuffer whose identifier is "MTRB", then the CRC-32 of those N bytes.
import struct
from microtrain.arenas import compact
from microtrain.blob import IDENTIFIER, ITEM_BYTES, ROLE_NAMES, Blob, Program, _COPY, is_buffer
from microtrain.crc32 import crc32
from microtrain.errors import BlobError
from microtrain.files import open_existing, path_of, read_whole, reason
from microtrain.flatbuf import Reader
from microtrain.opcodes import kernel_module, signature
from microtrain.stepcheck import StepCheck

# contract: blob Model Tensor Step Program Parameter OptimizerConfig InferenceTemplate InferenceOutput; optimizer_options; private
# (generated from host/microtrain_host/contract/ by `python -m microtrain_host.contract.generate`; do not edit)
from microtrain.errors import const
_MODEL_FORMAT_VERSION = const(0)
_MODEL_TENSORS = const(2)
_MODEL_PARAMETERS = const(3)
_MODEL_PROGRAMS = const(4)
_MODEL_FLOAT_ARENA = const(5)
_MODEL_INT_ARENA = const(6)
_MODEL_LOSS = const(7)
_MODEL_NUM_CLASSES = const(8)
_MODEL_OPTIMIZER = const(9)
_MODEL_INFERENCE = const(14)
_MODEL_BYTE_ARENA = const(16)
_MODEL_WEIGHTS_IN_PLACE = const(17)
_TENSOR_NAME = const(0)
_TENSOR_DTYPE = const(1)
_TENSOR_ROLE = const(2)
_TENSOR_SHAPE = const(3)
_TENSOR_OFFSET = const(4)
_TENSOR_SIZE = const(5)
_TENSOR_DATA = const(6)
_TENSOR_SCALE = const(9)
_TENSOR_DERIVED = const(12)
_TENSOR_IN_PLACE = const(13)
_STEP_OP = const(0)
_STEP_TENSORS = const(1)
_STEP_INTS = const(2)
_STEP_FLOATS = const(3)
_PROGRAM_NAME = const(0)
_PROGRAM_STEPS = const(1)
_PROGRAM_INPUTS = const(2)
_PROGRAM_OUTPUTS = const(3)
_PROGRAM_LATENT_FROM = const(4)
_PROGRAM_LATENT = const(5)
_PARAMETER_TENSOR = const(0)
_PARAMETER_GRAD = const(1)
_PARAMETER_STATE = const(2)
_PARAMETER_UPDATED_IN_BACKWARD = const(3)
_OPTIMIZER_CONFIG_KIND = const(0)
_INFERENCE_TEMPLATE_BLOB = const(0)
_INFERENCE_TEMPLATE_CUTS = const(1)
_INFERENCE_TEMPLATE_OUTPUTS = const(2)
_INFERENCE_OUTPUT_NAME = const(0)
_INFERENCE_OUTPUT_TENSOR = const(1)
# (name, OptimizerConfig field, struct format, default, lowest, highest) of each
# option, as float32 values (a range open at the top ends at the float32 below it);
# a flag is 0 or 1
_OPTIONS = (
    ("learning_rate", 1, "f", 0.001, 0.0, 3e+38),
    ("beta1", 2, "f", 0.9, 0.0, 0.99999994),
    ("beta2", 3, "f", 0.999, 0.0, 0.99999994),
    ("epsilon", 4, "f", 1e-06, 1e-30, 3e+38),
    ("weight_decay", 5, "f", 0.0, 0.0, 3e+38),
    ("bias_correction", 6, "B", 1, 0, 1),
    ("momentum", 7, "f", 0.0, 0.0, 3e+38),
    ("dampening", 8, "f", 0.0, 0.0, 1.0),
    ("nesterov", 9, "B", 0, 0, 1),
    ("l1_penalty", 10, "f", 0.0, 0.0, 3e+38),
    ("l2_penalty", 11, "f", 0.0, 0.0, 3e+38),
    ("clip_grad_norm", 12, "f", 0.0, 0.0, 3e+38),
)
_FLOAT = const(0)
_INT32 = const(1)
_INT8 = const(2)
_UINT8 = const(3)
_ROLE_PARAM = const(2)
_ROLE_CONSTANT = const(6)
_FORMAT_VERSION = const(1)
_NO_TENSOR = const(0xFFFFFFFF)  # the id of an absent optional tensor
# end of contract

def read(path):
    """The bytes of the blob file at path (or path.bak: files.open_existing), its head
    checked first."""
    path = path_of(path, BlobError, "the blob", True)
    try:
        f, _ = open_existing(path)
        with f:
            check_head(f.read(12), f.seek(0, 2))
            return read_whole(f)
    except OSError as e:
        raise BlobError("cannot read blob '%s': %s" % (path, reason(e)))


def load(path_or_bytes, keep_steps=False):
    data = path_or_bytes if is_buffer(path_or_bytes) else read(path_or_bytes)
    return parse(data, keep_steps)


def root_of(data, given=None):
    # Check the frame (size, identifier, CRC-32) and the format version; return the reader
    # and the root table. The CRC is computed once per load: the fallback crc32 is slow.
    # given: what the caller was given, when data is a view of it. (The frame is checked
    # here, not in a function of its own: each function costs a board's heap.)
    size = check_head(data, len(data), data if given is None else given)
    if crc32(memoryview(data)[4:4 + size]) & 0xFFFFFFFF != struct.unpack_from(
            "<I", data, 4 + size)[0]:
        raise BlobError("corrupt: CRC-32 of the blob does not match")
    r = Reader(memoryview(data)[:len(data) - 4], BlobError, start=4)
    root = r.root()
    version = r.scalar(root, _MODEL_FORMAT_VERSION, "H", 0)
    if version != _FORMAT_VERSION:
        raise BlobError("blob format version %d is not supported by this runtime (it reads %d);"
                        " repack the model with a matching microtrain" % (version, _FORMAT_VERSION))
    return r, root


def check_head(head, length, given=None):
    """A blob's first 12 bytes (size, root offset, identifier) against its length: a file is
    checked by these before it is read (a 512 MiB file of anything else is not)."""
    # bytes that read like a file name are a path given as bytes, taken for the blob itself
    hint = ("; bytes are read as the blob itself: give its path as a str"
            if isinstance(given, bytes) and len(given) < 1024 and b"\0" not in given else "")
    if length < 12 or len(head) < 12:
        raise BlobError("truncated: a blob is at least 12 bytes, this one has %d%s"
                        % (length, hint))
    if bytes(head[8:12]) != IDENTIFIER:
        raise BlobError("not a microtrain blob: identifier %r, expected %r%s"
                        % (bytes(head[8:12]), IDENTIFIER, hint))
    size = struct.unpack_from("<I", head, 0)[0]
    if 4 + size + 4 != length:
        raise BlobError("truncated or padded: header says %d bytes, file has %d"
                        % (4 + size + 4, length))
    return size


def parse(data, keep_steps=False):
    """Validate and parse a blob. keep_steps also keeps each step's tensor ids (for tools).
    Its steps get an empty byte arena: run a blob loaded with loader.load_into_arenas."""
    r, root = root_of(data)
    return parse_root(r, root, data, keep_steps, bytearray(0))


# Stand-ins in the args of byte kernels until the loader allocates what they stand for:
LATER_BYTES = bytearray(0)     # the byte arena
LATER_WEIGHTS = bytearray(0)   # the weights' buffer of a blob file


def parse_root(r, root, data, keep_steps, Q, in_file=False, weights=None, arenas=None):
    """The Blob of the checked frame (_root). Q: the byte arena the byte kernels' args get
    (or LATER_BYTES). in_file: constants are noted by their place in the file (the loader
    reads them into the arenas), not copied. weights: the buffer int8 weights are read from
    in place (the blob's own, given as a buffer), or None: one bytearray of them (the
    loader allocates it). arenas: (F, I, Q, arenas.put) when they are allocated already
    (Blob.derive)."""
    b = Blob()
    b._file = data
    b.weights = weights
    b._arenas = arenas
    b.float_arena, b.int_arena, b.byte_arena = arena_sizes(r, root)
    b.loss = r.string(root, _MODEL_LOSS, "loss")
    b.num_classes = r.scalar(root, _MODEL_NUM_CLASSES, "I", 0)
    _read_tensors(r, root, b, in_file)
    if keep_steps:
        # what only the host's tools read (a board's runtime carries neither the code nor
        # the attributes): the packer's figures, tensor aliases, step records
        from microtrain.toolfields import read_tool_fields
        read_tool_fields(r, root, b)
    _read_parameters(r, root, b)
    _read_optimizer(r, root, b)
    _read_inference(r, root, b)
    b.crc = struct.unpack_from("<I", data, len(data) - 4)[0]
    for t in r.tables(root, _MODEL_PROGRAMS, "program"):
        name = r.string(t, _PROGRAM_NAME, "program name")
        records = [] if keep_steps else None
        if keep_steps:
            b.step_records[name] = records
        p = b.programs[name] = Program(name, _read_steps(r, t, b, name, records, Q),
                                       _ids(r, t, _PROGRAM_INPUTS, b, name + " inputs"),
                                       _ids(r, t, _PROGRAM_OUTPUTS, b, name + " outputs"))
        p.latent_from = r.scalar(t, _PROGRAM_LATENT_FROM, "I", 0)  # (latent.py checks)
        p.latent = r.scalars(t, _PROGRAM_LATENT, "I", name + " latent")
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
        loss_type = _INT32 if b.integer_parameters else _FLOAT
        if p is not None and (not p.outputs or b.dtypes[p.outputs[0]] != loss_type):
            raise BlobError("the %s program has no %s loss as its first output"
                            % (name, "int" if loss_type else "float"))
    return b


def _read_tensors(r, root, b, in_file):
    # The fields of quantized tensors (scales,
    # derived constants, int8 weights read in place) are read by quantized.py, which a
    # float blob never imports.
    for t in r.tables(root, _MODEL_TENSORS, "tensor"):
        compact()
        name = r.string(t, _TENSOR_NAME, "tensor name")
        dtype = r.scalar(t, _TENSOR_DTYPE, "B", 0)
        role = r.scalar(t, _TENSOR_ROLE, "B", 0)
        shape = r.scalars(t, _TENSOR_SHAPE, "i", "tensor shape")
        offset = r.scalar(t, _TENSOR_OFFSET, "I", 0)
        size = r.scalar(t, _TENSOR_SIZE, "I", 0)
        count = 1
        for d in shape:
            if d < 0:
                raise BlobError("tensor '%s' has a negative dimension %r" % (name, shape))
            count *= d
        if dtype > _UINT8 or role >= len(ROLE_NAMES):
            raise BlobError("tensor '%s' has unknown dtype %d or role %d" % (name, dtype, role))
        if count != size:
            raise BlobError("tensor '%s': shape %r holds %d elements, size says %d"
                            % (name, shape, count, size))
        if (r.field(t, _TENSOR_SCALE) or r.field(t, _TENSOR_DERIVED)
                or r.field(t, _TENSOR_IN_PLACE)):
            from microtrain.quantized import read_quantized
            offset = read_quantized(r, t, b, name, dtype, role, offset, size, in_file)
        else:
            arena = (b.float_arena, b.int_arena, b.byte_arena, b.byte_arena)[dtype]
            if offset + size > arena:
                raise BlobError("tensor '%s' [%d, %d) lies outside its %d-element arena"
                                % (name, offset, offset + size, arena))
            if role == _ROLE_CONSTANT:
                pos, nbytes = r.vector(t, _TENSOR_DATA, 1, "constant data")
                if nbytes != ITEM_BYTES[dtype] * size:
                    raise BlobError("constant '%s' has %d data bytes, expected %d"
                                    % (name, nbytes, ITEM_BYTES[dtype] * size))
                b.constants.append((len(b.names), pos if in_file
                                    else bytes(r.buf[pos:pos + nbytes])))
        b.names.append(name)
        b.dtypes.append(dtype)
        b.roles.append(role)
        b.shapes.append(tuple(shape))
        b.offsets.append(offset)
        b.sizes.append(size)
    _check_places(b)


def _check_places(b):
    # Labels and int inputs are checked when they are copied in (class indices in range);
    # the int tensors kernels write (dropout masks and generator states) must then never
    # share their place, or a mask could turn a label into an index outside its row. Nor
    # may a tensor share a constant's place (a kernel writing it would change the constant).
    fed = [t for t in range(len(b.names))
           if b.dtypes[t] == _INT32 and ROLE_NAMES[b.roles[t]] in ("input", "label")]
    n = len(b.names)
    for u in range(n):      # each constant against every tensor: no list, no tuple
        if b.roles[u] != _ROLE_CONSTANT or not b.sizes[u] or u in b.in_place:
            continue
        low, high, arena = b.offsets[u], b.offsets[u] + b.sizes[u], min(b.dtypes[u], _INT8)
        for t in range(n):
            if (b.roles[t] != _ROLE_CONSTANT and b.offsets[t] < high
                    and low < b.offsets[t] + b.sizes[t] and min(b.dtypes[t], _INT8) == arena
                    and b.sizes[t] and t not in b.in_place):
                raise BlobError("tensor '%s' overlaps the constant '%s'"
                                % (b.names[t], b.names[u]))
    for t in range(len(b.names)):
        if b.dtypes[t] != _INT32 or t in fed:
            continue
        for f in fed:
            if b.offsets[t] < b.offsets[f] + b.sizes[f] and b.offsets[f] < b.offsets[t] + b.sizes[t]:
                raise BlobError("int tensor '%s' overlaps the fed tensor '%s'"
                                % (b.names[t], b.names[f]))


def _read_parameters(r, root, b):
    n = len(b.names)
    in_backward = []
    for t in r.tables(root, _MODEL_PARAMETERS, "parameter"):
        tensor = r.scalar(t, _PARAMETER_TENSOR, "I", _NO_TENSOR)
        grad = r.scalar(t, _PARAMETER_GRAD, "i", -1)
        state = r.scalars(t, _PARAMETER_STATE, "I", "parameter state")
        updated = r.scalar(t, _PARAMETER_UPDATED_IN_BACKWARD, "B", 0)
        if tensor < n and b.dtypes[tensor] != _FLOAT and b.roles[tensor] == _ROLE_PARAM and (
                grad < 0 and not state and not updated):
            # an int8 weight or int32 bias trained in integers: the train program's update
            # steps (kernels/inttrain.py) change it; no gradient buffer, no optimizer state
            b.integer_parameters = True
            b.parameters.append((tensor, grad, ()))
            continue
        for tid in (tensor,) + tuple(state) + ((grad,) if grad >= 0 else ()):
            if tid >= n or b.dtypes[tid] != _FLOAT:
                raise BlobError("parameter entry names tensor %d, which is not a float tensor" % tid)
        if updated:
            if grad >= 0:
                raise BlobError("parameter '%s' has a gradient buffer and is updated in the "
                                "backward pass" % b.names[tensor])
            in_backward.append(tensor)
        b.parameters.append((tensor, grad, tuple(state)))
    b.updated_in_backward = tuple(in_backward)


def _f32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


def _read_optimizer(r, root, b):
    # Every option of the contract's table (_OPTIONS) as float32 (a flag as a bool): a value
    # equal to its default is not written, and the default must then be the same float32
    # (0.9 is 0.89999997615...), or the bias correction the Optimizer computes would use
    # other betas than the kernels, which take them from the steps' float32 attributes. Each
    # must lie in its range (NaN fails every comparison): Optimizer.step divides by
    # 1 - beta1**t and takes sqrt(1 - beta2**t), so the betas lie in [0, 1).
    t = r.table(root, _MODEL_OPTIMIZER, "optimizer")
    if t is None:
        return
    b.optimizer = {"kind": r.string(t, _OPTIMIZER_CONFIG_KIND, "optimizer kind")}
    for name, field, fmt, default, low, high in _OPTIONS:
        value = r.scalar(t, field, fmt, default)
        if fmt == "B":
            value = bool(value)
        else:
            value = _f32(value)
            if not _f32(low) <= value <= _f32(high):
                raise BlobError("optimizer %s is %r, outside [%r, %r]" % (name, value, low, high))
        b.optimizer[name] = value


def _read_inference(r, root, b):
    t = r.table(root, _MODEL_INFERENCE, "inference template")
    if t is None:
        return
    pos, length = r.vector(t, _INFERENCE_TEMPLATE_BLOB, 1, "inference template")
    cuts = r.scalars(t, _INFERENCE_TEMPLATE_CUTS, "I", "inference template cuts")
    outputs = [(r.string(o, _INFERENCE_OUTPUT_NAME, "output name"),
                r.scalar(o, _INFERENCE_OUTPUT_TENSOR, "I", 0))
               for o in r.tables(t, _INFERENCE_TEMPLATE_OUTPUTS, "inference output")]
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
        if kind == _NO_TENSOR:
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
_KIND_DTYPES = {"f": (_FLOAT,), "?": (_FLOAT,), "i": (_INT32,), "k": (_INT32,), "b": (_INT8, _UINT8),
                "w": (_INT8, _UINT8)}


def _count(n):
    return "any number of" if n < 0 else str(n)  # < 0: the kernel's checker checks it


def _read_steps(r, program, b, program_name, records, Q):
    steps = []
    modules = {}
    check = StepCheck(b)
    for index, t in enumerate(r.tables(program, _PROGRAM_STEPS, "step")):
        compact()
        op = r.scalar(t, _STEP_OP, "H", 0)
        where = "%s step %d (op %d)" % (program_name, index, op)
        known = signature(op)
        if known is None:
            raise BlobError("%s: unknown op code; this runtime is older than the blob or "
                            "was trimmed for another model" % where)
        family, function, dtypes, n_ints, n_floats = known
        tensors = r.scalars(t, _STEP_TENSORS, "I", where)
        ints = r.scalars(t, _STEP_INTS, "i", where)
        floats = r.scalars(t, _STEP_FLOATS, "f", where)
        if (len(tensors) != len(dtypes) or (n_ints >= 0 and len(ints) != n_ints)
                or (n_floats >= 0 and len(floats) != n_floats)):
            raise BlobError("%s: expected %d tensors, %s ints, %s floats; got %d, %d, %d"
                            % (where, len(dtypes), _count(n_ints), _count(n_floats),
                               len(tensors), len(ints), len(floats)))
        offsets = []
        for tid, kind in zip(tensors, dtypes):
            if tid == _NO_TENSOR and kind in "?k":
                offsets.append(-1)
                continue
            if tid in b.in_place and kind != "w":
                raise BlobError("%s: tensor '%s' is an int8 weight read in place, which only "
                                "a weight argument can be" % (where, b.names[tid]))
            if tid >= len(b.names) or b.dtypes[tid] not in _KIND_DTYPES[kind]:
                raise BlobError("%s: tensor argument %d is not a valid %s tensor"
                                % (where, tid, {"i": "int", "k": "int", "b": "int8",
                                                "w": "int8"}.get(kind, "float")))
            offsets.append(b.offsets[tid])
        if family not in modules:
            modules[family] = kernel_module(family)
        offsets = tuple(offsets)
        args = offsets + ints + floats
        if "w" in dtypes:
            # the weight's buffer last: in place, or the byte arena
            w = tensors[dtypes.index("w")]
            args += ((LATER_WEIGHTS if b.weights is None else b.weights) if w in b.in_place
                     else Q,)
        if "b" in dtypes or "w" in dtypes:
            args = (Q,) + args
        check.where = "%s step %d (%s)" % (program_name, index, function)
        check.tensors = tensors
        check.counts = (len(ints), len(floats))
        check.offsets = offsets
        check.ints = ints
        check.floats = floats
        getattr(modules[family], function + "_check")(args, check)
        steps.append((getattr(modules[family], function), args))
        if records is not None:
            records.append((op, tensors, ints, floats))
    return steps


def arena_sizes(r, root):
    """The arena sizes (floats, ints, bytes) the root table states, checked against what its
    tensor table needs before anything that large is allocated: a blob whose size fields
    were altered must not make the device allocate whatever they say."""
    floats = r.scalar(root, _MODEL_FLOAT_ARENA, "I", 0)
    ints = r.scalar(root, _MODEL_INT_ARENA, "I", 0)
    nbytes = r.scalar(root, _MODEL_BYTE_ARENA, "I", 0)
    weights = r.scalar(root, _MODEL_WEIGHTS_IN_PLACE, "I", 0)
    need = [0, 0, 0]
    held = [0, 0, 0]    # what the tensors hold: no plan needs more (see below)
    in_place = 0
    for t in r.tables(root, _MODEL_TENSORS, "tensor"):
        size = r.scalar(t, _TENSOR_SIZE, "I", 0)
        if r.scalar(t, _TENSOR_IN_PLACE, "B", 0):
            in_place += size
            continue    # in place: in no arena
        dtype = r.scalar(t, _TENSOR_DTYPE, "B", 0)
        end = r.scalar(t, _TENSOR_OFFSET, "I", 0) + size
        arena = 2 if dtype in (_INT8, _UINT8) else dtype
        if dtype <= _UINT8:
            held[arena] += size
            if end > need[arena]:
                need[arena] = end
    for stated, needed, most, kind in ((floats, need[0], held[0], "float"),
                                       (ints, need[1], held[1], "int"),
                                       (nbytes, need[2], held[2], "byte")):
        if stated != needed:
            raise BlobError("the %s arena is %d elements, its tensors need %d"
                            % (kind, stated, needed))
        # The packer places each tensor at 0 or right after another one, so an arena never
        # exceeds the sum of its tensors' sizes; tensors moved further out (with the arena
        # grown to match) would only make the device allocate for nothing.
        if needed > most:
            raise BlobError("the %s arena is %d elements, but its tensors hold only %d: "
                            "they lie apart as no packed blob has them" % (kind, needed, most))
    if weights != in_place:
        raise BlobError("the blob states %d bytes of weights read in place, its tensors hold "
                        "%d" % (weights, in_place))
    return floats, ints, nbytes
