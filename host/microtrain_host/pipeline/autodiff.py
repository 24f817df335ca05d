"""Reverse-mode autodiff over ONNX graphs, driven by one gradient rule per op type.

A rule (registry.GRAD_RULES, written beside the op in its family module ops/<family>.py)
gets the builder, the forward node, the gradients of the node's outputs (None where no
gradient flows) and which inputs need a gradient; it emits nodes and returns one gradient
name (or None) per input. Gradients of a tensor used several times are summed. Only tensors
that depend on a trainable parameter get gradients, so frozen layers and the input gradient
of the first trainable layer cost nothing. Helpers the rules share live in graph.py."""
import numpy as np

from ..errors import UnsupportedOpError, node_name
from ..registry import GRAD_RULES


def build_gradients(g, forward_nodes, loss, trainable, seeds=None):
    """Emit the backward pass of `forward_nodes` into g; returns {param: gradient name}.
    The pass starts from d loss = 1, or from seeds {output: name of its gradient} when the
    loss is computed outside the graph."""
    needs_grad = set(trainable)
    for node in forward_nodes:
        if any(i in needs_grad for i in node.input if i):
            needs_grad.update(o for o in node.output if o)
    grads = dict(seeds) if seeds else {loss: g.constant("loss_grad", np.float32(1.0))}
    pending = {}  # tensor -> list of gradient contributions not yet summed

    def gradient_of(name):
        parts = pending.pop(name, None)
        if parts:
            total = parts[0]
            for part in parts[1:]:
                total = g.node("Add", [total, part], g.shape(name), hint=f"{name}_grad_sum")
            grads[name] = total
        return grads.get(name)

    for node in reversed(forward_nodes):
        needs = [bool(i) and i in needs_grad for i in node.input]
        if not any(needs):
            continue
        dys = [gradient_of(o) if o else None for o in node.output]
        if all(d is None for d in dys):
            continue
        rule = GRAD_RULES.get(node.op_type)
        if rule is None:
            raise UnsupportedOpError(f"no gradient rule for op '{node.op_type}' (node "
                                     f"{node_name(node)}); supported: "
                                     f"{', '.join(sorted(GRAD_RULES))}")
        for inp, need, dx in zip(node.input, needs, rule(g, node, dys, needs)):
            if need and dx is not None:
                pending.setdefault(inp, []).append(dx)
    return {p: gradient_of(p) for p in trainable}
