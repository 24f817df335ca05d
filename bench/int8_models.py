"""Issue 22's acceptance models in integer training (tests/int8_acceptance_models.py: the
MLPerf Tiny four, an MLP, a 1-D conv IMU classifier, a conv -> Flatten -> Gemm net), each
in two configurations: the classifier alone, and the sparse update (--train-biases and
--train-last of its last block). For each:

* packs it with the one command (int8pack.pack_int8 = `microtrain pack --int8 --calibrate`,
  32 synthetic calibration samples; batch 1, BatchNorm1d folded as any BatchNorm); a
  refusal is printed in the table;
* trains --steps integer steps on synthetic learnable data (one batch a step) on CPython,
  on the MicroPython Unix port with the viper kernels (every step under heap_lock()) and
  with the pure-Python kernels (tests/int8_acceptance_run.py, two runs at a time), and
  compares their parameters, each step's loss ints and checkpoints byte for byte
  (--compare-steps K: over the first K steps only, then all the steps on the viper kernels);
* the loss: the mean of the first 5 steps' losses and of the last 5, as the viper kernels'
  run reports them (from the same loss ints as the others when they ran all the steps);
* the arenas as `microtrain inspect` reports them ("all arenas": float + int32 + int8), the
  int8 weights read in place (a buffer for a blob file, none in ROMFS) and the fit check's
  predicted heap (`inspect --board`, tools/boards.predict, the board's default placement)
  on rp2040-pico, esp32 and qemu-mps2-an385;
* one integer step against one float step (the float pack of the same ONNX model training
  the same layers: sparse_update's requires_grad, SGD; at batch 2 where float training's
  BatchNorm refuses one value per channel, as the autoencoder's) in one MicroPython process
  (bench/int8_models_device.py, best of --rounds after a warm-up) and their ratio.

Prints a markdown table; asserts nothing.

    python bench/int8_models.py [--models a,b] [--steps 50] [--compare-steps K] [--rounds 2]
                                [--micropython PATH]
"""
import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "device"), str(ROOT / "host"), str(ROOT / "tests")]

BOARDS = ("rp2040-pico", "esp32", "qemu-mps2-an385")


def arena_bytes(blob):
    """(all arenas, int8 weights read in place) in bytes, as inspect computes them."""
    from microtrain import parser as device_blob_parser
    b = device_blob_parser.load(str(blob))
    return (4 * (b.float_arena + b.int_arena) + b.byte_arena,
            sum(b.sizes[t] for t in b.in_place))


def predicted_heaps(directory):
    from microtrain_host.tools import boards
    return {name: boards.predict(Path(directory), boards.load_board(name)) for name in BOARDS}


def float_pack(model, options, loss, batch, out):
    """(blob, checkpoint, batch) of the float pack training what the integer configuration
    trains (sparse_update's choice; the classifier alone is its last layer). Float training
    keeps BatchNormalization in training mode, which refuses one value per channel (the
    autoencoder's BatchNorm1d at batch 1): then batch 2, said in the table."""
    import microtrain_host as mh
    from microtrain_host.errors import UnsupportedOpError
    from microtrain_host.pipeline.sparse import sparse_update
    chosen = sparse_update(str(model), options.get("train_biases", False),
                           options.get("train_last") or 1)
    try:
        mh.generate_artifacts(str(model), requires_grad=chosen, artifact_directory=out,
                              batch_size=batch, optimizer="SGD", loss=loss)
    except UnsupportedOpError as e:
        if batch != 1 or "more than one value per channel" not in str(e):
            raise
        return float_pack(model, options, loss, 2, out)
    return out / "model.mtb", out / "checkpoint", batch


def step_times(micropython, info, float_blob, float_checkpoint, rounds):
    env = dict(os.environ, MICROPYPATH=f"{ROOT / 'device'}:{ROOT / 'bench'}")
    out = subprocess.run([micropython, "-X", "heapsize=64M",
                          str(ROOT / "bench" / "int8_models_device.py"), info["blob"],
                          info["checkpoint"], str(float_blob), str(float_checkpoint),
                          str(rounds)], capture_output=True, text=True, env=env,
                         check=True).stdout.split()
    return float(out[0]), float(out[1]), out[2] == "True"


def one_model(name, args, tmp):
    import int8_acceptance_run as run
    from int8_acceptance_models import ACCEPTANCE_MODELS
    m = ACCEPTANCE_MODELS[name]
    batch = run.BATCH.get(name, 1)
    model, calibration, x, y = run.prepare(name, tmp, args.steps)
    rows = []
    for config, options in run.configs(name).items():
        t0 = time.time()
        work = tmp / config
        work.mkdir()
        info = run.pack(name, config, model, calibration, work / "int8")
        row = dict(model=name, config=config, batch=batch, lr=run.LEARNING_RATES[name])
        if isinstance(info, str):
            rows.append(dict(row, refused=info))
            print(f"{name} {config}: refused: {info}", flush=True)
            continue
        (work / "data.bin").write_bytes(run.records(info, x, y, batch))
        compare = min(args.compare_steps or args.steps, args.steps)
        outs, identical = run.train_everywhere(args.micropython, info, work / "data.bin",
                                               compare, work)
        if compare < args.steps:     # the loss of all the steps: the viper kernels' run
            outs["viper"] = run.run_steps("viper", args.micropython, info, work / "data.bin",
                                          args.steps, work / "all.ckpt")
        viper_locked = outs["viper"].startswith("locked True viper True intgrad viper True")
        first, last = run.falls(run.losses(outs["viper"]))
        arenas, in_place = arena_bytes(info["blob"])
        fits = predicted_heaps(work / "int8")
        float_blob, float_checkpoint, float_batch = float_pack(model, options, m.loss, batch,
                                                              work / "float")
        int_us, float_us, locked = step_times(args.micropython, info, float_blob,
                                              float_checkpoint, args.rounds)
        rows.append(dict(row, parameters=len(info["parameters"]), first=first, last=last,
                         identical=identical, compared=compare, locked=viper_locked and locked, arenas=arenas,
                         in_place=in_place, fits=fits, int_us=int_us, float_us=float_us,
                         float_batch=float_batch,
                         seconds=time.time() - t0))
        print(f"{name} {config}: loss {first:.4f} -> {last:.4f}, identical {identical}, "
              f"int {int_us / 1000:.1f} ms, float {float_us / 1000:.1f} ms, "
              f"{time.time() - t0:.0f} s", flush=True)
    return rows


def _kb(n):
    return f"{n / 1024:.1f}"


def table(rows):
    head = ("| model | config | batch, lr | trained tensors | loss first 5 -> last 5 | "
            "CPython = viper = pure | arenas KiB (+ weights in place) | "
            + " | ".join(f"heap {b} KiB" for b in BOARDS)
            + " | int step ms | float step ms | float / int |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        start = f"| {r['model']} | {r['config']} | {r['batch']}, {r['lr']:g} |"
        if "refused" in r:
            lines.append(start + f" refused: {r['refused']} |" + " |" * 9)
            continue
        heaps = " | ".join(f"{_kb(f.needed)}" + ("" if f.fits else " (no fit)")
                           for f in r["fits"].values())
        same = (("yes" if r["identical"] else "NO") + f" ({r['compared']} steps)"
                + (", heap locked" if r["locked"] else ""))
        lines.append(start + f" {r['parameters']} | {r['first']:.3f} -> {r['last']:.3f} | "
                     f"{same} | {_kb(r['arenas'])} (+{_kb(r['in_place'])}) | {heaps} | "
                     f"{r['int_us'] / 1000:.1f} | {r['float_us'] / 1000:.1f}"
                     + (f" (batch {r['float_batch']})" if r["float_batch"] != r["batch"] else "")
                     + " | "
                     f"{r['float_us'] / r['int_us']:.1f}x |")
    return "\n".join(lines)


def main():
    from int8_acceptance_models import ACCEPTANCE_MODELS
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default=",".join(ACCEPTANCE_MODELS))
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--compare-steps", type=int, default=0,
                    help="compare the three runtimes over this many steps only (default: "
                         "--steps); the loss columns then come from a run of --steps on the "
                         "viper kernels")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--micropython", default=os.environ.get(
        "MICROTRAIN_MICROPYTHON", str(ROOT / ".cache" / "micropython" / "micropython")))
    args = ap.parse_args()
    started = time.time()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models.split(","):
            rows += one_model(name, args, Path(tmp) / name)
    print()
    print(f"{args.steps} integer steps per configuration; step times: MicroPython, best of "
          f"{args.rounds}; bench {time.time() - started:.0f} s")
    print()
    print(table(rows))


if __name__ == "__main__":
    main()
