"""What each sparse-update choice costs: the model packed once per choice (biases only, the
last k layers with and without the biases, every parameter), each blob's memory read back.
`microtrain inspect MODEL.onnx` prints the table."""
import dataclasses
import os
import tempfile

from microtrain import parser as device_blob_parser

from ..artifacts import generate_artifacts
from ..pipeline.pack import TRAINING_PROGRAMS
from ..pipeline.sparse import layers, sparse_update
from .memory_plan import persistent_parts, timelines


@dataclasses.dataclass
class Choice:
    label: str
    requires_grad: list | None   # None: every parameter
    trained: int = 0             # trainable parameter elements
    arena: int = 0               # float arena, elements
    gradients: int = 0           # gradient buffers, elements
    optimizer_state: int = 0
    peak_temporaries: int = 0    # live temporaries at the training timeline's peak
    train_steps: int = 0
    int_arena: int = 0           # int32 elements (labels, ReLU masks, dropout masks)


def candidate_choices(model, max_layers=6):
    """[(label, requires_grad)]: biases only, then for k = 1 .. max_layers the last k layers
    and the last k layers + every bias, then every parameter."""
    found = layers(model)
    has_biases = any(layer.biases for layer in found)
    result = [("biases", sparse_update(model, True, 0))] if has_biases else []
    for k in range(1, min(max_layers, len(found)) + 1):
        result.append((f"last {k}", sparse_update(model, False, k)))
        if has_biases:
            result.append((f"biases + last {k}", sparse_update(model, True, k)))
    result.append(("all", None))
    return result


def measure(blob_path):
    """(trainable elements, float arena, gradient buffers, optimizer state, peak temporaries
    of the training timeline, train steps, int arena) of a packed blob."""
    b = device_blob_parser.load(str(blob_path), keep_steps=True)
    parts = persistent_parts(b)
    train = [t for t in timelines(b) if t.name == "train"]
    steps = sum(len(b.programs[p].steps) for p in TRAINING_PROGRAMS if p in b.programs)
    return (parts["trainable parameters"], b.float_arena, parts["gradient buffers"],
            parts["optimizer state"], train[0].peak if train else 0, steps, b.int_arena)


def sparse_choices(model, max_layers=6, **pack_options):
    """Pack the model once per candidate choice (pack_options as generate_artifacts takes
    them: loss, optimizer, batch_size, optimizer_options, update_in_backward) and measure
    each. Returns [Choice]."""
    rows = []
    with tempfile.TemporaryDirectory() as directory:
        for k, (label, requires_grad) in enumerate(candidate_choices(model, max_layers)):
            out = os.path.join(directory, str(k))
            result = generate_artifacts(model, requires_grad=requires_grad,
                                        artifact_directory=out, **pack_options)
            rows.append(Choice(label, requires_grad, *measure(result.blob)))
    return rows


def table(rows):
    """The choices as text, one row each, memory in KiB of float32."""
    def kib(elements):
        return f"{elements * 4 / 1024:9.1f}"
    lines = [f"{'trains':18s} {'params':>8s} {'arena KiB':>9s} {'int KiB':>9s} {'grads':>9s} "
             f"{'opt state':>9s} {'peak tmp':>9s} {'steps':>6s}"]
    for row in rows:
        lines.append(f"{row.label:18s} {row.trained:8d} {kib(row.arena)} {kib(row.int_arena)} "
                     f"{kib(row.gradients)} {kib(row.optimizer_state)} "
                     f"{kib(row.peak_temporaries)} {row.train_steps:6d}")
    return "\n".join(lines)


def report(model, max_layers=6, **pack_options):
    """The layers train_last counts, then the table of choices (sparse_choices)."""
    found = layers(model)
    lines = [f"{model}: {len(found)} layers with parameters, counted from the last as "
             f"--train-last counts them:"]
    for n, layer in enumerate(reversed(found), 1):
        lines.append(f"  {n:3d} {layer.node} ({layer.op_type}): weights "
                     f"{', '.join(layer.weights) or '-'}; biases {', '.join(layer.biases) or '-'}")
    rows = sparse_choices(model, max_layers=max_layers, **pack_options)
    optimizer = pack_options.get("optimizer")
    notes = [f"batch size {pack_options.get('batch_size') or 'as exported'}",
             f"loss {pack_options.get('loss')}",
             f"optimizer {getattr(optimizer, 'name', optimizer)}"]
    if pack_options.get("update_in_backward"):
        notes.append("updates in the backward pass")
    if pack_options.get("recompute"):
        notes.append("cheap activations recomputed")
    lines += ["", f"what each sparse-update choice costs ({', '.join(notes)}; KiB of float32; "
              f"params = trainable elements; peak tmp = live temporaries at the training "
              f"peak):", table(rows)]
    return "\n".join(lines)
