#!/usr/bin/env bash
# Build the MicroPython Unix port with the device package frozen in (a FROZEN_MANIFEST written
# into the cache, listing every module of device/microtrain):
# `import microtrain` then runs bytecode from the binary, as a board runs it from flash, and
# `micropython -X heapsize=64K` measures the heap a run needs on such a board (arenas, blob,
# checkpoint, batch; no code). Same Debian source package as build_micropython.sh.
#
#   scripts/build_micropython_frozen.sh         -> prints the path of the binary
#   scripts/build_micropython_frozen.sh --key   -> prints the cache key only (no build)
#
# Cached under .cache/micropython-frozen/, keyed by the source tarball, this script and every
# device module (names and contents): change any and the next run rebuilds.
#
# The viper kernels (kernels/qlinear_viper.py, inttrain_viper.py, intgrad_viper.py) are frozen as
# machine code for this machine's architecture (MPY_CROSS_FLAGS below): `qlinear.FAST` and
# `inttrain.FAST` are then True without any .py file.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cache="$root/.cache/micropython-frozen"
binary="$cache/micropython"
manifest="$cache/manifest.py"

tarball=$(bash "$root/scripts/fetch_micropython_source.sh")
key=$( (basename "$tarball"; sha256sum "$tarball" | cut -d' ' -f1; cat "$0";
        cd "$root/device" && find microtrain -name '*.py' | LC_ALL=C sort | while read -r f; do
            echo "$f"; sha256sum "$f"; done) | sha256sum | cut -d' ' -f1)

if [ "${1:-}" = "--key" ]; then
    echo "$key"
    exit 0
fi
if [ -x "$binary" ] && [ "$(cat "$cache/key" 2>/dev/null)" = "$key" ]; then
    echo "$binary"
    exit 0
fi

rm -rf "$cache" && mkdir -p "$cache/tree"
{
    echo "# Written by scripts/build_micropython_frozen.sh: the device package, frozen."
    echo "freeze(\"$root/device\", ("
    (cd "$root/device" && find microtrain -name '*.py' | LC_ALL=C sort | sed 's/.*/    "&",/')
    echo "))"
} > "$manifest"
tar -xf "$tarball" -C "$cache/tree" --strip-components=1
# Debian's tarball leaves out the micropython-lib submodule; the freezer insists on seeing it
# although the manifest requires nothing from it.
mkdir -p "$cache/tree/lib/micropython-lib"
touch "$cache/tree/lib/micropython-lib/README.md"
# Viper and native functions are compiled to machine code when frozen: mpy-cross needs the
# architecture of the machine the Unix port runs on.
case "$(uname -m)" in
    x86_64|amd64) march=x64 ;;
    i?86) march=x86 ;;
    *) echo "build_micropython_frozen: no mpy-cross -march for $(uname -m)" >&2; exit 1 ;;
esac
jobs=$(nproc 2>/dev/null || echo 2)
echo "build_micropython_frozen: building the Unix port with microtrain frozen in" \
     "(log: $cache/build.log)" >&2
if ! { make -C "$cache/tree/mpy-cross" -j"$jobs" &&
       make -C "$cache/tree/ports/unix" -j"$jobs" FROZEN_MANIFEST="$manifest" \
           MPY_CROSS_FLAGS="-march=$march" \
           MICROPY_PY_BTREE=0 MICROPY_PY_SSL=0 MICROPY_SSL_MBEDTLS=0 MICROPY_SSL_AXTLS=0; } \
       > "$cache/build.log" 2>&1; then
    tail -n 40 "$cache/build.log" >&2
    echo "build_micropython_frozen: build failed" >&2
    exit 1
fi
cp "$cache/tree/ports/unix/build-standard/micropython" "$binary"
# The viper kernels must have been frozen and work: qlinear, inttrain and intgrad fall back to their
# pure-Python kernels when the import fails, which would hide a broken build.
(cd "$cache" && "$binary" -c "from microtrain.kernels import qlinear, inttrain, intgrad
assert qlinear.FAST and inttrain.FAST and intgrad.FAST")
echo "$key" > "$cache/key"
echo "$binary"
