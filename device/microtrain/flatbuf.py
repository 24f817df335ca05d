# A small, bounds-checked FlatBuffers reader over a buffer (bytes, bytearray, memoryview) or,
# FileReader, over a file read through a small window (a checkpoint is parsed without
# holding the file in RAM).
#
# Layout facts used (FlatBuffers binary format): little-endian; a table starts with an
# int32 offset back to its vtable (vtable = table - soffset); a vtable is u16 vtable size,
# u16 table size, then one u16 per field giving the field's offset inside the table
# (0 = absent, use the default); strings, vectors and sub-tables are reached through a
# u32 offset relative to the field's own position; vectors and strings start with a u32
# element count. Every read is checked against the buffer length so that a truncated or
# corrupt file raises the caller's error type with a reason instead of an IndexError.
import struct
from microtrain.files import seek


# struct format (little-endian) and size of each scalar type a caller names: looked up, so
# that a read builds no format string (a parse should leave little garbage among the objects
# it keeps: see checkpoint.py)
_FORMATS = {"B": ("<B", 1), "b": ("<b", 1), "H": ("<H", 2), "h": ("<h", 2), "I": ("<I", 4),
            "i": ("<i", 4), "Q": ("<Q", 8), "q": ("<q", 8), "f": ("<f", 4), "d": ("<d", 8)}


class Reader:
    def __init__(self, buf, error, start=0):
        self.buf = buf
        self.size = len(buf)
        self.error = error
        self.start = start
        self.base = 0          # the buffer position of buf[0] (FileReader: its window's)

    def fail(self, what):
        raise self.error(what)

    def check(self, pos, nbytes, what, detail=None):
        # what % detail names the part in the message: formatted only when it fails
        if pos < self.start or nbytes < 0 or pos + nbytes > self.size:
            self.fail("truncated or corrupt: %s at byte %d (+%d) is outside the %d-byte buffer"
                      % (what if detail is None else what % detail, pos, nbytes, self.size))

    # need: [pos, pos + nbytes) inside the buffer, and in self.buf from pos - self.base;
    # a buffer holds all its bytes, so check alone (a name, not a function: a function's
    # bytecode, raw-code record and object cost the heap of a board's runtime)
    need = check

    def unpack(self, fmt, pos, nbytes, what, detail=None):
        self.need(pos, nbytes, what, detail)
        return struct.unpack_from(fmt, self.buf, pos - self.base)

    # u16, u32 and table_at read bytes by hand: no tuple per read
    def u16(self, pos):
        self.need(pos, 2, "u16")
        b, at = self.buf, pos - self.base
        return b[at] | b[at + 1] << 8

    def u32(self, pos):
        self.need(pos, 4, "u32")
        b, at = self.buf, pos - self.base
        return b[at] | b[at + 1] << 8 | b[at + 2] << 16 | b[at + 3] << 24

    def root(self):
        # u32 offset to the root table at the start of the (unprefixed) buffer.
        return self.table_at(self.start + self.u32(self.start), "root table")

    def table_at(self, pos, what):
        self.need(pos, 4, what)
        b, at = self.buf, pos - self.base
        soffset = b[at] | b[at + 1] << 8 | b[at + 2] << 16 | ((b[at + 3] ^ 0x80) - 0x80) << 24
        vtable = pos - soffset
        vsize = self.u16(vtable)
        tsize = self.u16(vtable + 2)
        if vsize < 4 or vsize & 1:
            self.fail("corrupt: %s vtable size %d" % (what, vsize))
        self.check(vtable, vsize, "%s vtable", what)
        self.check(pos, tsize, what)
        return (pos, vtable, vsize, tsize)

    def field(self, table, index):
        # Absolute position of field `index`, or 0 when the field is absent.
        pos, vtable, vsize, tsize = table
        slot = 4 + 2 * index
        if slot + 2 > vsize:
            return 0
        off = self.u16(vtable + slot)
        if off == 0:
            return 0
        if off >= tsize:
            self.fail("corrupt: field %d lies outside its table" % index)
        return pos + off

    def scalar(self, table, index, fmt, default):
        at = self.field(table, index)
        if not at:
            return default
        fmt, size = _FORMATS[fmt]
        return self.unpack(fmt, at, size, "field %d", index)[0]

    def _target(self, table, index):
        at = self.field(table, index)
        if not at:
            return 0
        return at + self.u32(at)

    def table(self, table, index, what):
        at = self._target(table, index)
        return self.table_at(at, what) if at else None

    def vector(self, table, index, elem_size, what, detail=None):
        """(position of the first element, element count); (0, 0) when absent. Only
        checked to lie inside the buffer: its elements are not read."""
        at = self._target(table, index)
        if not at:
            return 0, 0
        count = self.u32(at)
        self.check(at + 4, count * elem_size, what, detail)
        return at + 4, count

    def scalars(self, table, index, fmt, what):
        size = _FORMATS[fmt][1]
        pos, count = self.vector(table, index, size, what)
        if not count:
            return ()
        return self.unpack("<%d%s" % (count, fmt), pos, count * size, what)

    def tables(self, table, index, what):
        pos, count = self.vector(table, index, 4, what)
        out = []
        for i in range(count):
            at = pos + 4 * i
            out.append(self.table_at(at + self.u32(at), what))
        return out

    def string(self, table, index, what):
        pos, count = self.vector(table, index, 1, what)
        if not pos:
            return ""
        self.need(pos, count + 1, "%s terminator", what)
        at = pos - self.base
        if self.buf[at + count] != 0:
            self.fail("corrupt: %s is not NUL-terminated" % what)
        try:
            # decoded from a view: no copy of the bytes on the way
            return str(memoryview(self.buf)[at:at + count], "utf-8")
        except Exception:
            self.fail("corrupt: %s is not UTF-8" % what)


class FileReader(Reader):
    """A Reader over the first `size` bytes of an open file, read through a window of
    `window` bytes (larger when one read needs more: a long name or dims vector)."""

    def __init__(self, f, size, error, window=64):
        Reader.__init__(self, bytearray(window), error)
        self.f = f
        self.size = size
        self.base = -window - 1  # no bytes in the window yet
        self.valid = 0

    def need(self, pos, nbytes, what, detail=None):
        self.check(pos, nbytes, what, detail)
        if pos < self.base or pos + nbytes > self.base + self.valid:
            if nbytes > len(self.buf):
                self.buf = bytearray(nbytes)
            seek(self.f, pos)     # (not f.seek: littlefs, see files.seek)
            self.valid = self.f.readinto(memoryview(self.buf)[:min(len(self.buf),
                                                                   self.size - pos)]) or 0
            self.base = pos
            if self.valid < nbytes:
                self.fail("the file changed while it was being read (%s at byte %d)"
                          % (what if detail is None else what % detail, pos))
