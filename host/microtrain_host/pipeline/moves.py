"""Memory moves on a lowered training program, before the arena is planned.

* place_updates: with update_in_backward the update steps (SGD, AdamW) come last in the
  lowered program; each moves up to right after the last step that reads its parameter or
  writes its gradient. The gradient is then a temporary that lives from its computation to
  its update instead of a persistent buffer, and no step reads a parameter after its update.
* split_program: cut a program planned as one timeline into two at the forward / backward
  boundary (the activations the second part reads stay where the plan put them).

Steps are (op code, tensor ids, ints, floats); a tensor's `storage` is the tensor whose space
it uses, so aliases (Reshape, Flatten, ...) count as the tensor they alias."""
from .. import opcodes as op
from ..errors import ArtifactError
from .lower import NO_TENSOR, Program

UPDATE_OPS = (op.SGD, op.SGD_GENERAL, op.ADAMW, op.ADAMW_GENERAL)


def _storages(step, tensors):
    return {tensors[t].storage for t in step.tensors if t != NO_TENSOR}


def place_updates(program, tensors):
    """Move every update step of `program` (in place) to right after the last other step
    that touches its parameter's or its gradient's storage. Returns the number moved."""
    updates = [s for s in program.steps if s.op in UPDATE_OPS]
    others = [s for s in program.steps if s.op not in UPDATE_OPS]
    after = {}  # index in `others` -> the updates that follow it
    for update in updates:
        param, grad = update.tensors[0], update.tensors[1]
        watched = {tensors[param].storage, tensors[grad].storage}
        anchor = max((i for i, s in enumerate(others) if _storages(s, tensors) & watched),
                     default=-1)
        if anchor < 0:
            raise ArtifactError(f"update of '{tensors[param].name}': no step computes its "
                                f"gradient '{tensors[grad].name}'")
        after.setdefault(anchor, []).append(update)
    program.steps[:] = [s for i, step in enumerate(others)
                        for s in [step] + after.get(i, [])]
    return len(updates)


def split_program(programs, name, forward_nodes, first, second, second_inputs=()):
    """Replace programs[name] by programs[first] (its leading steps from forward_nodes: the
    inputs, the outputs) and programs[second] (the rest; inputs second_inputs, no outputs)."""
    combined = programs.pop(name)
    steps = combined.steps
    boundary = 0
    while boundary < len(steps) and steps[boundary].node in forward_nodes:
        boundary += 1
    late = [s.node for s in steps[boundary:] if s.node in forward_nodes]
    if late:
        raise ArtifactError(f"cannot tell forward from backward steps: node name '{late[0]}' "
                            f"is used twice; give the model's nodes unique names")
    programs[first] = Program(first, steps[:boundary],
                              [t for t in combined.inputs if t not in second_inputs],
                              combined.outputs)
    programs[second] = Program(second, steps[boundary:], list(second_inputs), [])
