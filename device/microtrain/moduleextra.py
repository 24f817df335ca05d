# Module's methods a training loop does not call, imported on first use: the in-program
# reload (Module.load_checkpoint) and the names of a program's inputs and outputs. Apart
# from module.py so that a run that never calls them does not hold their bytecode in its
# heap (a runtime imported from a board's files copies every function it imports).


def reload(module, checkpoint_uri):
    # Module.load_checkpoint: the checkpoint is validated before anything changes; a
    # failure while taking it into the arenas puts the old state back as nominal
    from microtrain.checkpoint import CheckpointState
    state = CheckpointState.load_checkpoint(checkpoint_uri)
    old = module.state
    module.state = state
    try:
        module._bind_parameters()
        if module._randoms is not None:
            module._randoms.restore()
        if module._optimizer is not None:
            module._optimizer._bind_state(state)
    except Exception:
        # part of the new values may be in the arenas: nothing trains on them
        old.is_nominal = True
        module.state = old
        raise
    state._random_source = module._random_states
    module._reset_pending = True
    return state


def names(module, training, outputs):
    # Module.input_names / output_names: of the train program (the forward one of a loss
    # computed outside the graph) or the eval one; training None: the Module's mode
    if training is None:
        training = module._training
    program = (module._train or module._forward) if training else module._eval
    return [module.blob.names[t] for t in (program.outputs if outputs else program.inputs)]
