"""`microtrain train`: train packed artifacts on the host with the *device* runtime, under
CPython (in this process) or under the MicroPython Unix port (a subprocess)."""
import errno
import math
import numbers
import os
import pathlib
import re
import shutil
import signal
import subprocess
import tempfile
import zipfile
import zlib

import numpy as np

from ..errors import MicrotrainHostError

REPO_ROOT = pathlib.Path(__file__).resolve().parents[3]


class TrainError(MicrotrainHostError):
    """Data or runtime problems in `microtrain train`."""


def device_package_dir():
    import microtrain
    return pathlib.Path(microtrain.__file__).resolve().parent.parent


def find_micropython(explicit=None):
    for candidate in (explicit, os.environ.get("MICROTRAIN_MICROPYTHON"),
                      str(REPO_ROOT / ".cache" / "micropython" / "micropython"),
                      shutil.which("micropython")):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    raise TrainError("no MicroPython Unix port found: build it with scripts/build_micropython.sh "
                     "or set MICROTRAIN_MICROPYTHON")


def load_data(path, val_split=0.2, labels=True):
    """x_train/y_train[/x_val/y_val] from an .npz (or x/y split off by val_split). Anything
    else - a missing or corrupt file, a single .npy array, arrays of Python objects or
    strings, inputs and labels of different lengths, NaN or infinite inputs - is a
    TrainError naming the file and what is wrong with it. labels=False (a model whose input
    is its own target): the y arrays may be left out, and are read as no values per
    sample."""
    try:
        with open(path, "rb") as f:
            head = f.read(6)
    except FileNotFoundError:
        raise TrainError(f"data file '{path}' does not exist") from None
    except IsADirectoryError:
        raise TrainError(f"data '{path}' is a directory; give an .npz file") from None
    except OSError as e:
        raise TrainError(f"cannot read data '{path}': {e.strerror or e}") from e
    if head == b"\x93NUMPY":
        raise TrainError(f"data '{path}' holds a single array (an .npy file); training needs "
                         f"an .npz with arrays x_train, y_train (and x_val, y_val) or x, y: "
                         f"numpy.savez(path, x_train=..., y_train=...)")
    if not head.startswith(b"PK"):
        raise TrainError(f"data '{path}' is not an .npz file (it does not start as a zip "
                         f"archive); save the arrays with numpy.savez")
    try:
        # allow_pickle=False: an .npz of object arrays would run code from the file when
        # read; numpy raises ValueError for them instead (_read_array)
        data = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error) as e:
        raise TrainError(f"cannot read data '{path}': a damaged or truncated .npz ({e})") from e
    with data:
        keys = set(data.files)
        if not labels:
            # a model whose input is its own target: the x arrays alone (labels of no values)
            found = [n for n in ("x_train", "x_val") if n in keys] if "x_train" in keys else (
                ["x"] if "x" in keys else [])
            if not found:
                raise TrainError(f"'{path}' needs an array x_train (and x_val) or x; it has "
                                 f"{sorted(keys)}")
            names, arrays = [], []
            for name in found:
                x = _read_array(data, path, name)
                names += [name, "no labels"]
                arrays += [x, np.zeros((len(x) if x.ndim else 0, 0), np.float32)]
        else:
            if {"x_train", "y_train"} <= keys:
                names = ["x_train", "y_train"] + (
                    ["x_val", "y_val"] if {"x_val", "y_val"} <= keys else [])
            elif {"x", "y"} <= keys:
                names = ["x", "y"]
            else:
                raise TrainError(f"'{path}' needs arrays x_train, y_train (and x_val, y_val) "
                                 f"or x, y; it has {sorted(keys)}")
            arrays = [_read_array(data, path, name) for name in names]
    for x_name, y_name, x, y in zip(names[::2], names[1::2], arrays[::2], arrays[1::2]):
        if x.ndim == 0 or y.ndim == 0:
            raise TrainError(f"'{path}': {x_name} and {y_name} must hold one sample per row; "
                             f"their shapes are {list(x.shape)} and {list(y.shape)}")
        if len(x) != len(y):
            raise TrainError(f"'{path}': {x_name} has {len(x)} samples, {y_name} {len(y)}")
        for name, array in ((x_name, x), (y_name, y)):
            if array.dtype.kind == "f" and not np.isfinite(array).all():
                raise TrainError(f"'{path}': {name} holds NaN or infinite values "
                                 f"({int(np.count_nonzero(~np.isfinite(array)))} of "
                                 f"{array.size})")
    if len(arrays) == 4:
        return tuple(arrays)
    x, y = arrays[0], arrays[1]
    cut = int(round(len(x) * (1 - val_split)))
    return x[:cut], y[:cut], x[cut:], y[cut:]


def _read_array(data, path, name):
    """One numeric array of an .npz, or a TrainError saying why not."""
    try:
        array = data[name]
    except ValueError as e:
        if "allow_pickle" in str(e):  # numpy's refusal of an object array
            raise TrainError(f"'{path}': array '{name}' holds Python objects (dtype object); "
                             f"save numbers, e.g. numpy.asarray(values, numpy.float32)") from e
        raise TrainError(f"cannot read array '{name}' of '{path}': the file is corrupt "
                         f"({e})") from e
    except Exception as e:  # noqa: BLE001 - numpy's header parser raises whatever its
        # tokenizer or zlib meets in damaged bytes (TokenError, SyntaxError, BadZipFile...)
        raise TrainError(f"cannot read array '{name}' of '{path}': the file is corrupt "
                         f"({type(e).__name__}: {e})") from e
    if array.dtype.kind not in "biuf":
        raise TrainError(f"'{path}': array '{name}' has dtype {array.dtype}; training needs "
                         f"numbers (int or float)")
    return array


# The file names of a packed directory: every pack's, and the integer training blob's of
# `export --int8-train` (accepted as they are, sent to a board under the standard names).
ARTIFACT_NAMES = (("model.mtb", "checkpoint"), ("int8_train.mtb", "int8_train.ckpt"))


def artifact_files(artifacts, error=TrainError):
    """(blob path, checkpoint path) of the packed directory `artifacts`: model.mtb and
    checkpoint, or int8_train.mtb and int8_train.ckpt (export --int8-train)."""
    artifacts = pathlib.Path(artifacts)
    for blob, checkpoint in ARTIFACT_NAMES:
        if (artifacts / blob).is_file() and (artifacts / checkpoint).is_file():
            return artifacts / blob, artifacts / checkpoint
    raise error(f"'{artifacts}' holds no packed model: model.mtb and checkpoint (microtrain "
                f"pack ... -o {artifacts}), or int8_train.mtb and int8_train.ckpt (microtrain "
                f"export ... --int8-train {artifacts})")


def input_quantization(blob, error=TrainError):
    """(scale as float32, zero point, numpy dtype) of the train program's int8 / uint8 input
    (an integer training blob), read from the blob (blob: the device parser's, not loaded
    into arenas, so that its quantization table is whole); None for a float input."""
    x_id = blob.programs["train"].inputs[0]
    if blob.dtypes[x_id] not in (2, 3):     # INT8, UINT8
        return None
    quant = blob.quant.get(x_id)
    if quant is None or len(quant[0]) != 1:
        raise error(f"input '{blob.names[x_id]}' takes "
                    f"{'int8' if blob.dtypes[x_id] == 2 else 'uint8'} values but the blob "
                    f"has {'no' if quant is None else 'a per-channel'} quantization scale for "
                    f"it: the float samples cannot be quantized")
    return (np.float32(quant[0][0]), int(quant[1][0]),
            np.int8 if blob.dtypes[x_id] == 2 else np.uint8)


def quantize(xs, quantization):
    """Float samples as the int8 / uint8 values the blob takes, as onnxruntime's
    QuantizeLinear computes them: x / scale in float32, rounded half to even, plus the zero
    point, saturated to the type's range."""
    scale, zero_point, dtype = quantization
    info = np.iinfo(dtype)
    q = np.rint(np.asarray(xs, np.float32) / scale).astype(np.float64) + zero_point
    return np.clip(q, info.min, info.max).astype(dtype)


def check_data(blob, x, y, x_val, y_val, source="the data"):
    """Raise TrainError when the arrays do not fit the blob's train program: the number of
    values per sample of inputs and labels, at least one batch in each set, class-index
    labels in range. source names the data in the message (its file)."""
    if "train" not in blob.programs:
        raise TrainError("this model computes its loss outside the graph (packed with loss "
                         "none): train it with Module.forward and Module.backward")
    inputs = blob.programs["train"].inputs
    if len(inputs) not in (1, 2):
        raise TrainError("`microtrain train` feeds one input and one label tensor (or the "
                         "input alone, an autoencoder's own target); this model's train "
                         "program takes %d inputs (use the device API directly)" % len(inputs))
    x_id = inputs[0]
    batch = blob.shapes[x_id][0]
    x_size = blob.sizes[x_id] // batch
    y_size = blob.sizes[inputs[1]] // batch if len(inputs) == 2 else 0
    y_int = len(inputs) == 2 and blob.dtypes[inputs[1]] == 1
    for name, xs, ys in (("train", x, y), ("val", x_val, y_val)):
        xs = np.asarray(xs, np.float32).reshape(len(xs), -1)
        ys = _rows(ys)
        if xs.shape[1] != x_size:
            raise TrainError(f"{source}: {name} inputs have {xs.shape[1]} values per sample, "
                             f"the model's input '{blob.names[x_id]}' "
                             f"{list(blob.shapes[x_id])} needs {x_size}")
        if ys.shape[1] != y_size or len(ys) != len(xs):
            raise TrainError(f"{source}: {name} labels: {len(ys)} x {ys.shape[1]} values for "
                             f"{len(xs)} samples; the model needs {y_size} per sample")
        if len(xs) < batch:
            raise TrainError(f"{source}: {name} set has {len(xs)} samples, fewer than one "
                             f"batch ({batch})")
        if y_int and blob.num_classes:
            bad = (ys < 0) | (ys >= blob.num_classes) | (ys != np.round(ys))
            if bad.any():
                raise TrainError(f"{source}: {name} labels must be class indices in [0, "
                                 f"{blob.num_classes}); found {ys[bad][0]}")


def _rows(values):
    # one row per sample (a model without labels: rows of no values, which reshape's -1
    # cannot infer)
    values = np.asarray(values)
    return values.reshape(len(values), -1 if values.size else 0)


def own_labels(blob):
    """False when the blob's train program takes its input alone (an autoencoder whose
    input is its own target: load_data(labels=False))."""
    return "train" not in blob.programs or len(blob.programs["train"].inputs) != 1


def write_device_data(directory, blob, x, y, x_val, y_val, source="the data"):
    """Write the raw files microtrain.fit reads, after checking them (check_data):
    x_{train,val}.f32, or for an integer training blob's int8 / uint8 input the samples
    quantized with its scale and zero point (quantize) as x_*.i8 / x_*.u8; labels
    y_*.i32 (class indices) or y_*.f32, none for a model whose input is its own target.
    Returns the inputs' extension."""
    check_data(blob, x, y, x_val, y_val, source)
    inputs = blob.programs["train"].inputs
    y_int = len(inputs) == 2 and blob.dtypes[inputs[1]] == 1
    quantization = input_quantization(blob)
    x_ext = "f32" if quantization is None else ("i8" if quantization[2] == np.int8 else "u8")
    for name, xs, ys in (("train", x, y), ("val", x_val, y_val)):
        xs = np.asarray(xs, np.float32).reshape(len(xs), -1)
        ys = _rows(ys)
        if quantization is None:
            xs.astype("<f4").tofile(os.path.join(directory, f"x_{name}.f32"))
        else:
            quantize(xs, quantization).tofile(os.path.join(directory, f"x_{name}.{x_ext}"))
        if len(inputs) == 1:
            continue            # (the input is its own target: no labels file)
        if y_int:
            ys.astype("<i4").tofile(os.path.join(directory, f"y_{name}.i32"))
        else:
            ys.astype("<f4").tofile(os.path.join(directory, f"y_{name}.f32"))
    return x_ext


def train(artifact_dir, data_path, epochs, learning_rate, output, runtime="cpython", seed=1,
          report=None, micropython=None, heap="8M", max_arena_bytes=None):
    """Train; report(kind, values) as microtrain.fit calls it. Returns the epoch records.
    max_arena_bytes: the device runtime refuses a blob whose arenas take more (as a board
    with that much free RAM would), before allocating them."""
    from microtrain import parser as device_blob_parser
    from microtrain import fit as device_fit
    check_training_arguments(epochs, learning_rate, seed)
    if runtime not in ("cpython", "micropython"):
        raise TrainError(f"unknown runtime '{runtime}': cpython or micropython")
    blob_path, checkpoint_path = artifact_files(artifact_dir)
    blob = device_blob_parser.load(str(blob_path))
    x, y, x_val, y_val = load_data(data_path, labels=own_labels(blob))
    records = []

    def collect(kind, values):
        if kind == "epoch":
            records.append(values)
        if report is not None:
            report(kind, values)

    with tempfile.TemporaryDirectory(prefix="microtrain-data-") as data_dir:
        write_device_data(data_dir, blob, x, y, x_val, y_val, source=f"'{data_path}'")
        artifact_dir = str(pathlib.Path(blob_path).parent)
        if blob_path.name != "model.mtb":
            # microtrain.fit reads ARTIFACTS/model.mtb and ARTIFACTS/checkpoint: links to
            # the files under those names
            artifact_dir = os.path.join(data_dir, "artifacts")
            os.mkdir(artifact_dir)
            os.symlink(os.path.abspath(blob_path), os.path.join(artifact_dir, "model.mtb"))
            os.symlink(os.path.abspath(checkpoint_path),
                       os.path.join(artifact_dir, "checkpoint"))
        if runtime == "cpython":
            device_fit.run(artifact_dir, data_dir, epochs, float(learning_rate), str(output),
                           collect, seed, max_arena_bytes)
        elif runtime == "micropython":
            binary = find_micropython(micropython)
            env = dict(os.environ, MICROPYPATH=str(device_package_dir()))
            argv = [artifact_dir, data_dir, str(epochs), repr(float(learning_rate)),
                    str(output), str(seed), str(max_arena_bytes or 0)]
            proc = subprocess.Popen([binary, "-X", f"heapsize={heap}", "-m", "microtrain.fit"]
                                    + argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    text=True, env=env)
            for line in proc.stdout:
                if line.startswith("@step ") or line.startswith("@epoch "):
                    kind, *values = line[1:].split()
                    collect(kind, tuple(_parse(v) for v in values))
            err = proc.stderr.read()
            status = proc.wait()
            if status != 0:
                raise TrainError(f"MicroPython run failed: {device_error(err, status)}")
    return records


def check_training_arguments(epochs, learning_rate, seed=0):
    """TrainError unless epochs is a positive int, learning_rate a finite number >= 0 and
    seed an int >= 0 (the device's generator is seeded with its low 32 bits)."""
    if isinstance(epochs, bool) or not isinstance(epochs, numbers.Integral) or epochs < 1:
        raise TrainError(f"epochs must be a positive integer, got {epochs!r}")
    if (isinstance(learning_rate, bool) or not isinstance(learning_rate, numbers.Real)
            or not math.isfinite(learning_rate) or learning_rate < 0):
        raise TrainError(f"learning rate must be a finite number >= 0, got {learning_rate!r}")
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or seed < 0:
        raise TrainError(f"seed must be an integer >= 0, got {seed!r}")


# The last line of a MicroPython traceback: `Name: message`, or a bare exception name.
_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit)\b(:.*)?$")


def device_error(output, status=None):
    """One line in words for a failed MicroPython run, from its output (a traceback, log
    lines): the exception line the traceback ends with - or the last line - with errno
    numbers spelled out (errno_in_words). The traceback's file and line lines are left out:
    they point into the device runtime, not at what the user gave. status: the exit status,
    named when there is no output (a crash, a kill)."""
    lines = [line.strip() for line in (output or "").splitlines() if line.strip()]
    found = [line for line in lines if _EXCEPTION_LINE.match(line)]
    if found:
        return errno_in_words(found[-1])
    if lines:
        return errno_in_words(lines[-1])
    if status is not None and status < 0:
        try:
            return f"killed by signal {signal.Signals(-status).name}"
        except ValueError:
            return f"killed by signal {-status}"
    return f"exit status {status}, no output"


def errno_in_words(line):
    """MicroPython prints an OSError as `[Errno 2] ENOENT`, or as the bare number where its
    port has no name for it ("cannot write checkpoint 'x': 28"). Spell both as CPython does,
    `[Errno 28] No space left on device`: MicroPython's errno values are the POSIX ones
    (its ports use the C library's or its own table of the same numbers)."""
    def words(number):
        number = int(number)
        if number not in errno.errorcode:
            return None
        return f"[Errno {number}] {os.strerror(number)}"

    def named(match):
        return words(match.group(1)) or match.group(0)

    line = re.sub(r"\[Errno (\d+)\] [A-Z][A-Z0-9]*", named, line)
    # a bare number ends the line after an OSError's type or a quoted path: "OSError: 28",
    # "... '/path': 28" (the device runtime's messages embed the OSError so)
    match = re.search(r"(?:^OSError|'): (\d+)$", line)
    if match and words(match.group(1)):
        line = line[:match.start(1)] + words(match.group(1))
    return line


def _parse(text):
    if text == "None":
        return None
    try:
        return int(text)
    except ValueError:
        return float(text)
