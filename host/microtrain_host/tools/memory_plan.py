"""Where the arena goes, read back from a blob: the persistent part by role, and for every
step of a program the temporaries alive and their place in the planned region, printed as
an ASCII plan the way TensorFlow Lite Micro's planner prints its own (one row per step, one
column per slice of the region, one character per buffer).

Programs planned as one timeline are shown as one: "train" followed by "backward_update"
(updates in the backward pass), "forward" followed by "backward" (loss outside the graph).
It draws the float arena, where the planner shares space; the int8 activations of the byte
arena (issue 10) have a plan of their own, not drawn here yet."""
import dataclasses

from microtrain import blob as device_blob

from ..contract.ops import name_of

TIMELINES = (("train", ("train", "backward_update")), ("train", ("forward", "backward")),
             ("eval", ("eval",)), ("optimizer", ("optimizer",)), ("infer", ("infer",)))
SYMBOLS = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
_ACTIVATION = device_blob.ROLE_NAMES.index("activation")


@dataclasses.dataclass
class Buffer:
    tensor: int            # the tensor that owns the space (aliases of it share the buffer)
    offset: int
    size: int
    first: int
    last: int


@dataclasses.dataclass
class Timeline:
    name: str
    programs: list         # [(program name, first step index in the timeline)]
    steps: list            # [(program name, op code, tensor ids)]
    buffers: list          # [Buffer] of the float temporaries
    live: list             # live temporary elements at each step
    base: int              # where the temporaries region starts (end of the persistent part)

    @property
    def peak_step(self):
        return max(range(len(self.live)), key=self.live.__getitem__) if self.live else -1

    @property
    def peak(self):
        return max(self.live) if self.live else 0


def persistent_parts(b):
    """{part: float elements} of the persistent arena: trainable and frozen parameters,
    gradient buffers, optimizer state, inputs (and labels), constants and controls."""
    parts = {"trainable parameters": 0, "frozen parameters": 0, "gradient buffers": 0,
             "optimizer state": 0, "inputs and labels": 0, "constants and controls": 0}
    trainable = {t for t, g, _ in b.parameters if b.is_trainable(t, g)}
    role_part = {"param": None, "grad": "gradient buffers", "optimizer_state": "optimizer state",
                 "input": "inputs and labels", "label": "inputs and labels",
                 "constant": "constants and controls", "control": "constants and controls"}
    seen = set()
    for tid, name in enumerate(b.names):
        role = device_blob.ROLE_NAMES[b.roles[tid]]
        if role == "activation" or b.dtypes[tid] != device_blob.FLOAT:
            continue
        key = (b.offsets[tid], b.sizes[tid])
        if key in seen:            # an alias of a tensor already counted
            continue
        seen.add(key)
        part = role_part[role] or ("trainable parameters" if tid in trainable
                                   else "frozen parameters")
        parts[part] += b.sizes[tid]
    return parts


def integer_parts(b):
    """{part: bytes} of the persistent part of the int32 and int8 / uint8 arenas (an int8
    or integer training blob), as persistent_parts; the int8 weights the kernels read in
    place (b.in_place) lie outside the arenas and are not counted."""
    parts = {"trainable parameters": 0, "frozen parameters": 0, "optimizer state": 0,
             "inputs and labels": 0, "constants and controls": 0}
    trainable = {t for t, g, _ in b.parameters if b.is_trainable(t, g)}
    role_part = {"param": None, "grad": "optimizer state", "optimizer_state": "optimizer state",
                 "input": "inputs and labels", "label": "inputs and labels",
                 "constant": "constants and controls", "control": "constants and controls"}
    seen = set()
    for tid in range(len(b.names)):
        role = device_blob.ROLE_NAMES[b.roles[tid]]
        dtype = b.dtypes[tid]
        if role == "activation" or dtype == device_blob.FLOAT or tid in b.in_place:
            continue
        key = (dtype == device_blob.INT32, b.offsets[tid], b.sizes[tid])
        if key in seen:            # an alias of a tensor already counted
            continue
        seen.add(key)
        part = role_part[role] or ("trainable parameters" if tid in trainable
                                   else "frozen parameters")
        parts[part] += device_blob.ITEM_BYTES[dtype] * b.sizes[tid]
    return parts


def timelines(b):
    """The blob's programs as planned timelines (needs a blob loaded with keep_steps)."""
    found = []
    for name, members in TIMELINES:
        present = [p for p in members if p in b.step_records]
        if present and present[0] == members[0]:
            found.append(_timeline(b, name, present))
    return found


def _timeline(b, name, members):
    steps, starts, outputs = [], [], []
    for program in members:
        starts.append((program, len(steps)))
        steps.extend((program, op, tensors) for op, tensors, _, _ in b.step_records[program])
        outputs.extend(b.programs[program].outputs)
    def storage(tid):          # aliases (Reshape, Flatten, ...) live as their base tensor
        return b.alias_of[tid] if b.alias_of and b.alias_of[tid] >= 0 else tid
    spans = {}
    for index, (_, _, tensors) in enumerate(steps):
        for tid in tensors:
            if (tid != device_blob.NO_TENSOR and b.roles[tid] == _ACTIVATION
                    and b.dtypes[tid] == device_blob.FLOAT):
                span = spans.setdefault(storage(tid), [index, index])
                span[1] = index
    for tid in outputs:            # the caller reads outputs after the last step
        if storage(tid) in spans:
            spans[storage(tid)][1] = len(steps) - 1
    buffers = [Buffer(s, b.offsets[s], b.sizes[s], first, last)
               for s, (first, last) in sorted(spans.items(), key=lambda kv: (kv[1][0], kv[0]))]
    base = min((x.offset for x in buffers), default=b.float_arena)
    live = [_union([x for x in buffers if x.first <= t <= x.last]) for t in range(len(steps))]
    return Timeline(name, starts, steps, buffers, live, base)


def _union(buffers):
    total, end = 0, None
    for start, stop in sorted((x.offset, x.offset + x.size) for x in buffers):
        if end is None or start >= end:
            total += stop - start
            end = stop
        elif stop > end:
            total += stop - end
            end = stop
    return total


def _kib(elements):
    return f"{elements * 4 / 1024:.1f} KiB"


def step_label(b, timeline, index):
    program, op, tensors = timeline.steps[index]
    out = b.names[tensors[0]] if tensors and tensors[0] != device_blob.NO_TENSOR else "-"
    return f"{name_of(op)} -> {out}"


def render(b, timeline, width=64):
    """The ASCII plan of one timeline: a header, one row per step (live KiB, the region
    with one character per buffer, the step), then the legend of buffers."""
    region = max((x.offset + x.size for x in timeline.buffers), default=timeline.base) \
        - timeline.base
    if not region:
        return (f"timeline {timeline.name} ({' + '.join(p for p, _ in timeline.programs)}): "
                f"{len(timeline.steps)} steps, no temporaries")
    scale = max(1, -(-region // width))
    columns = -(-region // scale) if region else 0
    lines = [f"timeline {timeline.name} ({' + '.join(p for p, _ in timeline.programs)}): "
             f"{len(timeline.steps)} steps, temporaries region {region} elements "
             f"({_kib(region)}) from arena offset {timeline.base}, one column = {scale} "
             f"elements; peak {timeline.peak} live ({_kib(timeline.peak)}) at step "
             f"{timeline.peak_step}"]
    lines.append(f"{'step':>5} {'live':>10}  |{'-' * columns}|")
    peak_step = timeline.peak_step
    for t in range(len(timeline.steps)):
        row = ["."] * columns
        # Largest first, so that a buffer smaller than a column still shows on top.
        for k, x in sorted(enumerate(timeline.buffers), key=lambda kx: -kx[1].size):
            if x.first <= t <= x.last:
                symbol = SYMBOLS[k % len(SYMBOLS)]
                for c in range((x.offset - timeline.base) // scale,
                               -(-(x.offset - timeline.base + x.size) // scale)):
                    row[c] = symbol
        marker = " <- peak" if t == peak_step else ""
        for program, start in timeline.programs:
            if t == start and len(timeline.programs) > 1:
                lines.append(f"{'':>5} {'':>10}   program {program}:")
        lines.append(f"{t:5d} {_kib(timeline.live[t]):>10}  |{''.join(row)}| "
                     f"{step_label(b, timeline, t)}{marker}")
    lines.append("buffers (symbol: offset in the region, elements, steps, tensor):")
    for k, x in enumerate(timeline.buffers):
        lines.append(f"  {SYMBOLS[k % len(SYMBOLS)]}: @{x.offset - timeline.base:<7d} "
                     f"{x.size:7d}  {x.first:4d}-{x.last:<4d} {b.names[x.tensor]}")
    return "\n".join(lines)
