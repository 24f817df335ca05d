# Shared by the emulated boards' build scripts (build_qemu_board.sh, build_qemu_rv32.sh),
# which source it after setting root, cache, firmware and board_files.

# install_missing NAME PACKAGE...: the Debian packages a build lacks, installed with apt-get
install_missing() {
    local name=$1
    shift
    if [ $# -gt 0 ]; then
        echo "$name: installing $*" >&2
        apt-get update -qq >&2 && apt-get install -y -qq "$@" >&2
    fi
}

# prepare_tree SCRIPT: the MicroPython source tree under $cache/tree, from the same Debian
# tarball as the Unix port. The cache is keyed by the tarball, the build script SCRIPT, this
# file and boards/qemu/*: when $firmware exists under the same key, prints its path and
# exits (nothing to build). Sets key and jobs for the build.
prepare_tree() {
    local tarball
    tarball=$(bash "$root/scripts/fetch_micropython_source.sh")
    key=$( (basename "$tarball"; sha256sum "$tarball" | cut -d' ' -f1;
            cat "$1" "${BASH_SOURCE[0]}" "$board_files"/*) | sha256sum | cut -d' ' -f1)
    if [ -f "$firmware" ] && [ "$(cat "$cache/key" 2>/dev/null)" = "$key" ]; then
        echo "$firmware"
        exit 0
    fi
    rm -rf "$cache" && mkdir -p "$cache/tree"
    tar -xf "$tarball" -C "$cache/tree" --strip-components=1
    # Debian's tarball leaves out the micropython-lib submodule; the freezer insists on
    # seeing it although boards/qemu/manifest.py requires nothing from it.
    mkdir -p "$cache/tree/lib/micropython-lib"
    touch "$cache/tree/lib/micropython-lib/README.md"
    jobs=$(nproc 2>/dev/null || echo 2)
}
