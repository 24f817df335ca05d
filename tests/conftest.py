import os
import pathlib
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
DEVICE = ROOT / "device"
if str(DEVICE) not in sys.path:
    sys.path.insert(0, str(DEVICE))
if str(ROOT / "host") not in sys.path:
    sys.path.insert(0, str(ROOT / "host"))


def micropython_binary():
    """Path of the MicroPython Unix port: $MICROTRAIN_MICROPYTHON, the cached build, or PATH."""
    for candidate in (os.environ.get("MICROTRAIN_MICROPYTHON"),
                      str(ROOT / ".cache" / "micropython" / "micropython"),
                      shutil.which("micropython")):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


@pytest.fixture(scope="session")
def micropython():
    """The MicroPython binary. Missing: skip locally, fail when MICROTRAIN_REQUIRE_MICROPYTHON=1
    (CI sets it: a skipped MicroPython suite in CI is a failure)."""
    binary = micropython_binary()
    if binary is None:
        message = "MicroPython Unix port not found: run scripts/build_micropython.sh"
        if os.environ.get("MICROTRAIN_REQUIRE_MICROPYTHON") == "1":
            pytest.fail(message)
        pytest.skip(message)
    return binary


def run_micropython(binary, script, *args, heap="16M", timeout=600):
    """Run a script under MicroPython with the device package on its path; returns stdout."""
    env = dict(os.environ, MICROPYPATH=f"{DEVICE}:{ROOT / 'tests' / 'device_scripts'}")
    proc = subprocess.run([binary, "-X", f"heapsize={heap}", str(script), *map(str, args)],
                          capture_output=True, text=True, env=env, timeout=timeout)
    if proc.returncode != 0:
        raise AssertionError(f"MicroPython failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc.stdout
