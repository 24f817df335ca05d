# Exceptions raised by the device runtime. One type per concern; messages name the thing.
# Also the const() every module's generated contract block imports: MicroPython's, which
# folds `_NAME = const(5)` into the bytecode, or an identity on CPython.
try:
    from micropython import const  # noqa: F401
except ImportError:
    def const(x):
        return x


class MicrotrainError(Exception):
    pass


class BlobError(MicrotrainError):
    """The .mtb blob is not one we can run: wrong identifier or version, truncated, corrupt."""


class OutOfMemoryError(MicrotrainError):
    """The model's arenas (or its other buffers) do not fit in the free heap."""


class CheckpointError(MicrotrainError):
    """The checkpoint file is missing, truncated, corrupt, or does not match the model."""


class InputError(MicrotrainError):
    """Inputs or labels of the wrong count, length or value passed to a Module."""


class ParameterError(MicrotrainError):
    """Parameters missing, of the wrong size, or still nominal."""


class TrainingError(MicrotrainError):
    """Training cannot go on, e.g. the loss is NaN or infinite."""


def message(module, i, *operand):
    """Message i of microtrain/_msg_<module>.py, formatted with its operand if given: a
    minimal runtime keeps its raise statements' words there, imported only when one is
    raised (host microtrain_host/tools/runtime_messages.py), and forgotten once read, so
    that a run which goes on after the error holds no heap for them. Without the heap (or
    the file) for it, the message says which it was, with the operand."""
    import sys
    import microtrain
    name = "_msg_" + module
    try:
        text = __import__("microtrain." + name, None, None, ("T",)).T[i]
    except (MemoryError, ImportError):
        return "microtrain error %s %d %r (its message could not be loaded)" % (module, i,
                                                                                 operand)
    finally:
        sys.modules.pop("microtrain." + name, None)
        if hasattr(microtrain, name):
            delattr(microtrain, name)
    return text % operand[0] if operand else text
