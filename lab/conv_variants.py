"""GPU: the fused conv kernel's tuning candidates against cuDNN, per layer (GPU time only).

    python lab/conv_variants.py [--layers r50_02,r50_10] [--batch 32] [--dtype fp16] [--layout NHWC]
        [--solver triton-window] [--candidates 1] [--normal 1]

For each layer: cuDNN's convolution alone, cuDNN's fused conv+bias+ReLU, PyTorch eager
conv+bias+ReLU, and fusionplan's CBA-ReLU kernel (the first applicable solver, or ``--solver``)
with the heuristic's configuration and, with ``--candidates 1``, each of the solver's candidates.
Times are medians of triton.testing.do_bench (L2 flushed between runs), so host overhead is
excluded; it is measured separately per execute.
"""

from __future__ import annotations

import argparse
import glob
import os
import time

import torch
import torch.nn.functional as F
import triton.testing

import fusionplan as fp
from fusionplan.tools.shapes import load_shapes
from fusionplan.tools.verify import TF32_EPS, compare, reference_output

DT = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}


def _us(v: float | str) -> str:
    return f"{v * 1e3:.1f}us" if isinstance(v, float) else v


def host_time(fn, n: int = 300) -> float:
    """Microseconds of CPU time per call (the GPU queue absorbs the kernels)."""
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    elapsed = (time.perf_counter() - t0) / n * 1e6
    torch.cuda.synchronize()
    return elapsed


def wgmma_report() -> str:
    """How many compiled conv kernels in Triton's cache use wgmma (Hopper's warpgroup MMA)."""
    files = glob.glob(
        os.path.join(os.environ.get("TRITON_CACHE_DIR", os.path.expanduser("~/.triton/cache")), "*", "conv_kernel.ptx")
    )
    with_wgmma = sum("wgmma" in open(f).read() for f in files)
    return f"{with_wgmma} of {len(files)} compiled conv kernels use wgmma"


def bench(fn) -> float:
    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")


def run_layer(shape, opts, dtype: torch.dtype, fmt: torch.memory_format) -> None:
    x = torch.randn(opts.batch, shape.c, shape.h, shape.w, device="cuda").to(dtype).to(memory_format=fmt)
    w = (torch.randn(shape.k, shape.c, shape.r, shape.s, device="cuda") * 0.05).to(dtype).to(memory_format=fmt)
    b = torch.randn(shape.k, device="cuda").to(dtype)
    st, pd = shape.stride, shape.pad
    flops = shape.flops(opts.batch)
    t_conv = bench(lambda: F.conv2d(x, w, None, st, pd))
    t_cudnn_cba = bench(lambda: torch.cudnn_convolution_relu(x, w, b, (st, st), (pd, pd), (1, 1), 1))
    t_eager = bench(lambda: torch.relu(F.conv2d(x, w, b, st, pd)))
    plan = fp.Plan(x).conv(w, stride=st, padding=pd).bias(b).relu()
    plan.core.compile(plan.handle, solver=opts.solver)
    kernel = plan.core._entry(plan.handle).kernel
    y = torch.empty(plan.core.output_desc.dims, device="cuda", dtype=dtype).to(memory_format=fmt)
    records = [plan.args.get(op) for op in plan.core.ops]
    ref = reference_output(plan.core, x, plan.args)
    eps = TF32_EPS if getattr(kernel, "dot_precision", "ieee") == "tf32" else None  # fp32 data, TF32 products
    results = {}
    configs = [("heuristic", kernel.config)]
    if opts.candidates:
        configs += [(f"{c.block_m}x{c.block_n}x{c.block_k}w{c.num_warps}s{c.num_stages}", c) for c in kernel.candidates]
    for name, cfg in configs:
        kernel.config = cfg
        try:
            y.fill_(float("nan"))
            kernel.run(x, y, records, None)
            torch.cuda.synchronize()
            if not compare(y, ref, eps).rms_ok:
                results[name] = "WRONG"
                continue
            results[name] = bench(lambda: kernel.run(x, y, records, None))
        except Exception as exc:  # a config that does not fit (shared memory): reported
            results[name] = f"fail {type(exc).__name__}"
    kernel.config = configs[0][1]
    # host time per call, CPU-side: execute (checks + launch), kernel.run (launch path), Triton's launch alone
    args = plan.args
    host_us = host_time(lambda: plan.core.execute(plan.handle, x, y, args))
    run_us = host_time(lambda: kernel.run(x, y, records, None))
    packed, values, flags = kernel._derived.get(records, None)
    launch_us = host_time(lambda: kernel._launch(kernel.config, x, packed, y, values, flags))
    normal_note = ""
    if opts.normal:
        normal = fp.Plan(x, handle=fp.Handle("cuda", find_mode="NORMAL")).conv(w, stride=st, padding=pd).bias(b).relu()
        normal.core.compile(normal.handle, solver=opts.solver)
        nk = normal.core._entry(normal.handle).kernel
        t_normal = bench(lambda: nk.run(x, y, records, None))
        normal_note = f" | NORMAL {t_normal * 1e3:.1f}us {nk.config} ratio {t_normal / t_cudnn_cba:.2f}"
    timed = [(v, k) for k, v in results.items() if isinstance(v, float)]
    if not timed:
        print(f"{shape.name} {kernel.solver_name}: no configuration ran right: {results}", flush=True)
        return
    best = min(timed)
    print(
        f"{shape.name} C{shape.c} K{shape.k} {shape.r}x{shape.s}/{st} {shape.h}x{shape.w} {kernel.solver_name}: "
        f"cudnn conv {t_conv * 1e3:.1f}us, cudnn CBA-relu {t_cudnn_cba * 1e3:.1f}us, eager {t_eager * 1e3:.1f}us | "
        f"ours heuristic {_us(results['heuristic'])} "
        f"best {best[0] * 1e3:.1f}us ({best[1]}, {flops / best[0] / 1e9:.0f} TFLOP/s) "
        f"ratio best/cudnnCBA {best[0] / t_cudnn_cba:.2f}{normal_note} | "
        f"host execute {host_us:.0f}us run {run_us:.0f}us launch {launch_us:.0f}us"
    )
    print("   ", {k: (round(v * 1e3, 1) if isinstance(v, float) else v) for k, v in results.items()}, flush=True)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--layers", default="r50_00,r50_01,r50_02,r50_07,r50_10,r50_13,r50_15,r50_16,r50_21,r50_22")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--dtype", default="fp16")
    p.add_argument("--layout", default="NHWC")
    p.add_argument("--candidates", type=int, default=0, help="also time every tuning candidate")
    p.add_argument("--solver", default=None, help="force one solver (default: the first applicable)")
    p.add_argument("--normal", type=int, default=0, help="also time NORMAL find's pick")
    opts = p.parse_args()
    dtype = DT[opts.dtype]
    names = opts.layers.split(",")
    fmt = torch.channels_last if opts.layout == "NHWC" else torch.contiguous_format
    print(
        f"{torch.cuda.get_device_name()} torch {torch.__version__} triton {triton.__version__} "
        f"cudnn {torch.backends.cudnn.version()} {opts.dtype} {opts.layout} batch {opts.batch}"
    )
    for shape in [s for s in load_shapes() if s.name in names]:
        run_layer(shape, opts, dtype, fmt)
    print(wgmma_report())


if __name__ == "__main__":
    main()
