# A small, bounds-checked FlatBuffers reader over bytes / bytearray / memoryview.
#
# Layout facts used (FlatBuffers binary format): little-endian; a table starts with an
# int32 offset back to its vtable (vtable = table - soffset); a vtable is u16 vtable size,
# u16 table size, then one u16 per field giving the field's offset inside the table
# (0 = absent, use the default); strings, vectors and sub-tables are reached through a
# u32 offset relative to the field's own position; vectors and strings start with a u32
# element count. Every read is checked against the buffer length so that a truncated or
# corrupt file raises the caller's error type with a reason instead of an IndexError.
import struct


class Reader:
    def __init__(self, buf, error, start=0):
        self.buf = buf
        self.size = len(buf)
        self.error = error
        self.start = start

    def fail(self, what):
        raise self.error(what)

    def need(self, pos, nbytes, what):
        if pos < self.start or nbytes < 0 or pos + nbytes > self.size:
            self.fail("truncated or corrupt: %s at byte %d (+%d) is outside the %d-byte buffer"
                      % (what, pos, nbytes, self.size))

    def u16(self, pos):
        self.need(pos, 2, "u16")
        return struct.unpack_from("<H", self.buf, pos)[0]

    def u32(self, pos):
        self.need(pos, 4, "u32")
        return struct.unpack_from("<I", self.buf, pos)[0]

    def root(self):
        # u32 offset to the root table at the start of the (unprefixed) buffer.
        return self.table_at(self.start + self.u32(self.start), "root table")

    def table_at(self, pos, what):
        self.need(pos, 4, what)
        vtable = pos - struct.unpack_from("<i", self.buf, pos)[0]
        self.need(vtable, 4, what + " vtable")
        vsize = self.u16(vtable)
        tsize = self.u16(vtable + 2)
        if vsize < 4 or vsize & 1:
            self.fail("corrupt: %s vtable size %d" % (what, vsize))
        self.need(vtable, vsize, what + " vtable")
        self.need(pos, tsize, what)
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
        self.need(at, struct.calcsize(fmt), "field %d" % index)
        return struct.unpack_from("<" + fmt, self.buf, at)[0]

    def _target(self, table, index):
        at = self.field(table, index)
        if not at:
            return 0
        return at + self.u32(at)

    def table(self, table, index, what):
        at = self._target(table, index)
        return self.table_at(at, what) if at else None

    def vector(self, table, index, elem_size, what):
        """(position of the first element, element count); (0, 0) when absent."""
        at = self._target(table, index)
        if not at:
            return 0, 0
        count = self.u32(at)
        self.need(at + 4, count * elem_size, what)
        return at + 4, count

    def scalars(self, table, index, fmt, what):
        pos, count = self.vector(table, index, struct.calcsize(fmt), what)
        if not count:
            return ()
        return struct.unpack_from("<%d%s" % (count, fmt), self.buf, pos)

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
        self.need(pos + count, 1, what + " terminator")
        if self.buf[pos + count] != 0:
            self.fail("corrupt: %s is not NUL-terminated" % what)
        try:
            return str(bytes(self.buf[pos:pos + count]), "utf-8")
        except Exception:
            self.fail("corrupt: %s is not UTF-8" % what)
