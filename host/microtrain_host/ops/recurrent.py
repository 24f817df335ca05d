"""GRU and LSTM (one layer; direction forward, reverse or bidirectional; layout 0 or 1; initial
states, LSTM peepholes and every output optional) and their gradient ops GRUGrad / LSTMGrad:
backward through time. torch.nn.GRU / LSTM export (dynamo=False, opsets 14-17) as these ops
with layout 0 (batch_first adds Transposes around them), gates reordered by Slice / Concat of
the parameters, GRU linear_before_reset = 1, no sequence_lens, initial states as given or an
expanded zero constant. Device kernels: kernels/recurrent.py (layouts and saved activations
described there).

Memory: in a program that also runs the backward pass, the forward step keeps, per direction,
time step and sample, the gate activations (GRU 4H floats: z, r, h~ and the candidate's
recurrent part; LSTM 5H: i, o, f, c~ and the cell state) in a `<Y>.saved` activation the
planner keeps alive until the gradient step, and Y (H floats) itself. So training keeps
D*T*N*5H (GRU) or D*T*N*6H (LSTM) floats besides X; the gradient step adds a scratch of N*H
(GRU) or 2*N*H (LSTM). Eval and inference keep one slot per sample (D*N*4H or 5H) and, when
nothing reads Y, one step of Y (D*N*H)."""
import numpy as np

from .. import opcodes as op
from ..errors import UnsupportedOpError
from ..graph import DOMAIN, attr
from ..ir import ACTIVATION, FLOAT, NO_TENSOR, Tensor
from ..reference import MicrotrainOp
from ..registry import gradient, lowering

GATES = {"GRU": 3, "LSTM": 4}
DEFAULT_ACTIVATIONS = {"GRU": ["Sigmoid", "Tanh"], "LSTM": ["Sigmoid", "Tanh", "Tanh"]}
SLOT = {"GRU": 4, "LSTM": 5}       # saved floats per hidden unit and step (kernels/recurrent.py)
GRAD_OF = {"GRUGrad": "GRU", "LSTMGrad": "LSTM"}
# Forward inputs: X, W, R, B, sequence_lens, initial_h, [initial_c, P]
INPUT_NAMES = ("X", "W", "R", "B", "sequence_lens", "initial_h", "initial_c", "P")
X, W, R, B, SEQUENCE_LENS, INITIAL_H, INITIAL_C, P = range(8)


def _input(node, k):
    return node.input[k] if len(node.input) > k else ""


def _decoded(values):
    return [v.decode() if isinstance(v, bytes) else v for v in values]


def recurrent_config(node, shape_of, value_of, where):
    """What the kernels need from a GRU or LSTM node, checked: (steps, batch, n_in, hidden,
    dirs, reverse, layout). Anything the kernels do not do is refused naming the attribute
    or input."""
    kind = node.op_type
    gates = GATES[kind]
    activations = attr(node, "activations")
    if activations is not None:
        names = _decoded(activations)
        defaults = DEFAULT_ACTIVATIONS[kind]
        if names not in (defaults, defaults * 2):
            raise UnsupportedOpError(f"{where}: attribute activations = {names} is not "
                                     f"supported; only the defaults {defaults}")
    for name in ("activation_alpha", "activation_beta", "clip"):
        if attr(node, name) is not None:
            raise UnsupportedOpError(f"{where}: attribute {name} is not supported")
    if kind == "GRU" and attr(node, "linear_before_reset", 0) != 1:
        raise UnsupportedOpError(f"{where}: attribute linear_before_reset = "
                                 f"{attr(node, 'linear_before_reset', 0)} is not supported; "
                                 f"only 1 (torch.nn.GRU's form)")
    if kind == "LSTM" and attr(node, "input_forget", 0) != 0:
        raise UnsupportedOpError(f"{where}: attribute input_forget = "
                                 f"{attr(node, 'input_forget')} is not supported")
    direction = attr(node, "direction", "forward")
    if direction not in ("forward", "reverse", "bidirectional"):
        raise UnsupportedOpError(f"{where}: attribute direction = {direction!r} is not "
                                 f"forward, reverse or bidirectional")
    layout = attr(node, "layout", 0)
    if layout not in (0, 1):
        raise UnsupportedOpError(f"{where}: attribute layout = {layout} is not 0 or 1")
    dirs = 2 if direction == "bidirectional" else 1
    x_shape = tuple(shape_of(node.input[X]))
    if len(x_shape) != 3:
        raise UnsupportedOpError(f"{where}: input X must have 3 dimensions, got {list(x_shape)}")
    steps, batch, n_in = (x_shape[1], x_shape[0], x_shape[2]) if layout else x_shape
    hidden = tuple(shape_of(node.input[R]))[-1]
    if attr(node, "hidden_size", hidden) != hidden:
        raise UnsupportedOpError(f"{where}: attribute hidden_size = {attr(node, 'hidden_size')}"
                                 f" does not match R's last dimension {hidden}")
    state = (batch, dirs, hidden) if layout else (dirs, batch, hidden)
    expected = {W: (dirs, gates * hidden, n_in), R: (dirs, gates * hidden, hidden),
                B: (dirs, 2 * gates * hidden), INITIAL_H: state, INITIAL_C: state,
                P: (dirs, 3 * hidden)}
    for k, shape in expected.items():
        name = _input(node, k)
        if name and (kind == "LSTM" or k < INITIAL_C) and tuple(shape_of(name)) != shape:
            raise UnsupportedOpError(f"{where}: input {INPUT_NAMES[k]} has shape "
                                     f"{list(shape_of(name))}, expected {list(shape)}")
    lens = _input(node, SEQUENCE_LENS)
    if lens:
        value = value_of(lens)
        if value is None or np.any(np.asarray(value) != steps):
            raise UnsupportedOpError(f"{where}: input sequence_lens is supported only as a "
                                     f"constant equal to the sequence length {steps}")
    if 0 in (steps, batch, n_in, hidden):
        raise UnsupportedOpError(f"{where}: nothing to compute for X {list(x_shape)}, "
                                 f"hidden size {hidden}")
    return steps, batch, n_in, hidden, dirs, int(direction == "reverse"), layout


def shapes(config):
    """(X, Y, state) shapes of a config."""
    steps, batch, n_in, hidden, dirs, _, layout = config
    if layout:
        return (batch, steps, n_in), (batch, steps, dirs, hidden), (batch, dirs, hidden)
    return (steps, batch, n_in), (steps, dirs, batch, hidden), (dirs, batch, hidden)


def geometry(config, keep, full_y=True):
    """The kernels' 14 ints (kernels/recurrent.py). full_y False: Y holds one step, [D, N, H]."""
    steps, batch, n_in, hidden, dirs, reverse, layout = config
    if layout:
        x_strides, y_strides, h_strides = (n_in, steps * n_in), \
            (dirs * hidden, hidden, steps * dirs * hidden), (hidden, dirs * hidden)
    else:
        x_strides, y_strides, h_strides = (batch * n_in, n_in), \
            (dirs * batch * hidden, batch * hidden, hidden), (batch * hidden, hidden)
    if not full_y:
        y_strides = (0, batch * hidden, hidden)
    return ([steps, batch, n_in, hidden, dirs, reverse] + list(x_strides) + list(y_strides)
            + list(h_strides) + [int(keep)])


def _state(ctx, name):
    # An absent initial state, or a constant of zeros (torch's default), is no tensor: the
    # kernels then skip the first step's recurrent products.
    if not name:
        return NO_TENSOR
    value = ctx.value(name)
    if value is not None and not np.any(value):
        return NO_TENSOR
    return ctx.t(name)


def _optional(ctx, name):
    return ctx.t(name) if name else NO_TENSOR


def _temporary(ctx, name, shape):
    return ctx.add(Tensor(name, FLOAT, ACTIVATION, tuple(shape), program=ctx.program_name))


def _saved_key(y_name):
    return ("recurrent saved", y_name)   # not a string: no tensor name can collide with it


@lowering("GRU", "LSTM")
def lower_recurrent(ctx, node):
    kind = node.op_type
    config = recurrent_config(node, ctx.shape, ctx.value, ctx.where(node))
    steps, batch, n_in, hidden, dirs, _, _ = config
    _, y_shape, state_shape = shapes(config)
    outputs = (list(node.output) + ["", "", ""])[:3]
    # Training: the gradient step reads every step's gates and Y (the hidden states).
    keep = bool(outputs[0]) and f"{kind}Grad" in ctx.readers.get(outputs[0], ())
    full_y = keep or bool(outputs[0] and ctx.uses.get(outputs[0]))
    if full_y:
        y = ctx.define(outputs[0], y_shape)
    else:
        y = _temporary(ctx, f"{ctx.node_name}.Y", (dirs, batch, hidden))
    states = [ctx.define(name, state_shape) if name and ctx.uses.get(name) else NO_TENSOR
              for name in outputs[1:3 if kind == "LSTM" else 2]]   # Y_h[, Y_c]
    saved = _temporary(ctx, f"{outputs[0] or ctx.node_name}.saved",
                       (dirs, steps if keep else 1, batch, SLOT[kind] * hidden))
    if keep:
        ctx.local[_saved_key(outputs[0])] = saved
    tensors = [y] + states + [saved] + [ctx.t(node.input[k]) for k in (X, W, R)] \
        + [_optional(ctx, _input(node, B)), _state(ctx, _input(node, INITIAL_H))]
    if kind == "LSTM":
        tensors += [_state(ctx, _input(node, INITIAL_C)), _optional(ctx, _input(node, P))]
    ctx.step(op.GRU if kind == "GRU" else op.LSTM, tensors, geometry(config, keep, full_y))


@gradient("GRU", "LSTM")
def grad_recurrent(g, node, dys, needs):
    # GRUGrad(X, W, R, B, initial_h, Y, dY, dY_h) -> dX, dW, dR, dB, d initial_h
    # LSTMGrad(X, W, R, B, initial_h, initial_c, P, Y, dY, dY_h, dY_c) -> the same, d initial_c,
    # dP; outputs only where needed. sequence_lens (a constant) has no gradient.
    kind = node.op_type
    where = f"{kind} node '{node.name}'"
    config = recurrent_config(node, g.shape, g.constant_value, where)
    if not node.output or not node.output[0]:
        # The backward reads the hidden states from Y: give it a name.
        if not node.output:
            node.output.append("")
        node.output[0] = g.fresh(f"{node.name or kind}_Y")
        g.shapes[node.output[0]] = (g.shapes[node.input[X]][0], shapes(config)[1])
    forward = (X, W, R, B, INITIAL_H) + ((INITIAL_C, P) if kind == "LSTM" else ())
    need = list(needs) + [False] * 8
    outputs = [g.fresh(f"d{node.name or kind}_{INPUT_NAMES[k]}") if need[k] and _input(node, k)
               else "" for k in forward]
    grads = (list(dys) + [None] * 3)[:3 if kind == "LSTM" else 2]   # dY, dY_h[, dY_c]
    inputs = [_input(node, k) for k in forward] + [node.output[0]] + [d or "" for d in grads]
    out_shapes = [tuple(g.shape(_input(node, k))) if _input(node, k) else None for k in forward]
    g.node(f"{kind}Grad", inputs, out_shapes, outputs=outputs, domain=DOMAIN,
           hint=f"d{kind}", hidden_size=config[3], layout=config[6],
           direction=attr(node, "direction", "forward"))
    by_input = dict(zip(forward, outputs))
    return [by_input.get(k) or None for k in range(len(node.input))]


@lowering("GRUGrad", "LSTMGrad")
def lower_recurrent_grad(ctx, node):
    kind = GRAD_OF[node.op_type]
    lstm = kind == "LSTM"
    x, w, r = node.input[:3]
    y = node.input[7 if lstm else 5]
    saved = ctx.local.get(_saved_key(y))
    if saved is None:
        raise UnsupportedOpError(f"{ctx.where(node)}: the {kind} that computes '{y}' did not "
                                 f"keep its gates in this program")
    saved_shape = ctx.tensors[saved].shape
    steps, batch, n_in = (ctx.shape(x)[1], ctx.shape(x)[0], ctx.shape(x)[2]) \
        if attr(node, "layout", 0) else ctx.shape(x)
    dirs, hidden = saved_shape[0], attr(node, "hidden_size")
    direction = attr(node, "direction", "forward")
    config = (steps, batch, n_in, hidden, dirs, int(direction == "reverse"),
              attr(node, "layout", 0))
    outputs = [ctx.define(name) if name else NO_TENSOR
               for name in (list(node.output) + [""] * 7)[:7 if lstm else 5]]
    scratch = _temporary(ctx, f"{ctx.node_name}.scratch", ((2 if lstm else 1) * batch * hidden,))
    states = [_state(ctx, name) for name in node.input[4:6 if lstm else 5]]
    peephole = [_optional(ctx, node.input[6])] if lstm else []
    grads = [_optional(ctx, name) for name in node.input[8 if lstm else 6:]]
    tensors = outputs + [scratch, saved, ctx.t(x), ctx.t(w), ctx.t(r)] + states + peephole \
        + [ctx.t(y)] + grads
    ctx.step(op.LSTM_GRAD if lstm else op.GRU_GRAD, tensors, geometry(config, True))


# -- numpy references: float64, the ONNX equations, forward recomputed --------------------

def _sigmoid(v):
    return 1.0 / (1.0 + np.exp(-v))


def _time_major(x, y, dy, states, layout):
    """X [T, N, I], Y and dY [T, D, N, H], states [D, N, H] from either layout."""
    if not layout:
        return x, y, dy, states
    return (np.swapaxes(x, 0, 1), None if y is None else np.transpose(y, (1, 2, 0, 3)),
            None if dy is None else np.transpose(dy, (1, 2, 0, 3)),
            [None if s is None else np.swapaxes(s, 0, 1) for s in states])


def _steps(direction, d, steps):
    back = d == 1 or direction == "reverse"
    return list(range(steps - 1, -1, -1)) if back else list(range(steps))


def _recurrent_grad(kind, x, w, r, b, states, p, dy, dy_states, hidden, direction, layout):
    """dX, dW, dR, dB, d initial states..., dP of a GRU (linear_before_reset = 1) or LSTM."""
    f64 = lambda a: None if a is None else np.asarray(a, np.float64)  # noqa: E731
    direction = direction.decode() if isinstance(direction, bytes) else direction
    dtype = x.dtype
    x, _, dy, states = _time_major(f64(x), None, f64(dy), [f64(s) for s in states], layout)
    dy_states = _time_major(x, None, None, [f64(s) for s in dy_states], layout)[3]
    w, r, p = f64(w), f64(r), f64(p)
    steps, batch, _ = x.shape
    dirs, rows, _ = w.shape
    h = hidden
    b = np.zeros((dirs, 2 * rows)) if b is None else f64(b)
    dx, dw, dr, db = np.zeros_like(x), np.zeros_like(w), np.zeros_like(r), np.zeros_like(b)
    d_states = [np.zeros((dirs, batch, h)) for _ in states]
    dp = np.zeros((dirs, 3 * h))
    for d in range(dirs):
        order = _steps(direction, d, steps)
        wd, rd, wb, rb = w[d], r[d], b[d, :rows], b[d, rows:]
        hp = states[0][d] if states[0] is not None else np.zeros((batch, h))
        cp = states[1][d] if kind == "LSTM" and states[1] is not None else np.zeros((batch, h))
        pi, po, pf = np.split(p[d], 3) if p is not None else (np.zeros(h),) * 3
        cache = []
        for t in order:
            xw, hr = x[t] @ wd.T + wb, hp @ rd.T + rb
            if kind == "GRU":
                z = _sigmoid(xw[:, :h] + hr[:, :h])
                q = _sigmoid(xw[:, h:2 * h] + hr[:, h:2 * h])
                c = np.tanh(xw[:, 2 * h:] + q * hr[:, 2 * h:])
                cache.append((hp, z, q, c, hr[:, 2 * h:]))
                hp = (1 - z) * c + z * hp
            else:
                a = xw + hr
                i = _sigmoid(a[:, :h] + pi * cp)
                f = _sigmoid(a[:, 2 * h:3 * h] + pf * cp)
                c = np.tanh(a[:, 3 * h:])
                cell = f * cp + i * c
                o = _sigmoid(a[:, h:2 * h] + po * cell)
                cache.append((hp, cp, i, o, f, c, cell))
                hp, cp = o * np.tanh(cell), cell
        dh = np.zeros((batch, h)) if dy_states[0] is None else dy_states[0][d].copy()
        dc = np.zeros((batch, h)) if kind == "GRU" or dy_states[1] is None \
            else dy_states[1][d].copy()
        for t, saved in zip(reversed(order), reversed(cache)):
            g = dh + (dy[t, d] if dy is not None else 0.0)
            if kind == "GRU":
                prev, z, q, c, hn = saved
                da = g * (1 - z) * (1 - c * c)
                dz = g * (prev - c) * z * (1 - z)
                dq = da * hn * q * (1 - q)
                gx = np.concatenate([dz, dq, da], 1)
                gh = np.concatenate([dz, dq, da * q], 1)
                dh = g * z + gh @ rd
            else:
                prev, cp, i, o, f, c, cell = saved
                tc = np.tanh(cell)
                dao = g * tc * o * (1 - o)
                dcell = dc + g * o * (1 - tc * tc) + dao * po
                dai = dcell * c * i * (1 - i)
                daf = dcell * cp * f * (1 - f)
                dac = dcell * i * (1 - c * c)
                dc = dcell * f + dai * pi + daf * pf
                dp[d] += np.concatenate([(dai * cp).sum(0), (dao * cell).sum(0),
                                         (daf * cp).sum(0)])
                gx = gh = np.concatenate([dai, dao, daf, dac], 1)
                dh = gh @ rd
            dw[d] += gx.T @ x[t]
            dr[d] += gh.T @ prev
            db[d, :rows] += gx.sum(0)
            db[d, rows:] += gh.sum(0)
            dx[t] += gx @ wd
        d_states[0][d] = dh
        if kind == "LSTM":
            d_states[1][d] = dc
    if layout:
        dx = np.swapaxes(dx, 0, 1)
        d_states = [np.swapaxes(s, 0, 1) for s in d_states]
    results = [dx, dw, dr, db] + d_states + ([dp] if kind == "LSTM" else [])
    return tuple(np.ascontiguousarray(v).astype(dtype) for v in results)


class GRUGrad(MicrotrainOp):
    """dX, dW, dR, dB, d initial_h of a GRU (linear_before_reset = 1) from dY and dY_h."""

    def _run(self, x, w, r, b=None, initial_h=None, y=None, dy=None, dy_h=None,
             hidden_size=None, direction="forward", layout=0):
        return _recurrent_grad("GRU", x, w, r, b, [initial_h], None, dy, [dy_h], hidden_size,
                               direction, layout)


class LSTMGrad(MicrotrainOp):
    """dX, dW, dR, dB, d initial_h, d initial_c, dP of an LSTM from dY, dY_h and dY_c."""

    def _run(self, x, w, r, b=None, initial_h=None, initial_c=None, p=None, y=None, dy=None,
             dy_h=None, dy_c=None, hidden_size=None, direction="forward", layout=0):
        return _recurrent_grad("LSTM", x, w, r, b, [initial_h, initial_c], p, dy,
                               [dy_h, dy_c], hidden_size, direction, layout)
