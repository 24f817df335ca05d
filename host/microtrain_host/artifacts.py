"""generate_artifacts: ONNX model -> training, eval and optimizer graphs, checkpoint, blob.

Names, files and semantics follow onnxruntime.training.artifacts.generate_artifacts. The
driver of the pipeline (pipeline/: load -> ... -> pack) and of the quantization lines
(quant/: QAT's fake quantization, a QDQ model's int8 layers, a QAT blob's int8 export)."""
import dataclasses
import os
import tempfile

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from .errors import ArtifactError, MicrotrainHostError
from .formats import checkpoint as ckpt
from .graph import DOMAIN, DOMAIN_VERSION, GraphBuilder
from .ir import LAZY_RESET_GRAD, LEARNING_RATE, STEP, grad_buffer
from .ops.norm import folded_parameters, inference_form
from .pipeline.autodiff import build_gradients
from .pipeline.load import constant_value, load_model, tensor_shapes
from .pipeline.losses import LOSS_BLOCKS, LossType
from .pipeline.optimizers import DEFAULTS, OptimType, build_optimizer_graph
from .pipeline.pack import blob_bytes, lower_and_plan, write_blob
from .pipeline.params import split_parameters
from .pipeline.upgrade import source_opset
from .quant.int8 import ALL_WEIGHTS, int8_graph, is_qdq_model
from .quant.qat_export import lower_export
from .quant.quantize import METADATA_KEY, QuantizationConfig, eval_form, quantize_model


@dataclasses.dataclass
class Artifacts:
    """What generate_artifacts wrote (paths) and decided (parameter split, loss)."""
    training_model: str
    eval_model: str
    optimizer_model: str | None
    checkpoint: str
    nominal_checkpoint: str | None
    blob: str
    trainable: list
    frozen: list
    loss_name: str
    folded: list = dataclasses.field(default_factory=list)  # frozen, now model constants
    source_opset: int | None = None  # the opset of a model upgraded on load


def _enum(value, kind, what):
    if value is None or isinstance(value, kind):
        return value
    try:
        return kind[value] if isinstance(value, str) else kind(value)
    except (KeyError, ValueError):
        names = ", ".join(k.name for k in kind)
        raise ArtifactError(f"unknown {what} {value!r}; choose one of {names}") from None


def _save(model, path):
    onnx.save(model, path)
    return path


def _make_model(source, g, nodes, inputs, outputs, initializers, name, meta):
    produced = {o for n in nodes for o in n.output if o}
    value_info = [n for n in sorted(produced - set(outputs)) if n in g.shapes]
    graph = helper.make_graph(nodes, name, g.value_infos(inputs), g.value_infos(outputs),
                              initializer=initializers, value_info=g.value_infos(value_info))
    opsets = [o for o in source.opset_import if o.domain != DOMAIN]
    opsets.append(helper.make_opsetid(DOMAIN, DOMAIN_VERSION))
    model = helper.make_model(graph, opset_imports=opsets, producer_name="microtrain",
                              ir_version=source.ir_version)
    for key, value in meta.items():
        entry = model.metadata_props.add()
        entry.key, entry.value = f"microtrain.{key}", value
    return model


def generate_artifacts(model, requires_grad=None, frozen_params=None,
                       loss=LossType.CrossEntropyLoss, optimizer=OptimType.AdamW,
                       artifact_directory=None, prefix="", nominal_checkpoint=False,
                       loss_input_names=None, batch_size=None, optimizer_options=None,
                       additional_output_names=None, progress=None, quantization=None,
                       update_in_backward=False, recompute=False):
    """Write {prefix}training_model.onnx, eval_model.onnx, optimizer_model.onnx, checkpoint
    (and nominal_checkpoint) and the packed blob {prefix}model.mtb into artifact_directory.

    model: ModelProto or path. requires_grad / frozen_params: parameter names (ORT's rules:
    by default every float initializer is trainable; naming one in both is an error).
    loss: LossType (or its name) or None when the model's output already is the loss.
    loss=None with a non-scalar output, or with several loss_input_names, means the loss is
    computed outside the graph: the training graph takes d loss / d output as inputs
    `<output>_grad` (one per name in loss_input_names, default the first output) and the
    blob gets "forward" and "backward" programs instead of "train" (Module.forward,
    Module.backward).
    optimizer: OptimType (or name) or None for no optimizer graph. batch_size fixes a
    dynamic batch dimension. optimizer_options overrides the defaults (optimizers.DEFAULTS;
    AdamW: learning_rate, beta1, beta2, epsilon, weight_decay, bias_correction; SGD:
    learning_rate, momentum, dampening, nesterov, weight_decay; both: l1_penalty, l2_penalty,
    clip_grad_norm). additional_output_names: model outputs
    the eval graph returns after the loss (default: all model outputs). progress(stage,
    index, count), when given, is called as each stage starts (for a progress bar).
    quantization: None, True (defaults) or a QuantizationConfig / dict of its fields: insert
    QDQ fake quantization for quantization-aware training (quant/quantize.py); the
    observers' ranges become frozen parameters `<tensor>.observer_range`. A QDQ model as
    `model` (int8 weights): its frozen layers run as int8 kernels (quant/int8.py).
    update_in_backward: apply each parameter's update in the backward pass, right after its
    gradient is known, instead of keeping gradient buffers for a separate optimizer step: the
    training graph then holds the update nodes and there is no optimizer_model.onnx; each
    train call is one optimizer step (no gradient accumulation, no clip_grad_norm, which
    needs every gradient before any update). recompute: in the blob, keep 1-bit masks
    instead of ReLU outputs only their gradient reads, and recompute cheap activations
    (activation functions, normalisations) in the backward pass instead of keeping them
    from the forward pass, wherever that shrinks the arena (pipeline/moves.py).
    sparse_update(model, ...) gives requires_grad for the biases and the last layers."""
    stage = _stages(progress)
    _check_directory(artifact_directory if artifact_directory is not None else os.getcwd())
    options = dict(batch_size=batch_size, loss=loss, optimizer=optimizer,
                   loss_input_names=loss_input_names, optimizer_options=optimizer_options,
                   additional_output_names=additional_output_names, quantization=quantization,
                   update_in_backward=update_in_backward, recompute=recompute)
    graphs = _graphs(model, requires_grad, frozen_params, stage=stage, **options)

    # The blob first: a model that cannot be packed leaves the directory as it was.
    full_training = (0, 0)
    if not graphs.trains_everything:
        stage("full-training figures")
        full_training = _full_training_figures(graphs.source, options)
    stage("lower, plan, pack")
    blob = blob_bytes(graphs.training_model, graphs.eval_model, graphs.optimizer_model,
                      graphs.options, full_training, lower_export)

    stage("write")
    directory = artifact_directory if artifact_directory is not None else os.getcwd()
    os.makedirs(directory, exist_ok=True)
    path = lambda name: os.path.join(directory, prefix + name)  # noqa: E731
    trainable, frozen, values = graphs.trainable, graphs.frozen, graphs.values
    written = Artifacts(
        training_model=_save(graphs.training_model, path("training_model.onnx")),
        eval_model=_save(graphs.eval_model, path("eval_model.onnx")),
        optimizer_model=_save(graphs.optimizer_model, path("optimizer_model.onnx"))
        if graphs.optimizer_model is not None else None,
        checkpoint=path("checkpoint"),
        nominal_checkpoint=path("nominal_checkpoint") if nominal_checkpoint else None,
        blob=path("model.mtb"), trainable=trainable, frozen=frozen,
        loss_name=graphs.loss_name, folded=graphs.folded, source_opset=graphs.source_opset)
    ckpt.write_checkpoint(written.checkpoint, {p: values[p] for p in trainable},
                          {p: values[p] for p in frozen})
    if nominal_checkpoint:
        ckpt.write_checkpoint(written.nominal_checkpoint, {p: values[p] for p in trainable},
                              {p: values[p] for p in frozen}, nominal=True)
    write_blob(written.blob, blob)
    return written


def eval_graph(model, batch_size=None, loss=LossType.CrossEntropyLoss, quantization=None):
    """(eval graph, {parameter: value}) of generate_artifacts with every parameter trainable,
    built in memory: nothing lowered or written. The values are the checkpoint's (trainable,
    then frozen). What `pack --int8` calibrates and quantizes (int8pack.py): its
    BatchNormalization is in inference form (running statistics), so it builds at any batch
    size, where lowering the training graph (batch statistics) refuses one value per channel
    (a BatchNorm1d after a Gemm at batch 1)."""
    graphs = _graphs(model, None, None, stage=lambda name: None, batch_size=batch_size,
                     loss=loss, optimizer=None, loss_input_names=None, optimizer_options=None,
                     additional_output_names=None, quantization=quantization,
                     update_in_backward=False, recompute=False)
    return graphs.eval_model, {p: graphs.values[p] for p in graphs.trainable + graphs.frozen}


@dataclasses.dataclass
class _Graphs:
    """What generate_artifacts builds before anything is lowered or written."""
    training_model: onnx.ModelProto
    eval_model: onnx.ModelProto
    optimizer_model: onnx.ModelProto | None
    options: dict | None        # the optimizer's options, defaults filled in
    trainable: list
    frozen: list
    folded: list
    values: dict                # parameter name -> float32 array (the checkpoint's)
    loss_name: str
    source_opset: int | None
    trains_everything: bool
    source: onnx.ModelProto     # what the full-training figures start from


def _graphs(model, requires_grad, frozen_params, *, stage, batch_size, loss, optimizer,
            loss_input_names, optimizer_options, additional_output_names, quantization,
            update_in_backward, recompute):
    """The training, eval and optimizer graphs of generate_artifacts (same arguments)."""
    loss = _enum(loss, LossType, "loss")
    stage("load")
    optimizer = _enum(optimizer, OptimType, "optimizer")
    if update_in_backward:
        _check_update_in_backward(optimizer, optimizer_options)
    original = model
    model, shapes = load_model(model, batch_size)
    if is_qdq_model(model):
        # A quantized model (microtrain export --qdq): frozen layers run as int8 kernels,
        # the layers of the weights in requires_grad stay float (quant/int8.py).
        model = int8_graph(model, training=True, float_weights=set(requires_grad)
                           if requires_grad is not None else ALL_WEIGHTS)
        shapes = {**shapes, **tensor_shapes(model.graph)}
    trainable, frozen = split_parameters(model, requires_grad, frozen_params)
    trains_everything = set(trainable) == set(split_parameters(model, None, None)[0])
    quant_config = QuantizationConfig.of(quantization)
    quant_record = None
    if quant_config is not None:
        shapes, ranges, quant_record = quantize_model(model, shapes, quant_config)
        frozen = frozen + ranges
    graph = model.graph
    folded = folded_parameters(graph, frozen)
    frozen = [p for p in frozen if p not in folded]
    param_set = set(trainable) | set(frozen)
    params = [i.name for i in graph.initializer if i.name in param_set]  # initializer order
    initializer_names = {i.name for i in graph.initializer}
    user_inputs = [i.name for i in graph.input if i.name not in initializer_names]
    model_outputs = [o.name for o in graph.output]

    g = GraphBuilder(shapes)
    g.parameters = set(param_set)
    for init in graph.initializer:
        g.values[init.name] = numpy_helper.to_array(init)
    for node in graph.node:
        if node.op_type == "Constant":
            g.values[node.output[0]] = constant_value(node)
    constants = [i for i in graph.initializer if i.name not in param_set]

    # Loss block.
    stage("loss")
    loss_inputs = list(loss_input_names) if loss_input_names else model_outputs[:1]
    for name in loss_inputs:
        if name not in shapes:
            raise ArtifactError(f"loss input '{name}' is not a tensor of the model")
    labels = []
    output_grads = {}
    if loss is None:
        loss_name = loss_inputs[0]
        if len(loss_inputs) > 1 or g.shape(loss_name) not in ((), (1,)):
            # The loss is computed outside the graph (Module.forward / Module.backward): the
            # backward pass starts from d loss / d output, one graph input per output. (A
            # single scalar output is the loss itself; several named outputs never are.)
            output_grads = {name: g.fresh(f"{name}_grad") for name in loss_inputs}
            for name, grad in output_grads.items():
                g.shapes[grad] = g.shapes[name]
    else:
        if len(loss_inputs) != 1:
            raise ArtifactError(f"{loss.name} takes one model output, got {loss_inputs}")
        loss_name, label = LOSS_BLOCKS[loss](g, loss_inputs[0])
        labels = [label]
    forward = list(graph.node) + list(g.nodes)
    extra_outputs = list(additional_output_names) if additional_output_names is not None \
        else [o for o in model_outputs if o != loss_name]
    num_classes = g.shape(loss_inputs[0])[-1] if loss == LossType.CrossEntropyLoss else 0
    meta = {"inputs": ",".join(user_inputs), "labels": ",".join(labels),
            "params": ",".join(params), "trainable": ",".join(trainable),
            "loss": loss.name if loss is not None else "", "num_classes": str(num_classes),
            "outputs": ",".join(model_outputs), "output_grads": ",".join(output_grads.values())}
    if source_opset(model) is not None:
        meta["source_opset"] = str(source_opset(model))
    if quant_record is not None:
        meta[METADATA_KEY] = quant_record

    eval_model = _make_model(model, g, eval_form(inference_form(forward)), user_inputs + labels + params,
                             [loss_name] + extra_outputs, constants + list(g.initializers),
                             "eval", meta)

    # Backward pass and ORT-style gradient accumulation (or the updates themselves).
    stage("gradients")
    grads = build_gradients(g, forward, loss_name, trainable, seeds=output_grads or None)
    if recompute or update_in_backward:
        # Where the backward pass starts, for the packer's memory moves.
        meta["forward_nodes"] = str(len(forward))
    if recompute:
        meta["recompute"] = "1"
    for p in trainable:
        if grads[p] is None:
            raise ArtifactError(f"parameter '{p}' does not influence the loss; freeze it")
    stage("optimizer")
    options = None
    if optimizer is not None:
        options = dict(DEFAULTS[optimizer])
        unknown = set(optimizer_options or {}) - set(options)
        if unknown:
            raise ArtifactError(f"unknown {optimizer.name} option(s) {sorted(unknown)}; "
                                f"known: {sorted(options)}")
        options.update(optimizer_options or {})
    optimizer_meta = dict(meta, optimizer=optimizer.name,
                          options=repr(sorted(options.items()))) if optimizer else meta
    optimizer_model = None
    if update_in_backward and output_grads:
        raise ArtifactError("update_in_backward needs the loss in the graph (the NaN guard "
                            "checks it before any parameter changes); this model's loss is "
                            "computed outside it (loss=None, non-scalar output)")
    if update_in_backward:
        # The update nodes read the backward pass's gradients directly; the packer puts
        # each one right after the last step that needs its parameter's old value.
        ins, outs = build_optimizer_graph(g, optimizer, trainable, options, gradients=grads)
        states = [name for name in ins if name not in trainable and name not in grads.values()
                  and name not in (LEARNING_RATE, STEP)]
        optimizer_meta["update_in_backward"] = "1"
        optimizer_meta["optimizer_states"] = ",".join(states)
        training_model = _make_model(
            model, g, list(graph.node) + list(g.nodes),
            user_inputs + labels + params + states + [LEARNING_RATE, STEP],
            [loss_name] + outs, constants + list(g.initializers), "training", optimizer_meta)
    else:
        g.shapes[LAZY_RESET_GRAD] = (TensorProto.BOOL, (1,))
        accumulated = []
        for p in trainable:
            g.shapes[grad_buffer(p)] = g.shapes[p]
            out = g.node("GradAccumulate", [grad_buffer(p), grads[p], LAZY_RESET_GRAD],
                         g.shape(p), outputs=[f"{p}_grad.accumulation.out"], domain=DOMAIN)
            accumulated += out
        training_model = _make_model(
            model, g, list(graph.node) + list(g.nodes),
            user_inputs + labels + params + [grad_buffer(p) for p in trainable]
            + list(output_grads.values()) + [LAZY_RESET_GRAD],
            (loss_inputs if output_grads else [loss_name]) + accumulated,
            constants + list(g.initializers), "training", meta)
        if optimizer is not None:
            og = GraphBuilder(g.shapes)
            ins, outs = build_optimizer_graph(og, optimizer, trainable, options)
            optimizer_model = _make_model(model, og, og.nodes, ins, outs, [], "optimizer",
                                          optimizer_meta)

    values = {name: g.values[name].astype(np.float32) for name in params}
    return _Graphs(training_model, eval_model, optimizer_model, options, trainable, frozen,
                   folded, values, loss_name, source_opset(model), trains_everything,
                   original if quant_record is not None else model)


STAGES = ("load", "loss", "gradients", "optimizer", "lower, plan, pack", "write")


def _stages(progress):
    """stage(name): tell progress(name, index, count); the full-training figures of a
    partial update are an extra stage, counted when they come."""
    done = []

    def stage(name):
        if progress is not None:
            done.append(name)
            count = len(STAGES) + (name == "full-training figures" or
                                   "full-training figures" in done)
            progress(name, len(done), count)
    return stage


def _check_directory(directory):
    """Refuse, before any work, an artifact directory that cannot be written: an existing
    file, or a path where a directory cannot be made or written (checked by making the
    missing directories and a temporary file in it, then removing them: a failed pack
    leaves no trace)."""
    directory = os.fspath(directory)
    if os.path.exists(directory) and not os.path.isdir(directory):
        raise ArtifactError(f"artifact directory '{directory}' is an existing file; give a "
                            f"directory (created when missing)")
    made = []
    try:
        missing, path = [], os.path.abspath(directory)
        while not os.path.exists(path):
            missing.append(path)
            path = os.path.dirname(path)
        for path in reversed(missing):
            os.mkdir(path)
            made.append(path)
        with tempfile.TemporaryFile(dir=directory):
            pass
    except OSError as e:
        raise ArtifactError(f"cannot create or write the artifact directory '{directory}': "
                            f"{e.strerror or e}") from e
    finally:
        for path in reversed(made):
            os.rmdir(path)


def _check_update_in_backward(optimizer, optimizer_options):
    if optimizer is None:
        raise ArtifactError("update_in_backward needs an optimizer: it applies the optimizer's "
                            "update in the backward pass")
    if (optimizer_options or {}).get("clip_grad_norm") is not None:
        raise ArtifactError("update_in_backward cannot clip by the global gradient norm "
                            "(clip_grad_norm): that needs every gradient before any update")


def _full_training_figures(model, options):
    """(float arena, train steps) of the model with every parameter trained, for inspect to
    show what freezing saved; (0, 0) when the model cannot train them all. Lowered and
    planned in memory, nothing written."""
    try:
        graphs = _graphs(model, None, None, stage=lambda name: None, **options)
        planned = lower_and_plan(graphs.training_model, graphs.eval_model,
                                 graphs.optimizer_model, graphs.options, lower_export)
    except MicrotrainHostError:
        return (0, 0)
    return planned.sizes[0], planned.steps
