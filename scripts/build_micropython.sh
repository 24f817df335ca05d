#!/usr/bin/env bash
# Build the MicroPython Unix port from Debian's source package and cache it.
#
#   scripts/build_micropython.sh            -> prints the path of the micropython binary
#
# Debian 12 (bookworm) has no micropython package and trixie's binary needs a newer
# glibc, so we fetch trixie's *source* package with a private apt configuration (the
# machine's own sources are left alone) and build the Unix port from it. The result is
# cached under .cache/micropython/ (ignored by git); a second run only prints the path.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cache="$root/.cache/micropython"
binary="$cache/micropython"

if [ -x "$binary" ] && "$binary" -c "import array, struct, math, gc" >/dev/null 2>&1; then
    echo "$binary"
    exit 0
fi

mkdir -p "$cache/apt/sources" "$cache/apt/lists/partial" "$cache/src"

# Copy the URIs line of the machine's own Debian sources so we use the same mirror.
uris=$(grep -h '^URIs:' /etc/apt/sources.list.d/debian.sources 2>/dev/null | head -n 1 || true)
if [ -z "$uris" ]; then
    mirror=$(grep -hE '^deb ' /etc/apt/sources.list 2>/dev/null | head -n 1 | awk '{print $2}')
    [ -n "$mirror" ] || { echo "build_micropython: no Debian mirror found in /etc/apt" >&2; exit 1; }
    uris="URIs: $mirror"
fi
cat > "$cache/apt/sources/trixie.sources" <<SRC
Types: deb deb-src
$uris
Suites: trixie
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC

apt_opts=(-o Dir::Etc::SourceList=/dev/null
          -o "Dir::Etc::SourceParts=$cache/apt/sources"
          -o "Dir::State::Lists=$cache/apt/lists")

(
    cd "$cache/src"
    if ! ls micropython_*.orig.tar.* >/dev/null 2>&1; then
        apt-get "${apt_opts[@]}" update -qq >&2
        apt-get "${apt_opts[@]}" source --download-only micropython >&2
    fi
    tarball=$(ls micropython_*.orig.tar.* | head -n 1)
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
