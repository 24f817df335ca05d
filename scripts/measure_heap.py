"""The heap a MicroPython run needs: the smallest `-X heapsize` in which a script still runs to
the end, found by bisection (the Unix port's heap is one fixed block, as on a board).

    python scripts/measure_heap.py [--frozen [--m32] [--module FILE.py]] [--low 16K] [--high 8M]
                                   SCRIPT [ARGS...]

With --frozen it uses the Unix port with the device package frozen in
(scripts/build_micropython_frozen.sh; built and cached on first use) and runs the script
from a directory of its own, so that `import microtrain` can only come from the binary;
otherwise the plain Unix port (MICROTRAIN_MICROPYTHON or .cache/micropython/micropython) with
MICROPYPATH on device/, whose bytecode then takes heap too. Prints the needed heap in bytes
(to --resolution) and the last lines of the run at that size. A run that still fails at
--high is reported with its error."""
import argparse
import os
import pathlib
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[1]


def size(text):
    text = text.strip().upper()
    scale = {"K": 1024, "M": 1024 * 1024}.get(text[-1:], 1)
    return int(float(text.rstrip("KM")) * scale)


def interpreter(frozen, options=()):
    """The Unix port's binary; frozen: with the device package frozen in, built with
    build_micropython_frozen.sh's options (--m32, --module FILE.py)."""
    if frozen:
        out = subprocess.run(["bash", str(ROOT / "scripts" / "build_micropython_frozen.sh"),
                              *options], capture_output=True, text=True)
        if out.returncode:
            sys.exit(out.stderr)
        return out.stdout.strip().splitlines()[-1]
    for candidate in (os.environ.get("MICROTRAIN_MICROPYTHON"),
                      str(ROOT / ".cache" / "micropython" / "micropython")):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    sys.exit("no MicroPython Unix port: run scripts/build_micropython.sh")


def run(binary, heap, script, args, frozen, timeout):
    """(exit code, stdout + stderr) of one run with `heap` bytes."""
    env = dict(os.environ)
    env.pop("MICROPYPATH", None)
    if not frozen:
        env["MICROPYPATH"] = str(ROOT / "device")
    args = [str(pathlib.Path(a).resolve()) if os.path.exists(a) else a for a in args]
    with tempfile.TemporaryDirectory() as cwd:    # no microtrain/ beside the script
        proc = subprocess.run([binary, "-X", f"heapsize={heap}", str(script), *args],
                              capture_output=True, text=True, env=env, timeout=timeout,
                              cwd=cwd if frozen else None)
    return proc.returncode, proc.stdout + proc.stderr


def needed_heap(script, args=(), frozen=True, low=16 * 1024, high=8 * 1024 * 1024,
                resolution=1024, timeout=3600, options=()):
    """(smallest heap in bytes that runs script to the end, its output); (None, output at
    high) when even high is not enough. options: the frozen build's (interpreter)."""
    binary = interpreter(frozen, options)
    script = pathlib.Path(script).resolve()
    code, out = run(binary, high, script, args, frozen, timeout)
    if code:
        return None, out
    best, best_out = high, out
    while high - low > resolution:
        middle = (low + high) // 2 // resolution * resolution
        code, out = run(binary, middle, script, args, frozen, timeout)
        if code:
            low = middle
        else:
            high, best, best_out = middle, middle, out
    return best, best_out


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--frozen", action="store_true",
                        help="the Unix port with the device package frozen in")
    parser.add_argument("--m32", action="store_true",
                        help="with --frozen: the 32-bit build (object sizes as on a board)")
    parser.add_argument("--module", action="append", default=[],
                        help="with --frozen: also freeze this module (e.g. a blob as bytes)")
    parser.add_argument("--low", default="16K", help="heap known to be too small (16K)")
    parser.add_argument("--high", default="8M", help="largest heap to try (8M)")
    parser.add_argument("--resolution", default="1K", help="bisect down to this (1K)")
    parser.add_argument("script")
    parser.add_argument("args", nargs=argparse.REMAINDER)
    a = parser.parse_args()
    options = (["--m32"] if a.m32 else []) + [x for m in a.module for x in ("--module", m)]
    heap, out = needed_heap(a.script, a.args, a.frozen, size(a.low), size(a.high),
                            size(a.resolution), options=options)
    tail = "\n".join(out.strip().splitlines()[-5:])
    if heap is None:
        sys.exit(f"{a.script} fails even with a {a.high} heap:\n{tail}")
    print(tail)
    print(f"needs a heap of {heap} bytes ({heap / 1024:.0f} KiB; bisected to {a.resolution}, "
          f"{'runtime frozen into the interpreter' if a.frozen else 'runtime bytecode in the heap'})")


if __name__ == "__main__":
    main()
