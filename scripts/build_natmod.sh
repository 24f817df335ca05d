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
#   scripts/build_natmod.sh [--ship] [armv6m] [armv7m] [rv32imc]   -> prints each .mpy path
#
# --float builds the float kernels' module instead (device/native/float -> float_native.mpy,
# cached under .cache/natmod/float/<arch>/, shipped beside the int8 builds with its digest in
# FLOAT_SOURCES.sha256); it also takes armv7emsp (FPU boards: the C's float arithmetic as
# FPU instructions).
#
# Cached under .cache/natmod/<arch>/, keyed by the source tarball, the module's sources
# (device/native: Makefile, *.c, *.S, *.h) and this script: change any of them and the next run
# rebuilds that architecture. --ship also copies each build to
# device/microtrain/kernels/native/<arch>/qlinear_native.mpy, what deploy, the runtime builder
# and mip's package-<arch>.json ship (users need no toolchain), and writes the sources'
# digest beside them (tests/test_natmod_ship.py fails when the shipped builds are stale).
set -euo pipefail
# mpy_ld.py walks Python sets: with a random hash seed two builds of the same source differ
# in bytes (and size); a fixed seed makes the build reproducible, so the shipped module can
# be checked against a fresh build
export PYTHONHASHSEED=0

root=$(cd "$(dirname "$0")/.." && pwd)
cache="$root/.cache/natmod"
native="$root/device/native"
shipped="$root/device/microtrain/kernels/native"
ship=0
mod=qlinear_native
digest_file=SOURCES.sha256
archs="armv6m armv7m rv32imc"
while [ "${1:-}" = --ship ] || [ "${1:-}" = --float ]; do
    case "$1" in
        --ship) ship=1 ;;
        --float)
            mod=float_native
            native="$native/float"
            cache="$cache/float"
            digest_file=FLOAT_SOURCES.sha256
            archs="armv6m armv7m armv7emsp rv32imc"
            ;;
    esac
    shift
done
[ $# -gt 0 ] || set -- armv6m

missing=()
command -v make >/dev/null || missing+=(make)
# ship_build ARCH MPY: with --ship, the build and the digest of its sources into the package
ship_build() {
    [ "$ship" = 1 ] || return 0
    mkdir -p "$shipped/$1"
    cp "$2" "$shipped/$1/$mod.mpy"
    echo "$source_digest" > "$shipped/$digest_file"
}

for arch in "$@"; do
    case " $archs " in
        *" $arch "*) ;;
        *) echo "build_natmod: unknown architecture $arch ($archs)" >&2; exit 2 ;;
    esac
    case "$arch" in
        armv6m|armv7m|armv7emsp)
            command -v arm-none-eabi-gcc >/dev/null || missing+=(gcc-arm-none-eabi)
            [ -e /usr/lib/arm-none-eabi/include/stdlib.h ] || missing+=(libnewlib-arm-none-eabi)
            ;;
        rv32imc)
            command -v riscv64-unknown-elf-gcc >/dev/null || missing+=(gcc-riscv64-unknown-elf)
            [ -e /usr/lib/picolibc/riscv64-unknown-elf/picolibc.specs ] ||
                missing+=(picolibc-riscv64-unknown-elf)
            ;;
    esac
done
# shellcheck source=qemu_firmware_common.sh
source "$root/scripts/qemu_firmware_common.sh"   # install_missing, as the boards' builds
install_missing build_natmod "${missing[@]}"
python3 -c "import elftools, ar" 2>/dev/null ||
    python3 -m pip install -q pyelftools ar >&2

tarball=$(bash "$root/scripts/fetch_micropython_source.sh")
# one build at a time: the suite's two workers may ask for one together
mkdir -p "$root/.cache/natmod" "$cache"
exec 9>"$root/.cache/natmod.lock"
flock 9
tree_key=$( (basename "$tarball"; sha256sum "$tarball" | cut -d' ' -f1) | sha256sum | cut -d' ' -f1)
tree="$root/.cache/natmod/tree"
if [ "$(cat "$tree/.key" 2>/dev/null)" != "$tree_key" ]; then
    rm -rf "$tree" && mkdir -p "$tree"
    tar -xf "$tarball" -C "$tree" --strip-components=1
    echo "$tree_key" > "$tree/.key"
fi

# the module's sources (its README is not one), in a fixed order
sources=("$native"/Makefile "$native"/*.c "$native"/*.S "$native"/*.h)
# the shipped builds' digest: of the sources alone, so that a test can check it without the
# MicroPython tarball (a fresh build compared byte for byte covers the rest)
source_digest=$(cat "${sources[@]}" | sha256sum | cut -d' ' -f1)
for arch in "$@"; do
    out="$cache/$arch"
    key=$( (echo "$tree_key $arch"; cat "$0" "${sources[@]}") | sha256sum | cut -d' ' -f1)
    if [ -f "$out/$mod.mpy" ] && [ "$(cat "$out/key" 2>/dev/null)" = "$key" ]; then
        ship_build "$arch" "$out/$mod.mpy"
        echo "$out/$mod.mpy"
        continue
    fi
    # the Makefile writes the module (and mpy_ld's archive cache) beside itself: a copy.
    # BUILD relative: the .mpy names its build path as its source file, so an absolute one
    # would make the bytes depend on where the repository is checked out
    rm -rf "$out" && mkdir -p "$out/src"
    cp "${sources[@]}" "$out/src/"
    cross=()
    [ "$arch" = rv32imc ] && cross=(CROSS=riscv64-unknown-elf-)
    if ! make -C "$out/src" MPY_DIR="$tree" ARCH="$arch" BUILD=build "${cross[@]}" \
            > "$out/build.log" 2>&1; then
        tail -n 30 "$out/build.log" >&2
        echo "build_natmod: $arch build failed (log: $out/build.log)" >&2
        exit 1
    fi
    cp "$out/src/$mod.mpy" "$out/$mod.mpy"
    echo "$key" > "$out/key"
    ship_build "$arch" "$out/$mod.mpy"
    echo "$out/$mod.mpy"
done
