# Recurrent layers (ONNX GRU and LSTM, one layer; forward, reverse or bidirectional) and their
# backward through time, side by side.
#
# Every kernel ends with the same 14 ints:
#   steps, batch, n_in, hidden   T, N, I, H
#   dirs, reverse                1 or 2 directions; reverse = 1: the only direction runs
#                                backwards in time (with 2, direction 1 always does)
#   sx_t, sx_n                   X[t, n, i] = x + t*sx_t + n*sx_n + i   (dX alike)
#   sy_t, sy_d, sy_n             Y[t, d, n, j] = y + t*sy_t + d*sy_d + n*sy_n + j   (dY alike)
#   sh_d, sh_n                   initial_h, initial_c, Y_h, Y_c and their gradients
#   keep                         1: one saved slot per time step (training), 0: one for all
# so ONNX's layout 0 (X [T, N, I], Y [T, D, N, H]) and layout 1 (X [N, T, I], Y [N, T, D, H])
# are only strides. With keep = 0 and Y read by nothing, sy_t = 0: Y holds one step and each
# step updates it in place (all of a sample's gates are computed before its hidden state is
# overwritten, so that is safe).
#
# Weights are ONNX's: W [D, G*H, I], R [D, G*H, H], B [D, 2*G*H] (input biases, then
# recurrent ones), gates in ONNX's order: GRU z, r, h (G = 3), LSTM i, o, f, c (G = 4); LSTM
# peepholes P [D, 3H] (i, o, f). The GRU is linear_before_reset = 1, as torch exports it.
#
# Saved activations (`saved`, [D, T or 1, N, slot]): written by the forward pass, read by the
# backward one, so nothing is recomputed:
#   GRU  slot 4H: z, r, candidate h~, hn = H_prev.R_h + Rb_h (what r multiplies)
#   LSTM slot 5H: i, o, f, candidate c~, cell state C
# The hidden states are Y itself (full size when keep = 1). The backward pass overwrites each
# slot, latest step first, with the gradients of the gate pre-activations:
#   GRU  dz, dr, dh~*r (the candidate's recurrent part), dh~ (its input part)
#   LSTM di, do, df, dc~
# so that after the time loop dW, dR, dB and dX are sums with long inner loops (over time),
# and dH_prev inside the loop is one dot product per hidden unit.
#
# sigmoid(v) = 0.5 + 0.5*tanh(v/2): one call, no exp to overflow, no branch.
import math


def _gates(F, ps, px, hp, wd, rd, bd, rows, split, n_in, hidden):
    # Pre-activations of one sample's gates at one step into its slot at ps: row q is
    # X.W[q] + H_prev.R[q] + biases. Rows from `split` on keep the input part at q and the
    # recurrent part at q + hidden (the GRU candidate). hp < 0: H_prev is zero.
    pw = wd
    for q in range(rows):
        s = 0.0
        for i in range(px, px + n_in):
            s += F[i] * F[pw]
            pw += 1
        u = 0.0
        if hp >= 0:
            pr = rd + q * hidden
            for j in range(hp, hp + hidden):
                u += F[j] * F[pr]
                pr += 1
        if bd >= 0:
            s += F[bd + q]
            u += F[bd + rows + q]
        if q < split:
            F[ps + q] = s + u
        else:
            F[ps + q] = s
            F[ps + q + hidden] = u


def _copy_states(F, dst, src, batch, hidden, s_dst, s_src):
    # dst[n, :] = src[n, :] for every sample (n strides s_dst, s_src); src < 0: zeros.
    for n in range(batch):
        a = dst + n * s_dst
        b = src + n * s_src
        for j in range(hidden):
            F[a + j] = F[b + j] if src >= 0 else 0.0


def _layout(hidden, gates):
    # 2 * hidden, the gate rows of one direction's W and R (GRU: 3 gates, LSTM: 4) and one
    # saved slot's size (one step and sample: the gates, then GRU's R h + b_r or LSTM's cell)
    return 2 * hidden, gates * hidden, (gates + 1) * hidden


def _direction(d, reverse, w, r, b, rows, n_in, hidden):
    # direction d's walk (backwards for the second one, or the only one when reverse) and
    # its W, R and B (< 0: absent) rows, of GRU's and LSTM's forward pass
    return (d == 1 or reverse == 1, w + d * rows * n_in, r + d * rows * hidden,
            b + d * 2 * rows if b >= 0 else -1)


def gru(F, I, args):
    # Y, Y_h = GRU(X, W, R, B, initial_h); Y_h, B, initial_h < 0: absent.
    (y, y_h, saved, x, w, r, b, h0, steps, batch, n_in, hidden, dirs, reverse,
     sx_t, sx_n, sy_t, sy_d, sy_n, sh_d, sh_n, keep) = args
    th = math.tanh
    two, rows, size = _layout(hidden, 3)
    kept = steps if keep else 1
    for d in range(dirs):
        back, wd, rd, bd = _direction(d, reverse, w, r, b, rows, n_in, hidden)
        for k in range(steps):
            t = steps - 1 - k if back else k
            for n in range(batch):
                py = y + t * sy_t + d * sy_d + n * sy_n
                if k:
                    hp = py + sy_t if back else py - sy_t  # the previous step's output
                else:
                    hp = h0 + d * sh_d + n * sh_n if h0 >= 0 else -1
                ps = saved + ((d * kept + (t if keep else 0)) * batch + n) * size
                _gates(F, ps, x + t * sx_t + n * sx_n, hp, wd, rd, bd, rows, two, n_in, hidden)
                for j in range(hidden):
                    z = 0.5 + 0.5 * th(0.5 * F[ps + j])
                    q = 0.5 + 0.5 * th(0.5 * F[ps + hidden + j])
                    c = th(F[ps + two + j] + q * F[ps + rows + j])
                    F[ps + j] = z
                    F[ps + hidden + j] = q
                    F[ps + two + j] = c
                    F[py + j] = (1.0 - z) * c + (z * F[hp + j] if hp >= 0 else 0.0)
        if y_h >= 0:
            _copy_states(F, y_h + d * sh_d, y + (0 if back else steps - 1) * sy_t + d * sy_d,
                         batch, hidden, sh_n, sy_n)


def _geometry_check(args, c, x, y, states, weights, gates, slot):
    # Spans of X and Y (tensor arguments x and y) and of the state tensors (the arguments
    # in `states`, when present); sizes of the weights (`weights`: (argument, kind), a kind
    # holding per direction "w" G*H*I, "r" G*H*H, "b" 2*G*H or "p" 3*H elements). Returns
    # the elements the saved tensor holds.
    (steps, batch, n_in, hidden, dirs, reverse, sx_t, sx_n, sy_t, sy_d, sy_n, sh_d, sh_n,
     keep) = c.ints
    at = c.offsets
    c.positive(steps, batch, n_in, hidden, dirs)
    c.within(dirs, 1, 2, "directions")
    c.within(reverse, 0, 2 - dirs, "reverse")
    c.within(keep, 0, 1, "keep")
    c.moving((steps, batch), (sx_t, sx_n))  # X bounds the time and batch loops
    c.span(x, at[x], (steps, batch, n_in), (sx_t, sx_n, 1))
    c.span(y, at[y], (steps, dirs, batch, hidden), (sy_t, sy_d, sy_n, 1))
    for k in states:
        if c.present(k):
            c.span(k, at[k], (dirs, batch, hidden), (sh_d, sh_n, 1))
    per = {"w": gates * hidden * n_in, "r": gates * hidden * hidden, "b": 2 * gates * hidden,
           "p": 3 * hidden}
    for k, kind in weights:
        if c.present(k):
            c.holds(k, dirs * per[kind])
    return dirs * (steps if keep else 1) * batch * slot * hidden


def gru_check(args, c):
    # y, y_h, saved, x, w, r, b, h0
    c.holds(2, _geometry_check(args, c, 3, 0, (1, 7), ((4, "w"), (5, "r"), (6, "b")), 3, 4))


def _backward_check(args, c, x, y, dy, states, weights, gates, slot, scratch, saved):
    # The backward reads one slot per step (keep = 1), dY spans like Y, dX like X.
    (steps, batch, n_in, hidden, dirs, reverse, sx_t, sx_n, sy_t, sy_d, sy_n, sh_d, sh_n,
     keep) = c.ints
    if keep != 1:
        c.fail("keep is %d; the backward pass needs every step's slot" % keep)
    c.holds(saved, _geometry_check(args, c, x, y, states, weights, gates, slot))
    c.holds(scratch, (2 if gates == 4 else 1) * batch * hidden)
    if c.present(0):
        c.span(0, c.offsets[0], (steps, batch, n_in), (sx_t, sx_n, 1))
    if c.present(dy):
        c.span(dy, c.offsets[dy], (steps, dirs, batch, hidden), (sy_t, sy_d, sy_n, 1))


def _back_to_previous(F, pd, ps, rd, rows, hidden, add):
    # dH_prev[m] = sum over the gate rows q of dgate_q * R[q, m] (+ what pd holds when add):
    # the recurrent part of every gate's gradient, already in the slot at ps.
    for m in range(hidden):
        s = F[pd + m] if add else 0.0
        pr = rd + m
        for q in range(ps, ps + rows):
            s += F[q] * F[pr]
            pr += hidden
        F[pd + m] = s


def _add_output_grad(F, pd, pg, hidden):
    # dH += dY at this step
    for j in range(hidden):
        F[pd + j] += F[pg + j]


def _weight_grads(F, args, d, dx, dw, dr, db, saved, x, w, h0, y, rows, split, size):
    # After direction d's time loop, the slots hold the gates' pre-activation gradients:
    # dG_x[q] (input part) at q, or q + hidden from `split` on; dG_h[q] (recurrent part) at q.
    #   dW[q, i] = sum over t, n of dG_x[q] X[t, n, i]     dB_x[q] = sum of dG_x[q]
    #   dR[q, m] = sum over t, n of dG_h[q] H_prev[m]      dB_h[q] = sum of dG_h[q]
    #   dX[t, n, i] (+)= sum over q of dG_x[q] W[q, i]      (direction 1 adds to direction 0)
    # H_prev is Y at the step before (in the direction's order), initial_h (or 0) first.
    (steps, batch, n_in, hidden, dirs, reverse, sx_t, sx_n, sy_t, sy_d, sy_n, sh_d, sh_n,
     keep) = args[-14:]
    back = d == 1 or reverse == 1
    base = saved + d * steps * batch * size
    ss = batch * size       # slot stride between time steps
    end = steps * ss
    for q in range(rows if dw >= 0 or db >= 0 else 0):
        col = q if q < split else q + hidden
        if dw >= 0:
            out = dw + (d * rows + q) * n_in
            for i in range(n_in):
                s = 0.0
                for n in range(batch):
                    px = x + n * sx_n + i
                    p0 = base + n * size + col
                    for a in range(p0, p0 + end, ss):
                        s += F[a] * F[px]
                        px += sx_t
                F[out + i] = s
        if db >= 0:
            s = 0.0
            u = 0.0
            for n in range(batch):
                p0 = base + n * size
                for a in range(p0, p0 + end, ss):
                    s += F[a + col]
                    u += F[a + q]
            F[db + d * 2 * rows + q] = s
            F[db + d * 2 * rows + rows + q] = u
    if dr >= 0:
        first = steps - 1 if back else 0         # the step whose H_prev is initial_h
        later = 0 if back else 1                 # the first time index with a previous step
        shift = sy_t if back else -sy_t          # from a step's Y to its previous step's
        for q in range(rows):
            out = dr + (d * rows + q) * hidden
            for m in range(hidden):
                s = 0.0
                for n in range(batch):
                    py = y + later * sy_t + shift + d * sy_d + n * sy_n + m
                    p0 = base + (later * batch + n) * size + q
                    for a in range(p0, p0 + end - ss, ss):
                        s += F[a] * F[py]
                        py += sy_t
                    if h0 >= 0:
                        s += F[base + (first * batch + n) * size + q] * F[h0 + d * sh_d +
                                                                          n * sh_n + m]
                F[out + m] = s
    if dx >= 0:
        wd = w + d * rows * n_in
        for t in range(steps):
            for n in range(batch):
                ps = base + (t * batch + n) * size
                px = dx + t * sx_t + n * sx_n
                for i in range(n_in):
                    s = F[px + i] if d else 0.0
                    pw = wd + i
                    for a in range(ps, ps + split):
                        s += F[a] * F[pw]
                        pw += n_in
                    for a in range(ps + split + hidden, ps + rows + hidden):
                        s += F[a] * F[pw]
                        pw += n_in
                    F[px + i] = s


def gru_grad(F, I, args):
    # dX, dW, dR, dB, d initial_h of gru (each < 0: not needed) from dY, dY_h (< 0: zero),
    # the saved slots, X, W, R, initial_h and Y. dh (N*H) carries dH back through time.
    (dx, dw, dr, db, dh0, dh, saved, x, w, r, h0, y, dy, dy_h, steps, batch, n_in, hidden,
     dirs, reverse, sx_t, sx_n, sy_t, sy_d, sy_n, sh_d, sh_n, keep) = args
    two, rows, size = _layout(hidden, 3)
    for d in range(dirs):
        back = d == 1 or reverse == 1
        rd = r + d * rows * hidden
        base = saved + d * steps * batch * size
        _copy_states(F, dh, dy_h + d * sh_d if dy_h >= 0 else -1, batch, hidden, hidden, sh_n)
        for k in range(steps - 1, -1, -1):
            t = steps - 1 - k if back else k
            for n in range(batch):
                pd = dh + n * hidden
                at_y = t * sy_t + d * sy_d + n * sy_n
                if dy >= 0:
                    _add_output_grad(F, pd, dy + at_y, hidden)
                if k:
                    hp = y + at_y + (sy_t if back else -sy_t)
                else:
                    hp = h0 + d * sh_d + n * sh_n if h0 >= 0 else -1
                ps = base + (t * batch + n) * size
                for j in range(hidden):
                    g = F[pd + j]
                    z = F[ps + j]
                    q = F[ps + hidden + j]
                    c = F[ps + two + j]
                    da = g * (1.0 - z) * (1.0 - c * c)      # d pre-activation of h~
                    prev = F[hp + j] if hp >= 0 else 0.0
                    F[ps + j] = g * (prev - c) * z * (1.0 - z)
                    F[ps + hidden + j] = da * F[ps + rows + j] * q * (1.0 - q)
                    F[ps + two + j] = da * q
                    F[ps + rows + j] = da
                    F[pd + j] = g * z                        # H_t = ... + z * H_prev
                if k or dh0 >= 0:
                    _back_to_previous(F, pd, ps, rd, rows, hidden, True)
        if dh0 >= 0:
            _copy_states(F, dh0 + d * sh_d, dh, batch, hidden, sh_n, hidden)
        _weight_grads(F, args, d, dx, dw, dr, db, saved, x, w, h0, y, rows, two, size)


def gru_grad_check(args, c):
    # dx, dw, dr, db, dh0, dh, saved, x, w, r, h0, y, dy, dy_h
    _backward_check(args, c, 7, 11, 12, (4, 10, 13), ((1, "w"), (2, "r"), (3, "b"), (8, "w"),
                                                      (9, "r")), 3, 4, 5, 6)


def lstm(F, I, args):
    # Y, Y_h, Y_c = LSTM(X, W, R, B, initial_h, initial_c, P); Y_h, Y_c, B, initial_h,
    # initial_c, P < 0: absent.
    (y, y_h, y_c, saved, x, w, r, b, h0, c0, p, steps, batch, n_in, hidden, dirs, reverse,
     sx_t, sx_n, sy_t, sy_d, sy_n, sh_d, sh_n, keep) = args
    th = math.tanh
    two, rows, size = _layout(hidden, 4)
    three = 3 * hidden
    kept = steps if keep else 1
    for d in range(dirs):
        back, wd, rd, bd = _direction(d, reverse, w, r, b, rows, n_in, hidden)
        pp = p + d * three
        for k in range(steps):
            t = steps - 1 - k if back else k
            for n in range(batch):
                py = y + t * sy_t + d * sy_d + n * sy_n
                ps = saved + ((d * kept + (t if keep else 0)) * batch + n) * size
                if k:
                    hp = py + sy_t if back else py - sy_t
                    pc = rows + (ps if not keep else ps + batch * size if back
                                 else ps - batch * size)   # the previous step's C
                else:
                    hp = h0 + d * sh_d + n * sh_n if h0 >= 0 else -1
                    pc = c0 + d * sh_d + n * sh_n if c0 >= 0 else -1
                _gates(F, ps, x + t * sx_t + n * sx_n, hp, wd, rd, bd, rows, rows, n_in,
                       hidden)
                for j in range(hidden):
                    cp = F[pc + j] if pc >= 0 else 0.0
                    ai = F[ps + j]
                    ao = F[ps + hidden + j]
                    af = F[ps + two + j]
                    if p >= 0:
                        ai += F[pp + j] * cp
                        af += F[pp + two + j] * cp
                    gi = 0.5 + 0.5 * th(0.5 * ai)
                    gf = 0.5 + 0.5 * th(0.5 * af)
                    gc = th(F[ps + three + j])
                    cell = gf * cp + gi * gc
                    if p >= 0:
                        ao += F[pp + hidden + j] * cell
                    go = 0.5 + 0.5 * th(0.5 * ao)
                    F[ps + j] = gi
                    F[ps + hidden + j] = go
                    F[ps + two + j] = gf
                    F[ps + three + j] = gc
                    F[ps + rows + j] = cell
                    F[py + j] = go * th(cell)
        last = 0 if back else steps - 1
        if y_h >= 0:
            _copy_states(F, y_h + d * sh_d, y + last * sy_t + d * sy_d, batch, hidden, sh_n,
                         sy_n)
        if y_c >= 0:
            _copy_states(F, y_c + d * sh_d,
                         saved + (d * kept + (last if keep else 0)) * batch * size + rows,
                         batch, hidden, sh_n, size)


def lstm_check(args, c):
    # y, y_h, y_c, saved, x, w, r, b, h0, c0, p
    c.holds(3, _geometry_check(args, c, 4, 0, (1, 2, 8, 9),
                               ((5, "w"), (6, "r"), (7, "b"), (10, "p")), 4, 5))


def lstm_grad(F, I, args):
    # dX, dW, dR, dB, d initial_h, d initial_c, dP of lstm (each < 0: not needed) from dY,
    # dY_h, dY_c (< 0: zero), the saved slots, X, W, R, initial_h, initial_c, P and Y.
    # scratch: dH (N*H), then dC (N*H), carried back through time.
    (dx, dw, dr, db, dh0, dc0, dp, dh, saved, x, w, r, h0, c0, p, y, dy, dy_h, dy_c,
     steps, batch, n_in, hidden, dirs, reverse, sx_t, sx_n, sy_t, sy_d, sy_n, sh_d, sh_n,
     keep) = args
    th = math.tanh
    two, rows, size = _layout(hidden, 4)
    three = 3 * hidden
    dc = dh + batch * hidden
    if dp >= 0:
        for a in range(dp, dp + dirs * three):
            F[a] = 0.0
    for d in range(dirs):
        back = d == 1 or reverse == 1
        rd = r + d * rows * hidden
        base = saved + d * steps * batch * size
        pp = p + d * three
        dpp = dp + d * three
        _copy_states(F, dh, dy_h + d * sh_d if dy_h >= 0 else -1, batch, hidden, hidden, sh_n)
        _copy_states(F, dc, dy_c + d * sh_d if dy_c >= 0 else -1, batch, hidden, hidden, sh_n)
        for k in range(steps - 1, -1, -1):
            t = steps - 1 - k if back else k
            for n in range(batch):
                pd = dh + n * hidden
                pdc = dc + n * hidden
                at_y = t * sy_t + d * sy_d + n * sy_n
                if dy >= 0:
                    _add_output_grad(F, pd, dy + at_y, hidden)
                ps = base + (t * batch + n) * size
                if k:
                    pc = ps + rows + (batch * size if back else -batch * size)
                else:
                    pc = c0 + d * sh_d + n * sh_n if c0 >= 0 else -1
                for j in range(hidden):
                    g = F[pd + j]
                    gi = F[ps + j]
                    go = F[ps + hidden + j]
                    gf = F[ps + two + j]
                    gc = F[ps + three + j]
                    cell = F[ps + rows + j]
                    cp = F[pc + j] if pc >= 0 else 0.0
                    tc = th(cell)
                    dao = g * tc * go * (1.0 - go)
                    dcell = F[pdc + j] + g * go * (1.0 - tc * tc)
                    if p >= 0:
                        dcell += dao * F[pp + hidden + j]
                    dai = dcell * gc * gi * (1.0 - gi)
                    daf = dcell * cp * gf * (1.0 - gf)
                    back_c = dcell * gf
                    if p >= 0:
                        back_c += dai * F[pp + j] + daf * F[pp + two + j]
                        if dp >= 0:
                            F[dpp + j] += dai * cp
                            F[dpp + hidden + j] += dao * cell
                            F[dpp + two + j] += daf * cp
                    F[pdc + j] = back_c
                    F[ps + j] = dai
                    F[ps + hidden + j] = dao
                    F[ps + two + j] = daf
                    F[ps + three + j] = dcell * gi * (1.0 - gc * gc)
                if k or dh0 >= 0:
                    _back_to_previous(F, pd, ps, rd, rows, hidden, False)
        if dh0 >= 0:
            _copy_states(F, dh0 + d * sh_d, dh, batch, hidden, sh_n, hidden)
        if dc0 >= 0:
            _copy_states(F, dc0 + d * sh_d, dc, batch, hidden, sh_n, hidden)
        _weight_grads(F, args, d, dx, dw, dr, db, saved, x, w, h0, y, rows, rows, size)


def lstm_grad_check(args, c):
    # dx, dw, dr, db, dh0, dc0, dp, dh, saved, x, w, r, h0, c0, p, y, dy, dy_h, dy_c
    _backward_check(args, c, 9, 15, 16, (4, 5, 12, 13, 17, 18),
                    ((1, "w"), (2, "r"), (3, "b"), (6, "p"), (10, "w"), (11, "r"), (14, "p")),
                    4, 5, 7, 8)
