#!/usr/bin/env bash
# Federated averaging on the digits: 4 emulated devices (device 0 under the MicroPython Unix
# port when it is built, the others under CPython), each training on its own non-IID shard,
# 6 FedAvg rounds; prints the global model's validation accuracy after every round.
# Options go to federated.py (--devices, --rounds, --epochs, --lr, --cpython-only, --work).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
python3 "$here/federated.py" "$@"
