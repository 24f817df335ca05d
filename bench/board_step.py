# Device side of bench/board_cost.py, on the emulated Cortex-M3 under qemu -icount shift=0
# (settings prepended by the host: KIND, BLOB, X, X_TYPE, Y, STEPS, PROFILE). Loads the files the
# host put in the ROM filesystem, runs one warm-up step (imports, first allocations, the
# optimizer's state), then STEPS counted ones, and prints "ticks N U" per counted step: the
# FPGAIO counter's ticks (25 MHz of virtual time = one per 40 instructions) of the step, and
# U of its optimizer update (Optimizer.step) alone. The garbage collector runs when it
# must, as in a training run: a step's count includes its share.
# KIND "train": model(x, y), opt.step(), lazy_reset_grad(); "infer": InferenceSession.run(x).
import gc
import machine
from array import array


def counter():
    return machine.mem32[0x40028018]


def load(name, typecode):
    with open("/rom/" + name, "rb") as f:
        return array(typecode, f.read())


gc.collect()
# the blob where it lies in the ROM filesystem (flash): int8 weights are read in place
blob = memoryview(open("/rom/" + BLOB, "rb"))
if KIND == "train":
    from microtrain import CheckpointState, Module, Optimizer
    gc.collect()
    state = CheckpointState.load_checkpoint("/rom/checkpoint")
    # collect every 4 KB while Module loads, as boards/train_on_board.py does: its reader's
    # garbage then reuses small holes instead of splitting the block the arenas need
    gc.threshold(4096)
    model = Module(blob, state)
    gc.threshold(-1)
    opt = Optimizer(blob, model)
    x, y = load(X, X_TYPE), load(Y, "i")

    def step():
        model(x, y)
        t0 = counter()
        opt.step()
        update = counter() - t0
        model.lazy_reset_grad()
        return update
else:
    from microtrain import InferenceSession
    gc.collect()
    session = InferenceSession(blob)
    x = load(X, X_TYPE)

    def step():
        session.run(x)
        return 0


if PROFILE and KIND == "train":
    # per kernel: each program step's kernel wrapped to add its ticks under its name
    # (module.name, looked up among the loaded kernel modules); printed after the counted
    # steps as "kernel NAME TICKS CALLS" summed over them. The wrappers' own calls cost a
    # few hundred instructions each: the profiled step is a little longer than the counted.
    import sys
    names, spent = {}, {}
    for modname in list(sys.modules):
        if modname.startswith("microtrain.kernels."):
            mod = sys.modules[modname]
            for attr in dir(mod):
                names[id(getattr(mod, attr))] = modname[19:] + "." + attr

    def timed(kernel):
        name = names.get(id(kernel), repr(kernel))

        def run(F, I, args):
            t0 = counter()
            kernel(F, I, args)
            t = spent.get(name, (0, 0))
            spent[name] = (t[0] + counter() - t0, t[1] + 1)
        return run

    for program in (model._train, opt._program):
        if program is not None:
            program.steps = [(timed(k), a) for k, a in program.steps]

    def timed_method(obj, attr):
        # the runtime's own work between the kernels, under "Class.method"
        method = getattr(obj, attr)
        name = type(obj).__name__ + "." + attr

        def run(*a):
            t0 = counter()
            r = method(*a)
            t = spent.get(name, (0, 0))
            spent[name] = (t[0] + counter() - t0, t[1] + 1)
            return r
        setattr(obj, attr, run)

    for attr in ("_load_inputs", "_largest_gradient"):
        timed_method(model, attr)
    for attr in ("_advance", "check_updates"):
        timed_method(opt, attr)

step()
if PROFILE and KIND == "train":
    spent.clear()
gc.collect()
for _ in range(STEPS):
    t0 = counter()
    update = step()
    # the whole step's ticks, and those of its optimizer update alone
    print("ticks", (counter() - t0) & 0xFFFFFFFF, update & 0xFFFFFFFF)
if PROFILE and KIND == "train":
    for name in spent:
        print("kernel", name, spent[name][0], spent[name][1])
gc.collect()
print("heap", gc.mem_alloc())   # live after the steps: what the run keeps of the 140 KiB
