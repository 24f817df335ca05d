# The random generators a blob keeps in its int arena: each Dropout's (2 ints; stream k =
# the k-th '.random_state' tensor, kernels/norm.py) and integer training's stochastic-
# rounding ones (one int each, tensors "<weight>.dither", kernels/inttrain.py). A
# checkpoint saved with optimizer state holds their states as the int properties
# microtrain.rng.<k> and microtrain.rng.<weight>.dither (checkpoint.py), so that a resumed
# run draws what the uninterrupted one would have.
from microtrain.checkpoint import RNG_PREFIX
from microtrain.errors import CheckpointError


class Generators:
    def __init__(self, module):
        b = module.blob
        self.module = module
        self.random_at = [b.offsets[t] for t in range(len(b.names))
                          if b.names[t].endswith(".random_state")]
        self.dither_at = [(b.names[t], b.offsets[t]) for t in range(len(b.names))
                          if b.integer_parameters and b.names[t].endswith(".dither")]
        self.restore()

    def restore(self):
        """The saved states of the module's checkpoint (absent ones: seeded on the first
        draw)."""
        I = self.module.I
        saved = getattr(self.module.state, "random_states", None)
        if not saved:
            return
        for name, at in self.dither_at:
            value = saved.get(RNG_PREFIX + name)
            if value is None:
                continue                        # 0: the kernel seeds it on its first draw
            if not isinstance(value, int) or not 0 <= value < 65536:
                raise CheckpointError("property '%s' = %r is not a stochastic-rounding "
                                      "generator state (0 to 65535)" % (RNG_PREFIX + name, value))
            I[at] = value
        if not self.random_at:
            return
        from microtrain.kernels.norm import set_state
        for stream, at in enumerate(self.random_at):
            name = RNG_PREFIX + str(stream)
            if name in saved and not set_state(I, at, saved[name]):
                raise CheckpointError("property '%s' = %r is not a Dropout generator state"
                                      % (name, saved[name]))

    def states(self):
        """{microtrain.rng.<k>: state} of every Dropout and microtrain.rng.<w>.dither of
        every stochastic-rounding generator, for save_checkpoint (only then)."""
        I = self.module.I
        out = dict((RNG_PREFIX + name, I[at]) for name, at in self.dither_at)
        if self.random_at:
            from microtrain.kernels.norm import get_state
            for stream, at in enumerate(self.random_at):
                out[RNG_PREFIX + str(stream)] = get_state(I, at)
        return out

    def seed(self, seed):
        if self.random_at:
            from microtrain.kernels.norm import seed_state
            for stream, at in enumerate(self.random_at):
                seed_state(self.module.I, at, seed, stream)
