"""Recurrent kernel benchmark: MAC/s of the GRU and LSTM forward and backward-through-time
kernels (device/microtrain/kernels/recurrent.py) on a few representative layers, under
CPython and under the MicroPython Unix port, beside the interpreter's plain
multiply-accumulate loop measured in the same process. Prints figures only; asserts nothing.

    python bench/recurrent_kernels.py [--rounds N] [--micropython PATH]
"""
import argparse
from pathlib import Path

from train_step import device_runtimes, run_results

DEVICE_SCRIPT = Path(__file__).resolve().parent / "recurrent_device.py"
KERNELS = ("forward", "backward")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3,
                    help="interleaved rounds, best of each kept (default 3)")
    ap.add_argument("--micropython", help="MicroPython binary (default: $MICROTRAIN_MICROPYTHON, "
                                          "then .cache/micropython/micropython)")
    args = ap.parse_args()

    runtimes = device_runtimes(args.micropython, heap="2M")
    print(f"best of {args.rounds} interleaved rounds")

    print("\n%-12s %-22s %8s %11s  %-14s %-14s" % (
        "runtime", "layer", "fwd MACs", "loop MMAC/s", "forward", "backward"))
    for name, command, env in runtimes:
        lines = run_results(command, env, DEVICE_SCRIPT, args.rounds)
        if lines is None:
            continue
        results = {(r["layer"], r["kernel"]): r for r in lines}
        for layer in dict.fromkeys(layer for layer, _ in results):
            first = results[layer, KERNELS[0]]
            loop = float(first["loop"])
            cells = ["%5.2f (%3.0f%%)" % (float(results[layer, k]["rate"]) / 1e6,
                                         100 * float(results[layer, k]["rate"]) / loop)
                     for k in KERNELS]
            print("%-12s %-22s %8s %11.2f  %-14s %-14s" % (
                name, layer, first["macs"], loop / 1e6, *cells))
    print("\nMMAC/s of each kernel, in brackets its share of the plain MAC loop's rate. The "
          "backward pass does twice the forward's MACs (dH_prev and dR, dW and dX).")


if __name__ == "__main__":
    main()
