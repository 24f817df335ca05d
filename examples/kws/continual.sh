#!/usr/bin/env bash
# Keep learning on the device: the pretrained int8 keyword-spotting DS-CNN learns 12 new
# keywords in 4 stages of 3 (10 recordings each) with microtrain.continual.Learner, on the
# MicroPython Unix port built as a board's firmware would be (32-bit, the model's minimal
# runtime and the blob frozen in; built once into .cache/), in a 128 KB heap: the smallest
# heap the run needs is bisected first, then the staged run with replay, without replay,
# and joint training (the upper bound) print their held-out accuracy per stage, the
# forgetting, the sample store's bytes and the peak heap. A few minutes.
#   bash examples/kws/continual.sh [--runtime cpython] [--epochs N] [--lr LR]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
python "$here/continual.py" --measure-heap "$@"
