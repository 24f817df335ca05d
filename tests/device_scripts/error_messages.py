# Errors a training run can meet, one line each ("case: ExceptionType: message"), for
# tests/test_runtime_messages.py to run with the device package and with a minimal runtime
# whose messages were moved out (tools/runtime_messages.py), on CPython and MicroPython:
# the lines must be the same (the last: no message module held after them). argv: the
# digits artifacts directory, a scratch directory.
# Blob and checkpoint bytes are mutated one at a time, their CRC-32 fixed, so that the
# parser's and the checkpoint reader's own checks speak, not the CRC's.
import struct
import sys

from microtrain import CheckpointState, Module, Optimizer
from microtrain.crc32 import crc32
from microtrain.errors import MicrotrainError

ART, TMP = sys.argv[1], sys.argv[2]


def say(case, f, *args):
    try:
        f(*args)
        print(case + ": ok")
    except (MicrotrainError, ValueError, TypeError, OSError) as e:
        print(case + ": " + type(e).__name__ + ": " + str(e).replace(TMP, "TMP"))


def read(name):
    with open(ART + "/" + name, "rb") as f:
        return bytearray(f.read())


def write(data):
    with open(TMP + "/x", "wb") as f:
        f.write(data)
    return TMP + "/x"


BLOB = read("model.mtb")
CHECKPOINT = read("checkpoint")
state = CheckpointState.load_checkpoint(ART + "/checkpoint")


def load_blob(data):
    Module(write(data), CheckpointState.load_checkpoint(ART + "/checkpoint"))


size = struct.unpack_from("<I", BLOB, 0)[0]
for at in range(4, 4 + size, 7):
    for value in (0xFF, 0x01):
        data = bytearray(BLOB)
        data[at] ^= value
        struct.pack_into("<I", data, 4 + size, crc32(memoryview(data)[4:4 + size]) & 0xFFFFFFFF)
        say("blob %d^%d" % (at, value), load_blob, data)
say("blob cut", load_blob, BLOB[:len(BLOB) // 2])
say("blob empty", load_blob, b"")
say("blob crc", load_blob, BLOB[:-1] + bytes([BLOB[-1] ^ 1]))
say("blob missing", Module, TMP + "/none.mtb", state)

end = len(CHECKPOINT) - 8
for at in range(0, end, 5):
    data = bytearray(CHECKPOINT)
    data[at] ^= 0x41
    struct.pack_into("<I", data, end, crc32(memoryview(data)[:end]) & 0xFFFFFFFF)
    say("checkpoint %d" % at, CheckpointState.load_checkpoint, write(data))
say("checkpoint cut", CheckpointState.load_checkpoint, write(CHECKPOINT[:40]))
say("checkpoint missing", CheckpointState.load_checkpoint, TMP + "/none")

model = Module(ART + "/model.mtb", state)
optimizer = Optimizer(ART + "/model.mtb", model)
b = model.blob
x, y = b.programs["train"].inputs
n, m = b.sizes[x], b.sizes[y]
say("inputs count", model, [0.0] * n)
say("inputs length", model, [0.0] * (n - 1), [0] * m)
say("inputs kind", model, None, [0] * m)
say("label range", model, [0.0] * n, [99] * m)
say("label kind", model, [0.0] * n, [1.5] * m)
say("value range", model, [1e39] * n, [0] * m)
say("value kind", model, ["a"] * n, [0] * m)
say("nan loss", model, [float("nan")] * n, [0] * m)
say("step after refusal", optimizer.step)
say("learning rate", optimizer.set_learning_rate, -1.0)
say("buffer", model.copy_buffer_to_parameters, [0.0] * 3)
say("save", CheckpointState.save_checkpoint, state, TMP + "/no/such/dir/ck")
say("reload", model.load_checkpoint, TMP + "/none")
# the messages' modules are forgotten once read: none is held after the errors
print("held:", [name for name in sys.modules if "._msg_" in name])
