"""CPU benchmark: the cpu-folded solver against the reference solver and plain torch eager.

    python lab/cpu_bench.py                      # 6 ResNet-50 layers, batch 1, CBNA-ReLU, fp32, NCHW and NHWC
    python lab/cpu_bench.py --layers all --batch 4 --markdown lab/results/cpu.md

Each case is verified against the float64 reference before it is timed (a wrong result is a
failure, never a time). Times are medians of --iters runs after warm-up, wall clock.
"""

from __future__ import annotations

import argparse
import datetime
import platform
import statistics
import sys
import time

import torch
import torch.nn.functional as F

import fusionplan as fp
from fusionplan.tools.shapes import load_shapes
from fusionplan.tools.verify import compare, random_args, random_tensor, reference_output

DEFAULT_LAYERS = ["r50_01", "r50_02", "r50_06", "r50_10", "r50_15", "r50_22"]


def median_ms(fn, iters: int) -> float:
    for _ in range(2):
        fn()
    samples = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(samples)


def cbna_plan(shape, n: int, layout: fp.Layout) -> fp.FusionPlan:
    plan = fp.FusionPlan(fp.TensorDescriptor.packed("float", (n, shape.c, shape.h, shape.w), layout))
    conv = fp.ConvolutionDescriptor((shape.pad,) * 2, (shape.stride,) * 2, (1, 1))
    plan.add_conv_forward(conv, fp.TensorDescriptor.packed("float", (shape.k, shape.c, shape.r, shape.s)))
    plan.add_bias_forward(fp.TensorDescriptor.packed("float", (1, shape.k, 1, 1)))
    plan.add_batchnorm_inference(fp.BatchNormMode.SPATIAL, fp.TensorDescriptor.packed("float", (1, shape.k, 1, 1)))
    plan.add_activation_forward(fp.ActivationMode.RELU)
    return plan


def eager(x, conv_op, rec_b, rec_n, shape):
    c = conv_op.conv
    h = F.conv2d(x, rec_conv_weight(conv_op), rec_b.bias.flatten(), c.strides, c.pads)
    h = F.batch_norm(
        h,
        rec_n.mean.flatten(),
        rec_n.variance.flatten(),
        rec_n.scale.flatten(),
        rec_n.bias.flatten(),
        False,
        0.0,
        rec_n.epsilon,
    )
    return torch.relu(h)


_weights = {}


def rec_conv_weight(op):
    return _weights[op]


def run_case(shape, n, layout, iters):
    plan = cbna_plan(shape, n, layout)
    x = random_tensor(plan.input_desc.dims, torch.float32, "cpu", layout)
    args = random_args(plan)
    conv, bias, bn, _ = plan.ops
    _weights[conv] = args.get(conv).weight
    fmt = torch.channels_last if layout == fp.Layout.NHWC else torch.contiguous_format
    y = torch.full(plan.output_desc.dims, float("nan")).to(memory_format=fmt)
    times = {}
    ref = reference_output(plan, x, args)
    for backend in ("cpu", "reference"):
        handle = fp.Handle("cpu")
        plan.compile(handle, backend)
        y.fill_(float("nan"))
        plan.execute(handle, x, y, args)
        result = compare(y, ref)
        if not result.rms_ok:
            raise SystemExit(f"{shape.name} {backend}: wrong result: {result}")
        times[backend] = median_ms(lambda h=handle: plan.execute(h, x, y, args), iters)
    out = eager(x, conv, args.get(bias), args.get(bn), shape)
    if not compare(out, ref).rms_ok:
        raise SystemExit(f"{shape.name} eager: wrong result")
    times["eager"] = median_ms(lambda: eager(x, conv, args.get(bias), args.get(bn), shape), iters)
    return times


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", default=",".join(DEFAULT_LAYERS), help="comma-separated layer names, or 'all'")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--layouts", default="NCHW,NHWC")
    p.add_argument("--markdown", default=None, help="also write the table (with the environment) to this file")
    opts = p.parse_args(argv)
    shapes = load_shapes()
    if opts.layers != "all":
        wanted = opts.layers.split(",")
        shapes = [s for s in shapes if s.name in wanted]
    rows = []
    header = (
        "| layer | C→K | RxS/stride | HxW | layout | cpu-folded ms | reference ms | eager ms "
        "| vs reference | vs eager |"
    )
    print(header)
    print("|---" * 10 + "|")
    ratios_ref, ratios_eager = [], []
    for shape in shapes:
        for layout_name in opts.layouts.split(","):
            t = run_case(shape, opts.batch, fp.Layout[layout_name], opts.iters)
            ratios_ref.append(t["reference"] / t["cpu"])
            ratios_eager.append(t["eager"] / t["cpu"])
            row = (
                f"| {shape.name} | {shape.c}→{shape.k} | {shape.r}x{shape.s}/{shape.stride} | {shape.h}x{shape.w} | "
                f"{layout_name} | {t['cpu']:.3f} | {t['reference']:.3f} | {t['eager']:.3f} | "
                f"{ratios_ref[-1]:.2f}x | {ratios_eager[-1]:.2f}x |"
            )
            rows.append(row)
            print(row, flush=True)
    gm = lambda v: statistics.geometric_mean(v)  # noqa: E731
    summary = (
        f"geometric mean speed-up of cpu-folded: {gm(ratios_ref):.2f}x over the reference solver, "
        f"{gm(ratios_eager):.2f}x over torch eager"
    )
    print(summary)
    if opts.markdown:
        env = (
            f"date {datetime.date.today()}, CPU {platform.processor() or platform.machine()} "
            f"({torch.get_num_threads()} threads), torch {torch.__version__}, fusionplan {fp.__version__}, "
            f"batch {opts.batch}, CBNA-ReLU fp32 (spatial BN)"
        )
        cmd = "python lab/cpu_bench.py " + " ".join(argv if argv is not None else sys.argv[1:])
        with open(opts.markdown, "w") as f:
            f.write(f"# CPU solver benchmark\n\n{env}\n\nCommand: `{cmd}`\n\n{header}\n" + "|---" * 10 + "|\n")
            f.write("\n".join(rows) + f"\n\n{summary}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
