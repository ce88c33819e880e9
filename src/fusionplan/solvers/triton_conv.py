"""The triton-conv solver: any convolution plan, as the implicit-GEMM kernel of conv_kernel.py,
with pointwise operators before the convolution too (applied to the input tiles as they load), and
batch-norm statistics of its output after it (taken in the epilogue)."""

from __future__ import annotations

from fusionplan.solvers.base import Kernel, PlanSpec, Solver
from fusionplan.solvers.conv_kernel import TritonConvKernel
from fusionplan.solvers.conv_toolkit import (
    conv_plan_why_not,
    device_why_not,
)


class TritonConvSolver(Solver):
    name = "triton-conv"
    family = "triton"

    def why_not(self, spec: PlanSpec, handle) -> str | None:
        return conv_plan_why_not(spec, prologue=True, statistics=True) or device_why_not(handle, spec.dtype)

    def build(self, spec: PlanSpec, handle) -> Kernel:
        return TritonConvKernel(spec, handle)
