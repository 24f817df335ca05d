"""FlatBuffers tables by field name, for the host's writers and readers.

Writing: `write_table(builder, table, fields)` prepends the given fields of one table of a
contract schema (contract/schema.py) by name - the field number, the slot's type and its
default all come from the .fbs - in the order given (which decides where each lands in the
buffer), skipping a scalar equal to its default as the flatbuffers Builder does.

Reading: `Reader` is a bounds-checked reader of a little-endian, unprefixed buffer (the
`flatbuffers` package trusts its input: a corrupt offset there gives an IndexError, a wrong
value or a negative index that wraps around); every problem is the caller's error type,
naming the source. Its accessors take a schema table and a field name as well."""
import dataclasses
import struct

_SLOT_WRITERS = {"B": "PrependUint8Slot", "b": "PrependInt8Slot", "H": "PrependUint16Slot",
                 "h": "PrependInt16Slot", "I": "PrependUint32Slot", "i": "PrependInt32Slot",
                 "Q": "PrependUint64Slot", "q": "PrependInt64Slot", "f": "PrependFloat32Slot",
                 "d": "PrependFloat64Slot"}


def write_table(builder, table, fields):
    """Write one table of `table` (a contract schema Table) with builder; fields: (name,
    value) pairs in prepend order (a value of None is left out; a bool field takes any
    truthy value). Returns the table's offset."""
    builder.StartObject(len(table.fields))
    for name, value in fields:
        if value is None:
            continue
        f = table[name]
        if f.type == "bool":
            builder.PrependBoolSlot(f.number, bool(value), f.default)
        elif f.scalar:
            getattr(builder, _SLOT_WRITERS[f.scalar])(f.number, value, f.default)
        else:   # string, vector or table: an offset already written
            builder.PrependUOffsetTRelativeSlot(f.number, value, 0)
    return builder.EndObject()


def table_vector(builder, offsets):
    """A vector of tables (their offsets, in order)."""
    builder.StartVector(4, len(offsets), 4)
    for off in reversed(offsets):
        builder.PrependUOffsetTRelative(off)
    return builder.EndVector()


@dataclasses.dataclass
class Table:
    pos: int      # where the table starts (its soffset to the vtable)
    vtable: int
    vsize: int    # vtable size in bytes
    tsize: int    # table size in bytes
    what: str


class Reader:
    """Bounds-checked access to a FlatBuffers buffer (little-endian, unprefixed). Every
    problem raises error(f"{prefix}{problem}")."""

    def __init__(self, data: bytes, error, prefix: str = ""):
        self.data = data
        self.size = len(data)
        self.error = error
        self.prefix = prefix

    def fail(self, problem: str):
        raise self.error(f"{self.prefix}{problem}")

    def need(self, pos: int, nbytes: int, what: str) -> None:
        if pos < 0 or nbytes < 0 or pos + nbytes > self.size:
            self.fail(f"truncated or corrupt: {what} at byte {pos} (+{nbytes} bytes) lies "
                      f"outside the {self.size}-byte file")

    def unpack(self, fmt: str, pos: int, what: str):
        self.need(pos, struct.calcsize(fmt), what)
        return struct.unpack_from("<" + fmt, self.data, pos)[0]

    def root(self) -> Table:
        return self.table(self.unpack("I", 0, "root offset"), "root table")

    def table(self, pos: int, what: str) -> Table:
        vtable = pos - self.unpack("i", pos, what)
        vsize = self.unpack("H", vtable, what + " vtable")
        tsize = self.unpack("H", vtable + 2, what + " vtable")
        if vsize < 4 or vsize % 2:
            self.fail(f"corrupt: {what} has a vtable of {vsize} bytes")
        if tsize < 4:
            self.fail(f"corrupt: {what} is {tsize} bytes long")
        self.need(vtable, vsize, what + " vtable")
        self.need(pos, tsize, what)
        return Table(pos, vtable, vsize, tsize, what)

    def field(self, t: Table, index: int, width: int) -> int | None:
        """Absolute position of field `index` (`width` bytes), None when absent."""
        slot = 4 + 2 * index
        if slot + 2 > t.vsize:
            return None
        off = self.unpack("H", t.vtable + slot, t.what + " vtable")
        if off == 0:
            return None
        if off < 4 or off + width > t.tsize:
            self.fail(f"corrupt: field {index} of {t.what} lies outside the table")
        return t.pos + off

    def scalar(self, t: Table, f):
        """The value of scalar field f (a contract schema Field), or its default."""
        at = self.field(t, f.number, struct.calcsize(f.scalar))
        return f.default if at is None else self.unpack(f.scalar, at,
                                                        f"{f.name} of {t.what}")

    def target(self, t: Table, index: int, what: str) -> int | None:
        """Where the offset field `index` points to, None when absent."""
        at = self.field(t, index, 4)
        return None if at is None else at + self.unpack("I", at, what)

    def subtable(self, t: Table, f, what: str) -> Table | None:
        at = self.target(t, f.number, what)
        return None if at is None else self.table(at, what)

    def vector(self, t: Table, f, elem_size: int, what: str) -> tuple[int, int]:
        """(position of the first element, element count) of vector field f; (0, 0) when
        absent."""
        at = self.target(t, f.number, what)
        if at is None:
            return 0, 0
        count = self.unpack("I", at, what + " length")
        self.need(at + 4, count * elem_size, what)
        return at + 4, count

    def tables(self, t: Table, f, what: str) -> list[Table]:
        pos, count = self.vector(t, f, 4, what + " list")
        out = []
        for i in range(count):
            at = pos + 4 * i
            out.append(self.table(at + self.unpack("I", at, what), f"{what} {i}"))
        return out

    def string(self, t: Table, f, what: str) -> str | None:
        pos, count = self.vector(t, f, 1, what)
        if not pos:
            return None
        self.need(pos + count, 1, what + " terminator")
        if self.data[pos + count] != 0:
            self.fail(f"corrupt: {what} is not NUL-terminated")
        try:
            return self.data[pos:pos + count].decode("utf-8")
        except UnicodeDecodeError:
            self.fail(f"corrupt: {what} is not valid UTF-8")
