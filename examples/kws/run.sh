#!/usr/bin/env bash
# Personalise the pretrained keyword-spotting DS-CNN (MLPerf Tiny size) to 12 new keywords of
# a new speaker on the device runtime, at batch 1: prints what each training configuration
# costs in memory, then the held-out accuracy on the new keywords before and after training,
# and the peak heap in bytes.
#   bash examples/kws/run.sh               int8 backbone, the classifier trained in integers,
#                                          on the MicroPython Unix port in a 64 KB heap, built
#                                          as a board would be (once, into .cache/): 32-bit,
#                                          the model's minimal runtime frozen in and the blob
#                                          frozen as a bytes constant, so its frozen int8
#                                          weights are read in place as from flash; the heap
#                                          one step needs is bisected first (a few minutes)
#   bash examples/kws/run.sh cpython       float: every bias + the classifier, device runtime
#                                          under CPython (a few minutes)
#   bash examples/kws/run.sh micropython   the same float run on the frozen Unix port (slow:
#                                          tens of minutes)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
runtime=${1:-int8}
build=${BUILD_DIR:-$here/build}
case "$runtime" in
    int8) python "$here/personalise.py" --build "$build" --config "int8 last" \
              --runtime micropython --frozen --trim --flash --m32 --heap 64K --measure-heap ;;
    micropython) python "$here/personalise.py" --build "$build" --runtime micropython \
                     --frozen --measure-heap ;;
    *) python "$here/personalise.py" --build "$build" ;;
esac
