#!/usr/bin/env bash
# Build the emulated board: MicroPython's qemu port for the MPS2-AN385 machine (Cortex-M3, no
# FPU, single-precision floats, 140 KiB heap) from the same Debian source package as the Unix
# port, with boards/qemu/emulated_flash.py frozen in (a littlefs "flash" in RAM outside the
# heap, so `mpremote cp` works as on a real board). Installs the Debian tools it needs
# (qemu-system-arm, gcc-arm-none-eabi, libnewlib-arm-none-eabi) when they are missing.
#
#   scripts/build_qemu_board.sh     -> prints the path of firmware.elf
#
# Cached under .cache/qemu-board/, keyed by the source tarball, boards/qemu/*, this script and
# qemu_firmware_common.sh:
# change any of them and the next run rebuilds.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cache="$root/.cache/qemu-board"
firmware="$cache/firmware.elf"
board_files="$root/boards/qemu"

missing=()
command -v qemu-system-arm >/dev/null || missing+=(qemu-system-arm)
command -v arm-none-eabi-gcc >/dev/null || missing+=(gcc-arm-none-eabi)
[ -e /usr/lib/arm-none-eabi/include/stdlib.h ] || missing+=(libnewlib-arm-none-eabi)
command -v make >/dev/null || missing+=(make)
source "$root/scripts/qemu_firmware_common.sh"
install_missing build_qemu_board "${missing[@]}"
prepare_tree "$0"
echo "build_qemu_board: building the qemu MPS2_AN385 firmware (log: $cache/build.log)" >&2
# MICROPY_VFS_LFS2: littlefs for the emulated flash; no_clock.h: littlefs wants a clock the
# emulated board lacks; mps2.ld: room for the unwind table littlefs's 64-bit division needs.
if ! { make -C "$cache/tree/mpy-cross" -j"$jobs" &&
       make -C "$cache/tree/ports/qemu" -j"$jobs" BOARD=MPS2_AN385 \
           FROZEN_MANIFEST="$board_files/manifest.py" MICROPY_VFS_LFS2=1 \
           LDSCRIPT="$board_files/mps2.ld" CFLAGS_EXTRA="-include $board_files/no_clock.h"; } \
       > "$cache/build.log" 2>&1; then
    tail -n 40 "$cache/build.log" >&2
    echo "build_qemu_board: build failed" >&2
    exit 1
fi
elf="$cache/tree/ports/qemu/build-MPS2_AN385/firmware.elf"
# emulated_flash.py puts its block device at 0x100000: the image must end below it.
ebss=$(arm-none-eabi-nm "$elf" | awk '$3 == "_ebss" {print $1}')
if [ $((16#$ebss)) -ge $((0x100000)) ]; then
    echo "build_qemu_board: firmware ends at 0x$ebss, over the emulated flash at 0x100000" >&2
    exit 1
fi
cp "$elf" "$firmware"
echo "$key" > "$cache/key"
echo "$firmware"
