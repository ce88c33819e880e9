"""What an NCHW layer would cost as NHWC work plus transposes, beside the NCHW kernel itself.

    python lab/transpose_bound.py --layers r50_10,r50_22 [--precision fp16]

For each ResNet-50 layer (CBNA-ReLU, batch 32, CUDA-graph replay, input and output sets rotated past
the L2 cache as fusionplan-bench does) it times, in one process:

- ``nchw``: the plan on NCHW input and output (fusionplan's default solver);
- ``nhwc``: the same plan on NHWC input and output;
- ``in``: the NCHW input copied to an NHWC buffer; for a strided 1x1 layer only the pixels it reads
  (every ``stride``-th row and column), so that an NHWC 1x1 of stride 1 follows;
- ``out``: the NHWC output copied to NCHW;
- ``separate``: ``in``, the NHWC plan on that buffer (for a strided 1x1, a stride-1 plan on the
  picked pixels) and ``out``, three launches in one graph; its output is checked against ``nchw``'s;
- ``tri in``, ``tri out``, ``tri separate``: the same with the copies by a plain Triton transpose
  of 64 x 64 tiles instead of torch's copy.

``separate`` is what NCHW costs when the transposes are passes of their own; a kernel that turns
its input into NHWC inside itself saves ``out``'s pass and a launch on top. The ratios printed are
``nchw`` and the faster ``separate`` over ``nhwc``; ``err`` is the separate runs' relative error
against ``nchw``'s output. ``--compile-only`` compiles and checks without timing (to warm the
kernel caches from several processes first).
"""

from __future__ import annotations

import argparse
import math

import torch
import triton
import triton.language as tl

import fusionplan as fp
from fusionplan.tools.bench.timing import median_ms
from fusionplan.tools.shapes import ConvShape, resnet50_layer
from fusionplan.tools.verify import layer_plan, random_args

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
ROTATION_BYTES = 256 * 2**20


@triton.jit
def _to_nhwc(x_ptr, y_ptr, C, H, W, OW, P, STRIDE: tl.constexpr, BC: tl.constexpr, BP: tl.constexpr):
    # a [BC channels, BP output pixels] tile of one image: read along the planes, written along channels
    n, cb, pb = tl.program_id(2), tl.program_id(1), tl.program_id(0)
    c = cb * BC + tl.arange(0, BC)
    p = pb * BP + tl.arange(0, BP)
    src = (p // OW) * (STRIDE * W) + (p % OW) * STRIDE
    mask = (c[:, None] < C) & (p[None, :] < P)
    v = tl.load(x_ptr + n * C * H * W + c[:, None] * (H * W) + src[None, :], mask=mask)
    tl.store(y_ptr + n * P * C + p[None, :] * C + c[:, None], v, mask=mask)


@triton.jit
def _to_nchw(x_ptr, y_ptr, C, P, BC: tl.constexpr, BP: tl.constexpr):
    n, cb, pb = tl.program_id(2), tl.program_id(1), tl.program_id(0)
    c = cb * BC + tl.arange(0, BC)
    p = pb * BP + tl.arange(0, BP)
    mask = (c[:, None] < C) & (p[None, :] < P)
    v = tl.load(x_ptr + n * P * C + p[None, :] * C + c[:, None], mask=mask)
    tl.store(y_ptr + n * C * P + c[:, None] * P + p[None, :], v, mask=mask)


def to_nhwc(x: torch.Tensor, y: torch.Tensor, stride: int) -> None:
    """y (channels-last, the picked pixels) from NCHW x by one Triton launch."""
    n, c, h, w = x.shape
    oh, ow = y.shape[2:]
    grid = (triton.cdiv(oh * ow, 64), triton.cdiv(c, 64), n)
    _to_nhwc[grid](x, y, c, h, w, ow, oh * ow, STRIDE=stride, BC=64, BP=64)


def to_nchw(x: torch.Tensor, y: torch.Tensor) -> None:
    n, c, h, w = x.shape
    grid = (triton.cdiv(h * w, 64), triton.cdiv(c, 64), n)
    _to_nchw[grid](x, y, c, h * w, BC=64, BP=64)


def picked_shape(s: ConvShape) -> ConvShape | None:
    """The stride-1 layer that a strided 1x1 layer is on the pixels it reads, else None."""
    if s.r != 1 or s.s != 1 or s.stride == 1 or s.pad != 0:
        return None
    oh, ow = (s.h - 1) // s.stride + 1, (s.w - 1) // s.stride + 1
    return ConvShape(s.name + "-picked", s.c, s.k, oh, ow, 1, 1, 1, 0, groups=s.groups)


def compiled(s: ConvShape, x: torch.Tensor, chain: str = "CBNA") -> tuple[fp.FusionPlan, fp.Handle]:
    plan = layer_plan(s, x, chain)
    handle = fp.Handle("cuda")
    plan.compile(handle)
    return plan, handle


def layer_row(name: str, dtype: torch.dtype, iters: int, timed: bool = True) -> dict[str, float | str]:
    s = resnet50_layer(name)
    batch = 32
    nchw = [torch.randn(batch, s.c, s.h, s.w, device="cuda").to(dtype)]
    plan_c, handle_c = compiled(s, nchw[0])
    dims = plan_c.output_desc.dims
    per_set = nchw[0].numel() * nchw[0].element_size() * 2 + math.prod(dims) * nchw[0].element_size() * 2
    sets = max(2, min(16, math.ceil(ROTATION_BYTES / per_set)))
    nchw += [torch.randn_like(nchw[0]) for _ in range(sets - 1)]
    nhwc = [x.to(memory_format=torch.channels_last) for x in nchw]
    y_c = [torch.empty(dims, device="cuda", dtype=dtype) for _ in range(sets)]
    y_h = [y.to(memory_format=torch.channels_last) for y in y_c]
    plan_h, handle_h = compiled(s, nhwc[0])

    def args_of(plan: fp.FusionPlan) -> fp.OperatorArgs:  # the same values for every plan of the layer
        return random_args(plan, "cuda", param_dtype=torch.float32, gen=torch.Generator().manual_seed(0))

    args = args_of(plan_c)

    picked = picked_shape(s)
    if picked is None:
        scratch = [torch.empty_like(x) for x in nhwc]
        plan_s, handle_s = plan_h, handle_h
        args_s = args_of(plan_h)

        def view(x: torch.Tensor) -> torch.Tensor:
            return x
    else:
        shape = (batch, s.c, picked.h, picked.w)
        scratch = [torch.empty(shape, device="cuda", dtype=dtype).to(memory_format=torch.channels_last) for _ in nchw]
        plan_s, handle_s = compiled(picked, scratch[0])
        args_s = args_of(plan_s)

        def view(x: torch.Tensor) -> torch.Tensor:
            return x[:, :, :: s.stride, :: s.stride]

    args_h = args_of(plan_h)

    def run_nchw(i: int) -> None:
        plan_c.execute(handle_c, nchw[i % sets], y_c[i % sets], args)

    def run_nhwc(i: int) -> None:
        plan_h.execute(handle_h, nhwc[i % sets], y_h[i % sets], args_h)

    def run_in(i: int) -> None:
        scratch[i % sets].copy_(view(nchw[i % sets]))

    def run_out(i: int) -> None:
        y_c[i % sets].copy_(y_h[i % sets])

    def run_separate(i: int) -> None:
        run_in(i)
        plan_s.execute(handle_s, scratch[i % sets], y_h[i % sets], args_s)
        run_out(i)

    stride = 1 if picked is None else s.stride

    def run_tri_in(i: int) -> None:
        to_nhwc(nchw[i % sets], scratch[i % sets], stride)

    def run_tri_out(i: int) -> None:
        to_nchw(y_h[i % sets], y_c[i % sets])

    def run_tri_separate(i: int) -> None:
        run_tri_in(i)
        plan_s.execute(handle_s, scratch[i % sets], y_h[i % sets], args_s)
        run_tri_out(i)

    run_nchw(0)
    expected = y_c[0].clone()
    y_c[0].fill_(float("nan"))
    run_separate(0)
    torch.cuda.synchronize()
    err = ((y_c[0].double() - expected.double()).norm() / expected.double().norm()).item()
    y_c[0].fill_(float("nan"))
    run_tri_separate(0)
    torch.cuda.synchronize()
    err = max(err, ((y_c[0].double() - expected.double()).norm() / expected.double().norm()).item())
    row: dict[str, float | str] = {
        "layer": name,
        "nchw solver": plan_c.compiled_solver(handle_c),
        "nhwc solver": plan_s.compiled_solver(handle_s),
        "separate vs nchw": f"{err:.1e}",
    }
    if not timed:  # compiled and checked only (warms the kernel caches)
        return row
    for label, fn in (
        ("nchw", run_nchw),
        ("nhwc", run_nhwc),
        ("in", run_in),
        ("out", run_out),
        ("separate", run_separate),
        ("tri in", run_tri_in),
        ("tri out", run_tri_out),
        ("tri separate", run_tri_separate),
    ):
        row[label] = median_ms(fn, torch.device("cuda"), iters=iters, graph=True) * 1e3
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", default=",".join(f"r50_{i:02d}" for i in range(1, 23)))
    p.add_argument("--precision", default="fp16", choices=sorted(DTYPES))
    p.add_argument("--iters", type=int, default=30)
    p.add_argument("--compile-only", action="store_true", help="compile and check, time nothing")
    a = p.parse_args()
    rows = [layer_row(name, DTYPES[a.precision], a.iters, not a.compile_only) for name in a.layers.split(",")]
    if a.compile_only:
        for r in rows:
            print(r)
        return
    cols = ["nchw", "nhwc", "in", "out", "separate", "tri in", "tri out", "tri separate"]
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, {a.precision}, times in us")
    print("| layer | NCHW solver | NHWC solver | " + " | ".join(cols) + " | nchw/nhwc | separate/nhwc | err |")
    print("|" + "---|" * (len(cols) + 6))
    logs = {"nchw": 0.0, "separate": 0.0, "best": 0.0}
    for r in rows:
        times = " | ".join(f"{r[c]:.1f}" for c in cols)
        a_ratio, b_ratio = r["nchw"] / r["nhwc"], min(r["separate"], r["tri separate"]) / r["nhwc"]
        logs["nchw"] += math.log(a_ratio)
        logs["separate"] += math.log(b_ratio)
        logs["best"] += math.log(min(a_ratio, b_ratio))
        print(
            f"| {r['layer']} | {r['nchw solver']} | {r['nhwc solver']} | {times} | {a_ratio:.3f} | {b_ratio:.3f}"
            f" | {r['separate vs nchw']} |"
        )
    n = len(rows)
    print({k: round(math.exp(v / n), 3) for k, v in logs.items()}, "geometric means over", n, "layers")


if __name__ == "__main__":
    main()
