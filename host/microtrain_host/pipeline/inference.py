"""Inference models: the trained forward graph without loss, labels or training behaviour.

Two products come from one function, `inference_model` (eval graph -> plain ONNX forward):
  * `export_inference_model` (microtrain_host/export.py): a standard ONNX file with a
    checkpoint's weights as initializers, for onnxruntime or any other inference runtime;
  * the inference template packed into model.mtb: the inference-only blob the device
    writes in Module.export_model_for_inferencing, with its own arena plan, minus the
    regions only the device knows at export time (the current parameter values and the
    outputs chosen). `lower_inference` lowers it; formats/blob.py cuts those regions out
    and writes the result into the training blob (schema: InferenceTemplate).
"""
import numpy as np
from onnx import helper, numpy_helper

from ..errors import ArtifactError
from ..graph import DOMAIN
from ..ir import CONSTANT, INPUT, LABEL
from .lower import Lowering, meta_names

INFER_PROGRAM = "infer"


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


# -- the device's inference template ---------------------------------------------------

def lower_inference(eval_model, roles, training):
    """Lower the inference graph with its own tensor table. Parameters are lowered as the
    eval program sees them (runtime values, so no lowering can fold them into constants),
    then turned into constants whose data the device fills in at export. Returns the
    lowering and [(tensor id here, "data" (the Tensor field), tensor id in the training
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
                spliced.append((tid, "data", source))
            continue
        if t.role in (INPUT, LABEL):
            continue
        source = training.persistent.get(name)
        if source is None or training.tensors[source].size != t.size:
            raise ArtifactError(f"inference tensor '{name}' has no counterpart in the training "
                                f"blob to take its values from")
        t.role, t.data = CONSTANT, bytes(len(t.data) if t.data else 4 * t.size)
        spliced.append((tid, "data", source))
    return lowering, spliced


def inference_template(eval_model, roles, training, write_blob, int8_template=None):
    """(inference blob, spliced tensors, its shared regions, [(output name, tensor id in
    the inference blob)]) for the training blob; write_blob(lowering, regions) plans a
    lowering and returns the blob bytes, filling `regions` (SharedObjects.regions). The
    training blob's writer cuts it (formats/blob.py write_template). int8_template(training)
    -> (lowering, spliced): a QAT blob's template, the int8 inference blob
    (quant/qat_export.py)."""
    if int8_template is not None:
        lowering, spliced = int8_template(training)
    else:
        lowering, spliced = lower_inference(eval_model, roles, training)
    regions = {}
    blob = write_blob(lowering, regions)
    program = lowering.programs[INFER_PROGRAM]
    return blob, spliced, regions, [(lowering.tensors[t].name, t) for t in program.outputs]
