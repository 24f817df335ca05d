"""`microtrain deploy`: train packed artifacts on a MicroPython board over mpremote.

Copies the model's minimal runtime (as .mpy files, a ROMFS image, or nothing when it is
frozen into the firmware), the blob, the checkpoint, the training data as raw files and
boards/train_on_board.py; runs it (one loss per step); fetches the trained checkpoint back.
For the emulated boards (qemu-mps2-an385, qemu-virt-rv32) it starts qemu itself when no
port is given. mpremote soft-resets the board at its first command, so everything is chained
in one mpremote invocation."""
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
from .train import artifact_files, device_error, load_data, own_labels, write_device_data

TRAIN_SCRIPT = boards.REPO_ROOT / "boards" / "train_on_board.py"


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
        self.resume = None       # the checkpoint a resumed run starts from (--resume)
        self.start_step = 0      # its optimizer step: the steps the previous runs took
        self.native = {}         # {name on the board: shipped .mpy} of the native kernels
        self.native_left_out = None  # the fit with the native kernels deploy left out
        self.line_numbers = False  # the bundles keep their line numbers (--line-numbers)
        self.blob_path = self.artifacts / "model.mtb"   # the blob (plan(): artifact_files)
        self.blob_in_rom = False  # the blob goes into the ROMFS image with the runtime
        self.inputs = "f32"      # training inputs' file type (prepare()): f32, i8 or u8


def plan(artifacts, board_name, steps=None, epochs=None, placement=None, resume=None,
         native=True, line_numbers=False):
    for name, value in (("steps", steps), ("epochs", epochs)):
        # a count below 1 would copy no data and train nothing
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
    blob_path = artifact_files(artifacts, DeployError)[0]
    start_step = check_resume(artifacts, resume) if resume is not None else 0
    native, left_out = (boards.choose_native(artifacts, board, placement, resume) if native
                        else ({}, None))   # --no-native
    with tempfile.TemporaryDirectory() as tmp:   # (frozen: messages in place)
        sources = runtime.minimal_sources(blob_path, messages_apart=placement != "frozen",
                                          native=native, bundled=placement == "files")
        sizes = runtime.compile_runtime(sources, board["mpy_arch"], board["mpy_version"], tmp,
                                        bundle_lines=line_numbers)
        machine = boards.runtime_machine_mpy(tmp, sizes)
    messages, lazy = boards.messages_mpy(sizes), boards.lazy_mpy(sizes)
    fit = boards.predict(artifacts, board, placement, sum(sizes.values()) - messages - lazy,
                         resume=resume, native=native, machine_mpy=machine,
                         messages_mpy=messages, lazy_mpy=lazy)
    in_rom = boards.blob_in_rom(blob_path, placement)
    sizes.update({name: pathlib.Path(path).stat().st_size for name, path in native.items()})
    if steps is None and epochs is None:
        epochs = 1
    p = Plan(board, placement, artifacts, sizes, fit, None, steps, epochs)
    p.native, p.native_left_out, p.line_numbers = native, left_out, line_numbers
    p.blob_path = blob_path
    p.blob_in_rom = in_rom
    if resume is not None:
        p.resume = pathlib.Path(resume)
        p.start_step = start_step
    return p


def check_resume(artifacts, resume):
    """The optimizer step of checkpoint `resume`, checked to be one a run of these
    artifacts can resume from: a readable checkpoint of this model with optimizer state."""
    from microtrain import CheckpointState, Module, Optimizer
    from microtrain.errors import MicrotrainError
    path = pathlib.Path(resume)
    if not path.exists():
        raise DeployError(f"--resume '{resume}' does not exist")
    if not path.is_file():
        raise DeployError(f"--resume '{resume}' is not a file; give a checkpoint")
    blob = str(artifact_files(artifacts, DeployError)[0])
    try:
        state = CheckpointState.load_checkpoint(str(path))
        if not state.has_optimizer_state:
            raise DeployError(f"--resume '{resume}' has no optimizer state: save it with "
                              f"--with-optimizer-state (a resumed run would not continue as "
                              f"the uninterrupted one)")
        Optimizer(blob, Module(blob, state))   # of this model: parameters and moments bind
    except MicrotrainError as e:
        raise DeployError(f"--resume '{resume}': {type(e).__name__}: {e}") from e
    return state.optimizer_step


def prepare(plan, data, workdir):
    """Write the board's files into workdir: runtime, data, script. Fills plan.files."""
    from microtrain import parser as device_blob_parser
    workdir = pathlib.Path(workdir)
    blob_path, checkpoint_path = artifact_files(plan.artifacts, DeployError)
    b = device_blob_parser.load(str(blob_path))
    if "train" not in b.programs:
        raise DeployError("this model computes its loss outside the graph (packed with --loss "
                          "none): deploy trains models with a train program")
    x, y, x_val, y_val = load_data(data, labels=own_labels(b))
    batch = b.shapes[b.programs["train"].inputs[0]][0]
    if plan.resume is not None:
        # The batches an uninterrupted run would take next: it went through the data in
        # order, epoch after epoch (whole batches), and took start_step of them so far.
        batches = len(x) // batch
        if batches == 0:
            raise DeployError(f"{data} holds {len(x)} training samples, less than one batch "
                              f"({batch})")
        if plan.steps is None:
            plan.steps = plan.epochs * batches
        order = [(plan.start_step + i) % batches for i in range(plan.steps)]
        index = [k * batch + j for k in order for j in range(batch)]
        x, y = x[index], y[index]
    count = len(x) if plan.steps is None else plan.steps * batch
    if count > len(x):
        raise DeployError(f"--steps {plan.steps} needs {count} training samples (batch "
                          f"{batch}); {data} has {len(x)}")
    # an integer training blob's int8 / uint8 input: the samples quantized on the host
    # (x_train.i8 / .u8, one byte per value)
    inputs = write_device_data(workdir, b, x[:count], y[:count], x_val, y_val, source=f"'{data}'")
    plan.samples = count
    plan.inputs = inputs
    # (None: the input is its own target, no labels file)
    labels = next((kind for kind in ("i32", "f32") if (workdir / f"y_train.{kind}").exists()),
                  None)
    files = [(blob_path, "model.mtb"), (plan.resume or checkpoint_path, "checkpoint"),
             (workdir / f"x_train.{inputs}", f"x_train.{inputs}")]
    if labels is not None:
        files.append((workdir / f"y_train.{labels}", f"y_train.{labels}"))
    if plan.placement == "frozen":
        # the trimmed sources and a manifest.py to build them into the firmware
        plan.frozen_manifest = plan.artifacts / "frozen_runtime" / "manifest.py"
        # messages kept in place: frozen bytecode stays in flash, and moved ones would only
        # add a global (_m) to every module's dictionary, which is in RAM
        sources = runtime.minimal_sources(blob_path, messages_apart=False)
        runtime.write_sources(sources, plan.frozen_manifest.parent)
        plan.frozen_manifest.write_text(runtime.freeze_manifest(plan.frozen_manifest.parent,
                                                                sorted(sources)))
    else:
        rt = write_runtime(plan, blob_path, workdir / "runtime")
        if plan.blob_in_rom:
            # its int8 weights read where the blob is, in flash (boards.blob_in_rom)
            shutil.copyfile(blob_path, rt / "model.mtb")
            files.remove((blob_path, "model.mtb"))
        if plan.placement == "romfs":
            plan.romfs_image = workdir / "microtrain.romfs"
            plan.romfs_image.write_bytes(runtime.romfs_image(rt))
        else:
            files.insert(0, (rt / "microtrain", "microtrain"))
    plan.files = files
    return labels


def dry_run_notes(plan):
    """What a dry run says besides the files, after prepare(): how an integer training
    blob's samples were quantized, and that its blob goes into the ROMFS image."""
    notes = []
    if plan.inputs != "f32":
        from microtrain import parser as device_blob_parser
        from .train import input_quantization
        scale, zero_point, dtype = input_quantization(
            device_blob_parser.load(str(plan.blob_path)), DeployError)
        notes.append(f"  (inputs quantized on the host for the blob's {dtype.__name__} input: "
                     f"x / {float(scale)!r} rounded half to even + {zero_point}, saturated; "
                     f"x_train.{plan.inputs} holds one byte per value)")
    if plan.blob_in_rom:
        notes.append("  (model.mtb goes into the ROMFS image with the runtime: its int8 "
                     "weights stay in flash)")
    return notes


def write_runtime(plan, blob_path, directory):
    """directory, with the plan's runtime and native kernels compiled into microtrain/."""
    runtime.compile_runtime(runtime.minimal_sources(blob_path, native=plan.native,
                                                    bundled=plan.placement == "files"),
                            plan.board["mpy_arch"], plan.board["mpy_version"], directory,
                            bundle_lines=plan.line_numbers)
    runtime.add_native_modules(plan.native, directory)
    return pathlib.Path(directory)


def training_script(plan, labels, lr, output, with_optimizer_state):
    # with --steps the data files hold exactly that many batches: one pass
    epochs = 1 if plan.steps is not None else plan.epochs
    settings = (f"STEPS = {plan.steps or 0}\nEPOCHS = {epochs}\n"
                f"LR = {lr!r}\nINPUTS = {plan.inputs!r}\nLABELS = {labels!r}\n"
                f"OUTPUT = {output!r}\n"
                f"BLOB = {'/rom/model.mtb' if plan.blob_in_rom else 'model.mtb'!r}\n"
                f"WITH_OPTIMIZER_STATE = {bool(with_optimizer_state)}\n"
                f"RESERVE = {plan.fit.reserve}\n")
    return settings + TRAIN_SCRIPT.read_text()


def mpremote_command(plan, port, script, fetched=None, rom_loaded=False):
    """One mpremote invocation: setup, copies, run, then (fetched: a local path) fetch the
    board's `trained` file there (mpremote resets only once). rom_loaded: the runtime's ROMFS
    image is in the board's ROM partition already (the emulated board, QemuBoard(rom=...)):
    not copied."""
    args = [sys.executable, "-m", "mpremote", "connect", port]
    setup = plan.board.get("setup")
    if setup:
        args += ["exec", setup, "+"]
    for local, remote in plan.files:
        if pathlib.Path(local).is_dir():
            args += ["cp", "-r", str(local), ":", "+"]
        else:
            args += ["cp", str(local), ":" + remote, "+"]
    if plan.placement == "romfs" and not rom_loaded:
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
    args += ["run", str(script)]
    if fetched is not None:
        args += ["+", "cp", ":trained", str(fetched)]
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
            if "qemu" not in plan.board:
                raise DeployError(f"--port is needed for board {plan.board['name']} (e.g. "
                                  f"/dev/ttyACM0); only the emulated boards are started here")
            # the ROMFS image goes into the emulated flash's ROM partition at power-on, as
            # flashing a board would (copying it over the emulated UART takes a minute)
            rom = plan.romfs_image if plan.placement == "romfs" else None
            with QemuBoard(firmware, rom=rom, board=plan.board["name"]) as qemu:
                return _run_mpremote(plan, qemu.port, script, output, report, timeout, qemu)
        return _run_mpremote(plan, port, script, output, report, timeout, None)


def _run_mpremote(plan, port, script, output, report, timeout, qemu):
    result = Result()
    output.parent.mkdir(parents=True, exist_ok=True)
    partial = output.with_name(output.name + ".part")
    command = mpremote_command(plan, port, script, partial,
                               rom_loaded=qemu is not None and qemu.rom is not None)
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
    """qemu running an emulated board's MicroPython firmware, its UART on a pty. board: the
    profile whose "qemu" section names the qemu binary and machine, the firmware (its
    default path, the environment variable that overrides it, the script that builds it)
    and where the emulated flash lies: qemu-mps2-an385 (Cortex-M3) or qemu-virt-rv32.

    flash: a file that keeps the board's flash (the ROM partition and the littlefs of
    boards/qemu/emulated_flash.py, FLASH_SIZE bytes from flash_address) across boots: loaded
    at power-on when it exists, written back at exit and by cut(), which stops the CPU where
    it is, as a power cut does, and saves what the flash holds at that instant.
    rom: a ROMFS image written into the ROM partition at power-on (the rest of the flash
    blank), as flashing it onto a board does.
    icount: run with `-icount shift=0,align=off`: every emulated instruction takes exactly
    1 ns of virtual time, so the board's 25 MHz FPGAIO counter (COUNTER_ADDRESS) counts
    instructions, one tick per 40, the same on every run (bench/board_cost.py).
    serial: a terminal device the board's UART is attached to (the other side of a pty pair
    the caller made with os.openpty()) instead of a pty of qemu's own, which qemu reads only
    once it noticed a client on it (by a poll once a second: up to a second lost, on many
    boots); with flash, wake() then gets the first input read at once."""

    FLASH_SIZE = 0x200000      # emulated_flash's ROM_SIZE + FS_SIZE
    COUNTER_ADDRESS = 0x40028018   # MPS2 FPGAIO COUNTER: 25 MHz of virtual time (the ARM board)
    INSTRUCTIONS_PER_TICK = 40     # with icount shift=0: 1 ns per instruction, 40 ns per tick

    def __init__(self, firmware=None, flash=None, rom=None, board="qemu-mps2-an385",
                 icount=False, serial=None):
        profile = boards.load_board(board)
        if "qemu" not in profile:
            raise DeployError(f"board {board} is not emulated: its profile has no qemu section")
        self.board = board
        self.qemu = profile["qemu"]
        self.flash_address = int(self.qemu["flash_address"], 16)   # emulated_flash.ROM_ADDRESS
        self.firmware = pathlib.Path(firmware or os.environ.get(self.qemu["firmware_env"])
                                     or boards.REPO_ROOT / self.qemu["firmware"])
        self.flash = pathlib.Path(flash) if flash is not None else None
        self.rom = pathlib.Path(rom) if rom is not None else None
        self.icount = icount
        self.serial = serial
        self.proc = None
        self.port = None
        self._log = []
        self._monitor = None       # the HMP monitor's socket path (with flash only)
        self._tmp = None

    def __enter__(self):
        system, build = self.qemu["system"], self.qemu["build"]
        if shutil.which(system) is None:
            raise DeployError(f"{system} not found: run {build} (installs Debian's "
                              f"{self.qemu['package']} and builds the firmware)")
        if not self.firmware.exists():
            raise DeployError(f"no firmware for the emulated board {self.board} at "
                              f"{self.firmware}: run {build}")
        monitor = ["-monitor", "null"]
        if self.rom is not None:
            if self.flash is not None:
                raise DeployError("QemuBoard: give flash or rom, not both")
            if self.rom.stat().st_size > 0x40000:   # emulated_flash.ROM_SIZE
                raise DeployError(f"ROMFS image {self.rom} is larger than the emulated "
                                  f"board's 256 KB ROM partition")
            monitor += ["-device", f"loader,file={self.rom},addr={self.flash_address:#x},"
                                   f"force-raw=on"]
        if self.flash is not None:
            self._tmp = tempfile.mkdtemp(prefix="microtrain-qemu-")
            self._monitor = os.path.join(self._tmp, "monitor")
            monitor = ["-monitor", f"unix:{self._monitor},server,nowait"]
            if self.flash.exists():
                monitor += ["-device", f"loader,file={self.flash},addr={self.flash_address:#x},"
                                       f"force-raw=on"]
        # align=off: the guest is not slowed down to keep virtual time with the host's clock
        counted = ["-icount", "shift=0,align=off"] if self.icount else []
        self.proc = subprocess.Popen(
            [system, "-machine", self.qemu["machine"], "-nographic", *monitor, *counted,
             "-semihosting", "-bios", "none", "-serial", self.serial or "pty",
             "-kernel", str(self.firmware)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True)
        self.port = self.serial
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
            self._stop()
            raise DeployError(f"{system} did not report its serial pty:\n"
                              + "\n".join(self._log))
        return self

    def wake(self):
        """Have qemu watch the board's UART input again, once the board printed its prompt.
        The emulated UART refuses input until the firmware turns its receiver on, and qemu
        then stops watching the input until its main loop next wakes up: up to a second
        later, when nothing else happens. A monitor command wakes it (needs flash)."""
        import socket
        with socket.socket(socket.AF_UNIX) as s:
            s.connect(self._monitor)
            s.settimeout(10)
            s.sendall(b"info status\n")
            got = b""
            while b"VM status" not in got:
                chunk = s.recv(4096)
                if not chunk:
                    break
                got += chunk

    def cut(self):
        """Power cut: stop the CPU now and keep the flash as it is at this instant (the
        board cannot run again; leave the with block)."""
        self._save_flash()

    def _save_flash(self):
        if self._monitor is None or self.proc is None or self.proc.poll() is not None:
            return
        import socket
        part = self.flash.with_name(self.flash.name + ".part")
        if part.exists():
            part.unlink()
        with socket.socket(socket.AF_UNIX) as s:
            s.connect(self._monitor)
            s.settimeout(10)
            s.sendall(f'stop\npmemsave {self.flash_address:#x} {self.FLASH_SIZE:#x} "{part}"\n'
                      f'info status\n'.encode())
            got = b""
            deadline = time.monotonic() + 20
            # "info status" answers after pmemsave has written the file
            while b"VM status: paused" not in got and time.monotonic() < deadline:
                got += s.recv(4096)
        if not part.exists() or part.stat().st_size != self.FLASH_SIZE:
            raise DeployError(f"qemu did not save the emulated flash to {part}")
        os.replace(part, self.flash)
        self._monitor = None

    def log_tail(self):
        return ("\nqemu: " + "\nqemu: ".join(self._log[-5:])) if self._log else ""

    def __exit__(self, *exc):
        try:
            self._save_flash()
        finally:
            self._stop()
        return False

    def _stop(self):
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
