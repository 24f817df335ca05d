# The emulated boards' flash. qemu's machines have more RAM than a microcontroller: the
# MicroPython image, its 140 KB heap and the stack use well under 1 MB of the MPS2-AN385's
# 4 MB (from address 0) and end below 0x80700000 on the RISC-V virt machine (128 MB from
# 0x80000000). This module turns a 2 MB window of the unused RAM into the two flash
# partitions a MicroPython 1.25 board has:
#  * a ROM partition holding a ROMFS image, mounted at /rom: modules imported from it run
#    their bytecode in place, as frozen modules do, instead of copying it into the heap;
#  * a littlefs filesystem at "/" for data, blobs and checkpoints (rp2 and esp32 format their
#    flash with littlefs too), so `mpremote cp` works.
# Frozen into the firmware, so its code takes no heap either. The window survives a soft
# reset (mpremote does one on connect), so files stay until qemu exits; mount() again after
# each reset.
import sys
import micropython
import uctypes
import vfs

# The window's address per firmware build (sys.implementation._build): above the image,
# which scripts/build_qemu_board.sh and build_qemu_rv32.sh check, and where
# microtrain_host's QemuBoard loads a ROM image (the board profile's qemu "flash_address").
WINDOWS = {"MPS2_AN385": 0x100000, "MPS2_AN386": 0x100000, "VIRT_RV32": 0x80800000}
ROM_ADDRESS = WINDOWS[sys.implementation._build]
ROM_SIZE = 0x40000       # 256 KB
FS_ADDRESS = ROM_ADDRESS + ROM_SIZE
FS_SIZE = 0x1C0000       # 1.75 MB, ending well below the end of RAM (the ARM stack's top)
BLOCK_SIZE = 512
ROMFS_HEADER = b"\xd2\xcd\x31"


# base and offset apart: the RISC-V window's addresses are past 2**30, no small ints, and
# their sum would be a new big int per call
@micropython.viper
def _read(base: int, offset: int, buf: ptr8, n: int):
    src = ptr8(base + offset)
    for i in range(n):
        buf[i] = src[i]


@micropython.viper
def _write(base: int, offset: int, buf: ptr8, n: int):
    dst = ptr8(base + offset)
    for i in range(n):
        dst[i] = buf[i]


class MemoryBlocks:
    """A block device over a window of RAM, for littlefs. Reads and writes allocate nothing
    (viper copies, no memoryview slices), as a real board's flash driver in C: littlefs
    calls them per 32 bytes, and garbage made there would shuffle a small heap."""

    def __init__(self, address, size, block_size):
        self.address = address
        self.block_size = block_size
        self.blocks = size // block_size

    def readblocks(self, block, buf, offset=0):
        _read(self.address, block * self.block_size + offset, buf, len(buf))

    def writeblocks(self, block, buf, offset=0):
        _write(self.address, block * self.block_size + offset, buf, len(buf))

    def ioctl(self, op, arg):
        if op == 4:  # block count
            return self.blocks
        if op == 5:  # block size
            return self.block_size
        if op == 6:  # erase: littlefs overwrites in place here
            return 0
        return None


def rom():
    return memoryview(uctypes.bytearray_at(ROM_ADDRESS, ROM_SIZE))


def mount():
    """Mount littlefs at "/" (formatting it the first time) and, when the ROM partition holds
    a ROMFS image, that image at /rom, first on sys.path (as 1.25's romfs boards do)."""
    import os
    blocks = MemoryBlocks(FS_ADDRESS, FS_SIZE, BLOCK_SIZE)
    try:
        fs = vfs.VfsLfs2(blocks)
    except OSError:
        vfs.VfsLfs2.mkfs(blocks)
        fs = vfs.VfsLfs2(blocks)
    vfs.mount(fs, "/")
    os.chdir("/")
    image = rom()
    if bytes(image[:3]) == ROMFS_HEADER:
        vfs.mount(vfs.VfsRom(image), "/rom")
        if "/rom" not in sys.path:
            sys.path.insert(0, "/rom")


def install_rom(path):
    """Write the ROMFS image in file `path` (on the littlefs) into the ROM partition and mount
    it at /rom: what `mpremote romfs deploy` does on a board whose firmware has the ROM
    ioctl. Modules already imported from the old image must not be used afterwards."""
    import os
    size = os.stat(path)[6]
    if size > ROM_SIZE:
        raise OSError("ROMFS image of %d bytes is larger than the %d-byte ROM partition"
                      % (size, ROM_SIZE))
    try:
        vfs.umount("/rom")
    except OSError:
        pass
    image = rom()
    buf = bytearray(BLOCK_SIZE)
    at = 0
    with open(path, "rb") as f:
        while True:
            n = f.readinto(buf)
            if not n:
                break
            image[at:at + n] = buf[:n]
            at += n
    if bytes(image[:3]) != ROMFS_HEADER:
        image[:3] = b"\0\0\0"
        raise OSError("%s is not a ROMFS image" % path)
    vfs.mount(vfs.VfsRom(image), "/rom")
    if "/rom" not in sys.path:
        sys.path.insert(0, "/rom")
