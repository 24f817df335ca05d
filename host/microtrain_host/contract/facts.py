"""The facts host and device share besides the schemas and the op table: dtypes and their
arenas, control tensor names, optimizer kinds with their options (defaults come from the
schema's OptimizerConfig), the ONNX types of checkpoint tensors.

Written once here; contract/generate.py writes the device's copies (const()s and small
tables inside the device modules that need them) and tests/test_contract.py fails when one
is stale. Dtype and role numbers are the schema's enums (microtrain.fbs DType, Role)."""
import dataclasses

from . import schema

_blob = schema.blob_schema()

# Tensor dtypes (microtrain.fbs enum DType): bytes per element and the arena that holds them.
DTYPES = dict(_blob.enums["DType"][1])                  # name -> number
ITEM_BYTES = {"FLOAT": 4, "INT32": 4, "INT8": 1, "UINT8": 1}
ARENAS = ("float", "int", "byte")                       # allocated once at load
ARENA_OF = {"FLOAT": "float", "INT32": "int", "INT8": "byte", "UINT8": "byte"}
# A step's int arguments (Step.ints, [int] in the schema): int32 in the blob and on the device.
INT32_MIN, INT32_MAX = -2**31, 2**31 - 1

# Tensor roles (microtrain.fbs enum Role), lower case as messages and tools show them.
ROLES = tuple(name.lower() for name in _blob.enums["Role"][1])

# Scalars the runtime writes into the float arena before a program runs (role CONTROL).
CONTROLS = ("lazy_reset_grad",   # 1.0: the train step overwrites the gradient buffers
            "learning_rate",     # the optimizer's current rate
            "step",              # the 1-based optimizer step being taken (SGD momentum)
            "step_size")         # AdamW's bias-corrected step size

NO_TENSOR = 0xFFFFFFFF           # the tensor id of an absent optional step argument
# A QAT observer's [min, max] parameter: [inf, -inf] until it has seen a batch, the only
# parameter a checkpoint may hold an infinity in (quant/quantize.py names them).
OBSERVER_RANGE_SUFFIX = ".observer_range"
FORMAT_VERSION = 1               # Model.format_version a runtime reads
BLOB_IDENTIFIER = _blob.identifier
CHECKPOINT_IDENTIFIER = schema.checkpoint_schema().identifier
CHECKPOINT_VERSION = 2           # Checkpoint.version (ORT's format version)
CHECKPOINT_TRAILER = "MTCK"      # ends microtrain's CRC-32 trailer (checkpoint.fbs, top)
# Int properties of a checkpoint reserved for the device's random generators' states
# (Dropout streams, stochastic rounding): microtrain.rng.<k>, microtrain.rng.<weight>.dither
RNG_PREFIX = "microtrain.rng."

# ONNX TensorProto data types a checkpoint tensor may have: (bytes, array typecode).
CHECKPOINT_TENSOR_TYPES = {1: (4, "f"),    # FLOAT: every float parameter and moment
                           3: (1, "b"),    # INT8: an int8 weight trained in integers
                           5: (2, "h"),    # INT16: its momentum velocity (1/256 quanta)
                           6: (4, "i")}    # INT32: an int32 bias and its velocity

HUGE = 3e38                      # about float32's largest: a hyperparameter must lie below


@dataclasses.dataclass(frozen=True)
class Option:
    """One optimizer option (the OptimizerConfig field of the same name) and its range:
    low <= value <= high, or < high when high_open, checked on the float32 value the blob
    stores (a NaN fails every comparison); a flag is True or False."""
    name: str
    low: float = 0.0
    high: float = HUGE
    high_open: bool = False
    flag: bool = False

    def admits(self, value):
        return self.low <= value <= self.high and not (self.high_open and value == self.high)


# Every optimizer option, in the order OptimizerConfig declares them. Host (pack time) and
# device (load time) check these ranges alike: the host never writes what the device refuses.
OPTIONS = {o.name: o for o in (
    Option("learning_rate"),
    Option("beta1", high=1.0, high_open=True),
    Option("beta2", high=1.0, high_open=True),
    Option("epsilon", low=1e-30),
    Option("weight_decay"),
    Option("bias_correction", flag=True),
    Option("momentum"),
    Option("dampening", high=1.0),
    Option("nesterov", flag=True),
    Option("l1_penalty"),
    Option("l2_penalty"),
    Option("clip_grad_norm"),            # 0 in the blob: no clipping (the host: None)
)}
# Gradient transforms every optimizer applies before its update (penalties, clipping).
GRADIENT_OPTIONS = ("l1_penalty", "l2_penalty", "clip_grad_norm")


@dataclasses.dataclass(frozen=True)
class OptimizerKind:
    """An optimizer as both halves see it. `options`: what it takes besides the gradient
    options; `states`: its per-parameter state tensors (ORT's names); `stateful_option`:
    the option that must be non-zero for it to keep them (SGD's momentum); `step_size`: the
    device writes a bias-corrected step size each step (control "step_size");
    `nonnegative_state`: the index of a state that must never be negative (AdamW's second
    moment: a checkpoint holding a negative one is refused)."""
    name: str
    ort_type: int                   # onnxruntime.training's OptimType value
    options: tuple
    states: tuple
    stateful_option: str = ""
    step_size: bool = False
    nonnegative_state: int = -1


OPTIMIZERS = {k.name: k for k in (
    OptimizerKind("AdamW", 1, ("learning_rate", "beta1", "beta2", "epsilon", "weight_decay",
                               "bias_correction"), ("momentum0", "momentum1"),
                  step_size=True, nonnegative_state=1),
    OptimizerKind("SGD", 2, ("learning_rate", "momentum", "dampening", "nesterov",
                             "weight_decay"), ("momentum0",), stateful_option="momentum"),
)}


def option_default(name):
    """The default of an optimizer option: the schema's OptimizerConfig default (the host
    uses None for clip_grad_norm's 0, "no clipping")."""
    if name == "clip_grad_norm":
        return None
    return _blob["OptimizerConfig"][name].default
