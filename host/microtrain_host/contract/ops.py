"""The op table: every device kernel the host's lowering can emit, with its named arguments.

One row per op code: name, code, kernel family (device/microtrain/kernels/<family>.py and
host/microtrain_host/ops/<family>.py), kernel function, then its arguments in the order the
kernel receives them (a step's args are tensor offsets, then ints, then floats):

* tensors: "name:kind", kind "f" float tensor, "?" float tensor or none, "i" int32 tensor,
  "k" int32 tensor or none, "b" int8 / uint8 tensor (byte arena), "w" an int8 weight (in the
  byte arena, or read in place where the blob is). A kernel with "b" or "w" tensors gets the
  byte arena first in its args; one with a "w" tensor gets that weight's buffer last.
* ints, floats: names; a trailing "*" means the step carries more (tables that come with
  the geometry: Resize), whose exact count the kernel's checker checks.
* flags: "recomputable" (the memory moves may run it again in the backward pass instead of
  keeping its output: pipeline/moves.py), "update" (a parameter update: with
  update_in_backward it moves next to the gradient's last use).

contract/generate.py writes device/microtrain/opcodes.py (the rows as one string read by
signature(op), kernel_module) and host/microtrain_host/opcodes.py from this table;
tests/test_contract.py checks they are current, that every kernel and its load-time checker
exist, and that every step the host lowers carries the counts named here.

Code ranges by family: dense 1-9, elementwise 10-29 and 130-137, activation 30-49 (40 is
reduce), 128-129, 138-139 and 240-241, loss 50-59, optim 60-69, conv 70-79, pool 80-89, norm 90-99,
layout 100-119, smooth 120-127, group_norm 140-149, gather 150-159, resize 160-169, recurrent 170-189,
quant 200-219, qlinear 220-239, inttrain 242-247, intgrad 248-255."""
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


def op(name, code, family, kernel, tensors, ints="", floats="", flags=""):
    pairs = tuple(tuple(t.split(":")) for t in tensors.split())
    assert all(len(p) == 2 and p[1] in KINDS for p in pairs), (name, tensors)
    return Op(name, code, family, kernel, pairs, tuple(ints.split()), tuple(floats.split()),
              frozenset(flags.split()))


OPS = (
    op('GEMM', 1, 'dense', 'gemm', 'y:f a:f b:f c:?',
       ints='m k n sa_m sa_k sb_k sb_n sc_m sc_n', floats='alpha beta'),
    op('GEMM_ACCUMULATE', 2, 'dense', 'gemm_accumulate', 'y:f a:f b:f reset:f',
       ints='m k n sa_m sa_k sb_k sb_n', floats='alpha'),
    op('BATCHED_GEMM', 3, 'dense', 'batched_gemm', 'y:f a:f b:f',
       ints='d0 d1 d2 sa0 sa1 sa2 sb0 sb1 sb2 m k n sa_m sa_k sb_k sb_n', floats='alpha'),
    op('ADD', 10, 'elementwise', 'add', 'y:f a:f b:f',
       ints='d0 d1 d2 sa0 sa1 sa2 sb0 sb1 sb2', flags='recomputable'),
    op('SUB', 11, 'elementwise', 'sub', 'y:f a:f b:f',
       ints='d0 d1 d2 sa0 sa1 sa2 sb0 sb1 sb2', flags='recomputable'),
    op('MUL', 12, 'elementwise', 'mul', 'y:f a:f b:f',
       ints='d0 d1 d2 sa0 sa1 sa2 sb0 sb1 sb2', flags='recomputable'),
    op('DIV', 13, 'elementwise', 'div', 'y:f a:f b:f',
       ints='d0 d1 d2 sa0 sa1 sa2 sb0 sb1 sb2', flags='recomputable'),
    op('EXPAND', 14, 'elementwise', 'expand', 'y:f x:f',
       ints='d0 d1 d2 sx0 sx1 sx2'),
    op('COPY', 15, 'elementwise', 'copy', 'y:f x:f',
       ints='n'),
    op('NEG', 20, 'elementwise', 'neg', 'y:f x:f',
       ints='n'),
    op('ABS', 21, 'elementwise', 'absolute', 'y:f x:f',
       ints='n'),
    op('SIGN', 22, 'elementwise', 'sign', 'y:f x:f',
       ints='n'),
    op('EXP', 23, 'elementwise', 'exp', 'y:f x:f',
       ints='n'),
    op('LOG', 24, 'elementwise', 'log', 'y:f x:f',
       ints='n'),
    op('SQRT', 25, 'elementwise', 'sqrt', 'y:f x:f',
       ints='n'),
    op('POW', 26, 'elementwise', 'power', 'y:f x:f',
       ints='n', floats='exponent'),
    op('RELU', 30, 'activation', 'relu', 'y:f x:f',
       ints='n', flags='recomputable'),
    op('SIGMOID', 31, 'activation', 'sigmoid', 'y:f x:f',
       ints='n', flags='recomputable'),
    op('TANH', 32, 'activation', 'tanh', 'y:f x:f',
       ints='n', flags='recomputable'),
    op('RELU_GRAD', 33, 'activation', 'relu_grad', 'dx:f dy:f y:f',
       ints='n'),
    op('SIGMOID_GRAD', 34, 'activation', 'sigmoid_grad', 'dx:f dy:f y:f',
       ints='n'),
    op('TANH_GRAD', 35, 'activation', 'tanh_grad', 'dx:f dy:f y:f',
       ints='n'),
    op('SOFTMAX', 36, 'activation', 'softmax', 'y:f x:f',
       ints='outer n inner'),
    op('LOG_SOFTMAX', 37, 'activation', 'log_softmax', 'y:f x:f',
       ints='outer n inner'),
    op('SOFTMAX_GRAD', 38, 'activation', 'softmax_grad', 'dx:f dy:f y:f',
       ints='outer n inner'),
    op('LOG_SOFTMAX_GRAD', 39, 'activation', 'log_softmax_grad', 'dx:f dy:f y:f',
       ints='outer n inner'),
    op('REDUCE_SUM', 40, 'reduce', 'reduce_sum', 'y:f x:f',
       ints='d0 d1 d2 sy0 sy1 sy2 ny', floats='scale'),
    op('SOFTPLUS', 41, 'activation', 'softplus', 'y:f x:f',
       ints='n', flags='recomputable'),
    op('LEAKY_RELU', 42, 'activation', 'leaky_relu', 'y:f x:f',
       ints='n', floats='alpha', flags='recomputable'),
    op('LEAKY_RELU_GRAD', 43, 'activation', 'leaky_relu_grad', 'dx:f dy:f x:f',
       ints='n', floats='alpha'),
    op('CLIP', 44, 'activation', 'clip', 'y:f x:f',
       ints='n', floats='lo hi', flags='recomputable'),
    op('CLIP_GRAD', 45, 'activation', 'clip_grad', 'dx:f dy:f x:f',
       ints='n', floats='lo hi'),
    op('HARD_SIGMOID', 46, 'activation', 'hard_sigmoid', 'y:f x:f',
       ints='n', floats='alpha beta', flags='recomputable'),
    op('HARD_SIGMOID_GRAD', 47, 'activation', 'hard_sigmoid_grad', 'dx:f dy:f x:f',
       ints='n', floats='alpha beta'),
    op('HARD_SWISH', 48, 'activation', 'hard_swish', 'y:f x:f',
       ints='n', flags='recomputable'),
    op('HARD_SWISH_GRAD', 49, 'activation', 'hard_swish_grad', 'dx:f dy:f x:f',
       ints='n'),
    op('SOFTMAX_CE', 50, 'loss', 'softmax_cross_entropy', 'loss:f log_prob:f scores:f labels:i',
       ints='n c'),
    op('SOFTMAX_CE_GRAD', 51, 'loss', 'softmax_cross_entropy_grad', 'dscores:f dloss:f log_prob:f labels:i',
       ints='n c'),
    op('ACCUMULATE', 60, 'optim', 'accumulate', 'buf:f value:f reset:f',
       ints='n'),
    op('SGD', 61, 'optim', 'sgd', 'p:f g:f lr:f',
       ints='n', flags='update'),
    op('ADAMW', 62, 'optim', 'adamw', 'p:f g:f m:f v:f lr:f step_size:f',
       ints='n', floats='beta1 beta2 eps weight_decay', flags='update'),
    op('SGD_GENERAL', 63, 'optim', 'sgd_general', 'p:f g:f lr:f step:? buf:? coef:?',
       ints='n nesterov', floats='momentum dampening weight_decay l1 l2', flags='update'),
    op('ADAMW_GENERAL', 64, 'optim', 'adamw_general', 'p:f g:f m:f v:f lr:f step_size:f coef:?',
       ints='n', floats='beta1 beta2 eps weight_decay l1 l2', flags='update'),
    op('GRAD_NORM_SQUARED', 65, 'optim', 'grad_norm_squared', 'total:f g:f p:f',
       ints='n first', floats='l1 l2'),
    op('CLIP_COEF', 66, 'optim', 'clip_coef', 'at:f',
       ints='', floats='max_norm'),
    op('CONV', 70, 'conv', 'conv', 'y:f x:f w:f b:?',
       ints='n_images groups cin_g cout_g in_h in_w out_h out_w k_h k_w s_h s_w d_h d_w pad_t pad_l'),
    op('CONV_GRAD_INPUT', 71, 'conv', 'conv_grad_input', 'dx:f dy:f w:f',
       ints='n_images groups cin_g cout_g in_h in_w out_h out_w k_h k_w s_h s_w d_h d_w pad_t pad_l'),
    op('CONV_GRAD_WEIGHT', 72, 'conv', 'conv_grad_weight', 'dw:f dy:f x:f reset:?',
       ints='n_images groups cin_g cout_g in_h in_w out_h out_w k_h k_w s_h s_w d_h d_w pad_t pad_l'),
    op('CONV_TRANSPOSE', 73, 'conv', 'conv_transpose', 'y:f x:f w:f b:?',
       ints='n_images groups cin_g cout_g in_h in_w out_h out_w k_h k_w s_h s_w d_h d_w pad_t pad_l'),
    op('CONV_3D', 74, 'conv', 'conv3d', 'y:f x:f w:f b:?',
       ints='n_images groups cin_g cout_g in_d in_h in_w out_d out_h out_w k_d k_h k_w s_d s_h s_w d_d d_h d_w pad_f pad_t pad_l'),
    op('CONV_3D_GRAD_INPUT', 75, 'conv', 'conv3d_grad_input', 'dx:f dy:f w:f',
       ints='n_images groups cin_g cout_g in_d in_h in_w out_d out_h out_w k_d k_h k_w s_d s_h s_w d_d d_h d_w pad_f pad_t pad_l'),
    op('CONV_3D_GRAD_WEIGHT', 76, 'conv', 'conv3d_grad_weight', 'dw:f dy:f x:f reset:?',
       ints='n_images groups cin_g cout_g in_d in_h in_w out_d out_h out_w k_d k_h k_w s_d s_h s_w d_d d_h d_w pad_f pad_t pad_l'),
    op('MAX_POOL', 80, 'pool', 'max_pool', 'y:f x:f',
       ints='planes H W OH OW kH kW sH sW pT pL dH dW'),
    op('MAX_POOL_GRAD', 81, 'pool', 'max_pool_grad', 'dx:f dy:f x:f',
       ints='planes H W OH OW kH kW sH sW pT pL dH dW'),
    op('AVERAGE_POOL', 82, 'pool', 'average_pool', 'y:f x:f',
       ints='planes H W OH OW kH kW sH sW pT pL ch0 ch1 cw0 cw1'),
    op('AVERAGE_POOL_GRAD', 83, 'pool', 'average_pool_grad', 'dx:f dy:f',
       ints='planes H W OH OW kH kW sH sW pT pL ch0 ch1 cw0 cw1'),
    op('BATCH_NORM_TRAINING', 90, 'norm', 'batch_norm_training', 'y:f x:f scale:f bias:f rmean:? rvar:?',
       ints='n c inner', floats='eps momentum', flags='recomputable'),
    op('BATCH_NORM_INFERENCE', 91, 'norm', 'batch_norm_inference', 'y:f x:f scale:f bias:f mean:f var:f',
       ints='n c inner', floats='eps', flags='recomputable'),
    op('CHANNEL_AFFINE', 92, 'norm', 'channel_affine', 'y:f x:f a:f b:?',
       ints='n c inner', flags='recomputable'),
    op('BATCH_NORM_GRAD', 93, 'norm', 'batch_norm_grad', 'dx:? dscale:? dbias:? dy:f x:f scale:f mean:? var:?',
       ints='n c inner', floats='eps'),
    op('DROPOUT', 94, 'norm', 'dropout', 'y:f x:f mask:i state:i',
       ints='n threshold seed stream', floats='scale'),
    op('DROPOUT_GRAD', 95, 'norm', 'dropout_grad', 'dx:f dy:f mask:i',
       ints='n', floats='scale'),
    op('STRIDED_COPY', 100, 'layout', 'strided_copy', 'y:f x:f',
       ints='y0 x0 d0 d1 d2 d3 sy0 sy1 sy2 sy3 sx0 sx1 sx2 sx3'),
    op('STRIDED_ADD', 101, 'layout', 'strided_add', 'y:f x:f',
       ints='y0 x0 d0 d1 d2 d3 sy0 sy1 sy2 sy3 sx0 sx1 sx2 sx3'),
    op('FILL', 102, 'layout', 'fill', 'y:f',
       ints='n', floats='value'),
    op('EXP_LINEAR', 120, 'smooth', 'exp_linear', 'y:f x:f',
       ints='n', floats='alpha scale k', flags='recomputable'),
    op('EXP_LINEAR_GRAD', 121, 'smooth', 'exp_linear_grad', 'dx:f dy:f x:f',
       ints='n', floats='alpha scale k'),
    op('ERF', 122, 'smooth', 'erf', 'y:f x:f',
       ints='n', flags='recomputable'),
    op('ERF_GRAD', 123, 'smooth', 'erf_grad', 'dx:f dy:f x:f',
       ints='n'),
    op('GELU', 124, 'smooth', 'gelu', 'y:f x:f',
       ints='n approximate', flags='recomputable'),
    op('GELU_GRAD', 125, 'smooth', 'gelu_grad', 'dx:f dy:f x:f',
       ints='n approximate'),
    op('SOFTSIGN', 126, 'smooth', 'softsign', 'y:f x:f',
       ints='n', flags='recomputable'),
    op('SOFTSIGN_GRAD', 127, 'smooth', 'softsign_grad', 'dx:f dy:f x:f',
       ints='n'),
    op('SHRINK', 128, 'activation', 'shrink', 'y:f x:f',
       ints='n', floats='lambd bias'),
    op('SHRINK_GRAD', 129, 'activation', 'shrink_grad', 'dx:f dy:f x:f',
       ints='n', floats='lambd'),
    op('MAX', 130, 'elementwise', 'maximum', 'y:f a:f b:f',
       ints='d0 d1 d2 sa0 sa1 sa2 sb0 sb1 sb2'),
    op('MIN', 131, 'elementwise', 'minimum', 'y:f a:f b:f',
       ints='d0 d1 d2 sa0 sa1 sa2 sb0 sb1 sb2'),
    op('COUNT_EQUAL', 132, 'elementwise', 'count_equal', 'y:f a:f b:f',
       ints='d0 d1 d2 sa0 sa1 sa2 sb0 sb1 sb2'),
    op('TIE_SHARE', 133, 'elementwise', 'tie_share', 'dx:f dy:f y:f count:f x:f',
       ints='d0 d1 d2 sx0 sx1 sx2'),
    op('PRELU', 134, 'elementwise', 'prelu', 'y:f a:f b:f',
       ints='d0 d1 d2 sa0 sa1 sa2 sb0 sb1 sb2', flags='recomputable'),
    op('PRELU_GRAD', 135, 'elementwise', 'prelu_grad', 'dx:? dslope:? dy:f x:f slope:f',
       ints='d0 d1 d2 ss0 ss1 ss2'),
    op('POW_TENSOR', 136, 'elementwise', 'power_tensor', 'y:f a:f b:f',
       ints='d0 d1 d2 sa0 sa1 sa2 sb0 sb1 sb2'),
    op('POW_TENSOR_GRAD', 137, 'elementwise', 'power_tensor_grad', 'dx:? dp:? dy:f y:f x:f p:f',
       ints='d0 d1 d2 sx0 sx1 sx2 sp0 sp1 sp2'),
    op('THRESHOLDED_RELU', 138, 'activation', 'thresholded_relu', 'y:f x:f',
       ints='n', floats='alpha', flags='recomputable'),
    op('THRESHOLDED_RELU_GRAD', 139, 'activation', 'thresholded_relu_grad', 'dx:f dy:f x:f',
       ints='n', floats='alpha'),
    op('GROUP_NORM', 140, 'group_norm', 'group_norm', 'y:f x:f scale:? bias:?',
       ints='rows groups cpb inner', floats='eps', flags='recomputable'),
    op('GROUP_NORM_GRAD', 141, 'group_norm', 'group_norm_grad', 'dx:? dscale:? dbias:? dy:f x:f scale:?',
       ints='rows groups cpb inner', floats='eps'),
    op('GATHER_ROWS', 150, 'gather', 'gather_rows', 'y:f data:f indices:i',
       ints='outer size inner count'),
    op('GATHER_ROWS_GRAD', 151, 'gather', 'gather_rows_grad', 'dx:f dy:f indices:i',
       ints='outer size inner count'),
    op('RESIZE_NEAREST', 160, 'resize', 'resize_nearest', 'y:f x:f',
       ints='planes in_h in_w out_h out_w *'),
    op('RESIZE_NEAREST_GRAD', 161, 'resize', 'resize_nearest_grad', 'y:f x:f',
       ints='planes in_h in_w out_h out_w *'),
    op('RESIZE_LINEAR', 162, 'resize', 'resize_linear', 'y:f x:f',
       ints='planes in_h in_w out_h out_w *', floats='*'),
    op('RESIZE_LINEAR_GRAD', 163, 'resize', 'resize_linear_grad', 'y:f x:f',
       ints='planes in_h in_w out_h out_w *', floats='*'),
    op('GRU', 170, 'recurrent', 'gru', 'y:f y_h:? saved:f x:f w:f r:f b:? h0:?',
       ints='steps batch n_in hidden dirs reverse sx_t sx_n sy_t sy_d sy_n sh_d sh_n keep'),
    op('GRU_GRAD', 171, 'recurrent', 'gru_grad', 'dx:? dw:? dr:? db:? dh0:? dh:f saved:f x:f w:f r:f h0:? y:f dy:? dy_h:?',
       ints='steps batch n_in hidden dirs reverse sx_t sx_n sy_t sy_d sy_n sh_d sh_n keep'),
    op('LSTM', 172, 'recurrent', 'lstm', 'y:f y_h:? y_c:? saved:f x:f w:f r:f b:? h0:? c0:? p:?',
       ints='steps batch n_in hidden dirs reverse sx_t sx_n sy_t sy_d sy_n sh_d sh_n keep'),
    op('LSTM_GRAD', 173, 'recurrent', 'lstm_grad', 'dx:? dw:? dr:? db:? dh0:? dc0:? dp:? dh:f saved:f x:f w:f r:f h0:? c0:? p:? y:f dy:? dy_h:? dy_c:?',
       ints='steps batch n_in hidden dirs reverse sx_t sx_n sy_t sy_d sy_n sh_d sh_n keep'),
    op('FAKE_QUANT', 200, 'quant', 'fake_quant', 'y:f x:f s:f z:f',
       ints='outer channels inner qmin qmax'),
    op('FAKE_QUANT_GRAD', 201, 'quant', 'fake_quant_grad', 'dx:f dy:f x:f s:f z:f',
       ints='outer channels inner qmin qmax'),
    op('ABS_MAX_SCALE', 202, 'quant', 'abs_max_scale', 'scale:f w:f',
       ints='outer channels inner', floats='qmax eps'),
    op('OBSERVE_MIN_MAX', 203, 'quant', 'observe_min_max', 's:f z:f r:f x:f',
       ints='n qmin qmax', floats='momentum eps'),
    op('QUANT_PARAMS', 204, 'quant', 'quant_params', 's:f z:f r:f',
       ints='qmin qmax', floats='eps'),
    op('FOLD_BATCH_NORM', 205, 'quant', 'fold_batch_norm', 'w2:f b2:f w:f b:? gamma:f beta:f mean:f var:f',
       ints='outer channels inner', floats='eps'),
    op('QUANTIZE_WEIGHT', 206, 'quant', 'quantize_weight', 'q:b w:f scale:f',
       ints='outer channels inner'),
    op('QUANTIZE_BIAS', 207, 'quant', 'quantize_bias', 'q:i b:f x_scale:f w_scale:f',
       ints='channels'),
    op('REQUANT_HEADER', 208, 'quant', 'requant_header', 'h:i zx:f zb:? zy:f sy:f',
       ints='qmin qmax has_min has_max', floats='cmin cmax'),
    op('ZERO_POINT_INT', 209, 'quant', 'zero_point_int', 'y:i x:f',
       ints=''),
    op('QUANTIZE_LINEAR', 220, 'qlinear', 'quantize_linear', 'y:b x:f qp:f',
       ints='n qmin qmax'),
    op('DEQUANTIZE_LINEAR', 221, 'qlinear', 'dequantize_linear', 'y:f x:b qp:f',
       ints='n signed'),
    op('QLINEAR_GEMM', 222, 'qlinear', 'qlinear_gemm', 'y:b x:b w:w bias:k req:i',
       ints='m k n sx_m sx_k sw_k sw_n x_signed y_signed'),
    op('QLINEAR_CONV', 223, 'qlinear', 'qlinear_conv', 'y:b x:b w:w bias:k req:i scratch:i',
       ints='n_images groups cin_g cout_g in_h in_w out_h out_w k_h k_w s_h s_w d_h d_w pad_t pad_l x_signed y_signed'),
    op('QLINEAR_GLOBAL_AVERAGE_POOL', 224, 'qlinear', 'qlinear_global_average_pool', 'y:b x:b req:i',
       ints='planes count x_signed y_signed'),
    op('QLINEAR_MAX_POOL', 225, 'qlinear', 'qlinear_max_pool', 'y:b x:b',
       ints='planes H W OH OW kH kW sH sW pT pL signed'),
    op('QLINEAR_AVERAGE_POOL', 226, 'qlinear', 'qlinear_average_pool', 'y:b x:b req:i',
       ints='planes H W OH OW kH kW sH sW pT pL ch0 ch1 cw0 cw1 x_signed y_signed'),
    op('QLINEAR_ADD', 227, 'qlinear', 'qlinear_add', 'y:b a:b b:b req:i',
       ints='n a_signed b_signed y_signed'),
    op('QLINEAR_LOOKUP', 228, 'qlinear', 'qlinear_lookup', 'y:b x:b table:b',
       ints='n'),
    op('RELU_MASKED', 240, 'activation', 'relu_masked', 'y:f x:f mask:i',
       ints='n'),
    op('RELU_MASK_GRAD', 241, 'activation', 'relu_mask_grad', 'dx:f dy:f mask:i',
       ints='n'),
    op('INT_GEMM_LOGITS', 242, 'inttrain', 'int_gemm_logits', 'z:i x:b w:b bias:i req:i',
       ints='m k n x_signed'),
    op('INT_SOFTMAX_CE', 243, 'inttrain', 'int_softmax_ce', 'z:i g:i loss:i label:i table:i',
       ints='m n'),
    op('INT_GEMM_UPDATE', 244, 'inttrain', 'int_gemm_update', 'w:b bias:i x:b g:i rates:i random:k',
       ints='m k n x_signed'),
    op('INT_GEMM_GRAD_INPUT', 245, 'inttrain', 'int_gemm_grad_input', 'd:i g:i w:b factors:i',
       ints='m k n'),
    op('INT_CONV1X1_UPDATE', 246, 'inttrain', 'int_conv1x1_update', 'w:b bias:i x:b y:b d:i req:i rates:i random:k',
       ints='m cin cout plane x_signed y_signed'),
    op('INT_GEMM_UPDATE_MOMENTUM', 247, 'inttrain', 'int_gemm_update_momentum', 'w:b bias:i x:b g:i rates:i random:k vw:b vb:i',
       ints='m k n x_signed mu'),
    op('INT_POOL_GRAD', 248, 'intgrad', 'int_pool_grad', 'g:i d:i',
       ints='m channels plane'),
    op('INT_CLAMP_BIAS_GRAD', 249, 'intgrad', 'int_clamp_bias_grad', 'g:i mask:b bias:i rates:i random:k w:w',
       ints='m channels plane'),
    op('INT_CONV_GRAD_INPUT', 250, 'intgrad', 'int_conv_grad_input', 'gx:i g:i w:w',
       ints='m groups cin_g cout_g in_h in_w out_h out_w k_h k_w s_h s_w d_h d_w pad_t pad_l'),
    op('INT_CONV_UPDATE', 251, 'intgrad', 'int_conv_update', 'w:b x:b g:i rates:i random:k',
       ints='m groups cin_g cout_g in_h in_w out_h out_w k_h k_w s_h s_w d_h d_w pad_t pad_l x_signed'),
    op('INT_CLAMP_MASK', 252, 'intgrad', 'int_clamp_mask', 'mask:b y:b req:i',
       ints='count y_signed'),
)

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
    "inttrain": "integer training of an int8 classifier and the 1x1 conv before it (viper: inttrain_viper.py)",
    "intgrad": "integer backward through frozen int8 convolutions: the sparse update (viper: intgrad_viper.py)",
}
assert set(FAMILY_NOTES) == set(FAMILIES), "every family needs its line in FAMILY_NOTES"
