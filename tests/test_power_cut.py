"""Issue 25 scope 3, power-safe resumable training: microtrain.continual.Learner's run cut
off at random moments on the emulated Cortex-M3 (qemu stops the CPU and keeps the flash as
it is at that instant: deploy.QemuBoard.cut), resumed on the next boot, ends with the same
checkpoint, byte for byte, as a run never cut.

The run: the digits MLP's int8 classifier packed with room for 10 classes, none in use
(SGD with momentum 0.5 and stochastic rounding: optimizer state and a generator that a
resume must carry on), 4 stages adding 3, 3, 2, 2 classes, 6 samples a class captured into
the sample store and all replayed every stage, 2 epochs, batch 1, a checkpoint every 5
steps: 324 steps, 71 saves. The board's side is device_scripts/continual_power_cut.py; it
lies compiled in the board's ROM partition with the runtime, the blob and the samples, so a
boot costs a qemu start and two lines on the raw REPL.

* the uninterrupted run on the board: its checkpoint equals CPython's byte for byte;
* random cuts: chains of boots on one flash file each, every boot resuming the run and cut
  after a random time drawn from a seeded generator (so where each cut lands, training step,
  save, littlefs commit, is random; qemu runs in real time, so the same seed does not give
  the same instants twice; the delays are uniform up to 2/CUTS_PER_RUN of the uninterrupted
  run's training time, so about a dozen cuts fall on each run, over all its stages), until
  at least CUTS cuts. The timer runs only while a stage trains (from the board's "train S"
  line to its "stage S" line, the board waiting for the host's byte there): a cut during a
  capture loses the sample in flight (the store's documented behaviour) and the run would
  no longer be the uninterrupted one's. After every
  cut the next boot must load the run (unreadable: counted, must be 0) with no fewer
  completed stages and no less saved progress than the last ones the board reported (lost:
  counted, must be 0); every chain's final checkpoint must equal the uninterrupted one;
* every I/O event of one save (the one that completes stage 1): cut after its 1st, 2nd, ...,
  last write call, after the file's close and after the rename, one boot each on one flash
  file: every next boot loads the checkpoint before that save (the one after it, once
  renamed), redoes the steps and reaches the save again; the last boot ends with the
  uninterrupted checkpoint;
* a cut half-way through a capture: the next boot reads the store (the torn record dropped,
  the sample counted), resumes, and ends as CPython does after the same cut.

test_cuts_simulated_in_cpython does the same without the board, in one process: PowerCut
raised at every write of that save and at random steps and writes, fresh Learners after
each. Skipped without the firmware of scripts/build_qemu_board.sh; failed when
MICROTRAIN_REQUIRE_QEMU=1."""
import collections
import os
import select
import subprocess
import sys
import time
import tty

import numpy as np
import pytest

from conftest import DEVICE, ROOT, emulated_board_plan

import microtrain_host as mh
from microtrain_host.quant.inttrain import int8_training_artifacts, quantize_input
from microtrain_host.tools import boards, deploy, runtime
from microtrain_host.tools.train import train

SCRIPTS = ROOT / "tests" / "device_scripts"
if str(SCRIPTS) not in sys.path:
    sys.path.insert(0, str(SCRIPTS))
import continual_power_cut as board_side  # noqa: E402  (the board's side, run here too)

DIGITS = ROOT / "examples" / "digits"
EVERY, EPOCHS, LR = 5, 2, 0.05
CUTS = 200                  # random cuts on the board, at least
CUTS_PER_RUN = 12           # on average per chain: the random delays are up to 2/12 of
                            # the uninterrupted run's training time
STUCK = 60                  # seconds without a line from the board: it hangs
END = "\x04"                # a "line" starting with it: the program ended, then its error
CUT_SAVE = (2, 0)           # the save every I/O event of which is cut: the one completing
BEFORE_CUT_SAVE = (1, 70)   # stage 1 (72 steps), and the save before it


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    """The blob, the packed checkpoint and samples.bin (6 samples a class, stage after
    stage, each 64 uint8 inputs and an int32 label) in one directory."""
    tmp = tmp_path_factory.mktemp("power_cut")
    data = np.load(DIGITS / "digits.npz")
    # the backbone only has to give the classifier features: one epoch on 300 samples
    np.savez(tmp / "few.npz", x_train=data["x_train"][:300], y_train=data["y_train"][:300],
             x_val=data["x_val"][:50], y_val=data["y_val"][:50])
    mh.generate_artifacts(str(DIGITS / "mlp.onnx"), artifact_directory=tmp, batch_size=1,
                          quantization=True)
    train(tmp, tmp / "few.npz", 1, 0.01, tmp / "trained")
    mh.export_inference_model(tmp, tmp / "trained", tmp / "qdq.onnx", qdq=True)
    out = tmp / "run_files"
    info = int8_training_artifacts(tmp / "qdq.onnx", out, LR, max_classes=10,
                                   keep_classes=0, momentum=0.5)
    assert info["stochastic"] and info["input_shape"] == [1, 64]
    x, y = data["x_train"], data["y_train"]
    records = []
    for first, added in board_side.PLAN:
        picks = sorted(i for c in range(first, first + added)
                       for i in np.flatnonzero(y == c)[:board_side.SHOTS])
        records += [quantize_input(x[i], info).tobytes() + np.int32(y[i]).tobytes()
                    for i in picks]
    assert len(records[0]) == board_side.RECORD
    (out / "samples.bin").write_bytes(b"".join(records))
    return out


def cpython_run(artifacts, directory, cut=None):
    """The board's side under CPython in `directory` (its own process: a cut ends it);
    returns its output lines."""
    directory.mkdir(exist_ok=True)
    code = (f"import continual_power_cut as c\n"
            f"c.run({str(artifacts) + '/'!r}, {EVERY}, {EPOCHS}, {LR}, cut={cut!r})")
    proc = subprocess.run([sys.executable, "-c", code], cwd=directory, capture_output=True,
                          text=True, env=dict(os.environ, PYTHONPATH=f"{DEVICE}:{SCRIPTS}"))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return proc.stdout.splitlines()


# -- the board -------------------------------------------------------------------------

def rom_image(artifacts, tmp_path):
    """The ROMFS image of the board's ROM partition: the device package and the board's
    side compiled by mpy-cross, the blob, the packed checkpoint, the samples."""
    board = boards.load_board("qemu-mps2-an385")
    compiled = tmp_path / "board_side"
    runtime.compile_runtime({"continual_power_cut.py": (SCRIPTS / "continual_power_cut.py")
                             .read_text()}, board["mpy_arch"], board["mpy_version"], compiled)
    files = [(artifacts / name, name) for name in ("int8_train.mtb", "int8_train.ckpt",
                                                   "samples.bin")]
    plan = emulated_board_plan(tmp_path, artifacts, [], files + [
        (compiled / "continual_power_cut.mpy", "continual_power_cut.mpy")])
    return plan.romfs_image.read_bytes()


class Board:
    """One power-on of the emulated board whose flash is kept in the file `flash`, driven
    over its raw REPL (mpremote would cost about a second a boot: its own process, a soft
    reset)."""

    def __init__(self, firmware, flash):
        # the UART on a pty pair of ours: see QemuBoard's serial
        self.master, self.slave = os.openpty()
        tty.setraw(self.slave)
        self.qemu = deploy.QemuBoard(firmware, flash=flash, serial=os.ttyname(self.slave))
        self.fd = self.master
        self.pending = b""

    def __enter__(self):
        try:
            self.qemu.__enter__()
            self._until(b">>> ")        # the firmware's prompt: its UART receives
            self.qemu.wake()
            os.write(self.fd, b"\r\x01")   # raw REPL
            self._until(b"raw REPL; CTRL-B to exit\r\n>")
        except BaseException:
            self.__exit__(*sys.exc_info())
            raise
        return self

    def __exit__(self, *exc):
        try:
            return self.qemu.__exit__(*exc)
        finally:
            os.close(self.master)
            os.close(self.slave)

    def run(self, code):
        """Start `code` (a program, compiled on the board); its output comes by line()."""
        os.write(self.fd, code.encode() + b"\x04")
        self._until(b"OK")

    def send(self, data):
        os.write(self.fd, data)

    def cut(self):
        self.qemu.cut()

    def line(self, timeout=None):
        """The next line the board printed, or None when `timeout` seconds passed first.
        When the program ended: END + what it printed as its error (empty when none)."""
        deadline = time.monotonic() + (STUCK if timeout is None else timeout)
        while True:
            end, newline = self.pending.find(b"\x04"), self.pending.find(b"\n")
            if end == 0:
                error = self.pending.find(b"\x04>", 1)
                if error > 0:
                    text, self.pending = self.pending[1:error], self.pending[error + 2:]
                    return END + text.decode(errors="replace")
            elif end > 0 and (newline < 0 or end < newline):
                text, self.pending = self.pending[:end], self.pending[end:]
                return text.decode(errors="replace").rstrip("\r")
            elif newline >= 0:
                text, self.pending = self.pending[:newline], self.pending[newline + 1:]
                return text.decode(errors="replace").rstrip("\r")
            if not self._more(deadline):
                if timeout is None:
                    raise AssertionError("the board printed nothing for %d s; last bytes %r%s"
                                         % (STUCK, self.pending[-300:], self.qemu.log_tail()))
                return None

    def _until(self, marker):
        deadline = time.monotonic() + STUCK
        while marker not in self.pending:
            if not self._more(deadline):
                raise AssertionError("the board did not answer %r: %r%s"
                                     % (marker, self.pending[-300:], self.qemu.log_tail()))
        self.pending = self.pending[self.pending.index(marker) + len(marker):]

    def _more(self, deadline):
        ready, _, _ = select.select([self.fd], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            return False
        self.pending += os.read(self.fd, 4096)
        return True


def run_code(handshake, cut=None):
    return ("import emulated_flash\nemulated_flash.mount()\n"
            "import continual_power_cut as c\n"
            f"c.run('/rom/', {EVERY}, {EPOCHS}, {LR}, handshake={handshake}, cut={cut!r})\n")


class Boot:
    """What one boot printed (lines), whether it was cut, the seconds its training ran
    (armed: the stages' training, between "train S" and "stage S"), the run's final
    checkpoint when it ended."""

    def __init__(self):
        self.lines, self.cut, self.armed, self.checkpoint, self.error = [], False, 0.0, None, None

    def value(self, tag):
        # the numbers of the first line tagged `tag`, or None
        for line in self.lines:
            if line.split(" ", 1)[0] == tag:
                return tuple(int(v) for v in line.split()[1:])
        return None

    def last_progress(self):
        # the last (stages done, steps) a save of this boot reported, else the resumed one
        found = self.value("resumed")
        for line in self.lines:
            if line.startswith("saved "):
                found = tuple(int(v) for v in line.split()[1:])
        return found


def boot(firmware, flash, cut_after=None, cut=None):
    """Power the board on, run the board's side; cut_after: seconds of stage training after
    which the host cuts the power (None: never); cut: the board's own stop (run()'s cut)."""
    out = Boot()
    with Board(firmware, flash) as board:
        board.run(run_code(cut_after is not None, cut))
        armed_since = None
        while True:
            timeout = None
            if armed_since is not None:
                timeout = max(0.0, cut_after - out.armed - (time.monotonic() - armed_since))
            line = board.line(timeout)
            if line is None:            # the random moment came
                board.cut()
                out.cut = True
                out.armed = cut_after
                return out
            if line.startswith(END):
                out.error = line[1:].strip() or None
                break
            out.lines.append(line)
            if line == "cut":           # the board stopped itself
                board.cut()
                out.cut = True
                return out
            if line.startswith("train ") and cut_after is not None:
                armed_since = time.monotonic()
            elif line.startswith("stage ") and cut_after is not None:
                if armed_since is not None:
                    out.armed += time.monotonic() - armed_since
                    armed_since = None
                board.send(b"g")        # the board goes on to the next stage's captures
        if out.error is None:
            board.run("import binascii\nprint(binascii.hexlify(open('run/checkpoint', "
                      "'rb').read()).decode())\n")
            out.checkpoint = bytes.fromhex(board.line())
            assert board.line() == END, "reading the checkpoint failed"
    return out


@pytest.fixture(scope="module")
def board_run(artifacts, firmware, tmp_path_factory):
    """(ROMFS image, the uninterrupted run on the board: its Boot, with the host's
    handshake so that its training time counts as the random cuts' timer does)."""
    tmp = tmp_path_factory.mktemp("power_cut_board")
    image = rom_image(artifacts, tmp)
    flash = tmp / "flash.bin"
    flash.write_bytes(image)
    whole = boot(firmware, flash, cut_after=1e9)
    assert whole.error is None and whole.lines[-1].startswith("done"), whole.lines[-20:]
    return image, whole


def test_uninterrupted_run_on_the_board_equals_cpython(artifacts, board_run, tmp_path):
    _, whole = board_run
    cpython = cpython_run(artifacts, tmp_path / "cpython")
    assert (tmp_path / "cpython" / "run" / "checkpoint").read_bytes() == whole.checkpoint
    saves = [line for line in whole.lines if line.startswith("saved")]
    assert saves == [line for line in cpython if line.startswith("saved")]
    print(f"\nuninterrupted: {len(saves)} saves, {whole.value('done')} (records kept, "
          f"samples seen), training {whole.armed:.2f} s on the board; checkpoint "
          f"{len(whole.checkpoint)} B equal to CPython's")


def leaves_temporary_file(boot):
    # the run's directory listed at the boot's start holds a save's temporary file
    return boot is not None and any(line.startswith("files") and "checkpoint.tmp" in line
                                    for line in boot.lines)


def test_random_power_cuts_on_the_board(board_run, firmware, tmp_path):
    image, whole = board_run
    rng = np.random.default_rng(25)
    longest = 2 * whole.armed / CUTS_PER_RUN
    counts = collections.Counter()
    landed = collections.Counter()       # cuts per stage being trained
    started = time.monotonic()
    chain = 0
    while counts["cuts"] < CUTS:
        chain += 1
        flash = tmp_path / f"flash{chain}.bin"
        flash.write_bytes(image)
        completed, saved = 0, (0, 0)     # what the board reported done before the cut
        previous = None
        while True:
            delay = rng.uniform(0, longest) if counts["cuts"] < CUTS else 1e9
            this = boot(firmware, flash, cut_after=delay)
            counts["boots"] += 1
            resumed = this.value("resumed")
            if resumed is None:
                counts["unreadable"] += 1
                pytest.fail(f"chain {chain}: the run did not load: {this.error}")
            counts["lost stages"] += resumed[0] < completed
            counts["lost saves"] += resumed < saved
            assert resumed[0] >= completed and resumed >= saved, (chain, resumed, saved)
            # a save's temporary file left by the cut (not one the boot cut found already
            # and did not get to remove by a save of its own: counted low, never twice)
            counts["cut inside a save"] += leaves_temporary_file(this) and (
                not leaves_temporary_file(previous)
                or any(line.startswith("saved") for line in previous.lines))
            assert this.error is None, this.error
            if not this.cut:
                assert this.checkpoint == whole.checkpoint, f"chain {chain}"
                break
            counts["cuts"] += 1
            landed[[line for line in this.lines if line.startswith("train")][-1].split()[1]] += 1
            completed = max([completed] + [int(line.split()[1]) + 1 for line in this.lines
                                           if line.startswith("stage ")])
            saved = max(saved, this.last_progress())
            previous = this
    seconds = time.monotonic() - started
    print(f"\nrandom cuts: {counts['cuts']} cuts in {chain} chains, {counts['boots']} boots, "
          f"{counts['unreadable']} unreadable checkpoints, {counts['lost stages']} lost "
          f"completed stages, {counts['lost saves']} lost saves; {counts['cut inside a save']} "
          f"cuts left a save's temporary file; cuts per stage trained "
          f"{dict(sorted(landed.items()))}; every chain ended with the uninterrupted "
          f"checkpoint; {seconds:.0f} s")
    assert counts["unreadable"] == counts["lost stages"] == counts["lost saves"] == 0


def test_every_io_event_of_one_save_on_the_board(board_run, firmware, tmp_path):
    image, whole = board_run
    flash = tmp_path / "flash.bin"
    flash.write_bytes(image)
    started = time.monotonic()
    writes = None             # the save's write calls: the board prints them at its close
    event, left = 0, []
    while writes is None or event < writes + 2:
        event += 1
        this = boot(firmware, flash, cut=("save",) + CUT_SAVE + (event,))
        assert this.error is None and this.cut, (event, this.error, this.lines[-5:])
        if event > 1:
            # the save cut at the event before: its checkpoint counts once renamed, not sooner
            assert this.value("resumed") == BEFORE_CUT_SAVE, (event, this.lines[:3])
            left.append(next(line for line in this.lines if line.startswith("files")))
        assert this.last_progress() == BEFORE_CUT_SAVE, (event, this.lines[-5:])
        closed = this.value("closed")
        if closed is not None:      # cut after the close (event writes + 1) or the rename
            assert writes in (None, closed[0]) and event - closed[0] in (1, 2)
            writes = closed[0]
    last = boot(firmware, flash)
    assert last.error is None and not last.cut, last.error
    left.append(next(line for line in last.lines if line.startswith("files")))
    assert last.value("resumed") == CUT_SAVE and last.checkpoint == whole.checkpoint
    # a temporary file after every cut but the one after the rename
    assert writes >= 10 and ["checkpoint.tmp" in line for line in left] == [True] * (
        writes + 1) + [False]
    print(f"\nevery I/O event of the save completing stage 1: {writes} writes + close + "
          f"rename = {event} cuts, {event + 1} boots; each next boot loaded the run (from "
          f"the save before until the rename, then from this one); final checkpoint equal; "
          f"{time.monotonic() - started:.0f} s")


def test_cut_during_a_capture_on_the_board(artifacts, board_run, firmware, tmp_path):
    image, whole = board_run
    flash = tmp_path / "flash.bin"
    flash.write_bytes(image)
    cut = boot(firmware, flash, cut=("capture", 4))
    assert cut.cut and cut.lines == ["resumed 0 0", "saved 0 0", "cut"], cut.lines
    after = boot(firmware, flash)
    assert after.error is None and after.value("resumed") == (0, 0), after.error
    # the torn sample is counted, not kept: 59 records of 60 samples
    assert after.value("done") == (59, 60)
    cpython_run(artifacts, tmp_path / "cpython", cut=("capture", 4))
    cpython_run(artifacts, tmp_path / "cpython")
    assert (tmp_path / "cpython" / "run" / "checkpoint").read_bytes() == after.checkpoint
    assert after.checkpoint != whole.checkpoint       # it trained without that sample


# -- the same in one CPython process ------------------------------------------------------

class PowerCut(Exception):
    """Raised where the power goes; the run's objects are then dropped, as a board's RAM."""


def raise_power_cut():
    raise PowerCut


class CountedWrites:
    # a file being saved, every write call counted down to the cut
    def __init__(self, f, tick):
        self.f, self.tick = f, tick

    def write(self, data):
        n = self.f.write(data)
        self.tick()
        return n

    def flush(self):
        self.f.flush()

    def fileno(self):
        return self.f.fileno()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.f.close()


def run_in_process(source, capsys, cut=None, cut_after=None):
    """board_side.run in this process; cut_after: (kind, n) raises PowerCut after the n-th
    training step ("step") or checkpoint write ("write") of this run. Returns (was cut, the
    lines it printed)."""
    create, step = board_side.files._create, board_side.Learner._step
    if cut_after is not None:
        left = [cut_after[1]]

        def tick():
            left[0] -= 1
            if left[0] == 0:
                raise PowerCut

        def step_then_tick(learner, i):
            loss = step(learner, i)
            tick()
            return loss
        if cut_after[0] == "step":
            board_side.Learner._step = step_then_tick
        else:
            board_side.files._create = lambda tmp: CountedWrites(create(tmp), tick)
    try:
        board_side.run(source, EVERY, EPOCHS, LR, cut=cut)
        was_cut = False
    except PowerCut:
        was_cut = True
    finally:
        board_side.files._create, board_side.Learner._step = create, step
    out = Boot()
    out.lines = capsys.readouterr().out.splitlines()
    out.cut = was_cut
    return out


def test_cuts_simulated_in_cpython(artifacts, tmp_path, monkeypatch, capsys):
    source = str(artifacts) + "/"
    monkeypatch.setattr(board_side, "stop_here", raise_power_cut)
    for name in ("whole", "events", "random"):
        (tmp_path / name).mkdir()
    monkeypatch.chdir(tmp_path / "whole")
    assert not run_in_process(source, capsys).cut
    whole = (tmp_path / "whole" / "run" / "checkpoint").read_bytes()

    # every I/O event of the save completing stage 1, one after the other on one run
    monkeypatch.chdir(tmp_path / "events")
    writes, event, resumed = None, 0, []
    while writes is None or event < writes + 2:
        event += 1
        this = run_in_process(source, capsys, cut=("save",) + CUT_SAVE + (event,))
        assert this.cut
        if event > 1:
            resumed.append(this.value("resumed"))
        if this.value("closed") is not None:
            writes = this.value("closed")[0]
    resumed.append(run_in_process(source, capsys).value("resumed"))
    assert writes >= 10 and resumed == [BEFORE_CUT_SAVE] * (writes + 1) + [CUT_SAVE]
    assert (tmp_path / "events" / "run" / "checkpoint").read_bytes() == whole

    # random steps and writes, chains of runs until 100 cuts
    rng = np.random.default_rng(3)
    cuts, chains = 0, 0
    while cuts < 100:
        chains += 1
        (tmp_path / "random" / str(chains)).mkdir()
        monkeypatch.chdir(tmp_path / "random" / str(chains))
        completed, saved = 0, (0, 0)
        while True:
            kind = ("step", "write")[rng.integers(2)] if cuts < 100 else None
            n = int(rng.integers(1, 3 * EVERY if kind == "step" else 300))
            this = run_in_process(source, capsys, cut_after=(kind, n) if kind else None)
            resumed = this.value("resumed")
            assert resumed[0] >= completed and resumed >= saved, (cuts, resumed, saved)
            if not this.cut:
                break
            cuts += 1
            completed = max([completed] + [int(line.split()[1]) + 1 for line in this.lines
                                           if line.startswith("stage ")])
            saved = max(saved, this.last_progress())
        assert (tmp_path / "random" / str(chains) / "run" / "checkpoint").read_bytes() == whole
    with capsys.disabled():
        print(f"\nCPython: {writes + 2} cuts at every I/O event of one save, {cuts} at "
              f"random steps and writes in {chains} runs; no progress lost, final "
              f"checkpoints equal")
