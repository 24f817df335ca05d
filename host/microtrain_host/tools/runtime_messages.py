"""Error messages out of the minimal runtime's imported code. The words of a `raise` take
about a sixth of the runtime's bytecode, and bytecode imported from a board's filesystem is
copied into its heap. In the runtime deploy ships (not in the repository's modules), the
message literals of each module's raise statements move into a module beside it,
microtrain/_msg_<module>.py, which errors.message imports only when one of them is raised:
the message is the same string, formatted with the same operand.

    raise BlobError("tensor '%s' has a negative dimension %r" % (name, shape))
becomes, on the same line (the lines after it blanked, so a traceback's line numbers stay
the repository's):
    from microtrain.errors import message as _m; raise BlobError(_m("parser", 4, (name, shape)))

Only `"literal" % operand` and plain literals of MIN_LENGTH characters or more inside a
raise statement's exception (or the arguments of a call of ERROR_CALLS) move; modules with
viper or native functions are left whole."""
import ast

MIN_LENGTH = 16
PREFIX = "microtrain/_msg_"
IMPORT = "from microtrain.errors import message as _m"
NATIVE_DECORATORS = ("@micropython.viper", "@micropython.native")
# Functions that always raise, with the message as an argument: the checkers' fail
# (flatbuf.Reader, stepcheck.StepCheck) and Module._refuse
ERROR_CALLS = ("fail", "_refuse")


def message_module(path):
    """microtrain/kernels/loss.py -> ("kernels_loss", "microtrain/_msg_kernels_loss.py")."""
    key = path[len("microtrain/"):-3].replace("/", "_")
    return key, PREFIX + key + ".py"


def is_message_module(path):
    """True for a runtime path (.py or .mpy) of a module move_messages wrote."""
    return path.startswith(PREFIX)


class _Mover(ast.NodeTransformer):
    def __init__(self, key):
        self.key = key
        self.texts = []

    def _call(self, text, operand=None):
        self.texts.append(text)
        args = [ast.Constant(self.key), ast.Constant(len(self.texts) - 1)]
        return ast.Call(ast.Name("_m", ast.Load()), args + ([operand] if operand else []), [])

    def visit_BinOp(self, node):
        if (isinstance(node.op, ast.Mod) and isinstance(node.left, ast.Constant)
                and isinstance(node.left.value, str) and len(node.left.value) >= MIN_LENGTH):
            return self._call(node.left.value, self.visit(node.right))
        return self.generic_visit(node)

    def visit_Constant(self, node):
        if isinstance(node.value, str) and len(node.value) >= MIN_LENGTH:
            return self._call(node.value)
        return node

    def visit_JoinedStr(self, node):
        return node     # an f-string's parts are not messages of their own


def _error_call(node):
    """The call of a statement that raises: `raise E(...)`, or a call of one of ERROR_CALLS
    standing as a statement (`c.fail("...")`, `self._refuse("...")`)."""
    if isinstance(node, ast.Raise):
        return isinstance(node.exc, ast.Call)
    if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
        f = node.value.func
        return (f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", None)) in ERROR_CALLS
    return False


def _replace(lines, node, text):
    """Put text in place of the statement node (its first line keeps what precedes the node,
    its last line what follows; the lines between are blanked). Columns are UTF-8 bytes."""
    first = lines[node.lineno - 1].encode()
    last = lines[node.end_lineno - 1].encode()
    head, tail = first[:node.col_offset].decode(), last[node.end_col_offset:].decode()
    for i in range(node.lineno - 1, node.end_lineno):
        lines[i] = ""
    lines[node.lineno - 1] = head + text + tail


def move_messages(sources):
    """{relative path: source text} of a runtime -> the same with each module's raise
    messages moved out, and a microtrain/_msg_<module>.py per module that had any."""
    out = dict(sources)
    for path, text in sources.items():
        if not path.startswith("microtrain/") or any(d in text for d in NATIVE_DECORATORS):
            continue
        key, target = message_module(path)
        mover = _Mover(key)
        tree = ast.parse(text)
        raises = [n for n in ast.walk(tree) if _error_call(n)]
        # one import for the module, at the end of its first import statement's line (a
        # module without one imports at each raise)
        first = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))][:1]
        lines = text.split("\n")
        for node in sorted(raises, key=lambda n: n.lineno, reverse=True):
            before = len(mover.texts)
            call = node.exc if isinstance(node, ast.Raise) else node.value
            call.args = [mover.visit(a) for a in call.args]
            if len(mover.texts) > before:
                _replace(lines, node, ("" if first else IMPORT + "; ") + ast.unparse(node))
        if mover.texts:
            if first:
                _replace(lines, first[0], ast.unparse(first[0]) + "; " + IMPORT)
            out[path] = "\n".join(lines)
            out[target] = (f"# The error messages of {path} in the minimal runtime "
                           f"(microtrain_host/tools/runtime_messages.py):\n# imported only "
                           f"when one is raised (errors.message).\nT = (\n"
                           + "".join(f"    {t!r},\n" for t in mover.texts) + ")\n")
    return out
