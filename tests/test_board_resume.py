"""Resuming training on the emulated Cortex-M3 (MicroPython 1.25 qemu port, 140 KiB heap,
single-precision floats), issue 23, for the digits MLP (AdamW, batch 8) and the LeNet
reference CNN (AdamW, batch 4). Per model, four boots:

1. `deploy` K steps with --with-optimizer-state (the previous deploy's checkpoint);
2. `deploy --resume` from it, M steps: (b);
3. the README's device API on a board whose flash is kept in a file: the uninterrupted run
   of K + M steps with a checkpoint saved after K; Module.load_checkpoint of that checkpoint
   in the same program and M steps again: (c); then another save, cut off half-way through
   the file by stopping the emulated CPU (a power cut; the flash as it was at that instant);
4. a cold boot on that flash: CheckpointState.load_checkpoint, Module, Optimizer, M steps:
   (a).

Every loss after a resume must print as the uninterrupted run's (float repr, bit for bit),
and the fit check's resume and reload figures be within 10 % of the peaks measured (live
heap after gc.collect() between phases; for the reload, also while the checkpoint streams
into the arenas, when the old and the new state are both alive). Skipped without the
firmware of scripts/build_qemu_board.sh; failed when MICROTRAIN_REQUIRE_QEMU=1."""
import os
import re
import subprocess

import numpy as np
import pytest

from conftest import ROOT, lenet_board_artifacts

from microtrain_host import generate_artifacts
from microtrain_host.tools import deploy

DIGITS = ROOT / "examples" / "digits"

# The board program of boots 3 and 4 (settings prepended): SOURCE is the checkpoint to
# start from ("checkpoint": the packed one, boot 3; "ckpt": the saved one, boot 4).
BOARD_SCRIPT = """
import gc
import os
from array import array
gc.collect()
BASE = gc.mem_alloc()
peak = 0


def probe(name, quiet=False):
    global peak
    gc.collect()
    used = gc.mem_alloc() - BASE
    peak = max(peak, used)
    if not quiet:
        print("heap", name, used)


from microtrain import CheckpointState, Module, Optimizer
# the heap while a checkpoint's tensors stream into the arenas (both states alive in a
# reload), measured as the phases are
stream = CheckpointState.stream


def probing_stream(self, targets):
    probe("stream", True)
    return stream(self, targets)


CheckpointState.stream = probing_stream
probe("import")
state = CheckpointState.load_checkpoint(SOURCE)
probe("checkpoint")
model = Module("model.mtb", state)
probe("module")
opt = Optimizer("model.mtb", model)
opt.set_learning_rate(LR)
b = model.blob
x_id, y_id = b.programs["train"].inputs
x = array("f", bytes(4 * b.sizes[x_id]))
y = array("i", bytes(4 * b.sizes[y_id]))
probe("optimizer")
fx = open("x_train.f32", "rb")
fy = open("y_train.i32", "rb")


def steps(n, tag):
    first = opt.step_count
    fx.seek(first * 4 * len(x))
    fy.seek(first * 4 * len(y))
    for i in range(first, first + n):
        fx.readinto(x)
        fy.readinto(y)
        loss = model(x, y)
        opt.step()
        model.lazy_reset_grad()
        print(tag, i, repr(loss))
        probe("train", True)


if SOURCE == "ckpt":
    # (a) after the cut: the checkpoint of step K, whatever the cut save left beside it
    print("files", " ".join(sorted(n for n in os.listdir() if n.startswith("ckpt"))))
    steps(M, "resume")
    print("peak", peak)
else:
    steps(K, "step")
    CheckpointState.save_checkpoint(state, "ckpt", include_optimizer_state=True)
    probe("save")
    steps(M, "step")
    print("peak", peak)
    # (c) the checkpoint of step K reloaded into this Module and its Optimizer
    peak = 0
    state = model.load_checkpoint("ckpt")
    probe("reload")
    steps(M, "reload")
    print("reload peak", peak)
    # a save of step K + M cut off half-way through its second large tensor
    import microtrain.files as files
    create = files._create

    class Cut:
        def __init__(self, f):
            self.f = f
            self.big = 0

        def write(self, data):
            if len(data) >= 128:        # a tensor's values (a memoryview of the arena)
                self.big += 1
                if self.big == 2:
                    self.f.write(data[:len(data) // 2])
                    print("cut")
                    while True:         # the host stops the board here
                        pass
            return self.f.write(data)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

    files._create = lambda tmp: Cut(create(tmp))
    CheckpointState.save_checkpoint(state, "ckpt", include_optimizer_state=True)
    print("error: the save was not cut")
"""


def digits_mlp(tmp_path, steps):
    artifacts = tmp_path / "build"
    generate_artifacts(str(DIGITS / "mlp.onnx"), loss="CrossEntropyLoss", optimizer="AdamW",
                       artifact_directory=str(artifacts), batch_size=8,
                       optimizer_options={"learning_rate": 0.01})
    data = np.load(DIGITS / "digits.npz")
    np.savez(tmp_path / "data.npz", x_train=data["x_train"][:steps * 8],
             y_train=data["y_train"][:steps * 8], x_val=data["x_val"][:8],
             y_val=data["y_val"][:8])
    return artifacts, 0.01


def lenet_cnn(tmp_path, steps):
    return lenet_board_artifacts(tmp_path, "AdamW", steps)


def losses_of(lines, tag):
    # {step: the loss exactly as the board printed it}
    return {int(m.group(1)): m.group(2) for m in
            (re.fullmatch(tag + r" (\d+) (\S+)", line) for line in lines) if m}


def boot(firmware, plan, flash, script, cut=False):
    """Run script on the emulated board whose flash is kept in the file flash; with cut,
    stop the board (a power cut) when it prints "cut". Returns its output lines."""
    lines = []
    with deploy.QemuBoard(firmware, flash=flash) as qemu:
        command = deploy.mpremote_command(plan, qemu.port, script, rom_loaded=True)
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, env=dict(os.environ, PYTHONUNBUFFERED="1"))
        try:
            for line in proc.stdout:
                lines.append(line.rstrip("\r\n"))
                if cut and lines[-1] == "cut":
                    qemu.cut()
                    break
        finally:
            proc.kill()
            proc.wait()
    return lines


@pytest.mark.parametrize("model,K,M", [("mlp", 4, 3), ("lenet", 2, 2)])
def test_resume_on_the_emulated_board(firmware, tmp_path, model, K, M):
    make = {"mlp": digits_mlp, "lenet": lenet_cnn}[model]
    artifacts, lr = make(tmp_path, K + M)
    data = tmp_path / "data.npz"

    # 1-2: deploy K steps, then deploy --resume from its checkpoint M steps (b)
    first = deploy.run(deploy.plan(artifacts, "qemu-mps2-an385", steps=K), data, lr=lr,
                       output=tmp_path / "deployed", with_optimizer_state=True,
                       firmware=firmware)
    resumed_plan = deploy.plan(artifacts, "qemu-mps2-an385", steps=M,
                               resume=tmp_path / "deployed")
    assert resumed_plan.start_step == K
    resumed = deploy.run(resumed_plan, data, lr=lr, output=tmp_path / "resumed",
                         firmware=firmware)

    # 3-4: the device API, the flash kept in a file (the runtime in its ROM partition)
    plan = deploy.plan(artifacts, "qemu-mps2-an385", steps=K + M)
    work = tmp_path / "board"
    work.mkdir()
    deploy.prepare(plan, data, work)
    flash = tmp_path / "flash.bin"
    flash.write_bytes(plan.romfs_image.read_bytes())
    scripts = {}
    for source in ("checkpoint", "ckpt"):
        scripts[source] = tmp_path / f"resume_{source}.py"
        scripts[source].write_text(f"SOURCE = {source!r}\nK = {K}\nM = {M}\nLR = {lr!r}\n"
                                   + BOARD_SCRIPT)
    out1 = boot(firmware, plan, flash, scripts["checkpoint"], cut=True)
    assert out1[-1:] == ["cut"], "\n".join(out1[-30:])
    plan.files = []      # a cold boot: nothing copied, the flash as the cut left it
    out2 = boot(firmware, plan, flash, scripts["ckpt"])

    uninterrupted = losses_of(out1, "step")
    assert sorted(uninterrupted) == list(range(K + M)), "\n".join(out1[-30:])
    later = {k: v for k, v in uninterrupted.items() if k >= K}
    assert losses_of(out1, "reload") == later, "\n".join(out1[-30:])                 # (c)
    assert losses_of(out2, "resume") == later, "\n".join(out2[-30:])                 # (a)
    # (b): the deploys print the board's repr too
    deployed = losses_of(first.log, "step")
    assert deployed == {k: v for k, v in uninterrupted.items() if k < K}, first.log
    assert losses_of(resumed.log, "step") == later, resumed.log[-30:]
    files = next(line for line in out2 if line.startswith("files"))

    # the fit check: resume and reload predicted within 10 % of the measured peaks
    fit = plan.fit
    resume_peak = int(next(line for line in out2 if line.startswith("peak")).split()[1])
    reload_peak = int(next(line for line in out1 if line.startswith("reload peak"))
                      .split()[2])
    print(f"\n{model}: K={K} M={M}; losses after resuming {list(later.values())}, equal in "
          f"(a) cold boot after a cut save ({files}), (b) deploy --resume, (c) reload; "
          f"peaks: deploy --resume predicted {resumed_plan.fit.resume} measured "
          f"{resumed.peak}; device API resume predicted {fit.resume} measured {resume_peak}; "
          f"reload predicted {fit.reload} measured {reload_peak}; needed {fit.needed}")
    for predicted, measured in ((resumed_plan.fit.resume, resumed.peak),
                                (fit.resume, resume_peak), (fit.reload, reload_peak)):
        assert abs(predicted - measured) <= 0.10 * measured, (predicted, measured)
    assert fit.fits, (fit.needed, fit.heap)   # the GC pool, less the script's own heap
