# microtrain device runtime: train ONNX-exported models on MicroPython (or CPython) from a
# packed .mtb blob. API modelled on onnxruntime.training.api.
from microtrain.errors import (MicrotrainError, BlobError, CheckpointError, InputError,
                               ParameterError, TrainingError)
from microtrain.checkpoint import CheckpointState, Parameter
from microtrain.module import Module
from microtrain.inference import InferenceSession
from microtrain.optimizer import Optimizer
from microtrain.lr_scheduler import (LinearLRScheduler, ConstantLRScheduler,
                                     InverseScalingLRScheduler)

__version__ = "0.1.0"
