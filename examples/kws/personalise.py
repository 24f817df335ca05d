"""Personalise the pretrained keyword-spotting DS-CNN (ds_cnn_kws.onnx, MLPerf Tiny size) to
12 new keywords of a new speaker on the device runtime, at batch 1, and report what each
training configuration costs in memory.

  1. Data: the personalisation set of make_data.py (regenerated, identical every run): a few
     recordings per new keyword to train on, 25 per keyword held out.
  2. Memory: the model packed at batch 1 for each configuration, as the table printed:
       float full      every parameter trained
       float last      the classifier only
       float sparse    the biases of every layer + the classifier (MIT's sparse update)
     each plain and with the memory moves (updates in the backward pass, so no gradient
     buffers; cheap activations recomputed where that shrinks the arena); and
       int8 last       the int8 backbone (quantize.py: calibrated through the QAT path on
                       the pretraining set), the classifier trained in integers (int8
                       weights, int32 bias; QAS SGD fused into the backward step, integer
                       softmax cross-entropy: no gradient buffer, no optimizer state; the
                       inputs quantized on the host, as a board's front end would)
       int8 last block the classifier and the last 1x1 conv, in integers
       int8 sparse     MIT's sparse update in integers: the bias of every convolution, the
                       last block (depthwise 3x3 and pointwise 1x1 weights) and the
                       classifier (kernels/intgrad.py: the gradient flows back through the
                       frozen int8 convolutions in integers, each bias stepped in place)
       float sparse block  its float counterpart: the same parameters, plain SGD, the int8
                       configurations' epochs and learning rate (int against float)
  3. Personalisation: the chosen configuration packed with a fresh classifier (zeros: the
     old keywords' head means nothing for the new ones, so the model starts at chance),
     trained on the recordings with the device runtime (examples/kws/personalise_device.py)
     under CPython or the MicroPython Unix port, the held-out accuracy measured before and
     after. On MicroPython, --frozen uses the Unix port with the runtime frozen in
     (scripts/build_micropython_frozen.sh), as a board holds it in flash; --flash freezes
     the blob in too (kws_blob.py, a bytes constant), so its int8 weights are read in place
     as from a board's flash; --trim freezes only the model's minimal runtime (what
     `microtrain deploy` puts on a board); --m32 builds that port for 32 bits, with a
     microcontroller's object sizes. The run reports the largest live heap it saw, and --measure-heap first
     bisects the smallest -X heapsize in which one train step and one evaluation run
     (scripts/measure_heap.py; the data are streamed, so more samples need no more heap).

The last lines printed are the accuracy before and after and the peak heap in bytes."""
import argparse
import os
import pathlib
import re
import subprocess
import sys

import numpy as np
import onnx
from onnx import numpy_helper

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path[:0] = [str(HERE), str(ROOT / "host"), str(ROOT / "device"), str(ROOT / "scripts")]

import make_data  # noqa: E402
from microtrain_host import generate_artifacts  # noqa: E402
from microtrain_host.pipeline.sparse import sparse_update  # noqa: E402
from microtrain_host.tools.choices import measure  # noqa: E402

MODEL = HERE / "ds_cnn_kws.onnx"
DEVICE_SCRIPT = HERE / "personalise_device.py"
MOVES = {"update_in_backward": True, "recompute": True}
# name: (what it trains, requires_grad of the model) -- one line per configuration
CONFIGS = {
    "float full": ("every parameter", lambda model: None),
    "float last": ("the classifier", lambda model: sparse_update(model, False, 1)),
    "float sparse": ("every bias + the classifier", lambda model: sparse_update(model, True, 1)),
    "int8 last": ("the classifier, in integers", None),
    "int8 last block": ("last 1x1 conv + classifier, ints", None),
    "int8 sparse": ("biases + last block + classifier, ints", None),
    "float sparse block": ("biases + last block + classifier",
                           lambda model: sparse_update(model, True, 3)),
}
# packed from the int8 backbone (int8_pack), trained with SGD (QAS): what each trains
INT8 = {"int8 last": {}, "int8 last block": {"train_conv": True},
        "int8 sparse": {"train_biases": True, "train_conv": True, "train_depthwise": True}}
# float counterparts of an int8 configuration: the same parameters, plain SGD, the int8
# epochs and learning rate (the comparison of integer against float training)
FLOAT_SGD = {"float sparse block": "int8 sparse"}
OPTIMIZER = "AdamW"
INT8_LR = 0.01
INT8_EPOCHS = 6


def fresh_head(model):
    """A copy of the model whose classifier (the last layer) is all zeros."""
    model = onnx.ModelProto.FromString(model.SerializeToString())
    head = sparse_update(model, False, 1)
    for init in model.graph.initializer:
        if init.name in head:
            init.CopyFrom(numpy_helper.from_array(
                np.zeros_like(numpy_helper.to_array(init)), init.name))
    return model


def int8_pack(directory, lr, calibration_steps=20, **trained):
    """An int8 configuration in directory: model.mtb (kernels/inttrain.py's integer
    training blob of the calibrated int8 backbone), checkpoint (the classifier at zero, int8
    weight and int32 bias; the other trained tensors (`trained`: int8_training_artifacts'
    train_conv, train_biases, train_depthwise) as pretrained) and the info of
    quant/inttrain.py (input scale and zero point)."""
    import quantize
    from microtrain_host.formats.checkpoint import write_checkpoint
    from microtrain_host.quant.inttrain import int8_training_artifacts, int8_training_model
    qdq, _ = quantize.calibrate(directory / "backbone", steps=calibration_steps)
    info = int8_training_artifacts(qdq, directory, lr, **trained)
    blob = pathlib.Path(info["blob"]).read_bytes()
    (directory / "model.mtb").write_bytes(blob)
    # the same blob as a module for --flash (frozen, its bytes stay in the binary)
    (directory / "kws_blob.py").write_text(
        "# The KWS blob (model.mtb) as a bytes constant: frozen into the interpreter, it stays\n"
        "# in the binary as a blob in a board's flash (personalise_device.py ... flash).\n"
        "BLOB = %r\n" % blob)
    params = int8_training_model(qdq, True, **trained)[4]
    for name in (info["weight"], info["bias"]):
        params[name] = np.zeros_like(params[name])
    write_checkpoint(directory / "checkpoint", params, {}, keep_integers=True)
    return info


def int8_memory(directory, config):
    """An int8 configuration's arenas (its blob in directory), as a line of the table."""
    from microtrain import blob as device_blob
    from microtrain import parser as device_blob_parser
    b = device_blob_parser.load(str(directory / "model.mtb"))
    weights = sum(b.sizes[t] for t in range(len(b.names)) if b.dtypes[t] >= device_blob.INT8
                  and b.roles[t] in (2, 6) and t not in b.in_place)  # param, constant
    in_place = sum(b.sizes[t] for t in b.in_place)
    total = 4 * (b.float_arena + b.int_arena) + b.byte_arena
    return (f"  {config:14s} {CONFIGS[config][0]:28s} {'fused':5s} "
            f"arenas {total / 1024:.1f} KiB: int8 {b.byte_arena / 1024:.1f} (weights "
            f"{weights / 1024:.1f}, activations {(b.byte_arena - weights) / 1024:.1f}), int32 "
            f"{4 * b.int_arena / 1024:.1f}, float {4 * b.float_arena / 1024:.1f}; no gradient "
            f"buffer, no optimizer state; the frozen layers' {in_place / 1024:.1f} KiB of int8 "
            f"weights in no arena (read where the blob is: in place from flash, or one buffer "
            f"of them when it is a file)")


def pack(model, config, directory, moves=True, lr=0.003):
    if config in INT8:
        return int8_pack(directory, lr, **INT8[config])
    requires_grad = CONFIGS[config][1](model)
    return generate_artifacts(model, requires_grad=requires_grad, loss="CrossEntropyLoss",
                              optimizer="SGD" if config in FLOAT_SGD else OPTIMIZER,
                              artifact_directory=directory, batch_size=1,
                              optimizer_options={"learning_rate": lr},
                              **(MOVES if moves else {}))


def memory_table(model, build):
    """Arenas and peak of live temporaries per configuration, plain and with the moves."""
    lines = [f"memory at batch 1, {OPTIMIZER}, KiB (moves: updates in the backward pass, ReLU "
             f"masks and recomputed activations; int: labels and ReLU masks):",
             f"  {'configuration':14s} {'trains':28s} {'moves':5s} {'float':>7s} {'int':>5s} "
             f"{'peak tmp':>9s} {'grads':>6s} {'opt st':>6s}"]
    kib = lambda e: f"{e * 4 / 1024:.1f}"  # noqa: E731
    for config, (what, _) in CONFIGS.items():
        if config in INT8:
            continue
        for moves in (False, True):
            art = pack(model, config, build / "memory" / f"{config}-{moves}".replace(" ", "_"),
                       moves)
            _, arena, grads, state, peak, _, ints = measure(art.blob)
            lines.append(f"  {config if not moves else '':14s} {what if not moves else '':28s} "
                         f"{'yes' if moves else 'no':5s} {kib(arena):>7s} {kib(ints):>5s} "
                         f"{kib(peak):>9s} {kib(grads):>6s} {kib(state):>6s}")
    return "\n".join(lines)


def write_data(directory, shots, held_out, limit=None, info=None):
    """The personalisation set as raw files in directory (the first `limit` samples of each
    part when given); returns the sample counts. With info (an int8 configuration's): the
    inputs quantized as the blob's input wants them (x_*.q8, one byte per value)."""
    data = make_data.personalisation_set(shots=shots, held_out=held_out)
    directory.mkdir(parents=True, exist_ok=True)
    counts = []
    for part, x, y in (("train", data["x_train"], data["y_train"]),
                       ("test", data["x_val"], data["y_val"])):
        if info:
            from microtrain_host.quant.inttrain import quantize_input
            (directory / f"x_{part}.q8").write_bytes(quantize_input(x[:limit], info).tobytes())
        else:
            (directory / f"x_{part}.f32").write_bytes(x[:limit].astype("<f4").tobytes())
        (directory / f"y_{part}.i32").write_bytes(y[:limit].astype("<i4").tobytes())
        counts.append(len(y[:limit]))
    return counts


def build_options(directory, flash, m32, trim, extra=()):
    """build_micropython_frozen.sh's options for --flash, --m32 and --trim (which writes the
    model's minimal runtime into directory/runtime; extra: more device modules the run
    imports, e.g. microtrain.continual)."""
    options = (["--m32"] if m32 else []) + (["--module", str(directory / "kws_blob.py")]
                                            if flash else [])
    if trim:
        import shutil
        from microtrain import parser
        from microtrain_host.tools import runtime
        if parser.load(str(directory / "model.mtb")).integer_parameters:
            extra = tuple(extra) + ("microtrain.latent",)   # personalise_device's cache
        shutil.rmtree(directory / "runtime", ignore_errors=True)
        # frozen: the messages stay in place (in flash; moved, each module's dictionary in
        # RAM would hold one more global, which the 64 KB run has no room for)
        runtime.write_sources(runtime.minimal_sources(directory / "model.mtb", extra,
                                                      messages_apart=False),
                              directory / "runtime")
        options += ["--device", str(directory / "runtime")]
    return options


def run_device(directory, epochs, lr, runtime, frozen, heap, options=(), script=DEVICE_SCRIPT,
               mode=None):
    """The device script's output (mode: continual_device.py's second argument)."""
    args = ([str(directory)] + ([mode] if mode else []) + [str(epochs), repr(lr)]
            + (["flash"] if "--module" in options else []))
    if runtime == "cpython":
        proc = subprocess.run([sys.executable, str(script), *args], capture_output=True,
                              text=True, env=dict(os.environ, PYTHONPATH=str(ROOT / "device")))
        if proc.returncode:
            sys.exit(proc.stderr)
        return proc.stdout
    import measure_heap as heap_tool
    code, out = heap_tool.run(heap_tool.interpreter(frozen, options), heap_tool.size(heap),
                              script, args, frozen, 7200)
    if code:
        sys.exit(out)
    return out


def heap_for_one_step(directory, frozen, high, options=()):
    """The smallest -X heapsize in which one train step and one evaluation run: the blob
    and checkpoint of `directory`, one sample of each part."""
    import shutil
    import measure_heap as heap_tool
    probe = directory / "heap_probe"
    probe.mkdir(exist_ok=True)
    for name in ("model.mtb", "checkpoint"):
        shutil.copy(directory / name, probe / name)
    for part in ("train", "test"):
        for suffix, size in (("f32", 4 * 490), ("q8", 490)):
            if (directory / f"x_{part}.{suffix}").exists():
                (probe / f"x_{part}.{suffix}").write_bytes(
                    (directory / f"x_{part}.{suffix}").read_bytes()[:size])
        (probe / f"y_{part}.i32").write_bytes((directory / f"y_{part}.i32").read_bytes()[:4])
    flash = ["flash"] if "--module" in options else []
    needed, out = heap_tool.needed_heap(DEVICE_SCRIPT, [str(probe), "1", "0.001"] + flash,
                                        frozen=frozen, high=heap_tool.size(high),
                                        options=options)
    if needed is None:
        sys.exit(f"one step does not run even with a {high} heap:\n{out}")
    return needed


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", choices=sorted(CONFIGS), default="float sparse")
    parser.add_argument("--no-moves", action="store_true",
                        help="personalise without the memory moves")
    parser.add_argument("--shots", type=int, default=10, help="recordings per keyword (10)")
    parser.add_argument("--held-out", type=int, default=25,
                        help="held-out utterances per keyword (25; shots + held-out <= 50)")
    parser.add_argument("--epochs", type=int, default=None,
                        help="epochs (3; int8 and their float SGD counterparts: %d)" % INT8_EPOCHS)
    parser.add_argument("--lr", type=float, default=None,
                        help="learning rate (AdamW 0.003; int8 and their float SGD "
                             "counterparts: SGD %r)" % INT8_LR)
    parser.add_argument("--runtime", choices=("cpython", "micropython"), default="cpython")
    parser.add_argument("--frozen", action="store_true",
                        help="MicroPython with the runtime frozen into the interpreter")
    parser.add_argument("--flash", action="store_true",
                        help="int8, with --frozen: the blob frozen in too, its int8 weights "
                             "read in place as from a board's flash")
    parser.add_argument("--m32", action="store_true",
                        help="with --frozen: the 32-bit build of the port (a board's object "
                             "sizes; needs gcc-multilib, installed when missing)")
    parser.add_argument("--trim", action="store_true",
                        help="with --frozen: freeze the model's minimal runtime (only the "
                             "modules and kernels it uses, as `microtrain deploy` builds for a "
                             "board) instead of the whole device package")
    parser.add_argument("--heap", default=None,
                        help="MicroPython heap (1M; with --measure-heap: the heap measured)")
    parser.add_argument("--measure-heap", action="store_true",
                        help="MicroPython: first bisect the smallest heap one step needs")
    parser.add_argument("--build", default=str(HERE / "build"))
    parser.add_argument("--skip-table", action="store_true", help="no memory table")
    args = parser.parse_args()
    build = pathlib.Path(args.build)
    int8 = args.config in INT8
    if args.lr is None:
        args.lr = INT8_LR if int8 or args.config in FLOAT_SGD else 0.003
    if args.epochs is None:
        args.epochs = INT8_EPOCHS if int8 or args.config in FLOAT_SGD else 3
    model = fresh_head(onnx.load(MODEL))
    directory = build / args.config.replace(" ", "_")
    info = pack(model, args.config, directory, not args.no_moves, args.lr)
    if not args.skip_table:
        print(memory_table(model, build), flush=True)
        if int8:
            print(int8_memory(directory, args.config), flush=True)
    shots, held_out = write_data(directory, args.shots, args.held_out,
                                 info=info if int8 else None)
    needed = None
    if (args.flash or args.m32 or args.trim) and not (args.frozen
                                                      and args.runtime == "micropython"):
        parser.error("--flash, --m32 and --trim need --runtime micropython --frozen")
    if args.flash and not int8:
        parser.error("--flash is for the int8 configurations (float weights are trained)")
    options = build_options(directory, args.flash, args.m32, args.trim)
    port = ", ".join(["runtime frozen in"] * args.frozen + ["trimmed to the model"] * args.trim
                     + ["blob in flash"] * args.flash + ["32-bit build"] * args.m32)
    if args.runtime == "micropython" and args.measure_heap:
        needed = heap_for_one_step(directory, args.frozen, args.heap or "1M", options)
        print(f"one train step and one evaluation need a heap of {needed} bytes "
              f"(bisected -X heapsize{', ' + port if port else ''})", flush=True)
        if args.heap is None:
            args.heap = str(needed)     # the whole run in that heap
    print(f"personalising '{args.config}' ({CONFIGS[args.config][0]}"
          f"{', with the memory moves' if not args.no_moves and not int8 else ''}) on {shots} "
          f"recordings of 12 new keywords, {args.epochs} epochs, "
          f"{'SGD (QAS, integer)' if int8 else 'SGD' if args.config in FLOAT_SGD else OPTIMIZER}"
          f" lr {args.lr}, under "
          f"{args.runtime}{' (' + port + ')' if port else ''}; {held_out} held out",
          flush=True)
    out = run_device(directory, args.epochs, args.lr, args.runtime, args.frozen,
                     args.heap or "1M", options)
    for line in out.splitlines():
        if line.startswith("epoch"):
            print("  " + line)
    before = [int(v) for v in re.search(r"accuracy before (\d+)/(\d+)", out).groups()]
    after = [int(v) for v in re.search(r"accuracy after (\d+)/(\d+)", out).groups()]
    peak = int(re.search(r"peak heap (-?\d+)", out).group(1))
    print(f"accuracy on the new keywords before: {100 * before[0] / before[1]:.1f} % "
          f"(chance {100 / 12:.1f} %)")
    print(f"accuracy on the new keywords after:  {100 * after[0] / after[1]:.1f} %")
    if peak >= 0:
        print(f"peak heap: {peak} bytes (largest live heap after a collection, over the run, "
              f"in -X heapsize={args.heap or '1M'}"
              + (f"; one step needs a {needed}-byte -X heapsize)" if needed else ")"))
    else:
        print("peak heap: - (CPython; --runtime micropython measures it)")


if __name__ == "__main__":
    main()
