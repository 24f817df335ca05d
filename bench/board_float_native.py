"""Counted cost of the native float kernels (device/native/float, a MicroPython dynamic native
module built by `scripts/build_natmod.sh --float`) against the pure-Python ones (bytecode
over array('f')), on the emulated Cortex-M3 under qemu -icount shift=0 (bench/board_cost.py's
counting: FPGAIO ticks x 40 = instructions, deterministic), on the same arguments in the same
run; and the heap the module's import takes (its machine code is loaded into RAM). Prints
figures; asserts nothing (tests/test_board_float_native.py checks the bytes).

    python3 bench/board_float_native.py [--arch armv7m|armv6m] [--firmware ELF]
"""
import argparse
import pathlib
import subprocess
import sys
import tempfile

BENCH = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
from board_cost import PER_TICK, ROOT, run_on_board, whole_package  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--firmware", help="the emulated board's firmware (default: "
                                       "$MICROTRAIN_QEMU_FIRMWARE, then .cache/qemu-board)")
    ap.add_argument("--arch", default="armv7m", choices=("armv7m", "armv6m"),
                    help="the module's build (default armv7m: the M3's own)")
    args = ap.parse_args()
    module = subprocess.run(["bash", str(ROOT / "scripts" / "build_natmod.sh"), "--float",
                             args.arch], check=True, capture_output=True,
                            text=True).stdout.split()[-1]
    with tempfile.TemporaryDirectory(prefix="board-float-native-") as tmp:
        out = run_on_board(tmp, whole_package(),
                           {"microtrain/kernels/float_native.mpy": module},
                           (BENCH / "board_float_native_kernels.py").read_text(),
                           args.firmware)
    size = pathlib.Path(module).stat().st_size
    print(f"native float kernels ({args.arch} module, {size:,d} bytes of .mpy) vs bytecode on "
          f"the emulated Cortex-M3, instructions counted (ticks x {PER_TICK})\n")
    print(f"{'kernel, shape':45s} {'work':>7s} {'bytecode':>11s} {'per unit':>9s} "
          f"{'native':>9s} {'per unit':>8s} {'speed-up':>8s} same")
    for line in out.splitlines():
        if line.startswith("import "):
            heap = int(line.split()[1])     # (a copy of its own: "True")
        elif "|" in line:
            shape, work, p, n, same = line.split("|")
            work, p, n = int(work), int(p) * PER_TICK, int(n) * PER_TICK
            print(f"{shape:45s} {work:7,d} {p:11,d} {p / work:9.1f} {n:9,d} {n / work:8.2f} "
                  f"{p / n:7.1f}x {same}")
    print(f"\nheap taken by importing the module (from the ROM filesystem): {heap:,d} bytes")


if __name__ == "__main__":
    main()
