"""What the memory moves save and cost: each model packed plain and with the moves
(update_in_backward + recompute: no gradient buffers, ReLU masks, recomputed activations);
prints the float and int arenas and the train-step time with the moves relative to without,
both timed in this process on the device runtime under CPython, in interleaved rounds (the
best round of each), so the ratio holds on a busy machine. Prints figures, asserts nothing.

    python bench/memory_moves.py [--rounds 3] [--steps 2]
"""
import argparse
import pathlib
import sys
import tempfile
import time
import warnings
from array import array

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "host"), str(ROOT / "device"), str(ROOT / "tests"),
                str(ROOT / "examples" / "kws")]

import onnx  # noqa: E402

import microtrain_host as mh  # noqa: E402
from microtrain import CheckpointState, Module, Optimizer  # noqa: E402
from microtrain import parser as device_blob_parser

MOVES = {"update_in_backward": True, "recompute": True}


def cases():
    """(name, ONNX model, batch, requires_grad, loss): the reference CNNs trained whole at
    batch 4, and the KWS DS-CNN's sparse update at batch 1."""
    warnings.filterwarnings("ignore")
    from reference_models import ds_cnn, lenet, mobilenet_v2_block, tiny_transformer
    from test_models import example
    from torch_reference import export
    for build in (lenet, ds_cnn, mobilenet_v2_block, tiny_transformer):
        ref = build()
        yield ref.name, export(ref.module, example(ref, ref.batch)), ref.batch, None, ref.loss
    model = onnx.load(ROOT / "examples" / "kws" / "ds_cnn_kws.onnx")
    yield ("kws ds_cnn sparse", model, 1, mh.sparse_update(model, True, 1), "CrossEntropyLoss")


def step_timer(directory, steps):
    state = CheckpointState.load_checkpoint(str(directory / "checkpoint"))
    model = Module(str(directory / "model.mtb"), state)
    opt = Optimizer(str(directory / "model.mtb"), model)
    b = model.blob
    x_id, y_id = b.programs["train"].inputs
    x = array("f", [0.25] * b.sizes[x_id])
    y = array("i" if b.dtypes[y_id] == 1 else "f", [1] * b.sizes[y_id])
    model.train()

    def run():
        start = time.perf_counter()
        for _ in range(steps):
            model(x, y)
            opt.step()
            model.lazy_reset_grad()
        return (time.perf_counter() - start) / steps
    return run


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=2)
    args = parser.parse_args()
    print(f"{'model':20s} {'batch':>5s} {'arena plain':>12s} {'arena moves':>12s} "
          f"{'saved':>6s} {'step time moves/plain':>22s}")
    with tempfile.TemporaryDirectory() as tmp:
        for name, model, batch, requires_grad, loss in cases():
            arenas, timers = [], []
            for k, moves in enumerate(({}, MOVES)):
                directory = pathlib.Path(tmp) / f"{name}-{k}".replace(" ", "_")
                art = mh.generate_artifacts(model, requires_grad=requires_grad, loss=loss,
                                            optimizer="SGD", artifact_directory=directory,
                                            batch_size=batch, **moves)
                b = device_blob_parser.load(art.blob)
                arenas.append(4 * (b.float_arena + b.int_arena))
                timers.append(step_timer(directory, args.steps))
            best = [t() for t in timers]
            for _ in range(args.rounds - 1):
                best = [min(best[i], timers[i]()) for i in range(2)]
            print(f"{name:20s} {batch:5d} {arenas[0] / 1024:9.1f} KiB {arenas[1] / 1024:9.1f} KiB "
                  f"{100 * (1 - arenas[1] / arenas[0]):5.0f}% {best[1] / best[0]:21.2f}x",
                  flush=True)


if __name__ == "__main__":
    main()
