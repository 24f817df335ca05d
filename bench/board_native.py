"""Counted cost of the native int8 Gemm and Conv (device/native, a MicroPython dynamic native module
built for armv6m by scripts/build_natmod.sh) against the viper ones, on the emulated
Cortex-M3 under qemu -icount shift=0 (bench/board_cost.py's counting: FPGAIO ticks x 40 =
instructions, deterministic), on the same arguments in the same run; and the heap the
module's import takes (its machine code is loaded into RAM). Prints figures; asserts
nothing (tests/test_board_natmod.py checks the bytes).

    python3 bench/board_native.py [--arch armv6m|armv7m] [--firmware ELF]
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
    ap.add_argument("--arch", default="armv6m", choices=("armv6m", "armv7m"),
                    help="the module's build (default armv6m: every ARM core)")
    args = ap.parse_args()
    module = subprocess.run(["bash", str(ROOT / "scripts" / "build_natmod.sh"), args.arch],
                            check=True, capture_output=True, text=True).stdout.split()[-1]
    with tempfile.TemporaryDirectory(prefix="board-native-") as tmp:
        out = run_on_board(tmp, whole_package(),
                           {"microtrain/kernels/qlinear_native.mpy": module},
                           (BENCH / "board_native_kernels.py").read_text(), args.firmware)
    size = pathlib.Path(module).stat().st_size
    print(f"native int8 Gemm and Conv ({args.arch} module, {size:,d} bytes "
          f"of .mpy) vs viper on the emulated Cortex-M3, instructions counted "
          f"(ticks x {PER_TICK})\n")
    print(f"{'kernel, shape':33s} {'MACs':>7s} {'viper':>10s} {'per MAC':>8s} {'native':>9s} "
          f"{'per MAC':>8s} {'speed-up':>8s} same")
    for line in out.splitlines():
        if line.startswith("import "):
            heap = int(line.split()[1])
        elif line.startswith("fast "):
            picked = line
        elif line.startswith(("gemm ", "conv ")):
            shape, macs, v, n, same = line.split("|")
            macs, v, n = int(macs), int(v) * PER_TICK, int(n) * PER_TICK
            print(f"{shape:33s} {macs:7,d} {v:10,d} {v / macs:8.2f} {n:9,d} {n / macs:8.2f} "
                  f"{v / n:7.1f}x {same}")
    print(f"\nheap taken by importing the module (from the ROM filesystem): {heap:,d} bytes")
    print(f"qlinear.FAST, and the Gemm picked is the native one: {picked[5:]}")


if __name__ == "__main__":
    main()
