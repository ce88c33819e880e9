"""Find across solvers: which applicable solver runs a plan fastest, measured, not ranked by hand.

In find mode NORMAL (a handle's ``find_mode``, ``FUSIONPLAN_FIND_MODE``, ``fusionplan-tune``),
compile builds every applicable solver's kernel (each tunes its own configuration first), times
each on random data of the plan's shapes, and stores the times in the perf database under the
plan's signature and the device. Compile then tries the solvers fastest first. In FAST mode the
stored times order the solvers where the database has them; elsewhere the registry's priority
and the solvers' defer rules (the heuristic) do. The reference solver is never timed: it is the
correctness fallback, tried last; nor are Triton's solvers on a CPU device (the interpreter's
speed says nothing). ``FusionPlan.explain`` shows the stored times.
"""

from __future__ import annotations

import logging
import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

import torch

from fusionplan.core.caches import LruCache
from fusionplan.solvers.base import Kernel, PlanSpec, Solver, Verdict

if TYPE_CHECKING:
    from fusionplan.core.handle import Handle
    from fusionplan.runtime.perfdb import PerfDB

logger = logging.getLogger("fusionplan")

#: the perf database's solver column for the times of a plan's solvers
FIND_ENTRY = "find"

#: (database path and generation, key, device) -> times: one read per plan and process
_memo: LruCache[tuple, dict[str, float]] = LruCache("stored find times", 4096)


def device_name(device: torch.device) -> str:
    """The perf database's name of a device: its model and compute capability, or 'cpu'."""
    if device.type != "cuda":
        return device.type
    props = torch.cuda.get_device_properties(device)
    return f"{props.name} sm_{props.major}{props.minor}"


def _key(spec: PlanSpec, handle: Handle) -> tuple:
    return (FIND_ENTRY, spec.signature(), handle.tf32_allowed())


def _db(db: PerfDB | None) -> PerfDB:
    from fusionplan.runtime.perfdb import default_db

    return db or default_db()


def _memo_key(db: PerfDB, spec: PlanSpec, handle: Handle) -> tuple:
    """(the database and its generation, the perf key, the device): what a memoized read stands for."""
    return ((str(db.path), db.generation), _key(spec, handle), device_name(handle.device))


def stored_times(spec: PlanSpec, handle: Handle, db: PerfDB | None = None) -> dict[str, float]:
    """The solvers' measured times (ms) for this plan on the handle's device, where find ran."""
    db = _db(db)
    memo_key = _memo_key(db, spec, handle)
    remembered = _memo.get(memo_key)
    if remembered is not None:
        return dict(remembered)
    times: dict[str, float] = {}
    if db.path.exists():  # FAST mode without a database creates none
        entry = db.get(FIND_ENTRY, memo_key[1], memo_key[2]) or {}
        raw = entry.get("times")
        if isinstance(raw, dict):
            times = {str(k): float(v) for k, v in raw.items() if isinstance(v, (int, float)) and math.isfinite(v)}
    _memo.put(memo_key, times)
    return dict(times)


def _store(spec: PlanSpec, handle: Handle, times: dict[str, float], db: PerfDB | None) -> None:
    db = _db(db)
    memo_key = _memo_key(db, spec, handle)
    best = min(times, key=times.get)
    db.put(FIND_ENTRY, memo_key[1], memo_key[2], {"solver": best, "times": times}, times[best])
    _memo.put(memo_key, dict(times))


def rank(
    spec: PlanSpec,
    handle: Handle,
    candidates: Sequence[Solver],
    kernel_of: Callable[[Solver], Kernel],
    db: PerfDB | None = None,
) -> list[Solver]:
    """``candidates`` (in the heuristic's order) in the order compile tries them: the measured
    ones fastest first, then the others as they came. In NORMAL mode, solvers not yet measured
    for this plan are timed first (``kernel_of`` builds a solver's kernel), where more than one
    could be."""
    times = stored_times(spec, handle, db)
    timed = [s for s in candidates if s.family != "reference" and runs_natively(s.family, handle.device)]
    if handle.find_mode == "NORMAL" and len(timed) > 1 and any(s.name not in times for s in timed):
        measured = measure(spec, handle, timed, kernel_of)
        if measured:
            times = {**times, **measured}
            _store(spec, handle, times, db)
    return order_by_times(candidates, times)


def runs_natively(family: str, device: torch.device) -> bool:
    """False for Triton's solvers on the CPU: they run there only through Triton's interpreter,
    a test tool, whose times say nothing (find and the bench do not time them)."""
    return not (device.type == "cpu" and family == "triton")


def order_by_times(candidates: Sequence[Solver], times: dict[str, float]) -> list[Solver]:
    measured = sorted((s for s in candidates if s.name in times), key=lambda s: times[s.name])
    return measured + [s for s in candidates if s.name not in times]


def with_times(found: list[Verdict], times: dict[str, float]) -> list[Verdict]:
    """The verdicts with each solver's measured time, where find measured one."""
    return [replace(v, measured_ms=times.get(v.solver)) for v in found]


def measure(
    spec: PlanSpec, handle: Handle, timed: Sequence[Solver], kernel_of: Callable[[Solver], Kernel]
) -> dict[str, float]:
    """Each solver's median time (ms) on random data of the plan's shapes; a solver whose kernel
    does not build or run here is left out (compile then finds it fails, and goes on)."""
    try:
        data = random_data(spec, handle.device)
    except Exception as exc:  # a plan the random records cannot describe: the heuristic decides
        logger.info("find: no random data for %s (%s); the heuristic orders the solvers", spec.combination, exc)
        return {}
    times = {}
    for solver in timed:
        try:
            kernel = kernel_of(solver)
            with handle.activate():
                times[solver.name] = time_kernel(kernel, data, handle.device)
        except Exception as exc:
            logger.info("find: %s left out for %s: %s: %s", solver.name, spec.combination, type(exc).__name__, exc)
    return times


def random_data(spec: PlanSpec, device: torch.device) -> tuple:
    """(x, y, records): a random input, an output and random records of the plan's shapes."""
    from fusionplan.core.samples import random_record

    in_desc, out_desc = spec.input_desc, spec.output_desc
    x = torch.empty_strided(in_desc.dims, in_desc.strides, dtype=in_desc.dtype.torch_dtype, device=device)
    y = torch.empty_strided(out_desc.dims, out_desc.strides, dtype=out_desc.dtype.torch_dtype, device=device)
    records = [random_record(op, device, param_dtype=torch.float32) for op in spec.ops]
    return x.normal_(), y, records


def time_kernel(kernel: Kernel, data: tuple, device: torch.device) -> float:
    """The kernel's median time (ms) on ``data``: its first run, then its repeated runs timed."""
    x, y, records = data
    with torch.no_grad():
        kernel.run(x, y, records, None)
    return _median_ms(lambda: kernel.rerun(x, y, records, None), device)


def _median_ms(fn: Callable[[], None], device: torch.device) -> float:
    if device.type == "cuda":
        import triton.testing

        return float(triton.testing.do_bench(fn, warmup=5, rep=20, return_mode="median"))
    times = []
    for _ in range(5):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)
