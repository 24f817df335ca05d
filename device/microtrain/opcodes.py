# Device op codes: the kernel table the host's lowering targets.
# (generated from host/microtrain_host/contract/ by `python -m microtrain_host.contract.generate`; do not edit)
from microtrain.errors import const

GEMM = const(1)
GEMM_ACCUMULATE = const(2)
BATCHED_GEMM = const(3)
ADD = const(10)
SUB = const(11)
MUL = const(12)
DIV = const(13)
EXPAND = const(14)
COPY = const(15)
NEG = const(20)
ABS = const(21)
SIGN = const(22)
EXP = const(23)
LOG = const(24)
SQRT = const(25)
POW = const(26)
RELU = const(30)
SIGMOID = const(31)
TANH = const(32)
RELU_GRAD = const(33)
SIGMOID_GRAD = const(34)
TANH_GRAD = const(35)
SOFTMAX = const(36)
LOG_SOFTMAX = const(37)
SOFTMAX_GRAD = const(38)
LOG_SOFTMAX_GRAD = const(39)
REDUCE_SUM = const(40)
SOFTPLUS = const(41)
LEAKY_RELU = const(42)
LEAKY_RELU_GRAD = const(43)
CLIP = const(44)
CLIP_GRAD = const(45)
HARD_SIGMOID = const(46)
HARD_SIGMOID_GRAD = const(47)
HARD_SWISH = const(48)
HARD_SWISH_GRAD = const(49)
SOFTMAX_CE = const(50)
SOFTMAX_CE_GRAD = const(51)
ACCUMULATE = const(60)
SGD = const(61)
ADAMW = const(62)
SGD_GENERAL = const(63)
ADAMW_GENERAL = const(64)
GRAD_NORM_SQUARED = const(65)
CLIP_COEF = const(66)
CONV = const(70)
CONV_GRAD_INPUT = const(71)
CONV_GRAD_WEIGHT = const(72)
CONV_TRANSPOSE = const(73)
CONV_3D = const(74)
CONV_3D_GRAD_INPUT = const(75)
CONV_3D_GRAD_WEIGHT = const(76)
MAX_POOL = const(80)
MAX_POOL_GRAD = const(81)
AVERAGE_POOL = const(82)
AVERAGE_POOL_GRAD = const(83)
BATCH_NORM_TRAINING = const(90)
BATCH_NORM_INFERENCE = const(91)
CHANNEL_AFFINE = const(92)
BATCH_NORM_GRAD = const(93)
DROPOUT = const(94)
DROPOUT_GRAD = const(95)
STRIDED_COPY = const(100)
STRIDED_ADD = const(101)
FILL = const(102)
EXP_LINEAR = const(120)
EXP_LINEAR_GRAD = const(121)
ERF = const(122)
ERF_GRAD = const(123)
GELU = const(124)
GELU_GRAD = const(125)
SOFTSIGN = const(126)
SOFTSIGN_GRAD = const(127)
SHRINK = const(128)
SHRINK_GRAD = const(129)
MAX = const(130)
MIN = const(131)
COUNT_EQUAL = const(132)
TIE_SHARE = const(133)
PRELU = const(134)
PRELU_GRAD = const(135)
POW_TENSOR = const(136)
POW_TENSOR_GRAD = const(137)
THRESHOLDED_RELU = const(138)
THRESHOLDED_RELU_GRAD = const(139)
GROUP_NORM = const(140)
GROUP_NORM_GRAD = const(141)
GATHER_ROWS = const(150)
GATHER_ROWS_GRAD = const(151)
RESIZE_NEAREST = const(160)
RESIZE_NEAREST_GRAD = const(161)
RESIZE_LINEAR = const(162)
RESIZE_LINEAR_GRAD = const(163)
GRU = const(170)
GRU_GRAD = const(171)
LSTM = const(172)
LSTM_GRAD = const(173)
FAKE_QUANT = const(200)
FAKE_QUANT_GRAD = const(201)
ABS_MAX_SCALE = const(202)
OBSERVE_MIN_MAX = const(203)
QUANT_PARAMS = const(204)
FOLD_BATCH_NORM = const(205)
QUANTIZE_WEIGHT = const(206)
QUANTIZE_BIAS = const(207)
REQUANT_HEADER = const(208)
ZERO_POINT_INT = const(209)
QUANTIZE_LINEAR = const(220)
DEQUANTIZE_LINEAR = const(221)
QLINEAR_GEMM = const(222)
QLINEAR_CONV = const(223)
QLINEAR_GLOBAL_AVERAGE_POOL = const(224)
QLINEAR_MAX_POOL = const(225)
QLINEAR_AVERAGE_POOL = const(226)
QLINEAR_ADD = const(227)
QLINEAR_LOOKUP = const(228)
RELU_MASKED = const(240)
RELU_MASK_GRAD = const(241)
INT_GEMM_LOGITS = const(242)
INT_SOFTMAX_CE = const(243)
INT_GEMM_UPDATE = const(244)
INT_GEMM_GRAD_INPUT = const(245)
INT_CONV1X1_UPDATE = const(246)
INT_GEMM_UPDATE_MOMENTUM = const(247)
INT_POOL_GRAD = const(248)
INT_CLAMP_BIAS_GRAD = const(249)
INT_CONV_GRAD_INPUT = const(250)
INT_CONV_UPDATE = const(251)
INT_CLAMP_MASK = const(252)

# op code -> (kernel family module, function, tensor kinds, int count, float count)
# Tensor kinds: "f" float arena, "i" int arena, "?" float arena or no tensor, "b" byte
# arena (int8 / uint8; the kernel's args then start with the byte arena), "k" int arena or
# no tensor, "w" an int8 weight (byte arena, or in place where the blob is: the buffer it is
# in then ends the kernel's args). A count of -1: as many as the step carries (tables that
# come with the geometry); the kernel's checker checks the exact counts (StepCheck.counts).
SIGNATURES = {
    GEMM: ("dense", "gemm", "fff?", 9, 2),
    GEMM_ACCUMULATE: ("dense", "gemm_accumulate", "ffff", 7, 1),
    BATCHED_GEMM: ("dense", "batched_gemm", "fff", 16, 1),
    ADD: ("elementwise", "add", "fff", 9, 0),
    SUB: ("elementwise", "sub", "fff", 9, 0),
    MUL: ("elementwise", "mul", "fff", 9, 0),
    DIV: ("elementwise", "div", "fff", 9, 0),
    EXPAND: ("elementwise", "expand", "ff", 6, 0),
    COPY: ("elementwise", "copy", "ff", 1, 0),
    NEG: ("elementwise", "neg", "ff", 1, 0),
    ABS: ("elementwise", "absolute", "ff", 1, 0),
    SIGN: ("elementwise", "sign", "ff", 1, 0),
    EXP: ("elementwise", "exp", "ff", 1, 0),
    LOG: ("elementwise", "log", "ff", 1, 0),
    SQRT: ("elementwise", "sqrt", "ff", 1, 0),
    POW: ("elementwise", "power", "ff", 1, 1),
    RELU: ("activation", "relu", "ff", 1, 0),
    SIGMOID: ("activation", "sigmoid", "ff", 1, 0),
    TANH: ("activation", "tanh", "ff", 1, 0),
    RELU_GRAD: ("activation", "relu_grad", "fff", 1, 0),
    SIGMOID_GRAD: ("activation", "sigmoid_grad", "fff", 1, 0),
    TANH_GRAD: ("activation", "tanh_grad", "fff", 1, 0),
    SOFTMAX: ("activation", "softmax", "ff", 3, 0),
    LOG_SOFTMAX: ("activation", "log_softmax", "ff", 3, 0),
    SOFTMAX_GRAD: ("activation", "softmax_grad", "fff", 3, 0),
    LOG_SOFTMAX_GRAD: ("activation", "log_softmax_grad", "fff", 3, 0),
    REDUCE_SUM: ("reduce", "reduce_sum", "ff", 7, 1),
    SOFTPLUS: ("activation", "softplus", "ff", 1, 0),
    LEAKY_RELU: ("activation", "leaky_relu", "ff", 1, 1),
    LEAKY_RELU_GRAD: ("activation", "leaky_relu_grad", "fff", 1, 1),
    CLIP: ("activation", "clip", "ff", 1, 2),
    CLIP_GRAD: ("activation", "clip_grad", "fff", 1, 2),
    HARD_SIGMOID: ("activation", "hard_sigmoid", "ff", 1, 2),
    HARD_SIGMOID_GRAD: ("activation", "hard_sigmoid_grad", "fff", 1, 2),
    HARD_SWISH: ("activation", "hard_swish", "ff", 1, 0),
    HARD_SWISH_GRAD: ("activation", "hard_swish_grad", "fff", 1, 0),
    SOFTMAX_CE: ("loss", "softmax_cross_entropy", "fffi", 2, 0),
    SOFTMAX_CE_GRAD: ("loss", "softmax_cross_entropy_grad", "fffi", 2, 0),
    ACCUMULATE: ("optim", "accumulate", "fff", 1, 0),
    SGD: ("optim", "sgd", "fff", 1, 0),
    ADAMW: ("optim", "adamw", "ffffff", 1, 4),
    SGD_GENERAL: ("optim", "sgd_general", "fff???", 2, 5),
    ADAMW_GENERAL: ("optim", "adamw_general", "ffffff?", 1, 6),
    GRAD_NORM_SQUARED: ("optim", "grad_norm_squared", "fff", 2, 2),
    CLIP_COEF: ("optim", "clip_coef", "f", 0, 1),
    CONV: ("conv", "conv", "fff?", 16, 0),
    CONV_GRAD_INPUT: ("conv", "conv_grad_input", "fff", 16, 0),
    CONV_GRAD_WEIGHT: ("conv", "conv_grad_weight", "fff?", 16, 0),
    CONV_TRANSPOSE: ("conv", "conv_transpose", "fff?", 16, 0),
    CONV_3D: ("conv", "conv3d", "fff?", 22, 0),
    CONV_3D_GRAD_INPUT: ("conv", "conv3d_grad_input", "fff", 22, 0),
    CONV_3D_GRAD_WEIGHT: ("conv", "conv3d_grad_weight", "fff?", 22, 0),
    MAX_POOL: ("pool", "max_pool", "ff", 13, 0),
    MAX_POOL_GRAD: ("pool", "max_pool_grad", "fff", 13, 0),
    AVERAGE_POOL: ("pool", "average_pool", "ff", 15, 0),
    AVERAGE_POOL_GRAD: ("pool", "average_pool_grad", "ff", 15, 0),
    BATCH_NORM_TRAINING: ("norm", "batch_norm_training", "ffff??", 3, 2),
    BATCH_NORM_INFERENCE: ("norm", "batch_norm_inference", "ffffff", 3, 1),
    CHANNEL_AFFINE: ("norm", "channel_affine", "fff?", 3, 0),
    BATCH_NORM_GRAD: ("norm", "batch_norm_grad", "???fff??", 3, 1),
    DROPOUT: ("norm", "dropout", "ffii", 4, 1),
    DROPOUT_GRAD: ("norm", "dropout_grad", "ffi", 1, 1),
    STRIDED_COPY: ("layout", "strided_copy", "ff", 14, 0),
    STRIDED_ADD: ("layout", "strided_add", "ff", 14, 0),
    FILL: ("layout", "fill", "f", 1, 1),
    EXP_LINEAR: ("smooth", "exp_linear", "ff", 1, 3),
    EXP_LINEAR_GRAD: ("smooth", "exp_linear_grad", "fff", 1, 3),
    ERF: ("smooth", "erf", "ff", 1, 0),
    ERF_GRAD: ("smooth", "erf_grad", "fff", 1, 0),
    GELU: ("smooth", "gelu", "ff", 2, 0),
    GELU_GRAD: ("smooth", "gelu_grad", "fff", 2, 0),
    SOFTSIGN: ("smooth", "softsign", "ff", 1, 0),
    SOFTSIGN_GRAD: ("smooth", "softsign_grad", "fff", 1, 0),
    SHRINK: ("activation", "shrink", "ff", 1, 2),
    SHRINK_GRAD: ("activation", "shrink_grad", "fff", 1, 1),
    MAX: ("elementwise", "maximum", "fff", 9, 0),
    MIN: ("elementwise", "minimum", "fff", 9, 0),
    COUNT_EQUAL: ("elementwise", "count_equal", "fff", 9, 0),
    TIE_SHARE: ("elementwise", "tie_share", "fffff", 6, 0),
    PRELU: ("elementwise", "prelu", "fff", 9, 0),
    PRELU_GRAD: ("elementwise", "prelu_grad", "??fff", 6, 0),
    POW_TENSOR: ("elementwise", "power_tensor", "fff", 9, 0),
    POW_TENSOR_GRAD: ("elementwise", "power_tensor_grad", "??ffff", 9, 0),
    THRESHOLDED_RELU: ("activation", "thresholded_relu", "ff", 1, 1),
    THRESHOLDED_RELU_GRAD: ("activation", "thresholded_relu_grad", "fff", 1, 1),
    GROUP_NORM: ("group_norm", "group_norm", "ff??", 4, 1),
    GROUP_NORM_GRAD: ("group_norm", "group_norm_grad", "???ff?", 4, 1),
    GATHER_ROWS: ("gather", "gather_rows", "ffi", 4, 0),
    GATHER_ROWS_GRAD: ("gather", "gather_rows_grad", "ffi", 4, 0),
    RESIZE_NEAREST: ("resize", "resize_nearest", "ff", -1, 0),
    RESIZE_NEAREST_GRAD: ("resize", "resize_nearest_grad", "ff", -1, 0),
    RESIZE_LINEAR: ("resize", "resize_linear", "ff", -1, -1),
    RESIZE_LINEAR_GRAD: ("resize", "resize_linear_grad", "ff", -1, -1),
    GRU: ("recurrent", "gru", "f?ffff??", 14, 0),
    GRU_GRAD: ("recurrent", "gru_grad", "?????fffff?f??", 14, 0),
    LSTM: ("recurrent", "lstm", "f??ffff????", 14, 0),
    LSTM_GRAD: ("recurrent", "lstm_grad", "???????fffff???f???", 14, 0),
    FAKE_QUANT: ("quant", "fake_quant", "ffff", 5, 0),
    FAKE_QUANT_GRAD: ("quant", "fake_quant_grad", "fffff", 5, 0),
    ABS_MAX_SCALE: ("quant", "abs_max_scale", "ff", 3, 2),
    OBSERVE_MIN_MAX: ("quant", "observe_min_max", "ffff", 3, 2),
    QUANT_PARAMS: ("quant", "quant_params", "fff", 2, 1),
    FOLD_BATCH_NORM: ("quant", "fold_batch_norm", "fff?ffff", 3, 1),
    QUANTIZE_WEIGHT: ("quant", "quantize_weight", "bff", 3, 0),
    QUANTIZE_BIAS: ("quant", "quantize_bias", "ifff", 1, 0),
    REQUANT_HEADER: ("quant", "requant_header", "if?ff", 4, 2),
    ZERO_POINT_INT: ("quant", "zero_point_int", "if", 0, 0),
    QUANTIZE_LINEAR: ("qlinear", "quantize_linear", "bff", 3, 0),
    DEQUANTIZE_LINEAR: ("qlinear", "dequantize_linear", "fbf", 2, 0),
    QLINEAR_GEMM: ("qlinear", "qlinear_gemm", "bbwki", 9, 0),
    QLINEAR_CONV: ("qlinear", "qlinear_conv", "bbwkii", 18, 0),
    QLINEAR_GLOBAL_AVERAGE_POOL: ("qlinear", "qlinear_global_average_pool", "bbi", 4, 0),
    QLINEAR_MAX_POOL: ("qlinear", "qlinear_max_pool", "bb", 12, 0),
    QLINEAR_AVERAGE_POOL: ("qlinear", "qlinear_average_pool", "bbi", 17, 0),
    QLINEAR_ADD: ("qlinear", "qlinear_add", "bbbi", 4, 0),
    QLINEAR_LOOKUP: ("qlinear", "qlinear_lookup", "bbb", 1, 0),
    RELU_MASKED: ("activation", "relu_masked", "ffi", 1, 0),
    RELU_MASK_GRAD: ("activation", "relu_mask_grad", "ffi", 1, 0),
    INT_GEMM_LOGITS: ("inttrain", "int_gemm_logits", "ibbii", 4, 0),
    INT_SOFTMAX_CE: ("inttrain", "int_softmax_ce", "iiiii", 2, 0),
    INT_GEMM_UPDATE: ("inttrain", "int_gemm_update", "bibiik", 4, 0),
    INT_GEMM_GRAD_INPUT: ("inttrain", "int_gemm_grad_input", "iibi", 3, 0),
    INT_CONV1X1_UPDATE: ("inttrain", "int_conv1x1_update", "bibbiiik", 6, 0),
    INT_GEMM_UPDATE_MOMENTUM: ("inttrain", "int_gemm_update_momentum", "bibiikbi", 5, 0),
    INT_POOL_GRAD: ("intgrad", "int_pool_grad", "ii", 3, 0),
    INT_CLAMP_BIAS_GRAD: ("intgrad", "int_clamp_bias_grad", "ibiikw", 3, 0),
    INT_CONV_GRAD_INPUT: ("intgrad", "int_conv_grad_input", "iiw", 16, 0),
    INT_CONV_UPDATE: ("intgrad", "int_conv_update", "bbiik", 17, 0),
    INT_CLAMP_MASK: ("intgrad", "int_clamp_mask", "bbi", 2, 0),
}


def kernel_module(family):
    # Import only the kernel families a model uses, so a board can carry only those files.
    if family == "activation":
        from microtrain.kernels import activation as module
    elif family == "conv":
        from microtrain.kernels import conv as module
    elif family == "dense":
        from microtrain.kernels import dense as module
    elif family == "elementwise":
        from microtrain.kernels import elementwise as module
    elif family == "gather":
        from microtrain.kernels import gather as module
    elif family == "group_norm":
        from microtrain.kernels import group_norm as module
    elif family == "intgrad":
        from microtrain.kernels import intgrad as module
    elif family == "inttrain":
        from microtrain.kernels import inttrain as module
    elif family == "layout":
        from microtrain.kernels import layout as module
    elif family == "loss":
        from microtrain.kernels import loss as module
    elif family == "norm":
        from microtrain.kernels import norm as module
    elif family == "optim":
        from microtrain.kernels import optim as module
    elif family == "pool":
        from microtrain.kernels import pool as module
    elif family == "qlinear":
        from microtrain.kernels import qlinear as module
    elif family == "quant":
        from microtrain.kernels import quant as module
    elif family == "recurrent":
        from microtrain.kernels import recurrent as module
    elif family == "reduce":
        from microtrain.kernels import reduce as module
    elif family == "resize":
        from microtrain.kernels import resize as module
    elif family == "smooth":
        from microtrain.kernels import smooth as module
    else:
        raise ImportError("no kernel family " + family)
    return module
