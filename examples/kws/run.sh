#!/usr/bin/env bash
# Personalise the pretrained keyword-spotting DS-CNN (MLPerf Tiny size) to 12 new keywords of
# a new speaker on the device runtime, at batch 1: prints what each training configuration
# costs in memory, then the held-out accuracy on the new keywords before and after training,
# and the peak heap in bytes.
#   bash examples/kws/run.sh               int8 backbone, the classifier trained in integers,
#                                          on the MicroPython Unix port with the runtime
#                                          frozen in (built once into .cache/): the heap one
#                                          step needs is bisected first, then the whole run
#                                          goes in that -X heapsize (a few minutes)
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
              --runtime micropython --frozen --measure-heap ;;
    micropython) python "$here/personalise.py" --build "$build" --runtime micropython \
                     --frozen --measure-heap ;;
    *) python "$here/personalise.py" --build "$build" ;;
esac
