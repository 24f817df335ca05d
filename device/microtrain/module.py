# Module: runs the train and eval programs of a blob over arenas allocated once.
import math
from array import array
from microtrain import blob as blobfile
from microtrain.errors import InputError, ParameterError, TrainingError

_ROLE_PARAM = 2
_ROLE_LABEL = 1


def _zeros(typecode, n):
    # array(typecode, bytes(4 * n)) would briefly need twice the memory; an iterable with a
    # length is allocated once at its final size, then zeroed.
    a = array(typecode, range(n))
    zero = 0.0 if typecode == "f" else 0
    for i in range(n):
        a[i] = zero
    return a


class Module:
    """Like onnxruntime.training.api.Module: Module(blob_uri, state[, eval_uri]).

    model(*inputs) runs the train program in train mode (returns the loss, accumulating
    gradients) and the eval program in eval mode (returns the loss, or a list of the loss
    and views of the other outputs when the eval program has more)."""

    def __init__(self, train_model_uri, state, eval_model_uri=None):
        # The arenas are the largest blocks: allocate them before the blob's many small
        # objects fragment a small heap.
        data = blobfile.read(train_model_uri)
        float_arena, int_arena = blobfile.arena_sizes(data)
        self.F = _zeros("f", float_arena)
        self.I = _zeros("i", int_arena)
        b = blobfile.parse(data)
        del data
        self.blob = b
        self.uri = train_model_uri
        self.state = state
        for tid, raw in b.constants:
            off = b.offsets[tid]
            self.F[off:off + b.sizes[tid]] = array("f", raw)
        self._view = memoryview(self.F)
        self._bind_parameters()
        self._train = blobfile.program(b, None, "train", train_model_uri)
        self._eval = blobfile.program(b, eval_model_uri, "eval", train_model_uri)
        self._reset_at = b.offsets[b.tensor_id("lazy_reset_grad")]
        self._training = True
        self._reset_pending = True  # ORT: the first train step overwrites the gradients

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
            if (grad >= 0) != bool(p.requires_grad):
                raise ParameterError("parameter '%s' is %s in the checkpoint but %s in the model"
                                     % (name, "trainable" if p.requires_grad else "frozen",
                                        "trainable" if grad >= 0 else "frozen"))
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

    def _parameter_ids(self, trainable_only):
        return [t for t, grad, _ in self.blob.parameters if grad >= 0 or not trainable_only]

    def get_parameters_size(self, trainable_only=True):
        return sum(self.blob.sizes[t] for t in self._parameter_ids(trainable_only))

    def get_contiguous_parameters(self, trainable_only=False):
        out = _zeros("f", self.get_parameters_size(trainable_only))
        at = 0
        for t in self._parameter_ids(trainable_only):
            off, n = self.blob.offsets[t], self.blob.sizes[t]
            out[at:at + n] = self.F[off:off + n]
            at += n
        return out

    def copy_buffer_to_parameters(self, buffer, trainable_only=True):
        want = self.get_parameters_size(trainable_only)
        if len(buffer) != want:
            raise ParameterError("parameter buffer has %d values, the model's %s parameters need %d"
                                 % (len(buffer), "trainable" if trainable_only else "", want))
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
        self._reset_pending = True

    def input_names(self, training=None):
        program = self._program(training)
        return [self.blob.names[t] for t in program.inputs]

    def output_names(self, training=None):
        program = self._program(training)
        return [self.blob.names[t] for t in program.outputs]

    def _program(self, training):
        if training is None:
            training = self._training
        return self._train if training else self._eval

    def __call__(self, *inputs):
        if self.state.is_nominal:
            raise ParameterError("the checkpoint state is nominal (no parameter values): load "
                                 "all of them with copy_buffer_to_parameters(buffer, "
                                 "trainable_only=False) before training or eval")
        program = self._train if self._training else self._eval
        if len(inputs) != len(program.inputs):
            raise InputError("the %s program takes %d inputs (%s), got %d"
                             % (program.name, len(program.inputs),
                                ", ".join(self.input_names()), len(inputs)))
        for tid, values in zip(program.inputs, inputs):
            self._copy_in(tid, values)
        F = self.F
        I = self.I
        if self._training:
            F[self._reset_at] = 1.0 if self._reset_pending else 0.0
        for kernel, args in program.steps:
            kernel(F, I, args)
        loss = F[self.blob.offsets[program.outputs[0]]]
        if self._training:
            self._reset_pending = False
            if loss != loss or loss in (math.inf, -math.inf):
                # The gradient buffers now hold garbage: the next train call overwrites them.
                self._reset_pending = True
                raise TrainingError("the loss is %r: training diverged (lower the learning rate "
                                    "or check the inputs); parameters were not updated and the "
                                    "accumulated gradients are dropped" % loss)
        if len(program.outputs) == 1:
            return loss
        return [loss] + [self.output(t) for t in program.outputs[1:]]

    def output(self, tensor):
        """A view of an output tensor (id or name) in the arena; valid until the next call."""
        b = self.blob
        tid = b.tensor_id(tensor) if isinstance(tensor, str) else tensor
        off = b.offsets[tid]
        return self._view[off:off + b.sizes[tid]]

    def _copy_in(self, tid, values):
        b = self.blob
        name, off, n = b.names[tid], b.offsets[tid], b.sizes[tid]
        if len(values) != n:
            raise InputError("input '%s' needs %d values (shape %r), got %d"
                             % (name, n, b.shapes[tid], len(values)))
        if b.dtypes[tid] == blobfile.INT32:
            I = self.I
            classes = b.num_classes
            for i in range(n):
                v = values[i]
                if classes and not 0 <= v < classes:
                    raise InputError("label %r at position %d of '%s' is not a class index in "
                                     "[0, %d)" % (v, i, name, classes))
                I[off + i] = int(v)
        else:
            F = self.F
            for i in range(n):
                F[off + i] = values[i]
