"""Optimizer graphs: one node per trainable parameter, updating it in place.

Each optimizer kind is one module here (adamw.py, sgd.py: its node and its own checks) and
one entry of the contract (contract/facts.py OPTIMIZERS: its options, state tensors and
what the device does for it); its options' defaults are the schema's OptimizerConfig
defaults and their ranges the contract's, which the device checks again at load.

Before the update, every kind can add an elastic penalty to each gradient,
g + l1_penalty * sign(p) + 2 * l2_penalty * p (the gradient of l1 |p|_1 + l2 |p|^2, as
onnxcustom's ElasticLearningPenalty), and clip the gradients by their global L2 norm (as
torch.nn.utils.clip_grad_norm_, penalty included); weight decay comes after both, as in
torch.optim. The gradient buffers themselves are left untouched."""
import enum
import math
import numbers
import struct

from onnx import TensorProto

from ...contract import facts
from ...errors import ArtifactError
from ...graph import DOMAIN
from ...ir import LEARNING_RATE, STEP, grad_buffer, state_name
from . import adamw, sgd

OptimType = enum.IntEnum("OptimType", {k.name: k.ort_type for k in facts.OPTIMIZERS.values()})
OptimType.__doc__ = "ORT's OptimType values."
KINDS = {OptimType.AdamW: adamw, OptimType.SGD: sgd}     # the module of each kind

# Gradient transforms every kind takes; clip_grad_norm None = no clipping.
GRADIENT_OPTIONS = {name: facts.option_default(name) for name in facts.GRADIENT_OPTIONS}
DEFAULTS = {kind: {**{name: facts.option_default(name)
                      for name in facts.OPTIMIZERS[kind.name].options}, **GRADIENT_OPTIONS}
            for kind in OptimType}


def optimizer_kind(optimizer):
    """The contract's entry (contract.facts.OptimizerKind) of an OptimType."""
    return facts.OPTIMIZERS[OptimType(optimizer).name]


def state_names(optimizer, options):
    """Per-parameter optimizer state, with ORT's names: AdamW's two moments, SGD's momentum
    buffer when momentum is on; plain SGD keeps none."""
    kind = optimizer_kind(optimizer)
    if kind.stateful_option and not options.get(kind.stateful_option, 0.0):
        return ()
    return kind.states


def _number(options, name):
    # In the option's contract range, checked on the float32 the blob stores (0.99999999
    # is 1.0 there, which beta1 must stay below).
    value = options[name]
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise ArtifactError(f"optimizer option {name}={value!r} must be a finite number")
    option = facts.OPTIONS[name]
    stored = struct.unpack("<f", struct.pack("<f", value))[0] if abs(value) < 3.4e38 else value
    if not option.admits(stored):
        if option.high == facts.HUGE:
            bound = f">= {option.low:g}"
        else:
            bound = f"[{option.low:g}, {option.high:g}{')' if option.high_open else ']'}"
        raise ArtifactError(f"optimizer option {name}={value!r} must be {bound}")
    options[name] = float(value)  # numpy scalars too, so the options' repr stays literal


def check_options(optimizer, options):
    """Raise ArtifactError naming the option when a value cannot train: the contract's
    ranges (what the device checks again), then the kind's own rules. Numbers become floats
    and flags bools, in place."""
    clip = options["clip_grad_norm"]
    if clip is not None:
        if isinstance(clip, numbers.Real) and clip <= 0:
            raise ArtifactError(f"optimizer option clip_grad_norm={clip!r} must be > 0 (the "
                                f"largest global gradient norm), or None for no clipping")
        _number(options, "clip_grad_norm")
    for name in facts.OPTIMIZERS[optimizer.name].options + ("l1_penalty", "l2_penalty"):
        if facts.OPTIONS[name].flag:
            if options[name] not in (True, False):
                raise ArtifactError(f"optimizer option {name}={options[name]!r} must be True "
                                    f"or False")
            options[name] = bool(options[name])
        else:
            _number(options, name)
    KINDS[optimizer].check(options)


def build_optimizer_graph(g, optimizer, trainable, options, gradients=None):
    """Emit the update nodes into g; returns (input names, output names). gradients: {param:
    gradient name} to update from (default: the accumulation buffers, as ORT's optimizer
    graph; with the backward pass's gradients the update nodes join the training graph)."""
    check_options(optimizer, options)
    grad = (lambda p: gradients[p]) if gradients is not None else grad_buffer
    g.shapes[LEARNING_RATE] = (TensorProto.FLOAT, (1,))
    g.shapes[STEP] = (TensorProto.INT64, (1,))
    inputs, outputs = [LEARNING_RATE, STEP], []
    penalties = {"l1_penalty": options["l1_penalty"], "l2_penalty": options["l2_penalty"]}
    clip_coef = ""
    if options["clip_grad_norm"] is not None:
        # One factor for every gradient, from all of them, before any parameter changes.
        pairs = [name for p in trainable for name in (grad(p), p)]
        clip_coef = g.node("ClipGradNorm", pairs, (1,), domain=DOMAIN, hint="clip_coef",
                           max_norm=options["clip_grad_norm"], **penalties)
    for p in trainable:
        states = [state_name(p, s) for s in state_names(optimizer, options)]
        for s in states:
            g.shapes[s] = g.shapes[p]
        ins = [p, grad(p)] + states
        outs = [f"{p}.out"] + [f"{s}.out" for s in states]
        KINDS[optimizer].update_node(g, p, grad(p), states, clip_coef, outs, options, penalties)
        inputs += ins
        outputs += outs
    return inputs, outputs
