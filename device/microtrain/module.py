# Module: runs the train and eval programs of a blob over arenas allocated once. The rarely
# used parts live beside it and are imported only by the models that need them: integer
# parameters (intparams.py), random generators (randoms.py), a loss computed outside the
# graph (outside.py); what a training loop does not call (moduleextra.py: the in-program
# reload, the program's input and output names).
import math
from microtrain.checkpoint import Ref
from microtrain.errors import CheckpointError, ParameterError, TrainingError
from microtrain.feed import FLOAT_NATIVE, copy_inputs
from microtrain.loader import load_into_arenas, program

# contract: controls; private
# (generated from host/microtrain_host/contract/ by `python -m microtrain_host.contract.generate`; do not edit)
from microtrain.errors import const
_LAZY_RESET_GRAD = "lazy_reset_grad"
_FLOAT = const(0)
_INT32 = const(1)
# end of contract
_INF = math.inf
# A gradient beyond this would make a float32 moment or update infinite (AdamW squares it:
# 1e18 squared is 1e36, below float32's 3.4e38): such a train call is refused.
_GRADIENT_LIMIT = 1e18


# The train call's gradient check in machine code where the board's runtime carries
# kernels/float_native.mpy (feed.FLOAT_NATIVE): the same result as the loop in
# _largest_gradient, which took half of a native digits AdamW step (2,300 instructions per
# gradient element: a boxed float per comparison, and their collection). None: the loop.
largest_abs = FLOAT_NATIVE and FLOAT_NATIVE.largest_abs


class Module:
    """Like onnxruntime.training.api.Module: Module(train_model_uri, state,
    eval_model_uri=None), the uris naming .mtb blobs (the eval program is in the training
    blob too, so eval_model_uri is only needed to take it from another blob). A uri can
    also be the blob itself as a buffer: bytes, or a memoryview of a file in a board's ROM
    filesystem or of a frozen bytes object - a blob in flash, whose int8 weights are then
    read in place instead of taking heap. max_arena_bytes: refuse (OutOfMemoryError) a blob
    whose file or arenas would take more bytes than that, before reading or allocating
    them - for a host loading blobs it did not pack.

    model(*inputs) runs the train program in train mode (returns the loss, accumulating
    gradients) and the eval program in eval mode (returns the loss, or a list of the loss
    and views of the other outputs when the eval program has more; the list and the views
    are reused by the next call). A model whose loss is computed outside the graph trains
    with forward() and backward() instead. load_checkpoint(uri) takes another checkpoint
    of the same model into the arenas the Module has."""

    def __init__(self, train_model_uri, state, eval_model_uri=None, max_arena_bytes=None):
        # (checks inline here and in _bind_parameters, not in functions of their own: each
        # function costs a board's heap its bytecode, raw-code record and object)
        if not hasattr(state, "parameters") or not hasattr(state, "is_nominal"):
            raise ParameterError("Module(train_model_uri, state, eval_model_uri=None): state "
                                 "must be a CheckpointState (CheckpointState.load_checkpoint"
                                 "(path)), not %s" % type(state).__name__)
        b, self.F, self.I = load_into_arenas(train_model_uri, max_arena_bytes)
        self.blob = b
        self.uri = train_model_uri
        self.state = state
        self._view = memoryview(self.F)
        self._optimizer = None      # the Optimizer bound to this Module, if any
        self._randoms = None        # randoms.Generators of a blob with Dropout / dithering
        self._bind_parameters()
        if [n for n in b.names if n.endswith(".random_state") or n.endswith(".dither")]:
            from microtrain.randoms import Generators
            self._randoms = Generators(self)
        state._random_source = self._random_states
        # A model whose loss is computed outside the graph has forward and backward
        # programs instead of train (see forward()).
        self._forward = b.programs.get("forward")
        self._backward = b.programs.get("backward")
        self._train = (program(b, None, "train", train_model_uri)
                       if self._forward is None else None)
        self._eval = program(b, eval_model_uri, "eval", train_model_uri)
        # Packed with update_in_backward: "train" stops at the loss and "backward_update"
        # applies the updates as the gradients come (see __call__).
        self._backward_update = b.programs.get("backward_update")
        self._updater = None        # the Optimizer that prepares those updates
        # (an integer training blob has no gradient buffers, so no reset flag)
        self._reset_at = (b.offsets[b.tensor_id(_LAZY_RESET_GRAD)]
                          if _LAZY_RESET_GRAD in b.names else -1)
        self._training = True
        self._reset_pending = True  # ORT: the first train step overwrites the gradients
        self._gradients_ok = True   # False after a refused train call: no optimizer step
        # the state a training forward pass updates in place, kept and checked around each
        # train call (kept.py, imported only by blobs that have it)
        self._kept = None
        if b.kept:
            from microtrain.kept import Kept
            self._kept = Kept(b)
        # the gradient buffers a train call leaves for the optimizer program
        self._grads = [(b.offsets[g], b.sizes[g]) for t, g, _ in b.parameters if g >= 0]
        self._forward_at = None     # optimizer step of the last train forward(), until backward
        self._output_views = {}     # program name -> views of its outputs, made once

    # -- parameters -------------------------------------------------------------------
    def _bind_parameters(self):
        # Every parameter's values into its place in the arenas (streamed from the
        # checkpoint file in one pass when the state still has them there), then the state
        # sees views of the arenas.
        b = self.blob
        state = self.state
        missing = [b.names[p[0]] for p in b.parameters if b.names[p[0]] not in state.parameters]
        if missing:
            raise ParameterError("the checkpoint lacks parameters %s" % ", ".join(missing))
        targets = []
        bound = []          # (Parameter, its view, its gradient's view)
        for tensor, grad, _ in b.parameters:
            name = b.names[tensor]
            p = state.parameters[name]
            off, n = b.offsets[tensor], b.sizes[tensor]
            if tuple(p.shape) != b.shapes[tensor] and not state.is_nominal:
                raise ParameterError("parameter '%s' has shape %r in the checkpoint, %r in the model"
                                     % (name, tuple(p.shape), b.shapes[tensor]))
            trainable = b.is_trainable(tensor, grad)
            if trainable != bool(p.requires_grad):
                raise ParameterError("parameter '%s' is %s in the checkpoint but %s in the model"
                                     % (name, "trainable" if p.requires_grad else "frozen",
                                        "trainable" if trainable else "frozen"))
            if b.dtypes[tensor] != _FLOAT:
                from microtrain.intparams import bind_integer
                bound.append(bind_integer(self, p, tensor, targets))
                continue
            if getattr(p, "data_type", 1) != 1:
                raise ParameterError("parameter '%s' is an integer tensor in the checkpoint, "
                                     "a float one in the model" % name)
            if name in state._velocities:
                raise CheckpointError("the checkpoint has an integer momentum velocity for '%s', "
                                      "a float parameter in the model" % name)
            _take(p._data, name, n, self.F, off, targets)
            bound.append((p, tensor, self._view[off:off + n],
                          self._view[b.offsets[grad]:b.offsets[grad] + n] if grad >= 0 else None))
        if targets:
            state.stream(targets)
        for p, tensor, view, grad in bound:
            p.shape = b.shapes[tensor]
            p.data = view
            if grad is not None:
                p.grad = grad
        for tensor in b.nonnegative:
            # a running variance: negative, normalising by its square root gives NaN
            off = b.offsets[tensor]
            for i in range(b.sizes[tensor]):
                if self.F[off + i] < 0.0:
                    raise CheckpointError("the checkpoint's '%s' has %r at position %d: a "
                                          "variance is never negative"
                                          % (b.names[tensor], self.F[off + i], i))

    def load_checkpoint(self, checkpoint_uri):
        """Take the checkpoint at checkpoint_uri (of this model: the same parameters) into
        this Module's arenas - and its Optimizer's moments and step, when the Module has
        one - instead of building another Module: no second set of arenas. The checkpoint
        is validated before anything changes; returns its CheckpointState, which is now
        this Module's state."""
        # (moduleextra.py: the reload's steps, imported on first use, not by a training run)
        from microtrain.moduleextra import reload
        return reload(self, checkpoint_uri)

    def _random_states(self):
        # {microtrain.rng.*: state} of every generator, for save_checkpoint (only then)
        return self._randoms.states() if self._randoms is not None else {}

    # ORT's flat-buffer parameter API (federated averaging): flatparams.py, imported on
    # first use (a training run that never calls it does not carry it)
    def get_parameters_size(self, trainable_only=True):
        from microtrain.flatparams import parameters_size
        return parameters_size(self, trainable_only)

    def get_contiguous_parameters(self, trainable_only=False):
        from microtrain.flatparams import contiguous_parameters
        return contiguous_parameters(self, trainable_only)

    def copy_buffer_to_parameters(self, buffer, trainable_only=True):
        from microtrain.flatparams import copy_buffer
        copy_buffer(self, buffer, trainable_only)

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
        if self._randoms is not None:
            self._randoms.seed(seed)

    def input_names(self, training=None):
        from microtrain.moduleextra import names
        return names(self, training, False)

    def output_names(self, training=None):
        from microtrain.moduleextra import names
        return names(self, training, True)

    def _load_inputs(self, program, inputs):
        if self.state.is_nominal:
            raise ParameterError("the checkpoint state is nominal (no parameter values): load "
                                 "all of them with copy_buffer_to_parameters(buffer, "
                                 "trainable_only=False) before training or eval")
        b = self.blob
        copy_inputs(b, self.F, self.I, program, inputs, b.num_classes)

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
        kept = self._kept
        if self._training and kept is not None:
            kept.copy(F, I, True)
        for kernel, args in program.steps:
            kernel(F, I, args)
        if self.blob.integer_parameters:
            # the integer train step is done (updates included); its loss ints -> a float
            from microtrain.intparams import integer_loss
            return integer_loss(self, program)
        loss = F[self.blob.offsets[program.outputs[0]]]
        if self._training:
            self._reset_pending = False
            if not -_INF < loss < _INF:  # NaN too
                self._refuse("the loss is %r: training diverged (lower the learning rate "
                             "or check the inputs)" % loss)
            worst = self._largest_gradient()
            if not worst <= _GRADIENT_LIMIT:
                self._refuse("a gradient is %r: beyond %g a float32 moment or update would "
                             "become infinite (lower the learning rate, scale the inputs)"
                             % (worst, _GRADIENT_LIMIT))
            if kept is not None:
                why = kept.problem(self.blob, F)
                if why:
                    self._refuse(why)
            self._gradients_ok = True
            if self._backward_update is not None:
                # One optimizer step: the step count and the rates first, then the backward
                # pass, which updates each parameter as soon as its gradient is known.
                updater._advance()
                for kernel, args in self._backward_update.steps:
                    kernel(F, I, args)
                updater.check_updates()
        if len(program.outputs) == 1:
            return loss
        results = self._views(program)
        results[0] = loss  # a number in place of its view (forward() never sees this list)
        return results

    def _refuse(self, why):
        # A train call that must not count: the state the forward pass updated in place
        # (running statistics, observers' ranges, generators) is put back, the gradient
        # buffers (garbage now) are overwritten by the next train call, and no optimizer
        # step may use them. (With update_in_backward the backward pass has not run.)
        kept = self._kept
        if kept is not None:
            kept.copy(self.F, self.I, False)
        self._reset_pending = True
        self._gradients_ok = False
        raise TrainingError("%s; parameters were not updated%s and the accumulated gradients "
                            "are dropped" % (why, ", the state its forward pass updated "
                                             "(running statistics, ranges, generators) was "
                                             "put back," if kept is not None else ""))

    def _largest_gradient(self):
        # max |g| over the gradient buffers (NaN as soon as one is NaN); 0 without them
        F = self.F
        worst = 0.0
        for off, n in self._grads:
            if largest_abs is not None:
                worst = largest_abs(F, off, n, worst)
                if worst != worst:
                    return worst
                continue
            for i in range(off, off + n):
                g = F[i]
                if not -worst <= g <= worst:
                    if g != g:
                        return g
                    worst = g if g > 0.0 else -g
        return worst

    def forward(self, *inputs):
        """outputs = model.forward(*inputs) for a model packed with loss=None and a
        non-scalar output (the loss is computed outside the graph). In train mode it runs
        the training forward pass and keeps what backward() needs; in eval mode the eval
        program. Returns a view of the output (a list of views with several outputs), valid
        until the next forward or call; the views are the same objects every time."""
        from microtrain.outside import forward
        return forward(self, inputs)

    def backward(self, *grad_outputs):
        """model.backward(d_output) (one gradient per forward output, flat, in output
        order): accumulates the parameter gradients of the loss whose gradients with respect
        to the outputs are given, like a train call (lazy_reset_grad() semantics included);
        then Optimizer.step() as usual. Needs a train-mode forward() just before: nothing
        else (eval, optimizer step) may run in between."""
        from microtrain.outside import backward
        backward(self, grad_outputs)

    def export_model_for_inferencing(self, inference_model_uri, graph_output_names):
        """Write an inference-only blob (no gradients, optimizer state or loss; its own,
        smaller arena) with the parameters' current values, for InferenceSession.
        graph_output_names: the model outputs it returns, in that order. Atomic."""
        from microtrain.export import export_inference_blob
        export_inference_blob(self, inference_model_uri, graph_output_names)

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
        view = self._view if dtype == _FLOAT else memoryview(
            self.I if dtype == _INT32 else b.weights if tid in b.in_place else b.Q)
        return view[off:off + b.sizes[tid]]


def _take(values, name, n, arena, off, targets):
    # A tensor's values into arena[off:off + n]: a Ref (still in the checkpoint file) becomes
    # a target of the state's stream, values in RAM are copied; None (nominal) stays zero.
    if values is None:
        return
    count = values.nbytes // 4 if isinstance(values, Ref) else len(values)
    if count != n:
        raise ParameterError("parameter '%s' has %d values, the model needs %d"
                             % (name, count, n))
    if isinstance(values, Ref):
        targets.append((values, arena, off))
    else:
        for i in range(n):
            arena[off + i] = values[i]
