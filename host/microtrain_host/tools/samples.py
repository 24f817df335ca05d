"""`microtrain samples`: a sample store written on a board (device/microtrain/samples.py),
read on the host with the device's own reader, so that the host accepts exactly the records
the board would, and exported as arrays."""
from array import array

import numpy as np

from microtrain import samples as device_samples


def read_store(path):
    """(the opened store, x [records, values] float32 or int8, y int64, seq int64), records
    in the order they were captured (by sequence number). The store is closed."""
    store = device_samples.load(str(path))
    try:
        typecode = "f" if store.dtype == "float32" else "b"
        buffer = array(typecode, bytes(store.values_bytes))
        xs, ys, seqs = [], [], []
        for label in store.records(buffer):
            xs.append(np.frombuffer(bytes(buffer), dtype="<f4" if typecode == "f" else "i1"))
            ys.append(label)
            seqs.append(store.seq)
    finally:
        store.close()
    order = np.argsort(np.array(seqs, np.int64), kind="stable")
    dtype = np.float32 if typecode == "f" else np.int8
    x = (np.stack(xs) if xs else np.zeros((0, store.record_values))).astype(dtype)[order]
    return store, x, np.array(ys, np.int64)[order], np.array(seqs, np.int64)[order]


def describe(path, store):
    """What `microtrain samples` prints: geometry, fill, counts per class, dropped records."""
    counts = store.counts()
    lines = [
        f"sample store {path}: {store.record_values} {store.dtype} values per record, "
        f"{store.record_size} bytes a record ({device_samples.RECORD_OVERHEAD} of sequence "
        f"number, label and CRC-32{_padding(store)})",
        f"  budget {store.budget_bytes} bytes: {store.capacity} records; policy {store.policy}"
        f"{f' over {store.classes} classes' if store.classes else ''}, seed {store.seed}",
        f"  {len(store)} records kept of {store.seen} samples offered; {store.dropped} "
        f"dropped (torn by a power cut, or corrupt)",
        f"  state copies intact: {store.state_copies} of 2"
        + ("" if store.state_copies else " (count taken from the records, generator reseeded)"),
        "  per class: " + (", ".join(f"{label}: {n}" for label, n in enumerate(counts) if n)
                           or "none")]
    return "\n".join(lines)


def _padding(store):
    pad = store.record_size - device_samples.RECORD_OVERHEAD - store.values_bytes
    return f", {pad} of padding" if pad else ""
