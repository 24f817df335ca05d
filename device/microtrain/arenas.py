# The arenas a blob's tensors live in: allocated once, largest first, and filled with the
# constants' little-endian bytes. The loaders of a blob file (loader.py) and of a blob given
# as a buffer (inplace.py) share these.
import gc
from array import array
from microtrain.blob import ITEM_BYTES, zeros
from microtrain.errors import OutOfMemoryError

# contract: private
# (generated from host/microtrain_host/contract/ by `python -m microtrain_host.contract.generate`; do not edit)
from microtrain.errors import const
_FLOAT = const(0)
_INT32 = const(1)
# end of contract

CHUNK = 256             # bytes copied at a time into an arena
# MicroPython: a collection restarts allocation at the heap's bottom, so the parsed blob's
# objects pack together there instead of spreading over the heap with the garbage parsing
# makes, which would leave no hole as large as an arena. CPython needs no help.
compact = gc.collect if hasattr(gc, "mem_alloc") else (lambda: None)


def arenas(what, floats, ints, nbytes, weights):
    # The float, int and byte arenas and the buffer of `weights` bytes of int8 weights (a
    # blob file's), each allocated once, the largest first (into the file's place).
    compact()
    made = [None, None, None, None]
    try:
        # largest first (a small heap has few holes that large): F, I, Q, W by their
        # bytes, the kind in the two low bits
        for key in sorted((4 * floats * 4, 4 * ints * 4 + 1, nbytes * 4 + 2, weights * 4 + 3),
                          reverse=True):
            kind = key & 3
            made[kind] = (zeros("f", floats) if kind == 0 else zeros("i", ints) if kind == 1
                          else bytearray(nbytes if kind == 2 else weights))
    except MemoryError:
        raise OutOfMemoryError("'%s' needs %d bytes of arenas (%d floats, %d ints%s%s) "
                               "besides the parsed blob; the heap has %s bytes free (each "
                               "arena needs one contiguous block)"
                               % (what, 4 * (floats + ints) + nbytes + weights, floats, ints,
                                  ", %d int8 bytes" % nbytes if nbytes else "",
                                  ", %d bytes of int8 weights (a blob given as a buffer in "
                                  "flash reads them in place)" % weights if weights else "",
                                  mem_free()))
    return made


def within(budget, nbytes, what, kind):
    # The caller's byte budget (max_arena_bytes of Module / InferenceSession: a host that
    # loads blobs it did not pack), checked before reading or allocating that much.
    if budget is not None and nbytes > budget:
        raise OutOfMemoryError("%s %d bytes of %s, over the budget of %d bytes "
                               "(max_arena_bytes)" % (what, nbytes, kind, budget))


def put(b, tid, at, raw, nbytes, F, I, Q):
    # Little-endian bytes raw (nbytes of them) into tensor tid's arena slice from byte at
    off = b.offsets[tid] + at // ITEM_BYTES[b.dtypes[tid]]
    dtype = b.dtypes[tid]
    if dtype == _FLOAT:
        F[off:off + nbytes // 4] = array("f", bytes(raw))
    elif dtype == _INT32:
        I[off:off + nbytes // 4] = array("i", bytes(raw))
    else:
        Q[off:off + nbytes] = raw


def mem_free():
    try:
        return gc.mem_free()
    except AttributeError:  # CPython
        return "an unknown number of"
