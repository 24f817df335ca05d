"""MicroPython's `random` for CPython: the same draws from the same seed, so that a device
script's random cases can be made again on the host (tests/test_board_natmod.py: the board
runs the native kernels on them, CPython the pure-Python kernels). MicroPython 1.25's
extmod/modrandom.c draws 32-bit words from Yasmarang and takes randint, randrange and
choice's values below n by rejection under the smallest all-ones mask >= n; this module
does the same arithmetic in Python ints, wrapped to 32 bits. tests/test_micropython_random.py
checks it against the Unix port's module."""

_MASK = 0xFFFFFFFF
_pad, _n, _d, _dat = 0xEDA4BABA, 69, 233, 0


def seed(value):
    global _pad, _n, _d, _dat
    _pad, _n, _d, _dat = value & _MASK, 69, 233, 0


def _word():
    global _pad, _n, _d, _dat
    pad = (_pad + _dat + _d * _n) & _MASK
    pad = ((pad << 3) + (pad >> 29)) & _MASK
    _n = pad | 2
    _d ^= ((pad << 31) + (pad >> 1)) & _MASK
    _dat = (_dat ^ pad ^ (_d >> 8) ^ 1) & 0xFF
    _pad = pad
    return (pad ^ (_d << 5) ^ (pad >> 18) ^ (_dat << 1)) & _MASK


def _below(n):
    mask = 1
    while (n & mask) < n:
        mask = mask << 1 | 1
    while True:
        r = _word() & mask
        if r < n:
            return r


def getrandbits(bits):
    if not 0 <= bits <= 32:
        raise ValueError("bits must be 32 or less")
    return _word() & (_MASK >> (32 - bits)) if bits else 0


def randint(a, b):
    if a > b:
        raise ValueError
    return a + _below((b - a + 1) & _MASK)


def randrange(start, stop=None, step=1):
    if stop is None:
        if start <= 0:
            raise ValueError
        return _below(start)
    if step == 1:
        if start >= stop:
            raise ValueError
        return start + _below((stop - start) & _MASK)
    if step == 0:
        raise ValueError
    count = (stop - start + step - 1) // step if step > 0 else (stop - start + step + 1) // step
    if count <= 0:
        raise ValueError
    return start + step * _below(count)


def choice(sequence):
    if not len(sequence):
        raise IndexError
    return sequence[_below(len(sequence))]
