# Files on a board: opened with the fallback an interrupted save leaves, or a buffer in
# flash read like one; read in one buffer; written atomically, never through a planted link
# and never over a directory. The blob loader, the checkpoints and the inference export
# share these.
import os

from microtrain.errors import message

_IS_DIR = 0x4000          # S_IFDIR in os.stat()[0]


def reason(e):
    """An OSError in words: 'no space left on the device (errno 28)'."""
    number = e.args[0] if e.args and isinstance(e.args[0], int) else None
    text = e.args[1] if len(e.args) > 1 else None
    if text is None and number is not None and 0 <= number < 40:
        # the words of errno 0 to 39, for the ports whose OSError carries only the number:
        # microtrain/_msg_oserrors.py, imported only to word an error, so that a run's heap
        # does not hold the table
        text = message("oserrors", number)
    if text is None:
        return str(e)
    return "%s (errno %d)" % (text, number) if number is not None else str(text)


def path_of(uri, error, what, buffer_too=False):
    """uri as a str path: a str, or on CPython a path-like object; anything else (None, a
    number, bytes, an int that open() would take for a file descriptor and close) is
    error('<what> must be a path (a str) ...'), which mentions buffers where they are taken
    too (buffer_too)."""
    if isinstance(uri, str):
        return uri
    if hasattr(uri, "__fspath__"):
        path = uri.__fspath__()
        if isinstance(path, str):
            return path
    raise error("%s must be a path (a str)%s, not %s"
                % (what, " or a buffer (bytes, bytearray, memoryview)" if buffer_too else "",
                   type(uri).__name__))


def is_directory(path):
    try:
        return os.stat(path)[0] & _IS_DIR != 0
    except OSError:
        return False


def exists(path):
    try:
        return bool(os.stat(path))
    except OSError:
        return False


def open_existing(path):
    """(file opened for reading, the path opened): `path`, or path.bak when `path` cannot
    be opened. A board whose filesystem cannot rename over a file moves the previous file to
    path.bak while it replaces it (write_atomically); a power cut there leaves only path.bak.
    Raises the OSError of `path` when neither can be opened."""
    try:
        return open_regular(path), path
    except OSError as e:
        try:
            return open_regular(path + ".bak"), path + ".bak"
        except OSError:
            raise e


def seek(f, at):
    """f.seek(at) for a file read at scattered places. The littlefs of MicroPython 1.25
    (littlefs 2.8; fixed in littlefs 2.10.1, its pull request 1058) answers a read after a
    seek from a stale cache when the read before ended exactly at the end of a block and
    `at` lies in the next block at an offset the cache covered: the bytes of the block
    before, without an error. A seek to 0 first takes littlefs' flush path, which drops
    that cache."""
    f.seek(0)
    return f.seek(at)


def open_regular(path):
    # Only a regular file: a directory cannot be read, and a FIFO or a device would block
    # or never end.
    kind = os.stat(path)[0] & 0xF000
    if kind == _IS_DIR:
        raise OSError(21, "is a directory")
    if kind != 0x8000:
        raise OSError(22, "not a regular file")
    return open(path, "rb")


class BufferFile:
    """A buffer (bytes, a memoryview of a file in a board's ROM filesystem or of a frozen
    bytes object) read like an open file: seek, readinto, read."""

    def __init__(self, buf):
        self.view = memoryview(buf)
        self.at = 0

    def seek(self, at, whence=0):
        self.at = at if whence == 0 else len(self.view) + at
        return self.at

    def readinto(self, into):
        n = max(0, min(len(into), len(self.view) - self.at))
        into[:n] = self.view[self.at:self.at + n]
        self.at += n
        return n

    def read(self, n):
        out = bytes(self.view[self.at:self.at + n])
        self.at += len(out)
        return out

    def close(self):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


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
    `path` (_replace), so an interrupted write leaves the previous file in place. The
    temporary file is created afresh (a file or link already at path.tmp is removed, never
    written through), a directory at `path` is refused, and a failed write removes the
    temporary file; every OSError becomes error("cannot write <what> '<path>': <reason>").
    Checkpoints and exported inference blobs are saved this way."""
    path = path_of(path, error, "the %s" % what)
    if is_directory(path):
        raise error("cannot write %s '%s': it is a directory" % (what, path))
    tmp = path + ".tmp"
    try:
        f = _create(tmp)
        with f:
            write(f)
            if hasattr(os, "fsync"):  # CPython; MicroPython's close() flushes
                f.flush()
                os.fsync(f.fileno())
        _replace(tmp, path)
    except OSError as e:
        _remove(tmp)
        raise error("cannot write %s '%s': %s" % (what, path, reason(e)))
    except BaseException:
        _remove(tmp)
        raise


def _create(tmp):
    # A new file at tmp. Whatever is there (an interrupted save's leftover, or a link
    # planted to make the save overwrite another file) is removed first, not followed.
    # CPython then creates it exclusively without following links; MicroPython has no
    # O_EXCL, and a board runs one program: remove, then create.
    _remove(tmp)
    if hasattr(os, "O_EXCL"):
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) \
            | getattr(os, "O_BINARY", 0)
        return os.fdopen(os.open(tmp, flags, 0o666), "wb")
    return open(tmp, "wb")


def _replace(tmp, uri):
    bak = uri + ".bak"
    try:
        os.rename(tmp, uri)
    except OSError as e:
        try:
            mode = os.stat(uri)[0]
        except OSError:
            raise e  # nothing to move aside: the rename failed for another reason
        if mode & _IS_DIR:
            raise e  # never move a directory aside
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
