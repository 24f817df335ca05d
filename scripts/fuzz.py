"""Mutation fuzzing of blobs and checkpoints at scale (the suite runs a few hundred).

    python scripts/fuzz.py [--interpreter cpython|PATH_TO_MICROPYTHON] [--count N] [--seed S]
                           [--only mlp|cnn|rnn|decoder]

Packs the fuzzed models (tests/fuzzing.py: the digits MLP with AdamW, a small CNN with SGD
and momentum, a GRU + LSTM net with AdamW, a ConvTranspose / Resize decoder with SGD), then
mutates each one's blob and checkpoint N times with the CRC-32 recomputed over the mutated bytes, loads and trains every mutation, and prints the counts
of outcomes per file: trained, refused (by microtrain's own error, per type), crashes
(any other exception), hangs and deaths. Exits 1 when anything crashed, hung or died."""
import argparse
import pathlib
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests"))
import conftest  # noqa: E402,F401  (puts host/ and device/ on sys.path)
import fuzzing  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--interpreter", default="cpython",
                        help="cpython, or the path of a MicroPython binary")
    parser.add_argument("--count", type=int, default=5000,
                        help="mutations per file (6 files: 3 models x blob, checkpoint)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--only", help="fuzz only this model (mlp, cnn, rnn or decoder)")
    args = parser.parse_args()
    bad = 0
    with tempfile.TemporaryDirectory() as tmp:
        for name, directory in fuzzing.make_artifacts(pathlib.Path(tmp)).items():
            if args.only and name != args.only:
                continue
            for kind in ("blob", "checkpoint"):
                start = time.time()
                outcomes, examples, arena = fuzzing.fuzz(args.interpreter, directory, kind,
                                                         args.seed, args.count, chunk=500)
                print(f"{name} {kind}: {args.count} mutations in {time.time() - start:.0f} s; "
                      f"largest arena of a loaded mutation {arena[0]} elements "
                      f"(unmutated {arena[1]})")
                for key, n in sorted(outcomes.items(), key=lambda kv: -kv[1]):
                    print(f"  {n:6d}  {key}")
                for key, n in fuzzing.failures(outcomes).items():
                    bad += n
                    print(f"  first {key!r}: mutation {examples[key]} (seed {args.seed})")
                if arena[0] > arena[1]:
                    bad += 1
                    print("  a mutation allocated a larger arena than the unmutated file")
    print("crashes, hangs and deaths:", bad)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
