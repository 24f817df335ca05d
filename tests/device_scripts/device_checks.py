# Device checks that run unchanged under CPython and MicroPython.
#   device_checks.py ARTIFACT_DIR     (artifacts of a CrossEntropy MLP packed with batch 8)
# ARTIFACT_DIR may also hold ort_checkpoint, a checkpoint onnxruntime-training wrote (no
# CRC-32 trailer), for the corruption checks of trailer-less files.
# Prints one line per check and a closing "N passed, M failed".
import gc
import sys
from array import array
from microtrain import (BlobError, CheckpointError, CheckpointState, InputError, Module,
                        Optimizer, ParameterError, TrainingError)
from microtrain import parser as blobfile_parser

results = [0, 0]


def check(name, fn):
    try:
        fn()
        results[0] += 1
        print("ok   " + name)
    except Exception as e:
        results[1] += 1
        print("FAIL %s: %s %s" % (name, type(e).__name__, e))


def expect(exc, fn, *words):
    try:
        fn()
    except exc as e:
        text = str(e)
        for w in words:
            if w not in text:
                raise AssertionError("message %r lacks %r" % (text, w))
        return
    raise AssertionError("no %s raised" % exc.__name__)


directory = sys.argv[1]
blob_path = directory + "/model.mtb"
with open(blob_path, "rb") as f:
    BLOB = f.read()


def setup():
    state = CheckpointState.load_checkpoint(directory + "/checkpoint")
    model = Module(blob_path, state)
    opt = Optimizer(blob_path, model)
    opt.set_learning_rate(0.05)
    b = model.blob
    x_id, y_id = b.programs["train"].inputs
    x = array("f", [((i * 37) % 17) / 17.0 - 0.5 for i in range(b.sizes[x_id])])
    y = array("i", [i % b.num_classes for i in range(b.sizes[y_id])])
    return state, model, opt, x, y


def truncation_anywhere():
    step = max(1, len(BLOB) // 400)
    for n in list(range(0, len(BLOB), step)) + [len(BLOB) - 1]:
        expect(BlobError, lambda: blobfile_parser.parse(BLOB[:n]))


def wrong_identifier():
    bad = bytearray(BLOB)
    bad[8:12] = b"XXXX"
    expect(BlobError, lambda: blobfile_parser.parse(bytes(bad)), "identifier")


def bit_flips():
    for i in range(0, len(BLOB), max(1, len(BLOB) // 150)):
        bad = bytearray(BLOB)
        bad[i] ^= 0x10
        expect(BlobError, lambda: blobfile_parser.parse(bytes(bad)))


def checkpoint_bytes():
    # The host-written checkpoint, and one this runtime writes after a step with optimizer
    # state and a property; both end in microtrain's CRC-32 trailer.
    state, model, opt, x, y = setup()
    model(x, y)
    opt.step()
    state.properties["epoch"] = 1
    path = directory + "/device_written_checkpoint"
    CheckpointState.save_checkpoint(state, path, True)
    out = []
    for p in (directory + "/checkpoint", path):
        with open(p, "rb") as f:
            out.append(f.read())
    return out


def load_bytes(data):
    path = directory + "/damaged_checkpoint"
    with open(path, "wb") as f:
        f.write(data)
    return CheckpointState.load_checkpoint(path)


def ort_checkpoint():
    try:
        with open(directory + "/ort_checkpoint", "rb") as f:
            return f.read()
    except OSError:
        return None


def checkpoint_truncation_anywhere():
    # Every length of microtrain's files, and a dense sample of lengths of a trailer-less ORT
    # file, which the structure checks alone must catch.
    for good in checkpoint_bytes():
        load_bytes(good)
        for n in range(len(good)):
            expect(CheckpointError, lambda: load_bytes(good[:n]))
    good = ort_checkpoint()
    if good is None:
        return
    full = load_bytes(good)
    full.materialize()   # its values read now: load_bytes reuses the file for the cuts below
    # ORT's buffer ends in the NUL of its last string, then zero padding: cutting only
    # padding loses nothing and loads the same state; any longer cut is refused.
    end = len(good.rstrip(b"\x00")) + 1
    for n in list(range(0, end, max(1, end // 500))) + [end - 1]:
        expect(CheckpointError, lambda: load_bytes(good[:n]))
    for n in range(end, len(good)):
        cut = load_bytes(good[:n])
        assert cut.optimizer_step == full.optimizer_step
        for name in full.parameters:
            assert list(cut.parameters[name].data) == list(full.parameters[name].data), name


def checkpoint_byte_flips():
    # With the trailer, every flipped byte is refused (raw float data included).
    for good in checkpoint_bytes():
        for i in range(len(good)):
            bad = bytearray(good)
            bad[i] ^= (0x01, 0x80, 0xFF)[i % 3]
            expect(CheckpointError, lambda: load_bytes(bytes(bad)))
    # Without it (ORT's files), a flip inside raw data loads unnoticed, but anything else
    # either loads or raises CheckpointError: never another exception.
    good = ort_checkpoint()
    if good is None:
        return
    refused = 0
    for i in range(0, len(good), max(1, len(good) // 600)):
        bad = bytearray(good)
        bad[i] ^= 0x5A
        try:
            load_bytes(bytes(bad))
        except CheckpointError:
            refused += 1
    assert refused > 0, "no flip of the ORT checkpoint was refused"


def wrong_input_lengths():
    state, model, opt, x, y = setup()
    expect(InputError, lambda: model(x[:-1], y), "input", str(len(x)))
    expect(InputError, lambda: model(x, y[:-1]), "labels")
    expect(InputError, lambda: model(x), "2 inputs")
    bad = array("i", y)
    bad[3] = 99
    expect(InputError, lambda: model(x, bad), "99")


def wrong_parameter_buffer():
    state, model, opt, x, y = setup()
    n = model.get_parameters_size()
    expect(ParameterError, lambda: model.copy_buffer_to_parameters(array("f", bytes(4 * (n - 1)))),
           str(n - 1), str(n))


def parameters_round_trip():
    state, model, opt, x, y = setup()
    flat = model.get_contiguous_parameters()
    assert len(flat) == model.get_parameters_size(False)
    for i in range(len(flat)):
        flat[i] = flat[i] * 0.5
    model.copy_buffer_to_parameters(flat)
    again = model.get_contiguous_parameters()
    assert list(again) == list(flat)


def nan_loss_keeps_parameters():
    state, model, opt, x, y = setup()
    before = list(model.get_contiguous_parameters())
    clean = array("f", x)
    x[0] = float("nan")
    expect(TrainingError, lambda: model(x, y), "nan")
    assert list(model.get_contiguous_parameters()) == before
    # The NaN gradients are dropped: the next call starts from fresh buffers.
    model(clean, y)
    name = [n for n in state.parameters if state.parameters[n].requires_grad][0]
    after_nan = list(state.parameters[name].grad)
    _, fresh, _, _, _ = setup()
    fresh(clean, y)
    assert after_nan == list(fresh.state.parameters[name].grad)


def accumulate_until_reset():
    # Two train calls without lazy_reset_grad sum their gradients (ORT semantics).
    state, model, opt, x, y = setup()
    name = [n for n in state.parameters if state.parameters[n].requires_grad][0]
    p = state.parameters[name]
    model(x, y)
    one = list(p.grad)
    model(x, y)
    two = list(p.grad)
    for a, b in zip(one, two):
        assert abs(2 * a - b) <= 1e-6 * max(1.0, abs(b)), (a, b)
    model.lazy_reset_grad()
    model(x, y)
    assert list(p.grad) == one


def heap_does_not_grow():
    state, model, opt, x, y = setup()
    for _ in range(5):
        model(x, y)
        opt.step()
        model.lazy_reset_grad()
    gc.collect()
    if not hasattr(gc, "mem_alloc"):
        return  # CPython: tests/test_memory.py uses tracemalloc
    before = gc.mem_alloc()
    for _ in range(100):
        model(x, y)
        opt.step()
        model.lazy_reset_grad()
    gc.collect()
    after = gc.mem_alloc()
    print("     heap before %d after %d bytes" % (before, after))
    assert after == before, (before, after)


for name in ("truncation_anywhere", "wrong_identifier", "bit_flips",
             "checkpoint_truncation_anywhere", "checkpoint_byte_flips", "wrong_input_lengths",
             "wrong_parameter_buffer", "parameters_round_trip", "nan_loss_keeps_parameters",
             "accumulate_until_reset", "heap_does_not_grow"):
    check(name, globals()[name])
print("%d passed, %d failed" % (results[0], results[1]))
sys.exit(1 if results[1] else 0)
