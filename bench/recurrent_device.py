# Device side of bench/recurrent_kernels.py: the rate of the recurrent kernels
# (kernels/recurrent.py: GRU and LSTM forward, backward through time) on a few representative
# layers and, in the same process, the interpreter's plain multiply-accumulate loop.
# Runs unchanged on MicroPython and CPython (only array, gc, sys, time, via mac_loop.py).
#   micropython bench/recurrent_device.py ROUNDS     (MICROPYPATH=device)
#   python      bench/recurrent_device.py ROUNDS     (PYTHONPATH=device)
# Prints one "RESULT key=value ..." line per layer and kernel for the host script.
import gc
import sys
from array import array

from mac_loop import now_us, plain_loop_rate, since_us
from microtrain.kernels.recurrent import gru, gru_grad, lstm, lstm_grad

IMPL = sys.implementation.name

# name: (op, steps, batch, inputs, hidden, directions)
LAYERS = (
    ("gru_imu_6to16_T32", ("GRU", 32, 4, 6, 16, 1)),
    ("gru_16to32_T32", ("GRU", 32, 4, 16, 32, 1)),
    ("gru_bidir_8to16_T24", ("GRU", 24, 4, 8, 16, 2)),
    ("lstm_4to12_T32", ("LSTM", 32, 4, 4, 12, 1)),
    ("lstm_16to32_T32", ("LSTM", 32, 4, 16, 32, 1)),
)


def time_us(kernel, F, args):
    t0 = now_us()
    kernel(F, None, args)
    return since_us(t0)


rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
for name, (op, steps, batch, n_in, hidden, dirs) in LAYERS:
    gates = 3 if op == "GRU" else 4
    slot = 4 if op == "GRU" else 5
    x_size = steps * batch * n_in
    y_size = steps * dirs * batch * hidden
    h_size = dirs * batch * hidden
    w_size = dirs * gates * hidden * n_in
    r_size = dirs * gates * hidden * hidden
    b_size = dirs * 2 * gates * hidden
    p_size = dirs * 3 * hidden
    saved_size = dirs * steps * batch * slot * hidden
    # One arena, layout 0, everything present: X, W, R, B, P, h0, c0, Y, Y_h, Y_c, saved,
    # dY, dY_h, dY_c, dX, dW, dR, dB, dh0, dc0, dP, scratch.
    sizes = (x_size, w_size, r_size, b_size, p_size, h_size, h_size, y_size, h_size, h_size,
             saved_size, y_size, h_size, h_size, x_size, w_size, r_size, b_size, h_size,
             h_size, p_size, 2 * batch * hidden)
    at = []
    total = 0
    for s in sizes:
        at.append(total)
        total += s
    (x, w, r, b, p, h0, c0, y, y_h, y_c, saved, dy, dy_h, dy_c, dx, dw, dr, db, dh0, dc0, dp,
     scratch) = at
    gc.collect()
    F = array("f", bytes(4 * total))
    for i in range(len(F)):
        F[i] = (((i * 7919) % 1009) / 1009.0 - 0.5) * 0.5
    geometry = (steps, batch, n_in, hidden, dirs, 0, batch * n_in, n_in,
                dirs * batch * hidden, batch * hidden, hidden, batch * hidden, hidden, 1)
    # MACs: forward X.W and H.R per step (the first step has H_prev = h0 here);
    # backward dH_prev = dG.R per step, then dW, dR (and dX) over all steps.
    forward_macs = dirs * steps * batch * gates * hidden * (n_in + hidden)
    backward_macs = 2 * forward_macs
    if op == "GRU":
        fwd_args = (y, y_h, saved, x, w, r, b, h0) + geometry
        bwd_args = (dx, dw, dr, db, dh0, scratch, saved, x, w, r, h0, y, dy, dy_h) + geometry
        forward, backward = gru, gru_grad
    else:
        fwd_args = (y, y_h, y_c, saved, x, w, r, b, h0, c0, -1) + geometry
        bwd_args = (dx, dw, dr, db, dh0, dc0, -1, scratch, saved, x, w, r, h0, c0, -1, y, dy,
                    dy_h, dy_c) + geometry
        forward, backward = lstm, lstm_grad
    best = {"forward": 1e30, "backward": 1e30}
    loop = 0.0
    # Interleaved rounds, best of each: the kernels and the plain loop see the same machine.
    for _ in range(rounds):
        best["forward"] = min(best["forward"], time_us(forward, F, fwd_args))
        best["backward"] = min(best["backward"], time_us(backward, F, bwd_args))
        loop = max(loop, plain_loop_rate())
    for kernel, macs in (("forward", forward_macs), ("backward", backward_macs)):
        rate = macs / (best[kernel] / 1e6)
        print("RESULT impl=%s layer=%s kernel=%s macs=%d us=%.0f rate=%.0f loop=%.0f"
              % (IMPL, name, kernel, macs, best[kernel], rate, loop))
    F = None
