"""The device kernels under single-precision arithmetic, as on microcontroller builds of
MicroPython (MICROPY_FLOAT_IMPL_FLOAT: every float operation rounds to float32). The arena
below returns numpy.float32 scalars, so with NumPy 2's scalar rules every sum and product a
kernel makes rounds to float32 too; results are compared with float64 numpy and torch's
float32. (The emulated Cortex-M3 run in test_board_qemu.py checks whole training runs.)"""
from array import array

import numpy as np
import torch

from microtrain.kernels import loss, optim, reduce

assert np.float32(1) + 1e-8 == np.float32(1), "needs NumPy 2's weak Python scalars"


class Float32Arena:
    """An array('f') whose reads are numpy.float32: arithmetic on them stays float32."""

    def __init__(self, values):
        self.values = array("f", values)

    def __getitem__(self, i):
        return np.float32(self.values[i])

    def __setitem__(self, i, v):
        self.values[i] = float(v)


def test_long_row_sum_stays_accurate_in_float32():
    # 50,000 positive terms: the worst case for a running float32 sum (relative error 9e-7
    # before the sum went in blocks)
    n = 50_000
    x = (np.random.default_rng(0).random(n) + 0.5).astype(np.float32)
    F = Float32Arena(list(x) + [0.0])
    reduce.reduce_sum(F, None, (n, 0, 1, 1, n, 0, 0, 0, 1, 1.0))
    exact = x.astype(np.float64).sum()
    assert abs(F.values[n] - exact) / exact < 4e-7


def test_gradient_norm_stays_accurate_in_float32():
    # the global norm for clipping sums the squares of every gradient of a parameter: 1e-5
    # relative error over 50,000 terms with a running sum, 2.4e-8 in blocks (as numpy's)
    n = 50_000
    g = np.random.default_rng(1).standard_normal(n).astype(np.float32)
    F = Float32Arena(list(g) + [0.0] * n + [0.0])
    optim.grad_norm_squared(F, None, (2 * n, 0, n, n, 1, 0.0, 0.0))
    exact = (g.astype(np.float64) ** 2).sum()
    assert abs(F.values[2 * n] - exact) / exact < 1e-6


def test_softmax_cross_entropy_with_large_logits_in_float32():
    # exp(100) overflows float32 (max 3.4e38): the kernel must shift by the row's maximum
    scores = np.array([[100.0, 90.0, -50.0], [-80.0, -79.0, -120.0]], np.float32)
    labels = [1, 0]
    F = Float32Arena([0.0] + list(scores.ravel()) + [0.0] * 6)
    I = array("i", labels)
    loss.softmax_cross_entropy(F, I, (0, 7, 1, 0, 2, 3))
    expected = torch.nn.functional.cross_entropy(torch.tensor(scores), torch.tensor(labels))
    assert np.isfinite(F.values[0])
    assert abs(F.values[0] - expected.item()) <= 1e-6 * abs(expected.item())


def test_adamw_steps_in_float32_match_torch_float32():
    # ten AdamW steps (ORT's rule: eps outside the bias correction, as torch_reference
    # reproduces with torch.optim.AdamW) on gradients spanning eight orders of magnitude
    rng = np.random.default_rng(2)
    n, lr, eps = 64, 0.01, 1e-6
    p0 = rng.standard_normal(n).astype(np.float32)
    grads = [(rng.standard_normal(n) * 10.0 ** rng.integers(-6, 2, n)).astype(np.float32)
             for _ in range(10)]
    # arena: p, g, m, v, lr, step size
    F = Float32Arena(list(p0) + [0.0] * (3 * n) + [lr, 0.0])
    param = torch.tensor(p0, requires_grad=True)
    opt = torch.optim.AdamW([param], lr=lr, betas=(0.9, 0.999), eps=eps, weight_decay=0.0)
    for t, g in enumerate(grads, start=1):
        for i in range(n):
            F[n + i] = g[i]
        # the Optimizer's step size, in float32 arithmetic as on a board
        b1t, b2t = np.float32(0.9) ** t, np.float32(0.999) ** t
        F[4 * n + 1] = np.float32(lr) * np.sqrt(np.float32(1) - b2t) / (np.float32(1) - b1t)
        optim.adamw(F, None, (0, n, 2 * n, 3 * n, 4 * n, 4 * n + 1, n, 0.9, 0.999, eps, 0.0))
        param.grad = torch.tensor(g)
        opt.param_groups[0]["eps"] = eps / np.sqrt(1.0 - 0.999 ** t)
        opt.step()
    got = np.array(F.values[:n])
    want = param.detach().numpy()
    assert np.max(np.abs(got - want)) <= 2e-6 * np.max(np.abs(want))


# -- exp at the float32 edges -----------------------------------------------------------------

EDGES = [-3.4e38, -1e30, -104.0, -88.8, -1.0, 0.0, 1.0, 80.0, 88.72, 88.7228, 88.7229, 88.75,
         88.79, 89.0, 1e30, 3.4e38, float("inf"), float("-inf"), float("nan")]


def board_exp(x):
    """math.exp as a single-precision MicroPython build computes it: a float32 result, and
    ValueError('math domain error') where that overflows for a finite x (seen on the
    emulated Cortex-M3 for 88.7229 <= x < 88.8)."""
    with np.errstate(over="ignore"):
        r = np.exp(np.float32(x))
    if np.isinf(r) and np.isfinite(x):
        raise ValueError("math domain error")
    return r


def _same(got, expected):
    got, expected = np.asarray(got, np.float64), np.asarray(expected, np.float64)
    assert np.array_equal(np.isnan(got), np.isnan(expected)), (got, expected)
    assert np.array_equal(np.isinf(got), np.isinf(expected)), (got, expected)
    finite = np.isfinite(expected)
    np.testing.assert_allclose(got[finite], expected[finite], rtol=2e-6, atol=1e-37)


def test_exp_kernels_saturate_at_the_float32_edges(monkeypatch):
    # Exp, Sigmoid, Softmax, the Elu family and the gradients that take exp of a log-softmax
    # output, with every float rounded to float32 and math.exp raising as a board's does:
    # no ValueError, and torch's float32 results (inf where float32 overflows, NaN for NaN).
    import math
    from microtrain.kernels import activation, elementwise, smooth
    monkeypatch.setattr(math, "exp", board_exp)
    n = len(EDGES)
    x = torch.tensor(EDGES, dtype=torch.float32)
    dy = torch.linspace(-1, 1, n, dtype=torch.float32)

    def run(kernel, args, inputs):
        F = Float32Arena([v for block in inputs for v in block] + [0.0] * n)
        kernel(F, array("i", [0] * 4), args(sum(len(b) for b in inputs)))
        return list(F.values)[-n:]

    _same(run(elementwise.exp, lambda out: (out, 0, n), [EDGES]), torch.exp(x))
    _same(run(activation.sigmoid, lambda out: (out, 0, n), [EDGES]), torch.sigmoid(x))
    finite = x[torch.isfinite(x)]
    m = len(finite)
    F = Float32Arena(list(finite.numpy()) + [0.0] * m)
    activation.softmax(F, None, (m, 0, 1, m, 1))
    _same(list(F.values)[m:], torch.softmax(finite, 0))
    for alpha, scale, k in ((1.0, 1.0, 1.0), (1.6733, 1.0507, 1.0), (0.5, 1.0, 2.0)):
        reference = scale * torch.where(x > 0, x, alpha * torch.expm1(k * x))
        _same(run(smooth.exp_linear, lambda out: (out, 0, n, alpha, scale, k), [EDGES]),
              reference)
        slope = torch.where(x > 0, torch.tensor(scale), scale * alpha * k * torch.exp(k * x))
        _same(run(smooth.exp_linear_grad, lambda out: (out, 0, n, n, alpha, scale, k),
                  [list(dy.numpy()), EDGES]), dy * slope)
    # log-softmax gradient: dx = dy - exp(y) * sum(dy), y as given (edges included)
    _same(run(activation.log_softmax_grad, lambda out: (out, 0, n, 1, n, 1),
              [list(dy.numpy()), EDGES]), dy - torch.exp(x) * dy.sum())
    # cross-entropy gradient: (exp(log_prob) - onehot) * dloss / n_rows, one row
    F = Float32Arena(EDGES + [0.5] + [0.0] * n)
    I = array("i", [2])
    loss.softmax_cross_entropy_grad(F, I, (n + 1, n, 0, 0, 1, n))
    expected = torch.exp(x) * 0.5
    expected[2] -= 0.5
    _same(list(F.values)[n + 1:], expected)
