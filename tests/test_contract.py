"""The host and the device share no code; these tests keep their contract in sync."""
import re

from conftest import ROOT
from microtrain import opcodes as device_ops
from microtrain_host import opcodes as host_ops
from microtrain_host.pipeline.lower import LOWERINGS, ROLES
from microtrain import blob as device_blob


def test_op_codes_agree():
    text = (ROOT / "device" / "microtrain" / "opcodes.py").read_text()
    device = {name: int(v) for name, v in re.findall(r"^(\w+) = const\((\d+)\)", text, re.M)}
    host = {name: value for name, value in vars(host_ops).items()
            if name.isupper() and isinstance(value, int)}
    assert device == host
    assert set(device_ops.SIGNATURES) == set(host.values())


def test_every_kernel_exists_with_its_load_time_checker():
    # "Validate once at load, kernels trust their inputs": blob._read_steps calls
    # <kernel>_check(args, c) for every step.
    for code, (family, function, *_rest) in device_ops.SIGNATURES.items():
        module = device_ops.kernel_module(family)
        assert callable(getattr(module, function)), (code, function)
        assert callable(getattr(module, function + "_check", None)), (code, function + "_check")


def test_roles_agree():
    assert tuple(ROLES) == tuple(device_blob.ROLE_NAMES)


def test_schema_lists_the_fields_the_reader_uses():
    schema = (ROOT / "host" / "microtrain_host" / "schema" / "microtrain.fbs").read_text()
    model = re.search(r"table Model \{(.*?)\}", schema, re.S).group(1)
    fields = re.findall(r"^\s+(\w+):", model, re.M)
    assert fields[:12] == ["format_version", "producer", "tensors", "parameters", "programs",
                           "float_arena", "int_arena", "loss", "num_classes", "optimizer",
                           "naive_size", "lower_bound"]
    assert 'file_identifier "MTRB"' in schema
    assert LOWERINGS  # every lowering targets codes checked above
