"""Arena planning: give every temporary buffer an offset so that buffers alive at the same
time never overlap, in as little space as we can.

The algorithm (the greedy planner TensorFlow Lite Micro uses):
  * a buffer is (size, first step that touches it, last step that touches it), inclusive;
  * take buffers from largest to smallest (ties: longer-lived first, then by index);
  * place each at the lowest offset where it overlaps no already placed buffer whose
    lifetime intersects its own (first fit over the gaps between those buffers);
  * the arena is the highest end of any placed buffer.
The lower bound no plan can beat is the largest total size of buffers alive at one step."""
import dataclasses

from ..contract.ops import BY_CODE, WEIGHT_ARGUMENT
from ..ir import (ACTIVATION, BYTE_TYPES, CONSTANT, CONTROL, FLOAT, GRAD, INPUT, INT32, LABEL,
                  NO_TENSOR, OPTIMIZER_STATE, PARAM)



def _overlaps_in_time(a, b):
    return a[1] <= b[2] and b[1] <= a[2]


def plan(buffers, fixed=None):
    """buffers: [(size, first, last)] -> (offsets, arena size). fixed: {index: offset} of
    buffers already placed (shared with a program planned before)."""
    fixed = fixed or {}
    order = sorted((i for i in range(len(buffers)) if i not in fixed),
                   key=lambda i: (-buffers[i][0], -(buffers[i][2] - buffers[i][1]), i))
    offsets = [None] * len(buffers)
    placed = []
    for i, at in fixed.items():
        offsets[i] = at
        placed.append(i)
    for i in order:
        size = buffers[i][0]
        busy = sorted((offsets[j], offsets[j] + buffers[j][0]) for j in placed
                      if _overlaps_in_time(buffers[i], buffers[j]))
        at = 0
        for start, end in busy:
            if at + size <= start:
                break
            at = max(at, end)
        offsets[i] = at
        placed.append(i)
    size = max((offsets[i] + buffers[i][0] for i in range(len(buffers))), default=0)
    return offsets, size


def lower_bound(buffers):
    """Largest total size alive at one step: no arena can be smaller."""
    if not buffers:
        return 0
    last = max(b[2] for b in buffers)
    return max(sum(b[0] for b in buffers if b[1] <= t <= b[2]) for t in range(last + 1))


def conflict(buffers, offsets):
    """The first pair (i, j) of buffers alive at the same time that share space, or None."""
    for i, a in enumerate(buffers):
        for j in range(i + 1, len(buffers)):
            b = buffers[j]
            if _overlaps_in_time(a, b) and a[0] and b[0]:
                if offsets[i] < offsets[j] + b[0] and offsets[j] < offsets[i] + a[0]:
                    return i, j
    return None


def check(buffers, offsets):
    """Raise AssertionError if two buffers alive at the same time share space."""
    pair = conflict(buffers, offsets)
    if pair is not None:
        raise AssertionError(f"buffers {pair[0]} and {pair[1]} overlap in time and space")


def picture(buffers, offsets, size, width=64, names=None):
    """ASCII picture of a plan: one row per step, one column per arena slice."""
    if not buffers or not size:
        return "(no temporaries)"
    scale = max(1, -(-size // width))
    last = max(b[2] for b in buffers)
    symbols = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
    rows = []
    for t in range(last + 1):
        row = ["."] * (-(-size // scale))
        for i, (n, first, end) in enumerate(buffers):
            if first <= t <= end:
                for c in range(offsets[i] // scale, -(-(offsets[i] + n) // scale)):
                    row[c] = symbols[i % len(symbols)]
        rows.append(f"{t:4d} {''.join(row)}")
    if names:
        rows.append("     " + "  ".join(f"{symbols[i % len(symbols)]}={n}" for i, n in
                                         enumerate(names)))
    return "\n".join(rows)


# -- the blob's two arenas ---------------------------------------------------------------

PERSISTENT_ORDER = (INPUT, LABEL, PARAM, GRAD, OPTIMIZER_STATE, CONSTANT, CONTROL)
# The int8 kernels read their weight (contract.ops.WEIGHT_ARGUMENT: the tensor argument of
# kind "w") through a buffer of its own rather than the byte arena: an int8 constant read
# only there takes no arena space. A board reads it in place from the blob in flash; a blob
# loaded from a file gets one buffer of such weights.


def mark_in_place(lowering):
    """Tensor.in_place of every int8 / uint8 constant that steps read only as their weight."""
    uses = {}
    for program in lowering.programs.values():
        for step in program.steps:
            for k, tid in enumerate(step.tensors):
                if tid != NO_TENSOR:
                    uses.setdefault(tid, set()).add(WEIGHT_ARGUMENT.get(step.op) == k)
    for tid, t in enumerate(lowering.tensors):
        t.in_place = (t.role == CONSTANT and t.dtype in BYTE_TYPES and not t.derived
                      and t.storage == tid and uses.get(tid) == {True})


def lifetimes(program, tensors, dtypes=(FLOAT,)):
    """{storage id: [first step, last step]} of the activations of those dtypes a program
    touches."""
    spans = {}
    for index, step in enumerate(program.steps):
        for tid in step.tensors:
            if (tid == NO_TENSOR or tensors[tid].role != ACTIVATION
                    or tensors[tid].dtype not in dtypes):
                continue
            s = tensors[tid].storage
            span = spans.setdefault(s, [index, index])
            span[1] = index
    for tid in program.outputs:
        s = tensors[tid].storage
        if s in spans:
            spans[s][1] = len(program.steps)
    return spans


def assign_offsets(lowering):
    """Persistent tensors first, one after another; then each program's temporaries
    planned into one shared region. Returns the float arena, int arena, naive sum (every
    tensor in its own space) and lower bound (persistent + largest live peak), in elements."""
    tensors = lowering.tensors
    ends = {FLOAT: 0, INT32: 0, "bytes": 0}
    arena = lambda t: "bytes" if t.dtype in BYTE_TYPES else t.dtype  # noqa: E731
    mark_in_place(lowering)
    for role in PERSISTENT_ORDER:
        for tid, t in enumerate(tensors):
            if t.role == role and t.storage == tid and not t.in_place:
                t.offset = ends[arena(t)]
                ends[arena(t)] += t.size
    # Each program's activations, planned into one region per arena: float, int32 (bit-packed
    # dropout masks, the accumulator planes of int8 convolutions), int8 / uint8. An eval
    # activation shared with the training program (Lowering.twin) keeps its place.
    regions = {}
    naive = ends[FLOAT]
    peak = 0
    for dtypes, arena in (((FLOAT,), FLOAT), ((INT32,), INT32), (BYTE_TYPES, "bytes")):
        regions[arena] = 0
        placed = {}
        for program in lowering.programs.values():
            while True:
                spans = lifetimes(program, tensors, dtypes)
                ids = sorted(spans)
                buffers = [(tensors[s].size, spans[s][0], spans[s][1]) for s in ids]
                fixed = {k: placed[s] for k, s in enumerate(ids) if s in placed}
                offsets, size = plan(buffers, fixed)
                pair = conflict(buffers, offsets)
                if pair is None:
                    break
                # two shared buffers apart in time in training meet here: this program
                # gets its own copy of one of them
                _unshare(lowering, program, ids[pair[1] if pair[1] in fixed else pair[0]])
            for s, off in zip(ids, offsets):
                placed[s] = off
                tensors[s].offset = ends[arena] + off
            regions[arena] = max(regions[arena], size)
            if arena == FLOAT:
                naive += sum(b[0] for b in buffers)
                peak = max(peak, lower_bound(buffers))
    base = ends[FLOAT]
    region = regions[FLOAT]
    ends[INT32] += regions[INT32]
    lowering.byte_arena = ends["bytes"] + regions["bytes"]
    for tid, t in enumerate(tensors):
        if t.storage != tid:
            t.offset = tensors[t.storage].offset
    return base + region, ends[INT32], naive, base + peak


def _unshare(lowering, program, storage):
    """Give `program` its own copy of the activation storage `storage` (and of the aliases of
    it the program uses): new tensor entries, the program's steps and outputs renamed."""
    tensors = lowering.tensors
    used = {t for step in program.steps for t in step.tensors} | set(program.outputs)
    mapping = {}
    for tid in [storage] + [k for k, t in enumerate(tensors) if t.storage == storage and
                            k != storage and k in used]:
        clone = dataclasses.replace(tensors[tid], program=program.name)
        tensors.append(clone)
        mapping[tid] = len(tensors) - 1
    for tid, new in mapping.items():
        tensors[new].storage = mapping[storage]
    for step in program.steps:
        step.tensors = [mapping.get(t, t) for t in step.tensors]
    program.outputs = [mapping.get(t, t) for t in program.outputs]
    program.inputs = [mapping.get(t, t) for t in program.inputs]


# roles a frozen prefix may touch: skipping its steps must change nothing a later step or a
# later call reads, so no parameter, gradient, optimizer state or control value
_PREFIX_ROLES = (ACTIVATION, CONSTANT, INPUT, LABEL)


def mark_latent(lowering, name="train"):
    """Program.latent_from / latent of an integer training program (device latent.py): when
    the steps before some step s touch only activations, frozen constants and the inputs,
    a batch trained once can be trained again by writing back the tensors alive across s
    (the frozen prefix's output; the labels, the input where a later step reads it) and
    running the steps from s on: the same steps on the same values, so the parameters end
    bit for bit as without the cache. s is the latest such step whose live tensors are all
    int8 / uint8 / int32 and batch-major (the cache stores them per sample); 0 when there
    is none (a first layer that trains). A "scratch" argument (the contract's name: the
    kernel writes it before it reads it) carries nothing between steps. Call after
    assign_offsets: the storages are final."""
    program = lowering.programs.get(name)
    if program is None:
        return
    tensors = lowering.tensors
    last_free = len(program.steps)
    for index, step in enumerate(program.steps):
        if any(t != NO_TENSOR and tensors[t].role not in _PREFIX_ROLES for t in step.tensors):
            last_free = index
            break
    spans = {}          # storage: [first, last] use, a "scratch" argument's not counted
    read_at = {}        # an input's first and last use (the caller writes it before step 0)
    for index, step in enumerate(program.steps):
        names = BY_CODE[step.op].tensors
        for k, t in enumerate(step.tensors):
            if t == NO_TENSOR or names[k][0] == "scratch":
                continue
            storage = tensors[t].storage        # (a view of an input is the input)
            if storage in program.inputs:
                read_at.setdefault(storage, [index, index])[1] = index
            elif tensors[t].role == ACTIVATION:
                spans.setdefault(storage, [index, index])[1] = index
    for t in program.outputs:
        if tensors[t].storage in spans:
            spans[tensors[t].storage][1] = len(program.steps)
    program.latent_from, program.latent = 0, []
    batch = tensors[program.inputs[0]].shape[0]
    for cut in range(last_free, 0, -1):
        kept = [s for s, (first, last) in sorted(spans.items()) if first < cut <= last]
        kept += [t for t in program.inputs if t in read_at and read_at[t][1] >= cut]
        if kept and all(tensors[t].dtype in (INT32,) + BYTE_TYPES
                        and tuple(tensors[t].shape[:1]) == (batch,) for t in kept):
            program.latent_from, program.latent = cut, kept
            return
