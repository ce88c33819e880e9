"""The fuzzer's oracle: every operator in float64 numpy, written from MIOpen's formulas
(shared/reference/miopen-facts.md), sharing no code with fusionplan's solvers or its reference.

NaN and Inf follow IEEE arithmetic and torch's unfused ops: max(NaN, 0) is NaN, inf * 0 is NaN,
and a product over padding (outside the input) contributes nothing.
"""

from __future__ import annotations

import math

import numpy as np

POWER_EPS = 1e-6


def conv2d(x: np.ndarray, w: np.ndarray, pad, stride, dil, groups: int) -> np.ndarray:
    """Cross-correlation of x (N, C, H, W) with w (K, C/groups, R, S), as a sum over taps."""
    n, c, h, wd = x.shape
    k, cg, r, s = w.shape
    oh = (h + 2 * pad[0] - dil[0] * (r - 1) - 1) // stride[0] + 1
    ow = (wd + 2 * pad[1] - dil[1] * (s - 1) - 1) // stride[1] + 1
    kg = k // groups
    y = np.zeros((n, k, oh, ow))
    for i in range(r):
        for j in range(s):
            rows = i * dil[0] - pad[0] + stride[0] * np.arange(oh)
            cols = j * dil[1] - pad[1] + stride[1] * np.arange(ow)
            rok, cok = (rows >= 0) & (rows < h), (cols >= 0) & (cols < wd)
            if not rok.any() or not cok.any():
                continue
            ri, ci = np.nonzero(rok)[0], np.nonzero(cok)[0]
            taps = x[:, :, rows[rok]][:, :, :, cols[cok]]  # only real input: padding contributes nothing
            for g in range(groups):
                part = taps[:, g * cg : (g + 1) * cg]
                wt = w[g * kg : (g + 1) * kg, :, i, j]
                # explicit products and sum (no BLAS): inf * 0 stays NaN, as IEEE says
                prod = (part[:, None, :, :, :] * wt[None, :, :, None, None]).sum(axis=2)
                y[:, g * kg : (g + 1) * kg, ri[:, None], ci[None, :]] += prod
    return y


def activation(mode: int, x: np.ndarray, a: float, b: float, g: float) -> np.ndarray:
    """MIOpen's forward formulas, by mode number (PASTHRU 0 ... ELU 9)."""
    with np.errstate(all="ignore"):
        if mode == 0:
            return x.copy()
        if mode == 1:
            return 1.0 / (1.0 + np.exp(-x))
        if mode == 2:
            return b * np.tanh(a * x)
        if mode == 3:
            return np.maximum(x, 0.0)
        if mode == 4:
            return np.maximum(x, 0.0) + np.log1p(np.exp(-np.abs(x)))
        if mode == 5:
            return np.abs(x)
        if mode == 6:
            base = a + b * x
            live = base > POWER_EPS
            return np.where(live, np.power(np.where(live, base, 1.0), g), 0.0)
        if mode == 7:
            return np.minimum(np.maximum(x, 0.0), a)
        if mode in (8, 106):  # LEAKYRELU; PReLU, ``a`` its slopes (1, C, 1, 1)
            return np.where(x > 0, x, a * x)
        if mode == 9:
            return np.where(x > 0, x, a * np.expm1(np.minimum(x, 0.0)))
        if mode in EXTENSIONS:
            return EXTENSIONS[mode][0](x)
    raise ValueError(f"activation mode {mode}")


def activation_backward(mode: int, dy: np.ndarray, x: np.ndarray, a: float, b: float, g: float) -> np.ndarray:
    """dx of the forward formulas, in terms of the activation's input x (the calculus)."""
    with np.errstate(all="ignore"):
        if mode == 0:
            return dy.copy()
        if mode == 1:
            s = 1.0 / (1.0 + np.exp(-x))
            return dy * s * (1 - s)
        if mode == 2:
            t = np.tanh(a * x)
            return dy * a * b * (1 - t * t)
        if mode == 3:
            return dy * (x > 0)
        if mode == 4:
            return dy / (1.0 + np.exp(-x))
        if mode == 5:
            return dy * np.sign(x)
        if mode == 6:
            base = a + b * x
            live = base > POWER_EPS
            return np.where(live, dy * b * g * np.power(np.where(live, base, 1.0), g - 1), 0.0)
        if mode == 7:
            return dy * ((x > 0) & (x <= a))
        if mode == 8:
            return dy * np.where(x > 0, 1.0, a)
        if mode == 9:
            return dy * np.where(x > 0, 1.0, a * np.exp(np.minimum(x, 0.0)))
        if mode in EXTENSIONS:
            return dy * EXTENSIONS[mode][1](x)
    raise ValueError(f"activation mode {mode}")


# -- fusionplan's extension modes (100-105: SiLU, Hardswish, Hardsigmoid, GELU, GELU's tanh form,
# Mish), from their definitions: each (forward, derivative), parameterless ------------------------
def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def _softplus(x: np.ndarray) -> np.ndarray:
    return np.maximum(x, 0.0) + np.log1p(np.exp(-np.abs(x)))


_erf = np.vectorize(math.erf, otypes=[float])
_GELU_K = math.sqrt(2.0 / math.pi)


def _gelu_tanh(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.tanh(_GELU_K * (x + 0.044715 * x**3)))


def _gelu_tanh_grad(x: np.ndarray) -> np.ndarray:
    t = np.tanh(_GELU_K * (x + 0.044715 * x**3))
    return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * _GELU_K * (1.0 + 3 * 0.044715 * x * x)


def _mish_grad(x: np.ndarray) -> np.ndarray:
    t = np.tanh(_softplus(x))
    return t + x * (1.0 - t * t) * _sigmoid(x)


EXTENSIONS = {
    100: (lambda x: x * _sigmoid(x), lambda x: _sigmoid(x) * (1.0 + x * (1.0 - _sigmoid(x)))),
    101: (
        lambda x: x * np.clip(x + 3.0, 0.0, 6.0) / 6.0,
        lambda x: np.where(x <= -3.0, 0.0, np.where(x < 3.0, (2.0 * x + 3.0) / 6.0, 1.0)),  # torch's ends
    ),
    102: (lambda x: np.clip(x / 6.0 + 0.5, 0.0, 1.0), lambda x: np.where((x > -3.0) & (x < 3.0), 1.0 / 6.0, 0.0)),
    103: (
        lambda x: 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0))),
        lambda x: 0.5 * (1.0 + _erf(x / math.sqrt(2.0))) + x * np.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi),
    ),
    104: (_gelu_tanh, _gelu_tanh_grad),
    105: (lambda x: x * np.tanh(_softplus(x)), _mish_grad),
}


def blend(r: np.ndarray, alpha: float, beta: float, prior: np.ndarray | None) -> np.ndarray:
    """alpha * r + beta * prior; the prior is not read where beta is 0."""
    out = r if alpha == 1 else alpha * r
    return out + beta * prior if beta != 0 else out


def stat_axes(per_activation: bool) -> tuple[int, ...]:
    return (0,) if per_activation else (0, 2, 3)


def batchnorm_inference(x, scale, bias, mean, var, eps):
    with np.errstate(all="ignore"):
        return scale * (x - mean) / np.sqrt(var + eps) + bias


def batchnorm_training(x, scale, bias, eps, per_activation: bool):
    """(y, mean, inverse std, biased variance, count) of batch-norm forward training."""
    axes = stat_axes(per_activation)
    mean = x.mean(axis=axes, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=axes, keepdims=True)
    inv = 1.0 / np.sqrt(var + eps)
    count = x.size // mean.size
    return scale * (x - mean) * inv + bias, mean, inv, var, count


def batchnorm_backward(g, x, scale, saved_mean, saved_inv, per_activation: bool):
    """(dx, dscale, dbias) from the gradient g of batch-norm's output."""
    axes = stat_axes(per_activation)
    xhat = (x - saved_mean) * saved_inv
    count = g.size // saved_mean.size
    dbias = g.sum(axis=axes, keepdims=True)
    dscale = (g * xhat).sum(axis=axes, keepdims=True)
    dx = scale * saved_inv * (g - dbias / count - xhat * dscale / count)
    return dx, dscale, dbias
