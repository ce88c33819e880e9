"""Compile a solver's kernel for a ResNet-50 layer for sm_90 WITHOUT a GPU and summarize its SASS.

    python scripts/inspect_sass.py --layer r50_10 --solver triton-window [--mode CBNA] [--dtype fp16] [--layout NHWC]
        [--tuning NAME=VALUE ...] [--sass FILE] [--controls FILE]

Triton ships ptxas and nvdisasm, so the kernel the H100 would run can be built and read on any
machine. The summary answers the questions that decide a Hopper kernel's speed before timing it:
are the products tensor-core wgmma (HGMMA), do they overlap (a wait for zero outstanding wgmma
groups after each one means they run one at a time), is an operand staged through registers
(LDSM before HGMMA), and the registers, spills and shared memory per program.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

import fusionplan as fp
from fusionplan.runtime import tuning
from fusionplan.runtime.sass import compile_for_hopper, summarize, with_control_bits
from fusionplan.solvers import solver_named
from fusionplan.tools.bench.cli import tuning_override
from fusionplan.tools.shapes import resnet50_layer
from fusionplan.tools.verify import layer_plan


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layer", default="r50_10")
    p.add_argument("--solver", default="triton-conv")
    p.add_argument("--mode", default="CBNA")
    p.add_argument("--dtype", default="fp16", choices=["fp16", "bf16", "fp32"])
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--layout", default="NHWC", choices=["NHWC", "NCHW"], help="the input's layout")
    p.add_argument("--sass", help="write the whole SASS here")
    p.add_argument(
        "--controls",
        help="write each instruction here with its scheduling controls: the scoreboard it sets (W), "
        "the one its reads release (R), the ones it waits for",
    )
    p.add_argument(
        "--tuning",
        action="append",
        default=[],
        type=tuning_override,
        help="NAME=VALUE: a constant of fusionplan.runtime.tuning set for this compile (repeatable)",
    )
    a = p.parse_args()
    if os.environ.get("TRITON_INTERPRET") == "1":
        sys.exit("unset TRITON_INTERPRET: this compiles for the GPU")
    import triton

    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}[a.dtype]
    s = resnet50_layer(a.layer)
    x = torch.empty(a.batch, s.c, s.h, s.w, dtype=dtype)
    x = x.to(memory_format=torch.channels_last) if a.layout == "NHWC" else x
    plan = layer_plan(s, x, a.mode)
    with tuning.overridden(dict(a.tuning)):
        kernel = solver_named(a.solver).build(plan.spec(), fp.Handle("cpu"))
        grid, compiled = compile_for_hopper(kernel)
    info = summarize(compiled)
    if a.sass:
        with open(a.sass, "w") as f:
            f.write(info["sass"])
    if a.controls:
        with open(a.controls, "w") as f:
            for address, write, read, waits, text in with_control_bits(info["hex_sass"]):
                sets = f"W{write}" if write is not None else ""
                frees = f"R{read}" if read is not None else ""
                f.write(f"{address} {sets:3} {frees:3} wait[{''.join(map(str, waits)):6}] {text}\n")
    print(f"{a.layer} {a.mode} {a.dtype} {a.solver}: {kernel.config}, grid {grid}, Triton {triton.__version__}")
    for k, v in info.items():
        if k not in ("sass", "hex_sass"):
            print(f"  {k}: {v}")


if __name__ == "__main__":
    main()
