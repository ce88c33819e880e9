"""The vendor floor: a plan that cuDNN runs as one fused call, through torch's cuDNN bindings.

conv + bias and batch-norm inference (folded into the weights and bias) + ReLU, with an
optional residual (a scalar times y's prior contents, added before the ReLU), is one call of
``torch.cudnn_convolution_relu`` or ``torch.cudnn_convolution_add_relu``; its result is copied
into the caller's output. The solver is a candidate of find only: compile never picks it by
priority (``defer_why``), only where find measured it faster than fusionplan's own kernels
(``fusionplan.solvers.find``). An argument set that the one call cannot express (a blend on the
activation, a per-channel coefficient on the prior) runs through the folded stages in float32
(folded_toolkit), so every plan it accepts is computed right.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch

from fusionplan.enums import ActivationMode, DataType
from fusionplan.folding import PerArgsCache, is_one, is_zero
from fusionplan.ops import AFFINE_OPS, ActivationForwardOp, ConvForwardOp, OpArgs, Phase
from fusionplan.solvers.base import Kernel, PlanSpec, Solver
from fusionplan.solvers.folded_toolkit import ActStage, ConvStage, FoldedKernel

Tensor = torch.Tensor

#: the data types of cuDNN's fused convolution calls
_DTYPES = (DataType.HALF, DataType.BFLOAT16, DataType.FLOAT)


def cudnn_available() -> bool:
    return bool(torch.backends.cudnn.is_available())


@dataclass(frozen=True)
class OneCall:
    """An argument set as cuDNN's call takes it: relu(conv(x, weight) + bias + prior_coef * prior)."""

    weight: Tensor
    bias: Tensor | None
    prior_coef: float  # 0.0: no residual


def plan_shape_why_not(spec: PlanSpec) -> str | None:
    """None when the plan is conv, affine operators, ReLU: the chain cuDNN runs as one call."""
    ops = spec.ops
    if not isinstance(ops[0], ConvForwardOp):
        return "cuDNN's fused call starts with the convolution"
    last = ops[-1]
    if not isinstance(last, ActivationForwardOp) or last.mode != ActivationMode.RELU:
        return "cuDNN's fused call through torch ends with ReLU (conv + bias alone is two launches there)"
    if not all(isinstance(op, AFFINE_OPS) for op in ops[1:-1]):
        return "between the convolution and the ReLU, only bias and batch-norm inference fold into one call"
    return None


class CudnnKernel(FoldedKernel):
    solver_name = "cudnn"

    def __init__(self, spec: PlanSpec, tf32: bool) -> None:
        super().__init__(spec)
        # TF32 concerns float32 data only: the switch is not touched for half data (each toggle costs)
        self.tf32 = tf32 if spec.dtype == DataType.FLOAT else None
        self._calls = PerArgsCache()
        self.conv = spec.ops[0].conv
        # the call is conv (+ folded affine operators) then the ReLU; other stage cuts run the stages
        self._one_stage_pair = [type(stage) for stage in self.stages] == [ConvStage, ActStage]

    def one_call(self, records: Sequence[OpArgs]) -> OneCall | None:
        """The argument set as one cuDNN call, or None where the call cannot express it."""
        return self._calls.get(records, self._one_call)

    def _one_call(self, records: Sequence[OpArgs]) -> OneCall | None:
        if not self._one_stage_pair:
            return None
        folded, act = self.folded(records)
        rest = folded.rest
        if not (is_one(rest.scale) and is_zero(rest.shift) and isinstance(rest.prior_coef, float)):
            return None
        if act.alpha != 1 or act.beta != 0:
            return None
        dtype = self.spec.dtype.torch_dtype
        bias = None if folded.bias is None else folded.bias.to(dtype)
        return OneCall(folded.weight.to(dtype), bias, float(rest.prior_coef))

    def run(self, x: Tensor, y: Tensor, records: Sequence[OpArgs], prior: Tensor | None) -> None:
        call = self.one_call(records)
        if call is None or (call.prior_coef != 0 and prior is None):
            super().run(x, y, records, prior)
            return
        if self.tf32 is None or self.tf32 == torch.backends.cudnn.allow_tf32:
            out = self._call(x, call, prior)
        else:
            with _tf32(self.tf32):
                out = self._call(x, call, prior)
        y.copy_(out)

    def _call(self, x: Tensor, call: OneCall, prior: Tensor | None) -> Tensor:
        c = self.conv
        if call.prior_coef == 0:
            return torch.cudnn_convolution_relu(x, call.weight, call.bias, c.strides, c.pads, c.dilations, c.groups)
        return torch.cudnn_convolution_add_relu(
            x, call.weight, prior.to(x.dtype), call.prior_coef, call.bias, c.strides, c.pads, c.dilations, c.groups
        )


@contextlib.contextmanager
def _tf32(allowed: bool) -> Iterator[None]:
    """cuDNN's TF32 switch as the handle has it, for this call only."""
    saved = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = allowed
    try:
        yield
    finally:
        torch.backends.cudnn.allow_tf32 = saved


class CudnnSolver(Solver):
    name = "cudnn"
    family = "vendor"

    def why_not(self, spec: PlanSpec, handle) -> str | None:
        if handle.device.type != "cuda":
            return f"runs on CUDA devices only; the handle's device is {handle.device}"
        if not cudnn_available():
            return "this torch build has no cuDNN"
        if spec.phase != Phase.INFERENCE:
            return f"{spec.phase.value} plans have no fused cuDNN call"
        if spec.dtype not in _DTYPES:
            return f"cuDNN's fused call takes {', '.join(d.name for d in _DTYPES)}, not {spec.dtype.name}"
        return plan_shape_why_not(spec)

    def defer_why(self, spec: PlanSpec, handle) -> str | None:
        return "the vendor solver runs only where find measured it faster (find mode NORMAL, fusionplan-tune)"

    def build(self, spec: PlanSpec, handle) -> Kernel:
        return CudnnKernel(spec, handle.tf32_allowed())
