#!/usr/bin/env bash
# Build the native int8 kernels (device/native: C, plus Thumb-1 assembly on ARM) as a
# MicroPython 1.25 dynamic native module for each architecture named (default armv6m, which
# loads on every ARM core: RP2040, Cortex-M3/M4/M7, RP2350's ARM side; armv7m for
# Cortex-M3 and later only, whose C gets Thumb-2's 32x32->64 multiplies), with the source
# tree's py/dynruntime.mk and tools/mpy_ld.py (which need pyelftools and ar from PyPI).
# Installs what it needs when missing: gcc-arm-none-eabi + libnewlib-arm-none-eabi (armv6m,
# LINK_RUNTIME=1 links their libgcc and libm), gcc-riscv64-unknown-elf +
# picolibc-riscv64-unknown-elf (rv32imc).
#
#   scripts/build_natmod.sh [armv6m] [armv7m] [rv32imc]   -> prints each qlinear_native.mpy
#
# Cached under .cache/natmod/<arch>/, keyed by the source tarball, device/native/* and this
# script: change any of them and the next run rebuilds that architecture.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cache="$root/.cache/natmod"
native="$root/device/native"
[ $# -gt 0 ] || set -- armv6m

missing=()
command -v make >/dev/null || missing+=(make)
for arch in "$@"; do
    case "$arch" in
        armv6m|armv7m)
            command -v arm-none-eabi-gcc >/dev/null || missing+=(gcc-arm-none-eabi)
            [ -e /usr/lib/arm-none-eabi/include/stdlib.h ] || missing+=(libnewlib-arm-none-eabi)
            ;;
        rv32imc)
            command -v riscv64-unknown-elf-gcc >/dev/null || missing+=(gcc-riscv64-unknown-elf)
            [ -e /usr/lib/picolibc/riscv64-unknown-elf/picolibc.specs ] ||
                missing+=(picolibc-riscv64-unknown-elf)
            ;;
        *) echo "build_natmod: unknown architecture $arch (armv6m, armv7m, rv32imc)" >&2; exit 2 ;;
    esac
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "build_natmod: installing ${missing[*]}" >&2
    apt-get update -qq >&2 && apt-get install -y -qq "${missing[@]}" >&2
fi
python3 -c "import elftools, ar" 2>/dev/null ||
    python3 -m pip install -q pyelftools ar >&2

tarball=$(bash "$root/scripts/fetch_micropython_source.sh")
tree_key=$( (basename "$tarball"; sha256sum "$tarball" | cut -d' ' -f1) | sha256sum | cut -d' ' -f1)
tree="$cache/tree"
if [ "$(cat "$tree/.key" 2>/dev/null)" != "$tree_key" ]; then
    rm -rf "$tree" && mkdir -p "$tree"
    tar -xf "$tarball" -C "$tree" --strip-components=1
    echo "$tree_key" > "$tree/.key"
fi

for arch in "$@"; do
    out="$cache/$arch"
    key=$( (echo "$tree_key $arch"; cat "$0" "$native"/*) | sha256sum | cut -d' ' -f1)
    if [ -f "$out/qlinear_native.mpy" ] && [ "$(cat "$out/key" 2>/dev/null)" = "$key" ]; then
        echo "$out/qlinear_native.mpy"
        continue
    fi
    # the Makefile writes the module (and mpy_ld's archive cache) beside itself: a copy
    rm -rf "$out" && mkdir -p "$out/src"
    cp "$native"/* "$out/src/"
    cross=()
    [ "$arch" = rv32imc ] && cross=(CROSS=riscv64-unknown-elf-)
    if ! make -C "$out/src" MPY_DIR="$tree" ARCH="$arch" BUILD="$out/build" "${cross[@]}" \
            > "$out/build.log" 2>&1; then
        tail -n 30 "$out/build.log" >&2
        echo "build_natmod: $arch build failed (log: $out/build.log)" >&2
        exit 1
    fi
    cp "$out/src/qlinear_native.mpy" "$out/qlinear_native.mpy"
    echo "$key" > "$out/key"
    echo "$out/qlinear_native.mpy"
done
