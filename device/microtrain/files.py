# Files on a board: opened with the fallback an interrupted save leaves, read in one buffer,
# written atomically. The blob loader, the checkpoints and the inference export share these.
import os


def open_existing(path):
    """(file opened for reading, the path opened): `path`, or path.bak when `path` cannot
    be opened. A board whose filesystem cannot rename over a file moves the previous file to
    path.bak while it replaces it (write_atomically); a power cut there leaves only path.bak.
    Raises the OSError of `path` when neither can be opened."""
    try:
        return open(path, "rb"), path
    except OSError as e:
        try:
            return open(path + ".bak", "rb"), path + ".bak"
        except OSError:
            raise e


def read_whole(f, room=0):
    """The file's bytes in one buffer of its size (or, with room larger than the file, a
    view of the first bytes of a buffer of room bytes). f.read() grows its buffer while
    reading: on a board's small heap the copies it leaves behind put the bytes mid-hole,
    where the arenas allocated next no longer fit."""
    size = f.seek(0, 2)
    f.seek(0)
    try:
        data = bytearray(max(size, room))
    except MemoryError:     # no hole that large: the arenas will not fit either, which
        room = 0            # the loader then reports with the bytes they need
        data = bytearray(size)
    view = memoryview(data)
    got = 0
    while got < size:
        n = f.readinto(view[got:size])
        if not n:
            return data[:got]  # the file shrank while being read
        got += n
    return view[:size] if room > size else data


def write_atomically(path, write, error, what):
    """Write `path` with write(file) into path.tmp, flush it to storage, then rename it over
    `path` (_replace), so an interrupted write leaves the previous file in place. An OSError
    becomes error("cannot write <what> '<path>': ..."). Checkpoints and exported inference
    blobs are saved this way."""
    tmp = path + ".tmp"
    try:
        with open(tmp, "wb") as f:
            write(f)
            if hasattr(os, "fsync"):  # CPython; MicroPython's close() flushes
                f.flush()
                os.fsync(f.fileno())
        _replace(tmp, path)
    except OSError as e:
        raise error("cannot write %s '%s': %s" % (what, path, e))


def _replace(tmp, uri):
    bak = uri + ".bak"
    try:
        os.rename(tmp, uri)
    except OSError as e:
        try:
            os.stat(uri)
        except OSError:
            raise e  # nothing to move aside: the rename failed for another reason
        # This filesystem will not rename over an existing file (some board ports). Move
        # the old file aside first, so that at every moment uri or uri.bak is a
        # complete file (open_existing falls back to uri.bak when uri is missing).
        _remove(bak)  # left by an earlier interrupted save; uri is complete now
        os.rename(uri, bak)
        os.rename(tmp, uri)
    _remove(bak)  # the previous checkpoint, or one an interrupted save left behind


def _remove(path):
    try:
        os.remove(path)
    except OSError:
        pass
