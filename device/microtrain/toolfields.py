# What only the host's tools read of a blob (inspect, the memory plan, the minimal runtime's
# selection): the packer's memory figures, the opset a model was upgraded from, each
# tensor's alias and each step's record. parser.parse_root reads them for a blob loaded with
# keep_steps, which a board never asks for: its runtime carries neither this code nor the
# attributes.

# contract: blob Model Tensor
# (generated from host/microtrain_host/contract/ by `python -m microtrain_host.contract.generate`; do not edit)
from microtrain.errors import const
_MODEL_TENSORS = const(2)
_MODEL_NAIVE_SIZE = const(10)
_MODEL_LOWER_BOUND = const(11)
_MODEL_FULL_TRAINING_ARENA = const(12)
_MODEL_FULL_TRAINING_STEPS = const(13)
_MODEL_SOURCE_OPSET = const(15)
_TENSOR_ALIAS_OF = const(8)
# end of contract


def read_tool_fields(r, root, b):
    """Set b.naive_size (float elements without arena sharing), b.lower_bound (float
    elements no plan can go below), b.full_training_arena and b.full_training_steps (with
    frozen parameters: the arena and the train program's step count if all trained),
    b.source_opset (0: not upgraded), b.alias_of (per tensor: -1 or the tensor whose space
    it shares) and b.step_records (program -> [(op, tensor ids, ints, floats)], filled as
    the steps are parsed)."""
    b.naive_size = r.scalar(root, _MODEL_NAIVE_SIZE, "I", 0)
    b.lower_bound = r.scalar(root, _MODEL_LOWER_BOUND, "I", 0)
    b.full_training_arena = r.scalar(root, _MODEL_FULL_TRAINING_ARENA, "I", 0)
    b.full_training_steps = r.scalar(root, _MODEL_FULL_TRAINING_STEPS, "I", 0)
    b.source_opset = r.scalar(root, _MODEL_SOURCE_OPSET, "H", 0)
    b.alias_of = [r.scalar(t, _TENSOR_ALIAS_OF, "i", -1)
                  for t in r.tables(root, _MODEL_TENSORS, "tensor")]
    b.step_records = {}
