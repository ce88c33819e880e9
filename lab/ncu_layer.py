"""ResNet-50 layers, fused by fusionplan (and by cuDNN), one launch each, for Nsight Compute.

    ncu --clock-control none --profile-from-start off --section SpeedOfLight --section Occupancy \\
        --section LaunchStats --section WarpStateStats --section ComputeWorkloadAnalysis \\
        python lab/ncu_layer.py --layer r50_02

Every case is compiled and warmed up first; the profiler ranges then hold, case after case, exactly
one fusionplan execute (CBNA-ReLU) and, unless ``--no-cudnn``, one cuDNN fused conv+bias+ReLU
(batch-norm folded), fp16, NHWC or NCHW input and output. ``--layer`` and ``--layout`` take
comma-separated lists (every layer in every layout, in that order); the cases' order and solvers are
printed, so that a table of counters (``fusionplan.tools.bench.ncu_table``) can name each kernel's case.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import torch

import fusionplan as fp
from fusionplan.runtime import tuning
from fusionplan.tools.bench.cases import cudnn_fused
from fusionplan.tools.bench.cli import tuning_override
from fusionplan.tools.shapes import resnet50_layer
from fusionplan.tools.verify import layer_plan, random_args


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layer", default="r50_02", help="a layer or a comma-separated list")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--solver", default=None, help="force one solver (default: the first applicable)")
    p.add_argument("--layout", default="NHWC", help="NHWC, NCHW or both, comma-separated")
    p.add_argument("--no-cudnn", action="store_true", help="profile fusionplan's kernels alone")
    p.add_argument(
        "--tuning",
        action="append",
        default=[],
        type=tuning_override,
        help="NAME=VALUE: a constant of fusionplan.runtime.tuning set for the run (repeatable)",
    )
    a = p.parse_args()
    cases = [(layer, layout) for layer in a.layer.split(",") for layout in a.layout.split(",")]
    for _, layout in cases:
        if layout not in ("NHWC", "NCHW"):
            p.error(f"--layout {layout!r}: expected NHWC or NCHW")
    with tuning.overridden(dict(a.tuning)):
        runs = [prepare(a, layer, layout) for layer, layout in cases]
        for label, once in runs:
            profile(label, once)


def prepare(a: argparse.Namespace, layer: str, layout: str) -> tuple[str, Callable[[], None]]:
    """One case compiled and warmed up: its label (layer, layout, solver, configuration) and a
    function that runs it once (fusionplan, then cuDNN)."""
    s = resnet50_layer(layer)
    fmt = torch.channels_last if layout == "NHWC" else torch.contiguous_format
    x = torch.randn(a.batch, s.c, s.h, s.w, device="cuda").half().to(memory_format=fmt)
    plan = layer_plan(s, x, "CBNA")
    handle = fp.Handle("cuda")
    plan.compile(handle, solver=a.solver)
    args = random_args(plan, "cuda", param_dtype=torch.float32)
    y = torch.empty(plan.output_desc.dims, device="cuda", dtype=torch.float16).to(memory_format=fmt)
    cudnn = None if a.no_cudnn else cudnn_fused(plan, args)
    assert a.no_cudnn or cudnn is not None

    def once() -> None:
        plan.execute(handle, x, y, args)
        if cudnn is not None:
            cudnn(x)

    for _ in range(5):
        once()
    torch.cuda.synchronize()
    label = f"{layer} {layout}: {plan.compiled_solver(handle)}, config {plan._entry(handle).kernel.config}"
    return label, once


def profile(label: str, once: Callable[[], None]) -> None:
    """One run of a case inside the profiler range, then its label (fusionplan.tools.bench.ncu_table's LABEL)."""
    torch.cuda.profiler.start()
    once()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()
    print(label, flush=True)


if __name__ == "__main__":
    main()
