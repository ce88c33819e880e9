"""The activation modes (MIOpen's ten and fusionplan's extensions): forward and backward formulas,
as torch ops in any dtype.

alpha, beta, gamma are MIOpen's activAlpha, activBeta, activGamma. Backward formulas are
written in terms of the activation's input x (the calculus; MIOpen's POWER backward, which
ignores dy, is a bug we do not copy). Each entry is one row of one table, so that a new mode
is one new entry; kernels generate their code from their own table with the same rows.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from fusionplan.core.enums import ActivationMode

#: POWER gives 0 where alpha + beta*x <= POWER_EPS (MIOpen's threshold).
POWER_EPS = 1e-6

Tensor = torch.Tensor
Forward = Callable[[Tensor, float, float, float], Tensor]
Backward = Callable[[Tensor, Tensor, float, float, float], Tensor]


@dataclass(frozen=True)
class ActivationFormula:
    mode: ActivationMode
    formula: str  # forward, as text for docs and error messages
    params: tuple[str, ...]  # which of alpha, beta, gamma the formula reads
    forward: Forward  # (x, alpha, beta, gamma) -> y
    backward: Backward  # (dy, x, alpha, beta, gamma) -> dx


def _power_base(x: Tensor, a: float, b: float) -> Tensor:
    return a + b * x


def _power_forward(x: Tensor, a: float, b: float, g: float) -> Tensor:
    base = _power_base(x, a, b)
    live = base > POWER_EPS
    return torch.where(live, base.clamp_min(POWER_EPS).pow(g), torch.zeros_like(base))


def _power_backward(dy: Tensor, x: Tensor, a: float, b: float, g: float) -> Tensor:
    base = _power_base(x, a, b)
    live = base > POWER_EPS
    grad = b * g * base.clamp_min(POWER_EPS).pow(g - 1)
    return torch.where(live, dy * grad, torch.zeros_like(dy))


def _softrelu_forward(x: Tensor, a: float, b: float, g: float) -> Tensor:
    # log(1 + e^x) without overflow: max(x, 0) + log1p(e^-|x|)
    return torch.clamp_min(x, 0) + torch.log1p(torch.exp(-torch.abs(x)))


def _tanh_backward(dy: Tensor, x: Tensor, a: float, b: float, g: float) -> Tensor:
    t = torch.tanh(a * x)
    return dy * (a * b) * (1 - t * t)


def _logistic_backward(dy: Tensor, x: Tensor, a: float, b: float, g: float) -> Tensor:
    s = torch.sigmoid(x)
    return dy * s * (1 - s)


def _where_positive(x: Tensor, pos: Tensor | float, neg: Tensor | float) -> Tensor:
    pos_t = pos if isinstance(pos, Tensor) else torch.full_like(x, pos)
    neg_t = neg if isinstance(neg, Tensor) else torch.full_like(x, neg)
    return torch.where(x > 0, pos_t, neg_t)


ACTIVATIONS: dict[ActivationMode, ActivationFormula] = {
    f.mode: f
    for f in (
        ActivationFormula(
            ActivationMode.PASTHRU,
            "y = x",
            (),
            lambda x, a, b, g: x.clone(),
            lambda dy, x, a, b, g: dy.clone(),
        ),
        ActivationFormula(
            ActivationMode.LOGISTIC,
            "y = 1 / (1 + exp(-x))",
            (),
            lambda x, a, b, g: torch.sigmoid(x),
            _logistic_backward,
        ),
        ActivationFormula(
            ActivationMode.TANH,
            "y = beta * tanh(alpha * x)",
            ("alpha", "beta"),
            lambda x, a, b, g: b * torch.tanh(a * x),
            _tanh_backward,
        ),
        ActivationFormula(
            ActivationMode.RELU,
            "y = max(0, x)",
            (),
            lambda x, a, b, g: torch.clamp_min(x, 0),
            lambda dy, x, a, b, g: dy * (x > 0).to(dy.dtype),
        ),
        ActivationFormula(
            ActivationMode.SOFTRELU,
            "y = log(1 + exp(x))",
            (),
            _softrelu_forward,
            lambda dy, x, a, b, g: dy * torch.sigmoid(x),
        ),
        ActivationFormula(
            ActivationMode.ABS,
            "y = |x|",
            (),
            lambda x, a, b, g: torch.abs(x),
            lambda dy, x, a, b, g: dy * torch.sign(x),
        ),
        ActivationFormula(
            ActivationMode.POWER,
            f"y = (alpha + beta * x) ^ gamma, 0 where alpha + beta * x <= {POWER_EPS}",
            ("alpha", "beta", "gamma"),
            _power_forward,
            _power_backward,
        ),
        ActivationFormula(
            ActivationMode.CLIPPEDRELU,
            "y = min(alpha, max(0, x))",
            ("alpha",),
            lambda x, a, b, g: torch.clamp(torch.clamp_min(x, 0), max=a),
            lambda dy, x, a, b, g: dy * ((x > 0) & (x <= a)).to(dy.dtype),
        ),
        ActivationFormula(
            ActivationMode.LEAKYRELU,
            "y = x if x > 0 else alpha * x",
            ("alpha",),
            lambda x, a, b, g: torch.where(x > 0, x, a * x),
            lambda dy, x, a, b, g: dy * _where_positive(x, 1.0, a),
        ),
        ActivationFormula(
            ActivationMode.ELU,
            "y = x if x > 0 else alpha * (exp(x) - 1)",
            ("alpha",),
            lambda x, a, b, g: torch.where(x > 0, x, a * torch.expm1(torch.clamp_max(x, 0))),
            lambda dy, x, a, b, g: dy * _where_positive(x, 1.0, a * torch.exp(torch.clamp_max(x, 0))),
        ),
    )
}


def _autograd_backward(forward: Callable[[Tensor], Tensor]) -> Backward:
    """The backward of an extension activation: dy times the derivative, the derivative by autograd
    through torch's own forward. Not autograd's dx itself: torch's backward of Hardswish selects 0
    where the derivative is 0, dropping a NaN or infinite dy that the product keeps (README: NaN and Inf)."""

    def backward(dy: Tensor, x: Tensor, a: float, b: float, g: float) -> Tensor:
        with torch.enable_grad():
            leaf = x.detach().requires_grad_(True)
            (slope,) = torch.autograd.grad(forward(leaf), leaf, torch.ones_like(leaf))
        return dy * slope

    return backward


def _extension(
    mode: ActivationMode, formula: str, forward: Callable[[Tensor], Tensor], backward: Backward | None = None
) -> ActivationFormula:
    return ActivationFormula(mode, formula, (), lambda x, a, b, g: forward(x), backward or _autograd_backward(forward))


def _gelu(x: Tensor) -> Tensor:
    """torch's GELU with GELU(+Inf) = +Inf: torch 2.13's vectorized float32 and 16-bit GELU on
    AVX512 CPUs gives NaN there (float64, and AVX2 CPUs, give +Inf)."""
    return torch.where(x == math.inf, x, F.gelu(x))


def _hardsigmoid_backward(dy: Tensor, x: Tensor, a: float, b: float, g: float) -> Tensor:
    """1/6 inside (-3, 3): torch's own backward takes float32's 1/6 for every dtype (3e-8 off in float64)."""
    return dy * ((x > -3) & (x < 3)).to(dy.dtype) / 6


#: fusionplan's extension modes (enums.ActivationMode.is_extension): torch's functions, no parameters
ACTIVATIONS.update(
    (f.mode, f)
    for f in (
        _extension(ActivationMode.SILU, "y = x * sigmoid(x)", F.silu),
        _extension(ActivationMode.HARDSWISH, "y = x * min(max(x + 3, 0), 6) / 6", F.hardswish),
        _extension(ActivationMode.HARDSIGMOID, "y = min(max(x / 6 + 1/2, 0), 1)", F.hardsigmoid, _hardsigmoid_backward),
        _extension(ActivationMode.GELU, "y = x * (1 + erf(x / sqrt(2))) / 2", _gelu, _autograd_backward(F.gelu)),
        _extension(
            ActivationMode.GELU_TANH,
            "y = x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x^3))) / 2",
            lambda x: F.gelu(x, approximate="tanh"),
        ),
        _extension(ActivationMode.MISH, "y = x * tanh(log(1 + exp(x)))", F.mish),
    )
)


def _slope_of(a: Tensor | float, x: Tensor) -> Tensor | float:
    """PReLU's slope in x's dtype and device (a per-channel tensor broadcast over x, or a number)."""
    return a.to(dtype=x.dtype, device=x.device) if isinstance(a, Tensor) else a


def _prelu_forward(x: Tensor, a: Tensor | float, b: float, g: float) -> Tensor:
    if isinstance(a, Tensor) and x.dim() >= 2:  # torch's one-pass op (a slope per channel, dim 1)
        return F.prelu(x, _slope_of(a, x).reshape(-1))
    return torch.where(x > 0, x, x * _slope_of(a, x))


def _prelu_backward(dy: Tensor, x: Tensor, a: Tensor | float, b: float, g: float) -> Tensor:
    return dy * _where_positive(x, 1.0, _slope_of(a, dy))


#: PReLU: the slope is a tensor, broadcast over the channels (ActivationArgs.slope, shaped (1, C, 1, 1)),
#: passed where the other modes take activAlpha
ACTIVATIONS[ActivationMode.PRELU] = ActivationFormula(
    ActivationMode.PRELU, "y = x if x > 0 else slope[c] * x", ("slope",), _prelu_forward, _prelu_backward
)


def activation_forward(mode: ActivationMode, x: Tensor, alpha: float, beta: float, gamma: float) -> Tensor:
    return ACTIVATIONS[ActivationMode(mode)].forward(x, alpha, beta, gamma)


def activation_backward(mode: ActivationMode, dy: Tensor, x: Tensor, alpha: float, beta: float, gamma: float) -> Tensor:
    return ACTIVATIONS[ActivationMode(mode)].backward(dy, x, alpha, beta, gamma)
