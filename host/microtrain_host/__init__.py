"""microtrain host packager: ONNX model -> training artifacts and a packed .mtb blob.

Layers, each importing only those before it: contract/ (the schemas, op table and facts
shared with the device) -> ir.py, graph.py, registry.py -> ops/ (the op families) ->
formats/ (blob writer, checkpoint codec) -> pipeline/ (load -> ... -> pack) -> quant/ (QAT,
int8, integer training) -> artifacts.py, export.py (the drivers) -> tools/, cli.py."""
from . import ops  # noqa: F401  importing the op families fills registry.py's tables
from .artifacts import Artifacts, generate_artifacts
from .errors import (ArtifactError, CheckpointError, DynamicShapeError,
                     MicrotrainHostError, UnsupportedOpError)
from .export import export_inference_model
from .formats.checkpoint import read_checkpoint, write_checkpoint
from .pipeline.losses import LossType
from .pipeline.optimizers import OptimType
from .pipeline.sparse import sparse_update
from .quant.int8 import pack_inference_model
from .quant.intloss import quantize_target
from .quant.inttrain import int8_training_artifacts, quantize_input
from .tools.fedavg import fedavg

__version__ = "0.1.0"
__all__ = ["generate_artifacts", "Artifacts", "LossType", "OptimType", "ArtifactError",
           "CheckpointError", "DynamicShapeError", "MicrotrainHostError",
           "UnsupportedOpError", "export_inference_model", "fedavg", "sparse_update",
           "int8_training_artifacts", "quantize_input", "quantize_target",
           "pack_inference_model",
           "read_checkpoint", "write_checkpoint"]
