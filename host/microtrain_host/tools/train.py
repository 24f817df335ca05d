"""`microtrain train`: train packed artifacts on the host with the *device* runtime, under
CPython (in this process) or under the MicroPython Unix port (a subprocess)."""
import os
import pathlib
import shutil
import subprocess
import tempfile

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


def load_data(path, val_split=0.2):
    """x_train/y_train[/x_val/y_val] from an .npz (or x/y split off by val_split)."""
    try:
        data = np.load(path)
    except (OSError, ValueError) as e:
        raise TrainError(f"cannot read data '{path}': {e}") from e
    keys = set(data.files)
    if {"x_train", "y_train"} <= keys:
        x, y = data["x_train"], data["y_train"]
        if {"x_val", "y_val"} <= keys:
            return x, y, data["x_val"], data["y_val"]
    elif {"x", "y"} <= keys:
        x, y = data["x"], data["y"]
    else:
        raise TrainError(f"'{path}' needs arrays x_train, y_train (and x_val, y_val) or x, y; "
                         f"it has {sorted(keys)}")
    cut = int(round(len(x) * (1 - val_split)))
    return x[:cut], y[:cut], x[cut:], y[cut:]


def write_device_data(directory, blob, x, y, x_val, y_val):
    """Write the raw files microtrain.fit reads, after checking sizes against the blob."""
    if "train" not in blob.programs:
        raise TrainError("this model computes its loss outside the graph (packed with loss "
                         "none): train it with Module.forward and Module.backward")
    if len(blob.programs["train"].inputs) != 2:
        raise TrainError("`microtrain train` feeds one input and one label tensor; this model's "
                         "train program takes %d inputs (use the device API directly)"
                         % len(blob.programs["train"].inputs))
    x_id, y_id = blob.programs["train"].inputs
    batch = blob.shapes[x_id][0]
    x_size = blob.sizes[x_id] // batch
    y_size = blob.sizes[y_id] // batch
    y_int = blob.dtypes[y_id] == 1
    for name, xs, ys in (("train", x, y), ("val", x_val, y_val)):
        xs = np.asarray(xs, np.float32).reshape(len(xs), -1)
        ys = np.asarray(ys).reshape(len(ys), -1)
        if xs.shape[1] != x_size:
            raise TrainError(f"{name} inputs have {xs.shape[1]} values per sample, the model's "
                             f"input '{blob.names[x_id]}' {list(blob.shapes[x_id])} needs {x_size}")
        if ys.shape[1] != y_size or len(ys) != len(xs):
            raise TrainError(f"{name} labels: {len(ys)} x {ys.shape[1]} values for {len(xs)} "
                             f"samples; the model needs {y_size} per sample")
        if len(xs) < batch:
            raise TrainError(f"{name} set has {len(xs)} samples, fewer than one batch ({batch})")
        if y_int and blob.num_classes:
            bad = (ys < 0) | (ys >= blob.num_classes)
            if bad.any():
                raise TrainError(f"{name} labels must be class indices in [0, "
                                 f"{blob.num_classes}); found {ys[bad][0]}")
        xs.astype("<f4").tofile(os.path.join(directory, f"x_{name}.f32"))
        if y_int:
            ys.astype("<i4").tofile(os.path.join(directory, f"y_{name}.i32"))
        else:
            ys.astype("<f4").tofile(os.path.join(directory, f"y_{name}.f32"))


def train(artifact_dir, data_path, epochs, learning_rate, output, runtime="cpython", seed=1,
          report=None, micropython=None, heap="8M"):
    """Train; report(kind, values) as microtrain.fit calls it. Returns the epoch records."""
    from microtrain import blob as device_blob
    from microtrain import parser as device_blob_parser
    from microtrain import fit as device_fit
    artifact_dir = str(artifact_dir)
    blob_path = os.path.join(artifact_dir, "model.mtb")
    blob = device_blob_parser.load(blob_path)
    x, y, x_val, y_val = load_data(data_path)
    records = []

    def collect(kind, values):
        if kind == "epoch":
            records.append(values)
        if report is not None:
            report(kind, values)

    with tempfile.TemporaryDirectory(prefix="microtrain-data-") as data_dir:
        write_device_data(data_dir, blob, x, y, x_val, y_val)
        if runtime == "cpython":
            device_fit.run(artifact_dir, data_dir, epochs, float(learning_rate), str(output),
                           collect, seed)
        elif runtime == "micropython":
            binary = find_micropython(micropython)
            env = dict(os.environ, MICROPYPATH=str(device_package_dir()))
            argv = [artifact_dir, data_dir, str(epochs), repr(float(learning_rate)),
                    str(output), str(seed)]
            proc = subprocess.Popen([binary, "-X", f"heapsize={heap}", "-m", "microtrain.fit"]
                                    + argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    text=True, env=env)
            for line in proc.stdout:
                if line.startswith("@step ") or line.startswith("@epoch "):
                    kind, *values = line[1:].split()
                    collect(kind, tuple(_parse(v) for v in values))
            err = proc.stderr.read()
            if proc.wait() != 0:
                raise TrainError(f"MicroPython run failed:\n{err.strip()}")
        else:
            raise TrainError(f"unknown runtime '{runtime}': cpython or micropython")
    return records


def _parse(text):
    if text == "None":
        return None
    try:
        return int(text)
    except ValueError:
        return float(text)
