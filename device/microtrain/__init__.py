# microtrain device runtime: train ONNX-exported models on MicroPython (or CPython) from a
# packed .mtb blob. API modelled on onnxruntime.training.api.
from microtrain.errors import (MicrotrainError, BlobError, CheckpointError, InputError,
                               ParameterError, TrainingError, OutOfMemoryError)
from microtrain.inference import InferenceSession
try:
    from microtrain.checkpoint import CheckpointState, Parameter
    from microtrain.module import Module
    from microtrain.optimizer import Optimizer
    from microtrain.lr_scheduler import (LinearLRScheduler, ConstantLRScheduler,
                                         InverseScalingLRScheduler)
except ImportError:
    # A board that only predicts carries inference.py without the training files (see
    # inference.py); `import microtrain` must still work there.
    pass

__version__ = "0.1.0"
