"""pack_int8: the integer training artifacts of a float ONNX model in one call (`microtrain
pack model.onnx -o DIR --int8 --calibrate data.npz`).

The route, every stage an existing one:
  1. the eval graph of the model packed for quantization-aware training, built in memory
     (artifacts.eval_graph: generate_artifacts' graphs with quantization, the observed
     activations getting frozen parameters `<tensor>.observer_range`, quant/quantize.py;
     nothing lowered, so the training graph's BatchNormalization in training mode never
     meets the batch size: batch 1 works with a BatchNorm1d after a Gemm too);
  2. the observer ranges set by post-training calibration - the float model in inference
     form (BatchNormalization with its running statistics, Dropout gone) run over the
     calibration samples, each observed tensor's min and max over all of them - or taken,
     with the weights, from a QAT-trained checkpoint;
  3. the QDQ model of those ranges and weights (quant/qdq.py, what `export --qdq` writes:
     BatchNormalization folded into the convolution or Gemm before it, int8 weights per
     output channel, int32 biases);
  4. its integer training blob (quant/inttrain.py, what `export --int8-train` writes),
     stored under the names of every pack: model.mtb, checkpoint, and int8.json (the input
     quantization and what trains), plus model_qdq.onnx (the int8 model, for onnxruntime).

What trains is the float path's choice (--train-biases, --train-last N), mapped by
int8_training_choice, or a named set (--requires-grad / --frozen NAMES, the float model's
parameter names; --frozen also takes names out of the --train-* choice)."""
import json
import os
import tempfile

import numpy as np
import onnx
from onnx import TensorProto, helper

from .artifacts import _check_directory, eval_graph
from .errors import ArtifactError
from .formats.checkpoint import read_checkpoint
from .formats.files import write_atomically
from .pipeline.inference import inference_model
from .quant.inttrain import int8_training_artifacts
from .quant.qdq import qdq_model, strip_quantization
from .quant.quantize import RANGE_SUFFIX, quantization_metadata

BLOB, CHECKPOINT, INFO, QDQ_MODEL = "model.mtb", "checkpoint", "int8.json", "model_qdq.onnx"
SAMPLE_KEYS = ("x_train", "x")
DEFAULT_LEARNING_RATE = 0.01
# the integer losses' float forms, which the QAT pack the calibration runs on is built with
FLOAT_LOSS = {"cross_entropy": "CrossEntropyLoss", "mse": "MSELoss",
              "bce_with_logits": "BCEWithLogitsLoss"}

def int8_training_choice(train_biases=False, train_last=None):
    """The int8_training_artifacts keywords of the float path's choice: --train-last N (a
    layer is a node with weights, counted from the output as for a float pack: 1 the
    classifier alone, N also the weights of the N - 1 layers before it) and --train-biases
    (the bias of every layer). Every layer the integer backward passes trains its bias too
    (quant/intbackward.py)."""
    last = 1 if train_last is None else int(train_last)
    if last < 1:
        raise ArtifactError(f"--train-last {last}: integer training (--int8) trains at least "
                            f"the classifier (--train-last 1)")
    choice = {"train_biases": True} if train_biases else {}
    if last > 1:
        choice["train_last"] = last
    return choice


def pack_int8(model, output, *, calibration=None, qat_checkpoint=None, batch_size=None,
              train_biases=False, train_last=None, learning_rate=None, momentum=0.0,
              activation_dtype="uint8", prefix="", loss="cross_entropy", target=None,
              requires_grad=None, frozen=None):
    """Write {prefix}model.mtb, checkpoint, int8.json and model_qdq.onnx into `output` (see
    the module docstring). model: float ONNX model (path or ModelProto). calibration: .npz
    path whose x_train (or x) samples set the activation ranges; qat_checkpoint instead: a
    checkpoint of `pack --qat` artifacts of the same model whose observer ranges and weights
    are used. batch_size fixes the blob's batch (as for a float pack). learning_rate
    (default 0.01) and momentum: the integer SGD's. loss: cross_entropy, mse or
    bce_with_logits (quant/intloss.py; each with train_biases / train_last), target:
    "input" for an mse autoencoder trained on its own input. requires_grad / frozen: a
    named parameter set, as generate_artifacts takes it (the float model's parameter
    names: quant/intbackward.py named_choice). Returns the info dict written to int8.json
    (with the paths written)."""
    from .quant.intloss import check_loss
    check_loss(loss, {"--train-biases": train_biases, "--train-last": (train_last or 1) > 1,
                      "--requires-grad / --frozen": requires_grad is not None or
                      frozen is not None})
    if (calibration is None) == (qat_checkpoint is None):
        raise ArtifactError("--int8 needs the activation ranges from one source: calibration "
                            "samples (--calibrate data.npz) or a quantization-aware trained "
                            "checkpoint (--qat-checkpoint CKPT)"
                            + (", not both" if calibration is not None else ""))
    choice = int8_training_choice(train_biases, train_last)
    lr = DEFAULT_LEARNING_RATE if learning_rate is None else float(learning_rate)
    _check_directory(output)
    samples = _calibration_samples(calibration) if calibration is not None else None
    with tempfile.TemporaryDirectory() as work:
        eval_model, values = eval_graph(model, batch_size=batch_size, loss=FLOAT_LOSS[loss],
                                        quantization={"activation_dtype": activation_dtype})
        owners = sorted(set(quantization_metadata(eval_model)["activations"].values()))
        if samples is not None:
            values.update(calibrated_ranges(eval_model, values, owners, *samples))
            source = {"calibration": os.fspath(calibration), "samples": len(samples[0]),
                      "samples_key": samples[1]}
        else:
            values = _checkpoint_values(values, owners, qat_checkpoint)
            source = {"qat_checkpoint": os.fspath(qat_checkpoint)}
        qdq = qdq_model(inference_model(eval_model, None, values), eval_model)
        onnx.checker.check_model(qdq, full_check=True)
        info = int8_training_artifacts(qdq, work, lr, momentum=momentum, loss=loss,
                                       target=target, requires_grad=requires_grad,
                                       frozen_params=frozen, **choice)
        files = {BLOB: info["blob"], CHECKPOINT: info["checkpoint"]}
        data = {name: open(path, "rb").read() for name, path in files.items()}
    os.makedirs(output, exist_ok=True)
    paths = {name: os.path.join(os.fspath(output), prefix + name)
             for name in (BLOB, CHECKPOINT, INFO, QDQ_MODEL)}
    info.update(source, blob=paths[BLOB], checkpoint=paths[CHECKPOINT], info=paths[INFO],
                qdq_model=paths[QDQ_MODEL])
    try:
        for name, content in data.items():
            write_atomically(paths[name], content)
        write_atomically(paths[QDQ_MODEL], qdq.SerializeToString())
        write_atomically(paths[INFO], json.dumps(info, indent=1).encode())
    except OSError as e:
        raise ArtifactError(f"cannot write into '{output}': {e}") from e
    return info


def _calibration_samples(path):
    """(float32 samples, the key they came from) of a calibration .npz."""
    try:
        with np.load(os.fspath(path), allow_pickle=False) as data:
            key = next((k for k in SAMPLE_KEYS if k in data.files), None)
            if key is None:
                raise ArtifactError(f"calibration data '{path}' has no array x_train or x "
                                    f"(it has {sorted(data.files)})")
            x = data[key]
    except (OSError, ValueError, EOFError) as e:
        if isinstance(e, FileNotFoundError):
            raise ArtifactError(f"calibration data '{path}' does not exist") from None
        raise ArtifactError(f"cannot read calibration data '{path}' as an .npz: {e}") from e
    if x.dtype.kind not in "biuf" or x.ndim < 2 or len(x) == 0:
        raise ArtifactError(f"calibration data '{path}': {key} must hold numbers, one sample "
                            f"per row (it is {x.dtype} {list(x.shape)})")
    x = x.astype(np.float32)
    if not np.isfinite(x).all():
        raise ArtifactError(f"calibration data '{path}': {key} holds NaN or infinite values")
    return x, key


def calibrated_ranges(eval_model, values, owners, x, key="x"):
    """{<tensor>.observer_range: [min, max]} of each observed tensor in owners, over the
    samples x, computed by the float inference model of the QAT eval graph (fake
    quantization removed) in batches of its fixed batch size (the last one filled up with
    samples from the start: min and max do not change)."""
    model = strip_quantization(inference_model(eval_model, None, values))
    graph = model.graph
    if len(graph.input) != 1:
        raise ArtifactError(f"integer training needs a model with one input; it has "
                            f"{len(graph.input)}")
    x_info = graph.input[0]
    if x_info.type.tensor_type.elem_type != TensorProto.FLOAT:
        raise ArtifactError(f"integer training quantizes a float input; the model's input "
                            f"'{x_info.name}' is "
                            f"{TensorProto.DataType.Name(x_info.type.tensor_type.elem_type)} "
                            f"(token ids: an embedding has no int8 kernel)")
    shape = [d.dim_value for d in x_info.type.tensor_type.shape.dim]
    per_sample = int(np.prod(shape[1:]))
    if x.shape[1:] != tuple(shape[1:]) and int(np.prod(x.shape[1:])) != per_sample:
        raise ArtifactError(f"calibration samples ({key}) have shape {list(x.shape)}; the "
                            f"model's input '{x_info.name}' takes samples of shape "
                            f"[N, {', '.join(map(str, shape[1:]))}]"
                            + (f" (or [N, {per_sample}])" if len(shape) > 2 else ""))
    x = x.reshape([len(x)] + shape[1:])
    outputs = {o.name for o in graph.output}
    for name in owners:
        if name != x_info.name and name not in outputs:
            graph.output.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, None))
    names = [o.name for o in graph.output]
    run = _runner(model)
    low = {name: np.inf for name in owners}
    high = {name: -np.inf for name in owners}
    batch = shape[0]
    for start in range(0, len(x), batch):
        chunk = x[np.arange(start, start + batch) % len(x)]
        found = dict(zip(names, run(names, {x_info.name: chunk})))
        found[x_info.name] = chunk
        for name in owners:
            low[name] = min(low[name], float(np.min(found[name])))
            high[name] = max(high[name], float(np.max(found[name])))
    return {name + RANGE_SUFFIX: np.array([low[name], high[name]], np.float32)
            for name in owners}


def _runner(model):
    """run(output names, feeds) of onnxruntime when it is installed, else of onnx's
    reference evaluator (the same standard ops, slower)."""
    try:
        import onnxruntime
    except ImportError:
        from onnx.reference import ReferenceEvaluator
        return ReferenceEvaluator(model).run
    session = onnxruntime.InferenceSession(model.SerializeToString(),
                                           providers=["CPUExecutionProvider"])
    return session.run


def _checkpoint_values(values, owners, path):
    """values with the parameters and observer ranges of a QAT-trained checkpoint."""
    state = read_checkpoint(path)
    stored = {**state.trainable, **state.frozen}
    result = dict(values)
    for name, value in values.items():
        if name not in stored:
            raise ArtifactError(f"--qat-checkpoint '{path}' has no parameter '{name}': it is "
                                f"not a checkpoint of `microtrain pack --qat` artifacts of "
                                f"this model (with the same --activation-dtype)")
        if stored[name].shape != value.shape:
            raise ArtifactError(f"--qat-checkpoint '{path}': '{name}' has shape "
                                f"{list(stored[name].shape)}, the model's {list(value.shape)}")
        result[name] = stored[name]
    for name in owners:
        low, high = result[name + RANGE_SUFFIX]
        if not (np.isfinite(low) and np.isfinite(high)):
            raise ArtifactError(f"--qat-checkpoint '{path}': the observer range of '{name}' "
                                f"was never set (train the QAT model first, or --calibrate)")
    return result
