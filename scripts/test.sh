#!/usr/bin/env bash
# The whole test suite, on a fresh machine too: installs the package with its test extra,
# builds (or reuses) the MicroPython Unix port, then runs pytest with the MicroPython suite
# required (a missing interpreter fails instead of skipping).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
python3 -m pip install --quiet --disable-pip-version-check -e ".[test]"
export MICROTRAIN_MICROPYTHON=$(bash scripts/build_micropython.sh)
if command -v npm >/dev/null; then    # web/: MicroPython's WebAssembly port, playwright-core
    (cd web && npm ci --no-audit --no-fund --loglevel=error >/dev/null)
fi
export MICROTRAIN_REQUIRE_MICROPYTHON=1
set +e
python3 -m pytest "$@"
status=$?
set -e
if [ "$status" -eq 5 ]; then
    echo "pytest collected no tests: that is a failure here" >&2
    exit 1
fi
exit "$status"
