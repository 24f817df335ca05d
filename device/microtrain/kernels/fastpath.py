# The switch between a kernel family's pure-Python kernels and their viper versions: the
# use_fast(on) of qlinear.py and inttrain.py, written once so both families swap, fall back
# and cope with trimmed runtimes alike. Imported by those use_fast()s when they run (at
# import, FAST = use_fast()), so a runtime without them does not carry this module.


def use_fast(g, names, pure, on, load):
    """Put the pure-Python kernels back into the family's globals g, then with `on` the
    viper ones of the module load() returns (load imports it and hands it what it needs).
    `pure` is the family's {name: pure kernel}, filled on the first call (at import,
    before any swap) with those of `names` that g defines: a trimmed runtime
    (tools/runtime.py) keeps only the kernels its model uses. Returns `on`, or False when
    load() cannot import the viper module (CPython; a MicroPython without viper)."""
    if not pure:
        for name in names:
            if name in g:
                pure[name] = g[name]
    for name in pure:
        g[name] = pure[name]
    if on:
        try:
            fast = load()
        except (ImportError, SyntaxError):
            return False
        for name in pure:
            g[name] = getattr(fast, name)
    return on
