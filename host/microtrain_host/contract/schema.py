"""The two FlatBuffers schemas of the contract, read from their .fbs files.

A small reader of the subset of the FlatBuffers schema language the contract uses:
`namespace`, `file_identifier`, `file_extension`, `root_type`, `enum Name : type { A = 0, ... }`
and `table Name { field: type (= default)?; ... }` with `//` comments. A field's number is its
position in its table (the vtable slot is 4 + 2 * number), which is what the readers and
writers of both halves use: the host's writers take field numbers, types and defaults from
here (formats/flatbuf.py), the device's readers get them as const()s generated from here
(contract/generate.py)."""
import dataclasses
import functools
import pathlib
import re

HERE = pathlib.Path(__file__).resolve().parent

# scalar type -> (struct format, byte size)
SCALARS = {"bool": ("B", 1), "byte": ("b", 1), "ubyte": ("B", 1), "int8": ("b", 1),
           "uint8": ("B", 1), "short": ("h", 2), "int16": ("h", 2), "ushort": ("H", 2),
           "uint16": ("H", 2), "int": ("i", 4), "int32": ("i", 4), "uint": ("I", 4),
           "uint32": ("I", 4), "long": ("q", 8), "int64": ("q", 8), "ulong": ("Q", 8),
           "uint64": ("Q", 8), "float": ("f", 4), "float32": ("f", 4), "double": ("d", 8),
           "float64": ("d", 8)}


@dataclasses.dataclass(frozen=True)
class Field:
    name: str
    number: int         # position in the table: the vtable slot is 4 + 2 * number
    type: str           # a scalar, "string", an enum's or a table's name, or "[T]"
    default: object     # a scalar's default (0 / False / 0.0 unless given); None otherwise
    scalar: str = ""    # the struct format of a scalar (an enum's: its underlying type's)

    @property
    def is_vector(self):
        return self.type.startswith("[")

    @property
    def element(self):
        return self.type[1:-1] if self.is_vector else self.type


@dataclasses.dataclass(frozen=True)
class Table:
    name: str
    fields: tuple

    def __getitem__(self, name):
        for f in self.fields:
            if f.name == name:
                return f
        raise KeyError(f"table {self.name} has no field '{name}'")


@dataclasses.dataclass(frozen=True)
class Schema:
    path: pathlib.Path
    namespace: str
    identifier: str
    root: str
    enums: dict         # name -> (underlying type, {member: value}) in declaration order
    tables: dict        # name -> Table, in declaration order

    def __getitem__(self, name):
        return self.tables[name]


def _default(text, ftype, enums):
    if ftype in enums:
        base, members = enums[ftype]
        value = members[text] if text is not None and text in members else int(text or 0)
        return value, SCALARS[base][0]
    if ftype not in SCALARS:
        if text is not None:
            raise ValueError(f"a default for the non-scalar type {ftype}")
        return None, ""
    fmt = SCALARS[ftype][0]
    if ftype == "bool":
        return (text == "true"), fmt
    if fmt in "fd":
        return float(text) if text is not None else 0.0, fmt
    return int(text, 0) if text is not None else 0, fmt


@functools.lru_cache(maxsize=None)
def load(name):
    """The schema of contract/<name> (e.g. "microtrain.fbs")."""
    path = HERE / name
    text = re.sub(r"//[^\n]*", "", path.read_text())
    namespace = re.search(r"\bnamespace\s+([\w.]+)\s*;", text).group(1)
    identifier = re.search(r'\bfile_identifier\s+"(\w{4})"\s*;', text).group(1)
    root = re.search(r"\broot_type\s+(\w+)\s*;", text).group(1)
    enums = {}
    for name_, base, body in re.findall(r"\benum\s+(\w+)\s*:\s*(\w+)\s*\{([^}]*)\}", text):
        members, value = {}, 0
        for item in filter(None, (m.strip() for m in body.split(","))):
            member, _, given = (p.strip() for p in item.partition("="))
            value = int(given, 0) if given else value
            members[member] = value
            value += 1
        enums[name_] = (base, members)
    tables = {}
    for table_name, body in re.findall(r"\btable\s+(\w+)\s*\{([^}]*)\}", text):
        fields = []
        for statement in filter(None, (s.strip() for s in body.split(";"))):
            match = re.fullmatch(r"(\w+)\s*:\s*(\[?\w+\]?)\s*(?:=\s*([\w.+-]+))?", statement)
            if not match:
                raise ValueError(f"{path.name}: table {table_name}: cannot read '{statement}'")
            fname, ftype, given = match.groups()
            default, fmt = _default(given, ftype, enums)
            fields.append(Field(fname, len(fields), ftype, default, fmt))
        tables[table_name] = Table(table_name, tuple(fields))
    return Schema(path, namespace, identifier, root, enums, tables)


def blob_schema():
    return load("microtrain.fbs")


def checkpoint_schema():
    return load("checkpoint.fbs")
