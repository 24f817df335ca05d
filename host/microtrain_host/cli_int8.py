"""`microtrain pack --int8`: its options and help (added to the pack parser by cli_parser.py)
and the float pack options it refuses, by name, before any work (int8pack.py does the
packing; cli.py prints)."""
import os

# `train` and `deploy` take an integer training directory as any other (tools/train.py
# artifact_files)
ARTIFACTS_HELP = ("directory written by `microtrain pack` (model.mtb, checkpoint) or export "
                  "--int8-train (int8_train.mtb, .ckpt; samples quantized for its int8 input)")
# pack options the integer path has no form of yet, with what to say instead
FLOAT_ONLY = {
    "loss_inputs": "--loss-inputs",
    "weight_decay": "--weight-decay",
    "dampening": "--dampening",
    "nesterov": "--nesterov",
    "l1_penalty": "--l1-penalty",
    "l2_penalty": "--l2-penalty",
    "clip_grad_norm": "--clip-grad-norm",
    "recompute": "--recompute",
    "nominal_checkpoint": "--nominal-checkpoint",
    "qat": "--qat",
    "quantize": "--quantize",
    "keep_float": "--keep-float",
}


def add_int8_arguments(parser):
    g = parser.add_argument_group(
        "integer training",
        "--int8 packs a float model for training in integers on the device: the activation "
        "ranges calibrated on samples (or taken from a QAT-trained checkpoint), int8 "
        "weights per output channel (BatchNormalization folded into the convolution or "
        "Gemm before it, so any --batch-size, 1 included), every train step integer-only. "
        "Writes model.mtb, "
        "checkpoint, int8.json (the input's scale and zero point: the blob takes int8 / "
        "uint8 inputs) and model_qdq.onnx (the int8 model for onnxruntime). Integer "
        "training is SGD (--lr, default 0.01; --momentum) of the classifier; --train-last "
        "N adds the weights of the N - 1 layers before it, --train-biases every layer's "
        "bias (the backward runs in integers through convolutions, Gemms, residual Adds, "
        "Concats, "
        "pools, Flatten and lookup-table activations: a standalone ReLU / Clip, Sigmoid, "
        "Tanh, LeakyRelu, HardSigmoid, HardSwish; every layer it passes trains its bias). "
        "--requires-grad / --frozen NAMES (the float model's parameter names; a "
        "BatchNormalization folded into a convolution: the convolution's) choose exactly "
        "what trains, as for a float pack; the classifier always trains. The loss: --loss "
        "cross_entropy (class labels), mse (a target quantized as the output, or the input "
        "with --target-is-input: autoencoders) or bce_with_logits (target probabilities), "
        "each with --train-biases and --train-last. "
        "Example: microtrain pack model.onnx -o build --int8 --calibrate data.npz "
        "--batch-size 1 --train-biases --train-last 3")
    g.add_argument("--int8", action="store_true",
                   help="write the integer training blob (needs --calibrate or "
                        "--qat-checkpoint)")
    g.add_argument("--calibrate", metavar="NPZ",
                   help="with --int8: an .npz whose x_train (or x) samples, [N, *input "
                        "shape] or flattened [N, values], set each quantized activation's "
                        "range (its min and max over all samples, the float model in "
                        "inference form)")
    g.add_argument("--target-is-input", action="store_true",
                   help="with --int8 --loss mse: the model's input is its target (an "
                        "autoencoder; the device is called model(x))")
    g.add_argument("--qat-checkpoint", metavar="CKPT",
                   help="with --int8, instead of --calibrate: a checkpoint of `pack --qat` "
                        "artifacts of this model, trained: its observer ranges and weights")


def int8_pack_options(args):
    """pack_int8's keyword arguments from the pack arguments, or an ArtifactError naming the
    option the integer path cannot take."""
    from .errors import ArtifactError
    if not args.int8:
        for flag, value in (("--calibrate", args.calibrate),
                            ("--qat-checkpoint", args.qat_checkpoint),
                            ("--target-is-input", args.target_is_input or None)):
            if value is not None:
                raise ArtifactError(f"{flag} is for the integer training blob: add --int8")
        return None
    for name, flag in FLOAT_ONLY.items():
        if getattr(args, name) not in (None, False):
            raise ArtifactError(f"{flag} is not supported with --int8: integer training is "
                                f"SGD (--lr, --momentum) of the parameters --train-biases / "
                                f"--train-last / --requires-grad / --frozen choose")
    if args.requires_grad is not None and (args.train_biases or args.train_last is not None):
        raise ArtifactError("--requires-grad and --train-biases / --train-last both choose the "
                            "trainable parameters: give one or the other")
    if args.optimizer not in (None, "sgd"):
        raise ArtifactError(f"--optimizer {args.optimizer}: integer training (--int8) steps "
                            f"with SGD only (give --optimizer sgd, or leave it out)")
    if args.target_is_input and args.loss != "mse":
        raise ArtifactError("--target-is-input needs --loss mse (an autoencoder)")
    if args.momentum is not None and not args.momentum < 1:
        raise ArtifactError(f"--momentum {args.momentum:g}: integer SGD momentum must lie "
                            f"in [0, 1)")
    if args.lr == 0:
        raise ArtifactError("--lr 0: integer training needs a positive learning rate")
    return dict(calibration=args.calibrate, qat_checkpoint=args.qat_checkpoint,
                batch_size=args.batch_size, train_biases=args.train_biases,
                train_last=args.train_last, learning_rate=args.lr,
                requires_grad=_names(args.requires_grad), frozen=_names(args.frozen),
                momentum=args.momentum or 0.0, activation_dtype=args.activation_dtype,
                prefix=args.prefix, loss=args.loss,
                target="input" if args.target_is_input else None)


def _names(text):
    # a comma-separated list of parameter names, as the float pack reads it (cli.py)
    return [n for n in text.split(",") if n] if text is not None else None


def int8_pack_text(args, info):
    """What `pack --int8` prints: the files, what trains, the input quantization."""
    lines = [f"packed {args.model} -> {args.output}/ (integer training blob; activation "
             + (f"ranges calibrated on {info['samples']} samples of {info['samples_key']})"
                if "samples" in info else f"ranges of {info['qat_checkpoint']})")]
    for key in ("blob", "checkpoint", "info", "qdq_model"):
        lines.append(f"  {os.path.basename(info[key]):24s} {os.path.getsize(info[key]):8d} "
                     f"bytes")
    lines.append(f"trained in integers (SGD, lr {info['learning_rate']:g}, momentum "
                 f"{info['momentum']:g}): {', '.join(info['parameters'])}")
    lines.append(f"input '{info['input']}' {info['input_shape']}: {info['input_type']}, "
                 f"scale {info['input_scale']:g}, zero point {info['input_zero_point']} "
                 f"(in the blob and in {os.path.basename(info['info'])})")
    return "\n".join(lines)


def int8_export_loss(args):
    """export's --int8-* options checked, and the loss the integer training blob trains with
    (the QAT pack's: quant/intloss.pack_loss), or None without --int8-train."""
    from .errors import ArtifactError
    for flag, value in (("--int8-max-classes", args.int8_max_classes),
                        ("--int8-keep-classes", args.int8_keep_classes),
                        ("--int8-target-is-input", args.int8_target_is_input or None)):
        if value is not None and not args.int8_train:
            raise ArtifactError(f"{flag} needs --int8-train (it shapes the integer "
                                f"training blob)")
    if args.int8_max_classes is not None and not 2 <= args.int8_max_classes <= 1024:
        raise ArtifactError(f"--int8-max-classes {args.int8_max_classes}: give 2 to 1024")
    if args.int8_keep_classes is not None and args.int8_keep_classes < 0:
        raise ArtifactError(f"--int8-keep-classes {args.int8_keep_classes}: give 0 or more")
    if not args.int8_train:
        return None
    from .quant.intloss import pack_loss
    return pack_loss(os.path.join(args.artifacts, args.prefix + "model.mtb"), args)
