"""Train-step benchmark of the device runtime on the bundled digits MLP (64-32-10).

Packs examples/digits/mlp.onnx (CrossEntropyLoss, AdamW) with batch 8 and batch 1, prints
blob, checkpoint and arena sizes, then runs bench/device_step.py under CPython and under the
MicroPython Unix port and prints a table: time per train step (forward + backward + AdamW),
effective MAC/s of that step, the interpreter's plain MAC-loop rate measured in the same
process, their ratio, and time per eval call. Prints figures only; asserts nothing.

    python bench/train_step.py [--steps N] [--micropython PATH]
"""
import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEVICE = ROOT / "device"
MODEL = ROOT / "examples" / "digits" / "mlp.onnx"
DEVICE_SCRIPT = Path(__file__).resolve().parent / "device_step.py"
BATCHES = (8, 1)

sys.path.insert(0, str(DEVICE))
from microtrain import parser as blobfile_parser
from microtrain_host import generate_artifacts  # noqa: E402


def find_micropython(explicit):
    # An explicit --micropython is taken as is (so a wrong path reports "not found" instead of
    # silently benchmarking another binary); otherwise $MICROTRAIN_MICROPYTHON, then the cache.
    candidates = [explicit] if explicit else [os.environ.get("MICROTRAIN_MICROPYTHON"),
                                              str(ROOT / ".cache" / "micropython" / "micropython")]
    for candidate in candidates:
        if candidate and os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None


def device_runtimes(explicit, heap=None):
    """[(name, command, env)] to run a device-side script: CPython, and the MicroPython Unix
    port when found (said when it is not). Used by every benchmark here."""
    runtimes = [("cpython", [sys.executable], {"PYTHONPATH": str(DEVICE)})]
    mp = find_micropython(explicit)
    if mp:
        runtimes.append(("micropython", [mp] + (["-X", f"heapsize={heap}"] if heap else []),
                         {"MICROPYPATH": str(DEVICE)}))
    else:
        print("MicroPython not found (pass --micropython, set MICROTRAIN_MICROPYTHON or run "
              "scripts/build_micropython.sh): CPython figures only")
    print(f"python {sys.version.split()[0]}; micropython: {mp or 'not found'}")
    return runtimes


def run_results(command, env, script, *args):
    """Run a device-side script; echo its human lines, return the fields of its
    "RESULT key=value ..." lines (None when it failed)."""
    proc = subprocess.run(command + [str(script)] + [str(a) for a in args],
                          env=dict(os.environ, **env), capture_output=True, text=True)
    if proc.returncode != 0:
        print(f"  failed ({' '.join(command)}, exit {proc.returncode}):\n{proc.stderr.strip()}")
        return None
    results = []
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            results.append(dict(kv.split("=", 1) for kv in line.split()[1:]))
        else:
            print("  " + line)
    return results


def pack(directory, batch):
    generate_artifacts(str(MODEL), loss="CrossEntropyLoss", optimizer="AdamW",
                       artifact_directory=directory, batch_size=batch)
    b = blobfile_parser.load(os.path.join(directory, "model.mtb"))
    return {"blob": os.path.getsize(os.path.join(directory, "model.mtb")),
            "checkpoint": os.path.getsize(os.path.join(directory, "checkpoint")),
            "arena": b.float_arena * 4 + b.int_arena * 4,
            "float_arena": b.float_arena, "int_arena": b.int_arena}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=50,
                    help="timed calls per round (5 rounds; default 50)")
    ap.add_argument("--micropython", help="MicroPython binary (default: $MICROTRAIN_MICROPYTHON, "
                                          "then .cache/micropython/micropython)")
    args = ap.parse_args()

    runtimes = device_runtimes(args.micropython)
    print(f"best of 5 interleaved rounds of {args.steps} calls each")

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for batch in BATCHES:
            directory = os.path.join(tmp, f"b{batch}")
            sizes = pack(directory, batch)
            print(f"\nbatch={batch}: blob {sizes['blob']} B, checkpoint {sizes['checkpoint']} B, "
                  f"arena {sizes['arena']} B ({sizes['float_arena']} floats + "
                  f"{sizes['int_arena']} ints)")
            for name, command, env in runtimes:
                results = run_results(command, env, DEVICE_SCRIPT, directory, args.steps, batch)
                if results:
                    rows.append((name, batch, results[0]))

    print("\n%-12s %5s %6s %8s %8s %11s %11s %6s %8s %8s" % (
        "runtime", "batch", "MACs", "step ms", "AdamW ms", "step MMAC/s", "loop MMAC/s",
        "ratio", "eval ms", "heap B"))
    for name, batch, r in rows:
        train_us, eval_us = float(r["train_us"]), float(r["eval_us"])
        macs, loop = int(r["macs"]), float(r["loop_macs"])
        rate = macs / (train_us / 1e6)
        heap = r["heap_after"] if int(r["heap_after"]) >= 0 else "-"
        print("%-12s %5d %6d %8.2f %8.2f %11.2f %11.2f %5.0f%% %8.2f %8s" % (
            name, batch, macs, train_us / 1000, float(r["opt_us"]) / 1000, rate / 1e6,
            loop / 1e6, 100 * rate / loop, eval_us / 1000, heap))


if __name__ == "__main__":
    main()
