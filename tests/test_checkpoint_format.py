"""The ODTC training checkpoint: host writer/reader and device writer/reader agree.

Round trips in all four directions (host/device writer x host/device reader), an
independent check with the flatbuffers package's generic Table API, truncation at every
byte, random byte corruption, clear errors, and atomic saves.
"""

import io
import os
import random
import sys
from array import array
from pathlib import Path

import flatbuffers
import numpy as np
import pytest
from flatbuffers import number_types as N
from flatbuffers.table import Table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "host"))
sys.path.insert(0, str(ROOT / "device"))

import microtrain_host.formats.checkpoint as host_ckpt  # noqa: E402
from microtrain_host.formats.checkpoint import (  # noqa: E402
    build_checkpoint, parse_checkpoint, read_checkpoint, write_checkpoint)
from microtrain_host.errors import CheckpointError  # noqa: E402

import microtrain.checkpoint as device_ckpt  # noqa: E402
from microtrain import checkpoint_writer as device_checkpoint_writer  # noqa: E402
from microtrain import fbwriter  # noqa: E402
from microtrain.checkpoint import CheckpointState, Parameter  # noqa: E402
from microtrain.errors import CheckpointError as DeviceCheckpointError  # noqa: E402


def bits(values):
    """float32 values as their bit patterns (so NaN, -0.0 and denormals compare exactly)."""
    if isinstance(values, array):
        values = np.frombuffer(values, dtype=np.float32)
    return np.asarray(values, dtype=np.float32).reshape(-1).view(np.uint32).tolist()


SPECIAL = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, -3.4028235e38, 1 / 3],
                   dtype=np.float32)
# what the device loads: every value finite (a checkpoint holding NaN or inf is refused)
EDGES = np.array([0.0, -0.0, 3.4028235e38, -1e-45, 7e-42, 1e-45, -3.4028235e38, 1 / 3],
                 dtype=np.float32)


def sample(seed=0, finite=False):
    rng = np.random.default_rng(seed)
    special = EDGES if finite else SPECIAL
    trainable = {
        "fc1.weight": rng.standard_normal((4, 3)).astype(np.float32),
        "fc1.bias": special.copy(),
        "s": np.float32(2.5),  # a 0-d parameter
    }
    frozen = {
        "embed": rng.standard_normal((2, 2, 2)).astype(np.float32),
        "w": np.zeros((0,), np.float32),
    }
    momentums = {
        "fc1.weight": [rng.standard_normal((4, 3)).astype(np.float32),
                       np.abs(rng.standard_normal((4, 3))).astype(np.float32)],
        "fc1.bias": [special[::-1].copy(), np.ones(8, np.float32)],
    }
    properties = {"epoch": 3, "neg": -(2 ** 63), "zero": 0, "loss": 0.25, "lr0": 0.0,
                  "tiny": 1e-30, "note": "héllo ✓", "empty": ""}
    return trainable, frozen, momentums, properties


def build_sample(**kw):
    trainable, frozen, momentums, properties = sample()
    args = dict(optimizer_step=41, initial_learning_rate=0.01, momentums=momentums,
                properties=properties)
    args.update(kw)
    return build_checkpoint(trainable, frozen, **args)


def f32(x):
    return float(np.float32(x))


def device_state(nominal=False):
    """A CheckpointState built by hand, as a board would hold it."""
    state = CheckpointState()
    params = [
        Parameter("layer.weight", (2, 3), array("f", [0.5, -1.25, 3.0, -3.4e38, -0.0, 7e-42]),
                  True),
        Parameter("layer.bias", (3,), array("f", [1.0, 2.0, 3.0]), True),
        Parameter("b", (), array("f", [9.5]), True),
        Parameter("frozen.w", (2, 1, 2), array("f", [0.1, 0.2, 0.3, 0.4]), False),
    ]
    for p in params:
        if nominal:
            p.data = None
        state.parameters[p.name] = p
        state.parameter_order.append(p.name)
    state.is_nominal = nominal
    if not nominal:
        state.optimizer_step = 12
        state.initial_learning_rate = 0.125
        state.momentums = {
            "layer.weight": [array("f", [0.1] * 6), array("f", [0.01 * i for i in range(6)])],
            "layer.bias": [array("f", [-1.0, 0.0, 1.0]), array("f", [4.0, 5.0, 6.0])],
        }
    state.properties = {"epoch": 7, "best_loss": 0.375, "tag": "run-α", "big": 2 ** 40,
                        "zero_f": 0.0}
    return state


def device_bytes(tmp_path, state=None, include_optimizer_state=True):
    path = str(tmp_path / "device_ckpt")
    CheckpointState.save_checkpoint(state or device_state(), path, include_optimizer_state)
    return Path(path).read_bytes()


def device_load(tmp_path, data):
    path = tmp_path / "to_device"
    path.write_bytes(data)
    return CheckpointState.load_checkpoint(str(path))


# --------------------------------------------------------------------- generic FlatBuffers


def fb_offset(t, index):
    return t.Offset(4 + 2 * index)


def fb_string(t, index):
    o = fb_offset(t, index)
    return t.String(t.Pos + o).decode("utf-8") if o else None


def fb_tables(t, index):
    o = fb_offset(t, index)
    if not o:
        return []
    start = t.Vector(o)
    return [Table(t.Bytes, t.Indirect(start + 4 * i)) for i in range(t.VectorLen(o))]


def fb_tensor(t):
    dims_o, raw_o = fb_offset(t, 2), fb_offset(t, 4)
    dims = tuple(t.GetVectorAsNumpy(N.Int64Flags, dims_o).tolist()) if dims_o else None
    raw = t.GetVectorAsNumpy(N.Uint8Flags, raw_o).tobytes() if raw_o else None
    return fb_string(t, 0), dims, t.GetSlot(4 + 2 * 3, 0, N.Int32Flags), raw


def fb_walk(buf):
    """Read a checkpoint with the flatbuffers package's generic Table API only."""
    assert flatbuffers.util.BufferHasIdentifier(buf, 0, b"ODTC")
    root = Table(bytearray(buf), flatbuffers.encode.Get(flatbuffers.packer.uoffset, buf, 0))
    out = {"version": root.GetSlot(4, 0, N.Int32Flags)}
    module = Table(root.Bytes, root.Indirect(root.Pos + fb_offset(root, 1)))
    out["trainable"] = [fb_tensor(t) for t in fb_tables(module, 0)]
    out["frozen"] = [fb_tensor(t) for t in fb_tables(module, 1)]
    out["nominal"] = bool(module.GetSlot(4 + 2 * 2, 0, N.BoolFlags))
    out["groups"] = []
    for g in fb_tables(root, 2):
        states = {fb_string(s, 0): [fb_tensor(m) for m in fb_tables(s, 1)]
                  for s in fb_tables(g, 3)}
        out["groups"].append((fb_string(g, 0), g.GetSlot(6, 0, N.Int64Flags),
                              g.GetSlot(8, 0.0, N.Float32Flags), states))
    props = {}
    if fb_offset(root, 3):
        bag = Table(root.Bytes, root.Indirect(root.Pos + fb_offset(root, 3)))
        for p in fb_tables(bag, 0):
            props[fb_string(p, 0)] = p.GetSlot(6, 0, N.Int64Flags)
        for p in fb_tables(bag, 1):
            props[fb_string(p, 0)] = p.GetSlot(6, 0.0, N.Float32Flags)
        for p in fb_tables(bag, 2):
            props[fb_string(p, 0)] = fb_string(p, 1)
    out["properties"] = props
    return out


# --------------------------------------------------------------------- host -> host


def test_host_round_trip(tmp_path):
    trainable, frozen, momentums, properties = sample()
    path = tmp_path / "checkpoint"
    write_checkpoint(path, trainable, frozen, optimizer_step=41, initial_learning_rate=0.01,
                     momentums=momentums, properties=properties)
    ckpt = read_checkpoint(path)
    assert list(ckpt.trainable) == list(trainable)  # file order = dict order
    assert list(ckpt.frozen) == list(frozen)
    for mine, theirs in ((ckpt.trainable, trainable), (ckpt.frozen, frozen)):
        for name, value in theirs.items():
            assert mine[name].dtype == np.float32
            assert mine[name].shape == np.shape(value), name
            assert bits(mine[name]) == bits(value), name
    assert not ckpt.is_nominal
    assert ckpt.optimizer_step == 41
    assert ckpt.initial_learning_rate == f32(0.01)
    assert list(ckpt.momentums) == ["fc1.weight", "fc1.bias"]
    for name, ms in momentums.items():
        assert [bits(m) for m in ckpt.momentums[name]] == [bits(m) for m in ms]
        assert all(m.shape == trainable[name].shape for m in ckpt.momentums[name])
    expected = {k: (f32(v) if isinstance(v, float) else v) for k, v in properties.items()}
    assert ckpt.properties == expected
    assert {k: type(v) for k, v in ckpt.properties.items()} == \
        {k: type(v) for k, v in expected.items()}
    # ints, then floats, then strings, each sorted by name
    assert list(ckpt.properties) == ["epoch", "neg", "zero", "loss", "lr0", "tiny",
                                     "empty", "note"]


def test_host_round_trip_without_optimizer_state():
    trainable, frozen, _, _ = sample()
    ckpt = parse_checkpoint(build_checkpoint(trainable, frozen))
    assert ckpt.optimizer_step is None and ckpt.initial_learning_rate is None
    assert ckpt.momentums == {} and ckpt.properties == {}
    assert sorted(ckpt.trainable) == sorted(trainable)
    # a step alone still writes the (empty) group
    ckpt = parse_checkpoint(build_checkpoint(trainable, frozen, optimizer_step=0,
                                             initial_learning_rate=0.0))
    assert ckpt.optimizer_step == 0 and ckpt.initial_learning_rate == 0.0


def test_host_round_trip_nominal(tmp_path):
    trainable, frozen, _, properties = sample()
    write_checkpoint(tmp_path / "nominal", trainable, frozen, nominal=True,
                     properties=properties)
    ckpt = read_checkpoint(tmp_path / "nominal")
    assert ckpt.is_nominal
    assert list(ckpt.trainable) == list(trainable) and list(ckpt.frozen) == list(frozen)
    assert all(a.size == 0 and a.dtype == np.float32
               for a in list(ckpt.trainable.values()) + list(ckpt.frozen.values()))
    assert ckpt.properties["note"] == "héllo ✓"
    full = build_checkpoint(trainable, frozen, properties=properties)
    raw_bytes = sum(np.asarray(a, np.float32).nbytes for a in {**trainable, **frozen}.values())
    assert (tmp_path / "nominal").stat().st_size < len(full) - raw_bytes + 8 * 5
    walked = fb_walk((tmp_path / "nominal").read_bytes())
    assert walked["nominal"]
    # microtrain's nominal tensors keep their real dims and have an empty raw_data vector.
    # ORT 1.19.2's own nominal checkpoints have empty dims instead (tests/data/ort-1.19.2/
    # nominal_checkpoint); ORT 1.19.2 loads ours (scripts/ort_interop.py). Both vectors must be
    # present: ORT refuses a tensor lacking either. See contract/checkpoint.fbs.
    shapes = {n: np.shape(a) for n, a in {**trainable, **frozen}.items()}
    assert all(dims == shapes[name] and raw == b"" and dtype == 1
               for name, dims, dtype, raw in walked["trainable"] + walked["frozen"])
    ort = fb_walk((ROOT / "tests" / "data" / "ort-1.19.2" / "nominal_checkpoint").read_bytes())
    assert ort["nominal"] and ort["trainable"]
    assert all(dims == () and raw == b"" and dtype == 1  # empty vectors, not absent ones
               for _, dims, dtype, raw in ort["trainable"] + ort["frozen"])


def test_host_written_buffer_reads_with_generic_flatbuffers():
    trainable, frozen, momentums, properties = sample()
    walked = fb_walk(build_sample())
    assert walked["version"] == 2
    assert [t[0] for t in walked["trainable"]] == list(trainable)
    for name, dims, dtype, raw in walked["trainable"] + walked["frozen"]:
        value = {**trainable, **frozen}[name]
        assert dims == np.shape(value) and dtype == 1
        assert raw == np.asarray(value, "<f4").tobytes()
    (group_name, step, lr, states), = walked["groups"]
    assert (group_name, step, lr) == ("group0", 41, f32(0.01))
    assert [m[0] for m in states["fc1.weight"]] == ["momentum0", "momentum1"]
    assert walked["properties"]["note"] == "héllo ✓"


def test_host_writer_rejects_bad_arguments(tmp_path):
    trainable, frozen, momentums, _ = sample()
    with pytest.raises(CheckpointError, match="both trainable and frozen"):
        build_checkpoint(trainable, {"s": np.zeros(1)})
    with pytest.raises(CheckpointError, match="momentum1 of 'fc1.bias' has shape"):
        build_checkpoint(trainable, frozen, momentums={"fc1.bias": [SPECIAL, np.zeros(3)]})
    with pytest.raises(CheckpointError, match="not trainable"):
        build_checkpoint(trainable, frozen, momentums={"embed": [np.zeros((2, 2, 2))]})
    with pytest.raises(CheckpointError, match="property 'x' must be an int, float or str"):
        build_checkpoint(trainable, frozen, properties={"x": [1]})
    with pytest.raises(CheckpointError, match="int64"):
        build_checkpoint(trainable, frozen, properties={"x": 2 ** 63})
    with pytest.raises(CheckpointError, match="dtype"):
        build_checkpoint({"t": np.array(["a"])}, {})
    with pytest.raises(CheckpointError, match="nominal"):
        build_checkpoint(trainable, frozen, nominal=True, momentums=momentums)
    with pytest.raises(CheckpointError, match="cannot write checkpoint"):
        write_checkpoint(tmp_path / "no" / "such" / "dir", trainable, frozen)
    with pytest.raises(CheckpointError, match="cannot read checkpoint '.*missing'"):
        read_checkpoint(tmp_path / "missing")


# --------------------------------------------------------------------- host -> device


def test_host_write_device_read(tmp_path):
    trainable, frozen, momentums, properties = sample(finite=True)
    path = tmp_path / "checkpoint"
    write_checkpoint(path, trainable, frozen, optimizer_step=41, initial_learning_rate=0.01,
                     momentums=momentums, properties=properties)
    state = CheckpointState.load_checkpoint(str(path))
    assert state.parameter_order == list(trainable) + list(frozen)
    for params, requires_grad in ((trainable, True), (frozen, False)):
        for name, value in params.items():
            p = state.parameters[name]
            assert p.requires_grad is requires_grad, name
            assert tuple(p.shape) == np.shape(value), name
            assert bits(p.data) == bits(value), name
    assert not state.is_nominal
    assert state.optimizer_step == 41
    assert state.initial_learning_rate == f32(0.01)
    assert sorted(state.momentums) == sorted(momentums)
    for name, ms in momentums.items():
        assert [bits(m) for m in state.momentums[name]] == [bits(m) for m in ms]
    assert state.properties == {k: (f32(v) if isinstance(v, float) else v)
                                for k, v in properties.items()}
    assert isinstance(state.properties["lr0"], float)  # 0.0 is left out of the file


@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("where", ["parameter", "moment"])
def test_device_refuses_non_finite_state(tmp_path, value, where):
    # A NaN or infinite parameter or moment would train into NaN (or freeze a weight)
    # without a word: refused at load, naming the tensor and the position.
    trainable, frozen, momentums, _ = sample(finite=True)
    bad = {"parameter": trainable["fc1.weight"], "moment": momentums["fc1.weight"][1]}[where]
    bad.reshape(-1)[5] = value
    path = tmp_path / "checkpoint"
    write_checkpoint(path, trainable, frozen, optimizer_step=1, momentums=momentums)
    what = {"parameter": "parameter 'fc1.weight'", "moment": "momentum1 of 'fc1.weight'"}[where]
    with pytest.raises(DeviceCheckpointError, match=r"^checkpoint '.*checkpoint': %s holds "
                       r"-?%s at position 5 \(a parameter, moment or statistic must be finite\)$"
                       % (what, "nan" if value != value else "inf")):
        CheckpointState.load_checkpoint(str(path))


@pytest.mark.parametrize("source", ["path", "buffer"])
@pytest.mark.parametrize("position", [0, 63, 64, 65, 199])
@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
def test_device_finds_a_non_finite_value_anywhere(tmp_path, value, position, source):
    # the check reads 256 bytes (64 floats) at a time and judges each float by its
    # exponent bits: every place in a chunk, across the chunk boundary and in the last,
    # short chunk; from a file and from a buffer (a checkpoint in flash)
    big = np.linspace(-3e38, 3e38, 200).astype(np.float32)   # finite, large, -0 free
    big[position] = value
    path = tmp_path / "checkpoint"
    write_checkpoint(path, {"w": np.ones(2, np.float32)}, {"big": big})
    with pytest.raises(DeviceCheckpointError, match=r"'big' holds -?%s at position %d \(" % (
            "nan" if value != value else "inf", position)):
        CheckpointState.load_checkpoint(str(path) if source == "path" else path.read_bytes())


def test_device_loads_state_from_a_buffer_as_from_its_file(tmp_path):
    # a checkpoint passed as a buffer (a frozen bytes object, a file in ROMFS) gives the
    # same parameters and moments as its file: the values are copied out of the buffer
    # into arrays of their type (a byte slice cannot be assigned to a float view)
    trainable, frozen, momentums, _ = sample(finite=True)
    path = tmp_path / "checkpoint"
    write_checkpoint(path, trainable, frozen, optimizer_step=3, momentums=momentums)
    from_file = CheckpointState.load_checkpoint(str(path))
    from_buffer = CheckpointState.load_checkpoint(path.read_bytes())
    for name in from_file.parameters:
        assert bits(from_buffer.parameters[name].data) == bits(from_file.parameters[name].data)
    for name in momentums:
        assert [bits(m) for m in from_buffer.momentums[name]] == \
            [bits(m) for m in from_file.momentums[name]]


def test_device_loads_an_unobserved_range(tmp_path):
    # a QAT observer's [min, max] is [inf, -inf] until it has seen a batch: the one
    # parameter that may hold an infinity (never a NaN)
    path = tmp_path / "checkpoint"
    write_checkpoint(path, {"w": np.ones(2, np.float32)},
                     {"x.observer_range": np.array([np.inf, -np.inf], np.float32)})
    state = CheckpointState.load_checkpoint(str(path))
    assert list(state.parameters["x.observer_range"].data) == [np.inf, -np.inf]
    write_checkpoint(path, {"w": np.ones(2, np.float32)},
                     {"x.observer_range": np.array([np.nan, -np.inf], np.float32)})
    with pytest.raises(DeviceCheckpointError, match="'x.observer_range' holds nan"):
        CheckpointState.load_checkpoint(str(path))


def test_host_nominal_device_read(tmp_path):
    trainable, frozen, _, _ = sample()
    path = tmp_path / "nominal"
    write_checkpoint(path, trainable, frozen, nominal=True)
    state = CheckpointState.load_checkpoint(str(path))
    assert state.is_nominal
    assert state.parameter_order == list(trainable) + list(frozen)
    assert all(state.parameters[n].requires_grad for n in trainable)
    assert not any(state.parameters[n].requires_grad for n in frozen)
    assert all(p.data is None for p in state.parameters.values())


# --------------------------------------------------------------------- device -> host


def test_device_write_host_read(tmp_path):
    state = device_state()
    data = device_bytes(tmp_path, state)
    ckpt = parse_checkpoint(data, "device")
    assert sorted(ckpt.trainable) == ["b", "layer.bias", "layer.weight"]
    assert list(ckpt.frozen) == ["frozen.w"]
    for name, p in state.parameters.items():
        got = (ckpt.trainable if p.requires_grad else ckpt.frozen)[name]
        assert got.shape == tuple(p.shape), name
        assert bits(got) == bits(p.data), name
    assert ckpt.optimizer_step == 12
    assert ckpt.initial_learning_rate == 0.125
    assert sorted(ckpt.momentums) == sorted(state.momentums)
    for name, ms in state.momentums.items():
        assert [bits(m) for m in ckpt.momentums[name]] == [bits(m) for m in ms]
    assert ckpt.properties == state.properties
    assert not ckpt.is_nominal

    # The same buffer through the flatbuffers package's generic Table API.
    walked = fb_walk(data)
    assert walked["version"] == 2 and not walked["nominal"]
    for name, dims, dtype, raw in walked["trainable"] + walked["frozen"]:
        p = state.parameters[name]
        assert (dims, dtype, raw) == (tuple(p.shape), 1, bytes(p.data))
    (group_name, step, lr, states), = walked["groups"]
    assert (group_name, step, lr) == ("group0", 12, 0.125)
    assert [m[0] for m in states["layer.bias"]] == ["momentum0", "momentum1"]
    assert walked["properties"] == state.properties

    # And the device reads its own file back.
    again = device_load(tmp_path, data)
    assert {n: bits(p.data) for n, p in again.parameters.items()} == \
        {n: bits(p.data) for n, p in state.parameters.items()}
    assert again.properties == state.properties


def test_device_write_without_optimizer_state(tmp_path):
    data = device_bytes(tmp_path, include_optimizer_state=False)
    ckpt = parse_checkpoint(data)
    assert ckpt.optimizer_step is None and ckpt.momentums == {}


def test_device_nominal_write_host_read(tmp_path):
    ckpt = parse_checkpoint(device_bytes(tmp_path, device_state(nominal=True)))
    assert ckpt.is_nominal
    assert sorted(ckpt.trainable) == ["b", "layer.bias", "layer.weight"]
    assert list(ckpt.frozen) == ["frozen.w"]


# --------------------------------------------------------------------- corrupt input


def small_host(nominal=False):
    # One-letter names: the Builder pads after them, and that padding must not end the file.
    kw = dict(nominal=True) if nominal else dict(
        optimizer_step=3, momentums={"w": [np.array([1.5, -2.0], np.float32)]})
    return build_checkpoint({"w": np.array([0.5, 0.25], np.float32)},
                            {"f": np.array([[3.0]], np.float32)},
                            properties={"i": 1, "x": 0.5, "s": "t"}, **kw)


def small_device(tmp_path, nominal=False):
    state = CheckpointState()
    w = Parameter("w", (2,), None if nominal else array("f", [0.5, 0.25]), True)
    f = Parameter("f", (1, 1), None if nominal else array("f", [3.0]), False)
    state.parameters = {"w": w, "f": f}
    state.is_nominal = nominal
    if not nominal:
        state.momentums = {"w": [array("f", [1.5, -2.0])]}
        state.optimizer_step = 3
    state.properties = {"i": 1, "x": 0.5, "s": "t"}
    return device_bytes(tmp_path, state)


@pytest.fixture(params=["host", "host-nominal", "device", "device-nominal"])
def small(request, tmp_path):
    nominal = request.param.endswith("nominal")
    if request.param.startswith("host"):
        return small_host(nominal)
    return small_device(tmp_path, nominal)


def test_small_checkpoints_load(small, tmp_path):
    ckpt = parse_checkpoint(small)
    assert set(ckpt.trainable) == {"w"} and set(ckpt.frozen) == {"f"}
    assert ckpt.properties == {"i": 1, "x": 0.5, "s": "t"}
    state = device_load(tmp_path, small)
    assert state.properties == {"i": 1, "x": 0.5, "s": "t"}


def test_every_truncation_is_an_error(small, tmp_path):
    path = tmp_path / "truncated"
    for n in range(len(small)):
        with pytest.raises(CheckpointError):
            parse_checkpoint(small[:n], f"cut at {n}")
        path.write_bytes(small[:n])
        with pytest.raises(CheckpointError, match="truncated"):
            read_checkpoint(path)
        with pytest.raises(DeviceCheckpointError):
            CheckpointState.load_checkpoint(str(path))


def test_random_byte_corruption_raises_only_checkpoint_errors(small, tmp_path):
    """300 random single-byte corruptions: every one is refused by both readers (the CRC-32
    trailer catches what the structure checks cannot), and only with CheckpointError."""
    rng = random.Random(1234)
    path = tmp_path / "corrupt"
    for i in range(300):
        data = bytearray(small)
        pos = rng.randrange(len(data))
        data[pos] ^= rng.randrange(1, 256)
        with pytest.raises(CheckpointError):
            parse_checkpoint(bytes(data), f"flip {i} at {pos}")
        path.write_bytes(data)
        with pytest.raises(DeviceCheckpointError):
            CheckpointState.load_checkpoint(str(path))


def test_wrong_identifier(tmp_path):
    data = bytearray(small_host())
    data[4:8] = b"XXXX"
    with pytest.raises(CheckpointError, match=r"'bad': not a training checkpoint: file "
                                              r"identifier b'XXXX', expected b'ODTC'"):
        parse_checkpoint(bytes(data), "bad")
    with pytest.raises(DeviceCheckpointError, match="not a training checkpoint.*XXXX.*ODTC"):
        device_load(tmp_path, bytes(data))
    with pytest.raises(CheckpointError, match="size-prefixed"):
        parse_checkpoint(len(small_host()).to_bytes(4, "little") + small_host())


def test_wrong_version(tmp_path, monkeypatch):
    monkeypatch.setattr(host_ckpt, "VERSION", 3)
    data = small_host()
    monkeypatch.undo()
    with pytest.raises(CheckpointError, match=r"version 3 is not supported \(expected 2\)"):
        parse_checkpoint(data)
    with pytest.raises(DeviceCheckpointError, match=r"version 3 is not supported \(expected 2\)"):
        device_load(tmp_path, data)
    monkeypatch.setattr(device_checkpoint_writer, "VERSION", 1)
    data = small_device(tmp_path)
    monkeypatch.undo()
    with pytest.raises(CheckpointError, match="version 1 is not supported"):
        parse_checkpoint(data)


def hand_built(dtype=1, dims=(2,), raw=b"\0" * 8):
    """A checkpoint with one tensor written field by field with the flatbuffers Builder."""
    b = flatbuffers.Builder(256)
    name = b.CreateString("t")
    dims_vector = b.CreateNumpyVector(np.array(dims, dtype=np.int64))
    raw_vector = b.CreateByteVector(raw)
    b.StartObject(7)
    b.PrependUOffsetTRelativeSlot(0, name, 0)
    b.PrependUOffsetTRelativeSlot(2, dims_vector, 0)
    b.PrependInt32Slot(3, dtype, 0)
    b.PrependUOffsetTRelativeSlot(4, raw_vector, 0)
    tensor = b.EndObject()
    b.StartVector(4, 1, 4)
    b.PrependUOffsetTRelative(tensor)
    params = b.EndVector()
    b.StartObject(4)
    b.PrependUOffsetTRelativeSlot(0, params, 0)
    module = b.EndObject()
    b.StartObject(4)
    b.PrependInt32Slot(0, 2, 0)
    b.PrependUOffsetTRelativeSlot(1, module, 0)
    b.Finish(b.EndObject(), file_identifier=b"ODTC")
    return bytes(b.Output())


def test_unsupported_data_type_and_size_mismatch(tmp_path):
    assert bits(parse_checkpoint(hand_built()).trainable["t"]) == [0, 0]
    with pytest.raises(CheckpointError, match=r"tensor 't' has ONNX data type 7 \(INT64\); "
                                              r"only FLOAT \(1\), INT8 \(3\), INT16 \(5\) and "
                                              r"INT32 \(6\) are supported"):
        parse_checkpoint(hand_built(dtype=7, raw=b"\0" * 16))
    with pytest.raises(DeviceCheckpointError, match="data type 7"):
        device_load(tmp_path, hand_built(dtype=7, raw=b"\0" * 16))
    with pytest.raises(CheckpointError, match=r"'t' has 12 bytes of raw_data; dims \[2\] need 8"):
        parse_checkpoint(hand_built(raw=b"\0" * 12))
    with pytest.raises(DeviceCheckpointError, match="12 data bytes"):
        device_load(tmp_path, hand_built(raw=b"\0" * 12))
    with pytest.raises(CheckpointError, match="negative dimension"):
        parse_checkpoint(hand_built(dims=(-2,)))


# --------------------------------------------------------------------- atomic saves


def test_failed_device_save_keeps_previous_checkpoint(tmp_path, monkeypatch):
    path = str(tmp_path / "ckpt")
    CheckpointState.save_checkpoint(device_state(), path, include_optimizer_state=True)
    before = Path(path).read_bytes()

    real_write = fbwriter.write

    def write_half_then_fail(stream, root, identifier):
        buf = io.BytesIO()
        real_write(buf, root, identifier)
        stream.write(buf.getvalue()[:len(buf.getvalue()) // 2])
        raise OSError(28, "No space left on device")

    changed = device_state()
    changed.parameters["layer.bias"].data = array("f", [7.0, 8.0, 9.0])
    monkeypatch.setattr(fbwriter, "write", write_half_then_fail)
    with pytest.raises(DeviceCheckpointError, match="cannot write checkpoint"):
        CheckpointState.save_checkpoint(changed, path, include_optimizer_state=True)
    monkeypatch.setattr(fbwriter, "write", lambda *a: 1 / 0)  # not even an OSError
    with pytest.raises(ZeroDivisionError):
        CheckpointState.save_checkpoint(changed, path)
    monkeypatch.undo()

    assert Path(path).read_bytes() == before
    state = CheckpointState.load_checkpoint(path)
    assert list(state.parameters["layer.bias"].data) == [1.0, 2.0, 3.0]
    assert parse_checkpoint(before).trainable["layer.bias"].tolist() == [1.0, 2.0, 3.0]

    # A later save that succeeds replaces the file.
    CheckpointState.save_checkpoint(changed, path, include_optimizer_state=True)
    assert read_checkpoint(path).trainable["layer.bias"].tolist() == [7.0, 8.0, 9.0]


def test_failed_host_write_keeps_previous_checkpoint(tmp_path, monkeypatch):
    trainable, frozen, _, _ = sample()
    path = tmp_path / "ckpt"
    write_checkpoint(path, trainable, frozen)
    before = path.read_bytes()

    def fail(*args):
        raise OSError(5, "I/O error")

    monkeypatch.setattr(os, "fsync", fail)
    with pytest.raises(CheckpointError, match="cannot write checkpoint.*I/O error"):
        write_checkpoint(path, {"other": np.ones(3)}, {})
    monkeypatch.undo()
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["ckpt"]  # no temporary file left behind
    assert list(read_checkpoint(path).trainable) == list(trainable)
