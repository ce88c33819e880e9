"""Random arguments for operators: fresh data of each operator's shapes and dtypes (never zeros).

Below the plan layer (descriptors and operators only), so that solvers may benchmark candidate
configurations on them, and tests, the driver and the bench build on them (fusionplan.tools.verify).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from fusionplan.core.enums import ActivationMode, Layout
from fusionplan.core.ops import (
    ActivationArgs,
    ActivationForwardOp,
    BatchNormInferenceArgs,
    BatchNormInferenceOp,
    BatchNormStatisticsArgs,
    BatchNormStatisticsOp,
    BiasArgs,
    BiasForwardOp,
    ConvArgs,
    ConvForwardOp,
    FusionOp,
    OpArgs,
)

#: Activation parameters that exercise each formula's alpha/beta/gamma.
ACTIV_PARAMS = {
    ActivationMode.PASTHRU: (1.0, 0.0, 1.0),
    ActivationMode.LOGISTIC: (1.0, 0.0, 1.0),
    ActivationMode.TANH: (0.7, 1.3, 1.0),
    ActivationMode.RELU: (1.0, 0.0, 1.0),
    ActivationMode.SOFTRELU: (1.0, 0.0, 1.0),
    ActivationMode.ABS: (1.0, 0.0, 1.0),
    ActivationMode.POWER: (0.5, 0.8, 2.0),
    ActivationMode.CLIPPEDRELU: (0.6, 0.0, 1.0),
    ActivationMode.LEAKYRELU: (0.1, 0.0, 1.0),
    ActivationMode.ELU: (0.9, 0.0, 1.0),
    # the extension modes take no parameters (PReLU its slope tensor: random_record)
    **{m: (1.0, 0.0, 1.0) for m in ActivationMode if m.is_extension},
}


def random_tensor(
    shape: Sequence[int],
    dtype: torch.dtype,
    device: torch.device | str = "cpu",
    layout: Layout | None = None,
    scale: float = 1.0,
    shift: float = 0.0,
    gen: torch.Generator | None = None,
) -> torch.Tensor:
    """Normal random data (never zeros), made in float32 then cast, in ``layout``."""
    t = (torch.randn(tuple(shape), generator=gen) * scale + shift).to(dtype)
    if layout == Layout.NHWC and t.ndim == 4:
        t = t.to(memory_format=torch.channels_last)
    return t.to(device)


def random_record(
    op: FusionOp,
    device: torch.device | str = "cpu",
    param_dtype: torch.dtype | None = None,
    alpha: float = 1.0,
    beta: float = 0.0,
    activ_params: tuple[float, float, float] | None = None,
    epsilon: float = 1e-5,
    gen: torch.Generator | None = None,
) -> OpArgs:
    """A fresh random argument record for an inference operator, or batch-norm statistics (its saved
    statistics NaN, to show they were written)."""
    dt = op.input_desc.dtype.torch_dtype
    pdt = param_dtype or dt
    if isinstance(op, ConvForwardOp):
        fan_in = math.prod(op.w_desc.dims[1:])
        w = random_tensor(op.w_desc.dims, dt, device, op.w_desc.layout, 1.0 / math.sqrt(fan_in), gen=gen)
        return ConvArgs(weight=w, alpha=alpha, beta=beta)
    if isinstance(op, BiasForwardOp):
        return BiasArgs(bias=random_tensor(op.param_dims, pdt, device, gen=gen), alpha=alpha, beta=beta)
    if isinstance(op, BatchNormInferenceOp):
        dims = op.param_dims
        var = (torch.rand(dims, generator=gen) + 0.5).to(pdt).to(device)
        return BatchNormInferenceArgs(
            scale=random_tensor(dims, pdt, device, gen=gen),
            bias=random_tensor(dims, pdt, device, gen=gen),
            mean=random_tensor(dims, pdt, device, scale=0.5, gen=gen),
            variance=var,
            epsilon=epsilon,
            alpha=alpha,
            beta=beta,
        )
    if isinstance(op, ActivationForwardOp):
        a, b, g = activ_params or ACTIV_PARAMS[op.mode]
        # PReLU: a slope per channel, of either sign (a learned slope may be negative)
        slope = None
        if op.mode.has_slope:
            slope = random_tensor((op.channels,), pdt, device, scale=0.5, shift=0.25, gen=gen)
        return ActivationArgs(activ_alpha=a, activ_beta=b, activ_gamma=g, alpha=alpha, beta=beta, slope=slope)
    if isinstance(op, BatchNormStatisticsOp):  # passes its input through: no alpha or beta
        dims = op.param_dims
        running_mean = random_tensor(dims, pdt, device, scale=0.5, gen=gen)
        return BatchNormStatisticsArgs(
            saved_mean=torch.full(dims, float("nan"), dtype=pdt, device=device),
            saved_inv_variance=torch.full(dims, float("nan"), dtype=pdt, device=device),
            running_mean=running_mean,
            running_variance=(torch.rand(dims, generator=gen) + 0.5).to(pdt).to(device),
            exp_avg_factor=0.3,
            epsilon=epsilon,
        )
    raise TypeError(f"no random arguments for {op.title}")
