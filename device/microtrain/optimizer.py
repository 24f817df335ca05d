# Optimizer: runs the blob's optimizer program over the Module's arena, in place.
import math
from microtrain import blob as blobfile
from microtrain.parser import program
from microtrain.errors import CheckpointError, ParameterError
from microtrain.module import Module


class Optimizer:
    """Like onnxruntime.training.api.Optimizer: Optimizer(optimizer_uri, module), the uri
    naming the .mtb blob (the training blob holds the optimizer program); step() updates the
    trainable parameters from their accumulated gradients.

    A blob packed with update_in_backward has no optimizer program: each train call of the
    module applies the update in its backward pass (this object supplies the step count and
    the learning rate), and step() does nothing, so ORT-style loops run unchanged."""

    def __init__(self, optimizer_uri, module):
        if not isinstance(module, Module):
            raise ParameterError("Optimizer(optimizer_uri, module): module must be a Module, "
                                 "not %s" % type(module).__name__)
        b = module.blob
        self.module = module
        self.config = b.optimizer
        self._integer = b.integer_parameters
        if "backward_update" in b.programs or self._integer:
            # (integer training: the train program's inttrain steps update the parameters;
            # this object sets their learning-rate multipliers)
            self._program = None
            module._updater = self
        else:
            self._program = program(b, optimizer_uri, "optimizer", module.uri)
        self._lr_at = (b.offsets[b.tensor_id("learning_rate")]
                       if not self._integer else -1)
        self._step_size_at = (b.offsets[b.tensor_id("step_size")]
                              if self.config.get("kind") == "AdamW" else -1)
        # SGD with momentum reads the 1-based step to start its buffer on the first one.
        self._step_at = b.offsets[b.tensor_id("step")] if "step" in b.names else -1
        state = module.state
        self.step_count = state.optimizer_step
        self._bind_state(state)
        if not state.has_optimizer_state:
            # Like ORT: the checkpoint's optimizer group records the initial learning rate.
            state.initial_learning_rate = self.config.get("learning_rate", 0.001)
            state.has_optimizer_state = True
        self.set_learning_rate(self.config.get("learning_rate", 0.001))

    def _bind_state(self, state):
        # Optimizer state tensors (AdamW moments) live in the arena; the checkpoint state
        # sees them as views, and resumes from saved ones when it has them.
        b = self.module.blob
        F = self.module.F
        view = self.module._view
        for tensor, grad, moments in b.parameters:
            if not b.is_trainable(tensor, grad):
                continue
            name = b.names[tensor]
            saved = state.momentums.get(name)
            if not moments:
                # This optimizer keeps no state for it (plain SGD); ORT's SGD writes an
                # unused momentum0, which is not carried on.
                state.momentums.pop(name, None)
                continue
            if saved is not None and len(saved) != len(moments):
                raise CheckpointError("the checkpoint has %d optimizer moment(s) for '%s'; this "
                                      "optimizer (%s) keeps %d: save the checkpoint without "
                                      "optimizer state to switch optimizers"
                                      % (len(saved), name, self.config.get("kind"), len(moments)))
            views = []
            for i, tid in enumerate(moments):
                off, n = b.offsets[tid], b.sizes[tid]
                if saved is not None:
                    values = saved[i]
                    if i == 1 and self.config.get("kind") == "AdamW":
                        _check_second_moment(values, name)
                    for j in range(n):
                        F[off + j] = values[j]
                views.append(view[off:off + n])
            state.momentums[name] = views

    def set_learning_rate(self, learning_rate):
        if self._integer:
            # the integer multipliers of every inttrain update step (floats here, once)
            if not 0.0 <= learning_rate < 3e38:
                raise ParameterError("learning rate %r must be finite and >= 0"
                                     % learning_rate)
            from microtrain.kernels.inttrain import set_learning_rate
            set_learning_rate(self.module.blob, self.module.I, learning_rate)
        else:
            self.module.F[self._lr_at] = learning_rate
        self._lr = learning_rate

    def get_learning_rate(self):
        return self._lr

    def step(self):
        """Update the trainable parameters from their accumulated gradients (nothing with
        update_in_backward: the train call has done it)."""
        if self._program is None:
            if self._integer:
                self._advance()   # the train call has updated; count the step
            return
        self._advance()
        F = self.module.F
        I = self.module.I
        for kernel, args in self._program.steps:
            kernel(F, I, args)

    def _advance(self):
        # Count the step and write what its update kernels read: the 1-based step (SGD with
        # momentum) and AdamW's bias-corrected step size.
        F = self.module.F
        self.step_count += 1
        self.module.state.optimizer_step = self.step_count
        if self._step_at >= 0:
            F[self._step_at] = self.step_count
        if self._step_size_at >= 0:
            c = self.config
            t = self.step_count
            if c["bias_correction"]:
                F[self._step_size_at] = (self._lr * math.sqrt(1.0 - c["beta2"] ** t)
                                         / (1.0 - c["beta1"] ** t))
            else:
                F[self._step_size_at] = self._lr


def _check_second_moment(values, name):
    # AdamW divides by sqrt(v) + eps: a negative v (only a crafted checkpoint has one) would
    # raise a math domain error in the middle of a step.
    for j in range(len(values)):
        if values[j] < 0.0:
            raise CheckpointError("the AdamW second moment of '%s' has a negative value %r at "
                                  "position %d" % (name, values[j], j))
