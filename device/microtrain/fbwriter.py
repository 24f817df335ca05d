# A small forward FlatBuffers writer that streams to a file.
#
# FlatBuffers builders usually build back to front in one buffer; a board cannot afford a
# second copy of its parameters, so this writer first lays every object out (parents before
# children, so every u32 offset points forward as the format requires), then writes them in
# order, copying raw tensor data straight from its buffer (e.g. a slice of the arena).
# The file never ends in padding, so a reader notices truncation at any byte.
import struct

_SIZES = {"B": 1, "b": 1, "h": 2, "H": 2, "i": 4, "I": 4, "f": 4, "q": 8, "Q": 8, "d": 8}


def _align(pos, a):
    return (pos + a - 1) & -a


class Table:
    # fields: list indexed by field number; each None (absent), (fmt, value), or a child object.
    def __init__(self, fields):
        self.fields = fields


class Vector:
    # A vector of scalars, e.g. Vector("q", dims).
    def __init__(self, fmt, values):
        self.fmt = fmt
        self.values = values
        self.size = 4 + _SIZES[fmt] * len(values)


class String:
    def __init__(self, text):
        self.data = text.encode("utf-8")
        self.size = 4 + len(self.data) + 1


class Raw:
    # A [ubyte] vector of `nbytes` bytes taken from any buffer (bytes, array, memoryview).
    def __init__(self, buffer, nbytes):
        self.buffer = buffer
        self.nbytes = nbytes
        self.size = 4 + nbytes


class Tables:
    def __init__(self, tables):
        self.tables = tables
        self.size = 4 + 4 * len(tables)


def _layout(root):
    # Breadth first: a parent always lies before its children (queued as its fields are
    # laid out: no function of their own, which would cost a board's heap).
    order = []
    queue = [root]
    pos = 8
    while queue:
        obj = queue.pop(0)
        if isinstance(obj, Table):
            n = len(obj.fields)
            widest = 4
            for f in obj.fields:
                if isinstance(f, tuple) and _SIZES[f[0]] > widest:
                    widest = _SIZES[f[0]]
            vtable = _align(pos, 2)
            start = _align(vtable + 4 + 2 * n, widest)
            cursor = 4
            slots = []
            for f in obj.fields:
                if f is None:
                    slots.append(0)
                    continue
                if not isinstance(f, tuple):
                    queue.append(f)     # a child: a string, vector or table
                size = _SIZES[f[0]] if isinstance(f, tuple) else 4
                cursor = _align(cursor, size)
                slots.append(cursor)
                cursor += size
            obj.vtable, obj.pos, obj.slots, obj.size = vtable, start, slots, cursor
            pos = start + cursor
        else:
            # Vectors, strings: a u32 count, then elements aligned to their size (min 4).
            align = max(_SIZES[obj.fmt], 4) if isinstance(obj, Vector) else 4
            obj.pos = _align(pos + 4, align) - 4
            pos = obj.pos + obj.size
            if isinstance(obj, Tables):
                queue.extend(obj.tables)
        order.append(obj)
    return order, pos


def write(stream, root, identifier):
    """Write the FlatBuffer rooted at Table `root` to a binary stream; returns its size."""
    order, total = _layout(root)
    head = bytearray(8)
    struct.pack_into("<I", head, 0, root.pos)
    head[4:8] = identifier
    stream.write(head)
    at = 8
    for obj in order:
        begin = obj.vtable if isinstance(obj, Table) else obj.pos
        if begin > at:
            stream.write(bytes(begin - at))
        if isinstance(obj, Table):
            out = bytearray(obj.pos + obj.size - obj.vtable)
            n = len(obj.fields)
            struct.pack_into("<HH", out, 0, 4 + 2 * n, obj.size)
            base = obj.pos - obj.vtable
            struct.pack_into("<i", out, base, obj.pos - obj.vtable)
            for i in range(n):
                f = obj.fields[i]
                struct.pack_into("<H", out, 4 + 2 * i, obj.slots[i])
                if f is None:
                    continue
                where = base + obj.slots[i]
                if isinstance(f, tuple):
                    struct.pack_into("<" + f[0], out, where, f[1])
                else:
                    struct.pack_into("<I", out, where, f.pos - (obj.pos + obj.slots[i]))
            stream.write(out)
        elif isinstance(obj, Vector):
            stream.write(struct.pack("<I%d%s" % (len(obj.values), obj.fmt),
                                     len(obj.values), *obj.values))
        elif isinstance(obj, String):
            stream.write(struct.pack("<I", len(obj.data)))
            stream.write(obj.data)
            stream.write(b"\x00")
        elif isinstance(obj, Raw):
            stream.write(struct.pack("<I", obj.nbytes))
            stream.write(obj.buffer)
        else:
            out = bytearray(4 + 4 * len(obj.tables))
            struct.pack_into("<I", out, 0, len(obj.tables))
            for i in range(len(obj.tables)):
                field = obj.pos + 4 + 4 * i
                struct.pack_into("<I", out, 4 + 4 * i, obj.tables[i].pos - field)
            stream.write(out)
        at = obj.pos + obj.size
    return at

