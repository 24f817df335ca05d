"""export_inference_model: a trained checkpoint as a standard ONNX inference model.

The forward graph comes from the artifacts' eval graph (pipeline/inference.py); for a model
packed for quantization-aware training it is the QDQ model onnxruntime runs with its int8
kernels, or the float model without the fake quantization (quant/qdq.py)."""
import os

import onnx

from .errors import ArtifactError
from .formats.checkpoint import read_checkpoint
from .formats.files import write_atomically
from .pipeline.inference import inference_model
from .quant.qdq import qdq_model, strip_quantization
from .quant.quantize import quantization_metadata


def export_inference_model(artifact_directory, checkpoint, path, output_names=None, prefix="",
                           qdq=False):
    """Write a standard ONNX inference model to `path`: the forward graph of
    {prefix}eval_model.onnx in artifact_directory (no loss, no labels, no ai.microtrain
    ops, BatchNormalization in inference form, Dropout removed) with the parameters of
    `checkpoint` (e.g. one a device trained and saved) as initializers. output_names: the
    model outputs to keep (default all). Returns the ModelProto.
    For artifacts packed for quantization-aware training: qdq=True writes the QDQ model
    (int8 weights, int32 biases, the learned activation ranges; quant/qdq.py) that
    onnxruntime runs with its quantized kernels; qdq=False the float model without the
    fake quantization."""
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
    return model
