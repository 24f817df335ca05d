# Mutation fuzzing of blobs and checkpoints, the same under CPython and MicroPython.
#   fuzz_mutations.py ARTIFACT_DIR blob|checkpoint|inference SEED FIRST COUNT [trace]
# ARTIFACT_DIR holds model.mtb and checkpoint (a training blob: float or integer training),
# or model.mtb alone (inference: an int8 inference blob). Mutation i (FIRST <= i < FIRST +
# COUNT) of the chosen file changes a few bytes inside its CRC-protected part and then
# recomputes the CRC over the mutated bytes, so that the structural checks, not the CRC, are
# what is tested. Each mutated blob or checkpoint is then loaded and trained for two steps
# (train, optimizer step, eval, save); a mutated inference blob is loaded into an
# InferenceSession and run twice. Then the state must be finite: every float32 parameter,
# running statistic and optimizer moment (a QAT observer's range may be infinite, not NaN),
# the losses and the float outputs (integer state has nothing non-finite). Prints one line
# per mutation before trying it ("try i") and its outcome after:
#   trained | refused <error type> | crash <error type>: <message> | nonfinite <where>
# and at the end "arena <largest arena of a loaded mutation> <the unmutated one's>".
# A hang shows as a "try i" with no outcome: the runner kills the process and resumes at i+1.
# trace: also print a crash's traceback (to diagnose one mutation).
import struct
import sys
from array import array
from microtrain import CheckpointState, InferenceSession, Module, Optimizer, MicrotrainError
from microtrain.blob import FLOAT, INT8, INT32, UINT8, ROLE_OPTIMIZER_STATE, ROLE_PARAM
from microtrain.crc32 import crc32
from draws import Draws

INTERESTING = (0, 1, 2, 0x7F, 0x80, 0xFF, 0x7FFF, 0x8000, 0xFFFF, 0x7FFFFFFF, 0x80000000,
               0xFFFFFFFF, 0x10000, 0x3FFFFFFF)


def crc_span(kind, data):
    # (first, end) of the bytes the CRC covers and where the CRC is stored.
    if kind != "checkpoint":  # u32 size, FlatBuffer, CRC-32
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
        dtype = b.dtypes[tid]
        if dtype == INT32:
            classes = b.num_classes if b.num_classes > 0 else 1
            values.append(array("i", [i % classes for i in range(n)]))
        elif dtype == INT8 or dtype == UINT8:      # a quantized input (integer training)
            low = -128 if dtype == INT8 else 0
            values.append(array("b" if dtype == INT8 else "B",
                                [low + (i * 37) % 256 for i in range(n)]))
        else:
            values.append(array("f", [((i * 7) % 13 - 6) * 0.1 for i in range(n)]))
    return values


class NonFinite(Exception):
    pass


def _finite(values, where, infinite_ok=False):
    # v - v is 0.0 for a finite float, NaN for an infinite one or a NaN (no math.isfinite
    # needed on a port without it)
    for i in range(len(values)):
        v = values[i]
        if v != v or not (infinite_ok or v - v == 0):
            raise NonFinite("%s: %r at %d" % (where, v, i))


def _outputs(result, where):
    # a loss (a number) or a list of the loss and views of the other outputs
    if isinstance(result, (list, tuple)):
        for k in range(len(result)):
            item = result[k]
            if isinstance(item, float):
                _finite((item,), "%s output %d" % (where, k))
            elif len(item) and isinstance(item[0], float):     # a view of the float arena
                _finite(item, "%s output %d" % (where, k))
    else:
        _finite((result,), where)


def check_state(b, F, state):
    # every float32 parameter, running statistic and optimizer moment in the arena (a QAT
    # observer's range may hold inf before it has seen a batch, never NaN), and the state
    # save_checkpoint writes (its parameters' and moments' views)
    for tid in range(len(b.names)):
        if b.dtypes[tid] == FLOAT and (b.roles[tid] == ROLE_PARAM or
                                       b.roles[tid] == ROLE_OPTIMIZER_STATE):
            off, n = b.offsets[tid], b.sizes[tid]
            name = b.names[tid]
            _finite(F[off:off + n], name, name.endswith(".observer_range"))
    if state is None:
        return
    for name in state.parameters:
        p = state.parameters[name]
        if getattr(p, "data_type", 1) == 1:
            _finite(p.data, "checkpoint " + name, name.endswith(".observer_range"))
    for name in state.momentums:
        moments = state.momentums[name]
        for k in range(len(moments)):
            _finite(moments[k], "checkpoint %s moment %d" % (name, k))


def train(directory, blob_path, checkpoint_path):
    state = CheckpointState.load_checkpoint(checkpoint_path)
    model = Module(blob_path, state)
    optimizer = Optimizer(blob_path, model)
    b = model.blob
    batch = inputs_for(b, b.programs["train"])
    model.train()
    for _ in range(2):
        _outputs(model(*batch), "train loss")
        optimizer.step()
        model.lazy_reset_grad()
    check_state(b, model.F, state)
    if "eval" in b.programs:
        model.eval()
        _outputs(model(*inputs_for(b, b.programs["eval"])), "eval")
    CheckpointState.save_checkpoint(state, directory + "/fuzz_saved", True)
    return len(model.F) + len(model.I) + (len(b.Q) if b.Q is not None else 0)


def infer(blob_path):
    session = InferenceSession(blob_path)
    b = session.blob
    batch = inputs_for(b, b.programs["infer"])
    for _ in range(2):
        _finite(session.run(*batch), "inference output")
    check_state(b, session.F, None)
    return len(session.F) + len(session.I) + (len(b.Q) if b.Q is not None else 0)


def main(argv):
    directory, kind, seed, first, count = argv[1], argv[2], int(argv[3]), int(argv[4]), int(argv[5])
    trace = argv[6:] == ["trace"]
    blob = directory + "/model.mtb"
    checkpoint = directory + "/checkpoint"
    baseline = infer(blob) if kind == "inference" else train(directory, blob, checkpoint)
    target = checkpoint if kind == "checkpoint" else blob
    with open(target, "rb") as f:
        original = f.read()
    mutated = directory + ("/fuzz.mtb" if kind == "blob" else "/fuzz_checkpoint")
    largest = 0
    for index in range(first, first + count):
        print("try", index)
        with open(mutated, "wb") as f:
            f.write(mutate(kind, original, index, seed))
        try:
            if kind == "inference":
                arena = infer(mutated)
            elif kind == "blob":
                arena = train(directory, mutated, checkpoint)
            else:
                arena = train(directory, blob, mutated)
            largest = max(largest, arena)
            print(index, "trained")
        except NonFinite as e:
            print(index, "nonfinite", e)
        except MicrotrainError as e:
            print(index, "refused", type(e).__name__)
        except Exception as e:  # anything else is a crash the loaders should have prevented
            print(index, "crash", "%s: %s" % (type(e).__name__, e))
            if trace:
                if hasattr(sys, "print_exception"):
                    sys.print_exception(e)
                else:
                    import traceback
                    traceback.print_exc()
    print("arena", largest, baseline)


main(sys.argv)
