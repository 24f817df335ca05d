# The switch between a kernel family's pure-Python kernels and their viper versions, written
# once for the integer families (qlinear.py, inttrain.py, intgrad.py: their use_fast(on) call
# it, FAST = use_fast() at import), so that they swap, fall back and cope with trimmed
# runtimes alike. Imported by those use_fast()s when they run, so a runtime without them does
# not carry this module.


def use_fast(g, names, on, module, native=None, helper=None):
    """Put the pure-Python kernels back into the family's globals g, then with `on` the
    native and viper ones. g["_pure"] is the family's {name: pure kernel},
    filled on the first call (at import, before any swap) with those of `names` that g
    defines: a trimmed runtime (tools/runtime.py) keeps only the kernels its model uses.
    With `on`, the kernels the dynamic native module kernels/<native>.mpy defines
    (device/native; machine code for the board's architecture) take their places, then the
    viper module's the others' (none left: the viper module is not imported): native >
    viper > pure, kernel by kernel. Each gets that dict as its _pure, the fallback for
    arguments its machine words cannot hold (the native module's merged with the other
    families': it serves several). A kernel helper the family has loaded (load_helper;
    g[helper] not None) is switched with it. Returns `on`, or False when
    neither module can be imported (CPython; a MicroPython without viper and without the
    native module)."""
    if helper is not None and g.get(helper) is not None:
        g[helper].use_fast(on)
    pure = g.get("_pure")
    if pure is None:
        pure = g["_pure"] = {}
        for name in names:
            if name in g:
                pure[name] = g[name]
    for name in pure:
        g[name] = pure[name]
    if not on:
        return on
    found = False
    # the native module first: where it defines every kernel of the family, the viper
    # module is not imported at all (its machine code would take heap for nothing: ~11 KB
    # for intgrad_viper on the M3)
    for name_of, errors in (  # ValueError: an .mpy of another architecture or version
            (native, (ImportError, ValueError)), (module, (ImportError, SyntaxError))):
        if name_of is None:
            continue
        left = [name for name in pure if g[name] is pure[name]]
        if found and not left:
            break
        try:
            fast = __import__("microtrain.kernels." + name_of, None, None, ("_pure",))
        except errors:
            continue
        found = True
        if name_of is native:
            # one native module serves several families (qlinear_native: qlinear's Gemm and
            # Conv, inttrain's update, intgrad's kernels; float_native: dense's, optim's,
            # reduce's and activation's kernels): its _pure holds each family's, by their
            # distinct names
            merged = getattr(fast, "_pure", None)
            if not isinstance(merged, dict):
                merged = {}
            merged.update(pure)
            pure_of = merged
        else:
            pure_of = pure
        fast._pure = pure_of
        for name in left:
            kernel = getattr(fast, name, None)
            if kernel is not None:
                g[name] = kernel
    return found


def load_helper(g, name, probe):
    """Import the kernel helper kernels/<name>.py into the family's globals g with its viper
    forms switched as the family's are (on when g's kernel `probe` is not its pure one):
    the family's checker calls it at load for a layer that needs the helper, so that a
    model without one never imports it (a board's heap keeps its module and its machine
    code)."""
    helper = g.get(name)
    if helper is None:
        helper = g[name] = __import__("microtrain.kernels." + name, None, None, ("use_fast",))
    helper.use_fast(g["_pure"][probe] is not g[probe])
