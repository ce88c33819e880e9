"""One ResNet-50 layer, fused by fusionplan and by cuDNN, one launch each, for Nsight Compute.

    ncu --clock-control none --profile-from-start off --section SpeedOfLight --section Occupancy \\
        --section LaunchStats --section WarpStateStats --section ComputeWorkloadAnalysis \\
        python bench/ncu_layer.py --layer r50_02

Everything is compiled and warmed up first; the profiler range holds exactly one fusionplan
execute (CBNA-ReLU) and one cuDNN fused conv+bias+ReLU (batch-norm folded), fp16, NHWC or
(``--layout NCHW``) NCHW input and output.
"""

from __future__ import annotations

import argparse

import torch

import fusionplan as fp
from fusionplan import tuning
from fusionplan.benchmark.cases import cudnn_fused
from fusionplan.benchmark.cli import tuning_override
from fusionplan.shapes import resnet50_layer
from fusionplan.testing import layer_plan, random_args


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layer", default="r50_02")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--solver", default=None, help="force one solver (default: the first applicable)")
    p.add_argument("--layout", choices=("NHWC", "NCHW"), default="NHWC")
    p.add_argument(
        "--tuning",
        action="append",
        default=[],
        type=tuning_override,
        help="NAME=VALUE: a constant of fusionplan.tuning set for the run (repeatable)",
    )
    a = p.parse_args()
    with tuning.overridden(dict(a.tuning)):
        profile(a)


def profile(a: argparse.Namespace) -> None:
    """Compile, warm up, then one fusionplan execute and one cuDNN call inside the profiler range."""
    s = resnet50_layer(a.layer)
    fmt = torch.channels_last if a.layout == "NHWC" else torch.contiguous_format
    x = torch.randn(a.batch, s.c, s.h, s.w, device="cuda").half().to(memory_format=fmt)
    plan = layer_plan(s, x, "CBNA")
    handle = fp.Handle("cuda")
    plan.compile(handle, solver=a.solver)
    args = random_args(plan, "cuda", param_dtype=torch.float32)
    y = torch.empty(plan.output_desc.dims, device="cuda", dtype=torch.float16).to(memory_format=fmt)
    cudnn = cudnn_fused(plan, args)
    assert cudnn is not None
    for _ in range(5):
        plan.execute(handle, x, y, args)
        cudnn(x)
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    plan.execute(handle, x, y, args)
    cudnn(x)
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()
    print(f"{a.layer}: {plan.compiled_solver(handle)}, config {plan._entry(handle).kernel.config}")


if __name__ == "__main__":
    main()
