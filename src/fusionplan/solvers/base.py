"""What a solver is: a fused implementation that says whether it can run a plan, and why not."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from fusionplan.core.descriptors import TensorDescriptor
from fusionplan.core.ops import ConvForwardOp, FusionOp, OpArgs, Phase, field_names
from fusionplan.runtime.codegen import again_after_ast_race

if TYPE_CHECKING:
    from fusionplan.core.handle import Handle


@dataclass(frozen=True)
class PlanSpec:
    """An immutable snapshot of a plan, taken at compile: what a kernel is built from."""

    input_desc: TensorDescriptor
    ops: tuple[FusionOp, ...]

    @property
    def output_desc(self) -> TensorDescriptor:
        return self.ops[-1].output_desc

    @property
    def phase(self) -> Phase:
        """The first operator's phase, or STATISTICS for a chain that ends in batch-norm statistics."""
        last = self.ops[-1].phase
        return last if last == Phase.STATISTICS else self.ops[0].phase

    @property
    def dtype(self):
        return self.input_desc.dtype

    @property
    def conv_index(self) -> int | None:
        for op in self.ops:
            if isinstance(op, ConvForwardOp):
                return op.index
        return None

    @property
    def combination(self) -> str:
        """MIOpen-style letters of the chain, e.g. CBNA."""
        return "".join(op.letter for op in self.ops)

    def signature(self) -> tuple:
        d = self.input_desc
        return (d.dtype, d.dims, d.stride_key(), tuple(op.signature() for op in self.ops))


class Kernel(ABC):
    """A plan compiled by one solver for one handle."""

    solver_name: str = "?"

    @abstractmethod
    def run(
        self,
        x: torch.Tensor,
        y: torch.Tensor,
        records: Sequence[OpArgs],
        prior: torch.Tensor | None,
    ) -> None:
        """Compute the plan of ``x`` into ``y``. Inputs are validated; ``prior`` is y's prior
        contents (y itself unless the caller supplies another tensor) and may be None when no
        operator has beta != 0."""

    def rerun(
        self,
        x: torch.Tensor,
        y: torch.Tensor,
        records: Sequence[OpArgs],
        prior: torch.Tensor | None,
    ) -> None:
        """``run`` again, called when ``records`` is the object of a previous ``run`` and x, y and the
        prior (if any) have that call's shapes, strides, dtypes and devices. Solvers may skip what
        depends on those alone; autograd is not disabled by the caller."""
        with torch.no_grad():
            self.run(x, y, records, prior)

    def source(self) -> str | None:
        """Generated source code, for solvers that generate any."""
        return None

    def repeat_with_tensors(
        self, x: torch.Tensor, y: torch.Tensor, records: Sequence[OpArgs]
    ) -> Callable[[Sequence[torch.Tensor]], bool] | None:
        """After a ``run`` of x into y on ``records`` with no prior: a callable that runs that call
        again on other tensors, given as ``[y, x, *each record's tensors()]`` with the shapes,
        strides, dtypes and devices of this call's and the records' other fields unchanged; it
        returns whether it ran (False: the caller runs the plan as usual). None where the kernel
        cannot repeat the call (yet). This one builds the records anew around the tensors; a
        solver that keeps the call's launches launches them without records."""
        return RebuiltRecords(self, records)


class RebuiltRecords:
    """A call repeated on new tensors by records built anew around them (Kernel.repeat_with_tensors)."""

    __slots__ = ("kernel", "parts")

    def __init__(self, kernel: Kernel, records: Sequence[OpArgs]) -> None:
        self.kernel = kernel
        # per record: its type, its fields that are not tensors, the names of those that are
        self.parts = [_record_parts(r) for r in records]

    def __call__(self, tensors: Sequence[torch.Tensor]) -> bool:
        records, k = [], 2
        for cls, values, names in self.parts:
            records.append(cls(**values, **dict(zip(names, tensors[k : k + len(names)]))))
            k += len(names)
        self.kernel.run(tensors[1], tensors[0], records, None)
        return True


def _record_parts(record: OpArgs) -> tuple[type, dict, tuple[str, ...]]:
    values = {name: getattr(record, name) for name in field_names(type(record))}
    names = tuple(name for name, v in values.items() if isinstance(v, torch.Tensor))
    return type(record), {n: v for n, v in values.items() if n not in names}, names


class Solver(ABC):
    """One fused implementation. Its ``why_not`` is the single source of its supported set."""

    name: str = "?"
    family: str = "?"  # "triton", "cpu", "vendor" or "reference" (FUSIONPLAN_BACKEND selects families)

    @abstractmethod
    def why_not(self, spec: PlanSpec, handle: Handle) -> str | None:
        """None when this solver can run ``spec`` on ``handle``; else the reason it cannot."""

    @abstractmethod
    def build(self, spec: PlanSpec, handle: Handle) -> Kernel:
        """Compile ``spec`` (for which ``why_not`` returned None)."""

    def defer_why(self, spec: PlanSpec, handle: Handle) -> str | None:
        """For a plan this solver can run: why later solvers should be tried first (measured
        slower there), or None. A deferred solver still runs the plan when named, or when no
        later solver can."""
        return None


def build_kernel(solver: Solver, spec: PlanSpec, handle: Handle) -> Kernel:
    """``solver.build``, tried once more where it failed on CPython 3.11's AST race: the AST
    constructor's recursion count is kept per interpreter, so another thread building an AST at the
    same time (Triton parses kernels too) can fail this one with a SystemError that says nothing
    about the plan (cpython issue 106905)."""
    return again_after_ast_race(solver.build, spec, handle)


@dataclass(frozen=True)
class Verdict:
    solver: str
    family: str
    reason: str | None  # None: applicable
    deferred: str | None = None  # applicable, but later solvers are tried first, for this reason
    measured_ms: float | None = None  # its time on this plan and device, where find measured it

    @property
    def applicable(self) -> bool:
        return self.reason is None

    def __str__(self) -> str:
        if not self.applicable:
            return f"{self.solver} [{self.family}]: no: {self.reason}"
        after = f" (after others: {self.deferred})" if self.deferred else ""
        measured = f"; measured {self.measured_ms:.4g} ms" if self.measured_ms is not None else ""
        return f"{self.solver} [{self.family}]: applicable{after}{measured}"
