#!/usr/bin/env bash
# Build an emulated ARM board: MicroPython's qemu port for the MPS2-AN385 machine (Cortex-M3,
# no FPU, single-precision floats in software, 140 KiB heap) or, given MPS2_AN386, for the
# MPS2-AN386 (Cortex-M4 with its single-precision FPU, floats in hardware; the port's settings
# in boards/qemu/MPS2_AN386.mk), from the same Debian source package as the Unix port, with
# boards/qemu/emulated_flash.py frozen in (a littlefs "flash" in RAM outside the heap, so
# `mpremote cp` works as on a real board). Installs the Debian tools it needs
# (qemu-system-arm, gcc-arm-none-eabi, libnewlib-arm-none-eabi) when they are missing.
#
#   scripts/build_qemu_board.sh [MPS2_AN385 | MPS2_AN386]   -> prints the path of firmware.elf
#
# Cached under .cache/qemu-board/ (AN385) or .cache/qemu-m4/ (AN386), keyed by the source
# tarball, boards/qemu/*, this script and qemu_firmware_common.sh: change any of them and the
# next run rebuilds.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
board=${1:-MPS2_AN385}
case "$board" in
    MPS2_AN385) cache="$root/.cache/qemu-board" ;;
    MPS2_AN386) cache="$root/.cache/qemu-m4" ;;
    *) echo "build_qemu_board: unknown board $board (MPS2_AN385 or MPS2_AN386)" >&2; exit 2 ;;
esac
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
if [ "$board" = MPS2_AN386 ]; then
    # The port knows the AN385 only: the AN386 board is our settings file, and its reset
    # handler must switch the FPU on (CPACR: full access for coprocessors 10 and 11) before
    # the first float instruction, as a real Cortex-M4F's startup code does.
    mkdir -p "$cache/tree/ports/qemu/boards/MPS2_AN386"
    cp "$board_files/MPS2_AN386.mk" "$cache/tree/ports/qemu/boards/MPS2_AN386/mpconfigboard.mk"
    sed -i 's|^    __asm volatile ("mov sp, r0");$|&\n    __asm volatile ("ldr r0, =0xe000ed88\\n ldr r1, [r0]\\n orr r1, r1, #0xf00000\\n str r1, [r0]\\n dsb\\n isb");|' \
        "$cache/tree/ports/qemu/mcu/arm/startup.c"
    grep -q 0xe000ed88 "$cache/tree/ports/qemu/mcu/arm/startup.c" || {
        echo "build_qemu_board: could not switch the FPU on in mcu/arm/startup.c" >&2; exit 1; }
fi
echo "build_qemu_board: building the qemu $board firmware (log: $cache/build.log)" >&2
# MICROPY_VFS_LFS2: littlefs for the emulated flash; no_clock.h: littlefs wants a clock the
# emulated board lacks; mps2.ld: room for the unwind table littlefs's 64-bit division needs.
if ! { make -C "$cache/tree/mpy-cross" -j"$jobs" &&
       make -C "$cache/tree/ports/qemu" -j"$jobs" BOARD="$board" \
           FROZEN_MANIFEST="$board_files/manifest.py" MICROPY_VFS_LFS2=1 \
           LDSCRIPT="$board_files/mps2.ld" CFLAGS_EXTRA="-include $board_files/no_clock.h"; } \
       > "$cache/build.log" 2>&1; then
    tail -n 40 "$cache/build.log" >&2
    echo "build_qemu_board: build failed" >&2
    exit 1
fi
elf="$cache/tree/ports/qemu/build-$board/firmware.elf"
# emulated_flash.py puts its block device at 0x100000: the image must end below it.
ebss=$(arm-none-eabi-nm "$elf" | awk '$3 == "_ebss" {print $1}')
if [ $((16#$ebss)) -ge $((0x100000)) ]; then
    echo "build_qemu_board: firmware ends at 0x$ebss, over the emulated flash at 0x100000" >&2
    exit 1
fi
cp "$elf" "$firmware"
echo "$key" > "$cache/key"
echo "$firmware"
