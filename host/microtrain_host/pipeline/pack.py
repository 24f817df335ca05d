"""Pack: lower the three graphs, plan the arenas and write the .mtb blob.

Blob file = u32 N + N-byte FlatBuffer (schema/microtrain.fbs, identifier "MTRB") + CRC-32
of those N bytes."""
import ast
import os
import zlib

import flatbuffers
import numpy as np

from . import export as inference
from . import qat_export
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


class SharedObjects:
    """Strings and vectors written once per blob: FlatBuffers lets any number of tables
    point at one string or vector, so equal tensor names, program names, shapes, step
    attributes and scales cost their bytes once. `regions` maps the bytes of each one
    (u32 count, elements, a string's NUL) to (its offset: distance from the end of the
    buffer, 0 for a string or 1 for a vector of 4-byte elements): an inference template
    copies from them what it shares with its training blob (pipeline/export.py)."""

    def __init__(self, builder):
        self.b = builder
        self.regions = {}
        self.sources = {}  # bytes -> (offset, kind) of every one, shared or not (copyable)
        self.placed = []   # every (bytes, offset, kind) written, shared or not

    def own_vector(self, values, dtype):
        """A vector of this table's own (quantization parameters: a template splices them),
        recorded for the template's copies all the same."""
        array = np.ascontiguousarray(np.asarray(values, dtype=dtype))
        key = len(array).to_bytes(4, "little") + array.tobytes()
        offset = self.b.CreateNumpyVector(array)
        self.sources.setdefault(key, (offset, 1))
        self.placed.append((key, offset, 1))
        return offset

    def string(self, text):
        raw = text.encode("utf-8")
        key = len(raw).to_bytes(4, "little") + raw + b"\0"
        if key not in self.regions:
            self.regions[key] = (self.b.CreateString(raw), 0)
            self.sources.setdefault(key, self.regions[key])
            self.placed.append((key,) + self.regions[key])
        return self.regions[key][0]

    def vector(self, values, dtype):
        array = np.ascontiguousarray(np.asarray(values, dtype=dtype))
        assert array.itemsize == 4
        key = len(array).to_bytes(4, "little") + array.tobytes()
        if key not in self.regions:
            self.regions[key] = (self.b.CreateNumpyVector(array), 1)
            self.sources.setdefault(key, self.regions[key])
            self.placed.append((key,) + self.regions[key])
        return self.regions[key][0]


def _write(lowering, parameters, sizes, loss, num_classes, optimizer, options,
           full_training=(0, 0), inference_template=None, source_opset=0, regions=None,
           share_quantization=True):
    """The blob bytes. regions: a dict that receives where each string and vector is, for
    an inference template cut from this blob. share_quantization=False: every quantized
    tensor keeps its own scale and zero point vectors, whatever their values (an int8
    inference blob whose layout must not depend on them: one the device exports from a QAT
    blob, and the host's of the same model)."""
    float_arena, int_arena, naive_size, lower_bound = sizes
    b = flatbuffers.Builder(4096)
    shared = SharedObjects(b)
    tensor_offsets = []
    for tid, t in enumerate(lowering.tensors):
        name = shared.string(t.name)
        shape = shared.vector(list(t.shape), np.int32)
        data = b.CreateNumpyVector(np.frombuffer(t.data, np.uint8)) if t.role == CONSTANT else None
        program = shared.string(t.program) if t.program else None
        vector = shared.vector if share_quantization else shared.own_vector
        scale = vector(t.scale, np.float32) if len(t.scale) else None
        zero_point = vector(t.zero_point[:1] if len(set(t.zero_point)) == 1 else t.zero_point,
                            np.int32) if len(t.zero_point) else None
        b.StartObject(14)
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
        if scale is not None:
            b.PrependUOffsetTRelativeSlot(9, scale, 0)
            b.PrependUOffsetTRelativeSlot(10, zero_point, 0)
            b.PrependInt32Slot(11, t.axis, 0)
        b.PrependBoolSlot(12, t.derived, False)
        b.PrependBoolSlot(13, t.in_place, False)
        tensor_offsets.append(b.EndObject())
    program_offsets = []
    step_tables = {}   # an eval step equal to a train step (shared tensors) is its table
    for program in lowering.programs.values():
        step_offsets = []
        for step in program.steps:
            key = (step.op, shared.vector(step.tensors, np.uint32),
                   shared.vector(step.ints, np.int32), shared.vector(step.floats, np.float32))
            if key not in step_tables:
                b.StartObject(4)
                b.PrependUint16Slot(0, step.op, 0)
                b.PrependUOffsetTRelativeSlot(1, key[1], 0)
                b.PrependUOffsetTRelativeSlot(2, key[2], 0)
                b.PrependUOffsetTRelativeSlot(3, key[3], 0)
                step_tables[key] = b.EndObject()
            step_offsets.append(step_tables[key])
        name = shared.string(program.name)
        steps = _table_vector(b, step_offsets)
        inputs = shared.vector(program.inputs, np.uint32)
        outputs = _uints(b, program.outputs, np.uint32)   # its own: a template cuts it out
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
    template = (inference.write_template(b, inference_template, shared.sources)
                if inference_template is not None else None)
    b.StartObject(18)
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
    # bytes of int8 weights read in place (Tensor.in_place), in no arena: a blob file's
    # loader reads them into one buffer, and wants to know its size before it parses
    b.PrependUint32Slot(17, sum(t.size for t in lowering.tensors if t.in_place), 0)
    if template is not None:
        b.PrependUOffsetTRelativeSlot(14, template, 0)
    b.FinishSizePrefixed(b.EndObject(), file_identifier=IDENTIFIER)
    body = bytes(b.Output())
    if regions is not None:
        regions["placed"] = shared.placed
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
    int8_export = qat_export.lower_export(lowering, eval_model)   # QAT: the int8 export
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
        lambda infer, regions: _write(infer, [], assign_offsets(infer), "", 0, None, None,
                                      regions=regions,
                                      share_quantization=int8_export is None), int8_export)
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
