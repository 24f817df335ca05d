# Timing shared by the device-side benchmark scripts (device_step.py, model_step.py,
# conv_device.py): a microsecond clock and the interpreter's plain multiply-accumulate loop,
# the yardstick every kernel rate is compared with. Runs on MicroPython and CPython (the
# script's own folder is on both interpreters' import path).
from array import array

try:
    from time import ticks_diff, ticks_us  # MicroPython

    def now_us():
        return ticks_us()

    def since_us(t0):
        return ticks_diff(ticks_us(), t0)
except ImportError:  # CPython
    from time import perf_counter

    def now_us():
        return perf_counter() * 1e6

    def since_us(t0):
        return perf_counter() * 1e6 - t0


def plain_dot(F, G, k, sa, sb):
    # The inner loop of kernels/dense.gemm, verbatim: strided indices, one MAC per trip.
    pa = 0
    pb = 0
    s = 0.0
    for _ in range(k):
        s += F[pa] * G[pb]
        pa += sa
        pb += sb
    return s


def plain_loop_rate(seconds=0.2):
    """MACs per second of plain_dot over 2,048 elements, run for `seconds`."""
    n = 64 * 32
    F = array("f", [((i * 37) % 101) / 101.0 for i in range(n)])
    G = array("f", [((i * 53) % 97) / 97.0 for i in range(n)])
    calls = 0
    t0 = now_us()
    while True:
        plain_dot(F, G, n, 1, 1)
        calls += 1
        dt = since_us(t0)
        if dt >= seconds * 1e6:
            return calls * n / (dt / 1e6)
