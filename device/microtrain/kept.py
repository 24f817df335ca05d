# The state a training forward pass updates in place (running statistics, observers'
# ranges, generators: the checkers note it, StepCheck.kept): Module copies it before each
# train call and puts it back when the call is refused. Imported only for a blob that has
# such state, so that the runtime of a model without it (a float MLP) does not carry it.
from microtrain.blob import zeros

# contract: private
# (generated from host/microtrain_host/contract/ by `python -m microtrain_host.contract.generate`; do not edit)
from microtrain.errors import const
_FLOAT = const(0)
# end of contract


class Kept:
    def __init__(self, b):
        # [(float?, offset, count)] of the kept tensors, and arrays to copy them into
        self.spans = [(b.dtypes[t] == _FLOAT, b.offsets[t], b.sizes[t]) for t in b.kept]
        self.copy_f = zeros("f", sum(n for is_float, _, n in self.spans if is_float))
        self.copy_i = zeros("i", sum(n for is_float, _, n in self.spans if not is_float))
        # what is wrong with that state after a train call, or None (kernels/norm.py)
        from microtrain.kernels.norm import kept_problem
        self.problem = kept_problem

    def copy(self, F, I, keep):
        # keep: the spans into the copies; else back from them
        at_f = at_i = 0
        for is_float, off, n in self.spans:
            arena, copy = (F, self.copy_f) if is_float else (I, self.copy_i)
            at = at_f if is_float else at_i
            if keep:
                for i in range(n):
                    copy[at + i] = arena[off + i]
            else:
                for i in range(n):
                    arena[off + i] = copy[at + i]
            if is_float:
                at_f += n
            else:
                at_i += n
