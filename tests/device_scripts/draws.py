# The device scripts' seeded draws (fuzz_mutations.py, sample_store.py): the same on every
# port, without `random`.


class Draws:
    # A 31-bit linear congruential generator: the same draws on every port (no `random`).
    def __init__(self, seed):
        self.state = (seed * 2654435761 + 12345) & 0x7FFFFFFF

    def below(self, n):
        self.state = (self.state * 1103515245 + 12345) & 0x7FFFFFFF
        return (self.state >> 8) % n
