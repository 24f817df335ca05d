"""Counted cost on the emulated board: instructions per training step and per multiply-
accumulate on the emulated Cortex-M3 (MicroPython 1.25's qemu port, MPS2-AN385), and the
milliseconds per step that makes at each board profile's clock.

qemu runs with `-icount shift=0,align=off` (deploy.QemuBoard(icount=True)): every emulated
instruction is exactly 1 ns of virtual time, and the board's FPGAIO counter ticks at 25 MHz
of it, so ticks x 40 = instructions, the same on every run: a regression shows as a number,
not as noise. The device side (bench/board_step.py, bench/board_kernels.py) reads the counter
around a steady-state step, after a warm-up step. The ms columns assume one instruction per
cycle; real Cortex-M3/M4 cores take ~1.1-1.5 cycles per instruction (shared/FACTS.md), and
other cores (Xtensa; an FPU) run other code: an estimate. Prints figures; asserts nothing.

    python3 bench/board_cost.py [--quick] [--steps N] [--no-kws] [--only NAME] [--firmware ELF]
                                [--no-kernels] [--native ARCH] [--float-native ARCH]
                                [--heap BYTES] [--profile] [--board NAME]

--quick (CI): the kernels and the digits MLP only. --heap BYTES: each run starts with only
that much free heap (a filler takes the rest): whether a step fits a board of that heap.
--native armv6m|armv7m: the steps with the native int8 module (device/native,
scripts/build_natmod.sh) beside the kernels, as deploy ships it: kernels/fastpath.py picks
its Gemm and Conv over the viper ones (checked: the run stops when the board's int8 Gemm or
Conv is not the module's). --float-native armv6m|armv7m: the steps with the native float
module (device/native/float, build_natmod.sh --float) beside the kernels, as deploy ships it
(the runtime keeps the switch of the families it serves): its Gemm and Conv kernels and
optimizer updates (checked as for --native). --no-kernels: the steps only. --board qemu-mps2-an386:
count on the emulated Cortex-M4F instead (floats in its FPU: what boards with one run), the
runtime compiled for armv7emsp.
"""
import argparse
import pathlib
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent
BENCH = pathlib.Path(__file__).resolve().parent
sys.path[:0] = [str(ROOT / "host"), str(ROOT / "device"), str(ROOT / "tests"),
                str(ROOT / "examples" / "kws")]
from microtrain_host import generate_artifacts  # noqa: E402
from microtrain_host.tools import boards, deploy, runtime, step_cost  # noqa: E402

BOARD = "qemu-mps2-an385"
FPU_BOARD = "qemu-mps2-an386"
DIGITS = ROOT / "examples" / "digits"
PER_TICK = deploy.QemuBoard.INSTRUCTIONS_PER_TICK


class Case:
    """A step to count: the files for the ROM filesystem ({name: local path}), the device
    script's settings, and the blob whose MACs the cost model counts."""

    def __init__(self, name, kind, blob, files, x, x_type, y=None):
        self.name, self.kind, self.blob = name, kind, pathlib.Path(blob)
        self.files = dict(files, **{"model.mtb": blob})
        self.settings = (f"KIND = {kind!r}\nBLOB = 'model.mtb'\nX = {x!r}\nX_TYPE = "
                         f"{x_type!r}\nY = {y!r}\n")


def run_on_board(tmp, sources, files, script, firmware, timeout=1800, board=BOARD):
    """Run `script` (text) on the emulated board (profile `board`) under icount, the device
    package's `sources` (compiled for its architecture) and `files` ({name: path}) in its ROM
    filesystem. Returns its stdout."""
    tmp = pathlib.Path(tmp)
    rom = tmp / "rom"
    profile = boards.load_board(board)
    runtime.compile_runtime(sources, profile["mpy_arch"], profile["mpy_version"], rom)
    for name, path in files.items():
        (rom / name).write_bytes(pathlib.Path(path).read_bytes())
    plan = deploy.Plan(profile, "romfs", tmp, {}, None, None, None, None)
    plan.romfs_image = tmp / "bench.romfs"
    plan.romfs_image.write_bytes(runtime.romfs_image(rom))
    path = tmp / "count.py"
    path.write_text(script)
    with deploy.QemuBoard(firmware, board=board, rom=plan.romfs_image, icount=True) as qemu:
        # mpremote's whole chain but the fetch of a trained checkpoint
        command = deploy.mpremote_command(plan, qemu.port, path, rom_loaded=True)
        proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0 or "Traceback" in proc.stdout:
        raise BoardRunFailed(proc.stdout + proc.stderr)
    return proc.stdout


class BoardRunFailed(Exception):
    """A board run that ended with an exception (its output is the message)."""

    def last_line(self):
        lines = [line for line in str(self).splitlines() if line.strip()]
        return lines[-1] if lines else "no output"


def whole_package():
    package = runtime.device_package_dir()
    return runtime.package_sources(sorted(str(p.relative_to(package))
                                          for p in (package / "microtrain").rglob("*.py")))


def count_kernels(firmware, board=BOARD):
    """[(family, shape, MACs, instructions)] of bench/board_kernels.py; for the optimizer
    updates (family SGD, AdamW) the parameters updated instead of MACs."""
    with tempfile.TemporaryDirectory(prefix="board-cost-") as tmp:
        out = run_on_board(tmp, whole_package(), {},
                           (BENCH / "board_kernels.py").read_text(), firmware, board=board)
    if "fast True" not in out:
        raise SystemExit(f"the board's int8 kernels are not the viper ones:\n{out}")
    rows = []
    for line in out.splitlines():
        if line.startswith(("kernel ", "update ")):
            family, shape, units, ticks = line.split(" ", 1)[1].split("|")
            rows.append((family, shape, int(units), int(ticks) * PER_TICK))
    return rows


# appended to the step script with --native: whether fastpath picked the module's kernels
# (a trimmed runtime keeps only the int8 kernels its blob calls: Conv, Gemm or both)
PICKED = ("\nfrom microtrain.kernels import qlinear, qlinear_native\n"
          "print('native', [getattr(qlinear, k) is getattr(qlinear_native, k)\n"
          "                 for k in ('qlinear_gemm', 'qlinear_conv') if hasattr(qlinear, k)])\n")
# ... with --float-native: the float module's kernels the runtime calls (Gemm, updates,
# reduce_sum, relu), the train call's gradient check and its input copy
FLOAT_PICKED = ("\nimport sys\nfrom microtrain import feed, module\n"
                "from microtrain.kernels import float_native\n"
                "families = [sys.modules.get('microtrain.kernels.' + f)\n"
                "            for f in ('dense', 'optim', 'reduce', 'activation')]\n"
                "print('native', [getattr(f, k) is getattr(float_native, k)\n"
                "                 for f in families if f is not None for k in f._pure]\n"
                "      + [module.largest_abs is float_native.largest_abs,\n"
                "         feed._LOAD is float_native.load_floats])\n")


# prepended with --heap: a filler that leaves the run HEAP bytes of free heap, as a board
# with that heap would (the filler's own object header is the slack)
FILLER = ("import gc\ngc.collect()\n"
          "_filler = bytearray(max(0, gc.mem_free() - HEAP - 16))\n")


def count_step(case, steps, firmware, native=None, heap=None, float_native=None,
               profile=None, board=BOARD):
    """(instructions per counted step, of which the optimizer update; means over the steps),
    and the heap the run keeps live after them. native, float_native: the native modules'
    .mpy to put beside the kernels. heap: run with only this many bytes of free heap.
    profile: a dict that gets {kernel name: (instructions per step, calls per step)}."""
    # the model's minimal runtime as deploy copies it, plus the loader of a blob given as a
    # buffer (board_step.py reads it in place from flash) and, for inference, the session
    carried = {runtime.NATIVE_FLOAT_MODULE: float_native} if float_native else {}
    sources = runtime.minimal_sources(case.blob, native=carried)
    sources.update(runtime.package_sources(
        ["microtrain/inplace.py"] + (["microtrain/inference.py"] if case.kind == "infer" else [])))
    files, script = dict(case.files), (BENCH / "board_step.py").read_text()
    if native:
        files["microtrain/kernels/qlinear_native.mpy"] = native
        script += PICKED
    if float_native:
        files[runtime.NATIVE_FLOAT_MODULE] = float_native
        script += FLOAT_PICKED
    with tempfile.TemporaryDirectory(prefix="board-cost-") as tmp:
        prefix = f"HEAP = {heap}\n" + FILLER if heap else ""
        settings = f"STEPS = {steps}\nPROFILE = {profile is not None}\n" + case.settings
        out = run_on_board(tmp, sources, files, prefix + settings + script, firmware,
                           board=board)
    picked = [line for line in out.splitlines() if line.startswith("native ")]
    if (native or float_native) and not (picked and "True" in picked[0]
                                         and "False" not in picked[0]):
        raise SystemExit(f"{case.name}: the board's kernels are not the native module's:"
                         f"\n{out}")
    ticks = [line.split()[1:] for line in out.splitlines() if line.startswith("ticks ")]
    heap = [int(line.split()[1]) for line in out.splitlines() if line.startswith("heap ")]
    if len(ticks) != steps or not heap:
        raise SystemExit(f"{case.name}: expected {steps} counted steps:\n{out}")
    step, update = (sum(int(t[i]) for t in ticks) * PER_TICK / steps for i in (0, 1))
    if profile is not None:
        for line in out.splitlines():
            if line.startswith("kernel "):
                _, name, count, calls = line.split()
                profile[name] = (int(count) * PER_TICK / steps, int(calls) // steps)
    return step, update, heap[0]


def print_profile(case, count, profile):
    """A step's instructions per kernel, largest first; the rest: the runtime's own
    bytecode between the kernels (Module.__call__'s checks, Optimizer.step's)."""
    print(f"\n{case.name}: {count:,.0f} instructions per step (profiled)")
    for name, (spent, calls) in sorted(profile.items(), key=lambda kv: -kv[1][0]):
        print(f"  {name:40s} {spent:12,.0f} {spent / count:6.1%} {calls:4d} calls")
    rest = count - sum(spent for spent, _ in profile.values())
    print(f"  {'(outside the kernels)':40s} {rest:12,.0f} {rest / count:6.1%}")


def digits_cases(tmp):
    data = np.load(DIGITS / "digits.npz")
    x = tmp / "digits_x.f32"
    y = tmp / "digits_y.i32"
    x.write_bytes(data["x_train"][:8].astype("<f4").tobytes())
    y.write_bytes(data["y_train"][:8].astype("<i4").tobytes())
    cases = []
    for optimizer, lr in (("SGD", 0.1), ("AdamW", 0.01)):
        out = tmp / f"digits_{optimizer}"
        generate_artifacts(str(DIGITS / "mlp.onnx"), loss="CrossEntropyLoss",
                           optimizer=optimizer, artifact_directory=str(out), batch_size=8,
                           optimizer_options={"learning_rate": lr})
        cases.append(Case(f"digits MLP, batch 8, {optimizer}", "train", out / "model.mtb",
                          {"checkpoint": out / "checkpoint", "x.f32": x, "y.i32": y},
                          "x.f32", "f", "y.i32"))
    return cases


def lenet_cases(tmp):
    from conftest import lenet_board_artifacts
    cases = []
    for optimizer in ("SGD", "AdamW"):
        where = tmp / f"lenet_{optimizer}"
        where.mkdir()
        artifacts, _ = lenet_board_artifacts(where, optimizer, 1)
        data = np.load(where / "data.npz")
        (where / "x.f32").write_bytes(data["x_train"].astype("<f4").tobytes())
        (where / "y.i32").write_bytes(data["y_train"].astype("<i4").tobytes())
        cases.append(Case(f"LeNet CNN, batch 4, {optimizer}", "train",
                          artifacts / "model.mtb",
                          {"checkpoint": artifacts / "checkpoint", "x.f32": where / "x.f32",
                           "y.i32": where / "y.i32"}, "x.f32", "f", "y.i32"))
    return cases


def kws_cases(tmp, **calibration):
    """The KWS DS-CNN's int8 inference (examples/kws/quantize.py's calibrated backbone;
    `calibration`: its calibrate()'s steps and batch, when not its own) and its integer
    personalisation steps at batch 1 ("int8 last", "int8 sparse" of
    examples/kws/personalise.py), on the first personalisation sample."""
    import make_data
    import personalise
    import quantize
    from microtrain_host.formats.checkpoint import write_checkpoint
    from microtrain_host.quant.inttrain import (int8_training_artifacts, int8_training_model,
                                                quantize_input)
    qdq, int8_blob = quantize.calibrate(tmp / "kws_backbone", **calibration)
    sample = make_data.personalisation_set()
    x, y = sample["x_train"][:1], sample["y_train"][:1]
    (tmp / "kws_x.f32").write_bytes(x.astype("<f4").tobytes())
    (tmp / "kws_y.i32").write_bytes(y.astype("<i4").tobytes())
    cases = [Case("KWS DS-CNN int8 inference", "infer", int8_blob,
                  {"x.f32": tmp / "kws_x.f32"}, "x.f32", "f")]
    for config in ("int8 last", "int8 sparse"):
        out = tmp / config.replace(" ", "_")
        trained = personalise.INT8[config]
        info = int8_training_artifacts(qdq, out, 0.003, **trained)
        # the checkpoint as personalise.int8_pack writes it: the new classifier at zero
        params = int8_training_model(qdq, True, **trained)[4]
        for name in (info["weight"], info["bias"]):
            params[name] = np.zeros_like(params[name])
        write_checkpoint(out / "checkpoint", params, {}, keep_integers=True)
        q = np.asarray(quantize_input(x, info))
        (out / "x.q8").write_bytes(q.tobytes())
        cases.append(Case(f"KWS DS-CNN {config}, batch 1", "train", info["blob"],
                          {"checkpoint": out / "checkpoint", "x.q8": out / "x.q8",
                           "y.i32": tmp / "kws_y.i32"}, "x.q8",
                          "b" if q.dtype == np.int8 else "B", "y.i32"))
    return cases


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true",
                    help="the kernels and the digits MLP only (CI)")
    ap.add_argument("--steps", type=int, default=3,
                    help="counted steps per case, after the warm-up (default 3)")
    ap.add_argument("--no-kws", action="store_true", help="leave out the KWS DS-CNN cases "
                                                          "(their calibration takes minutes)")
    ap.add_argument("--only", help="count only the steps whose name contains this")
    ap.add_argument("--board", choices=(BOARD, FPU_BOARD), default=BOARD,
                    help=f"the emulated board to count on: {BOARD} (Cortex-M3, floats in "
                         f"software; default) or {FPU_BOARD} (Cortex-M4F, floats in its FPU, "
                         f".mpy for armv7emsp; scripts/build_qemu_board.sh MPS2_AN386)")
    ap.add_argument("--firmware", help="the emulated board's firmware (default: its "
                                       "profile's variable, $MICROTRAIN_QEMU_FIRMWARE or "
                                       "$MICROTRAIN_QEMU_M4_FIRMWARE, then its build)")
    ap.add_argument("--no-kernels", action="store_true",
                    help="leave out the per-kernel table (the steps only)")
    ap.add_argument("--heap", type=int, help="run each step with only this many bytes of "
                                              "free heap (a board's heap; default: all)")
    ap.add_argument("--native", choices=("armv6m", "armv7m"),
                    help="count the steps with this build of the native int8 module")
    ap.add_argument("--float-native", choices=("armv6m", "armv7m", "armv7emsp"),
                    help="count the steps with this build of the native float module")
    ap.add_argument("--profile", action="store_true",
                    help="also each training step's instructions per kernel (wrapped: "
                         "the profiled steps' totals run a little over the plain count)")
    args = ap.parse_args()
    native = float_native = None
    if args.native:
        native = subprocess.run(["bash", str(ROOT / "scripts" / "build_natmod.sh"), args.native],
                                check=True, capture_output=True, text=True).stdout.split()[-1]
    if args.float_native:
        float_native = subprocess.run(["bash", str(ROOT / "scripts" / "build_natmod.sh"),
                                       "--float", args.float_native], check=True,
                                      capture_output=True, text=True).stdout.split()[-1]
    steps = args.steps
    started = time.monotonic()
    counted_on = boards.load_board(args.board)
    print(f"counted on the {counted_on['title']} (qemu-system-arm -machine "
          f"{counted_on['qemu']['machine']} -icount "
          f"shift=0,align=off; FPGAIO counter x {PER_TICK} = instructions); steps: the mean "
          f"of {steps} after a warm-up step\n")

    if not args.no_kernels:
        print(f"{'kernel family':16s} {'shape':26s} {'MACs':>9s} {'instructions':>13s} "
              f"{'per MAC':>8s}  (optimizer updates: per parameter)")
        families = {}
        for family, shape, units, count in count_kernels(args.firmware, args.board):
            print(f"{family:16s} {shape:26s} {units:9,d} {count:13,d} {count / units:8.1f}")
            total = families.setdefault(family, [0, 0])
            total[0] += units
            total[1] += count
        # a family's figure: all its counted instructions over all its MACs (parameters);
        # step_cost holds these, rounded, from the run the README shows
        print("\nper family (all shapes): counted now / step_cost's figure")
        model = dict(step_cost.INSTRUCTIONS_PER_MAC, **step_cost.INSTRUCTIONS_PER_UPDATE)
        for family, (units, count) in families.items():
            print(f"  {family:16s} {count / units:8.1f} / {model[family]:g}")

    with tempfile.TemporaryDirectory(prefix="board-cost-cases-") as tmp:
        tmp = pathlib.Path(tmp)
        cases = digits_cases(tmp)
        if not args.quick:
            cases += lenet_cases(tmp)
            if not args.no_kws:
                cases += kws_cases(tmp)
        rows, failed = [], []
        for case in [c for c in cases if args.only is None or args.only in c.name]:
            try:
                profile = {} if args.profile else None
                count, update, heap = count_step(case, steps, args.firmware, native, args.heap,
                                                 float_native, profile, args.board)
            except BoardRunFailed as e:   # said below the table, the other cases still run
                failed.append((case, e.last_line()))
                continue
            # {name: build}: the float module's figures are its build's (step_cost._carried)
            work = step_cost.step_work(case.blob, native=dict(
                ([(runtime.NATIVE_MODULE, native)] if native else [])
                + ([(runtime.NATIVE_FLOAT_MODULE, float_native)] if float_native else [])))
            rows.append((case, count, update, heap, work))
            if profile:
                print_profile(case, count, profile)

    print(f"\n{'step':34s} {'instructions':>12s} {'update':>11s} {'MACs':>9s} {'per MAC':>8s} "
          f"{'params':>7s} {'per param':>9s} {'model':>6s} {'heap B':>8s}")
    for case, count, update, heap, work in rows:
        macs, updated = sum(work.macs.values()), sum(work.updates.values())
        # per param: the optimizer update's instructions per parameter element it updates
        per_param = f"{update / updated:9.1f}" if updated else f"{'-':>9s}"
        print(f"{case.name:34s} {count:12,.0f} {update:11,.0f} {macs:9,d} "
              f"{(count - update) / macs:8.1f} {updated:7,d} {per_param} "
              f"{work.instructions() / count:6.0%} {heap:8,d}")
    print("(per MAC: the step less its update, over its MACs; model: the share of the counted "
          "instructions that step_cost's MACs x instructions per MAC + parameters x per "
          "update accounts for, what `microtrain inspect --board` estimates; heap: live "
          "after the steps)")
    for case, reason in failed:
        print(f"not counted: {case.name}: the board run failed: {reason}")

    names = boards.board_names()
    print(f"\nestimated ms per step at the board's clock, one instruction per cycle "
          f"(x {step_cost.CYCLES_PER_INSTRUCTION[0]}-{step_cost.CYCLES_PER_INSTRUCTION[1]} on "
          f"real Cortex-M cores):")
    print(f"{'board':18s} {'MHz':>5s} " + " ".join(f"{i + 1:>9d}" for i in range(len(rows))))
    for name in names:
        board = boards.load_board(name)
        print(f"{name:18s} {board['clock_hz'] / 1e6:5g} "
              + " ".join(f"{1000 * count / board['clock_hz']:9,.1f}" for _, count, *_ in rows))
    for i, (case, *_) in enumerate(rows):
        print(f"  {i + 1}: {case.name}")
    print(f"\n({time.monotonic() - started:.0f} s)")


if __name__ == "__main__":
    main()
