"""What one step of a packed model costs on a board: the work it does, counted from the
packed program's steps (op codes and int attributes, as the device runs them), and an
estimate of its time at the board's clock.

The estimate is MACs x instructions per MAC of the kernel family that does them, plus
parameters x instructions per parameter of the optimizer's update, each counted on the
emulated Cortex-M3 (qemu -icount shift=0: bench/board_cost.py), divided by the board's
clock_hz: one instruction per cycle. Real Cortex-M3/M4 cores take about 1.1-1.5 cycles per
instruction (loads, branches, soft float; shared/FACTS.md), and the other work of a step
(activations, the loss, gradient sums) is not counted: a lower estimate. Other cores (Xtensa,
a core with an FPU) run other instruction streams: for them it is an order of magnitude."""
import pathlib

from microtrain import parser as device_blob_parser

from ..contract.ops import BY_CODE
from ..pipeline.pack import TRAINING_PROGRAMS

# Instructions per multiply-accumulate of each kernel family, counted by
# `python3 bench/board_cost.py` (its "per family" lines) on the emulated Cortex-M3
# (MicroPython 1.25 qemu port, no FPU, float32; the viper int8 kernels compiled for armv7m),
# 2026-11-27, on the shapes of bench/board_kernels.py: float kernels are bytecode over
# array('f') (soft-float arithmetic and a boxed float per operation); the int8 ones viper
# loops over bytes (depthwise: short 3x3 dot products, more loop overhead per MAC). Rerun the
# bench after changing a kernel and update these.
INSTRUCTIONS_PER_MAC = {
    "float dense": 2150,
    "float conv": 2257,
    "int8 dense": 59.1,
    "int8 conv": 27.2,
    "int8 depthwise": 86.4,
}
# The int8 Gemm and Conv of the native module (device/native) that deploy ships to boards
# with a build for their architecture (tools/runtime.native_modules): all shapes of
# `python3 bench/board_native.py` (armv6m build, the one every ARM core loads; the armv7m
# build is 5-40 % faster), 2026-11-28 after issue 24's eight-row Gemm (mt_t8), the
# requantization's Relu shortcut and the depthwise path's padding filled once (Conv: 3x3 9.61
# and 1x1 4.85, their mean; the KWS first Conv's 6.37 lies between; depthwise 11.26 / 11.15),
# and the fifth session's Gemm round (all Gemm shapes' instructions over their MACs, 4.79;
# 5.28 before it); Conv since 2026-11-29's direct path (qconv_direct.c): all the
# non-depthwise Conv shapes' instructions over their MACs, 4.61 (3x3 4.88, 1x1 4.83 and
# 4.33, the KWS first Conv 4.95 with its edge columns' padding terms left out; 4.67 before
# that, 7.2 before the direct path, the mean of 3x3 9.61 and 1x1 4.85); depthwise since
# the same day's row copy in one call a channel (mt_copy_rows) and the row loop's outputs
# two at a time: 9.18 / 9.07, 9.1 (11.2 before). Of the
# integer training kernels
# int_gemm_update is native too, and since 2026-11-28 inttrain's input gradient, 1x1 conv
# update and momentum update (not modelled here: counted as viper), and intgrad's (below).
NATIVE_INSTRUCTIONS_PER_MAC = {
    "int8 dense": 4.8,
    "int8 conv": 4.6,
    "int8 depthwise": 9.1,
}
NATIVE_OPS = ("QLINEAR_GEMM", "QLINEAR_CONV")
# ... and its integer backward through the convolutions (device/native/intgrad_native.c,
# 2026-11-28): the KWS DS-CNN's "int8 sparse" step's input gradients (4 pointwise 64x64 and
# 4 depthwise 3x3 over 25x5, 2,290,944 MACs) and weight updates (its last block: 572,736)
# on the emulated board, armv6m build (`bench/board_cost.py --native armv6m --profile`;
# armv7m: 7.7 / 14.4). Per MAC with what each does per element or weight besides: the
# normalization, the update steps.
NATIVE_BACKWARD = {"INT_CONV_GRAD_INPUT": "int8 conv grad input",
                   "INT_CONV_UPDATE": "int8 conv update"}
NATIVE_INSTRUCTIONS_PER_MAC.update({"int8 conv grad input": 10.0, "int8 conv update": 18.8})
# The native float module (device/native/float) that deploy ships to boards with a build:
# its Gemm kernels per MAC and its updates per parameter in the digits MLP's step (batch 8;
# `python3 bench/board_cost.py --float-native ARCH --profile`: gemm + gemm_accumulate over
# the step's 40,448 MACs, its inputs' zeros skipped; the "per param" column), 2026-11-28.
# On random data without zeros (bench/board_float_native.py's shapes) the Gemm takes 30-55
# instructions per MAC (armv7m) and 122-209 (armv6m): a lower estimate, as the bytecode's.
# The armv7m build (its Thumb-2 dot loop) is what Cortex-M3 and later cores take; the armv6m
# build (C over soft float) the RP2040's.
# Its 2-D Conv kernels (float_conv.c: C in both builds) per MAC in LeNet's step (batch 4,
# SGD; `--profile`: conv + conv_grad_input + conv_grad_weight over their 96,768 MACs, the
# gradients' zeros after max_pool_grad and relu_grad taking the zero-product path), 2026-11-28;
# on random data (bench/board_float_native.py) 88-96 (armv7m) and 192-206 (armv6m).
NATIVE_FLOAT_OPS = ("GEMM", "GEMM_ACCUMULATE", "BATCHED_GEMM", "CONV", "CONV_GRAD_INPUT",
                    "CONV_GRAD_WEIGHT")
NATIVE_FLOAT_UPDATES = ("SGD", "SGD_GENERAL", "ADAMW", "ADAMW_GENERAL")
NATIVE_INSTRUCTIONS_PER_MAC["float dense"] = 32.0
NATIVE_INSTRUCTIONS_PER_MAC["float conv"] = 65.9
# ... and per parameter element of one optimizer update (kernels/optim sgd, adamw over 1,024
# parameters, by the same bench)
INSTRUCTIONS_PER_UPDATE = {
    "SGD": 3433,
    "AdamW": 12478,
}
NATIVE_INSTRUCTIONS_PER_UPDATE = {
    "SGD": 100.9,
    "AdamW": 693.7,
}
# other builds' figures, counted the same way ("native <build> ..." in a Work): the armv6m
# build (the RP2040's) on the emulated Cortex-M3; the armv7emsp build (the FPU's
# instructions: the FPU boards') on the emulated Cortex-M4F (`--board qemu-mps2-an386
# --float-native armv7emsp --profile`: digits, and LeNet for the Conv), 2026-11-28
NATIVE_FLOAT_BUILDS = {"armv6m": {"float dense": 107.2, "float conv": 135.5, "SGD": 200.5,
                                  "AdamW": 1449.7},
                       "armv7emsp": {"float dense": 10.6, "float conv": 10.8, "SGD": 51.1,
                                     "AdamW": 183.9}}
CYCLES_PER_INSTRUCTION = (1.1, 1.5)   # real Cortex-M3/M4 (shared/FACTS.md)


def _carried(native):
    """(the int8 module carried, the float module's kind prefix or None): native is True
    (the int8 module, as callers said before the float one), the names of the runtime's
    native modules, or {name: build's path} (runtime.native_modules): a float module whose
    build is armv6m counts at that build's cost ("native armv6m "), any other as armv7m's
    ("native ")."""
    if native is True:
        return True, None
    names = [str(n) for n in (native or ())]
    flt = None
    for n in names:
        if n.endswith("float_native.mpy"):
            build = pathlib.PurePath(native[n]).parent.name if isinstance(native, dict) else ""
            flt = f"native {build} " if build in NATIVE_FLOAT_BUILDS else "native "
    return any(n.endswith("qlinear_native.mpy") for n in names), flt


def _taps(out, k, stride, dilation, pad, size):
    # (output, kernel tap) pairs of one axis that fall inside the input: the conv kernels
    # skip the taps on padding, so those are no MACs
    return sum(1 for o in range(out) for t in range(k)
               if 0 <= o * stride + t * dilation - pad < size)


def _conv(i):
    return (i["n_images"] * i["groups"] * i["cin_g"] * i["cout_g"]
            * _taps(i["out_h"], i["k_h"], i["s_h"], i["d_h"], i["pad_t"], i["in_h"])
            * _taps(i["out_w"], i["k_w"], i["s_w"], i["d_w"], i["pad_l"], i["in_w"]))


def _conv3d(i):
    return _conv(i) * _taps(i["out_d"], i["k_d"], i["s_d"], i["d_d"], i["pad_f"], i["in_d"])


def _int8_conv(i):
    # a depthwise conv (one input channel per group) runs its own loop
    return ("int8 depthwise" if i["cin_g"] == 1 and i["groups"] > 1 else "int8 conv"), _conv(i)


def _recurrent(gates, passes):
    # per time step and sample: the gates of X.W and H.R; a gradient does them again for
    # dX / dW and dH / dR (passes 2)
    return lambda i: ("float dense", passes * gates * i["steps"] * i["batch"] * i["dirs"]
                      * i["hidden"] * (i["n_in"] + i["hidden"]))


def _mnk(kind):
    return lambda i: (kind, i["m"] * i["k"] * i["n"])


# op name -> ints by name -> (kernel family, MACs). The other ops do no MACs: elementwise
# ops, pooling, the loss (linear in the tensor size) are not counted; the optimizer's
# updates are, per parameter (UPDATES).
MACS = {
    "GEMM": _mnk("float dense"),
    "GEMM_ACCUMULATE": _mnk("float dense"),
    "BATCHED_GEMM": lambda i: ("float dense", i["d0"] * i["d1"] * i["d2"] * i["m"] * i["k"]
                               * i["n"]),
    # a transposed conv's ints are the mirrored conv's: the same products
    **{name: lambda i: ("float conv", _conv(i))
       for name in ("CONV", "CONV_GRAD_INPUT", "CONV_GRAD_WEIGHT", "CONV_TRANSPOSE")},
    **{name: lambda i: ("float conv", _conv3d(i))
       for name in ("CONV_3D", "CONV_3D_GRAD_INPUT", "CONV_3D_GRAD_WEIGHT")},
    "GRU": _recurrent(3, 1), "GRU_GRAD": _recurrent(3, 2),
    "LSTM": _recurrent(4, 1), "LSTM_GRAD": _recurrent(4, 2),
    "QLINEAR_GEMM": _mnk("int8 dense"),
    "QLINEAR_CONV": _int8_conv,
    # integer training: its viper loops are int8 x int8 / int32 products as qlinear's
    "INT_GEMM_LOGITS": _mnk("int8 dense"),
    "INT_GEMM_UPDATE": _mnk("int8 dense"),
    "INT_GEMM_GRAD_INPUT": _mnk("int8 dense"),
    "INT_GEMM_UPDATE_MOMENTUM": _mnk("int8 dense"),
    "INT_CONV1X1_UPDATE": lambda i: ("int8 conv", i["m"] * i["cin"] * i["cout"] * i["plane"]),
    "INT_CONV_GRAD_INPUT": lambda i: _int8_conv(dict(i, n_images=i["m"])),
    "INT_CONV_UPDATE": lambda i: _int8_conv(dict(i, n_images=i["m"])),
}


# optimizer update op name -> ints by name -> (optimizer, parameter elements it updates)
UPDATES = {
    "SGD": lambda i: ("SGD", i["n"]),
    "SGD_GENERAL": lambda i: ("SGD", i["n"]),
    "ADAMW": lambda i: ("AdamW", i["n"]),
    "ADAMW_GENERAL": lambda i: ("AdamW", i["n"]),
}


class Work:
    """What one step of a blob does that the estimate counts: MACs by kernel family and
    parameter elements updated by optimizer, read off its programs' steps."""

    def __init__(self, b, programs, what, native=False):
        self.what = what
        self.macs, self.updates = {}, {}
        int8, flt = _carried(native)
        prefixes = dict({op: "native " for op in (NATIVE_OPS + tuple(NATIVE_BACKWARD)
                                                  if int8 else ())},
                        **{op: flt for op in (NATIVE_FLOAT_OPS + NATIVE_FLOAT_UPDATES
                                              if flt else ())})
        for name in programs:
            for op, _, ints, _ in b.step_records.get(name, ()):
                spec = BY_CODE.get(op)
                for table, counts in ((MACS, self.macs), (UPDATES, self.updates)):
                    if spec is not None and spec.name in table:
                        kind, n = table[spec.name](dict(zip(spec.ints, ints)))
                        if spec.name in prefixes:
                            kind = prefixes[spec.name] + NATIVE_BACKWARD.get(spec.name, kind)
                        counts[kind] = counts.get(kind, 0) + n

    def instructions(self):
        """Its instructions on the emulated M3 by the counted per-MAC and per-update costs."""
        return (sum(n * per_mac(family) for family, n in self.macs.items())
                + sum(n * per_update(kind) for kind, n in self.updates.items()))


def _cost(kind, counted, native):
    # kind "native armv6m AdamW": NATIVE_FLOAT_BUILDS' figure; "native AdamW": native's;
    # "AdamW": counted's
    if not kind.startswith("native "):
        return counted[kind]
    build, _, rest = kind[7:].partition(" ")
    return NATIVE_FLOAT_BUILDS[build][rest] if build in NATIVE_FLOAT_BUILDS else native[kind[7:]]


def per_mac(family):
    """Instructions per MAC of a family ("native int8 dense": the native module's)."""
    return _cost(family, INSTRUCTIONS_PER_MAC, NATIVE_INSTRUCTIONS_PER_MAC)


def per_update(kind):
    """Instructions per parameter of an optimizer's update ("native AdamW": the module's)."""
    return _cost(kind, INSTRUCTIONS_PER_UPDATE, NATIVE_INSTRUCTIONS_PER_UPDATE)


def step_work(path, native=False):
    """The Work of one step of the blob at path: a training step (its training programs
    and the optimizer's) when it has one, else one inference. native: the runtime carries
    the native int8 module (its Gemm and Conv counted at its cost)."""
    b = device_blob_parser.load(str(path), keep_steps=True)
    training = [p for p in TRAINING_PROGRAMS if p in b.programs]
    if training:
        return Work(b, training + ["optimizer"], "training step", native)
    return Work(b, [p for p in ("infer", "eval") if p in b.programs][:1], "inference", native)


class Estimate:
    def __init__(self, path, board, native=False):
        self.board = board
        self.work = step_work(path, native)
        self.instructions = self.work.instructions()
        self.ms = 1000.0 * self.instructions / board["clock_hz"]  # one instruction a cycle
        self.ms_range = tuple(self.ms * c for c in CYCLES_PER_INSTRUCTION)

    def text(self):
        board, work = self.board, self.work
        if not self.instructions:
            return (f"estimated time per {work.what} on {board['name']}: its programs do no "
                    f"multiply-accumulates and no optimizer update, nothing to estimate from")
        parts = [f"{n:,} {family} MACs x {per_mac(family):g}"
                 for family, n in sorted(work.macs.items())]
        parts += [f"{n:,} parameters' {kind} updates x {per_update(kind):g}"
                  for kind, n in sorted(work.updates.items())]
        on_m4 = ("; the armv7emsp build's on the emulated Cortex-M4F"
                 if any("armv7emsp" in kind for kind in list(work.macs) + list(work.updates))
                 else "")
        return "\n".join([
            f"estimated time per {work.what} on {board['name']} at {board['clock_hz'] / 1e6:g} "
            f"MHz: {self.ms:,.1f} ms ({self.ms_range[0]:,.1f}-{self.ms_range[1]:,.1f} ms at "
            f"{CYCLES_PER_INSTRUCTION[0]}-{CYCLES_PER_INSTRUCTION[1]} cycles per instruction)",
            f"  an estimate, not a measurement: {self.instructions / 1e6:,.1f} M instructions, "
            f"counted per unit on the emulated Cortex-M3 (bench/board_cost.py{on_m4}): "
            f"{'; '.join(parts)}. Other work (activations, the loss) is not counted; other "
            f"cores run other code"])
