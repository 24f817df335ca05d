"""Crafted blobs and checkpoints (CRC-32 recomputed, so only the structural checks stand in
the way) and crafted kernel arguments: each is refused with microtrain's own error and a
message naming the field, or, for data the loader cannot see, computed without raising.
The mutation fuzzing itself is in test_fuzz.py."""
import math
import shutil
import struct
import tracemalloc
from array import array

import pytest
import torch

import microtrain_host as mh
from conftest import ROOT, run_micropython
from microtrain import CheckpointState, Module, Optimizer, blob as blobfile
from microtrain import arenas
from microtrain import loader as blobfile_loader
from microtrain import parser as blobfile_parser
from microtrain.stepcheck import StepCheck
from microtrain.crc32 import crc32
from microtrain.errors import BlobError, CheckpointError, OutOfMemoryError
from microtrain.flatbuf import Reader
from microtrain.kernels import conv, dense, elementwise, norm, optim, pool, resize
from torch_reference import export, mlp

DIGITS = ROOT / "examples" / "digits" / "mlp.onnx"


@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    directory = tmp_path_factory.mktemp("hardening")
    mh.generate_artifacts(str(DIGITS), loss="CrossEntropyLoss", optimizer="AdamW",
                          artifact_directory=directory, batch_size=4)
    return directory


def crafted(directory, tmp_path, edit):
    """A copy of the digits artifacts whose blob went through edit(data, reader, root), the
    CRC-32 recomputed; returns the blob's path."""
    for name in ("model.mtb", "checkpoint"):
        shutil.copyfile(directory / name, tmp_path / name)
    path = tmp_path / "model.mtb"
    data = bytearray(path.read_bytes())
    size = struct.unpack_from("<I", data, 0)[0]
    r = Reader(memoryview(bytes(data))[:4 + size], BlobError, start=4)
    edit(data, r, r.root())
    struct.pack_into("<I", data, 4 + size, crc32(memoryview(data)[4:4 + size]) & 0xFFFFFFFF)
    path.write_bytes(bytes(data))
    return str(path)


def first_step(r, root, function):
    """The step table of the first step, in any program, that runs kernel `function`."""
    from microtrain.opcodes import signature
    for program in r.tables(root, 4, "program"):
        for t in r.tables(program, 1, "step"):
            if signature(r.scalar(t, 0, "H", 0))[1] == function:
                return t
    raise AssertionError(function)


def load(path, tmp_path):
    state = CheckpointState.load_checkpoint(str(tmp_path / "checkpoint"))
    return Module(path, state)


def test_altered_arena_size_is_refused_before_anything_is_allocated(digits, tmp_path):
    def edit(data, r, root):
        struct.pack_into("<I", data, r.field(root, 5), 600_000_000)  # a 2.4 GB float arena
    path = crafted(digits, tmp_path, edit)
    tracemalloc.start()
    with pytest.raises(BlobError, match=r"^the float arena is 600000000 elements, its tensors "
                                        r"need \d+$"):
        load(path, tmp_path)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 1_000_000


def test_arenas_that_do_not_fit_name_the_bytes_needed(digits, monkeypatch):
    def no_memory(typecode, n):
        raise MemoryError
    monkeypatch.setattr(arenas, "zeros", no_memory)
    b = blobfile_parser.load(str(digits / "model.mtb"))
    with pytest.raises(OutOfMemoryError, match=r"needs %d bytes of arenas \(%d floats, %d ints\) "
                       r"besides the parsed blob; the heap has an unknown number of bytes free \(each "
                       r"arena needs one contiguous block\)"
                       % (4 * (b.float_arena + b.int_arena), b.float_arena, b.int_arena)):
        blobfile_loader.load_into_arenas(str(digits / "model.mtb"))


def test_arenas_that_do_not_fit_on_micropython(digits, micropython, tmp_path):
    script = tmp_path / "small_heap.py"
    # A ballast fills the heap until about 45 KB are left (of which the Unix port's split
    # heap cannot hand out all): room for the runtime at work, not for the 41 KB arena.
    # Its last 8 KB are freed again, so that the 6 KB blob file is read whatever holes the
    # imports left (the runtime's bytecode is in this heap too) and the arena is what fails.
    # The kernel families the blob uses are imported first: parsing imports them, and their
    # bytecode would not fit in what the ballast leaves.
    script.write_text(
        "import gc\n"
        "ballast = [None] * 2000\n"          # before the imports fragment the heap
        "from microtrain import loader, OutOfMemoryError\n"
        "from microtrain.opcodes import kernel_module\n"
        "for family in ('dense', 'activation', 'loss', 'optim', 'reduce'):\n"
        "    kernel_module(family)\n"
        "gc.collect()\n"
        "i = 0\n"
        "while gc.mem_free() > 45000:\n"
        "    ballast[i] = bytearray(250)\n"
        "    i += 1\n"
        "for k in range(i - 32, i):\n"
        "    ballast[k] = None\n"
        "gc.collect()\n"
        "try:\n"
        "    loader.load_into_arenas(%r)\n"
        "except OutOfMemoryError as e:\n"
        "    print('refused:', e)\n" % str(digits / "model.mtb"))
    out = run_micropython(micropython, script, heap="256K")
    assert out.startswith("refused: '%s' needs 41196 bytes of arenas (10295 floats, 4 ints) "
                          "besides the parsed blob; the heap has " % (digits / "model.mtb")), out
    free = int(out.split("the heap has ")[1].split()[0])
    assert 0 < free < 45000 + 8000


@pytest.mark.parametrize("function,field,fmt,value,message", [
    # m, the rows of Y and A, made larger than Y
    ("gemm", 2, "<i", 1000, r"^train step \d+ \(gemm\): elements \[0, \d+\] lie outside "
                            r"tensor '.+' \[0, \d+\)$"),
    ("adamw", 3, "<f", 1.5, r"^optimizer step \d+ \(adamw\): beta1 is 1.5, outside "
                            r"\[0.0, 1.0\]$"),
], ids=["gemm_rows", "adamw_beta1"])
def test_crafted_step_argument_is_refused(digits, tmp_path, function, field, fmt, value, message):
    def edit(data, r, root):
        pos, _ = r.vector(first_step(r, root, function), field, 4, "step arguments")
        struct.pack_into(fmt, data, pos, value)  # the step's first int or float
    with pytest.raises(BlobError, match=message):
        load(crafted(digits, tmp_path, edit), tmp_path)


def test_swapped_optimizer_state_is_refused(digits, tmp_path):
    def edit(data, r, root):
        pos, _ = r.vector(first_step(r, root, "adamw"), 1, 4, "tensors")
        m, v = struct.unpack_from("<II", data, pos + 8)
        struct.pack_into("<II", data, pos + 8, v, m)  # AdamW's m and v swapped
    path = crafted(digits, tmp_path, edit)
    with pytest.raises(BlobError, match=r"^optimizer step \d+ \(adamw\): the optimizer state "
                                        r"arguments are not the state of parameter '.+'$"):
        load(path, tmp_path)


def test_optimizer_table_out_of_range_is_refused(tmp_path):
    mh.generate_artifacts(export(mlp(6, 3), torch.zeros(1, 6)), loss="CrossEntropyLoss",
                          optimizer="AdamW", optimizer_options={"beta1": 0.5},
                          artifact_directory=tmp_path / "a", batch_size=2)

    def edit(data, r, root):
        struct.pack_into("<f", data, r.field(r.table(root, 9, "optimizer"), 2), 1.0)
    path = crafted(tmp_path / "a", tmp_path, edit)
    with pytest.raises(BlobError, match=r"^optimizer beta1 is 1.0, outside \[0.0, 0.99999994\]$"):
        blobfile_parser.load(path)


def test_negative_second_moment_in_a_checkpoint_is_refused(digits, tmp_path):
    # Train one step, save with optimizer state, make one v element negative, save again.
    state = CheckpointState.load_checkpoint(str(digits / "checkpoint"))
    model = Module(str(digits / "model.mtb"), state)
    optimizer = Optimizer(str(digits / "model.mtb"), model)
    b = model.blob
    x, y = b.programs["train"].inputs
    model(array("f", [0.5] * b.sizes[x]), array("i", [1] * b.sizes[y]))
    optimizer.step()
    name = next(iter(state.momentums))
    state.momentums[name][1][3] = -0.25
    CheckpointState.save_checkpoint(state, str(tmp_path / "crafted"), True)
    resumed = CheckpointState.load_checkpoint(str(tmp_path / "crafted"))
    with pytest.raises(CheckpointError, match=r"^the AdamW second moment of '%s' has a negative "
                                              r"value -0.25 at position 3$" % name):
        Optimizer(str(digits / "model.mtb"), Module(str(digits / "model.mtb"), resumed))


class Check(StepCheck):
    """A StepCheck over a made-up tensor table: tensor argument k spans [start_k, start_k +
    size_k) one after the other; a size of None is an absent optional tensor."""

    def __init__(self, sizes):
        b = blobfile.Blob()
        start = 0
        tensors = []
        for size in sizes:
            if size is None:
                tensors.append(blobfile.NO_TENSOR)
                continue
            tensors.append(len(b.names))
            b.names.append("t%d" % len(b.names))
            b.offsets.append(start)
            b.sizes.append(size)
            b.roles.append(blobfile.ROLE_NAMES.index("activation"))
            start += size
        super().__init__(b)
        self.where = "crafted step"
        self.tensors = tuple(tensors)

    def check(self, checker, args):
        # run a checker on args as the parser would, the step's ints and floats (after the
        # tensor offsets) in c.ints and c.floats: split where c.counts says when a test set
        # it, else by their types
        rest = tuple(args[len(self.tensors):])
        if self.counts == (0, 0):
            self.counts = (sum(isinstance(v, int) for v in rest),
                           sum(isinstance(v, float) for v in rest))
        self.ints, self.floats = rest[:self.counts[0]], rest[self.counts[0]:]
        self.offsets = tuple(args[:len(self.tensors)])
        try:
            return checker(args, self)
        finally:
            self.counts = (0, 0)

    def tensor_offsets(self):
        return tuple(self.blob.offsets[t] if t != blobfile.NO_TENSOR else -1
                     for t in self.tensors)


def test_pool_window_entirely_in_the_padding_is_refused():
    c = Check([2 * 3 * 3, 2 * 4 * 4])
    # 4 output rows from 4 input rows with pad 3 at the top: window 0 reads rows -3..-2
    args = c.tensor_offsets() + (2, 4, 4, 3, 3, 2, 2, 1, 1, 3, 0, 1, 1)
    with pytest.raises(BlobError, match=r"^crafted step: pooling window 0 lies entirely in the "
                                        r"padding$"):
        c.check(pool.max_pool_check, args)


def test_conv_geometry_must_be_positive_and_fit():
    c = Check([2 * 4 * 5 * 5, 2 * 3 * 3 * 3, 4 * 3 * 3 * 3, None])
    # Y and X the wrong way round: X (3 channels of 5x5) does not fit in a 54-element tensor
    x, y, w, _ = c.tensor_offsets()
    args = (x, y, w, -1, 2, 1, 3, 4, 5, 5, 3, 3, 3, 3, 1, 1, 1, 1, 0, 0)
    with pytest.raises(BlobError, match=r"^crafted step: tensor 't1' holds 54 elements, the "
                                        r"step reads or writes 150$"):
        c.check(conv.conv_check, args)
    zero_stride = args[:14] + (0,) + args[15:]
    with pytest.raises(BlobError, match=r"^crafted step: count 0 must be at least 1$"):
        c.check(conv.conv_check, zero_stride)


def test_conv_transpose_bias_and_output_must_fit():
    # The geometry is that of the convolution whose input gradient it is: Y (2 images, 3
    # channels of 5x5) is the mirrored conv's X.
    c = Check([2 * 3 * 5 * 5, 2 * 4 * 3 * 3, 4 * 3 * 3 * 3, 2])
    y, x, w, b = c.tensor_offsets()
    args = (y, x, w, b, 2, 1, 3, 4, 5, 5, 3, 3, 3, 3, 1, 1, 1, 1, 0, 0)
    with pytest.raises(BlobError, match=r"^crafted step: tensor 't3' holds 2 elements, the "
                                        r"step reads or writes 3$"):
        c.check(conv.conv_transpose_check, args)
    c = Check([2 * 3 * 5 * 5 - 1, 2 * 4 * 3 * 3, 4 * 3 * 3 * 3, None])
    with pytest.raises(BlobError, match=r"^crafted step: tensor 't0' holds 149 elements, the "
                                        r"step reads or writes 150$"):
        c.check(conv.conv_transpose_check, c.tensor_offsets() + args[4:])


def _nearest_args(c, rows, cols):
    ints = (2, 3, 4, len(rows), len(cols)) + tuple(rows) + tuple(cols)
    c.counts = (len(ints), 0)
    return c.tensor_offsets() + ints


def test_resize_tables_must_lie_inside_the_input_and_match_the_counts():
    # X: 2 planes of 3x4 upsampled to 2 planes of 6x8 (Y first, then X).
    rows, cols = [0, 0, 1, 1, 2, 2], [0, 0, 1, 1, 2, 2, 3, 3]
    c = Check([2 * 6 * 8, 2 * 3 * 4])
    c.check(resize.resize_nearest_check, _nearest_args(c, rows, cols))   # as packed: fine
    with pytest.raises(BlobError, match=r"^crafted step: source column is 4, outside \[0, 3\]$"):
        c.check(resize.resize_nearest_check, _nearest_args(c, rows, cols[:-1] + [4]))
    with pytest.raises(BlobError, match=r"^crafted step: source row is -1, outside \[0, 2\]$"):
        c.check(resize.resize_nearest_check, _nearest_args(c, [-1] + rows[1:], cols))
    args = _nearest_args(c, rows, cols)
    c.counts = (c.counts[0] - 1, 1)   # the last table entry sent as a float
    with pytest.raises(BlobError, match=r"^crafted step: \(int count, float count\) is "
                                        r"\(18, 1\), expected \(19, 0\)$"):
        c.check(resize.resize_nearest_check, args)
    c = Check([2 * 6 * 8, 2 * 3 * 4 - 1])
    with pytest.raises(BlobError, match=r"^crafted step: tensor 't1' holds 23 elements, the "
                                        r"step reads or writes 24$"):
        c.check(resize.resize_nearest_check, _nearest_args(c, rows, cols))
    c = Check([2 * 6 * 8, 2 * 3 * 4])
    ints = (2, 3, 4, 6, 8)
    c.counts = (5, 0)   # a linear step without its tables
    with pytest.raises(BlobError, match=r"^crafted step: \(int count, float count\) is "
                                        r"\(5, 0\), expected \(33, 28\)$"):
        c.check(resize.resize_linear_check, c.tensor_offsets() + ints)


def test_crafted_resize_table_in_a_blob_is_refused(tmp_path):
    module = torch.nn.Sequential(torch.nn.Conv2d(1, 2, 1), torch.nn.Upsample(scale_factor=2))
    mh.generate_artifacts(export(module, torch.zeros(1, 1, 3, 4)), loss="MSELoss",
                          optimizer="SGD", artifact_directory=tmp_path / "a", batch_size=2)

    def edit(data, r, root):
        pos, _ = r.vector(first_step(r, root, "resize_nearest"), 2, 4, "step ints")
        struct.pack_into("<i", data, pos + 4 * 5, 1000)  # the first row's source row
    path = crafted(tmp_path / "a", tmp_path, edit)
    with pytest.raises(BlobError, match=r"^train step \d+ \(resize_nearest\): source row is "
                                        r"1000, outside \[0, 2\]$"):
        load(path, tmp_path)


def test_batch_norm_needs_two_values_and_a_positive_epsilon():
    c = Check([3, 3, 3, 3, 3, 3])
    args = c.tensor_offsets() + (1, 3, 1, 1e-5, 0.9)
    with pytest.raises(BlobError, match=r"^crafted step: batch statistics need at least 2 values "
                                        r"per channel, got 1$"):
        c.check(norm.batch_norm_training_check, args)
    c = Check([6, 6, 3, 3, 3, 3])
    with pytest.raises(BlobError, match=r"^crafted step: epsilon is 0.0, outside"):
        c.check(norm.batch_norm_training_check, c.tensor_offsets() + (2, 3, 1, 0.0, 0.9))


def test_reduction_walked_with_stride_zero_is_refused():
    # A GEMM whose A stands still along k would loop k times over one element: nothing
    # else bounds k, so a huge k would hang the board.
    c = Check([4, 4, 4, None])
    args = c.tensor_offsets() + (2, 1_000_000, 2, 1, 0, 0, 1, 0, 0, 1.0, 0.0)
    with pytest.raises(BlobError, match=r"^crafted step: a dimension of 1000000 elements is "
                                        r"walked with stride 0$"):
        c.check(dense.gemm_check, args)


def test_data_hazards_do_not_raise():
    # Values the loader cannot see (arena data, restored statistics) give inf or NaN as float
    # math does, not OverflowError or a math domain error.
    F = array("f", [1e30, 0.0, -4.0, 1.0, 0.0, 0.0])
    elementwise.power(F, None, (1, 0, 1, 20.0))
    assert F[1] == math.inf
    optim.clip_coef(F, None, (2, 1.0))  # a negative sum of squares: no clipping factor
    assert F[2] == 1.0
    F = array("f", [2.0, 0.0, 1.0, 0.0, 0.0, -1.0])   # y, x, scale, bias, mean, var
    norm.batch_norm_inference(F, None, (1, 0, 2, 3, 4, 5, 1, 1, 1, 1e-5))
    assert math.isnan(F[1])


def test_kernel_written_int_tensor_over_the_labels_is_refused():
    # A dropout mask placed over the labels would turn checked labels into indices outside
    # their row of scores.
    b = blobfile.Blob()
    for name, role, offset, size in (("labels", "label", 0, 4), ("mask", "activation", 2, 1)):
        b.names.append(name)
        b.dtypes.append(blobfile.INT32)
        b.roles.append(blobfile.ROLE_NAMES.index(role))
        b.offsets.append(offset)
        b.sizes.append(size)
    with pytest.raises(BlobError, match=r"^int tensor 'mask' overlaps the fed tensor 'labels'$"):
        blobfile_parser._check_places(b)


# -- pack time -------------------------------------------------------------------------

def _graph_model(nodes, initializers, output_dims):
    from onnx import TensorProto, helper
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, output_dims)],
        initializer=initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_absurd_batch_is_refused_naming_the_tensor_and_the_limit(tmp_path):
    from microtrain_host.errors import ArtifactError
    with pytest.raises(ArtifactError, match=r"^tensor 'input' has 64000000000 elements \(shape "
                                            r"\[1000000000, 64\]\); a blob holds at most "
                                            r"2\*\*31 - 1 = 2147483647 elements per tensor$"):
        mh.generate_artifacts(str(DIGITS), loss="CrossEntropyLoss", optimizer="SGD",
                              artifact_directory=tmp_path / "big", batch_size=1_000_000_000)
    assert not (tmp_path / "big").exists()  # nothing written for a model that cannot be packed


def test_tile_to_ten_billion_elements_is_refused(tmp_path):
    import numpy as np
    from onnx import helper, numpy_helper
    from microtrain_host.errors import ArtifactError
    model = _graph_model(
        [helper.make_node("MatMul", ["x", "W"], ["h"]),
         helper.make_node("Tile", ["h", "repeats"], ["y"], name="tile")],
        [numpy_helper.from_array(np.ones((4, 3), np.float32), "W"),
         numpy_helper.from_array(np.array([5_000_000_000, 1], np.int64), "repeats")], ["a", "b"])
    with pytest.raises(ArtifactError, match=r"has 30000000000 elements \(shape \[10000000000, 3\]\);"
                                            r" a blob holds at most 2\*\*31 - 1"):
        mh.generate_artifacts(model, loss="MSELoss", optimizer="SGD", artifact_directory=tmp_path)


@pytest.mark.parametrize("op", ["SequenceConstruct", "SplitToSequence"])
def test_sequence_ops_are_unsupported_ops_not_dynamic_shapes(tmp_path, op):
    import numpy as np
    from onnx import helper, numpy_helper
    from microtrain_host.errors import UnsupportedOpError
    sequence = (helper.make_node(op, ["h", "h"], ["s"], name="seq") if op == "SequenceConstruct"
                else helper.make_node(op, ["h"], ["s"], name="seq", axis=1))
    model = _graph_model(
        [helper.make_node("MatMul", ["x", "W"], ["h"]), sequence,
         helper.make_node("ConcatFromSequence", ["s"], ["y"], axis=0, name="cat")],
        [numpy_helper.from_array(np.ones((4, 3), np.float32), "W")], ["a", "b"])
    with pytest.raises(UnsupportedOpError, match=r"^node 'seq' \(%s\): sequence ops are not "
                                                 r"supported; microtrain trains on tensors of "
                                                 r"fixed shapes$" % op):
        mh.generate_artifacts(model, loss="MSELoss", optimizer="SGD", artifact_directory=tmp_path)


def test_train_program_without_a_loss_output_is_refused(digits, tmp_path):
    def edit(data, r, root):
        train = next(p for p in r.tables(root, 4, "program") if r.string(p, 0, "name") == "train")
        count_at = r.vector(train, 3, 4, "outputs")[0] - 4
        struct.pack_into("<I", data, count_at, 0)  # an empty outputs vector
    with pytest.raises(BlobError, match=r"^the train program has no float loss as its first "
                                        r"output$"):
        load(crafted(digits, tmp_path, edit), tmp_path)


def test_blob_that_cannot_be_parsed_names_its_file_size(digits, monkeypatch):
    def no_memory(*args):
        raise MemoryError
    monkeypatch.setattr(blobfile_loader, "parse_root", no_memory)
    size = (digits / "model.mtb").stat().st_size
    with pytest.raises(OutOfMemoryError, match=r"model.mtb' does not fit in the heap: its %d-byte "
                       r"file and the blob parsed from it need more than an unknown number of "
                       r"bytes free$" % size):
        blobfile_loader.load_into_arenas(str(digits / "model.mtb"))


def test_blob_changed_between_the_two_reads_is_refused(digits, tmp_path, monkeypatch):
    # load_into_arenas reads the file twice (parse, then constants into the arenas): a file
    # replaced in between must not put other bytes into the arenas unnoticed.
    path = tmp_path / "model.mtb"
    shutil.copyfile(digits / "model.mtb", path)
    b = blobfile_parser.load(str(path))
    data = bytearray(path.read_bytes())
    pos = data.find(b.constants[0][1])        # a constant's bytes in the file
    assert pos > 0 and b.constants[0][1]
    parse = blobfile_parser.parse_root

    def parse_then_change(*args):
        parsed = parse(*args)
        data[pos] ^= 1
        path.write_bytes(bytes(data))
        return parsed
    monkeypatch.setattr(blobfile_loader, "parse_root", parse_then_change)
    with pytest.raises(BlobError, match=r"changed while it was being loaded"):
        blobfile_loader.load_into_arenas(str(path))
    monkeypatch.setattr(blobfile_loader, "parse_root", parse)
    data[pos] ^= 1
    path.write_bytes(bytes(data))
    loaded, F, I = blobfile_loader.load_into_arenas(str(path))       # the same file loads
    assert loaded.constants is None
