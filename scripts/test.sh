#!/usr/bin/env bash
# The whole test suite, on a fresh machine too: installs the package with its test and
# deploy extras, builds (or reuses) the MicroPython Unix port and the three emulated boards
# (scripts/build_qemu_board.sh, the Cortex-M3 and, given MPS2_AN386, the Cortex-M4F: installs
# qemu-system-arm and the ARM toolchain from Debian when missing; scripts/build_qemu_rv32.sh,
# the 32-bit RISC-V: qemu-system-misc and the RISC-V toolchain) and the native int8 kernels
# for armv6m, armv7m and rv32imc (scripts/build_natmod.sh, cached under .cache/natmod and keyed by their sources: the board
# tests compare these fresh builds with the ones shipped in the device package), then runs
# pytest with all of them required (a missing interpreter or firmware fails instead of
# skipping), on two workers. The flower extra (Flower's simulation engine) is
# installed and required the same way: tests/test_flower.py fails rather than skips.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
python3 -m pip install --quiet --disable-pip-version-check -e ".[test,deploy,flower]"
export MICROTRAIN_REQUIRE_FLOWER=1
export MICROTRAIN_MICROPYTHON=$(bash scripts/build_micropython.sh)
if command -v npm >/dev/null; then    # web/: MicroPython's WebAssembly port, playwright-core
    (cd web && npm ci --no-audit --no-fund --loglevel=error >/dev/null)
fi
export MICROTRAIN_REQUIRE_MICROPYTHON=1
export MICROTRAIN_QEMU_FIRMWARE=$(bash scripts/build_qemu_board.sh)
export MICROTRAIN_REQUIRE_QEMU=1
export MICROTRAIN_QEMU_M4_FIRMWARE=$(bash scripts/build_qemu_board.sh MPS2_AN386)
export MICROTRAIN_REQUIRE_QEMU_M4=1
export MICROTRAIN_QEMU_RV32_FIRMWARE=$(bash scripts/build_qemu_rv32.sh)
export MICROTRAIN_REQUIRE_QEMU_RV32=1
# after the boards: their scripts installed the ARM and RISC-V toolchains the modules need
bash scripts/build_natmod.sh armv6m armv7m rv32imc >/dev/null
# Two workers (pytest-xdist), each taking whole test files (their module fixtures built
# once): the suite's CPU time spread over two cores. MICROTRAIN_TEST_WORKERS=1 runs it in
# one process (0: no xdist at all).
workers=${MICROTRAIN_TEST_WORKERS:-2}
parallel=()
if [ "$workers" != 0 ]; then
    parallel=(-n "$workers" --dist loadfile)
fi
set +e
python3 -m pytest "${parallel[@]}" "$@"
status=$?
set -e
if [ "$status" -eq 5 ]; then
    echo "pytest collected no tests: that is a failure here" >&2
    exit 1
fi
exit "$status"
