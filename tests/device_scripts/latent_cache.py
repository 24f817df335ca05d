# Integer training of a blob with a frozen prefix for EPOCHS epochs over BATCHES records of
# DATA (the quantized input bytes, then the int32 labels unless the input is its own
# target), with the latent cache (in RAM, or in a file) or without it: prints each epoch's
# mean loss and saves the checkpoint, so the test compares the runs byte for byte.
#   latent_cache.py BLOB CKPT DATA BATCHES EPOCHS plain|ram|file OUT_CKPT
import sys
from array import array
from microtrain import CheckpointState, Module
from microtrain.latent import LatentCache

blob, ckpt, data_path, batches, epochs, mode, out = sys.argv[1:8]
batches, epochs = int(batches), int(epochs)
state = CheckpointState.load_checkpoint(ckpt)
model = Module(blob, state)
b = model.blob
inputs = b.programs["train"].inputs
xin = inputs[0]
nx = b.sizes[xin]
nl = b.sizes[inputs[1]] if len(inputs) > 1 else 0     # (an autoencoder: no labels)
code = "b" if b.dtypes[xin] == 2 else "B"
x = array(code, bytes(nx))
y = array("i", bytes(4 * nl))
record = nx + 4 * nl
cache = None
if mode != "plain":
    cache = LatentCache(model, batches, out + ".cache" if mode == "file" else None)
with open(data_path, "rb") as f:
    data = f.read()
for epoch in range(epochs):
    total = 0.0
    for s in range(batches):
        if epoch == 0 or cache is None:
            at = s * record
            x[:] = array(code, data[at:at + nx])
            y[:] = array("i", data[at + nx:at + record])
        if cache is None:
            total += model(x, y) if nl else model(x)
        else:
            total += cache.step(s, x if epoch == 0 else None, y if nl else None)
    print("epoch", epoch + 1, repr(total / batches))
if cache is not None:
    print("cache bytes", cache.bytes)
    cache.close()
CheckpointState.save_checkpoint(state, out)
