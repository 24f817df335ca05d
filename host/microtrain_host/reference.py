"""Run microtrain's artifacts on the host: onnx.reference with numpy implementations of the
ai.microtrain ops.

    outputs = reference_evaluator("training_model.onnx").run(None, feeds)

Each op family (ops/<family>.py) defines the references of its gradient ops as subclasses of
MicrotrainOp, which registers them by being defined. Their semantics follow the device
kernels (device/microtrain/kernels) and the ORT ops they stand in for."""
import os

import onnx
from onnx.reference import ReferenceEvaluator
from onnx.reference.op_run import OpRun

from .graph import DOMAIN

OPS = []   # every MicrotrainOp subclass, in definition order


class MicrotrainOp(OpRun):
    """Base of the numpy references of the ai.microtrain ops; defining a subclass adds it to
    OPS."""
    op_domain = DOMAIN

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        OPS.append(cls)


def reference_evaluator(model_or_path, **kwargs):
    """onnx.reference.ReferenceEvaluator for a model (or path) that may use ai.microtrain ops."""
    if not isinstance(model_or_path, onnx.ModelProto):
        model_or_path = os.fspath(model_or_path)
    return ReferenceEvaluator(model_or_path, new_ops=list(OPS), **kwargs)
