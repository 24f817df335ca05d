# ONNX Runtime's flat-buffer parameter API (Module.get_parameters_size,
# get_contiguous_parameters, copy_buffer_to_parameters): every parameter as one float
# sequence in the blob's order, as federated averaging hands them around (federated.py).
# Module imports this module when one of them is first called, so that a training run
# which never does (the minimal runtime `microtrain deploy` ships) does not carry it.
from microtrain.blob import zeros
from microtrain.errors import ParameterError


def _ids(module, trainable_only):
    b = module.blob
    if b.integer_parameters:
        raise ParameterError("this model trains integer parameters: read and write them "
                             "through state.parameters (int8 / int32 views)")
    return [t for t, grad, _ in b.parameters if not trainable_only or b.is_trainable(t, grad)]


def parameters_size(module, trainable_only):
    return sum(module.blob.sizes[t] for t in _ids(module, trainable_only))


def contiguous_parameters(module, trainable_only):
    out = zeros("f", parameters_size(module, trainable_only))
    at = 0
    for t in _ids(module, trainable_only):
        off, n = module.blob.offsets[t], module.blob.sizes[t]
        out[at:at + n] = module.F[off:off + n]
        at += n
    return out


def copy_buffer(module, buffer, trainable_only):
    want = parameters_size(module, trainable_only)
    if len(buffer) != want:
        raise ParameterError("parameter buffer has %d values, the model's %s parameters need "
                             "%d (get_parameters_size(trainable_only=%r))"
                             % (len(buffer), "trainable" if trainable_only else "",
                                want, trainable_only))
    at = 0
    F = module.F
    for t in _ids(module, trainable_only):
        off, n = module.blob.offsets[t], module.blob.sizes[t]
        for i in range(n):
            F[off + i] = buffer[at + i]
        at += n
    if not trainable_only or parameters_size(module, True) == parameters_size(module, False):
        # Only once every parameter has a value; frozen ones must not silently stay zero.
        module.state.is_nominal = False
