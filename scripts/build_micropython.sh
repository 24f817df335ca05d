#!/usr/bin/env bash
# Build the MicroPython Unix port from Debian's source package and cache it.
#
#   scripts/build_micropython.sh            -> prints the path of the micropython binary
#
# Debian 12 (bookworm) has no micropython package and trixie's binary needs a newer
# glibc, so we build the Unix port from trixie's *source* package
# (scripts/fetch_micropython_source.sh). The result is
# cached under .cache/micropython/ (ignored by git); a second run only prints the path.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cache="$root/.cache/micropython"
binary="$cache/micropython"

if [ -x "$binary" ] && "$binary" -c "import array, struct, math, gc" >/dev/null 2>&1; then
    echo "$binary"
    exit 0
fi

tarball=$(bash "$root/scripts/fetch_micropython_source.sh")

(
    cd "$cache/src"
    rm -rf tree && mkdir tree
    tar -xf "$tarball" -C tree --strip-components=1
    jobs=$(nproc 2>/dev/null || echo 2)
    echo "build_micropython: building the Unix port (log: $cache/build.log)" >&2
    if ! { make -C tree/mpy-cross -j"$jobs" &&
           make -C tree/ports/unix -j"$jobs" FROZEN_MANIFEST= MICROPY_PY_BTREE=0 \
               MICROPY_PY_SSL=0 MICROPY_SSL_MBEDTLS=0 MICROPY_SSL_AXTLS=0; } \
           > "$cache/build.log" 2>&1; then
        tail -n 40 "$cache/build.log" >&2
        echo "build_micropython: build failed" >&2
        exit 1
    fi
    cp tree/ports/unix/build-standard/micropython "$binary"
)

"$binary" -c "import array, struct, math, gc" >/dev/null
echo "$binary"
