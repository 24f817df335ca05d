# A loss computed outside the graph (a model packed with loss=None and a non-scalar
# output): Module.forward runs the forward program and keeps what the backward program
# reads; Module.backward takes d loss / d output and accumulates the gradients.
from microtrain.blob import describe
from microtrain.errors import TrainingError


def _check(module):
    if module._forward is None:
        # Say which loss the blob has and how to get the other form: a model with
        # several outputs packed with loss=None takes a scalar first output as its loss.
        b = module.blob
        names = [b.names[t] for t in module._eval.outputs]
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
                            % (describe(module.uri), loss, outputs, ",".join(outputs)))


def forward(module, inputs):
    _check(module)
    program = module._forward if module._training else module._eval
    module._forward_at = None  # until this forward has run
    module._load_inputs(program, inputs)
    F = module.F
    I = module.I
    for kernel, args in program.steps:
        kernel(F, I, args)
    module._forward_at = module.state.optimizer_step if module._training else None
    views = module._views(program)
    return views[0] if len(views) == 1 else views


def backward(module, grad_outputs):
    _check(module)
    if module._forward_at != module.state.optimizer_step:
        raise TrainingError("backward() needs the activations of a train-mode forward() "
                            "run just before it (with no eval call or optimizer step in "
                            "between)")
    program = module._backward
    module._load_inputs(program, grad_outputs)
    F = module.F
    I = module.I
    F[module._reset_at] = 1.0 if module._reset_pending else 0.0
    for kernel, args in program.steps:
        kernel(F, I, args)
    module._reset_pending = False
    module._forward_at = None
