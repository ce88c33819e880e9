"""Repeat one long fused launch and compare each output bit for bit with the first, alone and
while other processes share the GPU (time-sliced contexts), on the GPU.

    python lab/time_slice_repro.py [--iters 30] [--load 8] [--solver gluon-gemm]

CBNA-ReLU, 1x1, 64 -> 64 channels, fp16 NCHW, 33 x 1024 x 1024 (4.4 GB in and out, about 5 ms a
launch). Each solver's kernel is deterministic: alone every repeat must equal the first. ``--load``
starts that many processes running torch matrix products for the duration, so the GPU switches
between their contexts during the launches. Prints each repeat that differs: how many elements,
how many NaN, which channels, the first values.
"""

from __future__ import annotations

import argparse

import torch
from huge_tensors import cbna_plan  # lab/ is the script's directory

import fusionplan as fp
from fusionplan.tools.bench.contention import other_processes_on_the_gpu
from fusionplan.tools.verify import random_args


def repeats(label: str, plan, handle, x, args, first, iters: int) -> int:
    """Repeat the launch ``iters`` times; the number of repeats that differ from ``first``."""
    y = torch.empty_like(first)
    bad = 0
    for it in range(iters):
        y.fill_(-1000.0)
        plan.execute(handle, x, y, args)
        torch.cuda.synchronize()
        differ = (y != first) & ~(torch.isnan(y) & torch.isnan(first))
        count = int(differ.sum())
        if count:
            bad += 1
            channels = differ.nonzero()[:, 1].unique().tolist()[:8]
            print(
                f"{label} repeat {it}: {count} elements differ, {int(torch.isnan(y).sum())} NaN, "
                f"channels {channels}, values {y[differ][:4].tolist()} (first {first[differ][:4].tolist()})",
                flush=True,
            )
    print(f"{label}: {bad} of {iters} repeats differ", flush=True)
    return bad


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--iters", type=int, default=30)
    parser.add_argument("--load", type=int, default=8, help="processes sharing the GPU in the second round")
    parser.add_argument("--solver", default=None, help="force a solver (default: the plan's first)")
    opts = parser.parse_args()
    torch.manual_seed(0)
    x = torch.randn((33, 64, 1024, 1024), device="cuda").half()
    plan, handle = cbna_plan(x, r=1), fp.Handle("cuda")
    solver = plan.compile(handle, solver=opts.solver)
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; solver {solver}", flush=True)
    args = random_args(plan, "cuda", param_dtype=torch.float32)
    first = torch.empty(plan.output_desc.dims, device="cuda", dtype=torch.float16)
    plan.execute(handle, x, first, args)
    repeats("alone", plan, handle, x, args, first, opts.iters)
    with other_processes_on_the_gpu(opts.load, seconds=10 + opts.iters):
        repeats(f"with {opts.load} processes", plan, handle, x, args, first, opts.iters)


if __name__ == "__main__":
    main()
