# Integer training steps on a board, for tests/test_board_kws_native.py and
# test_board_native_models.py (settings prepended by the host: BLOB, X, X_TYPE, Y (None: an
# autoencoder's, no labels), STEPS; the files in the ROM filesystem). Loads the blob in
# place from flash, runs STEPS train steps (model(x, y), opt.step(), lazy_reset_grad()) and
# prints each loss, then the CRC-32 of the int and byte arenas (parameters, gradients,
# momenta: a copy of the arenas would not fit beside them) and whether fastpath picked the
# native module's Gemm and Conv (those the blob has).
import gc

try:
    STATE
except NameError:
    STATE = None
from array import array
from binascii import crc32


def load(name, typecode):
    with open("/rom/" + name, "rb") as f:
        return array(typecode, f.read())


gc.collect()
from microtrain import CheckpointState, Module, Optimizer
from microtrain.kernels import qlinear
blob = memoryview(open("/rom/" + BLOB, "rb"))
state = CheckpointState.load_checkpoint("/rom/checkpoint")
model = Module(blob, state)
opt = Optimizer(blob, model)
x = load(X, X_TYPE)
y = load(Y, "i") if Y else None     # an autoencoder trains on its input alone
for _ in range(STEPS):
    print("loss", repr(model(x) if y is None else model(x, y)))
    opt.step()
    model.lazy_reset_grad()
from microtrain.kernels import qlinear_native
# (a minimal runtime's qlinear has only the kernels its blob uses)
print("native", *[getattr(qlinear, k) is getattr(qlinear_native, k)
                  for k in ("qlinear_gemm", "qlinear_conv") if hasattr(qlinear, k)])
# the int arena whole, or (STATE: the host's (offset, size) of each int32 tensor that outlives
# a step) without the scratch planes, which kernels of another build may use otherwise
ints = memoryview(model.I)
if STATE is None:
    crc = crc32(ints)
else:
    crc = 0
    for at, n in STATE:
        crc = crc32(ints[at:at + n], crc)
print("crc", crc, crc32(model.blob.Q))
