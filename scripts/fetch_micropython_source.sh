#!/usr/bin/env bash
# Fetch MicroPython's Debian source package (trixie, 1.25.0) into .cache/micropython/src/ once
# and print the path of its orig tarball. Both the Unix port (build_micropython.sh) and the
# emulated Cortex-M3 board (build_qemu_board.sh) are built from this one tarball.
#
# Debian 12 (bookworm) has no micropython package, so a private apt configuration (the
# machine's own sources are left alone) points at trixie's deb-src on the machine's mirror.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cache="$root/.cache/micropython"
src="$cache/src"

if ! ls "$src"/micropython_*.orig.tar.* >/dev/null 2>&1; then
    mkdir -p "$cache/apt/sources" "$cache/apt/lists/partial" "$src"
    # Copy the URIs line of the machine's own Debian sources so we use the same mirror.
    uris=$(grep -h '^URIs:' /etc/apt/sources.list.d/debian.sources 2>/dev/null | head -n 1 || true)
    if [ -z "$uris" ]; then
        mirror=$(grep -hE '^deb ' /etc/apt/sources.list 2>/dev/null | head -n 1 | awk '{print $2}')
        [ -n "$mirror" ] || { echo "fetch_micropython_source: no Debian mirror found in /etc/apt" >&2; exit 1; }
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
    (cd "$src" && apt-get "${apt_opts[@]}" update -qq >&2 &&
        apt-get "${apt_opts[@]}" source --download-only micropython >&2)
fi
ls "$src"/micropython_*.orig.tar.* | head -n 1
