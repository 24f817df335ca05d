"""export_inference_model: a trained checkpoint as a standard ONNX inference model.

The forward graph comes from the artifacts' eval graph (pipeline/inference.py); for a model
packed for quantization-aware training it is the QDQ model onnxruntime runs with its int8
kernels, or the float model without the fake quantization (quant/qdq.py). With ort_format,
its ORT format form too, for ORT Mobile and minimal builds (save_ort_format)."""
import contextlib
import io
import os
import pathlib
import shutil
import tempfile

import onnx

from .errors import ArtifactError
from .formats.checkpoint import read_checkpoint
from .formats.files import write_atomically
from .pipeline.inference import inference_model
from .quant.qdq import qdq_model, strip_quantization
from .quant.quantize import quantization_metadata


def export_inference_model(artifact_directory, checkpoint, path, output_names=None, prefix="",
                           qdq=False, ort_format=False):
    """Write a standard ONNX inference model to `path`: the forward graph of
    {prefix}eval_model.onnx in artifact_directory (no loss, no labels, no ai.microtrain
    ops, BatchNormalization in inference form, Dropout removed) with the parameters of
    `checkpoint` (e.g. one a device trained and saved) as initializers. output_names: the
    model outputs to keep (default all). Returns the ModelProto.
    For artifacts packed for quantization-aware training: qdq=True writes the QDQ model
    (int8 weights, int32 biases, the learned activation ranges; quant/qdq.py) that
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
