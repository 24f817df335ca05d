# The parsed blob: the record every part of the runtime shares. The blob (.mtb) is written by
# the host (schema: host/microtrain_host/contract/microtrain.fbs); parser.py checks and reads
# it, loader.py puts it and its constants into arenas allocated once.
from array import array
from microtrain.errors import BlobError

# contract: format; dtypes; roles
# (generated from host/microtrain_host/contract/ by `python -m microtrain_host.contract.generate`; do not edit)
from microtrain.errors import const
IDENTIFIER = b"MTRB"
FORMAT_VERSION = const(1)
NO_TENSOR = const(0xFFFFFFFF)  # the id of an absent optional tensor
FLOAT = const(0)
INT32 = const(1)
INT8 = const(2)
UINT8 = const(3)
ITEM_BYTES = (4, 4, 1, 1)  # by dtype
ROLE_NAMES = ("input", "label", "param", "grad", "activation", "optimizer_state", "constant", "control")
ROLE_INPUT = const(0)
ROLE_LABEL = const(1)
ROLE_PARAM = const(2)
ROLE_GRAD = const(3)
ROLE_ACTIVATION = const(4)
ROLE_OPTIMIZER_STATE = const(5)
ROLE_CONSTANT = const(6)
ROLE_CONTROL = const(7)
# end of contract
_COPY = 0x80000000         # inference template cut kind: copy bytes of the training blob


class Program:
    def __init__(self, name, steps, inputs, outputs):
        self.name = name
        self.steps = steps      # [(kernel, args)]
        self.inputs = inputs    # tensor ids
        self.outputs = outputs  # tensor ids
        self.latent_from = 0    # the latent cache's cut and the tensors it keeps (latent.py)
        self.latent = ()


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
        # loaded with keep_steps (the host's tools), also toolfields.py's naive_size,
        # lower_bound, full_training_arena, full_training_steps, source_opset, alias_of
        # and step_records
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
        self.int_derived = {}   # derived int tensors computed so far -> their size (or head)
        self.int_units = {}     # inttrain: gradient tensor -> its real unit (at load)
        self.int_unit_exps = {}  # intgrad: gradient tensor -> E when its real unit is
                                 # int_units[t] / 2**E (a deep backward's: E absent = 0)
        self.in_place = set()   # int8 constants the kernels read where the blob is (the
                                # weights of int8 Gemm / Conv: no arena space); their offsets
                                # index self.weights
        self.weights = None     # that buffer: the blob itself when it was given as a buffer
                                # (in flash), else a bytearray of those constants
        self.weights_size = 0   # ... of weights_size bytes (a blob loaded from a file)
        self._arenas = None     # (F, I, Q, arenas.put) while a blob given as a buffer is
                                # parsed (derive)
        self.nonnegative = set()  # parameters no checkpoint may bring a negative value into
                                  # (running variances; the checkers note them)
        self.kept = []          # tensors a training forward pass updates in place (the
                                # checkers note them: StepCheck.kept)

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
            F, I, Q, put = self._arenas
            put(self, tid, 0, raw, len(raw), F, I, Q)

    def tensor_id(self, name):
        try:
            return self.names.index(name)
        except ValueError:
            raise BlobError("the blob has no tensor named '%s'" % name)


def zeros(typecode, n):
    """A zeroed array of n elements, e.g. an arena. array(typecode, bytes(4 * n)) would
    briefly need twice the memory; an iterable with a length is allocated once at its
    final size, then zeroed. CPython repeats one zero instead (one allocation, memcpy: a
    200 MB arena in 0.3 s, not 7 s); MicroPython's array has no repetition."""
    try:
        return array(typecode, [0]) * n
    except TypeError:
        pass
    a = array(typecode, range(n))
    zero = 0.0 if typecode == "f" else 0
    for i in range(n):
        a[i] = zero
    return a


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


