"""fusionplan-tune: fill the perf database ahead of time for a set of shapes.

    fusionplan-tune             # on a GPU: the 23 ResNet-50 layers, batch 32, fp16 NHWC, CBNA and CBA
    fusionplan-tune --shapes my_layers.csv --batch 1,32 --precisions fp16,bf16 --layouts NHWC,NCHW
    fusionplan-tune --model resnext50_32x4d --batch 32   # a zoo model's layers, each with its chain

Each plan is compiled in NORMAL find mode: each applicable solver benchmarks its candidate
configurations once and stores the winner, then find times the solvers against each other (the
vendor's cuDNN call among them) and stores the times, so that later processes (FAST or NORMAL)
compile the fastest without benchmarking. The report counts the solvers chosen, and the plans
for which nothing new was stored (a solver without configurations, or a plan tuned before).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from collections.abc import Sequence

from fusionplan.core.errors import FusionPlanError
from fusionplan.core.handle import Handle, resolve_device
from fusionplan.runtime.perfdb import default_db
from fusionplan.solvers import find
from fusionplan.tools.bench.cases import build_plan
from fusionplan.tools.bench.cli import BadArgument, add_case_options, cases_from


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="fusionplan-tune",
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_case_options(p)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    opts = build_parser().parse_args(argv)
    try:
        device = resolve_device(opts.device)
    except FusionPlanError as exc:
        print(f"fusionplan-tune: {exc}", file=sys.stderr)
        return 2
    try:
        cases = cases_from(opts, device)
    except (BadArgument, FusionPlanError) as exc:
        print(f"fusionplan-tune: {exc}", file=sys.stderr)
        return 2
    db = default_db()
    before = db.count()
    chosen: Counter[str] = Counter()
    nothing_new: Counter[str] = Counter()
    across = 0
    started = time.perf_counter()
    for case in _progress(cases):
        plan = build_plan(case)
        handle = Handle(device, allow_tf32=case.tf32, find_mode="NORMAL")
        entries = db.count()
        solver = plan.compile(handle)
        chosen[solver] += 1
        across += bool(find.stored_times(plan.spec(), handle))
        if db.count() == entries:
            nothing_new[solver] += 1
    print(
        f"tuned {len(cases) - sum(nothing_new.values())} of {len(cases)} plans in "
        f"{time.perf_counter() - started:.1f} s; perf database {db.path}: {before} -> {db.count()} entries"
    )
    print("  chosen: " + ", ".join(f"{solver} {n}" for solver, n in chosen.most_common()))
    print(f"  {across} plans with solvers timed against each other (FusionPlan.explain shows the times)")
    for solver, n in nothing_new.items():
        print(f"  {n} plans compiled by {solver}: nothing new stored (no configurations to tune, or tuned before)")
    return 0


def _progress(cases):
    try:
        from rich.progress import track
    except ImportError:
        return cases
    return track(cases, description="tuning", transient=True)


if __name__ == "__main__":
    sys.exit(main())
