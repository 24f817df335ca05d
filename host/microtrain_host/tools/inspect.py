"""Human-readable description of a packed blob, as read by the device's own reader."""
from microtrain import blob as device_blob

from .. import opcodes
from ..pipeline.pack import TRAINING_PROGRAMS
from ..pipeline.upgrade import TARGET_OPSET
from .memory_plan import persistent_parts, render, step_label, timelines

ROLE_ORDER = ("input", "label", "param", "grad", "optimizer_state", "constant", "control",
              "activation")


def _kib(elements):
    return f"{elements * 4 / 1024:.1f} KiB"


def describe(path, steps=True, plan=False):
    """The blob at path in words: memory (by part, and the peak of each program), parameters,
    tensors, and with steps each program step by step; with plan the ASCII memory plan of
    each program (memory_plan.render)."""
    b = device_blob.load(str(path), keep_steps=True)
    lines = []
    opt = b.optimizer
    lines.append(f"blob {path}: format {device_blob.FORMAT_VERSION}, loss {b.loss or '-'}"
                 + (f", {b.num_classes} classes" if b.num_classes else "")
                 + (f", optimizer {opt['kind']} (lr {opt['learning_rate']:g})" if opt else ""))
    if b.source_opset:
        lines.append(f"  exported at opset {b.source_opset}, upgraded on load to opset "
                     f"{TARGET_OPSET} with onnx.version_converter")
    lines.append("")
    lines.append("memory (float32 elements):")
    lines.append(f"  arena            {b.float_arena:8d}  ({_kib(b.float_arena)})  planned, "
                 f"allocated once at load")
    lines.append(f"  naive sum        {b.naive_size:8d}  ({_kib(b.naive_size)})  every tensor "
                 f"in its own space")
    lines.append(f"  lower bound      {b.lower_bound:8d}  ({_kib(b.lower_bound)})  persistent + "
                 f"peak of live temporaries")
    lines.append(f"  int32 arena      {b.int_arena:8d}  ({_kib(b.int_arena)})")
    if b.byte_arena:
        int8 = [t for t in range(len(b.names)) if b.dtypes[t] in (device_blob.INT8,
                                                                   device_blob.UINT8)]
        weights = sum(b.sizes[t] for t in int8
                      if device_blob.ROLE_NAMES[b.roles[t]] == "constant")
        lines.append(f"  int8 arena       {b.byte_arena:8d}  ({b.byte_arena / 1024:.1f} KiB) bytes: "
                     f"{weights} int8 weights ({weights / 1024:.1f} KiB; {4 * weights / 1024:.1f} "
                     f"KiB as float32), {b.byte_arena - weights} bytes of int8 activations")
        total = 4 * (b.float_arena + b.int_arena) + b.byte_arena
        lines.append(f"  all arenas       {total:8d}  bytes ({total / 1024:.1f} KiB); the same "
                     f"layers in float32 would hold {4 * weights - weights} more bytes of "
                     f"weights alone")
    parts = persistent_parts(b)
    lines.append("  persistent part, by what it holds:")
    for part, elements in parts.items():
        if elements:
            lines.append(f"    {part:22s} {elements:8d}  ({_kib(elements)})")
    found = timelines(b)
    for timeline in found:
        if timeline.peak:
            lines.append(f"  {timeline.name + ' temporaries':16s} {timeline.peak:8d}  "
                         f"({_kib(timeline.peak)}) live at the peak, step {timeline.peak_step}"
                         f" ({step_label(b, timeline, timeline.peak_step)})")
    train_steps = sum(len(b.programs[p].steps) for p in TRAINING_PROGRAMS if p in b.programs)
    if train_steps:
        split = " + ".join(f"{len(b.programs[p].steps)} {p}" for p in TRAINING_PROGRAMS
                           if p in b.programs)
        lines.append(f"  train steps      {train_steps:8d}  ({split})")
    recomputed = [n[:-len(".recomputed")] for n in b.names if n.endswith(".recomputed")]
    if recomputed:
        lines.append(f"  recomputed       {len(recomputed)} activations in the backward pass "
                     f"instead of kept: {', '.join(recomputed[:4])}"
                     + (f" and {len(recomputed) - 4} more" if len(recomputed) > 4 else ""))
    if b.updated_in_backward:
        lines.append(f"  updates          in the backward pass ({len(b.updated_in_backward)} "
                     f"parameters, no gradient buffers; Optimizer.step() does nothing)")
    if b.full_training_arena:
        saved = b.full_training_arena - b.float_arena
        lines.append(f"  partial update   {b.float_arena:8d}  vs {b.full_training_arena} training "
                     f"every parameter: pruning saved {saved} ({_kib(saved)}, "
                     f"{100.0 * saved / b.full_training_arena:.0f} %); train program "
                     f"{train_steps} steps vs {b.full_training_steps}")
    quantized = _quantization(b)
    if quantized:
        lines += [""] + quantized
    lines.append("")
    lines.append("parameters:")
    for tensor, grad, state in b.parameters:
        kind = "trainable" if grad >= 0 else "frozen (no gradient buffer)"
        if tensor in b.updated_in_backward:
            kind = "trainable, updated in the backward pass (no gradient buffer)"
        extra = f", grad {b.names[grad]}" if grad >= 0 else ""
        if state:
            extra += ", state " + ", ".join(b.names[s] for s in state)
        lines.append(f"  {b.names[tensor]:24s} {list(b.shapes[tensor])!s:14s} {kind}{extra}")
    lines.append("")
    lines.append("tensors (role, dtype, shape, arena offset, size):")
    persistent_roles = [r for r in ROLE_ORDER if r != "activation"]
    for role in persistent_roles + ["activation"]:
        for tid, name in enumerate(b.names):
            if device_blob.ROLE_NAMES[b.roles[tid]] != role:
                continue
            dtype = ("f32", "i32", "i8", "u8")[b.dtypes[tid]]
            lines.append(f"  {tid:4d} {role:15s} {dtype} {list(b.shapes[tid])!s:14s} "
                         f"@{b.offsets[tid]:<7d} {b.sizes[tid]:7d}  {name}")
    if steps:
        for name, records in b.step_records.items():
            program = b.programs[name]
            lines.append("")
            ins = ", ".join(b.names[t] for t in program.inputs) or "-"
            outs = ", ".join(b.names[t] for t in program.outputs) or "-"
            lines.append(f"program {name}: {len(records)} steps; inputs {ins}; outputs {outs}")
            for i, (op, tensors, ints, floats) in enumerate(records):
                args = ", ".join(b.names[t] if t != device_blob.NO_TENSOR else "-" for t in tensors)
                attrs = " ".join(str(v) for v in ints)
                if floats:
                    attrs += " | " + " ".join(f"{v:g}" for v in floats)
                lines.append(f"  {i:3d} {opcodes.NAMES.get(op, str(op)):17s} ({args})  [{attrs}]")
    if plan:
        for timeline in found:
            lines.append("")
            lines.append(render(b, timeline))
    return "\n".join(lines)


def _quantization(b):
    """The fake-quantized tensors of a QAT blob (the eval program's FAKE_QUANT steps): dtype,
    per tensor or per channel, where the scale and zero point come from; and the bytes the
    quantized weights take as float32 now and as int8 (+ a float32 scale per channel) once
    exported."""
    records = b.step_records.get("eval") or []
    producers = {tensors[0]: (op, tensors) for op, tensors, _, _ in records}
    lines = []
    float_bytes = int8_bytes = 0
    for op, tensors, ints, _ in records:
        if op != opcodes.FAKE_QUANT:
            continue
        y, x, scale, _ = tensors
        outer, channels, inner, qmin, qmax = ints
        dtype = "uint8" if qmin == 0 else "int8"
        source = producers.get(scale)
        if source and source[0] == opcodes.ABS_MAX_SCALE:
            qmin = -127   # |w| / scale <= 127: the int8 grid's -128 is never reached
            how = (f"symmetric, {channels} channel scales = max|w| / 127 of the current "
                   f"weights")
            n = b.sizes[x]
            float_bytes += 4 * n
            int8_bytes += n + 4 * channels
        elif source and source[0] == opcodes.QUANT_PARAMS:
            how = f"per tensor, range {b.names[source[1][2]]} (moving average of min/max)"
        elif device_blob.ROLE_NAMES[b.roles[scale]] == "constant":
            how = "per tensor, fixed scale and zero point (from the quantized model)"
        else:
            how = "per tensor, shares the scale of " + b.names[scale]
        lines.append(f"  {b.names[x]:32s} {dtype:5s} [{qmin}, {qmax}]  {how}")
    if not lines:
        return []
    header = ["quantization-aware training (fake quantization, float arena):"]
    footer = [f"  quantized weights: {float_bytes:,} B as float32, {int8_bytes:,} B as int8 + "
              f"scales once exported ({100.0 * int8_bytes / max(float_bytes, 1):.0f} %)"]
    return header + lines + footer
