"""microtrain host packager: ONNX model -> training artifacts and a packed .mtb blob."""
from .pipeline.artifacts import Artifacts, generate_artifacts
from .errors import (ArtifactError, CheckpointError, DynamicShapeError,
                     MicrotrainHostError, UnsupportedOpError)
from .tools.fedavg import fedavg
from .pipeline.export import export_inference_model
from .pipeline.losses import LossType
from .pipeline.optimizers import OptimType

__version__ = "0.1.0"
__all__ = ["generate_artifacts", "Artifacts", "LossType", "OptimType", "ArtifactError",
           "CheckpointError", "DynamicShapeError", "MicrotrainHostError",
           "UnsupportedOpError", "export_inference_model", "fedavg"]
