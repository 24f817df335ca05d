# A training loop for boards and for `microtrain train`: epochs of shuffled mini-batches,
# evaluation on a validation set, a trained checkpoint at the end. Datasets are flat
# arrays in RAM; every buffer is allocated before the first step.
#
#   micropython -m microtrain.fit ARTIFACT_DIR DATA_DIR EPOCHS LR OUT_CHECKPOINT [SEED]
# DATA_DIR holds x_train.f32, y_train.{i32|f32}, x_val.f32, y_val.{i32|f32} (raw
# little-endian; no y files for a model whose input is its own target); an integer
# training blob's int8 / uint8 input takes x_*.i8 / x_*.u8 instead (quantized on the host).
# Progress goes to stdout as lines "@step ..." and "@epoch ...". More than one epoch of an
# integer blob whose trained layers follow frozen ones trains from a latent cache in RAM.
import sys
from array import array
from microtrain.checkpoint import CheckpointState
from microtrain.module import Module
from microtrain.optimizer import Optimizer

_INT32 = 1
# by the input's dtype (blob.py: FLOAT, INT32, INT8, UINT8): the inputs' file extension and
# array typecode
X_FILES = ("f32", "i32", "i8", "u8")
_TYPECODES = "fibB"


def _read(path, typecode):
    import os
    item = 1 if typecode in "bB" else 4
    n = os.stat(path)[6] // item
    data = array(typecode, bytes(item * n))
    with open(path, "rb") as f:
        f.readinto(data)
    return data


class Batches:
    """Copies shuffled samples of (x, y) into the fixed-size batch buffers of a Module."""

    def __init__(self, module, x, y):
        b = module.blob
        inputs = b.programs["train"].inputs
        x_id = inputs[0]
        y_id = inputs[1] if len(inputs) > 1 else -1   # -1: the input is its own target
        self.batch = b.shapes[x_id][0]
        self.x_size = b.sizes[x_id] // self.batch
        self.y_size = b.sizes[y_id] // self.batch if y_id >= 0 else 0
        self.y_int = y_id >= 0 and b.dtypes[y_id] == _INT32
        self.x, self.y = x, y
        self.count = len(x) // self.x_size
        if len(y) != self.count * self.y_size:
            raise ValueError("%d samples of x but %d labels/targets" % (
                self.count, len(y) // self.y_size if self.y_size else len(y)))
        code = _TYPECODES[b.dtypes[x_id]]
        self.xb = array(code, bytes((1 if code in "bB" else 4) * self.batch * self.x_size))
        self.yb = array("i" if self.y_int else "f", bytes(4 * self.batch * self.y_size))
        # what a train or eval call takes
        self.inputs = (self.xb, self.yb) if y_id >= 0 else (self.xb,)
        self.order = array("i", range(self.count))
        self.full_batches = self.count // self.batch

    def shuffle(self, rng):
        order = self.order
        for i in range(self.count - 1, 0, -1):
            j = rng.below(i + 1)
            order[i], order[j] = order[j], order[i]

    def fill(self, index):
        xs, ys, xb, yb = self.x_size, self.y_size, self.xb, self.yb
        x, y, order = self.x, self.y, self.order
        for k in range(self.batch):
            s = order[index * self.batch + k]
            src, dst = s * xs, k * xs
            for j in range(xs):
                xb[dst + j] = x[src + j]
            src, dst = s * ys, k * ys
            for j in range(ys):
                yb[dst + j] = y[src + j]


class XorShift:
    # Tiny deterministic PRNG (xorshift32): identical sequence on MicroPython and CPython.
    def __init__(self, seed):
        self.state = (seed or 1) & 0xFFFFFFFF

    def below(self, n):
        s = self.state
        s ^= (s << 13) & 0xFFFFFFFF
        s ^= s >> 17
        s ^= (s << 5) & 0xFFFFFFFF
        self.state = s
        return s % n


def _correct(module, batches, outputs):
    # Cross-entropy: argmax == label. BCE: (logit > 0) == (target > 0.5). Else: None.
    loss = module.blob.loss
    yb = batches.yb
    if loss == "CrossEntropyLoss" or loss == "int_softmax_cross_entropy":
        # (an integer training blob's logits are int32 fixed point: the same argmax)
        classes = len(outputs) // batches.batch
        hits = 0
        for k in range(batches.batch):
            best = 0
            row = k * classes
            for c in range(1, classes):
                if outputs[row + c] > outputs[row + best]:
                    best = c
            hits += 1 if best == yb[k] else 0
        return hits, batches.batch
    if loss == "BCEWithLogitsLoss":
        hits = 0
        for i in range(len(outputs)):
            hits += 1 if (outputs[i] > 0.0) == (yb[i] > 0.5) else 0
        return hits, len(outputs)
    return None


def evaluate(module, batches):
    """Mean loss and accuracy (None when the loss has none) over the full batches."""
    module.eval()
    total, hits, seen = 0.0, 0, 0
    for i in range(batches.full_batches):
        batches.fill(i)
        out = module(*batches.inputs)
        if isinstance(out, list):
            total += out[0]
            counted = _correct(module, batches, out[1])
            if counted is not None:
                hits += counted[0]
                seen += counted[1]
        else:
            total += out
    module.train()
    n = max(1, batches.full_batches)
    return total / n, (hits / seen if seen else None)


def fit(module, optimizer, train, val, epochs, report, seed=1, cache=None):
    """Train for `epochs`; report(kind, values) gets ("step", (epoch, index, count, loss))
    and ("epoch", (epoch, train loss, val loss, val accuracy or None)). cache: a
    microtrain.latent.LatentCache of the train samples (the same steps, bit for bit; a
    batch whose samples it holds runs only the layers after the frozen ones)."""
    rng = XorShift(seed)
    module.train()
    for epoch in range(1, epochs + 1):
        train.shuffle(rng)
        total = 0.0
        for i in range(train.full_batches):
            if cache is not None and cache.holds(i, train.order):
                loss = cache.step(i, None, None, train.order)
            else:
                train.fill(i)
                loss = (module(*train.inputs) if cache is None else
                        cache.step(i, train.xb, train.yb, train.order))
            optimizer.step()
            module.lazy_reset_grad()
            total += loss
            report("step", (epoch, i + 1, train.full_batches, loss))
        val_loss, val_acc = evaluate(module, val) if val is not None else (None, None)
        report("epoch", (epoch, total / max(1, train.full_batches), val_loss, val_acc))


def _print_report(kind, values):
    print("@" + kind + " " + " ".join(repr(v) for v in values))


def load(artifacts, data, lr, max_arena_bytes=None):
    """(state, module, optimizer, train batches, val batches) from
    ARTIFACTS/{checkpoint,model.mtb} and the raw files in DATA; a blob whose arenas take more
    than max_arena_bytes is refused (Module)."""
    state = CheckpointState.load_checkpoint(artifacts + "/checkpoint")
    module = Module(artifacts + "/model.mtb", state, max_arena_bytes=max_arena_bytes)
    optimizer = Optimizer(artifacts + "/model.mtb", module)
    optimizer.set_learning_rate(lr)
    inputs = module.blob.programs["train"].inputs
    y_type = "i" if len(inputs) > 1 and module.blob.dtypes[inputs[1]] == _INT32 else "f"
    ext = ".i32" if y_type == "i" else ".f32"
    x_dtype = module.blob.dtypes[inputs[0]]
    x_ext, x_type = "." + X_FILES[x_dtype], _TYPECODES[x_dtype]
    # (an input that is its own target: no labels file)
    labels = (lambda name: _read(data + "/y_" + name + ext, y_type)) if len(inputs) > 1 else (
        lambda name: array("f"))
    train = Batches(module, _read(data + "/x_train" + x_ext, x_type), labels("train"))
    val = Batches(module, _read(data + "/x_val" + x_ext, x_type), labels("val"))
    return state, module, optimizer, train, val


def latent_cache(module, train, epochs):
    """A latent cache in RAM for the train samples when it saves work: more than one epoch
    of an integer blob whose trained layers follow frozen ones. None otherwise, or where
    the heap cannot hold it (it only saves time)."""
    b = module.blob
    if epochs < 2 or not b.integer_parameters or not b.programs["train"].latent_from:
        return None
    from microtrain.latent import LatentCache
    try:
        return LatentCache(module, (train.count + train.batch - 1) // train.batch)
    except MemoryError:
        return None


def run(artifacts, data, epochs, lr, out, report, seed=1, max_arena_bytes=None, latent=True):
    """Load ARTIFACTS/{checkpoint,model.mtb} and the raw files in DATA, train, save OUT
    (latent: with the latent cache where it saves work)."""
    state, module, optimizer, train, val = load(artifacts, data, lr, max_arena_bytes)
    fit(module, optimizer, train, val, epochs, report, seed,
        latent_cache(module, train, epochs) if latent else None)
    CheckpointState.save_checkpoint(state, out)


def main(argv):
    out = argv[5]
    # argv: ARTIFACTS DATA EPOCHS LR OUT [SEED [MAX_ARENA_BYTES (0: no budget)]]
    run(argv[1], argv[2], int(argv[3]), float(argv[4]), out, _print_report,
        int(argv[6]) if len(argv) > 6 else 1, int(argv[7]) or None if len(argv) > 7 else None)
    print("@saved " + out)


if __name__ == "__main__":
    main(sys.argv)
