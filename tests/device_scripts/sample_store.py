# The sample store (microtrain.samples) on both interpreters, for tests/test_samples.py.
#   sample_store.py write PATH VALUES DTYPE BUDGET POLICY CLASSES SEED N [REOPEN_AT...]
#       offers samples 0..N-1 (stream(): the same on every port), closing and reopening the
#       store before each sample number in REOPEN_AT (a reboot); prints the slots kept
#   sample_store.py heap PATH
#       appends and reads under micropython.heap_lock(), and gc.mem_alloc() around 200
#       appends: "heap <before> <after>"
#   sample_store.py fuzz PATH SEED FIRST COUNT
#       mutates the store at PATH (mutation FIRST..FIRST+COUNT-1) and checks each one;
#       prints one line per mutation: "<i> <kind> opened|refused|crash ..." and
#       "<i> bad <why>" when an invariant breaks
import gc
import os
import struct
import sys
from array import array
from microtrain import samples
from microtrain.crc32 import crc32
from microtrain.errors import MicrotrainError
from draws import Draws

try:
    import micropython
except ImportError:
    micropython = None

CLASSES_DEFAULT = 4


def label_of(i, classes):
    # A skewed stream: class 0 most often, the last class least (classes >= 2).
    r = (i * 37 + i // 7) % 20
    if classes < 3:
        return 0 if r < 14 else 1
    return 0 if r < 12 else 1 if r < 17 else 2 + (i % (classes - 2))


def fill(x, i, dtype):
    # Sample i's values, exact in float32 (and the same on every port).
    for j in range(len(x)):
        v = (i * 7 + j * 13) % 251
        x[j] = v / 8.0 - 15.0 if dtype == "float32" else v - 128


def buffer(n, dtype):
    return array("f" if dtype == "float32" else "b", bytes(n * (4 if dtype == "float32" else 1)))


def write(argv):
    path, n_values, dtype, budget, policy = argv[2], int(argv[3]), argv[4], int(argv[5]), argv[6]
    classes, seed, count = int(argv[7]) or None, int(argv[8]), int(argv[9])
    reopen = [int(a) for a in argv[10:]]
    x = buffer(n_values, dtype)

    def open_store():
        return samples.SampleStore(path, n_values, dtype, budget, policy, classes, seed)
    store = open_store()
    kept = []
    for i in range(count):
        if i in reopen:
            store.close()
            store = open_store()
        fill(x, i, dtype)
        kept.append(store.append(label_of(i, classes or CLASSES_DEFAULT), x))
    store.close()
    print(" ".join(str(k) for k in kept))


def heap(argv):
    path = argv[2]
    store = samples.SampleStore(path, 16, "int8", 1200, "balanced", 4, 7)
    x = buffer(16, "int8")
    for i in range(100):                     # past the fill phase: replacements too
        store.append(i % 4, x)
    gc.collect()
    before = gc.mem_alloc() if hasattr(gc, "mem_alloc") else 0
    if micropython is not None:
        micropython.heap_lock()
    for i in range(200):
        store.append(label_of(i, 4), x)
    if micropython is not None:
        micropython.heap_unlock()
    gc.collect()
    after = gc.mem_alloc() if hasattr(gc, "mem_alloc") else 0
    records = store.records(x)
    if micropython is not None:
        micropython.heap_lock()
    read = 0
    for _ in records:
        read += 1
    if micropython is not None:
        micropython.heap_unlock()
    print("heap %d %d read %d" % (before, after, read))
    store.close()


KINDS = ("header", "state", "record", "flip", "truncate")


def mutate(original, rs, index, seed):
    # (kind, mutated bytes, the slot touched or -1): a few bytes of one region changed and
    # its CRC recomputed (the checks after the CRC are what is tested), or bits flipped
    # anywhere without fixing a CRC, or the file cut short.
    data = bytearray(original)
    draw = Draws(seed * 1000003 + index)
    kind = KINDS[draw.below(len(KINDS))]
    slots = (len(data) - samples.DATA_START) // rs
    salt = struct.unpack_from("<I", data, 24)[0]
    if kind == "truncate":
        return kind, data[:draw.below(len(data))], -1
    if kind == "flip":
        at = draw.below(len(data))
        data[at] ^= 1 << draw.below(8)
        slot = (at - samples.DATA_START) // rs if at >= samples.DATA_START else -1
        return kind, data, slot
    if kind == "header":
        first, end, slot = 0, 24, -1
    elif kind == "state":
        first = samples.HEADER_BYTES + samples.STATE_BYTES * draw.below(2)
        end, slot = first + 8, -1
    else:
        slot = draw.below(slots)
        first = samples.DATA_START + slot * rs
        end = first + rs - 4
    for _ in range(1 + draw.below(3)):
        at = first + draw.below(end - first)
        how = draw.below(3)
        if how == 0:
            data[at] = draw.below(256)
        elif how == 1:
            data[at] ^= 1 << draw.below(8)
        else:
            data[at] = (0, 1, 0x3F, 0x40, 0x7F, 0x80, 0xFF)[draw.below(7)]
    # the header's CRC starts from 0, the others from the header's
    crc = crc32(memoryview(data)[first:end], 0 if kind == "header" else salt)
    struct.pack_into("<I", data, end, crc & 0xFFFFFFFF)
    return kind, data, slot


def originals(path):
    store = samples.load(path)
    x = bytearray(store.values_bytes)
    out = []
    for slot in range(store.capacity):
        label = store.read(slot, x)
        out.append((label, store.seq, bytes(x)) if label >= 0 else None)
    rs = store.record_size
    store.close()
    return out, rs


def check(path, kind, slot, original, rs, size):
    # One mutated file: None when every invariant holds, else why not.
    try:
        store = samples.load(path)
    except MicrotrainError as e:
        if kind in ("header", "flip") or (kind == "truncate" and size < samples.DATA_START):
            return "refused", None
        return "refused", "refused (%s) a %s mutation: %s" % (type(e).__name__, kind, e)
    x = bytearray(store.values_bytes)
    invalid = 0
    for s in range(store.slots):
        label = store.read(s, x)
        whole = samples.DATA_START + (s + 1) * rs <= size
        expect = original[s] if s < len(original) else None
        if label < 0:
            if s < store.slots:
                invalid += 1
            if expect is not None and whole and kind in ("state", "record", "flip", "truncate") \
                    and s != slot:
                return "opened", "slot %d: a completed, unmutated record was lost" % s
            continue
        got = (label, store.seq, bytes(x))
        if got != expect and not (s == slot and kind == "record"):
            return "opened", "slot %d read as %r, was %r" % (s, got, expect)
    stored = (size - samples.DATA_START + store.record_size - 1) // store.record_size
    invalid += max(0, stored - store.capacity)    # bytes past the budget count as dropped
    if invalid != store.dropped:
        return "opened", "%d slots unreadable but %d counted dropped" % (invalid, store.dropped)
    outcome = "opened %d dropped" % store.dropped
    store.close()
    # and the store goes on: appending to it raises nothing but microtrain's own errors
    try:
        store = samples.load(path, writable=True)
        y = bytearray(store.values_bytes)
        for i in range(3):
            store.append(i % (store.classes or 3), y)
        store.close()
    except MicrotrainError:
        pass
    return outcome, None


def fuzz(argv):
    path, seed, first, count = argv[2], int(argv[3]), int(argv[4]), int(argv[5])
    original, rs = originals(path)
    with open(path, "rb") as f:
        base = f.read()
    mutated = path + ".fuzz"
    for index in range(first, first + count):
        kind, data, slot = mutate(base, rs, index, seed)
        with open(mutated, "wb") as f:
            f.write(data)
        try:
            outcome, why = check(mutated, kind, slot, original, rs, len(data))
        except Exception as e:   # anything but microtrain's own error is a crash
            outcome, why = "crash", "%s: %s" % (type(e).__name__, e)
        print(index, kind, outcome)
        if why is not None:
            print(index, "bad", why)
    os.remove(mutated)


{"write": write, "heap": heap, "fuzz": fuzz}[sys.argv[1]](sys.argv)
