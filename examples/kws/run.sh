#!/usr/bin/env bash
# Personalise the pretrained keyword-spotting DS-CNN (MLPerf Tiny size) to 12 new keywords of
# a new speaker on the device runtime, at batch 1: prints what each training configuration
# costs in memory, then the held-out accuracy on the new keywords before and after training
# the biases of every layer and the classifier, and the peak heap.
#   bash examples/kws/run.sh               device runtime under CPython (a few minutes)
#   bash examples/kws/run.sh micropython   the MicroPython Unix port with the runtime frozen
#                                          in (built once into .cache/), the heap one step
#                                          needs bisected first (float: slow, tens of minutes)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
runtime=${1:-cpython}
build=${BUILD_DIR:-$here/build}
if [ "$runtime" = micropython ]; then
    python "$here/personalise.py" --build "$build" --runtime micropython --frozen --measure-heap
else
    python "$here/personalise.py" --build "$build"
fi
