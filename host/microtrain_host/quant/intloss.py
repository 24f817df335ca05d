"""Which losses train in integers (issue 22; the kernels: ops/intloss.py and
ops/inttrain.py): the names `microtrain pack --loss` uses (cli_parser.LOSS_NAMES), the
refusal of the others at pack time, the loss of a QAT pack for `export --int8-train`, and
the integers the device takes as targets (quantize_target)."""
import numpy as np

from ..errors import ArtifactError

# the losses with an integer form: `microtrain pack --loss` names (cli_parser.LOSS_NAMES) ->
# (the training op, the blob's loss name, loss ints per sample)
INTEGER_LOSSES = {
    "cross_entropy": ("IntSoftmaxCrossEntropy", "int_softmax_cross_entropy", 2),
    "mse": ("IntMeanSquaredError", "int_mean_squared_error", 2),
    "bce_with_logits": ("IntBCEWithLogits", "int_bce_with_logits", 4)}
# the float pack's loss (LossType names, as a blob records them) -> those names
LOSS_OF_BLOB = {"CrossEntropyLoss": "cross_entropy", "MSELoss": "mse",
                "BCEWithLogitsLoss": "bce_with_logits", "L1Loss": "l1", "": "none"}


def pack_loss(blob, args):
    """The loss of the QAT pack whose blob is `blob` (export --int8-train), checked against
    the command's options (check_loss)."""
    from microtrain import parser as device_blob_parser
    recorded = device_blob_parser.load(blob).loss
    loss = LOSS_OF_BLOB.get(recorded, recorded)
    check_loss(loss, {f"--int8-{name.replace('_', '-')}": getattr(args, "int8_" + name) not in
                      (None, False) for name in ("train_conv", "train_biases",
                                                 "train_depthwise", "max_classes",
                                                 "keep_classes", "target_is_input")})
    return loss


# the options every integer loss takes (the integer backward below the last Gemm, fed its
# input's gradient as the cross-entropy's: ops/inttrain.py IntGemmGradInput); the others
# (the 1x1 convolution's and the last block's fused updates, class slots) are the
# cross-entropy's
ANY_LOSS = ("train_biases", "train_last")


def check_loss(loss, others):
    """Refuse a loss with no integer form, or one other than the cross-entropy with the
    options that only the classifier's softmax has (others: {option: given})."""
    if loss not in INTEGER_LOSSES:
        raise ArtifactError(f"integer training has no integer form of the loss '{loss}'; "
                            f"it trains with {', '.join(INTEGER_LOSSES)}")
    given = [name for name, value in others.items() if value and "target" not in name and
             not any(option in name.replace("-", "_") for option in ANY_LOSS)]
    if others.get("--int8-target-is-input") and loss != "mse":
        raise ArtifactError(f"--int8-target-is-input needs the mse loss, not '{loss}'")
    if loss != "cross_entropy" and given:
        raise ArtifactError(f"integer training with the loss '{loss}' trains the last Gemm, "
                            f"the biases and the last layers only: {', '.join(given)} "
                            f"need(s) the cross_entropy loss")


def quantize_target(t, info):
    """The integers the device is fed as the target for float target t: mse, quantized as
    the output (QuantizeLinear with the info's target scale and zero point); bce_with_logits,
    probabilities in Q14 (round(t * 2**14))."""
    if info["loss"] == "bce_with_logits":
        return np.rint(np.clip(np.asarray(t, np.float64), 0, 1) * 16384).astype(np.int32)
    lo, hi = (-128, 127) if info["target_type"] == "int8" else (0, 255)
    q = np.rint(np.asarray(t, np.float32) / np.float32(info["target_scale"]))
    return np.clip(q + info["target_zero_point"], lo, hi).astype(
        np.int8 if lo else np.uint8)
