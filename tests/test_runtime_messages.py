"""The minimal runtime's error messages (of raise statements, and of the checkers' fail and
Module._refuse) moved out of its imported modules
(host/microtrain_host/tools/runtime_messages.py): the same words, formatted the same way,
on CPython and on the MicroPython Unix port, for the errors a training run of the digits MLP
can meet (tests/device_scripts/error_messages.py: every 7th byte of the blob and every 5th
of the checkpoint altered, CRC-32 fixed, and the inputs, optimizer and file errors)."""
import subprocess
import sys

import pytest

from conftest import ROOT
from microtrain_host.cli import main
from microtrain_host.tools import runtime
from microtrain_host.tools.runtime_messages import move_messages

SCRIPT = ROOT / "tests" / "device_scripts" / "error_messages.py"


@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    out = tmp_path_factory.mktemp("digits") / "build"
    assert main(["pack", str(ROOT / "examples" / "digits" / "mlp.onnx"), "-o", str(out),
                 "--batch-size", "8", "--optimizer", "adamw"]) == 0
    return out


@pytest.fixture(scope="module")
def runtimes(digits, tmp_path_factory):
    """(the minimal runtime as deploy ships it, the same with its messages in place), with
    the flat-buffer parameter API the script also calls (flatparams.py, which Module imports
    on first use and a training run's runtime leaves out)."""
    base = tmp_path_factory.mktemp("runtimes")
    extra = ("microtrain.flatparams",)
    moved = runtime.write_sources(runtime.minimal_sources(digits / "model.mtb", extra),
                                  base / "moved")
    kept = runtime.write_sources(runtime.minimal_sources(digits / "model.mtb", extra,
                                                         messages_apart=False), base / "kept")
    return moved, kept


def _lines(command, path_variable, path, digits, tmp_path):
    scratch = tmp_path / path.name
    scratch.mkdir()
    proc = subprocess.run(command + [str(SCRIPT), str(digits), str(scratch)],
                          capture_output=True, text=True, env={path_variable: str(path)},
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout.splitlines()


def _check(moved, kept):
    assert moved == kept
    messages = {line.split(": ", 2)[-1] for line in kept if not line.endswith(": ok")}
    assert len(messages) > 150     # the cases reach many of the runtime's messages
    assert not any("could not be loaded" in line for line in moved)


def test_messages_are_the_same_on_cpython(runtimes, digits, tmp_path):
    moved, kept = runtimes
    _check(_lines([sys.executable], "PYTHONPATH", moved, digits, tmp_path),
           _lines([sys.executable], "PYTHONPATH", kept, digits, tmp_path))


def test_messages_are_the_same_on_micropython(runtimes, digits, micropython, tmp_path):
    moved, kept = runtimes
    _check(_lines([micropython], "MICROPYPATH", moved, digits, tmp_path),
           _lines([micropython], "MICROPYPATH", kept, digits, tmp_path))


def test_moved_raise_keeps_its_line_and_its_words():
    source = ("import struct\n"
              "def f(a, b):\n"
              "    if a:\n"
              "        raise ValueError('the value %d is not %r, as it must be'\n"
              "                         % (a, b))  # why\n"
              "    raise KeyError('short')\n"
              "def g(c, n):\n"
              "    c.fail('a count of %d is not allowed' % n)\n")
    out = move_messages({"microtrain/x.py": source})
    lines = out["microtrain/x.py"].split("\n")
    assert len(lines) == len(source.split("\n"))
    assert lines[0] == "import struct; from microtrain.errors import message as _m"
    # what follows the statement on its last line (a comment) stays, on the first
    assert lines[3] == "        raise ValueError(_m('x', 1, (a, b)))  # why" and lines[4] == ""
    assert lines[5] == "    raise KeyError('short')"    # under MIN_LENGTH: left in place
    assert lines[7] == "    c.fail(_m('x', 0, n))"     # a call that always raises
    table = {}
    exec(out["microtrain/_msg_x.py"], table)
    assert table["T"] == ("a count of %d is not allowed", "the value %d is not %r, as it must be")


def test_a_message_without_its_module_still_says_which():
    from microtrain.errors import message
    text = message("no_such_module", 3, (1, "a"))
    assert "no_such_module 3" in text and "(1, 'a')" in text
