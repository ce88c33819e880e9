"""Compile times (cold, warm process, same process; FAST and NORMAL find) and execute host overhead.

    python lab/compile_and_launch.py --out lab/results/compile-and-launch

Each compile measurement runs in a fresh Python process with its own cache directory, so "cold"
means nothing on disk (Triton's cache points inside ours), "warm" the same directory a second
time. Times are from just before ``plan.compile`` to a finished first ``execute`` (synchronized),
after torch, the CUDA context and Triton's import are done (the import is timed and reported).
Host overhead: CPU time per call over 10,000 executes of
a tiny plan, against 10,000 empty torch launches; a CUDA graph of 100 executes is replayed and
checked. Writes results.json and results.md to --out.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

import fusionplan as fp
from fusionplan.tools.verify import EPS, add_chain, compare, random_args, reference_output

LAYER = dict(n=32, c=64, h=56, w=56, k=64, r=3, pad=1)  # ResNet-50's 3x3 64->64 at 56x56 (r50_02)


def cbna_plan(n: int, c: int, h: int, w: int, k: int, r: int, pad: int) -> tuple[fp.FusionPlan, torch.Tensor]:
    x = torch.randn(n, c, h, w, device="cuda").half().to(memory_format=torch.channels_last)
    plan = fp.FusionPlan(fp.TensorDescriptor.from_tensor(x))
    add_chain(plan, "CBNA", conv=fp.ConvolutionDescriptor((pad, pad)), k=k, r=r, s=r, w_layout="NHWC")
    return plan, x


def output_for(plan: fp.FusionPlan) -> torch.Tensor:
    return torch.empty(plan.output_desc.dims, device="cuda", dtype=torch.float16).to(memory_format=torch.channels_last)


# ---- child: one process's compile measurement ------------------------------------------------------
def child(find_mode: str) -> dict:
    torch.zeros(1, device="cuda")  # the CUDA context is not part of compiling a plan
    t_import = time.perf_counter()
    import triton.language  # noqa: F401  (nor is importing Triton, done once by any Triton user)

    import_s = time.perf_counter() - t_import
    handle = fp.Handle("cuda", find_mode=find_mode)
    plan, x = cbna_plan(**LAYER)
    args = random_args(plan, "cuda", param_dtype=torch.float32)
    y = output_for(plan)
    t0 = time.perf_counter()
    plan.compile(handle)
    t1 = time.perf_counter()
    plan.execute(handle, x, y, args)
    torch.cuda.synchronize()
    t2 = time.perf_counter()
    same = []
    for _ in range(50):  # the same plan built again in this process: the handle has its kernel
        again, _ = cbna_plan(**LAYER)
        s0 = time.perf_counter()
        again.compile(handle)
        same.append(time.perf_counter() - s0)
    kernel = plan._entry(handle).kernel
    return {
        "import_triton_s": import_s,
        "compile_s": t1 - t0,
        "first_result_s": t2 - t0,
        "same_process_compile_s": statistics.median(same),
        "config": vars(kernel.config),
    }


def run_child(cache: Path, find_mode: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_CACHE_DIR", "FUSIONPLAN_FIND_MODE")}
    env["FUSIONPLAN_CACHE_DIR"] = str(cache)
    out = subprocess.run(
        [sys.executable, __file__, "--child", find_mode], env=env, capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


# ---- host overhead ------------------------------------------------------------------------------------
def per_call_us(fn, n: int = 2000) -> float:
    for _ in range(100):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    elapsed = time.perf_counter() - t0
    torch.cuda.synchronize()
    return elapsed / n * 1e6


def host_overhead(calls: int) -> dict:
    empty = torch.empty(1, device="cuda")
    results = {"empty_torch_launch_us": min(per_call_us(lambda: empty.add_(1.0), calls) for _ in range(3))}
    handle = fp.Handle("cuda")
    for chain in ("CBNA", "NA"):
        x = torch.randn(1, 16, 8, 8, device="cuda").half().to(memory_format=torch.channels_last)
        plan = add_chain(
            fp.FusionPlan(fp.TensorDescriptor.from_tensor(x)),
            chain,
            conv=fp.ConvolutionDescriptor((1, 1)),
            k=16,
            r=3,
            s=3,
            param_dtype="float",
        )
        plan.compile(handle)
        args = random_args(plan, "cuda", param_dtype=torch.float32)
        y = output_for(plan)
        call = lambda p=plan, x=x, y=y, a=args: p.execute(handle, x, y, a)  # noqa: E731
        us = min(per_call_us(call, calls) for _ in range(3))
        result = compare(y, reference_output(plan, x, args), EPS[torch.float16])
        assert result.nonfinite == 0 and result.rel_norm < 1e-2, str(result)
        results[f"execute_{chain}_us"] = us
        results[f"execute_{chain}_over_empty_us"] = us - results["empty_torch_launch_us"]
    return results


def graph_replay() -> dict:
    plan, x = cbna_plan(n=8, c=64, h=28, w=28, k=64, r=3, pad=1)
    handle = fp.Handle("cuda")
    plan.compile(handle)
    args = random_args(plan, "cuda", param_dtype=torch.float32)
    xs = [torch.randn_like(x) for _ in range(100)]
    ys = [output_for(plan) for _ in range(100)]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        plan.execute(handle, xs[0], ys[0], args)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for xi, yi in zip(xs, ys):
            plan.execute(handle, xi, yi, args)
    for xi, yi in zip(xs, ys):
        xi.normal_()
        yi.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    worst = max(compare(yi, reference_output(plan, xi, args), EPS[torch.float16]).rel_norm for xi, yi in zip(xs, ys))
    unwritten = sum(int(torch.isnan(yi).sum()) for yi in ys)
    return {"graph_executes": 100, "graph_worst_rel_norm": worst, "graph_unwritten": unwritten}


def markdown(r: dict) -> str:
    fast, normal = r["fast"], r["normal"]
    ms = lambda s: f"{s * 1e3:.1f} ms"  # noqa: E731
    us = lambda v: f"{v:.1f} µs"  # noqa: E731
    rows = [
        ("FAST cold compile (empty caches)", ms(fast["cold"]["compile_s"]), "≤ 2 s"),
        ("FAST cold, compile to first result", ms(fast["cold"]["first_result_s"]), ""),
        ("FAST compile, fresh process, warm caches", ms(fast["warm"]["compile_s"]), "≤ 50 ms"),
        ("  (importing Triton in that process, before it)", ms(fast["warm"]["import_triton_s"]), ""),
        ("FAST fresh process, compile to first result", ms(fast["warm"]["first_result_s"]), ""),
        ("FAST compile, same process (a new plan object)", ms(fast["warm"]["same_process_compile_s"]), "≤ 1 ms"),
        ("NORMAL cold compile (benchmarks the candidates)", ms(normal["cold"]["compile_s"]), ""),
        ("NORMAL compile, fresh process (perf DB hit)", ms(normal["warm"]["compile_s"]), ""),
        ("NORMAL winner reused by the second process", str(normal["cold"]["config"] == normal["warm"]["config"]), ""),
        ("empty torch launch (add_ on 1 element)", us(r["host"]["empty_torch_launch_us"]), ""),
        ("execute, tiny CBNA plan", us(r["host"]["execute_CBNA_us"]), ""),
        ("  over an empty torch launch", us(r["host"]["execute_CBNA_over_empty_us"]), "≤ 15 µs"),
        ("execute, tiny NA plan", us(r["host"]["execute_NA_us"]), ""),
        ("  over an empty torch launch", us(r["host"]["execute_NA_over_empty_us"]), "≤ 15 µs"),
        (
            "CUDA graph of 100 executes: worst rel. error, unwritten",
            f"{r['graph']['graph_worst_rel_norm']:.1e}, {r['graph']['graph_unwritten']}",
            "< 1e-2, 0",
        ),
    ]
    env = r["env"]
    lines = [
        f"# Compile time and host overhead ({env['date']})",
        "",
        f"GPU {env['gpu']}, torch {env['torch']}, Triton {env['triton']}, cuDNN {env['cudnn']}, "
        f"Python {env['python']}.",
        "",
        f"Command: `{env['command']}`",
        "",
        f"Plan for compile times: CBNA-ReLU, fp16 NHWC, {LAYER}. NORMAL config: {normal['cold']['config']}.",
        "",
        "| measurement | result | target |",
        "|---|---|---|",
        *[f"| {a} | {b} | {c} |" for a, b, c in rows],
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--child", choices=["FAST", "NORMAL"], help=argparse.SUPPRESS)
    p.add_argument("--out", type=Path, default=Path("lab/results/compile-and-launch"))
    p.add_argument("--calls", type=int, default=10_000)
    a = p.parse_args()
    if a.child:
        print(json.dumps(child(a.child)))
        return
    import triton

    results: dict = {}
    for mode in ("FAST", "NORMAL"):
        with tempfile.TemporaryDirectory() as cache:
            cold = run_child(Path(cache), mode)
            warm = run_child(Path(cache), mode)
        results[mode.lower()] = {"cold": cold, "warm": warm}
        print(mode, json.dumps(results[mode.lower()]), flush=True)
    results["host"] = host_overhead(a.calls)
    print(json.dumps(results["host"]), flush=True)
    results["graph"] = graph_replay()
    print(json.dumps(results["graph"]), flush=True)
    results["env"] = {
        "date": time.strftime("%Y-%m-%d"),
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "cudnn": torch.backends.cudnn.version(),
        "python": sys.version.split()[0],
        "command": "python lab/compile_and_launch.py " + " ".join(sys.argv[1:]),
    }
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "results.json").write_text(json.dumps(results, indent=2))
    (a.out / "results.md").write_text(markdown(results))
    print(markdown(results))


if __name__ == "__main__":
    main()
