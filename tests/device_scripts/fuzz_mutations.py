# Mutation fuzzing of blobs and checkpoints, the same under CPython and MicroPython.
#   fuzz_mutations.py ARTIFACT_DIR blob|checkpoint SEED FIRST COUNT
# ARTIFACT_DIR holds model.mtb and checkpoint. Mutation i (FIRST <= i < FIRST + COUNT) of
# the chosen file changes a few bytes inside its CRC-protected part and then recomputes the
# CRC over the mutated bytes, so that the structural checks, not the CRC, are what is tested.
# Each mutated file is then loaded and trained for two steps (train, optimizer step, eval,
# save). Prints one line per mutation before trying it ("try i") and its outcome after:
#   trained | refused <error type> | crash <error type>: <message>
# and at the end "arena <largest arena of a loaded mutation> <the unmutated one's>".
# A hang shows as a "try i" with no outcome: the runner kills the process and resumes at i+1.
import struct
import sys
from array import array
from microtrain import CheckpointState, Module, Optimizer, MicrotrainError
from microtrain.crc32 import crc32

INTERESTING = (0, 1, 2, 0x7F, 0x80, 0xFF, 0x7FFF, 0x8000, 0xFFFF, 0x7FFFFFFF, 0x80000000,
               0xFFFFFFFF, 0x10000, 0x3FFFFFFF)


class Draws:
    # A 31-bit linear congruential generator: the same draws on every port (no `random`).
    def __init__(self, seed):
        self.state = (seed * 2654435761 + 12345) & 0x7FFFFFFF

    def below(self, n):
        self.state = (self.state * 1103515245 + 12345) & 0x7FFFFFFF
        return (self.state >> 8) % n


def crc_span(kind, data):
    # (first, end) of the bytes the CRC covers and where the CRC is stored.
    if kind == "blob":  # u32 size, FlatBuffer, CRC-32
        size = struct.unpack_from("<I", data, 0)[0]
        return 4, 4 + size, 4 + size
    return 0, len(data) - 8, len(data) - 8  # checkpoint: FlatBuffer, CRC-32, magic


def mutate(kind, original, index, seed):
    data = bytearray(original)
    first, end, crc_at = crc_span(kind, data)
    draw = Draws(seed * 1000003 + index)
    for _ in range(1 + draw.below(3)):
        how = draw.below(4)
        at = first + draw.below(end - first)
        if how == 0:
            data[at] = draw.below(256)
        elif how == 1:
            data[at] ^= 1 << draw.below(8)
        else:
            at = first + 4 * draw.below((end - first) // 4)  # an aligned u32 field
            old = struct.unpack_from("<I", data, at)[0]
            if how == 2:
                new = INTERESTING[draw.below(len(INTERESTING))]
            else:
                new = (old + draw.below(17) - 8) & 0xFFFFFFFF
            struct.pack_into("<I", data, at, new)
    struct.pack_into("<I", data, crc_at, crc32(memoryview(data)[first:end]) & 0xFFFFFFFF)
    return data


def inputs_for(b, program):
    values = []
    for tid in program.inputs:
        n = b.sizes[tid]
        if b.dtypes[tid] == 1:
            classes = b.num_classes if b.num_classes > 0 else 1
            values.append(array("i", [i % classes for i in range(n)]))
        else:
            values.append(array("f", [((i * 7) % 13 - 6) * 0.1 for i in range(n)]))
    return values


def train(directory, blob_path, checkpoint_path):
    state = CheckpointState.load_checkpoint(checkpoint_path)
    model = Module(blob_path, state)
    optimizer = Optimizer(blob_path, model)
    b = model.blob
    batch = inputs_for(b, b.programs["train"])
    model.train()
    for _ in range(2):
        model(*batch)
        optimizer.step()
        model.lazy_reset_grad()
    if "eval" in b.programs:
        model.eval()
        model(*inputs_for(b, b.programs["eval"]))
    CheckpointState.save_checkpoint(state, directory + "/fuzz_saved", True)
    return len(model.F) + len(model.I)


def main(argv):
    directory, kind, seed, first, count = argv[1], argv[2], int(argv[3]), int(argv[4]), int(argv[5])
    blob = directory + "/model.mtb"
    checkpoint = directory + "/checkpoint"
    baseline = train(directory, blob, checkpoint)
    target = blob if kind == "blob" else checkpoint
    with open(target, "rb") as f:
        original = f.read()
    mutated = directory + ("/fuzz.mtb" if kind == "blob" else "/fuzz_checkpoint")
    largest = 0
    for index in range(first, first + count):
        print("try", index)
        with open(mutated, "wb") as f:
            f.write(mutate(kind, original, index, seed))
        try:
            if kind == "blob":
                arena = train(directory, mutated, checkpoint)
            else:
                arena = train(directory, blob, mutated)
            largest = max(largest, arena)
            print(index, "trained")
        except MicrotrainError as e:
            print(index, "refused", type(e).__name__)
        except Exception as e:  # anything else is a crash the loaders should have prevented
            print(index, "crash", "%s: %s" % (type(e).__name__, e))
    print("arena", largest, baseline)


main(sys.argv)
