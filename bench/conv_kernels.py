"""Conv kernel benchmark: MAC/s of the forward, input-gradient and weight-gradient kernels
(device/microtrain/kernels/conv.py) on a few representative Conv and ConvTranspose layers,
under CPython and under the MicroPython Unix port, beside the interpreter's plain
multiply-accumulate loop measured in the same process. Prints figures only; asserts nothing.

    python bench/conv_kernels.py [--rounds N] [--micropython PATH]
"""
import argparse
from pathlib import Path

from train_step import device_runtimes, run_results

DEVICE_SCRIPT = Path(__file__).resolve().parent / "conv_device.py"
KERNELS = ("forward", "grad_input", "grad_weight")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3,
                    help="interleaved rounds, best of each kept (default 3)")
    ap.add_argument("--micropython", help="MicroPython binary (default: $MICROTRAIN_MICROPYTHON, "
                                          "then .cache/micropython/micropython)")
    args = ap.parse_args()

    runtimes = device_runtimes(args.micropython, heap="2M")
    print(f"best of {args.rounds} interleaved rounds")

    tables = {"conv": [], "transpose": []}
    for name, command, env in runtimes:
        lines = run_results(command, env, DEVICE_SCRIPT, args.rounds)
        if lines is None:
            continue
        results = {(r["kind"], r["layer"], r["kernel"]): r for r in lines}
        for kind, layer in dict.fromkeys((kind, layer) for kind, layer, _ in results):
            first = results[kind, layer, KERNELS[0]]
            loop = float(first["loop"])
            cells = ["%5.2f (%3.0f%%)" % (float(results[kind, layer, k]["rate"]) / 1e6,
                                         100 * float(results[kind, layer, k]["rate"]) / loop)
                     for k in KERNELS]
            tables[kind].append("%-12s %-34s %7s %11.2f  %-14s %-14s %-14s" % (
                name, layer, first["macs"], loop / 1e6, *cells))
    for kind, title in (("conv", "Conv"), ("transpose", "ConvTranspose")):
        print("\n%-12s %-34s %7s %11s  %-14s %-14s %-14s" % (
            "runtime", title + " layer", "MACs", "loop MMAC/s", "forward", "grad input",
            "grad weight"))
        for row in tables[kind]:
            print(row)
    print("\nMMAC/s of each kernel, in brackets its share of the plain MAC loop's rate.")


if __name__ == "__main__":
    main()
