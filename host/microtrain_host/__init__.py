"""microtrain host packager: ONNX model -> training artifacts and a packed .mtb blob."""
from .artifacts import Artifacts, generate_artifacts
from .errors import (ArtifactError, CheckpointError, DynamicShapeError,
                     MicrotrainHostError, UnsupportedOpError)
from .fedavg import fedavg
from .inference import export_inference_model
from .losses import LossType
from .optimizers import OptimType

__version__ = "0.1.0"
__all__ = ["generate_artifacts", "Artifacts", "LossType", "OptimType", "ArtifactError",
           "CheckpointError", "DynamicShapeError", "MicrotrainHostError",
           "UnsupportedOpError", "export_inference_model", "fedavg"]
