"""The reference solver: any valid plan, any device, one torch op per operator (unfused).

It is the last resort of the registry and the baseline the fused solvers are measured
against. Half-precision data is computed in float32, double in float64.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from fusionplan.core.ops import OpArgs
from fusionplan.oracle.reference import compute_dtype_for, run_reference, write_side_outputs
from fusionplan.solvers.base import Kernel, PlanSpec, Solver


class ReferenceKernel(Kernel):
    solver_name = "reference"

    def __init__(self, spec: PlanSpec, compute_dtype: torch.dtype | None = None) -> None:
        self.spec = spec
        self.compute_dtype = compute_dtype or compute_dtype_for(spec.dtype.torch_dtype)

    def run(self, x: torch.Tensor, y: torch.Tensor, records: Sequence[OpArgs], prior: torch.Tensor | None) -> None:
        # cuDNN's transform algorithms (Winograd, FFT) spread an infinite input over outputs that do
        # not read it (as NaN); the solver's result keeps NaN and Inf where the arithmetic puts them
        with torch.backends.cudnn.flags(enabled=x.device.type != "cuda"):
            result = run_reference(self.spec.ops, x, records, prior, self.compute_dtype)
        y.copy_(result.output)
        write_side_outputs(result.side, records)


class ReferenceSolver(Solver):
    name = "reference"
    family = "reference"

    def why_not(self, spec: PlanSpec, handle) -> str | None:
        return None

    def build(self, spec: PlanSpec, handle) -> Kernel:
        return ReferenceKernel(spec)
