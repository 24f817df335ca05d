"""microtrain host packager: ONNX model -> training artifacts and a packed .mtb blob."""
from . import ops  # noqa: F401  importing the op families fills registry.py's tables
from .errors import (ArtifactError, CheckpointError, DynamicShapeError,
                     MicrotrainHostError, UnsupportedOpError)
from .pipeline.artifacts import Artifacts, generate_artifacts
from .pipeline.export import export_inference_model
from .pipeline.inttrain import int8_training_artifacts
from .pipeline.losses import LossType
from .pipeline.optimizers import OptimType
from .pipeline.sparse import sparse_update
from .tools.fedavg import fedavg

__version__ = "0.1.0"
__all__ = ["generate_artifacts", "Artifacts", "LossType", "OptimType", "ArtifactError",
           "CheckpointError", "DynamicShapeError", "MicrotrainHostError",
           "UnsupportedOpError", "export_inference_model", "fedavg", "sparse_update",
           "int8_training_artifacts"]
