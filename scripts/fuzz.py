"""Mutation fuzzing of blobs and checkpoints at scale (the suite runs a few hundred).

    python scripts/fuzz.py [--interpreter cpython|PATH_TO_MICROPYTHON] [--count N] [--seed S]
                           [--only mlp|cnn|rnn|decoder|int8|inttrain[,...]]

Packs the fuzzed models (tests/fuzzing.py: the digits MLP with AdamW, a small CNN with SGD
and momentum, a GRU + LSTM net with AdamW, a ConvTranspose / Resize decoder with SGD; a
small QAT-trained DS-CNN's int8 inference blob, and its integer-training blob with the
checkpoint the device saved with momentum velocities), then mutates each float or
integer-training model's blob and checkpoint, and the int8 inference blob, N times with
the CRC-32 recomputed over the mutated bytes, loads and trains (or runs) every mutation,
and prints the counts of outcomes per file: trained (or ran), refused (by microtrain's own
error, per type), crashes (any other exception), non-finite state after a mutation that
loaded and trained (nonfinite <where>), hangs and deaths. Exits 1 when anything crashed,
went non-finite, hung or died.

Issue 21's acceptance: --only int8,inttrain --count 10000 (CPython) and --count 1000
--interpreter PATH_TO_MICROPYTHON: 0 crashes, 0 non-finite."""
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
                        help="mutations per file (11 files: 5 models x blob, checkpoint; "
                             "the int8 inference blob)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--only", help="fuzz only these models, comma-separated (mlp, cnn, "
                                           "rnn, decoder, int8, inttrain)")
    args = parser.parse_args()
    only = args.only.split(",") if args.only else None
    bad = 0
    with tempfile.TemporaryDirectory() as tmp:
        artifacts = {}
        if not only or set(only) & {"mlp", "cnn", "rnn", "decoder"}:
            artifacts.update(fuzzing.make_artifacts(pathlib.Path(tmp)))
        if not only or set(only) & {"int8", "inttrain"}:
            artifacts.update(fuzzing.make_int_artifacts(pathlib.Path(tmp)))
        unknown = set(only or ()) - set(artifacts)
        if unknown:
            parser.error("no model named %s" % ", ".join(sorted(unknown)))
        for name, directory in artifacts.items():
            if only and name not in only:
                continue
            for kind in fuzzing.kinds(name):
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
                    shown = " ".join(map(str, examples[key][:20]))
                    more = " ..." if len(examples[key]) > 20 else ""
                    print(f"  {key!r}: mutations {shown}{more} (seed {args.seed})")
                if arena[0] > arena[1]:
                    bad += 1
                    print("  a mutation allocated a larger arena than the unmutated file")
    print("crashes, non-finite states, hangs and deaths:", bad)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
