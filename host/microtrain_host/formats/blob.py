"""The blob writer: a lowered, planned model (ir.py) -> the bytes of a .mtb file.

Blob file = u32 N + N-byte FlatBuffer (contract/microtrain.fbs, identifier "MTRB") + CRC-32
of those N bytes. Fields are written by name (formats/flatbuf.py); each step is checked
against the contract's op table before it is written. The inference template a training
blob carries (Model.inference) is cut and written here too (`cut_template`,
`write_template`); pipeline/inference.py lowers what goes into it."""
import zlib

import flatbuffers
import numpy as np
from flatbuffers import encode, number_types
from flatbuffers.table import Table

from ..contract import facts, schema
from ..ir import ACTIVATION, CONSTANT, NO_TENSOR, check_step
from .flatbuf import table_vector, write_table

SCHEMA = schema.blob_schema()
_TENSOR, _STEP, _PROGRAM, _PARAMETER, _OPTIMIZER, _MODEL, _TEMPLATE, _OUTPUT = (
    SCHEMA[t] for t in ("Tensor", "Step", "Program", "Parameter", "OptimizerConfig", "Model",
                        "InferenceTemplate", "InferenceOutput"))
IDENTIFIER = facts.BLOB_IDENTIFIER.encode()
FORMAT_VERSION = facts.FORMAT_VERSION

OUTPUT_IDS = NO_TENSOR  # template cut kind: the program's output-id vector (not a tensor's data)
COPY = 0x80000000       # template cut kind: COPY | e << 28 | distance: bytes of the training blob
MIN_COPY = 12           # a copy costs its 8-byte cut: longer regions pay
SPLICED_FIELDS = {"data": 1, "scale": 4, "zero_point": 4}   # Tensor fields a template splices


def _uints(builder, values, dtype):
    return builder.CreateNumpyVector(np.asarray(values, dtype=dtype))


class SharedObjects:
    """Strings and vectors written once per blob: FlatBuffers lets any number of tables
    point at one string or vector, so equal tensor names, program names, shapes, step
    attributes and scales cost their bytes once. `regions` maps the bytes of each one
    (u32 count, elements, a string's NUL) to (its offset: distance from the end of the
    buffer, 0 for a string or 1 for a vector of 4-byte elements): an inference template
    copies from them what it shares with its training blob (cut_template)."""

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


def optimizer_fields(kind, options):
    """The OptimizerConfig fields of optimizer `kind` (a contract.facts.OPTIMIZERS name) and
    its options, in the order the blob has always had them (its own options, the weight
    decay, the gradient options: readers go by field number, the order only decides the
    bytes). An option left out is the schema's default, which is not written."""
    names = [n for n in facts.OPTIMIZERS[kind].options if n != "weight_decay"]
    fields = []
    for name in names + ["weight_decay"] + list(facts.GRADIENT_OPTIONS):
        value = options.get(name, _OPTIMIZER[name].default)
        if name == "clip_grad_norm":
            value = value or 0.0        # None: no clipping, stored as 0
        fields.append((name, value))
    return fields


def serialize(lowering, parameters, sizes, loss, num_classes, optimizer, options,
              full_training=(0, 0), inference_template=None, source_opset=0, regions=None,
              share_quantization=True):
    """The blob bytes. parameters: [(param tensor id, grad id or -1, state ids, updated in
    the backward pass)]. optimizer: the kind's name (contract.facts.OPTIMIZERS) or None.
    regions: a dict that receives where each string and vector is, for an inference
    template cut from this blob. share_quantization=False: every quantized tensor keeps its
    own scale and zero point vectors, whatever their values (an int8 inference blob whose
    layout must not depend on them: one the device exports from a QAT blob, and the host's
    of the same model)."""
    float_arena, int_arena, naive_size, lower_bound = sizes
    b = flatbuffers.Builder(4096)
    shared = SharedObjects(b)
    tensor_offsets = []
    for tid, t in enumerate(lowering.tensors):
        vector = shared.vector if share_quantization else shared.own_vector
        name = shared.string(t.name)
        shape = shared.vector(list(t.shape), np.int32)
        data = b.CreateNumpyVector(np.frombuffer(t.data, np.uint8)) if t.role == CONSTANT else None
        program = shared.string(t.program) if t.program else None
        scale = vector(t.scale, np.float32) if len(t.scale) else None
        zero_point = vector(t.zero_point[:1] if len(set(t.zero_point)) == 1 else t.zero_point,
                            np.int32) if len(t.zero_point) else None
        quantized = scale is not None
        tensor_offsets.append(write_table(b, _TENSOR, [
            ("name", name), ("dtype", t.dtype), ("role", t.role), ("shape", shape),
            ("offset", t.offset), ("size", t.size), ("data", data), ("program", program),
            # an alias of a temporary: which space it shares, for the memory plan
            ("alias_of", t.storage if t.storage != tid and t.role == ACTIVATION else None),
            ("scale", scale), ("zero_point", zero_point if quantized else None),
            ("axis", t.axis if quantized else None),
            ("derived", t.derived), ("in_place", t.in_place)]))
    program_offsets = []
    step_tables = {}   # an eval step equal to a train step (shared tensors) is its table
    for program in lowering.programs.values():
        step_offsets = []
        for step in program.steps:
            check_step(step.op, step.tensors, step.ints, step.floats,
                       f"{step.node}' of program '{program.name}")
            key = (step.op, shared.vector(step.tensors, np.uint32),
                   shared.vector(step.ints, np.int32), shared.vector(step.floats, np.float32))
            if key not in step_tables:
                step_tables[key] = write_table(b, _STEP, zip(("op", "tensors", "ints", "floats"),
                                                             key))
            step_offsets.append(step_tables[key])
        name = shared.string(program.name)
        steps = table_vector(b, step_offsets)
        inputs = shared.vector(program.inputs, np.uint32)
        outputs = _uints(b, program.outputs, np.uint32)   # its own: a template cuts it out
        latent = _uints(b, program.latent, np.uint32) if program.latent else None
        program_offsets.append(write_table(b, _PROGRAM, [
            ("name", name), ("steps", steps), ("inputs", inputs), ("outputs", outputs),
            ("latent_from", program.latent_from), ("latent", latent)]))
    param_offsets = []
    for tensor, grad, states, in_backward in parameters:
        state_vec = _uints(b, states, np.uint32)
        param_offsets.append(write_table(b, _PARAMETER, [
            ("tensor", tensor), ("grad", grad), ("state", state_vec),
            ("updated_in_backward", in_backward)]))
    opt = None
    if optimizer is not None:
        kind = b.CreateString(optimizer)
        opt = write_table(b, _OPTIMIZER, [("kind", kind)] + optimizer_fields(optimizer, options))
    producer = b.CreateString("microtrain")
    tensors_vec = table_vector(b, tensor_offsets)
    params_vec = table_vector(b, param_offsets)
    programs_vec = table_vector(b, program_offsets)
    loss_name = b.CreateString(loss)
    template = (write_template(b, inference_template, shared.sources)
                if inference_template is not None else None)
    root = write_table(b, _MODEL, [
        ("format_version", FORMAT_VERSION), ("producer", producer), ("tensors", tensors_vec),
        ("parameters", params_vec), ("programs", programs_vec), ("float_arena", float_arena),
        ("int_arena", int_arena), ("loss", loss_name), ("num_classes", num_classes),
        ("optimizer", opt), ("naive_size", naive_size), ("lower_bound", lower_bound),
        ("full_training_arena", full_training[0]), ("full_training_steps", full_training[1]),
        ("source_opset", source_opset),   # absent (0) unless upgraded: blobs stay as they were
        ("byte_arena", getattr(lowering, "byte_arena", 0)),   # absent without int8
        # bytes of int8 weights read in place (Tensor.in_place), in no arena: a blob file's
        # loader reads them into one buffer, and wants to know its size before it parses
        ("weights_in_place", sum(t.size for t in lowering.tensors if t.in_place)),
        ("inference", template)])
    b.FinishSizePrefixed(root, file_identifier=IDENTIFIER)
    body = bytes(b.Output())
    if regions is not None:
        regions["placed"] = shared.placed
    return body + (zlib.crc32(body[4:]) & 0xFFFFFFFF).to_bytes(4, "little")


# -- the inference template ---------------------------------------------------------------

def _vector(table, field):
    """(position of the first element, element count) of vector field `field`."""
    slot = table.Offset(4 + 2 * field.number)
    return table.Vector(slot), table.VectorLen(slot)


def cut_template(blob, spliced, shared=None, training=None):
    """Cut out of a written inference blob the data (or scales, zero points) of the spliced
    tensors ([(tensor id, Tensor field name, training tensor id)]), the program's output-id
    vector and, given `shared` (the template's SharedObjects.regions) and `training` (the
    training blob's), every string or vector of MIN_COPY bytes or more that the training
    blob holds too. Returns (template bytes, cuts): cuts is a flat list of (position in
    the template, training tensor id, OUTPUT_IDS or COPY | e << 28 | distance from the end
    of the training FlatBuffer) pairs, by position (schema: InferenceTemplate)."""
    content = blob[4:-4]  # the FlatBuffer without size prefix and CRC
    root = Table(content, encode.Get(number_types.UOffsetTFlags.packer_type, content, 0))
    tensors, _ = _vector(root, _MODEL["tensors"])
    regions = []
    for tid, field, source in spliced:
        data, size = _vector(Table(content, root.Indirect(tensors + 4 * tid)), _TENSOR[field])
        regions.append((data, data + SPLICED_FIELDS[field] * size, source))
    programs, _ = _vector(root, _MODEL["programs"])
    outputs, count = _vector(Table(content, root.Indirect(programs)), _PROGRAM["outputs"])
    regions.append((outputs - 4, outputs + 4 * count, OUTPUT_IDS))  # with its count
    if shared and training:
        taken = sorted(regions)
        for key, offset, code in shared["placed"]:
            if len(key) >= MIN_COPY and key in training and training[key][1] == code \
                    and training[key][0] < 1 << 28:
                start = len(content) - offset
                assert content[start:start + len(key)] == key
                if any(s < start + len(key) and start < e for s, e, _ in taken):
                    continue   # spliced (a quantization parameter of a QAT template)
                regions.append((start, start + len(key), COPY | code << 28 | training[key][0]))
    regions.sort()
    template, cuts, at = b"", [], 0
    for start, end, kind in regions:
        assert start >= at, "overlapping template regions"
        template += content[at:start]
        cuts += [len(template), kind]
        at = end
    return template + content[at:], cuts


def write_template(b, template, training_regions):
    """Write an InferenceTemplate table with FlatBuffers builder b, copying from the
    training blob (its SharedObjects.regions, already written) what both hold; returns its
    offset. template: (inference blob, spliced tensors, its regions, [(output name, tensor
    id in the inference blob)]) (pipeline/inference.py inference_template)."""
    blob, spliced, regions, outputs = template
    data, cuts = cut_template(blob, spliced, regions, training_regions)
    output_offsets = []
    for name, tid in outputs:
        name_offset = b.CreateString(name)
        output_offsets.append(write_table(b, _OUTPUT, [("name", name_offset), ("tensor", tid)]))
    outputs_vec = table_vector(b, output_offsets)
    data_vec = b.CreateByteVector(data)
    cuts_vec = b.CreateNumpyVector(np.asarray(cuts, dtype=np.uint32))
    return write_table(b, _TEMPLATE, [("blob", data_vec), ("cuts", cuts_vec),
                                      ("outputs", outputs_vec)])
