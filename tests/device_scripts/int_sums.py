# The chunked sums of kernels/intgrad.py on made-up arenas (tests/test_int_limits.py): a
# bias step over 2 x 40000 positions per channel (beyond one sum of MAX_BIAS_SUM) and a 1x1
# convolution's weight steps over 4 x 64 x 64 positions (33 chunks of MAX_SUM), each under
# micropython.heap_lock() where there is one; prints the steps taken.
#   int_sums.py fast|pure
import sys
from array import array
try:
    import micropython
except ImportError:
    micropython = None
from microtrain.kernels import intgrad

if sys.argv[1] == "pure":
    intgrad.use_fast(False)


def mantissa(i):
    # a deterministic gradient mantissa in (-2**13, 2**13), mostly positive (sums that grow)
    return ((i * 7919) % 12000) - 4000


def run(kernel, args, I):
    if micropython is not None:
        micropython.heap_lock()
    try:
        kernel(None, I, args)
    finally:
        if micropython is not None:
            micropython.heap_unlock()


# int_clamp_bias_grad: G [e, m * channels * plane], its mask, two biases, their rates
m, channels, plane = 2, 2, 40000
count = m * channels * plane
g = 0
bias = 1 + count
rates = bias + channels
I = array("i", bytearray(4 * (rates + 4 * channels)))
I[g] = -3
for i in range(count):
    I[g + 1 + i] = mantissa(i)
for c in range(channels):
    I[rates + 4 * c] = 9000000 + c        # the bias step: m0 / 2**shift per unit
    I[rates + 4 * c + 1] = 30
    I[rates + 4 * c + 2] = 1 << 23        # the fold: 1 / 2
    I[rates + 4 * c + 3] = 24
Q = bytearray((count + 7) >> 3)
for i in range(len(Q)):
    Q[i] = (i * 37) & 255 | 1
run(intgrad.int_clamp_bias_grad, (Q, g, 0, bias, rates, -1, 0, m, channels, plane, Q), I)
print("bias", I[bias], I[bias + 1])
del I, Q

# int_conv_update: a 1x1 convolution, 2 -> 2 channels, batch 4, 64 x 64
m, cin, cout, side = 4, 2, 2, 64
x_count = m * cin * side * side
Q = bytearray(x_count + cin * cout)
for i in range(x_count):
    Q[i] = (i * 13 + i // 100) & 255
w = x_count
g = 0
rates = 1 + m * cout * side * side
I = array("i", bytearray(4 * (rates + 1 + 2 * cout)))
I[g] = -5
for i in range(m * cout * side * side):
    I[g + 1 + i] = mantissa(i) >> 4
I[rates] = 100                              # x_zp
for c in range(cout):
    I[rates + 1 + 2 * c] = 12000000 - c
    I[rates + 2 + 2 * c] = 39
run(intgrad.int_conv_update, (Q, w, 0, g, rates, -1, m, 1, cin, cout, side, side, side, side,
                              1, 1, 1, 1, 1, 1, 0, 0, 0), I)
print("weights", " ".join(str((v ^ 128) - 128) for v in Q[w:w + cin * cout]))
print("viper", intgrad.int_conv_update is not intgrad._pure["int_conv_update"])
