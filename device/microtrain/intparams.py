# Parameters trained in integers (kernels/inttrain.py, kernels/intgrad.py): an int8 weight in
# the byte arena, an int32 bias in the int arena, their momentum velocities, and the loss the
# integer softmax cross-entropy leaves as ints. A float model never imports this module.
from microtrain.blob import INT8, INT32, UINT8
from microtrain.checkpoint import ONNX_INT8, ONNX_INT16, ONNX_INT32, Ref
from microtrain.errors import CheckpointError, ParameterError


def bind_integer(module, p, tensor, targets):
    """An int8 weight (byte arena, ONNX data type 3) or int32 bias (int arena, 6): its values
    come in (a Ref of the checkpoint file joins `targets`, values in RAM are copied), then it
    is a view of the arena (raw bytes of the int8 one: two's complement, as the checkpoint
    stores them). Returns (p, tensor, view, None) for Module._bind_parameters."""
    b = module.blob
    dtype = b.dtypes[tensor]
    off, n = b.offsets[tensor], b.sizes[tensor]
    want = ONNX_INT8 if dtype == INT8 else ONNX_INT32
    if getattr(p, "data_type", 1) != want or dtype == UINT8:
        raise ParameterError("parameter '%s' has ONNX data type %d in the checkpoint, the "
                             "model needs %d" % (p.name, getattr(p, "data_type", 1), want))
    arena = b.Q if want == ONNX_INT8 else module.I
    values = p._data
    if values is not None:
        count = values.nbytes // (1 if want == ONNX_INT8 else 4) if isinstance(values, Ref) \
            else len(values)
        if count != n:
            raise ParameterError("parameter '%s' has %d values, the model needs %d"
                                 % (p.name, count, n))
        if isinstance(values, Ref):
            targets.append((values, arena, off))
        else:
            for i in range(n):
                arena[off + i] = values[i] & 255 if want == ONNX_INT8 else values[i]
    _bind_velocity(module, p.name, targets)
    return p, tensor, memoryview(arena)[off:off + n], None


def _bind_velocity(module, name, targets):
    # Integer momentum (kernels/inttrain.py int_gemm_update_momentum): the velocity of
    # parameter `name` is the optimizer-state tensor "<name>.velocity" (the host's
    # ops/inttrain.py names it so): int16 values as 2 little-endian bytes each in the byte
    # arena for an int8 weight, int32 ones in the int arena for a bias. It comes from
    # the checkpoint's momentum0 when that has one, else it stays zero (an older
    # checkpoint, or one saved without optimizer state: the velocities restart, as in a
    # fresh run); then the state holds a view of it, which save_checkpoint writes.
    b = module.blob
    velocities = module.state._velocities
    saved = velocities.pop(name, None)
    key = name + ".velocity"
    if key not in b.names:
        return      # trained without momentum: a saved velocity is not carried on
    tid = b.names.index(key)
    off, size = b.offsets[tid], b.sizes[tid]
    wide = b.dtypes[tid] == INT32
    want = ONNX_INT32 if wide else ONNX_INT16
    count = size if wide else size // 2
    arena = module.I if wide else b.Q
    if saved is not None:
        dtype, values = saved
        got = values.nbytes // (4 if dtype == ONNX_INT32 else 2) if isinstance(values, Ref) \
            else len(values)
        if dtype != want or got != count:
            raise CheckpointError("the integer momentum velocity (momentum0) of '%s' has %d "
                                  "values of ONNX type %d; the model needs %d of type %d"
                                  % (name, got, dtype, count, want))
        if isinstance(values, Ref):
            targets.append((values, arena, off))
        elif wide:
            for i in range(count):
                arena[off + i] = values[i]
        else:
            raw = bytes(values)              # the int16s' bytes, as the arena keeps them
            for i in range(size):
                arena[off + i] = raw[i]
    velocities[name] = (want, memoryview(arena)[off:off + size])


def integer_loss(module, program):
    # kernels/inttrain.py int_softmax_ce's loss ints -> the mean cross-entropy (or
    # kernels/intloss.py's -> the mean squared error, the binary cross-entropy, by the
    # blob's loss name); with more outputs (eval: the int32 logits, LOGIT_BITS fractional
    # bits) their views too
    b = module.blob
    t = program.outputs[0]
    if b.loss == "int_softmax_cross_entropy":
        from microtrain.kernels.inttrain import loss_value
        loss = loss_value(module.I, b.offsets[t], b.sizes[t] // 2)
    else:
        from microtrain.kernels.intloss import LOSSES
        value, per_sample = LOSSES[b.loss]
        loss = value(module.I, b.offsets[t], b.sizes[t] // per_sample, b.int_units[t])
    if module._training:
        module._reset_pending = False
    if len(program.outputs) == 1:
        return loss
    results = module._views(program)
    results[0] = loss
    return results
