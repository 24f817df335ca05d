"""The free heap `microtrain deploy`'s training script needs on the emulated Cortex-M3,
beside the fit check's prediction (docs/design.md, "Not yet": fragmentation).

    python bench/deploy_heap.py ARTIFACTS DATA [--firmware ELF] [--start N] [--step N]

Runs boards/train_on_board.py as `deploy` writes it (2 steps) after a filler bytearray
taken before the script starts, the filler growing by --step bytes until the run fails;
prints, per run, the free heap at the script's start, the phases the board measured and
the error. The heap the run needs lies between the free heap of the last run that trained
and of the first that failed (scanned upward, not bisected: near the limit the outcome
depends on where small objects land). A model that needs more than the stock firmware's
140 KiB is measured on a build with a larger heap: scripts/build_qemu_board.sh's make line
with MICROPY_HEAP_SIZE=196608 (same code; its GC pool is 192,064 B).
"""
import argparse
import pathlib
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "host"), str(ROOT / "device")]

from microtrain_host.tools import deploy  # noqa: E402

# prepended to the training script: its BASE (gc.mem_alloc() at its start) then holds it
FILLER = "import gc\nFILLER = bytearray(%d)\ngc.collect()\nprint('free0', gc.mem_free())\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("artifacts")
    parser.add_argument("data")
    parser.add_argument("--firmware", default=str(ROOT / ".cache/qemu-board/firmware.elf"))
    parser.add_argument("--start", type=int, default=0)
    parser.add_argument("--step", type=int, default=2000)
    args = parser.parse_args()
    plan = deploy.plan(pathlib.Path(args.artifacts), "qemu-mps2-an385", steps=2)
    fit = plan.fit
    print(f"predicted: needed {fit.needed} (script {fit.script}; load {fit.load}, train "
          f"{fit.train}, save {fit.save}) of {fit.heap} usable")
    with tempfile.TemporaryDirectory() as tmp:
        labels = deploy.prepare(plan, args.data, tmp)
        script = pathlib.Path(tmp) / "train.py"
        with deploy.QemuBoard(args.firmware, rom=plan.romfs_image) as qemu:
            filler = args.start
            while True:
                script.write_text(FILLER % filler + deploy.training_script(
                    plan, labels, None, "trained", False))
                out = subprocess.run(deploy.mpremote_command(plan, qemu.port, script,
                                                             rom_loaded=True),
                                     capture_output=True, text=True, timeout=1800).stdout
                lines = out.splitlines()
                free0 = [line.split()[1] for line in lines if line.startswith("free0")]
                phases = [" ".join(line.split()[1:]) for line in lines
                          if line.startswith("heap ") or line.startswith("peak ")]
                errors = [line for line in lines if line.startswith("error:")]
                print(f"filler {filler}: free at start {free0}, {'; '.join(phases)}",
                      *errors, flush=True)
                if errors or not any(line.startswith("peak") for line in lines):
                    break
                filler += args.step


if __name__ == "__main__":
    main()
