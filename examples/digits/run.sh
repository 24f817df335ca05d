#!/usr/bin/env bash
# The main job on the bundled example: pack the 64-32-10 digits MLP, show the packed blob's
# memory plan, then train it with the device runtime under CPython (pass "micropython" as
# the first argument to run the device runtime under the MicroPython Unix port instead).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
runtime=${1:-cpython}
build=${BUILD_DIR:-$here/build}
microtrain pack "$here/mlp.onnx" -o "$build" --loss cross_entropy --optimizer adamw --batch-size 8
microtrain train "$build" --data "$here/digits.npz" --epochs 5 --lr 0.01 --runtime "$runtime"
