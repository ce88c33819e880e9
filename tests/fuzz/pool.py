"""Fuzz cases in worker processes: a case that kills its worker is recorded as a crash, with a
one-line repro, and a new worker takes the next case.

Each worker makes its cases from (seed, index) itself; the parent hands out indices and reads
back one line per run. Workers start by spawn, so that CUDA works in them.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import signal
import sys
import time
import traceback
from collections import Counter
from dataclasses import dataclass, field

REPRO = "python -m tests.fuzz --mode {mode} --seed {seed} --index {index}"


def _worker(conn, mode: str, seed: int, options: dict) -> None:
    """Run the cases whose indices arrive on ``conn``; report each run (and each solver before it runs)."""
    if mode == "interp":
        os.environ["TRITON_INTERPRET"] = "1"
    import torch

    torch.set_num_threads(1)
    import logging

    logging.getLogger("fusionplan").setLevel(logging.ERROR)  # misuse cases log their failed calls

    from .execute import focused_case, fuzz_handle, run_case

    handle = fuzz_handle(mode)
    crash_at = os.environ.get("FUSIONPLAN_FUZZ_CRASH_INDEX")  # tests of the pool: a worker that dies
    while True:
        index = conn.recv()
        if index is None:
            return
        if crash_at is not None and index == int(crash_at):
            os.kill(os.getpid(), signal.SIGSEGV)
        solver = ["setup"]

        def progress(name: str, index: int = index, solver: list = solver) -> None:
            solver[0] = name
            conn.send(("start", index, name))

        try:
            case = focused_case(seed, index, mode, options, handle)
            runs = run_case(case, handle, progress=progress, only=options.get("solvers"))
            conn.send(("done", index, [(r.solver, r.failures) for r in runs]))
            fatal = any(fatal_text(f) for r in runs for f in r.failures[:1])
        except Exception as exc:  # a failure of the fuzzer's own setup, or of a plan's build: reported, not lost
            lines = traceback.format_exc(limit=8).strip().splitlines()
            conn.send(("done", index, [(solver[0], [f"{type(exc).__name__}: {exc}"[:600], *lines[-8:-1]])]))
            fatal = fatal_text(f"{exc} {exc.__cause__}")
        if fatal:  # the CUDA context is lost: a fresh worker takes the next case
            return


def fatal_text(failure: str) -> bool:
    """A failure that leaves the worker's CUDA context lost (every later call would fail)."""
    return "CUDA error" in failure or "illegal" in failure or "cudaError" in failure


@dataclass
class Summary:
    mode: str
    seed: int
    cases: int = 0
    runs: int = 0
    by_solver: Counter = field(default_factory=Counter)
    mismatches: list[dict] = field(default_factory=list)
    crashes: list[dict] = field(default_factory=list)
    seconds: float = 0.0

    def as_dict(self) -> dict:
        return {
            "mode": self.mode,
            "seed": self.seed,
            "cases": self.cases,
            "runs": self.runs,
            "runs_by_solver": dict(sorted(self.by_solver.items())),
            "mismatches": len(self.mismatches),
            "crashes": len(self.crashes),
            "seconds": round(self.seconds, 1),
            "mismatch_list": _first_per_solver(self.mismatches, 12),
            "crash_list": self.crashes[:200],
        }


def _first_per_solver(entries: list[dict], each: int) -> list[dict]:
    """The first ``each`` entries of every solver, so that one solver's many cannot hide another's."""
    seen: Counter = Counter()
    kept = []
    for entry in entries:
        seen[entry["solver"]] += 1
        if seen[entry["solver"]] <= each:
            kept.append(entry)
    return kept


class Worker:
    def __init__(self, mode: str, seed: int, options: dict) -> None:
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_worker, args=(child, mode, seed, options), daemon=True)
        self.proc.start()
        child.close()
        self.index: int | None = None
        self.solver = "(building)"
        self.since = 0.0

    def give(self, index: int) -> None:
        self.index, self.solver, self.since = index, "(building)", time.monotonic()
        self.conn.send(index)

    def stop(self) -> None:
        try:
            self.conn.send(None)
        except OSError:
            pass
        self.proc.join(5)
        if self.proc.is_alive():
            self.proc.kill()


def run_pool(
    mode: str,
    seed: int,
    indices: range,
    workers: int,
    options: dict,
    case_timeout: float,
    time_limit: float | None = None,
    log=print,
) -> Summary:
    """Run the cases of ``indices`` on ``workers`` processes; stop early after ``time_limit`` s."""
    summary = Summary(mode, seed)
    start = time.monotonic()
    todo = list(indices)[::-1]
    pool = [Worker(mode, seed, options) for _ in range(workers)]
    busy: list[Worker] = []
    for w in pool:
        if todo:
            w.give(todo.pop())
            busy.append(w)
    last_note = start
    while busy:
        for w in list(busy):
            message = None
            try:
                if w.conn.poll(0.05):
                    message = w.conn.recv()
            except (EOFError, OSError):
                message = None
            if message is None:
                dead = not w.proc.is_alive()
                late = time.monotonic() - w.since > case_timeout
                if not (dead or late):
                    continue
                how = _death(w.proc.exitcode) if dead else f"no answer in {case_timeout:.0f} s"
                repro = _repro(mode, seed, w.index, options)
                summary.crashes.append({"index": w.index, "solver": w.solver, "how": how, "repro": repro})
                summary.cases += 1
                log(f"CRASH case {w.index} ({w.solver}): {how}: {repro}")
                w.proc.kill()
                busy.remove(w)
                pool.remove(w)
                w = Worker(mode, seed, options)
                pool.append(w)
            elif message[0] == "start":
                w.solver = message[2]
                continue
            else:
                _record(summary, mode, seed, message[1], message[2], log, options)
                if any(fatal_text(f) for _, failures in message[2] for f in failures[:1]):
                    w.proc.join(30)  # the worker ends after a fatal case: a fresh one goes on
                    busy.remove(w)
                    pool.remove(w)
                    w = Worker(mode, seed, options)
                    pool.append(w)
            if w in busy:
                busy.remove(w)
            out_of_time = time_limit is not None and time.monotonic() - start > time_limit
            if todo and not out_of_time:
                w.give(todo.pop())
                busy.append(w)
        if time.monotonic() - last_note > 60:
            last_note = time.monotonic()
            log(
                f"... {summary.cases} cases, {summary.runs} runs, {len(summary.mismatches)} mismatches, "
                f"{len(summary.crashes)} crashes, {last_note - start:.0f} s"
            )
    for w in pool:
        w.stop()
    summary.seconds = time.monotonic() - start
    return summary


def _record(summary: Summary, mode: str, seed: int, index: int, runs: list, log, options: dict) -> None:
    summary.cases += 1
    for solver, failures in runs:
        summary.runs += 1
        summary.by_solver[solver.split(":")[0]] += 1
        if failures:
            repro = _repro(mode, seed, index, options)
            summary.mismatches.append({"index": index, "solver": solver, "failures": failures, "repro": repro})
            log(f"MISMATCH case {index} ({solver}): {failures[0][:300]} | {repro}")


def _death(code: int | None) -> str:
    if code is not None and code < 0:
        return f"killed by {signal.Signals(-code).name}"
    return f"exited with {code}"


#: The draw's options and their command-line defaults: a repro names those the run changed, since
#: each changes which case an index draws.
DRAW_DEFAULTS = {"training": 0.1, "misuse": 0.05, "layers": 0.0, "models": 0.0, "focus": None, "solvers": None}


def _repro(mode: str, seed: int, index: int | None, options: dict) -> str:
    flags = "".join(
        f" --{name} {options[name]}" for name, default in DRAW_DEFAULTS.items() if options.get(name, default) != default
    )
    return REPRO.format(mode=mode, seed=seed, index=index) + flags


def write_summary(summary: Summary, path: str | None) -> None:
    text = json.dumps(summary.as_dict(), indent=1)
    if path:
        with open(path, "w") as f:
            f.write(text + "\n")
    else:
        sys.stdout.write(text + "\n")
