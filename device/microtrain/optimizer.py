# Optimizer: runs the blob's optimizer program over the Module's arena, in place.
import math
from microtrain.checkpoint import Ref
from microtrain.errors import CheckpointError, ParameterError, TrainingError
from microtrain.loader import program
from microtrain.module import Module
from microtrain.opcodes import kernel_module

# contract: controls; optimizer_kinds
# (generated from host/microtrain_host/contract/ by `python -m microtrain_host.contract.generate`; do not edit)
_LEARNING_RATE = "learning_rate"
_STEP = "step"
_STEP_SIZE = "step_size"
# kind -> (writes the bias-corrected step_size, index of a state that must not be negative or -1)
_OPTIMIZERS = {"AdamW": (1, 1), "SGD": (0, -1)}
# end of contract


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
        self._lr_at = (b.offsets[b.tensor_id(_LEARNING_RATE)]
                       if not self._integer else -1)
        # what the device does for this kind (the contract's OPTIMIZERS entry): AdamW
        # writes a bias-corrected step size each step and its second moment is never
        # negative
        self._writes_step_size, self._nonnegative = _OPTIMIZERS.get(self.config.get("kind"),
                                                                    (0, -1))
        self._step_size_at = (b.offsets[b.tensor_id(_STEP_SIZE)]
                              if self._writes_step_size else -1)
        # SGD with momentum reads the 1-based step to start its buffer on the first one.
        self._step_at = b.offsets[b.tensor_id(_STEP)] if _STEP in b.names else -1
        self._bind_state(module.state)
        module._optimizer = self
        # the update kernels' count of elements left as they were (kernels/optim.py refused)
        self._updates = kernel_module("optim") if not self._integer else None
        self.set_learning_rate(self.config.get("learning_rate", 0.001))

    def _bind_state(self, state):
        # The step count, and the optimizer state tensors (AdamW moments) into the arena
        # (streamed from the checkpoint file when the state still has them there); the
        # checkpoint state sees them as views, and resumes from saved ones when it has them.
        b = self.module.blob
        F = self.module.F
        view = self.module._view
        targets = []
        bound = []
        for tensor, grad, moments in b.parameters:
            if not b.is_trainable(tensor, grad):
                continue
            name = b.names[tensor]
            saved = state._momentums.get(name)
            if not moments:
                # This optimizer keeps no state for it (plain SGD); ORT's SGD writes an
                # unused momentum0, which is not carried on.
                state._momentums.pop(name, None)
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
                    if isinstance(values, Ref):
                        targets.append((values, F, off))
                    else:
                        for j in range(n):
                            F[off + j] = values[j]
                views.append(view[off:off + n])
            bound.append((name, views))
        if targets:
            state.stream(targets)
        for name, views in bound:
            if name in state._momentums and self._nonnegative >= 0:
                # AdamW divides by sqrt(v) + eps: a negative v (only a crafted checkpoint
                # has one) would make the step NaN.
                v = views[self._nonnegative]
                for j in range(len(v)):
                    if v[j] < 0.0:
                        raise CheckpointError("the AdamW second moment of '%s' has a negative "
                                              "value %r at position %d" % (name, v[j], j))
            state._momentums[name] = views
        self.step_count = state.optimizer_step
        if not state.has_optimizer_state:
            # Like ORT: the checkpoint's optimizer group records the initial learning rate.
            state.initial_learning_rate = self.config.get("learning_rate", 0.001)
            state.has_optimizer_state = True

    def set_learning_rate(self, learning_rate):
        if isinstance(learning_rate, bool) or not isinstance(learning_rate, (int, float)) \
                or not 0.0 <= learning_rate < 3e38:
            raise ParameterError("learning rate %r must be a finite number >= 0"
                                 % (learning_rate,))
        if self._integer:
            # the integer multipliers of every inttrain update step (floats here, once)
            from microtrain.kernels.inttrain import set_learning_rate
            set_learning_rate(self.module.blob, self.module.I, learning_rate)
        else:
            self.module.F[self._lr_at] = learning_rate
        self._lr = learning_rate

    def get_learning_rate(self):
        return self._lr

    def step(self):
        """Update the trainable parameters from their accumulated gradients (nothing with
        update_in_backward: the train call has done it). Refused after a refused train call:
        its gradients were garbage (a NaN loss, an overflow) and are dropped."""
        if not self.module._gradients_ok:
            raise TrainingError("no optimizer step: the last train call was refused and its "
                                "gradients dropped; train on a good batch first")
        if self._program is None:
            if self._integer:
                self._advance()   # the train call has updated; count the step
            return
        self._advance()
        F = self.module.F
        I = self.module.I
        self._updates.refused = 0
        for kernel, args in self._program.steps:
            kernel(F, I, args)
        self.check_updates()

    def check_updates(self):
        # The update kernels leave an element whose update would be infinite or NaN as it
        # was (the state stays finite); a step that did so is reported.
        if self._updates is not None and self._updates.refused:
            count = self._updates.refused
            self._updates.refused = 0
            raise TrainingError("%d updates would have made a parameter or optimizer state "
                                "infinite or NaN and were not applied (those elements kept "
                                "their values): lower the learning rate or the weight decay"
                                % count)

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
