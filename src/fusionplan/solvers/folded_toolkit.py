"""Algebraic fusion around a library convolution: what cpu-folded and the cudnn solver share.

Bias and batch-norm inference are affine per channel, so a run of them collapses into one
scale and shift; the run right after the convolution folds into the convolution's weights
and bias. Folding happens once per argument set (cached against the argument records and
their tensors' version counters), not per execute. Activations apply in place on buffers
the kernel owns. alpha/beta blends are carried through the algebra as a coefficient on the
output's prior contents.

Half-precision data is computed in float32 (torch's kernels for fp16 on the CPU are slow and
less accurate), double in float64; the result is cast once, into the output.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from fusionplan.core.activations import activation_forward
from fusionplan.core.enums import ActivationMode, Layout
from fusionplan.core.ops import (
    AFFINE_OPS,
    ActivationArgs,
    ActivationForwardOp,
    BatchNormStatisticsOp,
    ConvArgs,
    ConvForwardOp,
    FusionOp,
    OpArgs,
)
from fusionplan.oracle.reference import batch_statistics, compute_dtype_for, write_side_outputs
from fusionplan.oracle.torch_conv import canonical, conv2d
from fusionplan.runtime.folding import Affine, Coef, PerArgsCache, compose, is_one, is_zero
from fusionplan.solvers.base import Kernel, PlanSpec

Tensor = torch.Tensor


def _per_channel(c: Coef) -> bool:
    return isinstance(c, float) or all(d == 1 for i, d in enumerate(c.shape) if i != 1)


def _apply_affine(h: Tensor, owned: bool, a: Affine, prior: Tensor | None) -> Tensor:
    if not is_one(a.scale):
        h = h.mul_(a.scale) if owned else h * a.scale
        owned = True
    if not is_zero(a.shift):
        h = h.add_(a.shift) if owned else h + a.shift
        owned = True
    if not is_zero(a.prior_coef):
        if isinstance(a.prior_coef, Tensor):
            h = h.addcmul_(prior, a.prior_coef) if owned else h + a.prior_coef * prior
        else:
            h = h.add_(prior, alpha=a.prior_coef) if owned else h + a.prior_coef * prior
    return h


def _can_write_into(y: Tensor, x: Tensor, dt: torch.dtype, prior: Tensor | None) -> bool:
    """y can take intermediate results: the compute dtype, no prior contents to keep, and no
    partial overlap with x (the very same elements are fine: each is read before it is written)."""
    if y.dtype != dt or prior is not None:
        return False
    if x.untyped_storage().data_ptr() != y.untyped_storage().data_ptr():
        return True
    return x.data_ptr() == y.data_ptr() and x.stride() == y.stride()


def _affine_into(h: Tensor, a: Affine, out: Tensor) -> None:
    """out = scale * h + shift (no prior term)."""
    if isinstance(a.scale, Tensor) and isinstance(a.shift, Tensor):
        torch.addcmul(a.shift.expand_as(out), h, a.scale, out=out)
    elif isinstance(a.scale, Tensor):
        torch.mul(h, a.scale, out=out).add_(a.shift)
    else:
        torch.add(
            a.shift if isinstance(a.shift, Tensor) else torch.tensor(a.shift, dtype=h.dtype),
            h * a.scale if not is_one(a.scale) else h,
            out=out,
        )


# ---- stages: the plan cut at activations and at the convolution --------------------------------
@dataclass(frozen=True)
class AffineStage:
    ops: tuple[int, ...]  # indices of consecutive bias / batch-norm operators


@dataclass(frozen=True)
class ConvStage:
    conv: int
    folded: tuple[int, ...]  # the affine operators right after the convolution


@dataclass(frozen=True)
class ActStage:
    op: int


Stage = AffineStage | ConvStage | ActStage


def plan_stages(ops: Sequence[FusionOp]) -> list[Stage]:
    stages: list[Stage] = []
    for op in ops:
        last = stages[-1] if stages else None
        if isinstance(op, ConvForwardOp):
            stages.append(ConvStage(op.index, ()))
        elif isinstance(op, ActivationForwardOp):
            stages.append(ActStage(op.index))
        elif isinstance(op, AFFINE_OPS) and isinstance(last, ConvStage):
            stages[-1] = ConvStage(last.conv, last.folded + (op.index,))
        elif isinstance(op, AFFINE_OPS) and isinstance(last, AffineStage):
            stages[-1] = AffineStage(last.ops + (op.index,))
        else:
            stages.append(AffineStage((op.index,)))
    return stages


@dataclass
class FoldedConv:
    weight: Tensor
    bias: Tensor | None
    rest: Affine  # what could not go into the weights (per-element scale/shift, prior blend)


class FoldedKernel(Kernel):
    """The plan as folded stages around torch's convolution, computed in float32 for half data."""

    def __init__(self, spec: PlanSpec) -> None:
        self.spec = spec
        self.dt = compute_dtype_for(spec.dtype.torch_dtype)
        last = spec.ops[-1]
        # batch-norm statistics, the last operator: taken of the chain's result in the compute dtype
        self.statistics = last if isinstance(last, BatchNormStatisticsOp) else None
        self.stages = plan_stages(spec.ops[:-1] if self.statistics else spec.ops)
        self.pointwise_only = not any(isinstance(stage, ConvStage) for stage in self.stages)
        self._folded = PerArgsCache()

    # -- work done once per argument set ---------------------------------------------------
    def folded(self, records: Sequence[OpArgs]) -> list:
        return self._folded.get(records, lambda recs: [self._fold_stage(s, recs) for s in self.stages])

    def _fold_stage(self, stage: Stage, records: Sequence[OpArgs]):
        if isinstance(stage, AffineStage):
            return compose(Affine(), stage.ops, records, self.dt)
        if isinstance(stage, ActStage):
            return records[stage.op]
        rec = records[stage.conv]
        assert isinstance(rec, ConvArgs)
        a = compose(Affine().then(1.0, 0.0, rec.alpha, rec.beta), stage.folded, records, self.dt)
        weight = rec.weight.to(self.dt)
        bias = None
        if _per_channel(a.scale):
            if not is_one(a.scale):
                weight = weight * (a.scale.reshape(-1, 1, 1, 1) if isinstance(a.scale, Tensor) else a.scale)
            a.scale = 1.0
            if isinstance(a.shift, Tensor) and _per_channel(a.shift):
                bias, a.shift = a.shift.reshape(-1).contiguous(), 0.0
        # oneDNN wants the weights in the activations' layout (another is reordered on every call), and
        # in canonical strides (torch_conv: unusual strides on size-1 axes miscompute)
        return FoldedConv(canonical(weight, self.spec.input_desc.layout == Layout.NHWC), bias, a)

    # -- execute ------------------------------------------------------------------------------
    def run(self, x: Tensor, y: Tensor, records: Sequence[OpArgs], prior: Tensor | None) -> None:
        params = self.folded(records)
        p = None if prior is None else prior.to(self.dt)
        h, owned = x.to(self.dt), x.dtype != self.dt
        stages = list(zip(self.stages, params))
        if (
            self.pointwise_only
            and stages
            and isinstance(stages[0][0], AffineStage)
            and _can_write_into(y, x, self.dt, prior)
        ):
            # A pointwise chain writes its first stage straight into y and the rest in place:
            # two passes over memory for B/N + activation, as many as eager PyTorch makes.
            _affine_into(h, stages[0][1], y)
            h, owned, stages = y, True, stages[1:]
        for stage, par in stages:
            if isinstance(stage, ConvStage):
                conv = self.spec.ops[stage.conv].conv
                h = conv2d(h, par.weight, par.bias, conv)
                h, owned = _apply_affine(h, True, par.rest, p), True
            elif isinstance(stage, AffineStage):
                h, owned = _apply_affine(h, owned, par, p), True
            else:
                h, owned = self._activation(self.spec.ops[stage.op], h, owned, par, p), True
        if self.statistics is not None:
            side: dict = {}
            batch_statistics(self.statistics, h, records[-1], self.dt, side)
            write_side_outputs(side, records)
        y.copy_(h)

    @staticmethod
    def _activation(op: ActivationForwardOp, h: Tensor, owned: bool, rec: ActivationArgs, p: Tensor | None) -> Tensor:
        if op.mode == ActivationMode.RELU and owned:
            h = h.clamp_min_(0)
        elif op.mode == ActivationMode.CLIPPEDRELU and owned:
            h = h.clamp_(0, rec.activ_alpha) if rec.activ_alpha >= 0 else h.clamp_min_(0).clamp_max_(rec.activ_alpha)
        else:
            h = activation_forward(op.mode, h, rec.alpha_argument(), rec.activ_beta, rec.activ_gamma)
        return _apply_affine(h, True, Affine(rec.alpha, 0.0, rec.beta), p)
