"""The reference implementation: every operator as plain torch ops, in any compute dtype.

One implementation serves four uses: the reference solver (the fallback that runs any valid
plan on any device), the oracle of the tests and the driver (float64), the unfused baseline
of the benchmarks (the data's own dtype, one op at a time), and the documentation of what
each operator computes. It is a pure function: side outputs (saved and running statistics,
parameter gradients) are returned, not written, so an oracle run disturbs nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from fusionplan.core.activations import activation_backward, activation_forward
from fusionplan.core.enums import BatchNormMode
from fusionplan.core.errors import BadParmError
from fusionplan.core.ops import (
    ActivationArgs,
    ActivationBackwardArgs,
    ActivationBackwardOp,
    ActivationForwardOp,
    BatchNormBackwardArgs,
    BatchNormBackwardOp,
    BatchNormForwardArgs,
    BatchNormForwardOp,
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
    Phase,
)
from fusionplan.oracle.torch_conv import conv2d

Tensor = torch.Tensor


@dataclass
class ReferenceResult:
    output: Tensor  # in the compute dtype
    side: dict[tuple[int, str], Tensor] = field(default_factory=dict)  # (op index, args field) -> value


def _c(t: Tensor, dtype: torch.dtype) -> Tensor:
    return t.to(dtype)


def reduce_dims(mode: BatchNormMode, ndim: int) -> tuple[int, ...]:
    """Axes a batch-norm statistic is taken over: N and spatial (Spatial) or N (PerActivation)."""
    return (0, *range(2, ndim)) if mode == BatchNormMode.SPATIAL else (0,)


def conv_forward(op: ConvForwardOp, x: Tensor, w: Tensor) -> Tensor:
    return conv2d(x, w, None, op.conv)


def batchnorm_inference(x: Tensor, scale: Tensor, bias: Tensor, mean: Tensor, var: Tensor, eps: float) -> Tensor:
    return scale * (x - mean) / torch.sqrt(var + eps) + bias


def _apply_forward(op: FusionOp, h: Tensor, rec: OpArgs, dt: torch.dtype, side: dict) -> Tensor:
    if isinstance(op, ConvForwardOp):
        assert isinstance(rec, ConvArgs)
        return conv_forward(op, h, _c(rec.weight, dt))
    if isinstance(op, BiasForwardOp):
        assert isinstance(rec, BiasArgs)
        return h + _c(rec.bias, dt)
    if isinstance(op, BatchNormInferenceOp):
        assert isinstance(rec, BatchNormInferenceArgs)
        return batchnorm_inference(
            h, _c(rec.scale, dt), _c(rec.bias, dt), _c(rec.mean, dt), _c(rec.variance, dt), rec.epsilon
        )
    if isinstance(op, ActivationForwardOp):
        assert isinstance(rec, ActivationArgs)
        return activation_forward(op.mode, h, rec.alpha_argument(), rec.activ_beta, rec.activ_gamma)
    if isinstance(op, BatchNormForwardOp):
        assert isinstance(rec, BatchNormForwardArgs)
        return _batchnorm_forward_training(op, h, rec, dt, side)
    if isinstance(op, BatchNormStatisticsOp):
        assert isinstance(rec, BatchNormStatisticsArgs)
        batch_statistics(op, h, rec, dt, side)
        return h
    raise BadParmError(f"operator {op.index} ({op.title}) is not a forward operator")


def _batchnorm_forward_training(
    op: BatchNormForwardOp, h: Tensor, rec: BatchNormForwardArgs, dt: torch.dtype, side: dict
) -> Tensor:
    mean, inv_std = batch_statistics(op, h, rec, dt, side)
    return _c(rec.scale, dt) * (h - mean) * inv_std + _c(rec.bias, dt)


def batch_statistics(
    op: BatchNormForwardOp | BatchNormStatisticsOp,
    h: Tensor,
    rec: BatchNormForwardArgs | BatchNormStatisticsArgs,
    dt: torch.dtype,
    side: dict,
) -> tuple[Tensor, Tensor]:
    """The batch mean and inverse deviation of ``h`` (returned, and as the saved side outputs),
    and the running statistics updated (side outputs)."""
    dims = reduce_dims(op.mode, h.ndim)
    mean = h.mean(dim=dims, keepdim=True)
    var = h.var(dim=dims, unbiased=False, keepdim=True)
    inv_std = torch.rsqrt(var + rec.epsilon)
    count = h.numel() // mean.numel()
    side[(op.index, "saved_mean")] = mean
    side[(op.index, "saved_inv_variance")] = inv_std
    f = rec.exp_avg_factor
    if rec.running_mean is not None:
        side[(op.index, "running_mean")] = (1 - f) * _c(rec.running_mean, dt) + f * mean
    if rec.running_variance is not None:
        unbiased = var * (count / (count - 1)) if count > 1 else var
        side[(op.index, "running_variance")] = (1 - f) * _c(rec.running_variance, dt) + f * unbiased
    return mean, inv_std


def _blend(r: Tensor, rec: OpArgs, prior: Tensor | None) -> Tensor:
    """alpha * r + beta * prior (the contract's meaning of alpha and beta)."""
    if rec.beta != 0:
        if prior is None:
            raise BadParmError("beta != 0 needs the output's prior contents")
        return rec.alpha * r + rec.beta * prior
    return r if rec.alpha == 1 else rec.alpha * r


def _bn_backward_recompute(op: BatchNormBackwardOp, rec: BatchNormBackwardArgs, dt: torch.dtype) -> tuple[Tensor, ...]:
    x = _c(rec.x, dt)
    xhat = (x - _c(rec.saved_mean, dt)) * _c(rec.saved_inv_variance, dt)
    return x, xhat


def _run_backward(
    ops: Sequence[FusionOp], records: Sequence[OpArgs], dy: Tensor, prior: Tensor | None, dt: torch.dtype, side: dict
) -> Tensor:
    bn_op, bn_rec = ops[0], records[0]
    assert isinstance(bn_op, BatchNormBackwardOp) and isinstance(bn_rec, BatchNormBackwardArgs)
    _, xhat = _bn_backward_recompute(bn_op, bn_rec, dt)
    scale = _c(bn_rec.scale, dt)
    g = dy
    if len(ops) > 1:  # the backward of [BN forward, activation forward]: activation first
        act_op, act_rec = ops[1], records[1]
        assert isinstance(act_op, ActivationBackwardOp) and isinstance(act_rec, ActivationBackwardArgs)
        z = scale * xhat + _c(bn_rec.bias, dt)  # the activation's forward input, recomputed
        g = activation_backward(act_op.mode, g, z, act_rec.activ_alpha, act_rec.activ_beta, act_rec.activ_gamma)
        g = _blend(g, act_rec, prior)
    dims = reduce_dims(bn_op.mode, g.ndim)
    count = g.numel() // scale.numel()
    dbias = g.sum(dim=dims, keepdim=True)
    dscale = (g * xhat).sum(dim=dims, keepdim=True)
    side[(bn_op.index, "result_bias_diff")] = dbias
    side[(bn_op.index, "result_scale_diff")] = dscale
    dx = scale * _c(bn_rec.saved_inv_variance, dt) * (g - dbias / count - xhat * dscale / count)
    return _blend(dx, bn_rec, prior)


def run_reference(
    ops: Sequence[FusionOp],
    x: Tensor,
    records: Sequence[OpArgs],
    prior: Tensor | None = None,
    compute_dtype: torch.dtype = torch.float64,
) -> ReferenceResult:
    """Run the operator chain ``ops`` on ``x`` with one argument record per operator.

    Everything is computed in ``compute_dtype`` on x's device; ``prior`` is the output's prior
    contents (needed only where an operator has beta != 0).
    """
    dt = compute_dtype
    side: dict[tuple[int, str], Tensor] = {}
    h = _c(x, dt)
    p = None if prior is None else _c(prior, dt)
    if ops[0].phase == Phase.BACKWARD:
        return ReferenceResult(_run_backward(ops, records, h, p, dt, side), side)
    for op, rec in zip(ops, records):
        h = _blend(_apply_forward(op, h, rec, dt, side), rec, p)
    return ReferenceResult(h, side)


def write_side_outputs(side: dict[tuple[int, str], Tensor], records: Sequence[OpArgs]) -> None:
    """Copy side outputs ((op index, args field) -> value, as ReferenceResult.side holds them) into
    the argument tensors that receive them (None targets are skipped)."""
    for (index, name), value in side.items():
        target = getattr(records[index], name)
        if target is not None:
            target.copy_(value.reshape(target.shape))


def compute_dtype_for(dtype: torch.dtype) -> torch.dtype:
    """The dtype the reference computes a plan of ``dtype`` in: float64 for float64, else float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32
