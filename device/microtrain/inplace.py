# A blob given as a buffer - bytes, a memoryview of a file in a board's ROM filesystem or
# of a frozen bytes object: the blob in flash - loaded where it is: parsed in place (no
# copy), its int8 weights left there for the kernels to read, the other constants copied
# into the arenas. A blob file is loaded by loader.py.
from microtrain.arenas import CHUNK, arenas, mem_free, put, within
from microtrain.blob import ITEM_BYTES, describe
from microtrain.errors import OutOfMemoryError
from microtrain.parser import arena_sizes, parse_root, root_of


def load_buffer(data, budget=None):
    # The blob as a buffer: parsed where it is (no copy), its int8 weights left there, the
    # other constants copied into the arenas.
    b, F, I, Q, view = parse_in_place(data, budget)
    b.quant = {}        # the scales served the checks (derived multipliers); not needed now
    b._arenas = None
    for tid, pos in b.constants:    # each noted by its place in the buffer
        n = ITEM_BYTES[b.dtypes[tid]] * b.sizes[tid]
        for at in range(0, n, CHUNK):
            put(b, tid, at, view[pos + at:pos + min(n, at + CHUNK)], min(CHUNK, n - at),
                 F, I, Q)
    b.Q = Q
    b.constants = None  # in the arenas now
    return b, F, I


def parse_in_place(data, budget=None):
    # (blob as parsed, F, I, Q, view) at the load's peak: the arenas allocated first, at the
    # bottom of a collected heap, before the parse's garbage can leave no hole as large as
    # them, then the blob parsed beside them, its constants noted by their place (the host's
    # fit check, tools/boards.py, measures this state)
    view = memoryview(data)
    what = describe(data)
    try:
        r, root = root_of(view, data)
        floats, ints, nbytes = arena_sizes(r, root)
    except MemoryError:
        raise OutOfMemoryError("%s: no room to check its frame" % what)
    within(budget, 4 * (floats + ints) + nbytes, "%s needs" % what, "arenas")
    F, I, Q, _ = arenas(what, floats, ints, nbytes, 0)
    try:
        b = parse_root(r, root, view, False, Q, True, view, (F, I, Q, put))
    except MemoryError:
        raise OutOfMemoryError("the blob parsed from %s needs more than the %s bytes the heap "
                               "has free besides its arenas" % (what, mem_free()))
    return b, F, I, Q, view


