"""The registry of solvers, in priority order: compile takes the first that applies.

``FUSIONPLAN_BACKEND=triton|cpu|vendor|reference`` (or ``backend=`` on compile) restricts the
choice to one family; when that family cannot run the plan, compile fails with
UnsupportedOpError and every solver's reason.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fusionplan.core.errors import BadParmError, UnsupportedOpError
from fusionplan.core.settings import VARIABLES, Settings
from fusionplan.solvers.base import Kernel, PlanSpec, Solver, Verdict
from fusionplan.solvers.cpu_folded import CpuFoldedSolver
from fusionplan.solvers.cpu_training import CpuTrainingSolver
from fusionplan.solvers.cudnn_vendor import CudnnSolver
from fusionplan.solvers.gluon_gemm import GluonGemmSolver
from fusionplan.solvers.gluon_halo import GluonHaloSolver
from fusionplan.solvers.gluon_nchw import GluonNchwSolver
from fusionplan.solvers.gluon_nchw_regs import GluonNchwRegsSolver
from fusionplan.solvers.gluon_plane_chunks import GluonPlaneChunksSolver
from fusionplan.solvers.gluon_row_pairs import GluonRowPairsSolver
from fusionplan.solvers.gluon_rows import GluonRowsSolver
from fusionplan.solvers.gluon_stem import GluonStemSolver
from fusionplan.solvers.gluon_window import GluonWindowSolver
from fusionplan.solvers.reference_solver import ReferenceSolver
from fusionplan.solvers.triton_batchnorm import TritonBatchNormSolver
from fusionplan.solvers.triton_conv import TritonConvSolver
from fusionplan.solvers.triton_depthwise import TritonDepthwiseSolver
from fusionplan.solvers.triton_gemm import TritonGemmSolver
from fusionplan.solvers.triton_gemm_nchw import TritonGemmNchwSolver
from fusionplan.solvers.triton_pointwise import TritonPointwiseSolver
from fusionplan.solvers.triton_stem import TritonStemSolver
from fusionplan.solvers.triton_window import TritonWindowSolver

if TYPE_CHECKING:
    from fusionplan.core.handle import Handle

BACKEND_ENV = VARIABLES["backend"]

#: Priority order. Each solver knows its device: on a CUDA handle the CPU solver says no and the
#: Triton solvers come first; on a CPU handle the CPU solver comes first (the Triton solvers run
#: there only in Triton's interpreter, when FUSIONPLAN_BACKEND=triton asks for them).
REGISTRY: list[Solver] = [
    CpuFoldedSolver(),
    CpuTrainingSolver(),  # the training plans: torch's fused CPU batch norm
    GluonGemmSolver(),  # Hopper: 1x1 convolutions over flat rows, warp-specialized, tiles sized to the GPU
    TritonGemmSolver(),
    GluonRowPairsSolver(),  # Hopper: strided 1x1 on NCHW planes, the even input rows by asynchronous copies
    GluonPlaneChunksSolver(),  # Hopper: 1x1 on small NCHW planes, an image's channel planes copied as one run
    GluonHaloSolver(),  # Hopper: 3x3 on small NCHW planes, a channel block's halo gathered once, taps shifted
    GluonNchwRegsSolver(),  # Hopper: gluon-nchw's convolutions, the input operand of wgmma in registers
    GluonNchwSolver(),  # Hopper: NCHW input gathered by a partition of its own warps
    TritonGemmNchwSolver(),  # 1x1 convolutions on NCHW planes (deferring until measured on a GPU)
    GluonRowsSolver(),  # Hopper: few input channels, the filter in registers, persistent over output rows
    GluonStemSolver(),  # Hopper: few input channels (the stem), warp-specialized over output rows
    GluonWindowSolver(),  # Hopper: triton-window's kernel, warp-specialized (lab/NOTES.md, section 15)
    TritonWindowSolver(),
    TritonStemSolver(),  # few input channels (the stem)
    TritonDepthwiseSolver(),  # before triton-conv: 23-59x faster on MobileNetV2's depthwise layers (H100)
    TritonConvSolver(),
    TritonPointwiseSolver(),
    TritonBatchNormSolver(),  # the training plans: batch-norm forward training, backward (+ activation)
    CudnnSolver(),  # the vendor floor: chosen only where find measured it faster (it always defers)
    ReferenceSolver(),
]


def requested_backend(backend: str | None, handle: Handle) -> str | None:
    """The family compile is restricted to: the argument, else the handle's settings' (from
    $FUSIONPLAN_BACKEND), else None."""
    if backend is None:
        return handle.settings.backend
    return Settings(backend=backend).backend


def verdicts(spec: PlanSpec, handle: Handle, backend: str | None = None, solver: str | None = None) -> list[Verdict]:
    """Every registered solver's verdict on ``spec`` for ``handle``, in priority order; ``backend``
    restricts the choice to a family, ``solver`` to one solver by name."""
    family = requested_backend(backend, handle)
    if solver is not None:
        solver_named(solver)  # an unknown name is an error, not an empty choice
    out = []
    for candidate in REGISTRY:
        if family is not None and candidate.family != family:
            reason = f"{BACKEND_ENV}/backend restricts compile to the {family} family"
        elif solver is not None and candidate.name != solver:
            reason = f"compile was restricted to the solver {solver}"
        else:
            try:
                reason = candidate.why_not(spec, handle)
            except Exception as exc:  # a solver's check must never take compile down
                reason = f"applicability check failed: {type(exc).__name__}: {exc}"
        deferred = candidate.defer_why(spec, handle) if reason is None and solver is None else None
        out.append(Verdict(candidate.name, candidate.family, reason, deferred))
    return out


def candidates(spec: PlanSpec, handle: Handle, backend: str | None = None, solver: str | None = None) -> list[Solver]:
    """The applicable solvers in the order compile tries them (compile_order), or
    UnsupportedOpError with every solver's reason."""
    found = verdicts(spec, handle, backend, solver)
    ordered = compile_order(found)
    if ordered:
        return [solver_named(v.solver) for v in ordered]
    raise UnsupportedOpError(refusal(spec, found, requested_backend(backend, handle), solver))


def refusal(spec: PlanSpec, found: list[Verdict], family: str | None, solver: str | None) -> str:
    """Why no solver runs ``spec``: each solver that was tried and its reason, a line each, then
    the names of those that the backend or solver restriction left out."""
    left_out = [v.solver for v in found if (family and v.family != family) or (solver and v.solver != solver)]
    lines = [f"  {v}" for v in found if v.solver not in left_out]
    if left_out:
        restriction = f"the solver {solver}" if solver else f"the {family} family"
        lines.append(f"  not tried (compile restricted to {restriction}): {', '.join(left_out)}")
    return f"no solver can run the plan {spec.combination}:\n" + "\n".join(lines)


def compile_order(found: list[Verdict]) -> list[Verdict]:
    """The applicable verdicts in the order compile tries them: those that do not defer first,
    each group in priority order."""
    return sorted((v for v in found if v.applicable), key=lambda v: v.deferred is not None)  # sorted is stable


def choice(found: list[Verdict]) -> Verdict | None:
    """The verdict compile follows when its kernel builds: the first of compile_order, else None."""
    ordered = compile_order(found)
    return ordered[0] if ordered else None


def solver_named(name: str) -> Solver:
    for solver in REGISTRY:
        if solver.name == name:
            return solver
    raise BadParmError(f"no solver named {name!r}; registered: {', '.join(s.name for s in REGISTRY)}")


__all__ = [
    "REGISTRY",
    "Kernel",
    "PlanSpec",
    "Solver",
    "Verdict",
    "candidates",
    "choice",
    "compile_order",
    "verdicts",
    "solver_named",
]
