"""Arena planning: give every temporary buffer an offset so that buffers alive at the same
time never overlap, in as little space as we can.

The algorithm (the greedy planner TensorFlow Lite Micro uses):
  * a buffer is (size, first step that touches it, last step that touches it), inclusive;
  * take buffers from largest to smallest (ties: longer-lived first, then by index);
  * place each at the lowest offset where it overlaps no already placed buffer whose
    lifetime intersects its own (first fit over the gaps between those buffers);
  * the arena is the highest end of any placed buffer.
The lower bound no plan can beat is the largest total size of buffers alive at one step."""
from .lower import (ACTIVATION, BYTE_TYPES, CONSTANT, CONTROL, FLOAT, GRAD, INPUT, INT32, LABEL,
                    NO_TENSOR, OPTIMIZER_STATE, PARAM)



def _overlaps_in_time(a, b):
    return a[1] <= b[2] and b[1] <= a[2]


def plan(buffers):
    """buffers: [(size, first, last)] -> (offsets, arena size)."""
    order = sorted(range(len(buffers)),
                   key=lambda i: (-buffers[i][0], -(buffers[i][2] - buffers[i][1]), i))
    offsets = [None] * len(buffers)
    placed = []
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


def check(buffers, offsets):
    """Raise AssertionError if two buffers alive at the same time share space."""
    for i, a in enumerate(buffers):
        for j in range(i + 1, len(buffers)):
            b = buffers[j]
            if _overlaps_in_time(a, b) and a[0] and b[0]:
                if offsets[i] < offsets[j] + b[0] and offsets[j] < offsets[i] + a[0]:
                    raise AssertionError(f"buffers {i} and {j} overlap in time and space")


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
    for role in PERSISTENT_ORDER:
        for tid, t in enumerate(tensors):
            if t.role == role and t.storage == tid:
                t.offset = ends[arena(t)]
                ends[arena(t)] += t.size
    for tid, t in enumerate(tensors):
        # Integer activations (bit-packed dropout masks, 1/30 of their float size) get space
        # of their own: the planner shares float space only.
        if t.role == ACTIVATION and t.dtype == INT32 and t.storage == tid:
            t.offset = ends[INT32]
            ends[INT32] += t.size
    base = ends[FLOAT]
    region = peak = 0
    naive = base
    for program in lowering.programs.values():
        spans = lifetimes(program, tensors)
        ids = sorted(spans)
        buffers = [(tensors[s].size, spans[s][0], spans[s][1]) for s in ids]
        offsets, size = plan(buffers)
        check(buffers, offsets)
        naive += sum(b[0] for b in buffers)
        peak = max(peak, lower_bound(buffers))
        for s, off in zip(ids, offsets):
            tensors[s].offset = base + off
        region = max(region, size)
    # int8 / uint8 activations: the same plan in the byte arena, after its persistent part
    byte_region = 0
    for program in lowering.programs.values():
        spans = lifetimes(program, tensors, BYTE_TYPES)
        ids = sorted(spans)
        buffers = [(tensors[s].size, spans[s][0], spans[s][1]) for s in ids]
        offsets, size = plan(buffers)
        check(buffers, offsets)
        for s, off in zip(ids, offsets):
            tensors[s].offset = ends["bytes"] + off
        byte_region = max(byte_region, size)
    lowering.byte_arena = ends["bytes"] + byte_region
    for tid, t in enumerate(tensors):
        if t.storage != tid:
            t.offset = tensors[t.storage].offset
    return base + region, ends[INT32], naive, base + peak
