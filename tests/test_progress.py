"""Progress bars (tools/progress.py): drawn on a terminal only, so what the commands print
line by line (and what tests and scripts parse) stays as it was elsewhere."""
import io
import os
import pty
import select
import subprocess
import sys

import microtrain_host as mh
from conftest import ROOT
from microtrain_host.artifacts import STAGES
from microtrain_host.tools.progress import Bar

MODEL = ROOT / "examples" / "digits" / "mlp.onnx"
DATA = ROOT / "examples" / "digits" / "digits.npz"


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_bar_draws_on_a_terminal_only():
    term = Terminal()
    bar = Bar(term, width=10, interval=0)
    for i in range(1, 5):
        bar.update("round 1/5", i, 4, "devices")
    text = term.getvalue()
    assert text.count("\r") == 4
    last = text.split("\r")[-1]
    assert last.startswith("round 1/5 [##########] 4/4  0:00 elapsed  devices"), last
    assert "round 1/5 [#####.....] 2/4" in text and "left" in text
    bar.clear()
    assert term.getvalue().endswith("\r" + " " * len(last) + "\r")
    pipe = io.StringIO()
    quiet = Bar(pipe, interval=0)
    quiet.update("x", 1, 2)
    quiet.clear()
    assert pipe.getvalue() == "" and not quiet.enabled


def test_bar_redraws_at_most_every_interval():
    term = Terminal()
    bar = Bar(term, interval=3600)
    for i in range(1, 1000):
        bar.update("epoch 1/1", i, 1000)
    bar.update("epoch 1/1", 1000, 1000)   # the last one always shows
    assert term.getvalue().count("\r") == 2


def test_pack_reports_its_stages(tmp_path):
    seen = []
    mh.generate_artifacts(str(MODEL), batch_size=8, artifact_directory=str(tmp_path / "a"),
                          progress=lambda *s: seen.append(s))
    assert seen == [(name, i + 1, len(STAGES)) for i, name in enumerate(STAGES)]
    seen.clear()
    mh.generate_artifacts(str(MODEL), batch_size=8, artifact_directory=str(tmp_path / "b"),
                          frozen_params=["1.weight"], progress=lambda *s: seen.append(s))
    names = [s[0] for s in seen]
    assert names == list(STAGES[:4]) + ["full-training figures"] + list(STAGES[4:])
    assert seen[-1][1:] == (7, 7)


def _run(argv, tty):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "host"), str(ROOT / "device")]))
    cmd = [sys.executable, "-m", "microtrain_host.cli", *map(str, argv)]
    if not tty:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout, proc.stderr
    master, slave = pty.openpty()
    proc = subprocess.Popen(cmd, stdout=slave, stderr=slave, env=env)
    os.close(slave)
    chunks = []
    while True:
        ready, _, _ = select.select([master], [], [], 600)
        if not ready:
            break
        try:
            data = os.read(master, 65536)
        except OSError:   # the pty closes with the process
            break
        if not data:
            break
        chunks.append(data)
    assert proc.wait(timeout=60) == 0
    os.close(master)
    return b"".join(chunks).decode(), None


def test_pack_and_train_show_bars_on_a_terminal_and_plain_lines_elsewhere(tmp_path):
    out, _ = _run(["pack", MODEL, "-o", tmp_path / "build", "--batch-size", "8"], tty=True)
    assert "\rpack [" in out and "] 6/6 " in out and "  write" in out and "packed " in out
    plain, err = _run(["pack", MODEL, "-o", tmp_path / "build2", "--batch-size", "8"], tty=False)
    assert "\r" not in plain + err and plain.startswith("packed ")

    args = ["train", tmp_path / "build", "--data", DATA, "--epochs", "1"]
    out, _ = _run(args, tty=True)
    assert "\repoch 1/1 [" in out and "/179" in out and " loss " in out
    assert "epoch 1/1  train loss " in out
    plain, err = _run(args, tty=False)
    assert "\r" not in plain + err
    lines = plain.splitlines()
    assert lines[0].startswith("training ") and lines[1].startswith("epoch 1/1  train loss ")
    assert lines[2].startswith("trained checkpoint written to")
