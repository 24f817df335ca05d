"""`microtrain deploy`: train packed artifacts on a MicroPython board over mpremote.

Copies the model's minimal runtime (as .mpy files, a ROMFS image, or nothing when it is
frozen into the firmware), the blob, the checkpoint, the training data as raw files and
boards/train_on_board.py; runs it (one loss per step); fetches the trained checkpoint back.
For the emulated board (qemu-mps2-an385) it starts qemu-system-arm itself when no port is
given. mpremote soft-resets the board at its first command, so everything is chained in one
mpremote invocation."""
import math
import numbers
import os
import pathlib
import re
import select
import shutil
import subprocess
import sys
import tempfile
import time

from ..errors import MicrotrainHostError
from . import boards, runtime
from .train import device_error, load_data, write_device_data

TRAIN_SCRIPT = boards.REPO_ROOT / "boards" / "train_on_board.py"
QEMU_FIRMWARE = boards.REPO_ROOT / ".cache" / "qemu-board" / "firmware.elf"


class DeployError(MicrotrainHostError):
    """A deployment that cannot be prepared, or a board run that failed."""


class Plan:
    """What deploy copies and runs: files (local path, board name), runtime .mpy sizes per
    module, the fit prediction, and the training settings."""

    def __init__(self, board, placement, artifacts, runtime_sizes, fit, samples, steps, epochs):
        self.board = board
        self.placement = placement
        self.artifacts = pathlib.Path(artifacts)
        self.runtime_sizes = runtime_sizes
        self.fit = fit
        self.samples = samples
        self.steps = steps
        self.epochs = epochs
        self.files = []          # (local path, name on the board), filled by prepare()
        self.romfs_image = None  # the runtime as a ROMFS image (placement romfs), by prepare()
        self.frozen_manifest = None  # placement frozen: manifest.py of the trimmed runtime


def plan(artifacts, board_name, steps=None, epochs=None, placement=None):
    for name, value in (("steps", steps), ("epochs", epochs)):
        # a count of 0 would copy no data and train nothing; a negative one, the same
        if value is not None and (isinstance(value, bool)
                                  or not isinstance(value, numbers.Integral) or value < 1):
            raise DeployError(f"{name} must be a positive integer, got {value!r}")
    if steps is not None and epochs is not None:
        raise DeployError("give steps or epochs, not both")
    board = boards.load_board(board_name)
    placement = placement or boards.default_placement(board)
    if placement == "romfs" and not board["romfs"]:
        raise DeployError(f"board {board_name} has no ROMFS partition: use --runtime files or "
                          f"frozen")
    blob_path = pathlib.Path(artifacts) / "model.mtb"
    with tempfile.TemporaryDirectory() as tmp:
        sizes = runtime.compile_runtime(runtime.minimal_sources(blob_path), board["mpy_arch"],
                                        board["mpy_version"], tmp)
    fit = boards.predict(artifacts, board, placement, sum(sizes.values()))
    if steps is None and epochs is None:
        epochs = 1
    return Plan(board, placement, artifacts, sizes, fit, None, steps, epochs)


def prepare(plan, data, workdir):
    """Write the board's files into workdir: runtime, data, script. Fills plan.files."""
    from microtrain import parser as device_blob_parser
    workdir = pathlib.Path(workdir)
    blob_path = plan.artifacts / "model.mtb"
    b = device_blob_parser.load(str(blob_path))
    if "train" not in b.programs:
        raise DeployError("this model computes its loss outside the graph (packed with --loss "
                          "none): deploy trains models with a train program")
    x, y, x_val, y_val = load_data(data)
    batch = b.shapes[b.programs["train"].inputs[0]][0]
    count = len(x) if plan.steps is None else plan.steps * batch
    if count > len(x):
        raise DeployError(f"--steps {plan.steps} needs {count} training samples (batch "
                          f"{batch}); {data} has {len(x)}")
    write_device_data(workdir, b, x[:count], y[:count], x_val, y_val, source=f"'{data}'")
    plan.samples = count
    labels = "i32" if (workdir / "y_train.i32").exists() else "f32"
    files = [(plan.artifacts / "model.mtb", "model.mtb"),
             (plan.artifacts / "checkpoint", "checkpoint"),
             (workdir / "x_train.f32", "x_train.f32"),
             (workdir / f"y_train.{labels}", f"y_train.{labels}")]
    if plan.placement == "frozen":
        # the trimmed sources and a manifest.py to build them into the firmware
        plan.frozen_manifest = plan.artifacts / "frozen_runtime" / "manifest.py"
        sources = runtime.minimal_sources(blob_path)
        runtime.write_sources(sources, plan.frozen_manifest.parent)
        plan.frozen_manifest.write_text(runtime.freeze_manifest(plan.frozen_manifest.parent,
                                                                sorted(sources)))
    else:
        rt = workdir / "runtime"
        runtime.compile_runtime(runtime.minimal_sources(blob_path), plan.board["mpy_arch"],
                                plan.board["mpy_version"], rt)
        if plan.placement == "romfs":
            plan.romfs_image = workdir / "microtrain.romfs"
            plan.romfs_image.write_bytes(runtime.romfs_image(rt))
        else:
            files.insert(0, (rt / "microtrain", "microtrain"))
    plan.files = files
    return labels


def training_script(plan, labels, lr, output, with_optimizer_state):
    # with --steps the data files hold exactly that many batches: one pass
    epochs = 1 if plan.steps is not None else plan.epochs
    settings = (f"STEPS = {plan.steps or 0}\nEPOCHS = {epochs}\n"
                f"LR = {lr!r}\nLABELS = {labels!r}\nOUTPUT = {output!r}\n"
                f"WITH_OPTIMIZER_STATE = {bool(with_optimizer_state)}\n"
                f"RESERVE = {plan.fit.reserve}\n")
    return settings + TRAIN_SCRIPT.read_text()


def mpremote_command(plan, port, script, fetched):
    """One mpremote invocation: setup, copies, run, fetch (mpremote resets only once)."""
    args = [sys.executable, "-m", "mpremote", "connect", port]
    setup = plan.board.get("setup")
    if setup:
        args += ["exec", setup, "+"]
    for local, remote in plan.files:
        if pathlib.Path(local).is_dir():
            args += ["cp", "-r", str(local), ":", "+"]
        else:
            args += ["cp", str(local), ":" + remote, "+"]
    if plan.placement == "romfs":
        install = plan.board.get("romfs_install")
        if install:  # the emulated board: copy the image, its frozen helper installs it
            args += ["cp", str(plan.romfs_image), ":microtrain.romfs", "+",
                     "exec", install.format(image="microtrain.romfs"), "+"]
        else:  # a board whose firmware has the ROM ioctl (MicroPython >= 1.25)
            args += ["romfs", "deploy", str(plan.romfs_image), "+"]
    # a soft reset before the run: the copies leave mpremote's helpers on the heap,
    # fragmenting it; the files stay (the emulated board's setup mounts them again)
    args += ["soft-reset", "+"]
    if setup:
        args += ["exec", setup, "+"]
    args += ["run", str(script), "+", "cp", ":trained", str(fetched)]
    return args


class Result:
    def __init__(self):
        self.losses = []
        self.heap = {}       # phase -> live bytes measured on the board
        self.peak = None
        self.checkpoint = None
        self.log = []


def run(plan, data, port=None, lr=None, output=None, with_optimizer_state=False, report=None,
        firmware=None, timeout=3600):
    """Deploy and train; report(kind, value) gets ("step", (index, loss)), ("heap", (phase,
    bytes)) and ("line", text) as they arrive. Returns a Result; raises DeployError when the
    board run fails, with the board's last exception line (its other lines were reported)."""
    if lr is not None and (isinstance(lr, bool) or not isinstance(lr, numbers.Real)
                           or not math.isfinite(lr) or lr < 0):
        raise DeployError(f"the learning rate must be a finite number >= 0, got {lr!r}")
    output = pathlib.Path(output or plan.artifacts / "board_checkpoint")
    with tempfile.TemporaryDirectory(prefix="microtrain-deploy-") as tmp:
        labels = prepare(plan, data, tmp)
        script = pathlib.Path(tmp) / "train_on_board.py"
        script.write_text(training_script(plan, labels, lr, "trained", with_optimizer_state))
        if port is None:
            if plan.board["name"] != "qemu-mps2-an385":
                raise DeployError(f"--port is needed for board {plan.board['name']} (e.g. "
                                  f"/dev/ttyACM0); only the emulated board is started here")
            with QemuBoard(firmware) as qemu:
                return _run_mpremote(plan, qemu.port, script, output, report, timeout, qemu)
        return _run_mpremote(plan, port, script, output, report, timeout, None)


def _run_mpremote(plan, port, script, output, report, timeout, qemu):
    result = Result()
    output.parent.mkdir(parents=True, exist_ok=True)
    partial = output.with_name(output.name + ".part")
    command = mpremote_command(plan, port, script, partial)
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + timeout
    for line in proc.stdout:
        line = line.rstrip("\n")
        result.log.append(line)
        _parse_line(line, result, report)
        if time.monotonic() > deadline:
            proc.kill()
            raise DeployError(f"board run exceeded {timeout} s")
    status = proc.wait()
    if status != 0 or result.peak is None or not partial.exists():
        # The board's lines were reported as they came (its traceback included); the error
        # is its last word: the exception it ended with, errno numbers in words.
        tail = "\n".join(result.log[-15:])
        if qemu is not None and not tail.strip():
            tail = qemu.log_tail()
        raise DeployError(f"training on {plan.board['name']} failed (mpremote exit {status}): "
                          f"{device_error(tail, status)}")
    os.replace(partial, output)
    result.checkpoint = output
    return result


def _parse_line(line, result, report):
    match = re.fullmatch(r"step (\d+) (\S+)", line)
    if match:
        value = (int(match.group(1)), float(match.group(2)))
        result.losses.append(value[1])
        if report:
            report("step", value)
        return
    match = re.fullmatch(r"heap (\w+) (\d+)", line)
    if match:
        result.heap[match.group(1)] = int(match.group(2))
        if report:
            report("heap", (match.group(1), int(match.group(2))))
        return
    match = re.fullmatch(r"peak (\d+)", line)
    if match:
        result.peak = int(match.group(1))
        return
    if report:
        report("line", line)


class QemuBoard:
    """qemu-system-arm running the emulated MPS2-AN385 firmware, its UART on a pty."""

    def __init__(self, firmware=None):
        self.firmware = pathlib.Path(firmware or os.environ.get("MICROTRAIN_QEMU_FIRMWARE")
                                     or QEMU_FIRMWARE)
        self.proc = None
        self.port = None
        self._log = []

    def __enter__(self):
        if shutil.which("qemu-system-arm") is None:
            raise DeployError("qemu-system-arm not found: run scripts/build_qemu_board.sh "
                              "(installs it and builds the firmware)")
        if not self.firmware.exists():
            raise DeployError(f"no emulated-board firmware at {self.firmware}: run "
                              f"scripts/build_qemu_board.sh")
        self.proc = subprocess.Popen(
            ["qemu-system-arm", "-machine", "mps2-an385", "-nographic", "-monitor", "null",
             "-semihosting", "-bios", "none", "-serial", "pty", "-kernel", str(self.firmware)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            text=True)
        deadline = time.monotonic() + 20
        while self.port is None and time.monotonic() < deadline:
            ready, _, _ = select.select([self.proc.stdout], [], [], 0.5)
            if ready:
                line = self.proc.stdout.readline()
                if not line:
                    break
                self._log.append(line.rstrip())
                match = re.search(r"(/dev/pts/\d+)", line)
                if match:
                    self.port = match.group(1)
        if self.port is None:
            self.__exit__(None, None, None)
            raise DeployError("qemu-system-arm did not report its serial pty:\n"
                              + "\n".join(self._log))
        return self

    def log_tail(self):
        return ("\nqemu: " + "\nqemu: ".join(self._log[-5:])) if self._log else ""

    def __exit__(self, *exc):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return False
