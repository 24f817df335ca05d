"""Inference models: the trained forward graph without loss, labels or training behaviour.

Two products come from one function, `inference_model` (eval graph -> plain ONNX forward):
  * `export_inference_model`: a standard ONNX file with a checkpoint's weights as
    initializers, for onnxruntime or any other inference runtime (and, with ort_format,
    its ORT format form for ORT Mobile and minimal builds: `save_ort_format`);
  * the inference template packed into model.mtb: the inference-only blob the device
    writes in Module.export_model_for_inferencing, with its own arena plan, minus the
    regions only the device knows at export time (the current parameter values and the
    outputs chosen). `lower_inference` lowers it, `cut_template` cuts those regions out,
    `write_template` writes the result into the training blob (schema: InferenceTemplate).
"""
import contextlib
import io
import os
import pathlib
import shutil
import tempfile

import numpy as np
import onnx
from flatbuffers import encode, number_types
from flatbuffers.table import Table
from onnx import helper, numpy_helper

from .checkpoint import read_checkpoint, write_atomically
from ..errors import ArtifactError
from ..graph import DOMAIN
from .lower import CONSTANT, INPUT, LABEL, NO_TENSOR, Lowering, meta_names
from .qdq import qdq_model, strip_quantization
from .quantize import quantization_metadata

INFER_PROGRAM = "infer"
OUTPUT_IDS = NO_TENSOR   # cut kind: the program's output-id vector (not a tensor's data)


def model_outputs(eval_model):
    """The model's own outputs (what inference returns), in the ONNX model's order."""
    meta = {p.key: p.value for p in eval_model.metadata_props}
    return meta_names(meta, "outputs")


def inference_model(eval_model, output_names=None, values=None):
    """Plain ONNX forward graph computing output_names (default: every model output) from
    the eval graph, whose nodes are already in inference form (BatchNormalization with its
    running statistics, Dropout an Identity: normalization.inference_form), by pruning the
    loss and labels. values {name: array}: parameters become initializers with these
    values; without values they stay graph inputs (what the device lowering wants)."""
    meta = {p.key: p.value for p in eval_model.metadata_props}
    known = model_outputs(eval_model)
    outputs = list(output_names) if output_names is not None else known
    unknown = [n for n in outputs if n not in known]
    if unknown or not outputs:
        problem = (f"output names {unknown} are not outputs of the model" if unknown
                   else "name at least one output")
        raise ArtifactError(f"{problem}; the model's outputs are: {', '.join(known)}")
    graph = eval_model.graph
    needed = set(outputs)
    kept = []
    for node in reversed(graph.node):
        if any(o in needed for o in node.output):
            kept.append(node)
            needed.update(i for i in node.input if i)
    kept.reverse()
    params = set(meta_names(meta, "params"))
    user_inputs = meta_names(meta, "inputs")
    inputs = [vi for vi in graph.input
              if vi.name in user_inputs or (vi.name in needed and vi.name not in params)]
    initializers = [i for i in graph.initializer if i.name in needed]
    parameters = [vi for vi in graph.input if vi.name in params and vi.name in needed]
    if values is None:
        inputs += parameters
    else:
        initializers += [numpy_helper.from_array(_parameter_value(vi, values), vi.name)
                         for vi in parameters]
    infos = {vi.name: vi for vi in list(graph.value_info) + list(graph.output)}
    produced = {o for n in kept for o in n.output}
    value_info = [infos[n] for n in sorted(produced - set(outputs)) if n in infos]
    new_graph = helper.make_graph(kept, "inference", inputs, [infos[n] for n in outputs],
                                  initializer=initializers, value_info=value_info)
    opsets = [o for o in eval_model.opset_import if o.domain != DOMAIN]
    return helper.make_model(new_graph, opset_imports=opsets, producer_name="microtrain",
                             ir_version=eval_model.ir_version)


def _parameter_value(vi, values):
    if vi.name not in values:
        raise ArtifactError(f"the checkpoint has no value for parameter '{vi.name}'")
    value = np.asarray(values[vi.name], dtype=np.float32)
    shape = tuple(d.dim_value for d in vi.type.tensor_type.shape.dim)
    if value.shape != shape:
        raise ArtifactError(f"parameter '{vi.name}' has shape {list(value.shape)} in the "
                            f"checkpoint, {list(shape)} in the model")
    return value


def export_inference_model(artifact_directory, checkpoint, path, output_names=None, prefix="",
                           qdq=False, ort_format=False):
    """Write a standard ONNX inference model to `path`: the forward graph of
    {prefix}eval_model.onnx in artifact_directory (no loss, no labels, no ai.microtrain
    ops, BatchNormalization in inference form, Dropout removed) with the parameters of
    `checkpoint` (e.g. one a device trained and saved) as initializers. output_names: the
    model outputs to keep (default all). Returns the ModelProto.
    For artifacts packed for quantization-aware training: qdq=True writes the QDQ model
    (int8 weights, int32 biases, the learned activation ranges; pipeline/qdq.py) that
    onnxruntime runs with its quantized kernels; qdq=False the float model without the
    fake quantization. ort_format=True also writes the model's ORT format beside it
    (save_ort_format: the .ort file and its required-operators config)."""
    eval_path = os.path.join(os.fspath(artifact_directory), prefix + "eval_model.onnx")
    try:
        eval_model = onnx.load(eval_path)
    except Exception as e:  # protobuf raises several types for a bad file
        raise ArtifactError(f"cannot read '{eval_path}': {e}") from e
    state = read_checkpoint(checkpoint)
    if state.is_nominal:
        raise ArtifactError(f"'{checkpoint}' is a nominal checkpoint: it has no parameter "
                            f"values to export")
    model = inference_model(eval_model, output_names, {**state.trainable, **state.frozen})
    if quantization_metadata(eval_model) is not None:
        model = qdq_model(model, eval_model) if qdq else strip_quantization(model)
    elif qdq:
        raise ArtifactError(f"'{eval_path}' was not packed for quantization-aware training "
                            f"(microtrain pack --qat): there is no QDQ model to export")
    onnx.checker.check_model(model, full_check=True)
    try:
        write_atomically(os.fspath(path), model.SerializeToString())
    except OSError as e:
        raise ArtifactError(f"cannot write '{path}': {e}") from e
    if ort_format:
        save_ort_format(path)
    return model


def save_ort_format(path):
    """Convert the ONNX model at `path` to ORT format with onnxruntime's own converter
    (onnxruntime.tools.convert_onnx_models_to_ort, fixed optimizations at its default level,
    as ORT's docs build models for ORT Mobile and minimal builds). Writes `path` with the
    suffix .ort, and beside it .required_operators.config, the operator list a minimal
    build of onnxruntime is configured with. Returns the two paths."""
    try:
        from onnxruntime.tools.convert_onnx_models_to_ort import (OptimizationStyle,
                                                                  convert_onnx_models_to_ort)
    except ImportError as e:
        raise ArtifactError(f"the ORT format needs onnxruntime's converter "
                            f"(onnxruntime.tools.convert_onnx_models_to_ort), which cannot be "
                            f"imported ({e}): pip install onnxruntime") from e
    target = pathlib.Path(path).with_suffix(".ort")
    config = target.with_suffix(".required_operators.config")
    # The converter takes .onnx files and names its outputs after them: convert a copy
    # named like the target, in a directory of our own, then move the results into place
    # (each move atomic, as the .onnx was written).
    with tempfile.TemporaryDirectory(dir=target.parent) as work:
        source = pathlib.Path(work) / (target.stem + ".onnx")
        shutil.copyfile(path, source)
        converted = pathlib.Path(work) / "ort"
        chatter = io.StringIO()   # the converter prints and logs its progress
        try:
            with contextlib.redirect_stdout(chatter), contextlib.redirect_stderr(chatter):
                convert_onnx_models_to_ort(source, output_dir=converted,
                                           optimization_styles=[OptimizationStyle.Fixed])
        except Exception as e:  # onnxruntime raises its own exception types
            raise ArtifactError(f"onnxruntime could not convert '{path}' to ORT format: "
                                f"{e}") from e
        os.replace(converted / target.name, target)
        os.replace(converted / config.name, config)
    return str(target), str(config)


# -- the device's inference template ---------------------------------------------------

def lower_inference(eval_model, roles, training):
    """Lower the inference graph with its own tensor table. Parameters are lowered as the
    eval program sees them (runtime values, so no lowering can fold them into constants),
    then turned into constants whose data the device fills in at export. Returns the
    lowering and [(tensor id here, Tensor field 6 (data), tensor id in the training
    lowering)]."""
    lowering = Lowering(roles)
    lowering.lower(INFER_PROGRAM, inference_model(eval_model))
    spliced = []
    for name, tid in lowering.persistent.items():
        t = lowering.tensors[tid]
        if t.role == CONSTANT:
            # a constant the training blob holds too (int8 weights of frozen layers, their
            # requantization tensors): taken from its arena at export, not stored twice
            source = training.persistent.get(name)
            twin = training.tensors[source] if source is not None else None
            if twin is not None and twin.role == CONSTANT and twin.dtype == t.dtype \
                    and twin.data == t.data and len(t.data) >= 64:
                t.data = bytes(len(t.data))
                spliced.append((tid, 6, source))
            continue
        if t.role in (INPUT, LABEL):
            continue
        source = training.persistent.get(name)
        if source is None or training.tensors[source].size != t.size:
            raise ArtifactError(f"inference tensor '{name}' has no counterpart in the training "
                                f"blob to take its values from")
        t.role, t.data = CONSTANT, bytes(len(t.data) if t.data else 4 * t.size)
        spliced.append((tid, 6, source))
    return lowering, spliced


def _vector(table, field):
    """(position of the first element, element count) of vector field `field`."""
    slot = table.Offset(4 + 2 * field)
    return table.Vector(slot), table.VectorLen(slot)


COPY = 0x80000000       # cut kind: COPY | e << 28 | distance: bytes of the training blob
MIN_COPY = 12           # a copy costs its 8-byte cut: longer regions pay


SPLICED_FIELDS = {6: 1, 9: 4, 10: 4}   # Tensor.data, .scale, .zero_point: element bytes


def cut_template(blob, spliced, shared=None, training=None):
    """Cut out of a written inference blob the data (or scales, zero points) of the spliced
    tensors, the program's
    output-id vector and, given `shared` (the template's SharedObjects.regions) and
    `training` (the training blob's), every string or vector of MIN_COPY bytes or more that
    the training blob holds too. Returns (template bytes, cuts): cuts is a flat list of
    (position in the template, training tensor id, OUTPUT_IDS or COPY | e << 28 |
    distance from the end of the training FlatBuffer) pairs, by position (schema:
    InferenceTemplate). Field numbers: Model.tensors 2, Model.programs 4, Tensor.data 6,
    Program.outputs 3."""
    content = blob[4:-4]  # the FlatBuffer without size prefix and CRC
    root = Table(content, encode.Get(number_types.UOffsetTFlags.packer_type, content, 0))
    tensors, _ = _vector(root, 2)
    regions = []
    for tid, field, source in spliced:
        data, size = _vector(Table(content, root.Indirect(tensors + 4 * tid)), field)
        regions.append((data, data + SPLICED_FIELDS[field] * size, source))
    programs, _ = _vector(root, 4)
    outputs, count = _vector(Table(content, root.Indirect(programs)), 3)
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


def inference_template(eval_model, roles, training, write_blob, int8=None):
    """(inference blob, spliced tensors, its shared regions, [(output name, tensor id in
    the inference blob)]) for the training blob; write_blob(lowering, regions) plans a
    lowering and returns the blob bytes, filling `regions` (SharedObjects.regions). The
    training blob's writer cuts it (write_template). int8: what qat_export.lower_export
    returned for a QAT blob: the template is then the int8 inference blob."""
    if int8 is not None:
        from .qat_export import lower_int8_template
        lowering, spliced = lower_int8_template(int8, training)
    else:
        lowering, spliced = lower_inference(eval_model, roles, training)
    regions = {}
    blob = write_blob(lowering, regions)
    program = lowering.programs[INFER_PROGRAM]
    return blob, spliced, regions, [(lowering.tensors[t].name, t) for t in program.outputs]


def write_template(b, template, training_regions):
    """Write an InferenceTemplate table with FlatBuffers builder b, copying from the
    training blob (its SharedObjects.regions, already written) what both hold; returns its
    offset."""
    blob, spliced, regions, outputs = template
    data, cuts = cut_template(blob, spliced, regions, training_regions)
    output_offsets = []
    for name, tid in outputs:
        name_offset = b.CreateString(name)
        b.StartObject(2)
        b.PrependUOffsetTRelativeSlot(0, name_offset, 0)
        b.PrependUint32Slot(1, tid, 0)
        output_offsets.append(b.EndObject())
    b.StartVector(4, len(output_offsets), 4)
    for off in reversed(output_offsets):
        b.PrependUOffsetTRelative(off)
    outputs_vec = b.EndVector()
    data_vec = b.CreateByteVector(data)
    cuts_vec = b.CreateNumpyVector(np.asarray(cuts, dtype=np.uint32))
    b.StartObject(3)
    b.PrependUOffsetTRelativeSlot(0, data_vec, 0)
    b.PrependUOffsetTRelativeSlot(1, cuts_vec, 0)
    b.PrependUOffsetTRelativeSlot(2, outputs_vec, 0)
    return b.EndObject()
