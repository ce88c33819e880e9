"""The CPU solver: algebraic fusion around torch's oneDNN convolution (folded_toolkit)."""

from __future__ import annotations

from fusionplan.core.ops import Phase
from fusionplan.solvers.base import Kernel, PlanSpec, Solver
from fusionplan.solvers.folded_toolkit import FoldedKernel


class CpuFoldedKernel(FoldedKernel):
    solver_name = "cpu-folded"


class CpuFoldedSolver(Solver):
    name = "cpu-folded"
    family = "cpu"

    def why_not(self, spec: PlanSpec, handle) -> str | None:
        if handle.device.type != "cpu":
            return f"runs on the CPU only; the handle's device is {handle.device}"
        if spec.phase not in (Phase.INFERENCE, Phase.STATISTICS):
            return f"{spec.phase.value} plans are cpu-training's"
        return None

    def build(self, spec: PlanSpec, handle) -> Kernel:
        return CpuFoldedKernel(spec)
