"""fusionplan-tune: fill the perf database ahead of time for a set of shapes.

    fusionplan-tune                                        # the 23 ResNet-50 layers, batch 32, fp16 NHWC, CBNA and CBA
    fusionplan-tune --shapes my_layers.csv --batch 1,32 --precisions fp16,bf16 --layouts NHWC,NCHW

Each plan is compiled in NORMAL find mode: its solver benchmarks the candidate configurations once
and stores the winner, so that later processes (FAST or NORMAL) compile it without benchmarking.
Solvers without tuning (the CPU and reference solvers) are reported and skipped.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence

from fusionplan.benchmark.cases import PRECISIONS, Case, build_plan
from fusionplan.benchmark.cli import _split
from fusionplan.enums import ActivationMode
from fusionplan.errors import FusionPlanError
from fusionplan.handle import Handle, resolve_device
from fusionplan.perfdb import default_db
from fusionplan.shapes import load_shapes

TUNED_SOLVERS = ("triton-conv",)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="fusionplan-tune",
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--shapes", default=None, help="CSV of shapes (name,C,K,H,W,R,S,stride,pad); default: ResNet-50 v1.5"
    )
    p.add_argument("--layers", default="all", help="comma-separated layer names, or 'all' (default)")
    p.add_argument("--batch", default="32", help="comma-separated batch sizes (default 32)")
    p.add_argument("--precisions", default="fp16", help=f"comma-separated, of {', '.join(PRECISIONS)} (default fp16)")
    p.add_argument("--layouts", default="NHWC", help="comma-separated NCHW,NHWC (default NHWC)")
    p.add_argument("--modes", default="CBNA,CBA", help="comma-separated operator chains (default CBNA,CBA)")
    p.add_argument("--device", default=None, help="cuda or cuda:N (default: the current device)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    opts = build_parser().parse_args(argv)
    try:
        device = resolve_device(opts.device)
    except FusionPlanError as exc:
        print(f"fusionplan-tune: {exc}", file=sys.stderr)
        return 2
    shapes = load_shapes(opts.shapes)
    if opts.layers != "all":
        shapes = [s for s in shapes if s.name in _split(opts.layers)]
    cases = [
        Case(s, int(b), p, lay, m.upper(), ActivationMode.RELU)
        for p in _split(opts.precisions)
        for lay in _split(opts.layouts)
        for m in _split(opts.modes)
        for b in _split(opts.batch)
        for s in shapes
    ]
    db = default_db()
    before = db.count()
    skipped: dict[str, int] = {}
    started = time.perf_counter()
    for case in _progress(cases):
        plan = build_plan(case)
        handle = Handle(device, allow_tf32=case.tf32, find_mode="NORMAL")
        solver = plan.compile(handle)
        if solver not in TUNED_SOLVERS:
            skipped[solver] = skipped.get(solver, 0) + 1
    print(
        f"tuned {len(cases) - sum(skipped.values())} plans in {time.perf_counter() - started:.1f} s; "
        f"perf database {db.path}: {before} -> {db.count()} entries"
    )
    for solver, n in skipped.items():
        print(f"  {n} plans compiled by {solver}, which has no tuning: nothing stored")
    return 0


def _progress(cases):
    try:
        from rich.progress import track
    except ImportError:
        return cases
    return track(cases, description="tuning", transient=True)


if __name__ == "__main__":
    sys.exit(main())
