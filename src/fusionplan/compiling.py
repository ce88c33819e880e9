"""Compile many plans at once: ``compile_all(plans, handle)``.

Each plan compiles as ``FusionPlan.compile`` would compile it, but the plans' kernels are built
on several threads, and on a GPU each thread hands Triton's compile to a worker process
(fusionplan.runtime.compile_pool), so a model's plans compile on every core instead of one after
another (docs/decisions/cold-start.md).
Plans that would build the same kernel (equal signatures) are compiled once, first, and the
others after, from the handle's kernel cache.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import TextIO

from fusionplan.core.errors import BadParmError, FusionPlanError, InternalError
from fusionplan.core.handle import Handle
from fusionplan.core.settings import Settings
from fusionplan.plan import FusionPlan
from fusionplan.runtime.codegen import interpreter_active
from fusionplan.runtime.compile_pool import worker_processes

#: Compiling shorter than this shows no progress line.
PROGRESS_AFTER_S = 1.0


def compile_all(
    plans: Sequence[FusionPlan],
    handle: Handle,
    *,
    backend: str | None = None,
    solver: str | None = None,
    workers: int | None = None,
    progress: bool | None = None,
    then: Callable[[int], None] | None = None,
) -> list[str]:
    """Compile every plan of ``plans`` for ``handle`` on ``workers`` threads (default:
    ``$FUSIONPLAN_COMPILE_WORKERS``, else the cores this process may use); returns each plan's
    solver, in order. ``backend`` and ``solver`` mean what they mean to ``FusionPlan.compile``.
    ``progress``: a progress line on stderr once compiling has taken a second (None: when
    stderr is a terminal). Every plan is tried; when some fail, the first failure's error type
    is raised, naming each failed plan (the others stay compiled). ``then(i)``: run on the
    compiling threads as soon as plan i has compiled (its first calls, say, which compile
    what a first execute compiles while other plans still compile); the first error it raises
    is raised after every plan was tried."""
    plans = _checked_plans(plans)
    if not isinstance(handle, Handle):
        raise BadParmError(f"compile_all: expected a Handle, got {type(handle).__name__}")
    count = resolve_workers(workers, handle.settings)
    leaders, followers = _by_kernel(plans)
    results: dict[int, str] = {}
    failures: dict[int, Exception] = {}
    shown = _Progress(len(plans), sys.stderr.isatty() if progress is None else bool(progress))

    after_errors: list[Exception] = []

    def after(index: int) -> None:
        try:
            then(index)
        except Exception as exc:  # raised once every plan was tried
            after_errors.append(exc)

    def compile_one(index: int, follow: bool = True) -> None:
        try:
            results[index] = plans[index].compile(handle, backend=backend, solver=solver)
        except Exception as exc:  # reported with the others' below
            failures[index] = exc
        shown.step()
        if follow and then is not None and index in results:
            after(index)

    with worker_processes(count, on_gpu(handle.device.type) and handle.settings.compile_processes):
        run_on_threads(compile_one, leaders, count)
        for index in followers:  # their kernels are in the handle's cache now
            compile_one(index, follow=False)
        if then is not None:  # the followers' first calls on the threads too
            run_on_threads(after, [i for i in followers if i in results], count)
    shown.done()
    if failures:
        raise _combined(plans, failures)
    if after_errors:
        raise after_errors[0]
    return [results[i] for i in range(len(plans))]


def resolve_workers(workers: int | None, settings: Settings) -> int:
    """The number of compiling threads: ``workers``, else the settings' compile_workers (from
    $FUSIONPLAN_COMPILE_WORKERS), else the cores this process may run on."""
    if workers is None:
        workers = settings.compile_workers or _usable_cores()
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise BadParmError(f"workers must be a whole number of at least 1, got {workers!r}")
    return workers


def _usable_cores() -> int:
    affinity = getattr(os, "sched_getaffinity", None)
    return len(affinity(0)) if affinity is not None else os.cpu_count() or 1


def _checked_plans(plans: object) -> list[FusionPlan]:
    if isinstance(plans, (str, bytes)) or not isinstance(plans, Sequence):
        raise BadParmError(f"compile_all: expected a sequence of FusionPlan, got {type(plans).__name__}")
    for i, plan in enumerate(plans):
        if not isinstance(plan, FusionPlan):
            raise BadParmError(f"compile_all: plans[{i}] is a {type(plan).__name__}, not a FusionPlan")
    return list(plans)


def _by_kernel(plans: list[FusionPlan]) -> tuple[list[int], list[int]]:
    """(the first plan of each kernel, the rest): plans of one signature build one kernel, so
    compiling them on two threads at once would build it twice."""
    seen: set = set()
    leaders, followers = [], []
    for i, plan in enumerate(plans):
        try:
            key = plan.spec().signature()
        except Exception:  # e.g. an empty plan: its compile reports why
            key = ("unsigned", i)
        (followers if key in seen else leaders).append(i)
        seen.add(key)
    return leaders, followers


def on_gpu(device_type: str) -> bool:
    """Whether kernels for a device of ``device_type`` are compiled (not interpreted) GPU kernels,
    which worker processes may compile."""
    return device_type == "cuda" and not interpreter_active()


def run_on_threads(task: Callable[[int], None], indices: list[int], workers: int, processes: bool = False) -> None:
    """``task(i)`` for each index, on up to ``workers`` threads (``processes``: whose Triton
    compiles go to as many worker processes; the caller decides, from its settings and device);
    the first error raised is raised once every task has ended."""
    if processes:
        with worker_processes(workers, True):
            return run_on_threads(task, indices, workers)
    if workers == 1 or len(indices) <= 1:
        for i in indices:
            task(i)
        return
    with ThreadPoolExecutor(max_workers=min(workers, len(indices)), thread_name_prefix="fusionplan-compile") as pool:
        for future in as_completed([pool.submit(task, i) for i in indices]):
            future.result()


def _combined(plans: list[FusionPlan], failures: dict[int, Exception]) -> Exception:
    """One error for every failed plan, of the first failure's type (fusionplan's errors; any
    other exception becomes an InternalError), chained to it."""
    ordered = sorted(failures)
    first = failures[ordered[0]]
    lines = "; ".join(
        f"plans[{i}] ({plans[i].combination}): {type(failures[i]).__name__}: {failures[i]}" for i in ordered
    )
    message = f"{len(ordered)} of {len(plans)} plans did not compile: {lines}"
    error = type(first)(message) if isinstance(first, FusionPlanError) else InternalError(message)
    error.__cause__ = first
    return error


class _Progress:
    """``fusionplan: compiled K/N plans (T s)`` on one line of a stream, redrawn as plans finish,
    shown only once compiling has taken PROGRESS_AFTER_S."""

    def __init__(self, total: int, enabled: bool, stream: TextIO | None = None) -> None:
        self.total, self.enabled = total, enabled
        self.stream = stream or sys.stderr
        self.finished = 0
        self.start = time.perf_counter()
        self.shown = False
        self.lock = threading.Lock()
        # the line appears at PROGRESS_AFTER_S even while the first plans are still compiling
        self.timer = threading.Timer(PROGRESS_AFTER_S, self.redraw) if enabled else None
        if self.timer is not None:
            self.timer.daemon = True
            self.timer.start()

    def redraw(self) -> None:
        with self.lock:
            self._draw()

    def step(self) -> None:
        with self.lock:
            self.finished += 1
            self._draw()

    def _draw(self) -> None:
        elapsed = time.perf_counter() - self.start
        if not self.enabled or elapsed < PROGRESS_AFTER_S:
            return
        self.stream.write(f"\rfusionplan: compiled {self.finished}/{self.total} plans ({elapsed:.1f} s)")
        self.stream.flush()
        self.shown = True

    def done(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
        with self.lock:
            if self.shown:
                self.stream.write("\n")
                self.stream.flush()
            self.enabled = False  # a timer already firing draws nothing after the line's end
