# microtrain device runtime: train ONNX-exported models on MicroPython (or CPython) from a
# packed .mtb blob. API modelled on onnxruntime.training.api.
from microtrain.errors import (MicrotrainError, BlobError, CheckpointError, InputError,
                               ParameterError, TrainingError, OutOfMemoryError)
# Each group below is optional, so that a board carries only what it runs: a predict-only
# board has inference.py without the training files (see inference.py); the minimal runtime
# `microtrain deploy` copies for training leaves out inference.py and lr_scheduler.py.
try:
    from microtrain.inference import InferenceSession
except ImportError:
    pass
try:
    from microtrain.checkpoint import CheckpointState, Parameter
    from microtrain.module import Module
    from microtrain.optimizer import Optimizer
except ImportError:
    pass
try:
    from microtrain.lr_scheduler import (LinearLRScheduler, ConstantLRScheduler,
                                         InverseScalingLRScheduler)
except ImportError:
    pass

__version__ = "0.1.0"
