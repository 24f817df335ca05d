"""Conv kernel benchmark: MAC/s of the forward, input-gradient and weight-gradient kernels
(device/microtrain/kernels/conv.py) on a few representative layers, under CPython and under
the MicroPython Unix port, beside the interpreter's plain multiply-accumulate loop measured
in the same process. Prints figures only; asserts nothing.

    python bench/conv_kernels.py [--rounds N] [--micropython PATH]
"""
import argparse
import os
import subprocess
import sys
from pathlib import Path

from train_step import DEVICE, find_micropython

DEVICE_SCRIPT = Path(__file__).resolve().parent / "conv_device.py"
KERNELS = ("forward", "grad_input", "grad_weight")


def run_device(command, env, rounds):
    """Run conv_device.py; returns {(layer, kernel): RESULT fields}, or None on failure."""
    proc = subprocess.run(command + [str(DEVICE_SCRIPT), str(rounds)],
                          env=dict(os.environ, **env), capture_output=True, text=True)
    if proc.returncode != 0:
        print(f"  failed ({' '.join(command)}, exit {proc.returncode}):\n{proc.stderr.strip()}")
        return None
    results = {}
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            fields = dict(kv.split("=", 1) for kv in line.split()[1:])
            results[fields["layer"], fields["kernel"]] = fields
    return results


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3,
                    help="interleaved rounds, best of each kept (default 3)")
    ap.add_argument("--micropython", help="MicroPython binary (default: $MICROTRAIN_MICROPYTHON, "
                                          "then .cache/micropython/micropython)")
    args = ap.parse_args()

    runtimes = [("cpython", [sys.executable], {"PYTHONPATH": str(DEVICE)})]
    mp = find_micropython(args.micropython)
    if mp:
        runtimes.append(("micropython", [mp, "-X", "heapsize=2M"], {"MICROPYPATH": str(DEVICE)}))
    print(f"python {sys.version.split()[0]}; micropython: {mp or 'not found'}; "
          f"best of {args.rounds} interleaved rounds")
    if not mp:
        print("MicroPython not found (pass --micropython, set MICROTRAIN_MICROPYTHON or run "
              "scripts/build_micropython.sh): CPython figures only")

    print("\n%-12s %-28s %7s %11s  %-14s %-14s %-14s" % (
        "runtime", "layer", "MACs", "loop MMAC/s", "forward", "grad input", "grad weight"))
    for name, command, env in runtimes:
        results = run_device(command, env, args.rounds)
        if results is None:
            continue
        for layer in dict.fromkeys(layer for layer, _ in results):
            first = results[layer, KERNELS[0]]
            loop = float(first["loop"])
            cells = ["%5.2f (%3.0f%%)" % (float(results[layer, k]["rate"]) / 1e6,
                                         100 * float(results[layer, k]["rate"]) / loop)
                     for k in KERNELS]
            print("%-12s %-28s %7s %11.2f  %-14s %-14s %-14s" % (
                name, layer, first["macs"], loop / 1e6, *cells))
    print("\nMMAC/s of each kernel, in brackets its share of the plain MAC loop's rate.")


if __name__ == "__main__":
    main()
