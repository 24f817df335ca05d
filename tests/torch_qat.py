"""The PyTorch side of the quantization-aware training tests: the same fake-quant
configuration as microtrain's QAT (quant/quantize.py), built from PyTorch's own
torch.ao.quantization modules, so the oracle's rounding, observers and gradients are
PyTorch's code, not ours:

  * weights: FakeQuantize with a PerChannelMinMaxObserver (per_channel_symmetric, qint8,
    [-127, 127]) reset before every forward, so the scale is max|w| / 127 of the current
    weights (clamped at float32 eps) at every step;
  * activations: FakeQuantize with a MovingAverageMinMaxObserver (per_tensor_affine, quint8
    [0, 255] or qint8 [-128, 127], averaging constant 0.01), observing in training,
    frozen (disable_observer) for evaluation.

The placement of the activation fake quantizations is written out by hand per model below
(where microtrain's pass puts them: the input of each quantized op, the output of each
quantized op after its BatchNorm / ReLU, the output of global average pooling).

Float32 storage, float64 arithmetic. The device keeps every tensor in float32 and computes
each op in double (CPython, the Unix port). A quantized network amplifies the difference
between two float32 implementations: PyTorch's float32 convolutions sum in another order, so
a value lands on the other side of a rounding tie now and then and the losses part by 1e-3
within 50 steps. So the oracle runs in float64 and rounds to float32 wherever the device
stores a tensor (`stored`: after every op, forward and backward, and the parameters and
optimizer state after every step); the fake quantizations themselves run in float32,
PyTorch's kernels. What remains is the order of double-precision sums, far below float32's
rounding."""
import copy
import math

import numpy as np
import torch
from torch import nn
from torch.ao.quantization import FakeQuantize
from torch.ao.quantization.observer import (MovingAverageMinMaxObserver,
                                            PerChannelMinMaxObserver)


def activation_fake_quant(dtype="uint8", momentum=0.01):
    qmin, qmax, qdtype = (0, 255, torch.quint8) if dtype == "uint8" else (-128, 127, torch.qint8)
    return FakeQuantize(observer=MovingAverageMinMaxObserver, quant_min=qmin, quant_max=qmax,
                        dtype=qdtype, qscheme=torch.per_tensor_affine,
                        averaging_constant=momentum)


def stored(t):
    """t rounded to float32 and back: a tensor as the device stores it (the gradient flowing
    back through it is rounded the same way)."""
    return t.float().double() if t.dtype == torch.float64 else t


class Stored(nn.Module):
    """A FakeQuantize on the float32 value of a float64 tensor."""

    def __init__(self, fake_quant):
        super().__init__()
        self.fq = fake_quant

    def forward(self, t):
        return self.fq(t.float()).double() if t.dtype == torch.float64 else self.fq(t)


class WeightFakeQuant(nn.Module):
    """max|w| / 127 per output channel, from the current weights at every call."""

    def __init__(self, axis=0):
        super().__init__()
        self.fq = FakeQuantize(observer=PerChannelMinMaxObserver, quant_min=-127, quant_max=127,
                               dtype=torch.qint8, qscheme=torch.per_channel_symmetric,
                               ch_axis=axis)

    def forward(self, w):
        self.fq.activation_post_process.reset_min_max_vals()
        return self.fq(w.float()).double() if w.dtype == torch.float64 else self.fq(w)


def _row_sums_f32(dy, dims):
    """Sum dy over dims other than 1 (batch first) the way the device's ReduceSum does for a
    bias gradient: each image's (or row's) partial sum in double, added into a float32
    result image after image."""
    total = torch.zeros(dy.shape[1], dtype=dy.dtype)
    for n in range(dy.shape[0]):
        part = dy[n].sum(dims) if dims else dy[n]
        total = stored(total + part)
    return total


class DeviceLinear(torch.autograd.Function):
    """F.linear in float64, rounded as the device stores it: Y, dX and dW each summed in
    double and rounded once; dB accumulated row by row in float32 (kernels/reduce.py)."""

    @staticmethod
    def forward(ctx, x, w, b):
        ctx.save_for_backward(x, w)
        return stored(x @ w.t() + b)

    @staticmethod
    def backward(ctx, dy):
        x, w = ctx.saved_tensors
        return stored(dy @ w), stored(dy.t() @ x), _row_sums_f32(dy, ())


class DeviceConv(torch.autograd.Function):
    """A 2-D convolution in float64 in the device's order (kernels/conv.py): every tap,
    then every input channel, added into the float32 output; dX likewise, tap by tap and
    output channel by output channel; dW summed in double and rounded once; dB image by
    image in float32."""

    @staticmethod
    def forward(ctx, x, w, b, stride, padding, dilation, groups):
        n, c_in, h, wd = x.shape
        m, cg, kh, kw = w.shape
        (sh, sw), (ph, pw), (dh, dw) = stride, padding, dilation
        oh = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1
        ow = (wd + 2 * pw - dw * (kw - 1) - 1) // sw + 1
        xp = torch.nn.functional.pad(x, (pw, pw, ph, ph))
        start = b if b is not None else torch.zeros(m, dtype=x.dtype)
        y = start.view(1, m, 1, 1).expand(n, m, oh, ow).clone()
        inputs_of = (torch.arange(m) // (m // groups)) * cg
        for ky in range(kh):
            for kx in range(kw):
                window = xp[:, :, ky * dh:ky * dh + sh * (oh - 1) + 1:sh,
                            kx * dw:kx * dw + sw * (ow - 1) + 1:sw]
                for c in range(cg):
                    y = stored(y + w[:, c, ky, kx].view(1, m, 1, 1) * window[:, inputs_of + c])
        ctx.save_for_backward(x, w)
        ctx.geometry = (stride, padding, dilation, groups, oh, ow, b is not None)
        return y

    @staticmethod
    def backward(ctx, dy):
        x, w = ctx.saved_tensors
        (sh, sw), (ph, pw), (dh, dw), groups, oh, ow, has_bias = ctx.geometry
        n, c_in, h, wd = x.shape
        m, cg, kh, kw = w.shape
        xp = torch.nn.functional.pad(x, (pw, pw, ph, ph))
        dxp = torch.zeros_like(xp)
        dw_ = torch.zeros_like(w)
        inputs_of = (torch.arange(m) // (m // groups)) * cg
        for ky in range(kh):
            for kx in range(kw):
                rows = slice(ky * dh, ky * dh + sh * (oh - 1) + 1, sh)
                cols = slice(kx * dw, kx * dw + sw * (ow - 1) + 1, sw)
                for mo in range(m):
                    for c in range(cg):
                        ci = int(inputs_of[mo]) + c
                        dxp[:, ci, rows, cols] = stored(dxp[:, ci, rows, cols]
                                                        + w[mo, c, ky, kx] * dy[:, mo])
                        dw_[mo, c, ky, kx] = (dy[:, mo] * xp[:, ci, rows, cols]).sum()
        dx = dxp[:, :, ph:ph + h, pw:pw + wd]
        db = _row_sums_f32(dy, (1, 2)) if has_bias else None
        return dx, stored(dw_), db, None, None, None, None


class QATLinear(nn.Module):
    def __init__(self, linear):
        super().__init__()
        self.linear = linear
        self.wfq = WeightFakeQuant(0)

    def forward(self, x):
        if x.dtype == torch.float64:
            return DeviceLinear.apply(x, self.wfq(self.linear.weight), self.linear.bias)
        return nn.functional.linear(x, self.wfq(self.linear.weight), self.linear.bias)


class QATConv(nn.Module):
    def __init__(self, conv):
        super().__init__()
        self.conv = conv
        self.wfq = WeightFakeQuant(0)

    def forward(self, x):
        conv = self.conv
        if x.dtype == torch.float64:
            return DeviceConv.apply(x, self.wfq(conv.weight), conv.bias, conv.stride,
                                    conv.padding, conv.dilation, conv.groups)
        return conv._conv_forward(x, self.wfq(conv.weight), conv.bias)


def activations(count, dtype, momentum):
    return nn.ModuleList(Stored(activation_fake_quant(dtype, momentum)) for _ in range(count))


def set_observing(module, on):
    for m in module.modules():
        if isinstance(m, FakeQuantize):
            (m.enable_observer if on else m.disable_observer)()


class QATMLP(nn.Module):
    """Flatten -> Linear -> ReLU -> Linear (the digits MLP): activations at the input, after
    the ReLU, at the logits."""

    def __init__(self, sequential, dtype="uint8", momentum=0.01):
        super().__init__()
        _, fc1, _, fc2 = sequential
        self.fc1, self.fc2 = QATLinear(fc1), QATLinear(fc2)
        self.fq = activations(3, dtype, momentum)

    def forward(self, x):
        x = self.fq[0](torch.flatten(x, 1))
        x = self.fq[1](stored(torch.relu(self.fc1(x))))
        return self.fq[2](self.fc2(x))

    def ranges(self):
        return ranges_of(self.fq)


class QATLeNet(nn.Module):
    """tests/reference_models.lenet: the input, after each ReLU (MaxPool keeps the grid), the
    logits."""

    def __init__(self, sequential, dtype="uint8", momentum=0.01):
        super().__init__()
        c1, _, p1, c2, _, p2, _, f1, _, f2 = sequential
        self.c1, self.c2, self.f1, self.f2 = QATConv(c1), QATConv(c2), QATLinear(f1), QATLinear(f2)
        self.p1, self.p2 = p1, p2
        self.fq = activations(5, dtype, momentum)

    def forward(self, x):
        x = self.fq[0](x)
        x = self.p1(self.fq[1](stored(torch.relu(self.c1(x)))))
        x = self.p2(self.fq[2](stored(torch.relu(self.c2(x)))))
        x = self.fq[3](stored(torch.relu(self.f1(torch.flatten(x, 1)))))
        return self.fq[4](self.f2(x))

    def ranges(self):
        return ranges_of(self.fq)


class QATDSCNN(nn.Module):
    """tests/reference_models.DSCNN: the input, after every BatchNorm + ReLU, after global
    average pooling, the logits."""

    def __init__(self, dscnn, dtype="uint8", momentum=0.01):
        super().__init__()
        m = copy.deepcopy(dscnn)
        stem_conv, self.stem_bn, _ = m.stem
        self.stem = QATConv(stem_conv)
        layers = list(m.blocks)
        self.convs = nn.ModuleList(QATConv(layers[i]) for i in range(0, len(layers), 3))
        self.bns = nn.ModuleList(layers[i] for i in range(1, len(layers), 3))
        self.classifier = QATLinear(m.classifier)
        self.pool = m.pool
        self.fq = activations(len(self.convs) + 4, dtype, momentum)

    def forward(self, x):
        x = self.fq[0](x)
        x = self.fq[1](stored(torch.relu(stored(self.stem_bn(self.stem(x))))))
        for k, (conv, bn) in enumerate(zip(self.convs, self.bns)):
            x = self.fq[2 + k](stored(torch.relu(stored(bn(conv(x))))))
        x = self.fq[-2](stored(self.pool(x)))
        return self.fq[-1](self.classifier(torch.flatten(x, 1)))

    def ranges(self):
        return ranges_of(self.fq)


def ranges_of(fake_quants):
    return [(float(f.fq.activation_post_process.min_val),
             float(f.fq.activation_post_process.max_val)) for f in fake_quants]


def qat_train(model, optimizer, xs, ys, lr, eps=1e-6, betas=(0.9, 0.999)):
    """Train the float64 QAT model (cross-entropy) with torch.optim: SGD, or AdamW made to
    follow ORT's rule as torch_reference.torch_train does; parameters, BatchNorm statistics,
    gradients and optimizer moments rounded to float32 as the device stores them. AdamW's
    betas and eps are the float32 values the blob holds (0.9 is 0.89999997615...), as the
    device's kernels and ORT's float attributes use them: with 0.999 itself, 1 - beta2
    differs by 1.3e-5 relative and every update by up to 6.4e-6. Returns the losses."""
    f32 = lambda v: float(np.float32(v))  # noqa: E731
    betas, eps = (f32(betas[0]), f32(betas[1])), f32(eps)
    model = model.double().train()
    for m in model.modules():
        if isinstance(m, FakeQuantize):
            m.float()    # scales, zero points and observers stay float32 (PyTorch's kernels)
    if optimizer == "SGD":
        opt = torch.optim.SGD(model.parameters(), lr=lr)
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=betas, eps=eps,
                                weight_decay=0.0)
    criterion = nn.CrossEntropyLoss()
    losses = []
    for t, (x, y) in enumerate(zip(xs, ys), start=1):
        opt.zero_grad()
        loss = criterion(model(torch.from_numpy(x).double()), torch.from_numpy(y))
        loss.backward()
        losses.append(loss.item())
        with torch.no_grad():
            for p in model.parameters():   # the device's gradient buffers are float32
                if p.grad is not None:
                    p.grad.copy_(stored(p.grad))
        if optimizer == "AdamW":
            for group in opt.param_groups:
                group["eps"] = eps / math.sqrt(1.0 - betas[1] ** t)
        opt.step()
        with torch.no_grad():
            tensors = list(model.parameters()) + list(model.buffers())
            tensors += [v for state in opt.state.values() for v in state.values()
                        if torch.is_tensor(v) and v.dtype == torch.float64]
            for v in tensors:
                if v.dtype == torch.float64:
                    v.copy_(stored(v))
    return losses
