"""Triton compiles in worker processes, for ``compile_all`` on a GPU.

A thread of ``compile_all`` that has a kernel to compile asks Triton for the kernel's
specialization data without compiling it (``capture_specialization``: Triton's ``jit_cache_hook``
answers "skip"), hands it to an idle worker (``fusionplan/runtime/compile_worker.py``, a process that
imports Triton alone), and waits, holding no GIL; the worker compiles into the Triton cache both
share and builds the kernel's launcher there. The thread then loads the kernel as a warm cache
would. Python's share of compiling (Triton's code generator, the LLVM passes' bindings) then runs
on every core instead of under one process's GIL (docs/decisions/cold-start.md).

The workers start as the first kernels to compile come (none for a warm cache), up to one per
compiling thread, and serve later ``compile_all`` calls; they end
with this process (their stdin closes). Any problem (a worker that died, a compile that failed
there, a kernel the process does not find after the worker compiled it) means the thread compiles
the kernel itself, as without workers: workers can cost time, never a wrong kernel.
``FUSIONPLAN_COMPILE_PROCESSES=0`` turns them off.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import queue
import subprocess
import sys
import threading
from pathlib import Path

from fusionplan.runtime.codegen import triton_cache_dir, use_triton_cache_inside_ours
from fusionplan.runtime.compile_worker import read_frame, write_frame

log = logging.getLogger("fusionplan")

WORKER_SCRIPT = Path(__file__).with_name("compile_worker.py")


def _worker_environment() -> dict[str, str]:
    """A worker's environment: ours, with Triton's cache where this process keeps it."""
    return {**os.environ, "TRITON_CACHE_DIR": str(triton_cache_dir())}


def _environment() -> tuple:
    """What a worker is given that selects what it compiles and where it puts it: a pool started
    under other settings is not used."""
    environment = _worker_environment().items()
    return tuple(sorted((k, v) for k, v in environment if k.startswith(("TRITON_", "FUSIONPLAN_CACHE_DIR"))))


class Worker:
    """One compiling process and its pipes."""

    def __init__(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, str(WORKER_SCRIPT)],
            env=_worker_environment(),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )

    def ask(self, request: dict) -> dict:
        """The worker's reply to ``request``; OSError where the worker is gone."""
        assert self.process.stdin is not None and self.process.stdout is not None
        write_frame(self.process.stdin, request)
        reply = read_frame(self.process.stdout)
        if reply is None:
            raise OSError(f"compile worker {self.process.pid} ended (exit status {self.process.poll()})")
        return reply

    def close(self) -> None:
        with contextlib.suppress(OSError):
            if self.process.stdin is not None:
                self.process.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=5)
        if self.process.poll() is None:
            self.process.kill()


class CompilePool:
    """``size`` workers; ``compile`` hands a request to an idle one."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.environment = _environment()
        self._idle: queue.Queue[Worker] = queue.Queue()
        self._workers: list[Worker] = []
        self._start_lock = threading.Lock()

    def _take(self) -> Worker:
        """An idle worker; a new one while fewer than ``size`` run (a warm cache starts none)."""
        with self._start_lock:
            if self._idle.empty() and len(self._workers) < self.size:
                self._workers.append(Worker())
                return self._workers[-1]
        return self._idle.get()

    def compile(self, request: dict) -> str | None:
        """The compiled kernel's hash in Triton's cache, or None where the worker did not compile
        it (the caller compiles it itself)."""
        worker = self._take()
        try:
            reply = worker.ask(request)
        except (OSError, ValueError) as exc:
            log.warning("compiling %s in a worker process failed (%s): compiling here", request.get("name"), exc)
            worker = self._replace(worker)
            return None
        finally:
            self._idle.put(worker)
        if "error" in reply:
            log.debug("worker could not compile %s: %s", request.get("name"), reply["error"])
            return None
        return reply.get("hash")

    def _replace(self, worker: Worker) -> Worker:
        """A fresh process in place of one that failed."""
        worker.close()
        fresh = Worker()
        self._workers[self._workers.index(worker)] = fresh
        return fresh

    def close(self) -> None:
        for worker in self._workers:
            worker.close()


_pool: CompilePool | None = None
_active = 0
_lock = threading.Lock()


@contextlib.contextmanager
def worker_processes(workers: int, enabled: bool):
    """While it is entered, Launcher compiles in ``workers`` worker processes (a pool kept for
    later calls); a no-op where they are not ``enabled`` (the settings' compile_processes, and
    kernels for a GPU: Triton's interpreter compiles nothing) or one worker is asked for."""
    global _pool, _active
    if workers < 2 or not enabled:
        yield
        return
    use_triton_cache_inside_ours()  # before the pool's settings are read: the workers compile there
    with _lock:
        if _pool is not None and _active == 0 and (_pool.environment != _environment() or _pool.size < workers):
            _pool.close()
            _pool = None
        if _pool is None:
            _pool = CompilePool(workers)
        _active += 1
    try:
        yield
    finally:
        with _lock:
            _active -= 1


def active_pool() -> CompilePool | None:
    """The worker pool while a compile_all uses it, else None."""
    pool = _pool
    return pool if _active > 0 and pool is not None and pool.environment == _environment() else None


def close_pool() -> None:
    """End the workers (at exit, or to start them afresh)."""
    global _pool
    with _lock:
        if _pool is not None and _active == 0:
            _pool.close()
            _pool = None


atexit.register(close_pool)


# ---- asking Triton what it would compile ----------------------------------------------------------
_capture = threading.local()
_hook_lock = threading.Lock()
_installed_hook = None


def _install_hook() -> bool:
    """Put the capturing hook in Triton's jit_cache_hook, before any hook already there (which
    it calls for every compile it does not capture); False where this Triton has no such hook."""
    global _installed_hook
    try:
        from triton import knobs

        runtime = knobs.runtime
    except (ImportError, AttributeError):
        return False
    with _hook_lock:
        if runtime.jit_cache_hook is not None and runtime.jit_cache_hook is _installed_hook:
            return True
        previous = runtime.jit_cache_hook

        def hook(**kwargs):
            if getattr(_capture, "active", False):
                _capture.data = kwargs.get("compile", {}).get("specialization_data")
                return True  # skip the compile: a worker does it
            return previous(**kwargs) if previous is not None else None

        runtime.jit_cache_hook = _installed_hook = hook
    return True


def capture_specialization(jit, kwargs: dict) -> str | None:
    """Triton's specialization data of ``jit.warmup(**kwargs)`` without compiling it; None where
    Triton has the kernel in memory already (nothing to compile) or would not say."""
    if not _install_hook():
        return None
    _capture.active, _capture.data = True, None
    try:
        jit.warmup(**kwargs)
        return _capture.data
    finally:
        _capture.active, _capture.data = False, None


def compile_in_worker(fn, kwargs: dict) -> bool:
    """Compile ``fn.jit.warmup(**kwargs)``'s kernel in a worker of the active pool; True once it
    is in Triton's cache. ``fn`` is a codegen.GeneratedKernel (whose module a worker can import
    by path: it imports Triton alone); anything else is compiled by the caller."""
    pool = active_pool()
    path, module = getattr(fn, "path", None), getattr(fn, "module_name", None)
    if pool is None or path is None or module is None:
        return False
    data = capture_specialization(fn.jit, kwargs)
    if data is None:
        return False
    from triton.runtime import driver

    target = driver.active.get_current_target()
    request = {
        "path": str(path),
        "module": module,
        "name": fn.__name__,
        "data": data,
        "target": [target.backend, target.arch, target.warp_size],
    }
    return pool.compile(request) is not None
