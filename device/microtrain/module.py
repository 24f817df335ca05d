# Module: runs the train and eval programs of a blob over arenas allocated once.
import math
from microtrain import blob as blobfile
from microtrain.errors import CheckpointError, ParameterError, TrainingError

_INF = math.inf
_NEG_INF = -math.inf


class Module:
    """Like onnxruntime.training.api.Module: Module(train_model_uri, state,
    eval_model_uri=None), the uris naming .mtb blobs (the eval program is in the training
    blob too, so eval_model_uri is only needed to take it from another blob). A uri can
    also be the blob itself as a buffer: bytes, or a memoryview of a file in a board's ROM
    filesystem or of a frozen bytes object - a blob in flash, whose int8 weights are then
    read in place instead of taking heap.

    model(*inputs) runs the train program in train mode (returns the loss, accumulating
    gradients) and the eval program in eval mode (returns the loss, or a list of the loss
    and views of the other outputs when the eval program has more; the list and the views
    are reused by the next call). A model whose loss is computed outside the graph trains
    with forward() and backward() instead."""

    def __init__(self, train_model_uri, state, eval_model_uri=None):
        if not hasattr(state, "parameters") or not hasattr(state, "is_nominal"):
            raise ParameterError("Module(train_model_uri, state, eval_model_uri=None): state "
                                 "must be a CheckpointState (CheckpointState.load_checkpoint"
                                 "(path)), not %s" % type(state).__name__)
        b, self.F, self.I = blobfile.load_into_arenas(train_model_uri)
        self.blob = b
        self.uri = train_model_uri
        self.state = state
        self._view = memoryview(self.F)
        self._bind_parameters()
        self._bind_random_states()
        # A model whose loss is computed outside the graph has forward and backward
        # programs instead of train (see forward()).
        self._forward = b.programs.get("forward")
        self._backward = b.programs.get("backward")
        self._train = (blobfile.program(b, None, "train", train_model_uri)
                       if self._forward is None else None)
        self._eval = blobfile.program(b, eval_model_uri, "eval", train_model_uri)
        # Packed with update_in_backward: "train" stops at the loss and "backward_update"
        # applies the updates as the gradients come (see __call__).
        self._backward_update = b.programs.get("backward_update")
        self._updater = None        # the Optimizer that prepares those updates
        # (an integer training blob has no gradient buffers, so no reset flag)
        self._reset_at = (b.offsets[b.tensor_id("lazy_reset_grad")]
                          if "lazy_reset_grad" in b.names else -1)
        self._training = True
        self._reset_pending = True  # ORT: the first train step overwrites the gradients
        self._forward_at = None     # optimizer step of the last train forward(), until backward
        self._output_views = {}     # program name -> views of its outputs, made once

    # -- parameters -------------------------------------------------------------------
    def _bind_parameters(self):
        b = self.blob
        wanted = [b.names[p[0]] for p in b.parameters]
        missing = [n for n in wanted if n not in self.state.parameters]
        if missing:
            raise ParameterError("the checkpoint lacks parameters %s" % ", ".join(missing))
        for tensor, grad, _ in b.parameters:
            name = b.names[tensor]
            p = self.state.parameters[name]
            off, n = b.offsets[tensor], b.sizes[tensor]
            if tuple(p.shape) != b.shapes[tensor] and not self.state.is_nominal:
                raise ParameterError("parameter '%s' has shape %r in the checkpoint, %r in the model"
                                     % (name, tuple(p.shape), b.shapes[tensor]))
            trainable = b.is_trainable(tensor, grad)
            if trainable != bool(p.requires_grad):
                raise ParameterError("parameter '%s' is %s in the checkpoint but %s in the model"
                                     % (name, "trainable" if p.requires_grad else "frozen",
                                        "trainable" if trainable else "frozen"))
            dtype = b.dtypes[tensor]
            if dtype != blobfile.FLOAT:
                self._bind_integer(p, name, tensor, off, n, dtype)
                continue
            if getattr(p, "data_type", 1) != 1:
                raise ParameterError("parameter '%s' is an integer tensor in the checkpoint, "
                                     "a float one in the model" % name)
            if name in self.state.int_velocities:
                raise CheckpointError("the checkpoint has an integer momentum velocity for '%s', "
                                      "a float parameter in the model" % name)
            if p.data is not None:
                if len(p.data) != n:
                    raise ParameterError("parameter '%s' has %d values, the model needs %d"
                                         % (name, len(p.data), n))
                data, F = p.data, self.F
                for i in range(n):
                    F[off + i] = data[i]
            p.shape = b.shapes[tensor]
            p.data = self._view[off:off + n]
            if grad >= 0:
                g = b.offsets[grad]
                p.grad = self._view[g:g + n]

    def _bind_integer(self, p, name, tensor, off, n, dtype):
        # An int8 weight (byte arena, data_type 3) or int32 bias (int arena, 6) trained in
        # integers (kernels/inttrain.py): its values come in, then it is a view of the arena
        # (raw bytes of the int8 one: two's complement, as the checkpoint stores them).
        want = 3 if dtype == blobfile.INT8 else 6
        if getattr(p, "data_type", 1) != want or dtype == blobfile.UINT8:
            raise ParameterError("parameter '%s' has ONNX data type %d in the checkpoint, the "
                                 "model needs %d" % (name, getattr(p, "data_type", 1), want))
        arena = self.blob.Q if want == 3 else self.I
        if p.data is not None:
            if len(p.data) != n:
                raise ParameterError("parameter '%s' has %d values, the model needs %d"
                                     % (name, len(p.data), n))
            data = p.data
            for i in range(n):
                arena[off + i] = data[i] & 255 if want == 3 else data[i]
        p.shape = self.blob.shapes[tensor]
        p.data = memoryview(arena)[off:off + n]
        self._bind_velocity(name)

    def _bind_velocity(self, name):
        # Integer momentum (kernels/inttrain.py int_gemm_update_momentum): the velocity of
        # parameter `name` is the optimizer-state tensor "<name>.velocity" (the host's
        # ops/inttrain.py names it so): int16 values as 2 little-endian bytes each in the byte
        # arena for an int8 weight, int32 ones in the int arena for a bias. It comes from
        # the checkpoint's momentum0 when that has one, else it stays zero (an older
        # checkpoint, or one saved without optimizer state: the velocities restart, as in a
        # fresh run); then the state holds a view of it, which save_checkpoint writes.
        b = self.blob
        velocities = self.state.int_velocities
        saved = velocities.pop(name, None)
        key = name + ".velocity"
        if key not in b.names:
            return      # trained without momentum: a saved velocity is not carried on
        tid = b.names.index(key)
        off, size = b.offsets[tid], b.sizes[tid]
        wide = b.dtypes[tid] == blobfile.INT32
        want = 6 if wide else 5                  # ONNX INT32, INT16
        count = size if wide else size // 2
        if saved is not None:
            dtype, values = saved
            if dtype != want or len(values) != count:
                raise CheckpointError("the integer momentum velocity (momentum0) of '%s' has %d "
                                      "values of ONNX type %d; the model needs %d of type %d"
                                      % (name, len(values), dtype, count, want))
            if wide:
                I = self.I
                for i in range(count):
                    I[off + i] = values[i]
            else:
                raw = bytes(values)              # the int16s' bytes, as the arena keeps them
                Q = b.Q
                for i in range(size):
                    Q[off + i] = raw[i]
        velocities[name] = (want, memoryview(self.I if wide else b.Q)[off:off + size])

    # -- Dropout generators ---------------------------------------------------------------
    def _bind_random_states(self):
        # Each Dropout's generator state (2 ints in the int arena; stream k = the k-th
        # '.random_state' tensor) is restored from the state's microtrain.rng.<k> property
        # when it has one (otherwise the kernel seeds it on its first draw), and the state
        # keeps _random_states to write the current ones on a save with optimizer state.
        # Integer training's stochastic-rounding generators (one int each, tensors
        # "<weight>.dither", kernels/inttrain.py _dither) are kept the same way, as
        # microtrain.rng.<weight>.dither.
        b = self.blob
        self._random_at = [b.offsets[t] for t in range(len(b.names))
                           if b.names[t].endswith(".random_state")]
        self._dither_at = [(b.names[t], b.offsets[t]) for t in range(len(b.names))
                           if b.integer_parameters and b.names[t].endswith(".dither")]
        self.state._random_source = self._random_states
        saved = getattr(self.state, "random_states", None)
        if not saved:
            return
        from microtrain.checkpoint import RNG_PREFIX
        for name, at in self._dither_at:
            value = saved.get(RNG_PREFIX + name)
            if value is None:
                continue                        # 0: the kernel seeds it on its first draw
            if not isinstance(value, int) or not 0 <= value < 65536:
                raise CheckpointError("property '%s' = %r is not a stochastic-rounding "
                                      "generator state (0 to 65535)" % (RNG_PREFIX + name, value))
            self.I[at] = value
        if not self._random_at:
            return
        from microtrain.kernels.norm import set_state
        for stream, at in enumerate(self._random_at):
            name = RNG_PREFIX + str(stream)
            if name in saved and not set_state(self.I, at, saved[name]):
                raise CheckpointError("property '%s' = %r is not a Dropout generator state"
                                      % (name, saved[name]))

    def _random_states(self):
        # {microtrain.rng.<k>: state} of every Dropout (and microtrain.rng.<w>.dither of
        # every stochastic-rounding generator), for save_checkpoint (only then).
        if not self._random_at and not self._dither_at:
            return {}
        from microtrain.checkpoint import RNG_PREFIX
        out = dict((RNG_PREFIX + name, self.I[at]) for name, at in self._dither_at)
        if self._random_at:
            from microtrain.kernels.norm import get_state
            for stream, at in enumerate(self._random_at):
                out[RNG_PREFIX + str(stream)] = get_state(self.I, at)
        return out

    def _parameter_ids(self, trainable_only):
        b = self.blob
        if b.integer_parameters:
            raise ParameterError("this model trains integer parameters: read and write them "
                                 "through state.parameters (int8 / int32 views)")
        return [t for t, grad, _ in b.parameters if not trainable_only or b.is_trainable(t, grad)]

    def get_parameters_size(self, trainable_only=True):
        return sum(self.blob.sizes[t] for t in self._parameter_ids(trainable_only))

    def get_contiguous_parameters(self, trainable_only=False):
        out = blobfile.zeros("f", self.get_parameters_size(trainable_only))
        at = 0
        for t in self._parameter_ids(trainable_only):
            off, n = self.blob.offsets[t], self.blob.sizes[t]
            out[at:at + n] = self.F[off:off + n]
            at += n
        return out

    def copy_buffer_to_parameters(self, buffer, trainable_only=True):
        want = self.get_parameters_size(trainable_only)
        if len(buffer) != want:
            raise ParameterError("parameter buffer has %d values, the model's %s parameters need "
                                 "%d (get_parameters_size(trainable_only=%r))"
                                 % (len(buffer), "trainable" if trainable_only else "",
                                    want, trainable_only))
        at = 0
        F = self.F
        for t in self._parameter_ids(trainable_only):
            off, n = self.blob.offsets[t], self.blob.sizes[t]
            for i in range(n):
                F[off + i] = buffer[at + i]
            at += n
        if not trainable_only or self.get_parameters_size(True) == self.get_parameters_size(False):
            # Only once every parameter has a value; frozen ones must not silently stay zero.
            self.state.is_nominal = False

    # -- running ----------------------------------------------------------------------
    def train(self, mode=True):
        self._training = mode
        return self

    def eval(self):
        self._training = False
        return self

    def lazy_reset_grad(self):
        """The next train call overwrites the gradient buffers instead of adding to them.
        (A blob packed with update_in_backward has no gradient buffers: every train call
        applies its own update, so this does nothing there.)"""
        self._reset_pending = True

    def set_seed(self, seed):
        """Restart every Dropout's random stream from `seed` (ORT's SetSeed, per Module):
        the same seed gives the same masks on CPython and on every MicroPython port. Without
        it a Dropout starts from its `seed` attribute, or 0, or from the state a checkpoint
        saved with optimizer state holds."""
        if self._random_at:
            from microtrain.kernels.norm import seed_state
            for stream, at in enumerate(self._random_at):
                seed_state(self.I, at, seed, stream)

    def input_names(self, training=None):
        program = self._program(training)
        return [self.blob.names[t] for t in program.inputs]

    def output_names(self, training=None):
        program = self._program(training)
        return [self.blob.names[t] for t in program.outputs]

    def _program(self, training):
        if training is None:
            training = self._training
        return (self._train or self._forward) if training else self._eval

    def _load_inputs(self, program, inputs):
        if self.state.is_nominal:
            raise ParameterError("the checkpoint state is nominal (no parameter values): load "
                                 "all of them with copy_buffer_to_parameters(buffer, "
                                 "trainable_only=False) before training or eval")
        b = self.blob
        blobfile.copy_inputs(b, self.F, self.I, program, inputs, b.num_classes)

    def __call__(self, *inputs):
        if self._forward is not None:
            raise TrainingError("this model computes its loss outside the graph (packed with "
                                "loss=None and a non-scalar output): use forward() and "
                                "backward()")
        program = self._train if self._training else self._eval
        self._load_inputs(program, inputs)
        F = self.F
        I = self.I
        if self._training and self._reset_at >= 0:
            F[self._reset_at] = 1.0 if self._reset_pending else 0.0
        if self._training:
            updater = self._updater
            if self._backward_update is not None and updater is None:
                raise TrainingError("this blob applies the optimizer's updates in the backward "
                                    "pass (packed with update_in_backward): create its "
                                    "Optimizer before training")
        for kernel, args in program.steps:
            kernel(F, I, args)
        if self.blob.integer_parameters:
            # the integer train step is done (updates included); its loss ints -> a float
            return self._integer_loss(program)
        loss = F[self.blob.offsets[program.outputs[0]]]
        if self._training:
            self._reset_pending = False
            if not _NEG_INF < loss < _INF:  # NaN too
                # The gradient buffers now hold garbage: the next train call overwrites them.
                # (With update_in_backward the backward pass has not run yet.)
                self._reset_pending = True
                raise TrainingError("the loss is %r: training diverged (lower the learning rate "
                                    "or check the inputs); parameters were not updated and the "
                                    "accumulated gradients are dropped" % loss)
            if self._backward_update is not None:
                # One optimizer step: the step count and the rates first, then the backward
                # pass, which updates each parameter as soon as its gradient is known.
                updater._advance()
                for kernel, args in self._backward_update.steps:
                    kernel(F, I, args)
        if len(program.outputs) == 1:
            return loss
        results = self._views(program)
        results[0] = loss  # a number in place of its view (forward() never sees this list)
        return results

    def _integer_loss(self, program):
        # kernels/inttrain.py int_softmax_ce's loss ints -> the mean cross-entropy; with
        # more outputs (eval: the int32 logits, LOGIT_BITS fractional bits) their views too
        from microtrain.kernels.inttrain import loss_value
        b = self.blob
        t = program.outputs[0]
        loss = loss_value(self.I, b.offsets[t], b.sizes[t] // 2)
        if self._training:
            self._reset_pending = False
        if len(program.outputs) == 1:
            return loss
        results = self._views(program)
        results[0] = loss
        return results

    def forward(self, *inputs):
        """outputs = model.forward(*inputs) for a model packed with loss=None and a
        non-scalar output (the loss is computed outside the graph). In train mode it runs
        the training forward pass and keeps what backward() needs; in eval mode the eval
        program. Returns a view of the output (a list of views with several outputs), valid
        until the next forward or call; the views are the same objects every time."""
        self._check_forward_program()
        program = self._forward if self._training else self._eval
        self._forward_at = None  # until this forward has run
        self._load_inputs(program, inputs)
        F = self.F
        I = self.I
        for kernel, args in program.steps:
            kernel(F, I, args)
        self._forward_at = self.state.optimizer_step if self._training else None
        views = self._views(program)
        return views[0] if len(views) == 1 else views

    def backward(self, *grad_outputs):
        """model.backward(d_output) (one gradient per forward output, flat, in output
        order): accumulates the parameter gradients of the loss whose gradients with respect
        to the outputs are given, like a train call (lazy_reset_grad() semantics included);
        then Optimizer.step() as usual. Needs a train-mode forward() just before: nothing
        else (eval, optimizer step) may run in between."""
        self._check_forward_program()
        if self._forward_at != self.state.optimizer_step:
            raise TrainingError("backward() needs the activations of a train-mode forward() "
                                "run just before it (with no eval call or optimizer step in "
                                "between)")
        program = self._backward
        self._load_inputs(program, grad_outputs)
        F = self.F
        I = self.I
        F[self._reset_at] = 1.0 if self._reset_pending else 0.0
        for kernel, args in program.steps:
            kernel(F, I, args)
        self._reset_pending = False
        self._forward_at = None

    def export_model_for_inferencing(self, inference_model_uri, graph_output_names):
        """Write an inference-only blob (no gradients, optimizer state or loss; its own,
        smaller arena) with the parameters' current values, for InferenceSession.
        graph_output_names: the model outputs it returns, in that order. Atomic."""
        from microtrain.export import export_inference_blob
        export_inference_blob(self, inference_model_uri, graph_output_names)

    def _check_forward_program(self):
        if self._forward is None:
            # Say which loss the blob has and how to get the other form: a model with
            # several outputs packed with loss=None takes a scalar first output as its loss.
            b = self.blob
            names = [b.names[t] for t in self._eval.outputs]
            if b.loss:
                loss = "the loss %s is part of the graph" % b.loss
                outputs = names[1:]
            else:
                loss = ("it was packed with loss=None and its output '%s' is a scalar, so "
                        "that output is the loss" % names[0])
                outputs = names
            raise TrainingError("'%s' has no forward program: %s. Call model(*inputs) to "
                                "train on it (in eval mode it also returns the other "
                                "outputs), or, to compute the loss outside the graph with "
                                "forward() and backward(), pack with loss=None and "
                                "loss_input_names=%r (microtrain pack --loss none "
                                "--loss-inputs %s)"
                                % (blobfile.describe(self.uri), loss, outputs,
                                   ",".join(outputs)))

    def _views(self, program):
        # Views of the program's outputs, made once: a step allocates no list or view.
        views = self._output_views.get(program.name)
        if views is None:
            views = [self.output(t) for t in program.outputs]
            self._output_views[program.name] = views
        return views

    def output(self, tensor):
        """A view of an output tensor (id or name) in the arena (an int8 weight read in
        place: where it is); valid until the next call."""
        b = self.blob
        tid = b.tensor_id(tensor) if isinstance(tensor, str) else tensor
        off = b.offsets[tid]
        dtype = b.dtypes[tid]
        view = self._view if dtype == blobfile.FLOAT else memoryview(
            self.I if dtype == blobfile.INT32 else b.weights if tid in b.in_place else b.Q)
        return view[off:off + b.sizes[tid]]
