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
from ..contract.ops import RECOMPUTABLE, UPDATES
from ..errors import ArtifactError
from ..ir import ACTIVATION, INT32, NO_TENSOR, Program, Step, Tensor
from .plan import lifetimes, plan


def _storages(step, tensors):
    return {tensors[t].storage for t in step.tensors if t != NO_TENSOR}


def _forward_end(steps, forward_nodes):
    """The index of the first step that no forward node lowered to: where the backward
    pass begins."""
    boundary = 0
    while boundary < len(steps) and steps[boundary].node in forward_nodes:
        boundary += 1
    return boundary


def place_updates(program, tensors):
    """Move every update step of `program` (in place) to right after the last other step
    that touches its parameter's or its gradient's storage. Returns the number moved."""
    updates = [s for s in program.steps if s.op in UPDATES]
    others = [s for s in program.steps if s.op not in UPDATES]
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
    boundary = _forward_end(steps, forward_nodes)
    late = [s.node for s in steps[boundary:] if s.node in forward_nodes]
    if late:
        raise ArtifactError(f"cannot tell forward from backward steps: node name '{late[0]}' "
                            f"is used twice; give the model's nodes unique names")
    programs[first] = Program(first, steps[:boundary],
                              [t for t in combined.inputs if t not in second_inputs],
                              combined.outputs)
    programs[second] = Program(second, steps[boundary:], list(second_inputs), [])


# -- recomputing cheap activations --------------------------------------------------------
# A forward activation the backward pass reads is kept alive from its computation to that
# read, across the whole rest of the forward pass: in a conv net, every BatchNormalization
# input (its gradient needs it) and every ReLU output (ReluGrad reads it). When such a tensor
# comes from a cheap step (an elementwise activation, a normalisation) whose inputs are still
# alive where the backward pass first reads it, or are themselves cheap to recompute, the
# step can run again right there: the forward copy dies at its last forward use, the copy
# lives only across the backward reads. A recomputed step runs the same kernel on the same
# values, so the results are bit-identical; a BatchNormalization recomputed in training mode
# leaves the running statistics alone (the forward pass has updated them once already).
# Each candidate is kept only when the planned region shrinks. Which steps are cheap enough
# is the op table's flag "recomputable" (contract/ops.py RECOMPUTABLE).


def _region(program, tensors):
    spans = lifetimes(program, tensors)
    return plan([(tensors[s].size, first, last) for s, (first, last) in spans.items()])[1]


class _Uses:
    """Per storage of one program: the step writing it (tensors[0]) and the steps touching it."""

    def __init__(self, steps, tensors):
        self.writer, self.touch = {}, {}
        for i, step in enumerate(steps):
            for k, t in enumerate(step.tensors):
                if t == NO_TENSOR:
                    continue
                s = tensors[t].storage
                self.touch.setdefault(s, []).append(i)
                if k == 0:
                    self.writer.setdefault(s, i)


def _recompute_plan(steps, tensors, uses, storage, at, boundary, chain):
    """Append to `chain` the forward steps that recompute `storage` at step `at`, inputs
    first; False when some input would have to be kept alive longer for it."""
    i = uses.writer.get(storage)
    if i is None or i >= boundary or steps[i].op not in RECOMPUTABLE:
        return False
    step = steps[i]
    inputs = step.tensors[1:4] if step.op == op.BATCH_NORM_TRAINING else step.tensors[1:]
    for t in inputs:
        if t == NO_TENSOR or tensors[t].role != ACTIVATION:
            continue        # parameters and constants: unchanged until the updates, last
        s = tensors[t].storage
        if max(uses.touch[s]) >= at or s in chain:
            continue        # alive there anyway (or recomputed already in this chain)
        if not _recompute_plan(steps, tensors, uses, s, at, boundary, chain):
            return False
    chain[storage] = i
    return True


def _apply_recompute(program, lowering, storage, boundary):
    """Recompute `storage` right before its first backward reader; returns the new steps
    list, or None when that is not possible."""
    steps, tensors = program.steps, lowering.tensors
    uses = _Uses(steps, tensors)
    readers = [i for i in uses.touch.get(storage, []) if i >= boundary]
    if not readers or any(tensors[t].storage == storage for t in program.outputs):
        return None
    at = readers[0]
    chain = {}
    if not _recompute_plan(steps, tensors, uses, storage, at, boundary, chain):
        return None
    fresh = {}      # original storage -> its recomputed copy

    def copy_of(t):
        base = tensors[t]
        s = base.storage
        if s not in fresh:
            return t
        if t == s:
            return fresh[s]
        alias = Tensor(base.name + ".recomputed", base.dtype, base.role, base.shape,
                       program=base.program, storage=fresh[s])
        return lowering.add(alias)

    inserted = []
    for s in sorted(chain, key=chain.get):      # in forward order: inputs first
        source = steps[chain[s]]
        base = tensors[s]
        fresh[s] = lowering.add(Tensor(base.name + ".recomputed", base.dtype, base.role,
                                       base.shape, program=base.program))
        args = [copy_of(t) if t != NO_TENSOR else t for t in source.tensors]
        if source.op == op.BATCH_NORM_TRAINING:
            args[4:6] = [NO_TENSOR, NO_TENSOR]  # running statistics: updated once, forward
        inserted.append(Step(source.op, args, list(source.ints), list(source.floats),
                             source.node + " (recomputed)"))
    fresh = {storage: fresh[storage]}   # backward readers take the final copy only
    later = []
    for step in steps[at:]:
        args = [copy_of(t) if t != NO_TENSOR and tensors[t].storage == storage else t
                for t in step.tensors]
        later.append(Step(step.op, args, step.ints, step.floats, step.node))
    return steps[:at] + inserted + later


def recompute_activations(program, lowering, forward_nodes):
    """Recompute cheap forward activations in the backward pass of `program` (in place)
    wherever that shrinks its planned region. Returns [(tensor name, steps added)]."""
    tensors = lowering.tensors
    boundary = _forward_end(program.steps, forward_nodes)
    best = _region(program, tensors)
    done = []
    candidates = [step.tensors[0] for step in program.steps[:boundary]
                  if step.op in RECOMPUTABLE and tensors[step.tensors[0]].role == ACTIVATION]
    for tid in candidates:
        storage = tensors[tid].storage
        known = len(tensors)
        steps = _apply_recompute(program, lowering, storage, boundary)
        trial = steps and type(program)(program.name, steps, program.inputs, program.outputs)
        region = _region(trial, tensors) if steps else best
        if region >= best:
            del tensors[known:]     # the copies of a rejected trial
        else:
            best = region
            done.append((tensors[tid].name, len(steps) - len(program.steps)))
            program.steps[:] = steps
    return done


# -- ReLU masks ----------------------------------------------------------------------------
# ReluGrad reads the forward output y only to ask y > 0. When nothing else in the backward
# pass reads y (a frozen convolution after it needs no activations), the forward step also
# writes that answer as a 1-bit mask into the int arena (RELU_MASKED) and the gradient reads
# the mask (RELU_MASK_GRAD): the float y then dies at its last forward use. In a bias-only
# update of a conv net every ReLU output would otherwise be kept to the end of the forward
# pass. Applied where the float region shrinks by more than the mask takes.

def _mask_plan(program, tensors, storage, boundary):
    """(forward RELU step index, [backward RELU_GRAD indices]) when the ReLU output
    `storage` is read in the backward pass by its gradient only, else None."""
    uses = _Uses(program.steps, tensors)
    i = uses.writer.get(storage)
    if i is None or i >= boundary or program.steps[i].op != op.RELU:
        return None
    backward = [k for k in uses.touch[storage] if k >= boundary]
    for k in backward:
        step = program.steps[k]
        if step.op != op.RELU_GRAD or tensors[step.tensors[2]].storage != storage or any(
                tensors[t].storage == storage for t in step.tensors[:2]):
            return None
    if not backward or any(tensors[t].storage == storage for t in program.outputs):
        return None
    return i, backward


def mask_relus(program, lowering, forward_nodes):
    """Keep 1-bit masks instead of ReLU outputs (see above) wherever that pays; changes
    `program` in place. Returns the names of the ReLU outputs no longer kept."""
    tensors = lowering.tensors
    boundary = _forward_end(program.steps, forward_nodes)
    best = _region(program, tensors)
    done = []
    for step in list(program.steps[:boundary]):
        if step.op != op.RELU:
            continue
        y = step.tensors[0]
        found = _mask_plan(program, tensors, tensors[y].storage, boundary)
        if found is None:
            continue
        i, readers = found
        n = tensors[y].size
        mask = Tensor(tensors[y].name + ".mask", INT32, ACTIVATION, ((n + 29) // 30,),
                      program=tensors[y].program)
        known = len(tensors)
        mask_id = lowering.add(mask)
        steps = list(program.steps)
        steps[i] = Step(op.RELU_MASKED, [y, step.tensors[1], mask_id], [n], [], step.node)
        for k in readers:
            dx, dy, _ = steps[k].tensors
            steps[k] = Step(op.RELU_MASK_GRAD, [dx, dy, mask_id], [n], [], steps[k].node)
        trial = type(program)(program.name, steps, program.inputs, program.outputs)
        region = _region(trial, tensors)
        if region + mask.size < best:
            best = region
            program.steps[:] = steps
            done.append(tensors[y].name)
        else:
            del tensors[known:]
    return done
