#!/usr/bin/env python3
"""Checkpoint interop between microtrain and onnxruntime-training 1.19.2, both ways.

    python scripts/ort_interop.py [--work DIR] [--steps N] [--record DIR]

onnxruntime-training conflicts with the `onnxruntime` package microtrain's tests use, so it
lives in a venv of its own, .cache/ort-training-venv, created on the first run with
onnxruntime-training==1.19.2 (a 299 MB wheel from PyPI), numpy<2 and torch==2.13.0 (which
the training package imports). The script runs twice: as the orchestrator under the
project's Python (microtrain's host package and device runtime), and as a worker inside the
venv (onnxruntime-training only), which gets a JSON list of tasks and answers in JSON.

The model is the digits MLP (examples/digits/mlp.onnx, 64-32-10, batch 8, cross-entropy);
the batches are the first ones of examples/digits/digits.npz. Checked:

* microtrain -> ORT: ORT loads the host-written checkpoint, the nominal one, and checkpoints
  the device runtime wrote after N steps (AdamW and SGD, with and without optimizer state,
  with properties); parameters and properties read equal to the bit; ORT (its training graph
  from its own generate_artifacts on the same model) trains on, and its losses equal the
  device runtime's continuing from the same file.
  Two more writers: the device runtime under MicroPython (AdamW with optimizer state; the
  reference is the CPython device runtime continuing from that file), and SGD with
  momentum 0.9, whose velocity is saved as momentum0: ORT's SGD (SGDOptimizerV2) has no
  momentum, so ORT must train on like microtrain's plain SGD from the same parameters, and
  its own save afterwards shows what it did with momentum0.
* ORT -> microtrain: checkpoints ORT wrote after N steps (with optimizer state and
  properties) and ORT's nominal checkpoint load in the host reader and the device runtime,
  equal to the bit; the device runtime resumes them and its losses equal ORT's own
  continuation.
* LinearLRScheduler: ORT's Python LinearLRScheduler(optimizer, a, b, lr) for a few (a, b),
  its learning rate before each step. ORT 1.19.2's binding hands the two counts to its C++
  scheduler swapped (warmup = b, total = a); microtrain follows the documented order, so
  microtrain's (b, a) must give ORT's rates within 1e-7 (and, as microtrain refuses
  warmup > total, its (b, b) when a < b: ORT's warm-up count then plays no part).

Losses must agree within 1e-4 relative (denominator max(|b|, 1e-3)), in lists of equal,
nonzero length; figures are printed.
Exit status 0 when every check passes, 1 otherwise.

--record DIR copies checkpoints ORT wrote, with what ORT read and computed from them (and
ORT's scheduler rates), into DIR (tests/data/ort-1.19.2 was made so), for the regular test
suite, which must not need onnxruntime-training (tests/test_ort_checkpoints.py).
"""
import argparse
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VENV = os.path.join(ROOT, ".cache", "ort-training-venv")
MODEL = os.path.join(ROOT, "examples", "digits", "mlp.onnx")
DATA = os.path.join(ROOT, "examples", "digits", "digits.npz")
REQUIREMENTS = ["onnxruntime-training==1.19.2", "numpy<2", "torch==2.13.0"]
BATCH = 8
LEARNING_RATES = {"AdamW": 0.01, "SGD": 0.1}
TOLERANCE = 1e-4
ORT_MAX_IR = 10  # onnxruntime 1.19 reads ONNX IR version 10 at most
MOMENTUM = 0.9  # microtrain's SGD with momentum; ORT's SGD (SGDOptimizerV2) has none
# ORT's Python LinearLRScheduler(optimizer, a, b, initial_lr) is called with these (a, b, lr)
# and its learning rate is recorded before each of LR_STEPS optimizer steps.
LR_PAIRS = [(4, 10, 1.0), (10, 4, 1.0), (0, 10, 1.0), (10, 0, 1.0), (0, 0, 1.0), (3, 3, 1.0),
            (2, 6, 0.05), (6, 2, 0.05)]
LR_STEPS = 12
LR_TOLERANCE = 1e-7
RESUME_SCRIPT = os.path.join(ROOT, "tests", "device_scripts", "resume_steps.py")


# ----------------------------------------------------------------------------- worker (venv)


def worker(task_file, result_file):
    import numpy as np
    import onnx
    import onnxruntime
    onnxruntime.set_default_logger_severity(3)
    from onnxruntime.training import artifacts
    from onnxruntime.training.api import CheckpointState, LinearLRScheduler, Module, Optimizer

    with open(task_file) as f:
        tasks = json.load(f)
    data = np.load(tasks["batches"])
    xs, ys = data["x"], data["y"]

    def generate(directory, optimizer):
        model = onnx.load(MODEL)
        model.ir_version = min(model.ir_version, ORT_MAX_IR)
        os.makedirs(directory, exist_ok=True)
        artifacts.generate_artifacts(
            model, requires_grad=[i.name for i in model.graph.initializer],
            loss=artifacts.LossType.CrossEntropyLoss,
            optimizer=getattr(artifacts.OptimType, optimizer), artifact_directory=directory,
            nominal_checkpoint=True)
        for name in os.listdir(directory):  # the venv's onnx writes a newer IR than ORT reads
            if name.endswith(".onnx"):
                path = os.path.join(directory, name)
                m = onnx.load(path)
                if m.ir_version > ORT_MAX_IR:
                    m.ir_version = ORT_MAX_IR
                    onnx.save(m, path)

    def session(directory, checkpoint, lr=None):
        state = CheckpointState.load_checkpoint(checkpoint)
        module = Module(os.path.join(directory, "training_model.onnx"), state,
                        os.path.join(directory, "eval_model.onnx"))
        if lr is None:  # (ORT 1.19.2 crashes setting the learning rate on a nominal state)
            return state, module, None
        optimizer = Optimizer(os.path.join(directory, "optimizer_model.onnx"), module)
        optimizer.set_learning_rate(lr)
        return state, module, optimizer

    def train(module, optimizer, start, steps):
        losses = []
        for i in range(start, start + steps):
            losses.append(float(module(xs[i], ys[i])))
            optimizer.step()
            module.lazy_reset_grad()
        return losses

    def dump(state, path):
        np.savez(path, **{name: p.data for name, p in state.parameters})

    results = {}
    for optimizer in ("AdamW", "SGD"):
        generate(os.path.join(tasks["work"], "ort_" + optimizer), optimizer)
    for task in tasks["tasks"]:
        directory = os.path.join(tasks["work"], "ort_" + task["optimizer"])
        out = {}
        try:
            if task["kind"] == "continue":
                # Load a checkpoint (microtrain's or ORT's), dump what ORT read, train on.
                state, module, optimizer = session(directory, task["checkpoint"], task["lr"])
                dump(state, task["dump"])
                out["properties"] = {name: state.properties[name] for name in task["properties"]}
                out["losses"] = train(module, optimizer, task["start"], task["steps"])
                if task.get("save"):
                    # ORT's side of ORT -> microtrain: its state after those steps.
                    for name, value in task["set_properties"].items():
                        state.properties[name] = value
                    dump(state, task["save"] + ".npz")
                    CheckpointState.save_checkpoint(state, task["save"],
                                                    include_optimizer_state=True)
                    out["after_save"] = train(module, optimizer, task["start"] + task["steps"],
                                              task["steps"])
                if task.get("resave"):
                    # What ORT made of the optimizer state it was given, after its steps.
                    CheckpointState.save_checkpoint(state, task["resave"],
                                                    include_optimizer_state=True)
            elif task["kind"] == "lr_schedule":
                # ORT's Python LinearLRScheduler(optimizer, a, b, lr): the learning rate
                # before each optimizer step, as ORT's optimizer reports it.
                out["runs"] = []
                for a, b, lr in task["pairs"]:
                    _, module, optimizer = session(directory, os.path.join(directory,
                                                                           "checkpoint"), 0.5)
                    scheduler = LinearLRScheduler(optimizer, a, b, lr)
                    rates = []
                    for i in range(task["steps"]):
                        rates.append(float(optimizer.get_learning_rate()))
                        module(xs[i % len(xs)], ys[i % len(ys)])
                        optimizer.step()
                        module.lazy_reset_grad()
                        scheduler.step()
                    out["runs"].append({"warmup_step_count": a, "total_step_count": b,
                                        "initial_lr": lr, "rates": rates})
            elif task["kind"] == "nominal":
                # Refuses to train until every parameter arrives, then trains like the full one.
                _, full, _ = session(directory, task["full"])
                state, module, _ = session(directory, task["checkpoint"])
                try:
                    module(xs[0], ys[0])
                    out["refused"] = False
                except Exception as e:  # ORT raises a RuntimeError-like pybind error
                    out["refused"] = "nominal" in str(e)
                contiguous = full.get_contiguous_parameters()
                np.save(task["contiguous"], contiguous.numpy())
                module.copy_buffer_to_parameters(contiguous, trainable_only=False)
                out["losses"] = [float(module(xs[0], ys[0])), float(full(xs[0], ys[0]))]
            elif task["kind"] == "own":
                # ORT's own checkpoints, for microtrain to read.
                for name in ("checkpoint", "nominal_checkpoint"):
                    out[name] = os.path.join(directory, name)
                state = CheckpointState.load_checkpoint(out["checkpoint"])
                dump(state, task["dump"])
        except Exception as e:
            out["error"] = "%s: %s" % (type(e).__name__, str(e).strip().splitlines()[-1][-300:])
        results[task["name"]] = out
    with open(result_file, "w") as f:
        json.dump(results, f)


# ----------------------------------------------------------------------------- orchestrator


def venv_python():
    return os.path.join(VENV, "bin", "python")


def ensure_venv():
    python = venv_python()
    probe = [python, "-c", "import onnxruntime.training.api, onnx, numpy"]
    if os.path.exists(python) and subprocess.run(probe, capture_output=True).returncode == 0:
        return python
    print("creating %s with %s (once; onnxruntime-training is a 299 MB download)"
          % (os.path.relpath(VENV, ROOT), ", ".join(REQUIREMENTS)), flush=True)
    subprocess.run([sys.executable, "-m", "venv", VENV], check=True)
    subprocess.run([python, "-m", "pip", "install", "--quiet", *REQUIREMENTS], check=True)
    subprocess.run(probe, check=True)
    return python


class Report:
    def __init__(self):
        self.failures = 0

    def check(self, ok, text):
        print("  %s %s" % ("ok  " if ok else "FAIL", text), flush=True)
        if not ok:
            self.failures += 1
        return ok


def rel_diff(a, b):
    """Largest relative difference of two loss lists; inf unless both have the same, nonzero
    length (a short or empty list from ORT must fail the check, not pass it)."""
    if len(a) != len(b) or not b:
        return float("inf")
    return max(abs(x - y) / max(abs(y), 1e-3) for x, y in zip(a, b))


def f32_bits(values):
    import numpy as np
    return np.asarray(values, dtype=np.float32).reshape(-1).view(np.uint32)


def same_bits(a, b):
    import numpy as np
    return np.array_equal(f32_bits(a), f32_bits(b))


def device_rates(blob, checkpoint, warmup, total, lr, xs, ys, steps=LR_STEPS):
    """microtrain's LinearLRScheduler(optimizer, warmup, total, lr) on the device runtime:
    the learning rate before each optimizer step, as ORT's runs are recorded."""
    from microtrain import CheckpointState, LinearLRScheduler, Module, Optimizer
    module = Module(blob, CheckpointState.load_checkpoint(checkpoint))
    optimizer = Optimizer(blob, module)
    scheduler = LinearLRScheduler(optimizer, warmup, total, lr)
    rates = []
    for i in range(steps):
        rates.append(optimizer.get_learning_rate())
        module(xs[i % len(xs)].reshape(-1).tolist(), ys[i % len(ys)].tolist())
        optimizer.step()
        module.lazy_reset_grad()
        scheduler.step()
    return rates


def check_lr_schedules(report, runs, blob, checkpoint, xs, ys):
    """ORT's Python LinearLRScheduler(opt, a, b, lr) runs its C++ scheduler with warmup b and
    total a. microtrain follows the documented order, so its (b, a) must give ORT's rates;
    microtrain refuses warmup > total, and for a < b ORT's rates (lr*k/b, then 0: the
    warm-up count plays no part) are microtrain's (b, b)."""
    def close(x, y):
        return len(x) == len(y) > 0 and max(abs(p - q) for p, q in zip(x, y)) <= LR_TOLERANCE

    for run in runs:
        a, b, lr = run["warmup_step_count"], run["total_step_count"], run["initial_lr"]
        theirs = run["rates"]
        shown = " ".join("%.4g" % v for v in theirs)
        if b <= a:
            mine, how = device_rates(blob, checkpoint, b, a, lr, xs, ys), "(%d, %d)" % (b, a)
        else:
            mine, how = device_rates(blob, checkpoint, b, b, lr, xs, ys), "(%d, %d)" % (b, b)
        report.check(close(mine, theirs), "ORT (%d, %d, %g): %s = microtrain %s within %g"
                     % (a, b, lr, shown, how, LR_TOLERANCE))
        if a < b:
            same_order = device_rates(blob, checkpoint, a, b, lr, xs, ys)
            print("       (microtrain (%d, %d), the documented meaning: %s)"
                  % (a, b, " ".join("%.4g" % v for v in same_order)))


def micropython_binary():
    """The MicroPython Unix port, found as tests/conftest.py finds it."""
    for candidate in (os.environ.get("MICROTRAIN_MICROPYTHON"),
                      os.path.join(ROOT, ".cache", "micropython", "micropython"),
                      shutil.which("micropython")):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


def micropython_run(report, blob, checkpoint, xs, ys, lr, steps, out, work):
    """The device runtime under MicroPython (tests/device_scripts/resume_steps.py): `steps`
    steps from `checkpoint`, then a save to `out` with optimizer state and the properties
    epoch, lr and note. Returns its losses and those properties, or None (a failed check)."""
    import numpy as np
    binary = micropython_binary()
    if not report.check(binary is not None, "MicroPython Unix port found%s" % (
            "" if binary else ": none (run scripts/build_micropython.sh)")):
        return None
    data = os.path.join(work, "micropython_batches")
    os.makedirs(data, exist_ok=True)
    xs.astype("<f4").tofile(os.path.join(data, "x.f32"))
    ys.astype("<i4").tofile(os.path.join(data, "y.i32"))
    lr32 = struct.unpack("<I", struct.pack("<f", lr))[0]
    env = dict(os.environ, MICROPYPATH=os.path.join(ROOT, "device"))
    proc = subprocess.run([binary, "-X", "heapsize=4M", RESUME_SCRIPT, blob, checkpoint, data,
                           "0", str(steps), "%08x" % lr32, out, "1"],
                          capture_output=True, text=True, env=env, timeout=600)
    if not report.check(proc.returncode == 0 and "saved" in proc.stdout.split(),
                        "MicroPython (%s) trained %d steps and saved %s" % (
                            binary, steps, os.path.basename(out))):
        print(proc.stdout[-2000:] + proc.stderr[-2000:])
        return None
    losses = [struct.unpack("<f", struct.pack("<I", int(line.split()[1], 16)))[0]
              for line in proc.stdout.splitlines() if line.startswith("loss ")]
    return {"losses": losses, "props": {"epoch": steps, "lr": float(np.float32(lr)),
                                        "note": "trained to step %d" % steps}}


def record(directory, work, steps, results):
    """Copy ORT's files and the figures ORT computed from them into `directory`."""
    os.makedirs(directory, exist_ok=True)
    own = os.path.join(work, "ort_AdamW")
    copies = {"checkpoint": os.path.join(own, "checkpoint"),
              "nominal_checkpoint": os.path.join(own, "nominal_checkpoint"),
              "adamw_step%d_checkpoint" % steps: os.path.join(work, "ort_AdamW_with_state"),
              "adamw_step%d_parameters.npz" % steps:
                  os.path.join(work, "ort_AdamW_with_state.npz"),
              "sgd_step%d_checkpoint" % steps: os.path.join(work, "ort_SGD_with_state")}
    for name, source in copies.items():
        shutil.copyfile(source, os.path.join(directory, name))
    expected = {
        "written_by": "onnxruntime-training 1.19.2 (scripts/ort_interop.py --record)",
        "model": "examples/digits/mlp.onnx", "batch_size": BATCH,
        "data": "examples/digits/digits.npz x_train/y_train in order, %d per batch" % BATCH,
        "saved_after_steps": steps,
        "properties": {"epoch": 5, "by": "onnxruntime"},
        "runs": {opt: {"learning_rate": LEARNING_RATES[opt],
                       "losses_from_step_%d" % steps: results[opt + ":ort_origin"]["after_save"]}
                 for opt in ("AdamW", "SGD")},
        "linear_lr_scheduler": {
            "call": "onnxruntime.training.api.LinearLRScheduler(optimizer, warmup_step_count, "
                    "total_step_count, initial_lr), called with the two counts below in "
                    "that order",
            "rates": "optimizer.get_learning_rate() before each optimizer.step(), the "
                     "scheduler stepped after each",
            "finding": "ORT 1.19.2's C++ binding takes (total_step_count, warmup_step_count) "
                       "and passes them on swapped, so the C++ scheduler runs with warmup = "
                       "the Python total_step_count and total = the Python warmup_step_count",
            "runs": results["SGD:lr_schedule"]["runs"]}}
    with open(os.path.join(directory, "expected.json"), "w") as f:
        json.dump(expected, f, indent=1)
    print("recorded ORT's files in %s" % directory)


def orchestrate(work, steps, record_dir=None):
    import numpy as np
    sys.path[:0] = [os.path.join(ROOT, "host"), os.path.join(ROOT, "device")]
    from microtrain import CheckpointState, Module, Optimizer
    from microtrain_host import generate_artifacts
    from microtrain_host.formats.checkpoint import read_checkpoint

    report = Report()
    data = np.load(DATA)
    count = 3 * steps
    xs = data["x_train"][:count * BATCH].reshape(count, BATCH, -1).astype(np.float32)
    ys = data["y_train"][:count * BATCH].reshape(count, BATCH).astype(np.int64)
    batches = os.path.join(work, "batches.npz")
    np.savez(batches, x=xs, y=ys)
    properties = {"epoch": 3, "best_loss": 0.375, "note": "from microtrain"}

    def device_run(blob, checkpoint, lr, start, n, save=None, include_optimizer_state=False):
        """Device runtime: n steps from batch `start`; optionally save after them."""
        state = CheckpointState.load_checkpoint(checkpoint)
        module = Module(blob, state)
        optimizer = Optimizer(blob, module)
        optimizer.set_learning_rate(lr)
        losses = []
        for i in range(start, start + n):
            losses.append(module(xs[i].reshape(-1).tolist(), ys[i].tolist()))
            optimizer.step()
            module.lazy_reset_grad()
            if save and i == start + n - 1:
                state.properties.update(properties)
                CheckpointState.save_checkpoint(state, save, include_optimizer_state)
        return losses

    # microtrain's artifacts and the device runtime's checkpoints and reference losses.
    ours, tasks = {}, []
    for opt in ("AdamW", "SGD"):
        lr = LEARNING_RATES[opt]
        art = generate_artifacts(MODEL, loss="CrossEntropyLoss", optimizer=opt,
                                 artifact_directory=os.path.join(work, "mt_" + opt),
                                 batch_size=BATCH, nominal_checkpoint=True)
        blob = art.blob
        with_state = os.path.join(work, "device_%s_with_state" % opt)
        without = os.path.join(work, "device_%s_params_only" % opt)
        uninterrupted = device_run(blob, art.checkpoint, lr, 0, 2 * steps, save=None)
        device_run(blob, art.checkpoint, lr, 0, steps, save=with_state,
                   include_optimizer_state=True)
        device_run(blob, art.checkpoint, lr, 0, steps, save=without)
        ours[opt] = {"art": art, "lr": lr, "uninterrupted": uninterrupted,
                     "files": {"host": art.checkpoint, "device_with_state": with_state,
                               "device_params_only": without},
                     "fresh_moments": device_run(blob, without, lr, steps, steps)}
        common = dict(optimizer=opt, lr=lr, properties=[])
        tasks.append(dict(common, kind="continue", name=opt + ":host", checkpoint=art.checkpoint,
                          start=0, steps=2 * steps, dump=art.checkpoint + ".ort.npz"))
        for key, path in (("device_with_state", with_state), ("device_params_only", without)):
            tasks.append(dict(common, kind="continue", name="%s:%s" % (opt, key),
                              checkpoint=path, start=steps, steps=steps,
                              dump=path + ".ort.npz", properties=list(properties)))
        tasks.append(dict(common, kind="nominal", name=opt + ":nominal",
                          checkpoint=art.nominal_checkpoint, full=art.checkpoint,
                          contiguous=art.checkpoint + ".contiguous.npy"))
        tasks.append(dict(common, kind="own", name=opt + ":own",
                          dump=os.path.join(work, "ort_%s_own.npz" % opt)))
        tasks.append(dict(common, kind="continue", name=opt + ":ort_origin",
                          checkpoint=os.path.join(work, "ort_" + opt, "checkpoint"), start=0,
                          steps=steps, dump=os.path.join(work, "ort_origin_%s.npz" % opt),
                          save=os.path.join(work, "ort_%s_with_state" % opt),
                          set_properties={"epoch": 5, "lr_seen": lr, "by": "onnxruntime"}))
    # Two more writers for microtrain -> ORT. (1) The device runtime under MicroPython
    # (AdamW, with optimizer state); the device runtime under CPython continues from its file
    # as the reference. (2) SGD with momentum, which saves its velocity as momentum0: ORT's
    # SGD has no momentum, so the reference is plain SGD from the same parameters.
    mp_path = os.path.join(work, "micropython_AdamW_with_state")
    mp = micropython_run(report, ours["AdamW"]["art"].blob, ours["AdamW"]["art"].checkpoint,
                         xs, ys, LEARNING_RATES["AdamW"], steps, mp_path, work)
    if mp is not None:
        mp["reference"] = device_run(ours["AdamW"]["art"].blob, mp_path,
                                     LEARNING_RATES["AdamW"], steps, steps)
        ours["AdamW"]["files"]["micropython_with_state"] = mp_path
        ours["AdamW"]["micropython"] = mp
        tasks.append(dict(optimizer="AdamW", lr=LEARNING_RATES["AdamW"], kind="continue",
                          name="AdamW:micropython_with_state", checkpoint=mp_path, start=steps,
                          steps=steps, dump=mp_path + ".ort.npz", properties=list(mp["props"])))
    lr = LEARNING_RATES["SGD"]
    art_m = generate_artifacts(MODEL, loss="CrossEntropyLoss", optimizer="SGD",
                               optimizer_options={"momentum": MOMENTUM}, batch_size=BATCH,
                               artifact_directory=os.path.join(work, "mt_SGD_momentum"))
    m_path = os.path.join(work, "device_SGD_momentum_with_state")
    device_run(art_m.blob, art_m.checkpoint, lr, 0, steps, save=m_path,
               include_optimizer_state=True)
    ours["SGD"]["files"]["device_momentum_with_state"] = m_path
    ours["SGD"]["momentum"] = {
        "plain": device_run(ours["SGD"]["art"].blob, m_path, lr, steps, steps),
        "with_momentum": device_run(art_m.blob, m_path, lr, steps, steps),
        "resaved": m_path + ".ort_resaved"}
    tasks.append(dict(optimizer="SGD", lr=lr, kind="continue",
                      name="SGD:device_momentum_with_state", checkpoint=m_path, start=steps,
                      steps=steps, dump=m_path + ".ort.npz", properties=list(properties),
                      resave=m_path + ".ort_resaved"))
    tasks.append(dict(optimizer="SGD", kind="lr_schedule", name="SGD:lr_schedule",
                      pairs=LR_PAIRS, steps=LR_STEPS))
    # The ORT-origin tasks need ORT's generated checkpoint; the worker generates it first.
    task_file = os.path.join(work, "tasks.json")
    result_file = os.path.join(work, "results.json")
    with open(task_file, "w") as f:
        json.dump({"work": work, "batches": batches, "tasks": tasks}, f)
    print("running onnxruntime-training 1.19.2 in %s ..." % os.path.relpath(VENV, ROOT),
          flush=True)
    log = os.path.join(work, "ort_worker.log")
    with open(log, "w") as f:  # ORT logs every graph transform of generate_artifacts
        worker_run = subprocess.run([ensure_venv(), os.path.abspath(__file__), "--worker",
                                     task_file, result_file], stdout=f, stderr=subprocess.STDOUT)
    if worker_run.returncode != 0:
        with open(log) as f:
            tail = f.read().splitlines()[-20:]
        sys.exit("the onnxruntime-training worker failed (%d):\n%s"
                 % (worker_run.returncode, "\n".join(tail)))
    with open(result_file) as f:
        results = json.load(f)

    def ok_result(name):
        r = results[name]
        return report.check("error" not in r, "ORT ran '%s'%s" % (
            name, (": " + r["error"]) if "error" in r else ""))

    for opt in ("AdamW", "SGD"):
        mine = ours[opt]
        print("\n%s (lr %g), %d steps before saving, %d after" % (opt, mine["lr"], steps, steps))
        print(" microtrain -> ORT")
        for key, path in mine["files"].items():
            name = "%s:%s" % (opt, key)
            if not ok_result(name):
                continue
            r = results[name]
            mt = read_checkpoint(path)
            ort_read = np.load(path + ".ort.npz")
            equal = all(same_bits(ort_read[n], mt.trainable[n]) for n in mt.trainable)
            report.check(equal and sorted(ort_read.files) == sorted(mt.trainable),
                         "%s checkpoint (%d bytes%s): ORT reads all %d parameters equal to "
                         "the bit" % (key, os.path.getsize(path),
                                      ", CRC-32 trailer" if mt.checked else "",
                                      len(mt.trainable)))
            expected = None
            if key == "host":
                reference, what = mine["uninterrupted"], "from step 0"
            elif key == "device_with_state":
                reference, what = mine["uninterrupted"][steps:], "resumed with optimizer state"
                expected = properties
                if opt == "AdamW":
                    fresh = rel_diff(mine["fresh_moments"], reference)
                    report.check(fresh > TOLERANCE, "(the check can fail: fresh moments instead "
                                 "change the losses by up to %.2e)" % fresh)
            elif key == "micropython_with_state":
                mp = mine["micropython"]
                first = rel_diff(mp["losses"], mine["uninterrupted"][:steps])
                report.check(first <= TOLERANCE, "(MicroPython's own %d losses before the save: "
                             "max relative difference to CPython's %.2e)"
                             % (len(mp["losses"]), first))
                reference, what = mp["reference"], ("MicroPython's file, resumed with optimizer "
                                                    "state; reference: CPython device runtime "
                                                    "from the same file")
                expected = mp["props"]
            elif key == "device_momentum_with_state":
                reference, what = mine["momentum"]["plain"], (
                    "SGD+momentum %g file; ORT's SGD has no momentum, so the reference is "
                    "microtrain's plain SGD from the same parameters" % MOMENTUM)
                expected = properties
            else:
                reference, what = mine["fresh_moments"], "params only (fresh optimizer)"
            if expected is not None:
                got = {n: r["properties"][n] for n in expected}
                expected = {n: (float(np.float32(v)) if isinstance(v, float) else v)
                            for n, v in expected.items()}
                report.check(got == expected, "ORT reads the properties %s" % got)
            losses = r["losses"]
            report.check(len(losses) == len(reference) > 0, "ORT returned %d losses, "
                         "microtrain %d" % (len(losses), len(reference)))
            diff = rel_diff(losses, reference)
            report.check(diff <= TOLERANCE, "ORT trains on (%s): %d losses, max relative "
                         "difference to microtrain %.2e (first %s vs %.6f)"
                         % (what, len(reference), diff,
                            "%.6f" % losses[0] if losses else "none", reference[0]))
            if key == "device_momentum_with_state":
                momentum = mine["momentum"]
                off = rel_diff(momentum["with_momentum"], reference)
                report.check(off > TOLERANCE, "(the check can fail: microtrain continuing with "
                             "momentum differs from that by up to %.2e)" % off)
                # What ORT did with momentum0: its save of the state after its steps.
                before, after = mt.momentums, read_checkpoint(momentum["resaved"])
                nonzero = sum(int(np.count_nonzero(m[0])) for m in before.values())
                carried = (sorted(after.momentums) == sorted(before) and
                           all(len(after.momentums[n]) == len(before[n]) == 1 and
                               same_bits(after.momentums[n][0], before[n][0]) for n in before))
                report.check(carried and after.optimizer_step == 2 * steps,
                             "ORT loads momentum0 (%d parameters, %d nonzero values), does not "
                             "use it, and saves it back unchanged to the bit (its step %d -> %s)"
                             % (len(before), nonzero, steps, after.optimizer_step))
        name = opt + ":nominal"
        if ok_result(name):
            r = results[name]
            report.check(r["refused"], "ORT loads our nominal checkpoint (%d bytes) and refuses "
                         "to train on it" % os.path.getsize(mine["art"].nominal_checkpoint))
            report.check(r["losses"][0] == r["losses"][1], "after copy_buffer_to_parameters("
                         "trainable_only=False) it trains like the full one (loss %.6f)"
                         % r["losses"][0])
            theirs = np.load(mine["art"].checkpoint + ".contiguous.npy")
            module = Module(mine["art"].blob, CheckpointState.load_checkpoint(
                mine["art"].checkpoint))
            report.check(same_bits(theirs, module.get_contiguous_parameters(False)),
                         "get_contiguous_parameters: ORT's buffer (%d values) equals the device "
                         "runtime's, same order (federated rounds can mix them)" % theirs.size)

        print(" ORT -> microtrain")
        blob = mine["art"].blob
        if ok_result(opt + ":own"):
            own = results[opt + ":own"]
            ort_values = np.load(os.path.join(work, "ort_%s_own.npz" % opt))
            mt = read_checkpoint(own["checkpoint"])
            ours_initial = read_checkpoint(mine["art"].checkpoint)
            report.check(all(same_bits(mt.trainable[n], ort_values[n]) and
                              same_bits(mt.trainable[n], ours_initial.trainable[n])
                              for n in ort_values.files),
                         "ORT's initial checkpoint (%d bytes; ours %d): host reader equal to "
                         "the bit, and to our own" % (os.path.getsize(own["checkpoint"]),
                                                      os.path.getsize(mine["art"].checkpoint)))
            state = CheckpointState.load_checkpoint(own["nominal_checkpoint"])
            module = Module(blob, state)
            try:
                module(xs[0].reshape(-1).tolist(), ys[0].tolist())
                refused = False
            except Exception as e:
                refused = "nominal" in str(e)
            full = Module(blob, CheckpointState.load_checkpoint(own["checkpoint"]))
            module.copy_buffer_to_parameters(full.get_contiguous_parameters(), False)
            x, y = xs[0].reshape(-1).tolist(), ys[0].tolist()
            report.check(refused and module(x, y) == full(x, y),
                         "ORT's nominal checkpoint (%d bytes): the device runtime refuses to "
                         "train, then trains like the full one"
                         % os.path.getsize(own["nominal_checkpoint"]))
        name = opt + ":ort_origin"
        if ok_result(name):
            r = results[name]
            path = os.path.join(work, "ort_%s_with_state" % opt)
            ort_values = np.load(path + ".npz")
            mt = read_checkpoint(path)
            state = CheckpointState.load_checkpoint(path)
            equal = all(same_bits(mt.trainable[n], ort_values[n]) and
                        same_bits(state.parameters[n].data, ort_values[n])
                        for n in ort_values.files)
            report.check(equal, "ORT's checkpoint after %d steps (%d bytes, step %s, %d "
                         "moments per parameter): host reader and device runtime equal to "
                         "the bit" % (steps, os.path.getsize(path), mt.optimizer_step,
                                      len(next(iter(mt.momentums.values()), []))))
            report.check(state.properties == {"epoch": 5, "lr_seen": float(np.float32(
                mine["lr"])), "by": "onnxruntime"},
                "device runtime reads ORT's properties %s" % state.properties)
            resumed = device_run(blob, path, mine["lr"], steps, steps)
            diff = rel_diff(resumed, r["after_save"])
            report.check(diff <= TOLERANCE, "device runtime resumes it: %d losses (ORT's "
                         "continuation %d), max relative difference %.2e"
                         % (len(resumed), len(r["after_save"]), diff))

    print("\nLinearLRScheduler: ORT's Python API (a, b, lr), rate before each of %d steps"
          % LR_STEPS)
    if ok_result("SGD:lr_schedule"):
        check_lr_schedules(report, results["SGD:lr_schedule"]["runs"], ours["SGD"]["art"].blob,
                           ours["SGD"]["art"].checkpoint, xs, ys)
    if record_dir and not report.failures:
        record(record_dir, work, steps, results)
    print("\n%s" % ("all checks passed" if not report.failures
                    else "%d check(s) FAILED" % report.failures))
    return 1 if report.failures else 0


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", help="working directory (default: a temporary one)")
    parser.add_argument("--steps", type=int, default=5,
                        help="training steps before and after each save (default 5)")
    parser.add_argument("--record", metavar="DIR",
                        help="copy ORT-written checkpoints and ORT's figures into DIR")
    parser.add_argument("--worker", nargs=2, metavar=("TASKS", "RESULTS"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(*args.worker)
        return 0
    if args.work:
        os.makedirs(args.work, exist_ok=True)
        return orchestrate(os.path.abspath(args.work), args.steps, args.record)
    with tempfile.TemporaryDirectory(prefix="ort-interop-") as work:
        return orchestrate(work, args.steps, args.record)


if __name__ == "__main__":
    sys.exit(main())
