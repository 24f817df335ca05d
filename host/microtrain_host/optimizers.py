"""Optimizer graphs: one node per trainable parameter, updating it in place."""
import enum

from onnx import TensorProto

from .graph import DOMAIN


class OptimType(enum.IntEnum):
    """ORT's OptimType values."""
    AdamW = 1
    SGD = 2


# ORT's onnxblock defaults (AdamW: adam_mode=1, the Hugging Face rule, bias correction on).
DEFAULTS = {
    OptimType.AdamW: {"learning_rate": 0.001, "beta1": 0.9, "beta2": 0.999, "epsilon": 1e-6,
                      "weight_decay": 0.0, "bias_correction": True},
    OptimType.SGD: {"learning_rate": 0.001},
}
STATE_NAMES = {OptimType.AdamW: ("momentum0", "momentum1"), OptimType.SGD: ()}


def grad_buffer(param):
    return f"{param}_grad.accumulation.buffer"


def state_name(param, state):
    return f"{param}.{state}"


def build_optimizer_graph(g, optimizer, trainable, options):
    """Emit the update nodes into g; returns (input names, output names)."""
    lr = "learning_rate"
    step = "step"
    g.shapes[lr] = (TensorProto.FLOAT, (1,))
    g.shapes[step] = (TensorProto.INT64, (1,))
    inputs, outputs = [lr, step], []
    for p in trainable:
        states = [state_name(p, s) for s in STATE_NAMES[optimizer]]
        for s in states:
            g.shapes[s] = g.shapes[p]
        ins = [p, grad_buffer(p)] + states
        outs = [f"{p}.out"] + [f"{s}.out" for s in states]
        shapes = [g.shape(p)] * len(outs)
        if optimizer == OptimType.AdamW:
            g.node("AdamW", [lr, step] + ins, shapes, outputs=outs, domain=DOMAIN,
                   alpha=options["beta1"], beta=options["beta2"], epsilon=options["epsilon"],
                   weight_decay=options["weight_decay"],
                   correct_bias=int(options["bias_correction"]))
        else:
            g.node("SGD", [lr] + ins, shapes, outputs=outs, domain=DOMAIN)
        inputs += ins
        outputs += outs
    return inputs, outputs
