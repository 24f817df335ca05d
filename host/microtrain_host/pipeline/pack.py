"""Pack: lower the three graphs, plan the arenas and write the .mtb blob.

Blob file = u32 N + N-byte FlatBuffer (schema/microtrain.fbs, identifier "MTRB") + CRC-32
of those N bytes."""
import ast
import os
import zlib

import flatbuffers
import numpy as np

from . import export as inference
from .checkpoint import write_atomically
from ..errors import ArtifactError
from .lower import ACTIVATION, CONSTANT, Lowering, meta_names, roles_from_metadata
from .moves import mask_relus, place_updates, recompute_activations, split_program
from .optimizers import OptimType, grad_buffer, state_name, state_names
from .plan import assign_offsets

IDENTIFIER = b"MTRB"
FORMAT_VERSION = 1
# The programs of one training step: "train", or "forward" + "backward" when the loss is
# computed outside the graph; with update_in_backward "train" (forward pass and loss) +
# "backward_update" (the backward pass with the updates in it) and no "optimizer".
TRAINING_PROGRAMS = ("train", "forward", "backward", "backward_update")


def _uints(builder, values, dtype):
    return builder.CreateNumpyVector(np.asarray(values, dtype=dtype))


def _write(lowering, parameters, sizes, loss, num_classes, optimizer, options,
           full_training=(0, 0), inference_template=None, source_opset=0):
    float_arena, int_arena, naive_size, lower_bound = sizes
    b = flatbuffers.Builder(4096)
    tensor_offsets = []
    for tid, t in enumerate(lowering.tensors):
        name = b.CreateString(t.name)
        shape = _uints(b, list(t.shape), np.int32)
        data = b.CreateNumpyVector(np.frombuffer(t.data, np.uint8)) if t.role == CONSTANT else None
        program = b.CreateString(t.program) if t.program else None
        b.StartObject(9)
        b.PrependUOffsetTRelativeSlot(0, name, 0)
        b.PrependUint8Slot(1, t.dtype, 0)
        b.PrependUint8Slot(2, t.role, 0)
        b.PrependUOffsetTRelativeSlot(3, shape, 0)
        b.PrependUint32Slot(4, t.offset, 0)
        b.PrependUint32Slot(5, t.size, 0)
        if data is not None:
            b.PrependUOffsetTRelativeSlot(6, data, 0)
        if program is not None:
            b.PrependUOffsetTRelativeSlot(7, program, 0)
        if t.storage != tid and t.role == ACTIVATION:
            # An alias of a temporary: which space it shares, for the memory plan.
            b.PrependInt32Slot(8, t.storage, -1)
        tensor_offsets.append(b.EndObject())
    program_offsets = []
    for program in lowering.programs.values():
        step_offsets = []
        for step in program.steps:
            tensors = _uints(b, step.tensors, np.uint32)
            ints = _uints(b, step.ints, np.int32)
            floats = _uints(b, step.floats, np.float32)
            b.StartObject(4)
            b.PrependUint16Slot(0, step.op, 0)
            b.PrependUOffsetTRelativeSlot(1, tensors, 0)
            b.PrependUOffsetTRelativeSlot(2, ints, 0)
            b.PrependUOffsetTRelativeSlot(3, floats, 0)
            step_offsets.append(b.EndObject())
        name = b.CreateString(program.name)
        steps = _table_vector(b, step_offsets)
        inputs = _uints(b, program.inputs, np.uint32)
        outputs = _uints(b, program.outputs, np.uint32)
        b.StartObject(4)
        b.PrependUOffsetTRelativeSlot(0, name, 0)
        b.PrependUOffsetTRelativeSlot(1, steps, 0)
        b.PrependUOffsetTRelativeSlot(2, inputs, 0)
        b.PrependUOffsetTRelativeSlot(3, outputs, 0)
        program_offsets.append(b.EndObject())
    param_offsets = []
    for tensor, grad, states, in_backward in parameters:
        state_vec = _uints(b, states, np.uint32)
        b.StartObject(4)
        b.PrependUint32Slot(0, tensor, 0)
        b.PrependInt32Slot(1, grad, -1)
        b.PrependUOffsetTRelativeSlot(2, state_vec, 0)
        b.PrependBoolSlot(3, in_backward, False)
        param_offsets.append(b.EndObject())
    opt = None
    if optimizer is not None:
        kind = b.CreateString(optimizer.name)
        b.StartObject(13)
        b.PrependUOffsetTRelativeSlot(0, kind, 0)
        b.PrependFloat32Slot(1, options["learning_rate"], 0.001)
        if optimizer == OptimType.AdamW:
            b.PrependFloat32Slot(2, options["beta1"], 0.9)
            b.PrependFloat32Slot(3, options["beta2"], 0.999)
            b.PrependFloat32Slot(4, options["epsilon"], 1e-6)
            b.PrependBoolSlot(6, bool(options["bias_correction"]), True)
        else:
            b.PrependFloat32Slot(7, options.get("momentum", 0.0), 0.0)
            b.PrependFloat32Slot(8, options.get("dampening", 0.0), 0.0)
            b.PrependBoolSlot(9, bool(options.get("nesterov", False)), False)
        b.PrependFloat32Slot(5, options.get("weight_decay", 0.0), 0.0)
        b.PrependFloat32Slot(10, options.get("l1_penalty", 0.0), 0.0)
        b.PrependFloat32Slot(11, options.get("l2_penalty", 0.0), 0.0)
        b.PrependFloat32Slot(12, options.get("clip_grad_norm") or 0.0, 0.0)
        opt = b.EndObject()
    producer = b.CreateString("microtrain")
    tensors_vec = _table_vector(b, tensor_offsets)
    params_vec = _table_vector(b, param_offsets)
    programs_vec = _table_vector(b, program_offsets)
    loss_name = b.CreateString(loss)
    template = (inference.write_template(b, inference_template)
                if inference_template is not None else None)
    b.StartObject(17)
    b.PrependUint16Slot(0, FORMAT_VERSION, 0)
    b.PrependUOffsetTRelativeSlot(1, producer, 0)
    b.PrependUOffsetTRelativeSlot(2, tensors_vec, 0)
    b.PrependUOffsetTRelativeSlot(3, params_vec, 0)
    b.PrependUOffsetTRelativeSlot(4, programs_vec, 0)
    b.PrependUint32Slot(5, float_arena, 0)
    b.PrependUint32Slot(6, int_arena, 0)
    b.PrependUOffsetTRelativeSlot(7, loss_name, 0)
    b.PrependUint32Slot(8, num_classes, 0)
    if opt is not None:
        b.PrependUOffsetTRelativeSlot(9, opt, 0)
    b.PrependUint32Slot(10, naive_size, 0)
    b.PrependUint32Slot(11, lower_bound, 0)
    b.PrependUint32Slot(12, full_training[0], 0)
    b.PrependUint32Slot(13, full_training[1], 0)
    b.PrependUint16Slot(15, source_opset, 0)  # absent (0) unless upgraded: blobs stay as they were
    b.PrependUint32Slot(16, getattr(lowering, "byte_arena", 0), 0)  # absent without int8
    if template is not None:
        b.PrependUOffsetTRelativeSlot(14, template, 0)
    b.FinishSizePrefixed(b.EndObject(), file_identifier=IDENTIFIER)
    body = bytes(b.Output())
    return body + (zlib.crc32(body[4:]) & 0xFFFFFFFF).to_bytes(4, "little")


def _table_vector(b, offsets):
    b.StartVector(4, len(offsets), 4)
    for off in reversed(offsets):
        b.PrependUOffsetTRelative(off)
    return b.EndVector()


def _forward_node_names(training_model, count):
    # The training graph starts with the forward pass (model and loss nodes), named as the
    # lowering names steps.
    return {n.name or n.op_type for n in training_model.graph.node[:count]}


# Step arguments (offsets, counts, strides) are int32 in the blob and element indices on
# the device: no tensor and no arena may hold more elements than an int32 can count.
MAX_ELEMENTS = 2**31 - 1


def _check_limits(lowering, sizes):
    for t in lowering.tensors:
        if t.size > MAX_ELEMENTS:
            raise ArtifactError(f"tensor '{t.name}' has {t.size} elements (shape "
                                f"{list(t.shape)}); a blob holds at most 2**31 - 1 = "
                                f"{MAX_ELEMENTS} elements per tensor")
    for arena, kind in zip(sizes[:2], ("float", "int")):
        if arena > MAX_ELEMENTS:
            raise ArtifactError(f"the {kind} arena would need {arena} elements; a blob holds "
                                f"at most 2**31 - 1 = {MAX_ELEMENTS} elements per arena")


def pack(training_model, eval_model, optimizer_model, path, optimizer_options=None,
         full_training=(0, 0)):
    """Lower the graphs, plan the arenas and write the blob to path (see blob_bytes)."""
    write_blob(path, blob_bytes(training_model, eval_model, optimizer_model, optimizer_options,
                                full_training))


def write_blob(path, data):
    try:
        write_atomically(os.fspath(path), data)
    except OSError as e:
        raise ArtifactError(f"cannot write blob '{path}': {e}") from e


def blob_bytes(training_model, eval_model, optimizer_model, optimizer_options=None,
               full_training=(0, 0)):
    """The blob of the three graphs: lowered, planned and serialized. full_training: (float
    arena, train steps) of the same model with every parameter trained, recorded so that
    inspect can show what freezing parameters saved."""
    roles, meta = roles_from_metadata(training_model, optimizer_model)
    lowering = Lowering(roles)
    output_grads = meta_names(meta, "output_grads")
    in_backward = meta.get("microtrain.update_in_backward") == "1"
    training = "forward_backward" if output_grads else "train"
    lowering.lower(training, training_model)
    forward_count = int(meta.get("microtrain.forward_nodes", len(eval_model.graph.node)))
    forward_nodes = _forward_node_names(training_model, forward_count)
    if meta.get("microtrain.recompute") == "1":
        mask_relus(lowering.programs[training], lowering, forward_nodes)
        recompute_activations(lowering.programs[training], lowering, forward_nodes)
    if in_backward:  # after recomputing: a recomputed step may read a parameter
        place_updates(lowering.programs["train"], lowering.tensors)
    lowering.lower("eval", eval_model)
    optimizer = None
    opt_meta = ({p.key: p.value for p in optimizer_model.metadata_props}
                if optimizer_model is not None else meta)
    if "microtrain.optimizer" in opt_meta:
        optimizer = OptimType[opt_meta["microtrain.optimizer"]]
        if optimizer_options is None:
            optimizer_options = dict(ast.literal_eval(opt_meta["microtrain.options"]))
    if optimizer_model is not None:
        lowering.lower("optimizer", optimizer_model)
    lowering.control("lazy_reset_grad")
    lowering.control("learning_rate")
    if optimizer == OptimType.AdamW:
        lowering.control("step_size")
    sizes = assign_offsets(lowering)
    _check_limits(lowering, sizes)
    if output_grads:
        # Planned as one timeline, then split: the activations backward reads survive
        # between the two calls, and the outputs stay valid until the end of backward.
        split_program(lowering.programs, "forward_backward", forward_nodes, "forward",
                      "backward", [lowering.persistent[name] for name in output_grads])
    elif in_backward:
        # The loss is known before any update: the Module checks it between the two.
        split_program(lowering.programs, "train", forward_nodes, "train", "backward_update")
    template = inference.inference_template(
        eval_model, roles, lowering,
        lambda infer: _write(infer, [], assign_offsets(infer), "", 0, None, None))
    trainable = set(meta_names(meta, "trainable"))
    parameters = []
    for name in meta_names(meta, "params"):
        tid = lowering.persistent[name]
        grad = lowering.persistent.get(grad_buffer(name), -1) if name in trainable else -1
        states = [lowering.persistent[state_name(name, s)]
                  for s in state_names(optimizer, optimizer_options)] \
            if optimizer is not None and name in trainable else []
        parameters.append((tid, grad, states, in_backward and name in trainable))
    return _write(lowering, parameters, sizes, meta.get("microtrain.loss", ""),
                  int(meta.get("microtrain.num_classes", "0") or 0), optimizer,
                  optimizer_options, full_training, template,
                  int(meta.get("microtrain.source_opset", "0")))
