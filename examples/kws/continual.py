"""Keep learning on the device: the pretrained int8 keyword-spotting DS-CNN learns 12 new
keywords of a new speaker in 4 stages of 3 (10 recordings each), on the device runtime, with
microtrain.continual.Learner: each stage adds 3 classes to a classifier packed with room for
12, captures the new recordings' latent codes (the frozen int8 backbone's output) into a
sample store of 16 KB on the device's filesystem, and trains the classifier in integers on
the whole store - the new keywords and the replayed codes of the earlier ones.

Three modes of the same device program (examples/kws/continual_device.py), same epochs and
learning rate per stage:
  replay     the 4 stages as above
  noreplay   the 4 stages, each trained on its own keywords' samples only (what replay saves)
  joint      the upper bound at each stage: the keywords so far learned in one stage from
             the start, with as many training steps as the staged run took (four runs)
Prints per stage the held-out accuracy on every keyword learned so far and on the earlier
ones, the store's bytes, the forgetting and the peak heap.

  python examples/kws/continual.py                        MicroPython Unix port, 32-bit
        build, the model's minimal runtime (with microtrain.continual) and the blob frozen
        in, a 128 KB heap (what a board would run; the build is cached under .cache/)
  python examples/kws/continual.py --runtime cpython      the device runtime under CPython

Forgetting of a group of keywords: its best held-out accuracy at the end of any stage
minus its accuracy at the end, averaged over the groups before the last (Chaudhry et al.,
2018). Accuracy is over all keywords learned so far, so a group also meets more confusers
as classes are added: the same measure over the joint runs, where nothing learned earlier
can be forgotten, shows how much of it that is. The drop beyond joint training: at each
stage after the first, the joint run's accuracy on the earlier keywords minus the staged
run's, averaged over those stages."""
import argparse
import pathlib
import re
import shutil
import sys

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path[:0] = [str(HERE), str(ROOT / "host"), str(ROOT / "device"), str(ROOT / "scripts")]

import personalise  # noqa: E402

DEVICE_SCRIPT = HERE / "continual_device.py"
MODES = ("replay", "noreplay", "joint")
CLASSES = 12


def pack(directory, lr, calibration_steps=20):
    """The integer training blob of the calibrated int8 backbone, its classifier packed with
    room for 12 classes, none in use (model.mtb, checkpoint, kws_blob.py); returns the info
    of quant/inttrain.py."""
    import quantize
    from microtrain_host.quant.inttrain import int8_training_artifacts
    qdq, _ = quantize.calibrate(directory / "backbone", steps=calibration_steps)
    info = int8_training_artifacts(qdq, directory / "int8", lr, max_classes=CLASSES,
                                   keep_classes=0)
    blob = pathlib.Path(info["blob"]).read_bytes()
    (directory / "model.mtb").write_bytes(blob)
    shutil.copy(info["checkpoint"], directory / "checkpoint")
    (directory / "kws_blob.py").write_text(
        "# The KWS blob (model.mtb) as a bytes constant, frozen into the interpreter: it stays\n"
        "# in the binary as a blob in a board's flash (continual_device.py ... flash).\n"
        "BLOB = %r\n" % blob)
    return info


def run(directory, mode, epochs, lr, runtime, heap, options):
    for old in directory.glob(f"run_{mode}*"):
        shutil.rmtree(old)
    return personalise.run_device(directory, epochs, lr, runtime, True, heap, options,
                                  script=DEVICE_SCRIPT, mode=mode)


def parse(out):
    """[(classes, store bytes, [(right, total) per group])] per stage, peak heap."""
    stages = []
    for m in re.finditer(r"stage \d+ classes (\d+) store (\d+) groups ([\d/ ]+)", out):
        groups = [tuple(int(v) for v in g.split("/")) for g in m.group(3).split()]
        stages.append((int(m.group(1)), int(m.group(2)), groups))
    return stages, int(re.search(r"peak heap (-?\d+)", out).group(1))


def percent(pairs):
    right, total = sum(p[0] for p in pairs), sum(p[1] for p in pairs)
    return 100.0 * right / total


def forgetting(stages):
    """Mean over the groups before the last of (best accuracy at any stage's end - final)."""
    final = stages[-1][2]
    drops = []
    for g in range(len(final) - 1):
        best = max(percent([s[2][g]]) for s in stages if len(s[2]) > g)
        drops.append(best - percent([final[g]]))
    return sum(drops) / len(drops) if drops else 0.0


def beyond_joint(stages, joint):
    """Mean over the stages after the first of (joint accuracy on the earlier keywords -
    the staged run's)."""
    drops = [percent(j[2][:-1]) - percent(s[2][:-1]) for s, j in zip(stages[1:], joint[1:])]
    return sum(drops) / len(drops)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=30, help="epochs per stage (30)")
    parser.add_argument("--lr", type=float, default=0.04,
                        help="integer SGD (QAS) learning rate at each stage's start; it falls "
                             "linearly to a tenth of it by the stage's last epoch (0.04)")
    parser.add_argument("--runtime", choices=("micropython", "cpython"), default="micropython")
    parser.add_argument("--heap", default="128K", help="MicroPython heap (128K)")
    parser.add_argument("--measure-heap", action="store_true",
                        help="MicroPython: first bisect the smallest heap the replay run needs "
                             "(its four stages at one epoch each: the heap does not grow with "
                             "the epochs)")
    parser.add_argument("--build", default=str(HERE / "build" / "continual"))
    args = parser.parse_args()
    directory = pathlib.Path(args.build)
    directory.mkdir(parents=True, exist_ok=True)
    info = pack(directory, args.lr)
    shots, held_out = personalise.write_data(directory, 10, 25, info=info)
    options = ()
    where = "CPython"
    if args.runtime == "micropython":
        options = personalise.build_options(directory, True, True, True,
                                            extra=("microtrain.continual",))
        where = (f"the MicroPython Unix port (32-bit, minimal runtime and blob frozen in, "
                 f"-X heapsize={args.heap})")
    print(f"12 new keywords in 4 stages of 3, {shots // CLASSES} recordings each, "
          f"{held_out // CLASSES} held out each; {args.epochs} epochs per stage, integer SGD "
          f"lr {args.lr} falling to {args.lr / 10:g}; on {where}", flush=True)
    if args.measure_heap and args.runtime == "micropython":
        import measure_heap as heap_tool
        needed, out = heap_tool.needed_heap(
            DEVICE_SCRIPT, [str(directory), "replay", "1", repr(args.lr), "flash", "fresh"],
            frozen=True, high=heap_tool.size(args.heap), options=options)
        if needed is None:
            sys.exit(f"the replay run does not fit in a {args.heap} heap:\n{out}")
        print(f"the replay run needs a heap of {needed} bytes (bisected -X heapsize)",
              flush=True)
    results = {}
    for mode in MODES:
        out = run(directory, mode, args.epochs, args.lr, args.runtime, args.heap, options)
        results[mode] = parse(out)
        stages, peak = results[mode]
        print(f"\n{mode}:")
        for s, (classes, store, groups) in enumerate(stages):
            earlier = groups[:-1]
            print(f"  stage {s + 1}: {classes:2d} keywords, accuracy on all so far "
                  f"{percent(groups):5.1f} %"
                  + (f", on the earlier ones {percent(earlier):5.1f} %" if earlier else "")
                  + f"; sample store {store} bytes")
        print(f"  forgetting {forgetting(stages):.1f} points; peak heap "
              f"{peak if peak >= 0 else '- (CPython)'}{' bytes' if peak >= 0 else ''}",
              flush=True)
    final = {mode: percent(results[mode][0][-1][2]) for mode in MODES}
    joint = results["joint"][0]
    print(f"\nfinal accuracy on all 12 keywords: replay {final['replay']:.1f} %, no replay "
          f"{final['noreplay']:.1f} %, joint training {final['joint']:.1f} % (replay - joint: "
          f"{final['replay'] - final['joint']:+.1f} points)")
    print(f"forgetting: replay {forgetting(results['replay'][0]):.1f} points, no replay "
          f"{forgetting(results['noreplay'][0]):.1f} points; the joint runs "
          f"{forgetting(joint):.1f} points (the larger label space alone)")
    print(f"drop on the earlier keywords beyond joint training: replay "
          f"{beyond_joint(results['replay'][0], joint):+.1f} points, no replay "
          f"{beyond_joint(results['noreplay'][0], joint):+.1f} points")
    print(f"the replay run: sample store {results['replay'][0][-1][1]} bytes of its "
          f"16,384-byte budget, peak heap {results['replay'][1]} bytes")


if __name__ == "__main__":
    main()
