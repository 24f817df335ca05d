"""Device op codes (the kernel table). Mirrors device/microtrain/opcodes.py; a test keeps
the two in sync."""

GEMM = 1
GEMM_ACCUMULATE = 2
ADD = 10
SUB = 11
MUL = 12
DIV = 13
EXPAND = 14
COPY = 15
NEG = 20
ABS = 21
SIGN = 22
EXP = 23
LOG = 24
SQRT = 25
POW = 26
RELU = 30
SIGMOID = 31
TANH = 32
RELU_GRAD = 33
SIGMOID_GRAD = 34
TANH_GRAD = 35
SOFTMAX = 36
LOG_SOFTMAX = 37
SOFTMAX_GRAD = 38
LOG_SOFTMAX_GRAD = 39
SOFTPLUS = 41
REDUCE_SUM = 40
SOFTMAX_CE = 50
SOFTMAX_CE_GRAD = 51
ACCUMULATE = 60
SGD = 61
ADAMW = 62

NAMES = {value: name for name, value in list(globals().items())
         if name.isupper() and isinstance(value, int)}
