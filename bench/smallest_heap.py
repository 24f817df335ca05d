"""Smallest heap on the emulated Cortex-M3 for a fresh start and for a resume (issue 23).

    python bench/smallest_heap.py [--models mlp,lenet] [--step 512]

For the digits MLP (AdamW, batch 8) and the LeNet reference CNN (AdamW, batch 4): packs the
model, trains 3 steps on the host with the device runtime and saves a checkpoint with
optimizer state (what a board saves before a power cut). Then, on the emulated MPS2-AN385
board (qemu, MicroPython 1.25, 140 KB heap; the blob and both checkpoints in its ROM
filesystem), runs the README's device API - `load_checkpoint`, `Module`, `Optimizer`, the
batch arrays, 2 train steps - once from the nominal checkpoint (a fresh start) and once from
the saved one (a resume), each after a filler bytearray that takes part of the heap. The
filler grows in --step bytes until the run fails: the heap it needs is the free heap at the
start minus the last filler that ran. Scanning upward (not bisecting) because the outcome
is not monotonic in the filler near the limit: where small objects land decides whether the
arenas find a hole.

Needs the emulated board (scripts/build_qemu_board.sh, or $MICROTRAIN_QEMU_FIRMWARE) and
mpremote. Prints one line per case and the resume's excess over the fresh start.
"""
import argparse
import os
import pathlib
import subprocess
import sys
import tempfile
from array import array

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "host"), str(ROOT / "device"), str(ROOT / "tests")]

from conftest import emulated_board_plan, lenet_board_artifacts  # noqa: E402
from microtrain import CheckpointState, Module, Optimizer  # noqa: E402
from microtrain_host import generate_artifacts  # noqa: E402
from microtrain_host.tools import deploy  # noqa: E402

# the board side: FILLER, NX, NY and CHECKPOINT are prepended
BOARD_SCRIPT = '''
import gc
gc.collect()
free0 = gc.mem_free()
filler = bytearray(FILLER)
from array import array
from microtrain import CheckpointState, Module, Optimizer
from microtrain.errors import OutOfMemoryError
try:
    state = CheckpointState.load_checkpoint(CHECKPOINT)
    model = Module("model.mtb", state)
    opt = Optimizer("model.mtb", model)
    x = array("f", bytes(4 * NX))
    y = array("i", bytes(4 * NY))
    for i in range(NX):
        x[i] = 0.01 * (i % 13)
    for i in range(NY):
        y[i] = i % 10
    for _ in range(2):
        model(x, y)
        opt.step()
        model.lazy_reset_grad()
    print("RESULT ok", free0)
except (MemoryError, OutOfMemoryError) as e:
    print("RESULT oom", free0, repr(e))
'''


def prepare(name, directory):
    """(artifact directory, (inputs, labels) per batch) with checkpoint (nominal) and
    resume_ckpt (after 3 host steps, with optimizer state)."""
    if name == "mlp":
        art = directory / "build"
        generate_artifacts(str(ROOT / "examples" / "digits" / "mlp.onnx"),
                           loss="CrossEntropyLoss", optimizer="AdamW", batch_size=8,
                           artifact_directory=str(art))
    else:
        art, _ = lenet_board_artifacts(directory, "AdamW", 1)
    state = CheckpointState.load_checkpoint(str(art / "checkpoint"))
    model = Module(str(art / "model.mtb"), state)
    opt = Optimizer(str(art / "model.mtb"), model)
    x_id, y_id = model.blob.programs["train"].inputs
    nx, ny = model.blob.sizes[x_id], model.blob.sizes[y_id]
    x = array("f", [0.01 * (i % 13) for i in range(nx)])
    y = array("i", [i % 10 for i in range(ny)])
    for _ in range(3):
        model(x, y)
        opt.step()
        model.lazy_reset_grad()
    CheckpointState.save_checkpoint(state, str(art / "resume_ckpt"), True)
    return art, (nx, ny)


def sweep(firmware, art, sizes, step, start):
    """{checkpoint name: heap needed} for the fresh start and the resume."""
    tmp = pathlib.Path(tempfile.mkdtemp())
    plan = emulated_board_plan(tmp, tmp, [(art / "model.mtb", "model.mtb"),
                                          (art / "checkpoint", "checkpoint"),
                                          (art / "resume_ckpt", "resume_ckpt")])
    out = {}
    with deploy.QemuBoard(firmware, rom=plan.romfs_image) as qemu:
        def run(checkpoint, filler):
            script = tmp / "run.py"
            script.write_text("FILLER, NX, NY, CHECKPOINT = %d, %d, %d, %r\n"
                              % (filler, sizes[0], sizes[1], checkpoint) + BOARD_SCRIPT)
            cmd = deploy.mpremote_command(plan, qemu.port, script, rom_loaded=True)
            text = subprocess.run(cmd, capture_output=True, text=True, timeout=600).stdout
            lines = [line.split() for line in text.splitlines() if line.startswith("RESULT")]
            if not lines:
                raise SystemExit("the board run printed no result:\n" + text[-2000:])
            return lines[-1][1] == "ok", int(lines[-1][2])

        for checkpoint in ("checkpoint", "resume_ckpt"):
            fits, free0 = run(checkpoint, start)
            if not fits:
                raise SystemExit("%s: fails even with a %d-byte filler; lower --start"
                                 % (checkpoint, start))
            filler = start
            while fits:
                filler += step
                fits, _ = run(checkpoint, filler)
            out[checkpoint] = free0 - (filler - step)
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="mlp,lenet", help="mlp, lenet or both")
    parser.add_argument("--step", type=int, default=512, help="filler step in bytes")
    parser.add_argument("--firmware", default=os.environ.get(
        "MICROTRAIN_QEMU_FIRMWARE", str(ROOT / ".cache" / "qemu-board" / "firmware.elf")))
    args = parser.parse_args()
    if not pathlib.Path(args.firmware).exists():
        raise SystemExit("no emulated board firmware at %s: run scripts/build_qemu_board.sh"
                         % args.firmware)
    labels = {"mlp": "digits MLP, AdamW, batch 8", "lenet": "LeNet CNN, AdamW, batch 4"}
    starts = {"mlp": 20000, "lenet": 0}      # fillers every version so far runs with
    print("smallest heap on the emulated Cortex-M3 (bytes; filler step %d)" % args.step)
    for name in args.models.split(","):
        with tempfile.TemporaryDirectory() as directory:
            art, sizes = prepare(name, pathlib.Path(directory))
            needed = sweep(args.firmware, art, sizes, args.step, starts[name])
        fresh, resume = needed["checkpoint"], needed["resume_ckpt"]
        print("%-28s fresh start %7d   resume with optimizer state %7d   resume - fresh %+6d"
              % (labels[name], fresh, resume, resume - fresh))


if __name__ == "__main__":
    main()
