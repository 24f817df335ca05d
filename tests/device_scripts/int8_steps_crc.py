# Integer training steps on a board, for tests/test_board_kws_native.py (settings prepended
# by the host: BLOB, X, X_TYPE, Y, STEPS; the files in the ROM filesystem). Loads the blob in
# place from flash, runs STEPS train steps (model(x, y), opt.step(), lazy_reset_grad()) and
# prints each loss, then the CRC-32 of the int and byte arenas (parameters, gradients,
# momenta: a copy of the arenas would not fit beside them) and whether fastpath picked the
# native module's Gemm and Conv (those the blob has).
import gc
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
x, y = load(X, X_TYPE), load(Y, "i")
for _ in range(STEPS):
    print("loss", repr(model(x, y)))
    opt.step()
    model.lazy_reset_grad()
from microtrain.kernels import qlinear_native
# (a minimal runtime's qlinear has only the kernels its blob uses)
print("native", *[getattr(qlinear, k) is getattr(qlinear_native, k)
                  for k in ("qlinear_gemm", "qlinear_conv") if hasattr(qlinear, k)])
print("crc", crc32(memoryview(model.I)), crc32(model.blob.Q))
