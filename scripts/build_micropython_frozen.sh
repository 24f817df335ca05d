#!/usr/bin/env bash
# Build the MicroPython Unix port with the device package frozen in (a FROZEN_MANIFEST written
# into the cache, listing every module of device/microtrain):
# `import microtrain` then runs bytecode from the binary, as a board runs it from flash, and
# `micropython -X heapsize=64K` measures the heap a run needs on such a board (arenas, blob,
# checkpoint, batch; no code). Same Debian source package as build_micropython.sh.
#
#   scripts/build_micropython_frozen.sh [--m32] [--module FILE.py]...  -> the binary's path
#   scripts/build_micropython_frozen.sh [options] --key    -> the cache key only (no build)
#
#   --m32              a 32-bit build (needs gcc-multilib): pointers, object headers and
#                      small ints as on a microcontroller, whose heap the objects of a run
#                      then take as much of as they would there (a 64-bit build takes about
#                      twice as much for the same objects)
#   --device DIR       freeze DIR/microtrain instead of device/microtrain (e.g. the minimal
#                      runtime of one model: microtrain_host.tools.runtime.minimal_sources)
#   --module FILE.py   also freeze this module (e.g. one holding a blob as a bytes constant:
#                      frozen, its bytes stay in the binary, as a blob in a board's flash)
#
# Cached under .cache/micropython-frozen[-m32][-<first module's name>]/, keyed by the source
# tarball, this script, every device module (names and contents) and the extra modules:
# change any and the next run rebuilds.
#
# The viper kernels (kernels/qlinear_viper.py, inttrain_viper.py, intgrad_viper.py) are
# frozen as machine code for the build's architecture (MPY_CROSS_FLAGS below): `qlinear.FAST` and
# `inttrain.FAST` are then True without any .py file.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
m32=0
key_only=0
device="$root/device"
modules=()
while [ $# -gt 0 ]; do
    case "$1" in
        --m32) m32=1 ;;
        --key) key_only=1 ;;
        --device) device=$(cd "$2" && pwd); shift ;;
        --module) modules+=("$(cd "$(dirname "$2")" && pwd)/$(basename "$2")"); shift ;;
        *) echo "build_micropython_frozen: unknown option $1 (see the top of $0)" >&2; exit 2 ;;
    esac
    shift
done
variant=""
[ "$m32" = 1 ] && variant="-m32"
[ ${#modules[@]} -gt 0 ] && variant="$variant-$(basename "${modules[0]}" .py)"
[ "$device" != "$root/device" ] && variant="$variant-trimmed"
cache="$root/.cache/micropython-frozen$variant"
binary="$cache/micropython"
manifest="$cache/manifest.py"

tarball=$(bash "$root/scripts/fetch_micropython_source.sh")
key=$( (basename "$tarball"; sha256sum "$tarball" | cut -d' ' -f1; cat "$0"; echo "m32 $m32";
        for m in ${modules[@]+"${modules[@]}"}; do basename "$m"; sha256sum < "$m"; done;
        cd "$device" && find microtrain -name '*.py' | LC_ALL=C sort | while read -r f; do
            echo "$f"; sha256sum "$f"; done) | sha256sum | cut -d' ' -f1)

if [ "$key_only" = 1 ]; then
    echo "$key"
    exit 0
fi
# one build of a variant at a time: the suite's two workers may ask for it together
mkdir -p "$root/.cache"
exec 9>"$cache.lock"
flock 9
if [ -x "$binary" ] && [ "$(cat "$cache/key" 2>/dev/null)" = "$key" ]; then
    echo "$binary"
    exit 0
fi

rm -rf "$cache" && mkdir -p "$cache/tree"
{
    echo "# Written by scripts/build_micropython_frozen.sh: the device package, frozen."
    echo "freeze(\"$device\", ("
    (cd "$device" && find microtrain -name '*.py' | LC_ALL=C sort | sed 's/.*/    "&",/')
    echo "))"
    for m in ${modules[@]+"${modules[@]}"}; do
        echo "freeze(\"$(dirname "$m")\", \"$(basename "$m")\")"
    done
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
width=()
if [ "$m32" = 1 ]; then
    if ! echo 'int main(void) { return 0; }' | gcc -m32 -x c - -o /dev/null 2>/dev/null; then
        echo "build_micropython_frozen: installing gcc-multilib for the 32-bit build" >&2
        apt-get update -qq >&2 && apt-get install -y -qq gcc-multilib >&2
    fi
    march=x86
    width=(MICROPY_FORCE_32BIT=1 MICROPY_PY_FFI=0)  # libffi would need its own 32-bit build
fi
jobs=$(nproc 2>/dev/null || echo 2)
echo "build_micropython_frozen: building the Unix port with microtrain frozen in" \
     "(log: $cache/build.log)" >&2
if ! { make -C "$cache/tree/mpy-cross" -j"$jobs" &&
       make -C "$cache/tree/ports/unix" -j"$jobs" FROZEN_MANIFEST="$manifest" \
           MPY_CROSS_FLAGS="-march=$march" ${width[@]+"${width[@]}"} \
           MICROPY_PY_BTREE=0 MICROPY_PY_SSL=0 MICROPY_SSL_MBEDTLS=0 MICROPY_SSL_AXTLS=0; } \
       > "$cache/build.log" 2>&1; then
    tail -n 40 "$cache/build.log" >&2
    echo "build_micropython_frozen: build failed" >&2
    exit 1
fi
cp "$cache/tree/ports/unix/build-standard/micropython" "$binary"
# The viper kernels must have been frozen and work: qlinear, inttrain and intgrad fall back
# to their pure-Python kernels when the import fails, which would hide a broken build (and a
# trimmed runtime must have kept them).
(cd "$cache" && "$binary" -c "
for family in ('qlinear', 'inttrain', 'intgrad'):
    try:
        module = __import__('microtrain.kernels.' + family, None, None, ['FAST'])
    except ImportError:     # a trimmed runtime without that family
        continue
    assert module.FAST, family")
echo "$key" > "$cache/key"
echo "$binary"
