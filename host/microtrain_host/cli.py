"""The `microtrain` command: runs the subcommands cli_parser.py defines. The only module that
prints or exits."""
import os
import sys

from .cli_int8 import int8_pack_options, int8_pack_text
from .cli_parser import LOSS_NAMES, OPTIMIZER_NAMES, build_parser
from .errors import MicrotrainHostError

# `pack` flags that are optimizer options of the same name.
OPTIMIZER_FLAGS = ("weight_decay", "momentum", "dampening", "nesterov", "l1_penalty",
                   "l2_penalty", "clip_grad_norm")


def _names(text):
    return [n for n in text.split(",") if n] if text is not None else None


class OutputPathError(MicrotrainHostError):
    """An output path given on the command line where the command cannot write its file."""


def _check_output_file(option, path, create_parent=False):
    """Refuse, before any work, an output file that cannot be written at `path`: an existing
    directory (the atomic save would move it aside to PATH.bak and put the file in its
    place), a parent that is missing (unless the command creates it) or not a directory."""
    if os.path.isdir(path):
        raise OutputPathError(f"{option} '{path}' is a directory; give the path of the file "
                              f"to write")
    parent = os.path.dirname(os.path.abspath(path))
    while create_parent and not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.path.exists(parent):
        raise OutputPathError(f"{option} '{path}': directory '{parent}' does not exist")
    if not os.path.isdir(parent):
        raise OutputPathError(f"{option} '{path}': '{parent}' is not a directory")
    if not os.access(parent, os.W_OK):
        raise OutputPathError(f"{option} '{path}': directory '{parent}' is not writable")


def cmd_pack(args):
    from . import generate_artifacts
    from .tools.inspect import describe
    from .pipeline.upgrade import TARGET_OPSET
    from .tools.progress import Bar
    int8 = int8_pack_options(args)
    if int8 is not None:  # the integer training blob (int8pack.py)
        from .int8pack import pack_int8
        print(int8_pack_text(args, pack_int8(args.model, args.output, **int8)))
        return 0
    bar = Bar()
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
    quantization = None
    if args.qat:
        quantization = {"activation_dtype": args.activation_dtype,
                        "momentum": args.observer_momentum,
                        "layers": _names(args.quantize), "skip": _names(args.keep_float) or []}
    elif args.quantize or args.keep_float:
        from .errors import ArtifactError
        raise ArtifactError("--quantize and --keep-float choose layers for --qat; add --qat")
    result = generate_artifacts(
        args.model, requires_grad=requires_grad, frozen_params=frozen,
        loss=LOSS_NAMES[args.loss], optimizer=OPTIMIZER_NAMES[args.optimizer or "adamw"],
        artifact_directory=args.output, prefix=args.prefix,
        nominal_checkpoint=args.nominal_checkpoint, batch_size=args.batch_size,
        loss_input_names=_names(args.loss_inputs),
        optimizer_options=options or None, quantization=quantization,
        update_in_backward=args.update_in_backward, recompute=args.recompute,
        progress=lambda stage, index, count: bar.update("pack", index, count, stage))
    bar.clear()
    print(f"packed {args.model} -> {args.output}/")
    if result.source_opset is not None:
        print(f"  exported at opset {result.source_opset}, upgraded on load to opset "
              f"{TARGET_OPSET} with onnx.version_converter")
    for path in (result.training_model, result.eval_model, result.optimizer_model,
                 result.checkpoint, result.nominal_checkpoint, result.blob):
        if path:
            print(f"  {os.path.basename(path):24s} {os.path.getsize(path):8d} bytes")
    print(f"trainable: {', '.join(result.trainable)}" if result.trainable else
          "trainable: none (nothing in the model trains: the blob runs its forward pass, and "
          "training changes nothing)")
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
    print(describe(args.blob, steps=not args.no_steps, plan=args.plan, scales=args.scales,
                   checkpoint=args.checkpoint))
    if args.board:
        from .tools import boards
        board = boards.load_board(args.board)
        print()
        artifacts = os.path.dirname(os.path.abspath(args.blob))
        placement = args.runtime or boards.default_placement(board)
        native, left_out = boards.choose_native(artifacts, board, placement)
        print(_fit_text(boards.predict(artifacts, board, placement, native=native), left_out))
        print(_cost_text(args.blob, board, native))
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


def _fit_text(fit, native_left_out=None):   # native_left_out: boards.choose_native's
    from .tools.boards import native_left_out_note
    board = fit.board
    where = {"files": "bytecode in the heap (imported from the filesystem)",
             "romfs": "bytecode in flash (ROMFS image)",
             "frozen": "bytecode in flash (frozen into the firmware)"}[fit.placement]
    verdict = (f"fits, margin {_kb(fit.margin)}" if fit.fits
               else f"does NOT fit: {_kb(-fit.margin)} more than the heap")
    return "\n".join([
        f"fit check on {board['name']} ({board['title']}; heap {_kb(board['heap'])}, "
        f"{board['heap_source']}; {_kb(fit.heap)} of it left to the GC's blocks by its "
        f"tables; {board['word_bytes'] * 8}-bit, {board['float']} floats):",
        f"  runtime          {_kb(fit.runtime_mpy)} of .mpy imported, {where}"
        + (f"; the viper kernels' machine code ({fit.machine_mpy:,} B of it) copied to RAM"
           if fit.machine_mpy else "") + fit.messages_note("; and "),
        f"  imported code    {_kb(fit.code)} of heap"
        + (f", of which {_kb(fit.native_code)} the native kernels' machine code "
           f"({fit.native_mpy:,} B of .mpy, copied to RAM at import)" if fit.native_mpy else ""),
        f"  while training   {_kb(fit.train)} predicted peak of the live heap between "
        f"phases (arenas, blob, checkpoint, batch)",
        f"  while loading    {_kb(fit.load)} (inside Module: blob file or arenas + the "
        f"loaded checkpoint's tables)",
        f"  resuming         {_kb(fit.resume)} from a checkpoint with optimizer state "
        f"(loaded first, then Module, Optimizer); {_kb(fit.resume_load)} inside Module",
        f"  saving           {_kb(fit.save)} (inside save_checkpoint: the checkpoint's "
        f"tables beside the training model)",
        f"  reloading        {_kb(fit.reload)} (Module.load_checkpoint into the training "
        f"model's arenas)",
        f"  largest block    {_kb(fit.arena)} (the largest arena, one contiguous block)",
        f"  needed           {_kb(fit.needed)} (the largest, and {_kb(fit.script)} the "
        f"training script holds): {verdict}"] + native_left_out_note(native_left_out))


def _cost_text(blob, board, native=False):
    """The estimated time of a step of the blob at the board's clock (tools/step_cost.py);
    native: the native modules its runtime carries ({name: .mpy path})."""
    from .tools.step_cost import Estimate
    return Estimate(blob, board, native).text()


def cmd_deploy(args):
    from .tools import deploy
    if args.output:
        _check_output_file("--output", args.output, create_parent=True)
    plan = deploy.plan(args.artifacts, args.board, steps=args.steps, epochs=args.epochs,
                       placement=args.runtime, resume=args.resume, native=not args.no_native,
                       line_numbers=args.line_numbers)
    print(f"deploy {args.artifacts} to {args.board} (mpy-cross -march={plan.board['mpy_arch']}, "
          f".mpy v{plan.board['mpy_version']}), runtime as {plan.placement}")
    print(f"minimal runtime: {len(plan.runtime_sizes)} modules, "
          f"{sum(plan.runtime_sizes.values()):,} B of .mpy" + plan.fit.messages_note(", of which "))
    for name, size in sorted(plan.runtime_sizes.items()):
        native = ("  (native kernels, machine code for "
                  f"{plan.native[name].parent.name})" if name in plan.native else "")
        print(f"  {name:34s} {size:7,d}{native}")
    print(_fit_text(plan.fit, plan.native_left_out))
    print(_cost_text(plan.blob_path, plan.board, plan.native))
    if plan.resume is not None:
        print(f"resuming from {plan.resume}: optimizer step {plan.start_step}, the data from "
              f"its batch {plan.start_step} on")
    data = args.data or _default_data(args.artifacts)
    if args.dry_run:
        import tempfile
        with tempfile.TemporaryDirectory() as tmp:
            deploy.prepare(plan, data, tmp)
            print(f"would copy ({plan.samples} training samples from {data}):")
            for note in deploy.dry_run_notes(plan):   # an integer training blob's
                print(note)
            if plan.romfs_image is not None:
                print(f"  {'microtrain.romfs':34s} {plan.romfs_image.stat().st_size:7,d}  "
                      f"(ROMFS image of the runtime)")
            if plan.frozen_manifest is not None:
                print(f"runtime to freeze into the firmware: make -C ports/PORT BOARD=... "
                      f"FROZEN_MANIFEST={plan.frozen_manifest}")
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

    from .tools.progress import Bar
    bar = Bar()

    def report(kind, value):
        # On a terminal a bar over the steps; elsewhere one line per step, as always.
        if kind == "step" and bar.enabled:
            total = plan.start_step + (plan.steps or plan.epochs * (plan.samples
                                                                     // _batch(plan.blob_path)))
            bar.update("training on the board", value[0], total, f"loss {value[1]:.6f}")
            return
        bar.clear()
        if kind == "step":
            print(f"step {value[0]:4d}  loss {value[1]:.6f}", flush=True)
        elif kind == "heap":
            print(f"  heap after {value[0]:10s} {_kb(value[1])}", flush=True)
        else:
            print(f"  board: {value}", flush=True)

    result = deploy.run(plan, data, port=args.port, lr=args.lr, output=args.output,
                        with_optimizer_state=args.with_optimizer_state, report=report,
                        firmware=args.firmware)
    bar.clear()
    predicted = plan.fit.resume if plan.resume is not None else plan.fit.train
    error = 100.0 * (predicted - result.peak) / result.peak
    print(f"peak heap between phases: predicted {_kb(predicted)}, measured "
          f"{_kb(result.peak)} on the board (prediction {error:+.1f} %)")
    print(f"trained checkpoint fetched to {result.checkpoint} (read it with microtrain "
          f"export {args.artifacts} --checkpoint {result.checkpoint} -o model.onnx)")
    return 0


def _batch(blob_path):
    from microtrain import parser as device_blob_parser
    b = device_blob_parser.load(str(blob_path))
    return b.shapes[b.programs["train"].inputs[0]][0]


def _default_data(artifacts):
    parent = os.path.dirname(os.path.abspath(artifacts))
    found = sorted(f for f in os.listdir(parent) if f.endswith(".npz"))
    if len(found) != 1:
        from .tools.deploy import DeployError
        raise DeployError(f"give the training data with --data (found {len(found)} .npz files "
                          f"beside {artifacts})")
    return os.path.join(parent, found[0])


def cmd_export(args):
    from .export import export_inference_model
    from .errors import ArtifactError
    # what needs --qdq, and where the files go, is known before the export runs
    if args.int8_blob and not args.qdq:
        raise ArtifactError("--int8-blob needs --qdq (it is packed from the QDQ model)")
    if args.int8_train and not args.qdq:
        raise ArtifactError("--int8-train needs --qdq (it is built from the QDQ model)")
    from .cli_int8 import int8_export_loss
    loss = int8_export_loss(args)       # refused before any file is written
    _check_output_file("-o/--output", args.output)
    if args.int8_blob:
        _check_output_file("--int8-blob", args.int8_blob)
    if args.int8_train and os.path.exists(args.int8_train) and not os.path.isdir(args.int8_train):
        raise OutputPathError(f"--int8-train '{args.int8_train}' is a file; give a directory "
                              f"(created when missing)")
    model = export_inference_model(args.artifacts, args.checkpoint, args.output,
                                   output_names=_names(args.outputs), prefix=args.prefix,
                                   qdq=args.qdq, ort_format=args.ort)
    graph = model.graph
    if args.qdq:
        int8 = sum(i.data_type in (2, 3) and len(i.dims) > 1 for i in graph.initializer)
        print(f"QDQ model: {int8} int8 weight tensors, "
              f"{sum(n.op_type == 'QuantizeLinear' for n in graph.node)} quantized "
              f"activations (onnxruntime fuses them into QLinearConv / QGemm / ...)")
    if args.int8_blob:
        from .quant.int8 import pack_inference_model
        pack_inference_model(args.output, args.int8_blob)
        print(f"int8 inference blob {args.int8_blob} ({os.path.getsize(args.int8_blob)} bytes) "
              f"for microtrain.InferenceSession: int8 kernels, integer requantization")
    if args.int8_train:
        from .quant.inttrain import int8_training_artifacts
        info = int8_training_artifacts(args.output, args.int8_train, args.int8_lr,
                                       stochastic=not args.int8_nearest,
                                       train_conv=args.int8_train_conv,
                                       momentum=args.int8_momentum,
                                       train_biases=args.int8_train_biases,
                                       train_depthwise=args.int8_train_depthwise,
                                       max_classes=args.int8_max_classes,
                                       keep_classes=args.int8_keep_classes, loss=loss,
                                       target="input" if args.int8_target_is_input else None)
        others = len(info["parameters"]) - 2
        in_use = ("" if info["classes_in_use"] == info["classes"]
                  else " (%d classes in use)" % info["classes_in_use"])
        print(f"integer training blob {info['blob']} ({os.path.getsize(info['blob'])} bytes), "
              f"checkpoint {info['checkpoint']}, loss {loss}: last Gemm {info['weight']} "
              f"[{info['classes']}, {info['features']}]"
              f"{in_use}"
              f"{f' and {others} more tensors' if others else ''} trained in "
              f"integers ({', '.join(info['parameters'])}); inputs "
              f"quantized with scale {info['input_scale']:g}, zero point "
              f"{info['input_zero_point']} ({info['input_type']}; see {info['info']})")
    print(f"exported {args.output} ({os.path.getsize(args.output)} bytes): inputs "
          f"{', '.join(i.name for i in graph.input)}; outputs "
          f"{', '.join(o.name for o in graph.output)}; {len(graph.node)} nodes")
    if args.ort:
        ort_path = os.path.splitext(args.output)[0] + ".ort"
        print(f"ORT format {ort_path} ({os.path.getsize(ort_path)} bytes, onnxruntime's "
              f"converter); operators for a minimal build: "
              f"{os.path.splitext(args.output)[0]}.required_operators.config")
    return 0


def cmd_aggregate(args):
    from .tools.fedavg import fedavg
    _check_output_file("-o/--output", args.output)
    result = fedavg(args.checkpoints, weights=args.weights, output=args.output)
    values = sum(a.size for a in list(result.trainable.values()) + list(result.frozen.values()))
    weights = (", ".join(f"{w:g}" for w in args.weights) if args.weights
               else "equal weights")
    print(f"averaged {len(args.checkpoints)} checkpoints ({weights}) -> {args.output}: "
          f"{len(result.trainable)} trainable and {len(result.frozen)} frozen parameters, "
          f"{values} values; optimizer state and properties dropped")
    return 0


def cmd_samples(args):
    from .tools.samples import describe, read_store
    import numpy as np
    if args.npz:
        _check_output_file("--npz", args.npz)
    store, x, y, seq = read_store(args.file)
    print(describe(args.file, store))
    if args.npz:
        with open(args.npz, "wb") as f:  # a file object: np.savez adds no .npz suffix
            np.savez(f, x=x, y=y, seq=seq)
        print(f"{len(y)} records -> {args.npz} (x {x.dtype} {list(x.shape)}, y int64, seq)")
    return 0


class EpochProgress:
    """train's report: a bar over each epoch's steps on a terminal (tools/progress.py), and
    one line per epoch everywhere."""

    def __init__(self, epochs):
        from .tools.progress import Bar
        self.epochs = epochs
        self.bar = Bar()

    def __call__(self, kind, values):
        if kind == "step":
            epoch, index, count, loss = values
            self.bar.update(f"epoch {epoch}/{self.epochs}", index, count, f"loss {loss:.4f}")
        elif kind == "epoch":
            epoch, train_loss, val_loss, val_acc = values
            self.bar.clear()
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
    if args.output:
        _check_output_file("--output", args.output)
    if args.plot:
        require_matplotlib()
        _check_output_file("--plot", args.plot)
    print(f"training {args.artifacts} on {args.data} with the device runtime under "
          f"{'MicroPython' if args.runtime == 'micropython' else 'CPython'}", flush=True)
    records = train(args.artifacts, args.data, args.epochs, args.lr, output,
                    runtime=args.runtime, seed=args.seed, report=EpochProgress(args.epochs),
                    micropython=args.micropython, heap=args.heap,
                    max_arena_bytes=args.max_arena_bytes)
    print(f"trained checkpoint written to {output}")
    if args.plot:
        plot_curves(records, args.plot, title=f"{os.path.basename(os.path.normpath(args.artifacts))}"
                    f" ({args.runtime}, lr {args.lr})")
        print(f"loss/accuracy curves written to {args.plot}")
    return 0


def cmd_federate(args):
    from .tools.progress import Bar
    try:
        from .flower import describe_report, federate
        import flwr
    except ImportError as e:
        print(f"microtrain federate: error: {e}", file=sys.stderr)
        return 2
    if args.output:
        _check_output_file("-o/--output", args.output)
    bar = Bar()

    def report(kind, values):
        if kind == "round-progress":
            server_round, done, total = values
            bar.update(f"round {server_round}/{args.rounds}", done, total, "devices")
        else:
            bar.clear()
            print(describe_report(kind, values, args.runtime, args.alpha), flush=True)

    print(f"federating {args.artifacts} on {args.data}: FedAvg (Flower {flwr.__version__}'s "
          f"strategy, simulation engine), {args.rounds} rounds, {args.epochs} local "
          f"epoch(s) per round, lr {args.lr}", flush=True)
    records = federate(args.artifacts, args.data, clients=args.clients, rounds=args.rounds,
                       epochs=args.epochs, lr=args.lr, alpha=args.alpha, fraction=args.fraction,
                       runtime=args.runtime, micropython=args.micropython, heap=args.heap,
                       seed=args.seed, workers=args.workers, updates_dir=args.keep_updates,
                       report=report, verbose=args.verbose)
    rounds = records[1:]
    print(f"{len(rounds)} rounds in {sum(r['seconds'] + r['eval_seconds'] for r in rounds):.1f}"
          f" s; the first includes starting Ray")
    if args.output:
        from .tools.devices import buffer_to_checkpoint
        buffer_to_checkpoint(args.artifacts, records[-1]["parameters"], args.output)
        print(f"global checkpoint written to {args.output}")
    if args.keep_updates:
        k = os.path.join(args.keep_updates, "round1")
        print(f"device updates and global models kept in {args.keep_updates}/roundR/; check "
              f"round 1 with: microtrain aggregate {k}/device* --weights $(cat "
              f"{k}/weights.txt) -o g && cmp g {k}/global")
    return 0


def main(argv=None):
    """Run one subcommand. Bad input of any kind - an argument, a file, a model, data, a
    device run that fails - ends as one line `microtrain COMMAND: error: ...` on stderr and
    exit status 2 (argparse's own errors too: cli_parser.Parser). Other exceptions are bugs
    and keep their traceback."""
    args = build_parser().parse_args(argv)
    commands = {"pack": cmd_pack, "inspect": cmd_inspect, "deploy": cmd_deploy,
                "export": cmd_export, "aggregate": cmd_aggregate, "train": cmd_train,
                "federate": cmd_federate, "samples": cmd_samples}
    try:
        return commands[args.command](args)
    except MicrotrainHostError as e:
        message = str(e)
    except OSError as e:
        # a file given, or the disk, the permissions, the network: not a bug in microtrain
        message = _os_error(e)
    except Exception as e:
        from microtrain.errors import MicrotrainError
        if not isinstance(e, MicrotrainError):
            raise
        message = f"{type(e).__name__}: {e}"
    if sys.stderr.isatty():
        sys.stderr.write("\r\033[K")  # a progress bar may be on the line (tools/progress.py)
    print(f"microtrain {args.command}: error: {_one_line(message)}", file=sys.stderr)
    return 2


def _os_error(e):
    """`No such file or directory: 'x.npz'` - what the OSError says, then the file(s)."""
    text = e.strerror or str(e) or type(e).__name__
    for name in (e.filename, e.filename2):
        if name is not None:
            text += f": '{os.fsdecode(name)}'"
    return text


def _one_line(message):
    """Messages are written to be one line; one that quotes another program's output (a
    board's, a library's) may not be: its lines are joined so that the error stays one
    line that scripts and logs can take whole."""
    return " | ".join(line.strip() for line in str(message).splitlines() if line.strip())


if __name__ == "__main__":
    sys.exit(main())
