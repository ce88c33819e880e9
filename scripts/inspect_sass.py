"""Compile a solver's kernel for a ResNet-50 layer for sm_90 WITHOUT a GPU and summarize its SASS.

    python scripts/inspect_sass.py --layer r50_10 --solver triton-window [--mode CBNA] [--dtype fp16] [--layout NHWC]

Triton ships ptxas and nvdisasm, so the kernel the H100 would run can be built and read on any
machine. The summary answers the questions that decide a Hopper kernel's speed before timing it:
are the products tensor-core wgmma (HGMMA), do they overlap (a wait for zero outstanding wgmma
groups after each one means they run one at a time), is an operand staged through registers
(LDSM before HGMMA), and the registers, spills and shared memory per program.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile

import torch

import fusionplan as fp
from fusionplan.shapes import resnet50_layer
from fusionplan.solvers import solver_named
from fusionplan.testing import layer_plan

TRITON_TYPES = {torch.float16: "*fp16", torch.bfloat16: "*bf16", torch.float32: "*fp32", torch.int32: "*i32"}


def captured_launch(kernel) -> tuple:
    """The (grid, key, args, num_warps, num_stages) that compiling ahead would hand the launcher."""
    seen: list[tuple] = []
    kernel.launcher.compile_ahead = lambda *a: seen.append(a)
    kernel.compile_ahead(torch.device("cpu"))
    return seen[0]


def ast_source(fn, args: list):
    """Triton's ASTSource for ``fn`` specialized as a launch with ``args`` would be."""
    import triton

    signature, constexprs, attrs = {}, {}, {}
    for i, (param, a) in enumerate(zip(fn.params, args)):
        name = param.name
        if param.is_constexpr or isinstance(a, (bool, str)) or a is None or (isinstance(a, int) and a == 1):
            signature[name] = "constexpr"
            constexprs[(i,)] = a
        elif isinstance(a, torch.Tensor):
            signature[name] = TRITON_TYPES[a.dtype]
            attrs[(i,)] = [["tt.divisibility", 16]]
        elif isinstance(a, int):
            signature[name] = "i32" if -(2**31) <= a < 2**31 else "i64"
            if a % 16 == 0:
                attrs[(i,)] = [["tt.divisibility", 16]]
        else:
            signature[name] = "fp32"
    return triton.compiler.ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs)


def summarize(compiled) -> dict:
    import triton

    tools = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compiled.asm["cubin"])
        f.flush()
        sass = subprocess.run([f"{tools}/nvdisasm", "-c", f.name], capture_output=True, text=True).stdout
        usage = subprocess.run([f"{tools}/cuobjdump", "-res-usage", f.name], capture_output=True, text=True).stdout
    waits = re.findall(r"WARPGROUP\.DEPBAR\.LE gsb0, (0x[0-9a-f]+)", sass)
    return {
        "HGMMA": sass.count("HGMMA"),
        "wgmma waits (outstanding groups allowed)": waits,
        "LDSM (operand through registers)": sass.count("LDSM"),
        "tensor loads (UTMALDG)": sass.count("UTMALDG"),
        "async copies (LDGSTS)": sass.count("LDGSTS"),
        "resources": " ".join(re.findall(r"(REG:\d+|STACK:\d+|SHARED:\d+|LOCAL:\d+)", usage)),
        "shared bytes (dynamic)": compiled.metadata.shared,
        "sass": sass,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layer", default="r50_10")
    p.add_argument("--solver", default="triton-conv")
    p.add_argument("--mode", default="CBNA")
    p.add_argument("--dtype", default="fp16", choices=["fp16", "bf16", "fp32"])
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--layout", default="NHWC", choices=["NHWC", "NCHW"], help="the input's layout")
    p.add_argument("--sass", help="write the whole SASS here")
    a = p.parse_args()
    if os.environ.get("TRITON_INTERPRET") == "1":
        sys.exit("unset TRITON_INTERPRET: this compiles for the GPU")
    import triton
    from triton.backends.compiler import GPUTarget

    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}[a.dtype]
    s = resnet50_layer(a.layer)
    x = torch.empty(a.batch, s.c, s.h, s.w, dtype=dtype)
    x = x.to(memory_format=torch.channels_last) if a.layout == "NHWC" else x
    plan = layer_plan(s, x, a.mode)
    kernel = solver_named(a.solver).build(plan.spec(), fp.Handle("cpu"))
    grid, _, args, num_warps, num_stages = captured_launch(kernel)
    compiled = triton.compile(
        ast_source(kernel.launcher.fn, args),
        target=GPUTarget("cuda", 90, 32),
        options={"num_warps": num_warps, "num_stages": num_stages},
    )
    info = summarize(compiled)
    if a.sass:
        with open(a.sass, "w") as f:
            f.write(info["sass"])
    print(f"{a.layer} {a.mode} {a.dtype} {a.solver}: {kernel.config}, grid {grid}, Triton {triton.__version__}")
    for k, v in info.items():
        if k != "sass":
            print(f"  {k}: {v}")


if __name__ == "__main__":
    main()
