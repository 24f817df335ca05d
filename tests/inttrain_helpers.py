"""Arenas and args for calling kernels/inttrain.py directly (tests/test_inttrain.py and its
MicroPython scripts share the layout through this host-side builder)."""
from array import array

import numpy as np

from microtrain.kernels import inttrain as K
from microtrain.kernels.fixedpoint import f32, requant_pair
from microtrain_host.ops.inttrain import LOGIT_BITS, exp_table


class Layer:
    """One int8 classifier layer in arenas: x [m, k] uint8 at Q[0:], W [n, k] int8 after it;
    ints: bias, logits req, logits, grad, loss, labels, exp table, update rates."""

    def __init__(self, x, x_zp, w, bias, sx, sw, labels, lr, signed=False):
        m, k = x.shape
        n = w.shape[0]
        self.m, self.k, self.n = m, k, n
        self.Q = bytearray(np.concatenate([x.astype(np.int64) & 255,
                                           w.astype(np.int64) & 255]).astype(np.uint8).tobytes())
        self.x, self.w = 0, m * k
        req = [x_zp]
        for j in range(n):
            req += requant_pair(f32(f32(sx * float(sw[j])) * 2 ** LOGIT_BITS))
        rates = K.rate_values(x_zp, K.update_reals(sx, [float(s) for s in sw], m, lr))
        parts = [("bias", list(bias)), ("req", req), ("z", [0] * (m * n)), ("g", [0] * (m * n)),
                 ("loss", [0] * (2 * m)), ("labels", list(labels)),
                 ("table", exp_table().tolist()), ("rates", rates)]
        values = []
        for name, v in parts:
            setattr(self, name, len(values))
            values += [int(t) for t in v]
        self.I = array("i", values)
        self.signed = int(signed)

    def forward(self):
        K.int_gemm_logits(None, self.I, (self.Q, self.z, self.x, self.w, self.bias, self.req,
                                         self.m, self.k, self.n, self.signed))
        K.int_softmax_ce(None, self.I, (self.z, self.g, self.loss, self.labels, self.table,
                                        self.m, self.n))

    def update(self):
        K.int_gemm_update(None, self.I, (self.Q, self.w, self.bias, self.x, self.g, self.rates, -1,
                                         self.m, self.k, self.n, self.signed))

    def weights(self):
        return np.frombuffer(bytes(self.Q[self.w:self.w + self.n * self.k]),
                             np.int8).reshape(self.n, self.k).copy()

    def ints(self, name, count):
        at = getattr(self, name)
        return np.array(self.I[at:at + count], np.int64)
