"""Whether float C code works in a MicroPython 1.25 dynamic native module, and what a
float multiply-add costs there: builds a one-function module (a float32 dot product over
two array('f'), in order, -ffp-contract=off) for armv6m and armv7m with the source tree's
py/dynruntime.mk (LINK_RUNTIME=1: libgcc's soft-float routines), then on the emulated
Cortex-M3 under qemu -icount compares its bytes with MicroPython's own single-precision
loop on 200 random dot products and counts instructions per multiply-add against the
bytecode loop. Prints figures; asserts nothing (device/native/README.md quotes them).
Needs scripts/build_natmod.sh to have run once (its MicroPython tree under .cache/natmod).
"""
import os
import pathlib
import subprocess
import sys
import tempfile

BENCH = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
from board_cost import PER_TICK, ROOT, run_on_board, whole_package  # noqa: E402

SOURCE = r"""
#include "py/dynruntime.h"
// fdot(a, b): a[0] = sum over i of a[i] * b[i], in order, each product and sum rounded
static mp_obj_t fdot(mp_obj_t a_in, mp_obj_t b_in) {
    mp_buffer_info_t a, b;
    mp_get_buffer_raise(a_in, &a, MP_BUFFER_RW);
    mp_get_buffer_raise(b_in, &b, MP_BUFFER_READ);
    float *x = a.buf;
    const float *y = b.buf;
    float s = 0.0f;
    for (size_t i = 0; i < a.len / 4; i++) {
        s = s + x[i] * y[i];
    }
    x[0] = s;
    return mp_const_none;
}
static MP_DEFINE_CONST_FUN_OBJ_2(fdot_obj, fdot);
mp_obj_t mpy_init(mp_obj_fun_bc_t *self, size_t n_args, size_t n_kw, mp_obj_t *args) {
    MP_DYNRUNTIME_INIT_ENTRY
    mp_store_global(MP_QSTR_fdot, MP_OBJ_FROM_PTR(&fdot_obj));
    MP_DYNRUNTIME_INIT_EXIT
}
"""

MAKEFILE = """MOD = fdot
SRC = fdot.c
LINK_RUNTIME = 1
CFLAGS_EXTRA += -ffp-contract=off
include $(MPY_DIR)/py/dynruntime.mk
"""

# on the board: 200 dot products of 1..97 terms (values 1e-4 .. 1e3, both signs) against
# the bytecode loop, then 256 terms counted both ways
BOARD = """
import machine
from array import array
import fdot
seed = 12345
def rnd():
    global seed
    seed = (seed * 1103515245 + 12345) & 0x7fffffff
    return (seed / 0x7fffffff - 0.5) * (10.0 ** ((seed >> 8) % 8 - 4))
def loop(a, b):
    s = 0.0
    for i in range(len(a)):
        s = s + a[i] * b[i]
    return s
differ = 0
for trial in range(200):
    n = 1 + trial % 97
    a = array('f', [rnd() for _ in range(n)])
    b = array('f', [rnd() for _ in range(n)])
    ref = array('f', [loop(a, b)])
    fdot.fdot(a, b)
    differ += bytes(a)[:4] != bytes(ref)
print('differ', differ)
a = array('f', [rnd() for _ in range(256)])
b = array('f', [rnd() for _ in range(256)])
t0 = machine.mem32[0x40028018]
loop(a, b)
t1 = machine.mem32[0x40028018]
fdot.fdot(a, b)
t2 = machine.mem32[0x40028018]
print('ticks', t1 - t0, t2 - t1)
"""


def build(arch, tmp):
    tree = ROOT / ".cache" / "natmod" / "tree"
    if not (tree / "py" / "dynruntime.mk").exists():
        sys.exit(f"no MicroPython tree at {tree}: run scripts/build_natmod.sh first")
    src = pathlib.Path(tmp) / arch
    src.mkdir()
    (src / "fdot.c").write_text(SOURCE)
    (src / "Makefile").write_text(MAKEFILE)
    env = dict(os.environ, PYTHONHASHSEED="0")
    subprocess.run(["make", "-C", str(src), f"MPY_DIR={tree}", f"ARCH={arch}", "BUILD=build"],
                   check=True, capture_output=True, env=env)
    return src / "fdot.mpy"


def main():
    firmware = os.environ.get("MICROTRAIN_QEMU_FIRMWARE",
                              str(ROOT / ".cache" / "qemu-board" / "firmware.elf"))
    print("float32 dot product in a dynamic native module (libgcc soft float) vs bytecode, "
          "emulated Cortex-M3, instructions counted per multiply-add (256 terms)")
    for arch in ("armv6m", "armv7m"):
        with tempfile.TemporaryDirectory(prefix="float-probe-") as tmp:
            module = build(arch, tmp)
            size = module.stat().st_size
            out = run_on_board(tmp, whole_package(), {"fdot.mpy": module}, BOARD, firmware)
        differ = int(out.split("differ")[1].split()[0])
        loop, native = (int(t) * PER_TICK / 256 for t in out.split("ticks")[1].split()[:2])
        print(f"{arch}: {size:,d} B of .mpy; bytecode "
              f"{loop:,.1f}, native {native:,.1f} per multiply-add ({loop / native:.1f}x); "
              f"differing from MicroPython's bytes in {differ} of 200 dot products")


if __name__ == "__main__":
    main()
