"""The CPU solver of the training plans: torch's fused CPU batch norm (one kernel for the statistics
and the normalization forward, one for the three gradients backward) and the activation around it.

Per-activation mode is spatial mode over the tensor viewed as (N, C*H*W, 1, 1): statistics over N
for each element of an image. Half-precision data is computed in float32, double in float64.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from fusionplan.core.activations import activation_backward, activation_forward
from fusionplan.core.enums import BatchNormMode
from fusionplan.core.ops import (
    ActivationArgs,
    ActivationBackwardArgs,
    BatchNormBackwardArgs,
    BatchNormForwardArgs,
    OpArgs,
    Phase,
)
from fusionplan.oracle.reference import compute_dtype_for
from fusionplan.solvers.base import Kernel, PlanSpec, Solver

Tensor = torch.Tensor


def _blend(r: Tensor, rec: OpArgs, prior: Tensor | None) -> Tensor:
    """alpha * r + beta * prior (the contract's alpha and beta)."""
    if rec.alpha != 1:
        r = r.mul_(rec.alpha)
    if rec.beta != 0:
        assert prior is not None
        r = r.add_(prior, alpha=rec.beta)
    return r


class CpuTrainingKernel(Kernel):
    solver_name = "cpu-training"

    def __init__(self, spec: PlanSpec) -> None:
        self.spec = spec
        self.dt = compute_dtype_for(spec.dtype.torch_dtype)
        self.per_activation = spec.ops[0].mode == BatchNormMode.PER_ACTIVATION
        self.act = spec.ops[1] if len(spec.ops) > 1 else None

    def _spatial(self, t: Tensor) -> Tensor:
        """t in the compute dtype, as the 4-d tensor whose channels are the statistics' features."""
        t = t.to(self.dt)
        return t.reshape(t.shape[0], -1, 1, 1) if self.per_activation else t

    def _vector(self, t: Tensor) -> Tensor:
        return t.reshape(-1).to(self.dt)

    def run(self, x: Tensor, y: Tensor, records: Sequence[OpArgs], prior: Tensor | None) -> None:
        if self.spec.phase == Phase.BACKWARD:
            self._backward(x, y, records, prior)
        else:
            self._forward(x, y, records, prior)

    def _forward(self, x: Tensor, y: Tensor, records: Sequence[OpArgs], prior: Tensor | None) -> None:
        bn = records[0]
        assert isinstance(bn, BatchNormForwardArgs)
        running = bn.running_mean is not None and bn.running_variance is not None
        rm = self._vector(bn.running_mean).clone() if running else None
        rv = self._vector(bn.running_variance).clone() if running else None
        xs, scale, bias = self._spatial(x), self._vector(bn.scale), self._vector(bn.bias)
        _, mean, inv = torch.native_batch_norm(xs, scale, bias, rm, rv, True, bn.exp_avg_factor, bn.epsilon)
        # its output is x * s' + b', which cancels where |mean| * inv is large (one value per feature:
        # the mean is x, the result bias, torch's off by ulp(x * 316)); (x - mean) * s + b does not
        shape = (1, -1, 1, 1)
        out = (xs - mean.view(shape)) * (scale * inv).view(shape) + bias.view(shape)
        p = None if prior is None else prior.to(self.dt)
        h = _blend(out.reshape(x.shape), bn, p)
        if self.act is not None:
            rec = records[1]
            assert isinstance(rec, ActivationArgs)
            h = activation_forward(self.act.mode, h, rec.activ_alpha, rec.activ_beta, rec.activ_gamma)
            h = _blend(h, rec, p)
        y.copy_(h)
        for target, value in ((bn.saved_mean, mean), (bn.saved_inv_variance, inv)):
            if target is not None:
                target.copy_(value.reshape(target.shape))
        if running:
            bn.running_mean.copy_(rm.reshape(bn.running_mean.shape))
            bn.running_variance.copy_(rv.reshape(bn.running_variance.shape))

    def _backward(self, dy: Tensor, dx: Tensor, records: Sequence[OpArgs], prior: Tensor | None) -> None:
        bn = records[0]
        assert isinstance(bn, BatchNormBackwardArgs)
        p = None if prior is None else prior.to(self.dt)
        x, scale = self._spatial(bn.x), self._vector(bn.scale)
        mean, inv = self._vector(bn.saved_mean), self._vector(bn.saved_inv_variance)
        g = self._spatial(dy)
        if self.act is not None:
            rec = records[1]
            assert isinstance(rec, ActivationBackwardArgs)
            shape = (1, -1, 1, 1)
            z = (x - mean.view(shape)) * (inv * scale).view(shape) + self._vector(bn.bias).view(shape)
            g = activation_backward(self.act.mode, g, z, rec.activ_alpha, rec.activ_beta, rec.activ_gamma)
            g = _blend(g, rec, None if p is None else p.reshape(g.shape))
        grad_x, grad_scale, grad_bias = torch.ops.aten.native_batch_norm_backward(
            g, x, scale, None, None, mean, inv, True, 0.0, [True, True, True]
        )
        dx.copy_(_blend(grad_x.reshape(dx.shape), bn, p))
        bn.result_scale_diff.copy_(grad_scale.reshape(bn.result_scale_diff.shape))
        bn.result_bias_diff.copy_(grad_bias.reshape(bn.result_bias_diff.shape))


class CpuTrainingSolver(Solver):
    name = "cpu-training"
    family = "cpu"

    def why_not(self, spec: PlanSpec, handle) -> str | None:
        if handle.device.type != "cpu":
            return f"runs on the CPU only; the handle's device is {handle.device}"
        if spec.phase in (Phase.INFERENCE, Phase.STATISTICS):
            return f"{spec.phase.value} plans are cpu-folded's (this solver runs the training plans)"
        if spec.input_desc.ndim != 4:
            return f"{spec.input_desc.ndim}-d tensors; torch's CPU batch norm is run on 4-d (NCHW) tensors here"
        return None

    def build(self, spec: PlanSpec, handle) -> Kernel:
        return CpuTrainingKernel(spec)
