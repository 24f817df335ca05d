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
* ORT -> microtrain: checkpoints ORT wrote after N steps (with optimizer state and
  properties) and ORT's nominal checkpoint load in the host reader and the device runtime,
  equal to the bit; the device runtime resumes them and its losses equal ORT's own
  continuation.

Losses must agree within 1e-4 relative (denominator max(|b|, 1e-3)); figures are printed.
Exit status 0 when every check passes, 1 otherwise.

--record DIR copies checkpoints ORT wrote, with what ORT read and computed from them, into
DIR (tests/data/ort-1.19.2 was made so), for the regular test suite, which must not need
onnxruntime-training (tests/test_ort_checkpoints.py).
"""
import argparse
import json
import os
import shutil
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


# ----------------------------------------------------------------------------- worker (venv)


def worker(task_file, result_file):
    import numpy as np
    import onnx
    import onnxruntime
    onnxruntime.set_default_logger_severity(3)
    from onnxruntime.training import artifacts
    from onnxruntime.training.api import CheckpointState, Module, Optimizer

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
    return max((abs(x - y) / max(abs(y), 1e-3) for x, y in zip(a, b)), default=0.0)


def f32_bits(values):
    import numpy as np
    return np.asarray(values, dtype=np.float32).reshape(-1).view(np.uint32)


def same_bits(a, b):
    import numpy as np
    return np.array_equal(f32_bits(a), f32_bits(b))


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
                 for opt in ("AdamW", "SGD")}}
    with open(os.path.join(directory, "expected.json"), "w") as f:
        json.dump(expected, f, indent=1)
    print("recorded ORT's files in %s" % directory)


def orchestrate(work, steps, record_dir=None):
    import numpy as np
    sys.path[:0] = [os.path.join(ROOT, "host"), os.path.join(ROOT, "device")]
    from microtrain import CheckpointState, Module, Optimizer
    from microtrain_host import generate_artifacts
    from microtrain_host.checkpoint import read_checkpoint

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
            if key == "host":
                reference, what = mine["uninterrupted"], "from step 0"
            elif key == "device_with_state":
                reference, what = mine["uninterrupted"][steps:], "resumed with optimizer state"
                got = {n: r["properties"][n] for n in properties}
                expected = {n: (float(np.float32(v)) if isinstance(v, float) else v)
                            for n, v in properties.items()}
                report.check(got == expected, "ORT reads the properties %s" % got)
                if opt == "AdamW":
                    fresh = rel_diff(mine["fresh_moments"], reference)
                    report.check(fresh > TOLERANCE, "(the check can fail: fresh moments instead "
                                 "change the losses by up to %.2e)" % fresh)
            else:
                reference, what = mine["fresh_moments"], "params only (fresh optimizer)"
            diff = rel_diff(r["losses"], reference)
            report.check(diff <= TOLERANCE, "ORT trains on (%s): %d losses, max relative "
                         "difference to microtrain %.2e (first %.6f vs %.6f)"
                         % (what, len(reference), diff, r["losses"][0], reference[0]))
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
            report.check(diff <= TOLERANCE, "device runtime resumes it: %d losses, max "
                         "relative difference to ORT's own continuation %.2e"
                         % (len(resumed), diff))
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
