# Device op codes: the kernel each op code names, as the host's lowering targets them.
# (generated from host/microtrain_host/contract/ by `python -m microtrain_host.contract.generate`; do not edit)

# One row per op code: "<code> <kernel family module> <function> <tensor kinds> <int
# count> <float count>". Tensor kinds: "f" float arena, "i" int arena, "?" float
# arena or no tensor, "b" byte arena (int8 / uint8; the kernel's args then start with the
# byte arena), "k" int arena or no tensor, "w" an int8 weight (byte arena, or in place
# where the blob is: the buffer it is in then ends the kernel's args). A count of -1: as many
# as the step carries (tables that come with the geometry); the kernel's checker checks the
# exact counts (StepCheck.counts). One string constant, not a dict: it stays in the .mpy
# (in flash when frozen or in a ROM filesystem) where a dict of tuples took ~11 KB of heap;
# it is read only while a blob loads. The op names are the host's (opcodes.py there).
_ROWS = (
    ""  # a runtime trimmed to a model keeps the rows of its op codes only
    "\n1 dense gemm fff? 9 2"  # GEMM
    "\n2 dense gemm_accumulate ffff 7 1"  # GEMM_ACCUMULATE
    "\n3 dense batched_gemm fff 16 1"  # BATCHED_GEMM
    "\n10 elementwise add fff 9 0"  # ADD
    "\n11 elementwise sub fff 9 0"  # SUB
    "\n12 elementwise mul fff 9 0"  # MUL
    "\n13 elementwise div fff 9 0"  # DIV
    "\n14 elementwise expand ff 6 0"  # EXPAND
    "\n15 elementwise copy ff 1 0"  # COPY
    "\n20 elementwise neg ff 1 0"  # NEG
    "\n21 elementwise absolute ff 1 0"  # ABS
    "\n22 elementwise sign ff 1 0"  # SIGN
    "\n23 elementwise exp ff 1 0"  # EXP
    "\n24 elementwise log ff 1 0"  # LOG
    "\n25 elementwise sqrt ff 1 0"  # SQRT
    "\n26 elementwise power ff 1 1"  # POW
    "\n30 activation relu ff 1 0"  # RELU
    "\n31 activation sigmoid ff 1 0"  # SIGMOID
    "\n32 activation tanh ff 1 0"  # TANH
    "\n33 activation relu_grad fff 1 0"  # RELU_GRAD
    "\n34 activation sigmoid_grad fff 1 0"  # SIGMOID_GRAD
    "\n35 activation tanh_grad fff 1 0"  # TANH_GRAD
    "\n36 activation softmax ff 3 0"  # SOFTMAX
    "\n37 activation log_softmax ff 3 0"  # LOG_SOFTMAX
    "\n38 activation softmax_grad fff 3 0"  # SOFTMAX_GRAD
    "\n39 activation log_softmax_grad fff 3 0"  # LOG_SOFTMAX_GRAD
    "\n40 reduce reduce_sum ff 7 1"  # REDUCE_SUM
    "\n41 activation softplus ff 1 0"  # SOFTPLUS
    "\n42 activation leaky_relu ff 1 1"  # LEAKY_RELU
    "\n43 activation leaky_relu_grad fff 1 1"  # LEAKY_RELU_GRAD
    "\n44 activation clip ff 1 2"  # CLIP
    "\n45 activation clip_grad fff 1 2"  # CLIP_GRAD
    "\n46 activation hard_sigmoid ff 1 2"  # HARD_SIGMOID
    "\n47 activation hard_sigmoid_grad fff 1 2"  # HARD_SIGMOID_GRAD
    "\n48 activation hard_swish ff 1 0"  # HARD_SWISH
    "\n49 activation hard_swish_grad fff 1 0"  # HARD_SWISH_GRAD
    "\n50 loss softmax_cross_entropy fffi 2 0"  # SOFTMAX_CE
    "\n51 loss softmax_cross_entropy_grad fffi 2 0"  # SOFTMAX_CE_GRAD
    "\n60 optim accumulate fff 1 0"  # ACCUMULATE
    "\n61 optim sgd fff 1 0"  # SGD
    "\n62 optim adamw ffffff 1 4"  # ADAMW
    "\n63 optim sgd_general fff??? 2 5"  # SGD_GENERAL
    "\n64 optim adamw_general ffffff? 1 6"  # ADAMW_GENERAL
    "\n65 optim grad_norm_squared fff 2 2"  # GRAD_NORM_SQUARED
    "\n66 optim clip_coef f 0 1"  # CLIP_COEF
    "\n70 conv conv fff? 16 0"  # CONV
    "\n71 conv conv_grad_input fff 16 0"  # CONV_GRAD_INPUT
    "\n72 conv conv_grad_weight fff? 16 0"  # CONV_GRAD_WEIGHT
    "\n73 conv conv_transpose fff? 16 0"  # CONV_TRANSPOSE
    "\n74 conv conv3d fff? 22 0"  # CONV_3D
    "\n75 conv conv3d_grad_input fff 22 0"  # CONV_3D_GRAD_INPUT
    "\n76 conv conv3d_grad_weight fff? 22 0"  # CONV_3D_GRAD_WEIGHT
    "\n80 pool max_pool ff 13 0"  # MAX_POOL
    "\n81 pool max_pool_grad fff 13 0"  # MAX_POOL_GRAD
    "\n82 pool average_pool ff 15 0"  # AVERAGE_POOL
    "\n83 pool average_pool_grad ff 15 0"  # AVERAGE_POOL_GRAD
    "\n90 norm batch_norm_training ffff?? 3 2"  # BATCH_NORM_TRAINING
    "\n91 norm batch_norm_inference ffffff 3 1"  # BATCH_NORM_INFERENCE
    "\n92 norm channel_affine fff? 3 0"  # CHANNEL_AFFINE
    "\n93 norm batch_norm_grad ???fff?? 3 1"  # BATCH_NORM_GRAD
    "\n94 norm dropout ffii 4 1"  # DROPOUT
    "\n95 norm dropout_grad ffi 1 1"  # DROPOUT_GRAD
    "\n100 layout strided_copy ff 14 0"  # STRIDED_COPY
    "\n101 layout strided_add ff 14 0"  # STRIDED_ADD
    "\n102 layout fill f 1 1"  # FILL
    "\n120 smooth exp_linear ff 1 3"  # EXP_LINEAR
    "\n121 smooth exp_linear_grad fff 1 3"  # EXP_LINEAR_GRAD
    "\n122 smooth erf ff 1 0"  # ERF
    "\n123 smooth erf_grad fff 1 0"  # ERF_GRAD
    "\n124 smooth gelu ff 2 0"  # GELU
    "\n125 smooth gelu_grad fff 2 0"  # GELU_GRAD
    "\n126 smooth softsign ff 1 0"  # SOFTSIGN
    "\n127 smooth softsign_grad fff 1 0"  # SOFTSIGN_GRAD
    "\n128 activation shrink ff 1 2"  # SHRINK
    "\n129 activation shrink_grad fff 1 1"  # SHRINK_GRAD
    "\n130 elementwise maximum fff 9 0"  # MAX
    "\n131 elementwise minimum fff 9 0"  # MIN
    "\n132 elementwise count_equal fff 9 0"  # COUNT_EQUAL
    "\n133 elementwise tie_share fffff 6 0"  # TIE_SHARE
    "\n134 elementwise prelu fff 9 0"  # PRELU
    "\n135 elementwise prelu_grad ??fff 6 0"  # PRELU_GRAD
    "\n136 elementwise power_tensor fff 9 0"  # POW_TENSOR
    "\n137 elementwise power_tensor_grad ??ffff 9 0"  # POW_TENSOR_GRAD
    "\n138 activation thresholded_relu ff 1 1"  # THRESHOLDED_RELU
    "\n139 activation thresholded_relu_grad fff 1 1"  # THRESHOLDED_RELU_GRAD
    "\n140 group_norm group_norm ff?? 4 1"  # GROUP_NORM
    "\n141 group_norm group_norm_grad ???ff? 4 1"  # GROUP_NORM_GRAD
    "\n150 gather gather_rows ffi 4 0"  # GATHER_ROWS
    "\n151 gather gather_rows_grad ffi 4 0"  # GATHER_ROWS_GRAD
    "\n160 resize resize_nearest ff -1 0"  # RESIZE_NEAREST
    "\n161 resize resize_nearest_grad ff -1 0"  # RESIZE_NEAREST_GRAD
    "\n162 resize resize_linear ff -1 -1"  # RESIZE_LINEAR
    "\n163 resize resize_linear_grad ff -1 -1"  # RESIZE_LINEAR_GRAD
    "\n170 recurrent gru f?ffff?? 14 0"  # GRU
    "\n171 recurrent gru_grad ?????fffff?f?? 14 0"  # GRU_GRAD
    "\n172 recurrent lstm f??ffff???? 14 0"  # LSTM
    "\n173 recurrent lstm_grad ???????fffff???f??? 14 0"  # LSTM_GRAD
    "\n190 intflow int_grad_sum iiii 1 0"  # INT_GRAD_SUM
    "\n191 intflow int_add_grad ikib 4 0"  # INT_ADD_GRAD
    "\n192 intflow int_max_pool_grad iib 12 0"  # INT_MAX_POOL_GRAD
    "\n193 intflow int_average_pool_grad iii 15 0"  # INT_AVERAGE_POOL_GRAD
    "\n194 intloss int_mse iiibi 3 0"  # INT_MSE
    "\n195 intloss int_bce_logits iiiii 2 0"  # INT_BCE_LOGITS
    "\n196 qlinear qlinear_concat bbi 6 0"  # QLINEAR_CONCAT
    "\n197 intflow int_concat_grad iibbi 5 0"  # INT_CONCAT_GRAD
    "\n200 quant fake_quant ffff 5 0"  # FAKE_QUANT
    "\n201 quant fake_quant_grad fffff 5 0"  # FAKE_QUANT_GRAD
    "\n202 quant abs_max_scale ff 3 2"  # ABS_MAX_SCALE
    "\n203 quant observe_min_max ffff 3 2"  # OBSERVE_MIN_MAX
    "\n204 quant quant_params fff 2 1"  # QUANT_PARAMS
    "\n205 quant fold_batch_norm fff?ffff 3 1"  # FOLD_BATCH_NORM
    "\n206 quant quantize_weight bff 3 0"  # QUANTIZE_WEIGHT
    "\n207 quant quantize_bias ifff 1 0"  # QUANTIZE_BIAS
    "\n208 quant requant_header if?ff 4 2"  # REQUANT_HEADER
    "\n209 quant zero_point_int if 0 0"  # ZERO_POINT_INT
    "\n210 intlookup int_lookup_grad iibi 1 1"  # INT_LOOKUP_GRAD
    "\n211 intlookup int_clamp_grad ibiw 3 0"  # INT_CLAMP_GRAD
    "\n220 qlinear quantize_linear bff 3 0"  # QUANTIZE_LINEAR
    "\n221 qlinear dequantize_linear fbf 2 0"  # DEQUANTIZE_LINEAR
    "\n222 qlinear qlinear_gemm bbwki 9 0"  # QLINEAR_GEMM
    "\n223 qlinear qlinear_conv bbwkii 18 0"  # QLINEAR_CONV
    "\n224 qlinear qlinear_global_average_pool bbi 4 0"  # QLINEAR_GLOBAL_AVERAGE_POOL
    "\n225 qlinear qlinear_max_pool bb 12 0"  # QLINEAR_MAX_POOL
    "\n226 qlinear qlinear_average_pool bbi 17 0"  # QLINEAR_AVERAGE_POOL
    "\n227 qlinear qlinear_add bbbi 4 0"  # QLINEAR_ADD
    "\n228 qlinear qlinear_lookup bbb 1 0"  # QLINEAR_LOOKUP
    "\n240 activation relu_masked ffi 1 0"  # RELU_MASKED
    "\n241 activation relu_mask_grad ffi 1 0"  # RELU_MASK_GRAD
    "\n242 inttrain int_gemm_logits ibbii 4 0"  # INT_GEMM_LOGITS
    "\n243 inttrain int_softmax_ce iiiii 2 0"  # INT_SOFTMAX_CE
    "\n244 inttrain int_gemm_update bibiik 4 0"  # INT_GEMM_UPDATE
    "\n245 inttrain int_gemm_grad_input iibi 3 0"  # INT_GEMM_GRAD_INPUT
    "\n246 inttrain int_conv1x1_update bibbiiik 6 0"  # INT_CONV1X1_UPDATE
    "\n247 inttrain int_gemm_update_momentum bibiikbi 5 0"  # INT_GEMM_UPDATE_MOMENTUM
    "\n248 intgrad int_pool_grad ii 3 0"  # INT_POOL_GRAD
    "\n249 intgrad int_clamp_bias_grad ibiikw 3 0"  # INT_CLAMP_BIAS_GRAD
    "\n250 intgrad int_conv_grad_input iiw 16 0"  # INT_CONV_GRAD_INPUT
    "\n251 intgrad int_conv_update bbiik 17 0"  # INT_CONV_UPDATE
    "\n252 intgrad int_clamp_mask bbi 2 0"  # INT_CLAMP_MASK
    "\n")


def signature(op):
    # (family, function, tensor kinds, int count, float count) of op code op, or None
    at = _ROWS.find("\n%d " % op)
    if at < 0:
        return None
    row = _ROWS[at + 1:_ROWS.find("\n", at + 1)].split()
    return row[1], row[2], row[3], int(row[4]), int(row[5])


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
    elif family == "intflow":
        from microtrain.kernels import intflow as module
    elif family == "intgrad":
        from microtrain.kernels import intgrad as module
    elif family == "intlookup":
        from microtrain.kernels import intlookup as module
    elif family == "intloss":
        from microtrain.kernels import intloss as module
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
