"""Human-readable description of a packed blob, as read by the device's own reader."""
import numpy as np
from microtrain import blob as device_blob
from microtrain import parser as device_blob_parser
from microtrain.errors import BlobError
from microtrain.flatbuf import Reader

from .. import opcodes
from ..contract.ops import name_of
from ..pipeline.pack import TRAINING_PROGRAMS
from ..pipeline.upgrade import TARGET_OPSET
from .memory_plan import integer_parts, persistent_parts, render, step_label, timelines

ROLE_ORDER = ("input", "label", "param", "grad", "optimizer_state", "constant", "control",
              "activation")


def _kib(elements):
    return f"{elements * 4 / 1024:.1f} KiB"


def _name(b, tid):
    return b.names[tid] or f"#{tid}"


def describe(path, steps=True, plan=False, scales=False, checkpoint=None):
    """The blob at path in words: memory (by part, and the peak of each program), parameters,
    tensors, and with steps each program step by step; with plan the ASCII memory plan of
    each program (memory_plan.render). scales: every per-channel scale, not a range.
    checkpoint: a QAT model's checkpoint, to show the scales and zero points it holds now
    (the observers' ranges, the weights' max |w| / 127)."""
    b = device_blob_parser.load(str(path), keep_steps=True)
    values = None
    if checkpoint is not None:
        from ..formats.checkpoint import read_checkpoint
        state = read_checkpoint(str(checkpoint))
        values = {**state.trainable, **state.frozen}
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
    integer = integer_parts(b) if b.int_arena or b.byte_arena else {}
    if b.byte_arena or b.in_place:
        lines += _byte_arena_lines(b, integer)
    parts = persistent_parts(b)
    if any(parts.values()) or not any(integer.values()):
        lines.append("  persistent part, by what it holds:")
    for part, elements in parts.items():
        if elements:
            lines.append(f"    {part:22s} {elements:8d}  ({_kib(elements)})")
    if any(integer.values()):
        lines.append("  persistent part of the int32 and int8 arenas, by what it holds (bytes):")
        for part, nbytes in integer.items():
            if nbytes:
                lines.append(f"    {part:22s} {nbytes:8d}  ({nbytes / 1024:.1f} KiB)")
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
    lines += [""] + blob_bytes(str(path))
    quantized = _quantization(b, values)
    if quantized:
        lines += [""] + quantized
    lines += quantized_tensors(b, scales)
    lines.append("")
    lines.append("parameters:")
    for tensor, grad, state in b.parameters:
        kind = "trainable" if grad >= 0 else "frozen (no gradient buffer)"
        if grad < 0 and b.dtypes[tensor] != device_blob.FLOAT:
            kind = (f"trainable, in integers ({('int8', 'int32')[b.dtypes[tensor] == 1]}; "
                    f"updated by the train program's steps, no gradient buffer)")
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
                         f"@{b.offsets[tid]:<7d} {b.sizes[tid]:7d}  {_name(b, tid)}")
    if steps:
        for name, records in b.step_records.items():
            program = b.programs[name]
            lines.append("")
            ins = ", ".join(b.names[t] for t in program.inputs) or "-"
            outs = ", ".join(b.names[t] for t in program.outputs) or "-"
            lines.append(f"program {name}: {len(records)} steps; inputs {ins}; outputs {outs}")
            for i, (op, tensors, ints, floats) in enumerate(records):
                args = ", ".join(_name(b, t) if t != device_blob.NO_TENSOR else "-"
                                 for t in tensors)
                attrs = " ".join(str(v) for v in ints)
                if floats:
                    attrs += " | " + " ".join(f"{v:g}" for v in floats)
                lines.append(f"  {i:3d} {name_of(op):17s} ({args})  [{attrs}]")
    if plan:
        for timeline in found:
            lines.append("")
            lines.append(render(b, timeline))
    return "\n".join(lines)


def _byte_arena_lines(b, integer):
    """The int8 / uint8 arena in bytes (its persistent part and the int8 activations), the
    int8 weights read in place (outside the arenas) and every arena together, as the device
    loader allocates them (loader.load_into_arenas, inplace.load_buffer)."""
    persistent = sum(integer.values()) - 4 * _int32_persistent(b)
    activations = b.byte_arena - persistent
    read_in_place = sum(b.sizes[t] for t in b.in_place)
    lines = [f"  int8 arena       {b.byte_arena:8d}  bytes ({b.byte_arena / 1024:.1f} KiB): "
             f"{persistent} persistent (int8 parameters, inputs, constants), "
             f"{activations} of int8 activations"]
    if read_in_place:
        lines.append(f"  int8 weights     {read_in_place:8d}  bytes ({read_in_place / 1024:.1f} KiB) "
                     f"read in place: a buffer beside the arenas when the blob is a file, "
                     f"none when it is in flash (ROMFS); {4 * read_in_place / 1024:.1f} KiB as "
                     f"float32")
    train = b.programs.get("train")
    if train is not None and train.latent_from:
        # a frozen prefix before every trained layer: microtrain.latent's record per batch
        record = sum(b.sizes[t] * (4 if b.dtypes[t] == device_blob.INT32 else 1)
                     for t in train.latent)
        lines.append(f"  latent cache     {record:8d}  bytes per training batch "
                     f"(microtrain.latent.LatentCache, in RAM or a file): later epochs run "
                     f"steps {train.latent_from}-{len(train.steps) - 1} of the train program, "
                     f"not the frozen layers before them")
    total = 4 * (b.float_arena + b.int_arena) + b.byte_arena
    lines.append(f"  all arenas       {total:8d}  bytes ({total / 1024:.1f} KiB)"
                 + (f"; {total + read_in_place} with the weights' buffer of a blob file"
                    if read_in_place else ""))
    return lines


def _int32_persistent(b):
    # int32 elements of the persistent part (integer_parts counts them with the int8 bytes)
    seen = set()
    for t in range(len(b.names)):
        if (b.dtypes[t] == device_blob.INT32 and b.roles[t] != device_blob.ROLE_ACTIVATION
                and t not in b.in_place):
            seen.add((b.offsets[t], b.sizes[t]))
    return sum(size for _, size in seen)


def _quantization(b, values=None):
    """The fake-quantized tensors of a QAT blob (the eval program's FAKE_QUANT steps): dtype,
    per tensor or per channel, where the scale and zero point come from (with `values`, a
    checkpoint's parameters: their values now); and the bytes the quantized weights take as
    float32 now and as int8 (+ a float32 scale per channel) once exported."""
    from ..ops.quant import abs_max_scale_values, qparams_values
    records = b.step_records.get("eval") or []
    producers = {tensors[0]: (op, tensors, ints, floats) for op, tensors, ints, floats in records}
    constants = dict(b.constants)
    lines = []
    float_bytes = int8_bytes = 0
    for op, tensors, ints, _ in records:
        if op != opcodes.FAKE_QUANT:
            continue
        y, x, scale, _ = tensors
        outer, channels, inner, qmin, qmax = ints
        dtype = "uint8" if qmin == 0 else "int8"
        source = producers.get(scale)
        now = ""
        if source and source[0] == opcodes.ABS_MAX_SCALE:
            qmin = -127   # |w| / scale <= 127: the int8 grid's -128 is never reached
            how = (f"symmetric, {channels} channel scales = max|w| / 127 of the current "
                   f"weights")
            n = b.sizes[x]
            float_bytes += 4 * n
            int8_bytes += n + 4 * channels
            w = (values or {}).get(b.names[source[1][1]])
            if w is not None:
                view = np.asarray(w, np.float32).reshape(source[2])
                now = "; now " + _values([float(v) for v in abs_max_scale_values(
                    view, 1, source[3][0], source[3][1])], False) + ", zero point 0"
        elif source and source[0] == opcodes.QUANT_PARAMS:
            how = f"per tensor, range {b.names[source[1][2]]} (moving average of min/max)"
            observed = (values or {}).get(b.names[source[1][2]])
            if observed is not None:
                s_, z_ = qparams_values(observed[0], observed[1], *source[2], source[3][0])
                now = (f"; now [{float(observed[0])!r}, {float(observed[1])!r}]: scale "
                       f"{float(s_)!r}, zero point {z_}")
        elif device_blob.ROLE_NAMES[b.roles[scale]] == "constant":
            how = "per tensor, fixed scale and zero point (from the quantized model)"
            if scale in constants:
                now = f": scale {float(np.frombuffer(constants[scale], '<f4')[0])!r}"
        else:
            how = "per tensor, shares the scale of " + b.names[scale]
        lines.append(f"  {b.names[x]:32s} {dtype:5s} [{qmin}, {qmax}]  {how}{now}")
    if not lines:
        return []
    header = ["quantization-aware training (fake quantization, float arena):"]
    footer = [f"  quantized weights: {float_bytes:,} B as float32, {int8_bytes:,} B as int8 + "
              f"scales once exported ({100.0 * int8_bytes / max(float_bytes, 1):.0f} %)"] \
        if float_bytes else []
    return header + lines + footer


def _values(values, every):
    if len(values) == 1 or every:
        return " ".join(repr(v) for v in values)
    return f"{len(values)} values {min(values)!r} .. {max(values)!r}"


def quantized_tensors(b, every=False):
    """Each quantized tensor of an int8 blob: dtype, scale(s), zero point(s) (as stored in
    the blob: real = (q - zero point) * scale), and the int32 biases with the scales they
    imply (input scale x weight scale, float32, as onnxruntime's quantizer writes them)."""
    lines = []
    for tid in sorted(b.quant):
        scale, zero_point, axis = b.quant[tid]
        dtype = "int8" if b.dtypes[tid] == device_blob.INT8 else "uint8"
        where = f" (axis {axis})" if len(scale) > 1 else ""
        lines.append(f"  {_name(b, tid):44s} {dtype:5s} scale{where} {_values(scale, every)}; "
                     f"zero point {_values(zero_point, every)}")
    for name, records in b.step_records.items():
        for op, tensors, ints, floats in records:
            if op not in (opcodes.QLINEAR_GEMM, opcodes.QLINEAR_CONV) or \
                    tensors[3] == device_blob.NO_TENSOR or tensors[3] in b.quant:
                continue
            x, w = b.quant.get(tensors[1]), b.quant.get(tensors[2])
            if x is None or w is None:
                continue
            f = np.float32
            bias_scales = [float(f(f(x[0][0]) * f(s))) for s in w[0]]
            b.quant[tensors[3]] = (bias_scales, (0,), 0)   # once per bias
            lines.append(f"  {_name(b, tensors[3]):44s} int32 scale (input x weight) "
                         f"{_values(bias_scales, every)}; zero point 0")
    if not lines:
        return []
    return ["", "quantized tensors (real = (q - zero point) * scale; int8 weights per output "
                "channel):"] + lines


def blob_bytes(path):
    """Where the blob's bytes go: constant data by dtype, quantization parameters, the
    tensor table, each program, the inference template (what Module.export_model_for_
    inferencing streams), the rest (FlatBuffers tables, vtables, padding). Each string or
    vector counts once however many tables share it."""
    data = device_blob_parser.read(path)
    r = Reader(memoryview(data)[:len(data) - 4], BlobError, start=4)
    root = r.root()
    seen = set()
    totals = {}

    def count(kind, table, field, size):
        pos, n = r.vector(table, field, size, kind)
        if pos and pos not in seen:
            seen.add(pos)
            totals[kind] = totals.get(kind, 0) + 4 + n * size + (size == 1 and kind == "names")

    kinds = ("float", "int32", "int8")
    for t in r.tables(root, 2, "tensor"):
        dtype = r.scalar(t, 1, "B", 0)
        count(f"{kinds[min(dtype, 2)]} constant data", t, 6, 1)
        count("names", t, 0, 1)
        count("shapes", t, 3, 4)
        count("scales and zero points", t, 9, 4)
        count("scales and zero points", t, 10, 4)
    for program in r.tables(root, 4, "program"):
        name = r.string(program, 0, "program name")
        for step in r.tables(program, 1, "step"):
            for field in (1, 2, 3):
                count(f"{name} program (step vectors)", step, field, 4)
    template = r.table(root, 14, "inference template")
    if template is not None:
        count("inference template", template, 0, 1)
        count("inference template", template, 1, 4)
    lines = [f"blob bytes ({len(data):,}; strings and vectors tables share counted once):"]
    for kind, n in sorted(totals.items(), key=lambda kv: -kv[1]):
        lines.append(f"  {n:8,d}  {kind}")
    rest = len(data) - sum(totals.values())
    lines.append(f"  {rest:8,d}  tables, vtables, offsets, padding, frame")
    return lines
