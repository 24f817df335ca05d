"""Optimizer graphs: one node per trainable parameter, updating it in place.

Before the update, both optimizers can add an elastic penalty to each gradient,
g + l1_penalty * sign(p) + 2 * l2_penalty * p (the gradient of l1 |p|_1 + l2 |p|^2, as
onnxcustom's ElasticLearningPenalty), and clip the gradients by their global L2 norm (as
torch.nn.utils.clip_grad_norm_, penalty included); weight decay comes after both, as in
torch.optim. The gradient buffers themselves are left untouched."""
import enum
import math
import numbers

from onnx import TensorProto

from ..errors import ArtifactError
from ..graph import DOMAIN


class OptimType(enum.IntEnum):
    """ORT's OptimType values."""
    AdamW = 1
    SGD = 2


# Gradient transforms both optimizers share; clip_grad_norm None = no clipping.
GRADIENT_OPTIONS = {"l1_penalty": 0.0, "l2_penalty": 0.0, "clip_grad_norm": None}
# ORT's onnxblock defaults (AdamW: adam_mode=1, the Hugging Face rule, bias correction on);
# SGD as torch.optim.SGD (momentum, dampening, nesterov, L2-coupled weight_decay).
DEFAULTS = {
    OptimType.AdamW: {"learning_rate": 0.001, "beta1": 0.9, "beta2": 0.999, "epsilon": 1e-6,
                      "weight_decay": 0.0, "bias_correction": True, **GRADIENT_OPTIONS},
    OptimType.SGD: {"learning_rate": 0.001, "momentum": 0.0, "dampening": 0.0,
                    "nesterov": False, "weight_decay": 0.0, **GRADIENT_OPTIONS},
}


def state_names(optimizer, options):
    """Per-parameter optimizer state, with ORT's names: AdamW's two moments, SGD's momentum
    buffer when momentum is on; plain SGD keeps none."""
    if optimizer == OptimType.AdamW:
        return ("momentum0", "momentum1")
    return ("momentum0",) if options.get("momentum", 0.0) else ()


def grad_buffer(param):
    return f"{param}_grad.accumulation.buffer"


def state_name(param, state):
    return f"{param}.{state}"


def _number(options, name, low=0.0, high=math.inf, high_open=False):
    value = options[name]
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise ArtifactError(f"optimizer option {name}={value!r} must be a finite number")
    if value < low or value > high or (high_open and value == high):
        if high == math.inf:
            bound = f">= {low:g}"
        else:
            bound = f"[{low:g}, {high:g}{')' if high_open else ']'}"
        raise ArtifactError(f"optimizer option {name}={value!r} must be {bound}")
    options[name] = float(value)  # numpy scalars too, so the options' repr stays literal


def check_options(optimizer, options):
    """Raise ArtifactError naming the option when a value cannot train (torch.optim's rules).
    Numbers become floats and flags bools, in place."""
    for name in ("learning_rate", "weight_decay", "l1_penalty", "l2_penalty"):
        _number(options, name)
    clip = options["clip_grad_norm"]
    if clip is not None:
        _number(options, "clip_grad_norm", -math.inf)
        if clip <= 0:
            raise ArtifactError(f"optimizer option clip_grad_norm={clip!r} must be > 0 (the "
                                f"largest global gradient norm), or None for no clipping")
    flags = ("bias_correction",) if optimizer == OptimType.AdamW else ("nesterov",)
    for name in flags:
        if options[name] not in (True, False):
            raise ArtifactError(f"optimizer option {name}={options[name]!r} must be True or False")
        options[name] = bool(options[name])
    if optimizer == OptimType.AdamW:
        _number(options, "beta1", 0.0, 1.0, high_open=True)
        _number(options, "beta2", 0.0, 1.0, high_open=True)
        _number(options, "epsilon")
        return
    _number(options, "momentum")
    _number(options, "dampening", 0.0, 1.0)
    if options["nesterov"] and (options["momentum"] <= 0 or options["dampening"] != 0):
        raise ArtifactError(f"nesterov=True needs momentum > 0 and dampening 0 (as in "
                            f"torch.optim.SGD); got momentum={options['momentum']!r}, "
                            f"dampening={options['dampening']!r}")


def build_optimizer_graph(g, optimizer, trainable, options, gradients=None):
    """Emit the update nodes into g; returns (input names, output names). gradients: {param:
    gradient name} to update from (default: the accumulation buffers, as ORT's optimizer
    graph; with the backward pass's gradients the update nodes join the training graph)."""
    check_options(optimizer, options)
    grad = (lambda p: gradients[p]) if gradients is not None else grad_buffer
    lr = "learning_rate"
    step = "step"
    g.shapes[lr] = (TensorProto.FLOAT, (1,))
    g.shapes[step] = (TensorProto.INT64, (1,))
    inputs, outputs = [lr, step], []
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
        shapes = [g.shape(p)] * len(outs)
        if optimizer == OptimType.AdamW:
            g.node("AdamW", _trim([lr, step] + ins + [clip_coef]), shapes, outputs=outs,
                   domain=DOMAIN, alpha=options["beta1"], beta=options["beta2"],
                   epsilon=options["epsilon"], weight_decay=options["weight_decay"],
                   correct_bias=int(options["bias_correction"]), **penalties)
        else:
            momentum = [step] + states if states else ["", ""]
            g.node("SGD", _trim([lr, p, grad(p)] + momentum + [clip_coef]), shapes,
                   outputs=outs, domain=DOMAIN, momentum=options["momentum"],
                   dampening=options["dampening"], nesterov=int(options["nesterov"]),
                   weight_decay=options["weight_decay"], **penalties)
        inputs += ins
        outputs += outs
    return inputs, outputs


def _trim(inputs):
    # ONNX leaves out trailing optional inputs rather than naming them "".
    while inputs and not inputs[-1]:
        inputs = inputs[:-1]
    return inputs
