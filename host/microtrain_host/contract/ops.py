"""The op table: every device kernel the host's lowering can emit, with its named arguments.

A text table, one block per kernel family (device/microtrain/kernels/<family>.py and
host/microtrain_host/ops/<family>.py), headed [family]. A row is an op: its code, its name
(NAME=kernel where the kernel function is not the name in lower case), then its arguments in
the order the kernel receives them (a step's args are tensor offsets, then ints, then floats):

* tensors: "name:kind", kind "f" float tensor, "?" float tensor or none, "i" int32 tensor,
  "k" int32 tensor or none, "b" int8 / uint8 tensor (byte arena), "w" an int8 weight (in the
  byte arena, or read in place where the blob is). A kernel with "b" or "w" tensors gets the
  byte arena first in its args; one with a "w" tensor gets that weight's buffer last.
  A tensor argument named "scratch" is one the kernel writes before it reads it: no value
  passes between steps through it (pipeline/plan.py mark_latent relies on that).
* "ints ...", "floats ...": names; "$NAME" stands for the list SHARED_INTS[NAME] (a geometry
  several kernels read); a trailing "*" means the step carries more (tables that come with
  the geometry: Resize), whose exact count the kernel's checker checks.
* "flags ...": "recomputable" (the memory moves may run it again in the backward pass instead
  of keeping its output: pipeline/moves.py), "update" (a parameter update: with
  update_in_backward it moves next to the gradient's last use).
* "like OTHER" instead of the arguments: the same arguments and flags as the op OTHER, so a
  signature several ops share is written once.
A line that starts with no code goes on with the row above it.

contract/generate.py writes device/microtrain/opcodes.py (the rows as one string read by
signature(op), kernel_module) and host/microtrain_host/opcodes.py from this table;
tests/test_contract.py checks they are current, that every kernel and its load-time checker
exist, and that every step the host lowers carries the counts named here.

Code ranges by family: dense 1-9, elementwise 10-29 and 130-137, activation 30-49 (40 is
reduce), 128-129, 138-139 and 240-241, loss 50-59, optim 60-69, conv 70-79, pool 80-89, norm 90-99,
layout 100-119, smooth 120-127, group_norm 140-149, gather 150-159, resize 160-169, recurrent 170-189,
quant 200-219, qlinear 220-239 and 196, inttrain 242-247, intgrad 248-255, intflow 190-193
and 197, intloss 194-195."""
import dataclasses

KINDS = "f?ikbw"


@dataclasses.dataclass(frozen=True)
class Op:
    name: str
    code: int
    family: str
    kernel: str
    tensors: tuple      # ((name, kind), ...)
    ints: tuple         # names; a trailing "*": and as many more as the step carries
    floats: tuple
    flags: frozenset

    @property
    def kinds(self):
        return "".join(kind for _, kind in self.tensors)

    @property
    def int_count(self):
        """How many ints a step carries; -1: any number (the checker checks them)."""
        return -1 if self.ints[-1:] == ("*",) else len(self.ints)

    @property
    def float_count(self):
        return -1 if self.floats[-1:] == ("*",) else len(self.floats)

    @property
    def weight_argument(self):
        """The index of its int8 weight tensor ("w"), or -1."""
        return self.kinds.find("w")


def _rows(text):
    """(family, code, "NAME" or "NAME=kernel", [the words after it]) of each row of the
    text table."""
    rows, family = [], None
    for line in text.splitlines():
        words = line.split()
        if words and words[0].startswith("["):
            family = words[0].strip("[]")
        elif words and words[0].isdigit():
            rows.append((family, int(words[0]), words[1], words[2:]))
        elif words:
            rows[-1][3].extend(words)     # the row above goes on
    return rows


def table(text, shared_ints):
    """The ops of a text table (the format above), in the order of their codes."""
    ops = {}
    for family, code, name, words in _rows(text):
        name, _, kernel = name.partition("=")
        kernel = kernel or name.lower()
        assert name not in ops, f"op {name} is in the table twice"
        if words[0] == "like":
            assert len(words) == 2 and words[1] in ops, (name, words)
            ops[name] = dataclasses.replace(ops[words[1]], name=name, code=code, family=family,
                                            kernel=kernel)
            continue
        parts, section = {"tensors": [], "ints": [], "floats": [], "flags": []}, "tensors"
        for word in words:
            if word in parts:
                section = word
            elif word.startswith("$"):
                parts[section] += shared_ints[word[1:]].split()
            else:
                parts[section].append(word)
        tensors = tuple(tuple(t.split(":")) for t in parts["tensors"])
        assert all(len(t) == 2 and t[1] in KINDS for t in tensors), (name, tensors)
        ops[name] = Op(name, code, family, kernel, tensors, tuple(parts["ints"]),
                       tuple(parts["floats"]), frozenset(parts["flags"]))
    return tuple(sorted(ops.values(), key=lambda o: o.code))


# Int lists several kernels read ($NAME in the table).
SHARED_INTS = {
    # the dimensions of a strided broadcasting binary op (merged to at most 3), the strides
    # of A and B along them
    "BROADCAST": "d0 d1 d2 sa0 sa1 sa2 sb0 sb1 sb2",
    # a 2-D convolution (a 1-D one has height 1): images, groups, channels per group, sizes,
    # kernel, strides, dilations, begin pads; a 3-D one's sizes depth first
    "CONV": "n_images groups cin_g cout_g in_h in_w out_h out_w k_h k_w s_h s_w d_h d_w pad_t "
            "pad_l",
    "CONV_3D": "n_images groups cin_g cout_g in_d in_h in_w out_d out_h out_w k_d k_h k_w s_d s_h "
               "s_w d_d d_h d_w pad_f pad_t pad_l",
    # a 2-D pool over its planes (images x channels): sizes, kernel, strides, begin pads
    "POOL": "planes H W OH OW kH kW sH sW pT pL",
    # GRU and LSTM: sizes, directions, the strides of X, Y and the hidden states, whether
    # every time step keeps its saved slot (kernels/recurrent.py)
    "RECURRENT": "steps batch n_in hidden dirs reverse sx_t sx_n sy_t sy_d sy_n sh_d sh_n keep",
}

OPS = table("""
[dense]
  1 GEMM             y:f a:f b:f c:?  ints m k n sa_m sa_k sb_k sb_n sc_m sc_n  floats alpha beta
  2 GEMM_ACCUMULATE  y:f a:f b:f reset:f  ints m k n sa_m sa_k sb_k sb_n  floats alpha
  3 BATCHED_GEMM     y:f a:f b:f  ints d0 d1 d2 sa0 sa1 sa2 sb0 sb1 sb2 m k n sa_m sa_k sb_k sb_n
                     floats alpha
[elementwise]
 10 ADD                                y:f a:f b:f  ints $BROADCAST  flags recomputable
 11 SUB                                like ADD
 12 MUL                                like ADD
 13 DIV                                like ADD
 14 EXPAND                             y:f x:f  ints d0 d1 d2 sx0 sx1 sx2
 15 COPY                               y:f x:f  ints n
 20 NEG                                like COPY
 21 ABS=absolute                       like COPY
 22 SIGN                               like COPY
 23 EXP                                like COPY
 24 LOG                                like COPY
 25 SQRT                               like COPY
 26 POW=power                          y:f x:f  ints n  floats exponent
130 MAX=maximum                        y:f a:f b:f  ints $BROADCAST
131 MIN=minimum                        like MAX
132 COUNT_EQUAL                        like MAX
133 TIE_SHARE                          dx:f dy:f y:f count:f x:f  ints d0 d1 d2 sx0 sx1 sx2
134 PRELU                              like ADD
135 PRELU_GRAD                         dx:? dslope:? dy:f x:f slope:f  ints d0 d1 d2 ss0 ss1 ss2
136 POW_TENSOR=power_tensor            like MAX
137 POW_TENSOR_GRAD=power_tensor_grad  dx:? dp:? dy:f y:f x:f p:f
                                       ints d0 d1 d2 sx0 sx1 sx2 sp0 sp1 sp2
[activation]
 30 RELU                   y:f x:f  ints n  flags recomputable
 31 SIGMOID                like RELU
 32 TANH                   like RELU
 33 RELU_GRAD              dx:f dy:f y:f  ints n
 34 SIGMOID_GRAD           like RELU_GRAD
 35 TANH_GRAD              like RELU_GRAD
 36 SOFTMAX                y:f x:f  ints outer n inner
 37 LOG_SOFTMAX            like SOFTMAX
 38 SOFTMAX_GRAD           dx:f dy:f y:f  ints outer n inner
 39 LOG_SOFTMAX_GRAD       like SOFTMAX_GRAD
 41 SOFTPLUS               like RELU
 42 LEAKY_RELU             y:f x:f  ints n  floats alpha  flags recomputable
 43 LEAKY_RELU_GRAD        dx:f dy:f x:f  ints n  floats alpha
 44 CLIP                   y:f x:f  ints n  floats lo hi  flags recomputable
 45 CLIP_GRAD              dx:f dy:f x:f  ints n  floats lo hi
 46 HARD_SIGMOID           y:f x:f  ints n  floats alpha beta  flags recomputable
 47 HARD_SIGMOID_GRAD      dx:f dy:f x:f  ints n  floats alpha beta
 48 HARD_SWISH             like RELU
 49 HARD_SWISH_GRAD        dx:f dy:f x:f  ints n
128 SHRINK                 y:f x:f  ints n  floats lambd bias
129 SHRINK_GRAD            dx:f dy:f x:f  ints n  floats lambd
138 THRESHOLDED_RELU       like LEAKY_RELU
139 THRESHOLDED_RELU_GRAD  like LEAKY_RELU_GRAD
240 RELU_MASKED            y:f x:f mask:i  ints n
241 RELU_MASK_GRAD         dx:f dy:f mask:i  ints n
[reduce]
 40 REDUCE_SUM  y:f x:f  ints d0 d1 d2 sy0 sy1 sy2 ny  floats scale
[loss]
 50 SOFTMAX_CE=softmax_cross_entropy            loss:f log_prob:f scores:f labels:i  ints n c
 51 SOFTMAX_CE_GRAD=softmax_cross_entropy_grad  dscores:f dloss:f log_prob:f labels:i  ints n c
[optim]
 60 ACCUMULATE         buf:f value:f reset:f  ints n
 61 SGD                p:f g:f lr:f  ints n  flags update
 62 ADAMW              p:f g:f m:f v:f lr:f step_size:f  ints n
                       floats beta1 beta2 eps weight_decay  flags update
 63 SGD_GENERAL        p:f g:f lr:f step:? buf:? coef:?  ints n nesterov
                       floats momentum dampening weight_decay l1 l2  flags update
 64 ADAMW_GENERAL      p:f g:f m:f v:f lr:f step_size:f coef:?  ints n
                       floats beta1 beta2 eps weight_decay l1 l2  flags update
 65 GRAD_NORM_SQUARED  total:f g:f p:f  ints n first  floats l1 l2
 66 CLIP_COEF          at:f  floats max_norm
[conv]
 70 CONV                                    y:f x:f w:f b:?  ints $CONV
 71 CONV_GRAD_INPUT                         dx:f dy:f w:f  ints $CONV
 72 CONV_GRAD_WEIGHT                        dw:f dy:f x:f reset:?  ints $CONV
 73 CONV_TRANSPOSE                          like CONV
 74 CONV_3D=conv3d                          y:f x:f w:f b:?  ints $CONV_3D
 75 CONV_3D_GRAD_INPUT=conv3d_grad_input    dx:f dy:f w:f  ints $CONV_3D
 76 CONV_3D_GRAD_WEIGHT=conv3d_grad_weight  dw:f dy:f x:f reset:?  ints $CONV_3D
[pool]
 80 MAX_POOL           y:f x:f  ints $POOL dH dW
 81 MAX_POOL_GRAD      dx:f dy:f x:f  ints $POOL dH dW
 82 AVERAGE_POOL       y:f x:f  ints $POOL ch0 ch1 cw0 cw1
 83 AVERAGE_POOL_GRAD  dx:f dy:f  ints $POOL ch0 ch1 cw0 cw1
[norm]
 90 BATCH_NORM_TRAINING   y:f x:f scale:f bias:f rmean:? rvar:?  ints n c inner
                          floats eps momentum  flags recomputable
 91 BATCH_NORM_INFERENCE  y:f x:f scale:f bias:f mean:f var:f  ints n c inner  floats eps
                          flags recomputable
 92 CHANNEL_AFFINE        y:f x:f a:f b:?  ints n c inner  flags recomputable
 93 BATCH_NORM_GRAD       dx:? dscale:? dbias:? dy:f x:f scale:f mean:? var:?  ints n c inner
                          floats eps
 94 DROPOUT               y:f x:f mask:i state:i  ints n threshold seed stream  floats scale
 95 DROPOUT_GRAD          dx:f dy:f mask:i  ints n  floats scale
[layout]
100 STRIDED_COPY  y:f x:f  ints y0 x0 d0 d1 d2 d3 sy0 sy1 sy2 sy3 sx0 sx1 sx2 sx3
101 STRIDED_ADD   like STRIDED_COPY
102 FILL          y:f  ints n  floats value
[smooth]
120 EXP_LINEAR       y:f x:f  ints n  floats alpha scale k  flags recomputable
121 EXP_LINEAR_GRAD  dx:f dy:f x:f  ints n  floats alpha scale k
122 ERF              y:f x:f  ints n  flags recomputable
123 ERF_GRAD         dx:f dy:f x:f  ints n
124 GELU             y:f x:f  ints n approximate  flags recomputable
125 GELU_GRAD        dx:f dy:f x:f  ints n approximate
126 SOFTSIGN         like ERF
127 SOFTSIGN_GRAD    like ERF_GRAD
[group_norm]
140 GROUP_NORM       y:f x:f scale:? bias:?  ints rows groups cpb inner  floats eps
                     flags recomputable
141 GROUP_NORM_GRAD  dx:? dscale:? dbias:? dy:f x:f scale:?  ints rows groups cpb inner
                     floats eps
[gather]
150 GATHER_ROWS       y:f data:f indices:i  ints outer size inner count
151 GATHER_ROWS_GRAD  dx:f dy:f indices:i  ints outer size inner count
[resize]
160 RESIZE_NEAREST       y:f x:f  ints planes in_h in_w out_h out_w *
161 RESIZE_NEAREST_GRAD  like RESIZE_NEAREST
162 RESIZE_LINEAR        y:f x:f  ints planes in_h in_w out_h out_w *  floats *
163 RESIZE_LINEAR_GRAD   like RESIZE_LINEAR
[recurrent]
170 GRU        y:f y_h:? saved:f x:f w:f r:f b:? h0:?  ints $RECURRENT
171 GRU_GRAD   dx:? dw:? dr:? db:? dh0:? dh:f saved:f x:f w:f r:f h0:? y:f dy:? dy_h:?
               ints $RECURRENT
172 LSTM       y:f y_h:? y_c:? saved:f x:f w:f r:f b:? h0:? c0:? p:?  ints $RECURRENT
173 LSTM_GRAD  dx:? dw:? dr:? db:? dh0:? dc0:? dp:? dh:f saved:f x:f w:f r:f h0:? c0:? p:?
               y:f dy:? dy_h:? dy_c:?  ints $RECURRENT
[intloss]
194 INT_MSE         z:i g:i loss:i target:b req:i  ints m n t_signed
195 INT_BCE_LOGITS  z:i g:i loss:i target:i table:i  ints m n
[quant]
200 FAKE_QUANT       y:f x:f s:f z:f  ints outer channels inner qmin qmax
201 FAKE_QUANT_GRAD  dx:f dy:f x:f s:f z:f  ints outer channels inner qmin qmax
202 ABS_MAX_SCALE    scale:f w:f  ints outer channels inner  floats qmax eps
203 OBSERVE_MIN_MAX  s:f z:f r:f x:f  ints n qmin qmax  floats momentum eps
204 QUANT_PARAMS     s:f z:f r:f  ints qmin qmax  floats eps
205 FOLD_BATCH_NORM  w2:f b2:f w:f b:? gamma:f beta:f mean:f var:f  ints outer channels inner
                     floats eps
206 QUANTIZE_WEIGHT  q:b w:f scale:f  ints outer channels inner
207 QUANTIZE_BIAS    q:i b:f x_scale:f w_scale:f  ints channels
208 REQUANT_HEADER   h:i zx:f zb:? zy:f sy:f  ints qmin qmax has_min has_max  floats cmin cmax
209 ZERO_POINT_INT   y:i x:f
[qlinear]
220 QUANTIZE_LINEAR              y:b x:f qp:f  ints n qmin qmax
221 DEQUANTIZE_LINEAR            y:f x:b qp:f  ints n signed
222 QLINEAR_GEMM                 y:b x:b w:w bias:k req:i
                                 ints m k n sx_m sx_k sw_k sw_n x_signed y_signed
223 QLINEAR_CONV                 y:b x:b w:w bias:k req:i scratch:i
                                 ints $CONV x_signed y_signed
224 QLINEAR_GLOBAL_AVERAGE_POOL  y:b x:b req:i  ints planes count x_signed y_signed
225 QLINEAR_MAX_POOL             y:b x:b  ints $POOL signed
226 QLINEAR_AVERAGE_POOL         y:b x:b req:i  ints $POOL ch0 ch1 cw0 cw1 x_signed y_signed
227 QLINEAR_ADD                  y:b a:b b:b req:i  ints n a_signed b_signed y_signed
228 QLINEAR_LOOKUP               y:b x:b table:b  ints n
196 QLINEAR_CONCAT               y:b x:b req:i  ints blocks size stride offset x_signed y_signed
[inttrain]
242 INT_GEMM_LOGITS           z:i x:b w:b bias:i req:i  ints m k n x_signed
243 INT_SOFTMAX_CE            z:i g:i loss:i label:i table:i  ints m n
244 INT_GEMM_UPDATE           w:b bias:i x:b g:i rates:i random:k  ints m k n x_signed
245 INT_GEMM_GRAD_INPUT       d:i g:i w:b factors:i  ints m k n
246 INT_CONV1X1_UPDATE        w:b bias:i x:b y:b d:i req:i rates:i random:k
                              ints m cin cout plane x_signed y_signed
247 INT_GEMM_UPDATE_MOMENTUM  w:b bias:i x:b g:i rates:i random:k vw:b vb:i
                              ints m k n x_signed mu
[intgrad]
248 INT_POOL_GRAD        g:i d:i  ints m channels plane
249 INT_CLAMP_BIAS_GRAD  g:i mask:b bias:i rates:i random:k w:w  ints m channels plane
250 INT_CONV_GRAD_INPUT  gx:i g:i w:w
                         ints m groups cin_g cout_g in_h in_w out_h out_w k_h k_w s_h s_w d_h d_w
                         pad_t pad_l
251 INT_CONV_UPDATE      w:b x:b g:i rates:i random:k
                         ints m groups cin_g cout_g in_h in_w out_h out_w k_h k_w s_h s_w d_h d_w
                         pad_t pad_l x_signed
252 INT_CLAMP_MASK       mask:b y:b req:i  ints count y_signed
[intflow]
190 INT_GRAD_SUM           g:i a:i b:i ratio:i  ints count
191 INT_ADD_GRAD           ga:i gb:k g:i y:b  ints count lo hi y_signed
192 INT_MAX_POOL_GRAD      gx:i g:i x:b  ints $POOL signed
193 INT_AVERAGE_POOL_GRAD  gx:i g:i factors:i  ints $POOL ch0 ch1 cw0 cw1
197 INT_CONCAT_GRAD        gx:i g:i x:b y:b keep:i  ints blocks size stride offset x_signed
[intlookup]
210 INT_LOOKUP_GRAD  gx:i g:i x:b slopes:i  ints count  floats slope_unit
211 INT_CLAMP_GRAD   g:i mask:b folds:i w:w  ints m channels plane
""", SHARED_INTS)

BY_NAME = {o.name: o for o in OPS}
BY_CODE = {o.code: o for o in OPS}
assert len(BY_NAME) == len(OPS) == len(BY_CODE), "an op name or code is used twice"
FAMILIES = tuple(sorted({o.family for o in OPS}))
RECOMPUTABLE = frozenset(o.code for o in OPS if "recomputable" in o.flags)
UPDATES = frozenset(o.code for o in OPS if "update" in o.flags)
WEIGHT_ARGUMENT = {o.code: o.weight_argument for o in OPS if o.weight_argument >= 0}


def name_of(code):
    """The op's name, or its number when the contract has no such op (a crafted blob)."""
    return BY_CODE[code].name if code in BY_CODE else str(code)


# One line per family for the docs' op table (docs/design.md, generated).
FAMILY_NOTES = {
    "dense": "Gemm and MatMul (batched: BATCHED_GEMM); GEMM_ACCUMULATE adds into a gradient buffer",
    "elementwise": "strided broadcast arithmetic (Max / Min folded pairwise; TIE_SHARE their gradient), unary math, PRelu, Pow with a tensor exponent",
    "activation": "Relu, Sigmoid, Tanh, Softmax, LogSoftmax, Softplus, LeakyRelu, Clip, HardSigmoid, HardSwish, Shrink, each gradient beside it; RELU_MASKED keeps a 1-bit mask for its gradient",
    "reduce": "ReduceSum (ReduceMean is REDUCE_SUM with a scale)",
    "loss": "softmax cross-entropy and its gradient",
    "optim": "gradient accumulation, SGD and AdamW (plain and general: penalties, clipping, momentum), the global gradient norm",
    "conv": "Conv 1-D / 2-D and 3-D, its input and weight gradients; ConvTranspose (the mirrored convolution's input-gradient walk)",
    "pool": "MaxPool, AveragePool and their gradients (a 3-D pool is two steps)",
    "norm": "BatchNormalization (training, inference, folded as a per-channel affine), its gradient; Dropout",
    "layout": "strided copies and adds (Transpose, Slice, Concat, Split, Pad), Fill",
    "smooth": "Elu / Selu / Celu, Erf, Gelu, Softsign, each gradient reading X",
    "group_norm": "LayerNormalization, InstanceNormalization, GroupNormalization",
    "gather": "Gather of rows by int32 indices",
    "resize": "Resize / Upsample: nearest and linear, sampling tables in the step's ints and floats",
    "recurrent": "GRU and LSTM with backward through time",
    "quant": "fake quantization for QAT, observers, weight scales; the int8 export of a QAT blob",
    "qlinear": "int8 inference kernels (viper fast paths in qlinear_viper.py)",
    "intloss": "integer mean squared error and binary cross-entropy with logits of the last Gemm (beside inttrain's softmax cross-entropy)",
    "inttrain": "integer training of an int8 classifier and the 1x1 conv before it (viper: inttrain_viper.py)",
    "intgrad": "integer backward through frozen int8 convolutions: the sparse update (viper: intgrad_viper.py)",
    "intflow": "integer gradients through residual Adds, Concats, pools and tensors read twice (the sparse update beyond a chain of convolutions)",
    "intlookup": "the integer backward of lookup-table activations (QLinearLookup: a fixed-point slope per input byte) and of a layer whose bias is not in the named parameter set",
}
assert set(FAMILY_NOTES) == set(FAMILIES), "every family needs its line in FAMILY_NOTES"
