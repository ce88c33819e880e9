"""The fuzzer's command line.

    python -m tests.fuzz --mode cpu --seed 1 --cases 100000 --workers 2 --summary cpu.json
    python -m tests.fuzz --mode interp --seed 1 --cases 5000
    python -m tests.fuzz --mode gpu --seed 1 --cases 20000 --workers 16
    python -m tests.fuzz --mode cpu --seed 1 --index 4711      # one case, in this process, verbose

--mode: cpu (the CPU solvers), interp (the Triton solvers through Triton's interpreter), gpu
(every GPU solver) or sm90 (the GPU's cases on the CPU: every Gluon solver that takes a plan but
for the device builds its kernel and makes its launch). Exit status 1 when any run mismatched or
crashed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.fuzz", description=__doc__.split("\n\n")[0])
    ap.add_argument("--mode", choices=("cpu", "interp", "gpu", "sm90"), default="cpu")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--cases", type=int, default=1000)
    ap.add_argument("--first", type=int, default=0, help="index of the first case")
    ap.add_argument("--index", type=int, default=None, help="run this one case here, and print it")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--training", type=float, default=0.1, help="share of training plans")
    ap.add_argument("--misuse", type=float, default=0.05, help="share of misuse cases")
    ap.add_argument(
        "--layers", type=float, default=0.0, help="share of layer-like cases (channels of real networks' layers)"
    )
    ap.add_argument("--models", type=float, default=0.0, help="share of random fused models trained a few steps")
    ap.add_argument("--solvers", default=None, help="only solvers with these name prefixes, comma separated")
    ap.add_argument("--focus", default=None, help="draw, for each index, a plan this solver takes (of its variants)")
    ap.add_argument("--case-timeout", type=float, default=600.0)
    ap.add_argument("--time-limit", type=float, default=None, help="stop handing out cases after this many seconds")
    ap.add_argument("--summary", default=None, help="write the JSON summary here (default: stdout)")
    args = ap.parse_args(argv)
    options = {
        "training": args.training,
        "misuse": args.misuse,
        "solvers": args.solvers,
        "layers": args.layers,
        "models": args.models,
        "focus": args.focus,
    }
    if args.index is not None:
        return _one(args.mode, args.seed, args.index, options)
    from .pool import run_pool, write_summary

    summary = run_pool(
        args.mode,
        args.seed,
        range(args.first, args.first + args.cases),
        args.workers,
        options,
        args.case_timeout,
        args.time_limit,
        log=lambda line: print(line, file=sys.stderr, flush=True),
    )
    write_summary(summary, args.summary)
    return 1 if summary.mismatches or summary.crashes else 0


def _one(mode: str, seed: int, index: int, options: dict) -> int:
    if mode == "interp":
        os.environ["TRITON_INTERPRET"] = "1"

    from .execute import focused_case, fuzz_handle, run_case

    handle = fuzz_handle(mode)
    case = focused_case(seed, index, mode, options, handle)
    print(json.dumps(case))
    runs = run_case(case, handle, only=options["solvers"])
    for run in runs:
        print(f"{run.solver}: {'ok' if not run.failures else ''}")
        for failure in run.failures:
            print("   ", failure)
    return 1 if any(run.failures for run in runs) else 0


if __name__ == "__main__":
    sys.exit(main())
