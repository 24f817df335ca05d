# The personalisation run on the device (MicroPython or CPython), as a board would do it:
#   personalise_device.py DIR EPOCHS LR [flash]
# flash: the blob is the bytes constant BLOB of the module kws_blob, frozen into the
# interpreter (build_micropython_frozen.sh --module): it stays in the binary, as a blob in a
# board's flash, and the Module reads its int8 weights there in place.
# DIR holds model.mtb and checkpoint (packed at batch 1) and the data as raw little-endian
# files: x_train.f32, y_train.i32 (the user's few recordings) and x_test.f32, y_test.i32 (held
# out); for a blob whose input is int8 / uint8 (integer training) x_*.q8, one byte per value,
# already quantized. One sample is in RAM at a time. Prints the held-out accuracy before training, one
# "epoch K mean-loss" line per epoch, the accuracy after, then "peak heap BYTES": the largest
# live heap seen after a collection at each phase (MicroPython; CPython prints -1), relative
# to the heap in use before `import microtrain`. Saves DIR/personalised_checkpoint. An
# integer blob whose trained layers follow frozen ones uses a latent cache
# (DIR/latent.cache): the frozen layers run once per sample, the later epochs only the
# trained ones.
import gc
import sys
from array import array

gc.collect()
try:
    BASE = gc.mem_alloc()
except AttributeError:      # CPython
    BASE = None
peak = 0
SUFFIX, XBYTES = "f32", 0   # the input files' suffix and bytes per sample (main sets them)


def probe():
    global peak
    if BASE is not None:
        gc.collect()
        used = gc.mem_alloc() - BASE
        if used > peak:
            peak = used


def accuracy(model, x, y, directory, classes):
    # Held-out accuracy by argmax of the eval program's output, one sample at a time.
    model.eval()
    right = total = 0
    with open(directory + "/x_test." + SUFFIX, "rb") as fx, \
            open(directory + "/y_test.i32", "rb") as fy:
        while fx.readinto(x) == XBYTES and fy.readinto(y) == 4 * len(y):
            scores = model(x, y)[1]
            best = 0
            for k in range(1, classes):
                if scores[k] > scores[best]:
                    best = k
            right += best == y[0]
            total += 1
    probe()
    return right, total


def latent_cache(model, directory, epochs):
    # An integer blob whose trained layers follow frozen ones keeps what the frozen layers
    # hand on for each training sample in a file (microtrain.latent): epochs after the
    # first run only the trained layers. None for any other blob, or a single epoch.
    if epochs < 2 or not model.blob.integer_parameters:
        return None
    import os
    from microtrain.errors import InputError
    from microtrain.latent import LatentCache
    samples = os.stat(directory + "/x_train." + SUFFIX)[6] // XBYTES
    try:
        return LatentCache(model, samples, directory + "/latent.cache")
    except InputError:          # the blob trains its first layer too (--train-biases)
        return None


def main(directory, epochs, lr, flash):
    global SUFFIX, XBYTES
    from microtrain import CheckpointState, Module, Optimizer
    probe()
    if flash:
        from kws_blob import BLOB
        blob = memoryview(BLOB)
    else:
        blob = directory + "/model.mtb"
    state = CheckpointState.load_checkpoint(directory + "/checkpoint")
    model = Module(blob, state)
    opt = Optimizer(blob, model)
    opt.set_learning_rate(lr)
    b = model.blob
    x_id, y_id = b.programs["train"].inputs
    if b.dtypes[x_id] == 0:          # float32
        SUFFIX, XBYTES = "f32", 4 * b.sizes[x_id]
        x = array("f", bytes(XBYTES))
    else:                            # quantized on the host: int8 (2) or uint8 (3)
        SUFFIX, XBYTES = "q8", b.sizes[x_id]
        x = array("b" if b.dtypes[x_id] == 2 else "B", bytes(XBYTES))
    y = array("i", bytes(4 * b.sizes[y_id]))
    cache = latent_cache(model, directory, epochs)
    probe()
    right, total = accuracy(model, x, y, directory, b.num_classes)
    print("accuracy before %d/%d" % (right, total))
    for epoch in range(epochs):
        model.train()
        loss, steps = 0.0, 0
        if cache is not None and epoch > 0:     # the backbone's features of every sample
            for slot in range(cache.batches):   # are in the cache: the classifier alone
                loss += cache.step(slot, None, None)
                opt.step()
                steps += 1
        else:
            with open(directory + "/x_train." + SUFFIX, "rb") as fx, \
                    open(directory + "/y_train.i32", "rb") as fy:
                while fx.readinto(x) == XBYTES and fy.readinto(y) == 4 * len(y):
                    loss += model(x, y) if cache is None else cache.step(steps, x, y)
                    opt.step()
                    model.lazy_reset_grad()
                    steps += 1
                    if steps == 1:
                        probe()
        print("epoch %d %r" % (epoch + 1, loss / steps))
    if cache is not None:
        cache.close()
    right, total = accuracy(model, x, y, directory, b.num_classes)
    print("accuracy after %d/%d" % (right, total))
    CheckpointState.save_checkpoint(state, directory + "/personalised_checkpoint")
    probe()
    print("peak heap %d" % (peak if BASE is not None else -1))


main(sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4:] == ["flash"])
