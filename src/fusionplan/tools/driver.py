"""fusionplan-driver: MIOpenDriver's CBAInfer commands for fusionplan.

    fusionplan-driver CBAInfer      -F 0 -n 8 -c 128 -H 28 -W 28 -k 128 -y 3 -x 3 -p 1 -q 1 -t 1
    fusionplan-driver CBAInferfp16  --layout NHWC -t 1
    fusionplan-driver CBAInferbfp16 -F 2 -c 64

It builds the plan of the fusion mode (-F), compiles it on the best device present (a GPU
if there is one, else the CPU), runs it, verifies it against the float64 reference and, with
-t 1, times it against the same operators run one by one. Exit status: 0 verified, 1 the
verification failed, 2 the plan or an argument was refused (the reason is printed).
With no shape flags it runs ResNet-50 layer r50_10 (128 -> 128 channels, 3x3, 28x28) at batch 8.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable, Sequence

import torch

from fusionplan.core.descriptors import ConvolutionDescriptor, TensorDescriptor
from fusionplan.core.enums import MIOPEN_ACTIVATIONS, ActivationMode, BatchNormMode, DataType, Layout
from fusionplan.core.errors import FusionPlanError
from fusionplan.core.handle import Handle
from fusionplan.core.settings import FAMILIES
from fusionplan.plan import FusionPlan
from fusionplan.solvers.reference_solver import ReferenceKernel
from fusionplan.tools.verify import EPS, TF32_EPS, add_chain, compare, random_args, random_tensor, reference_output

COMMANDS = {"CBAInfer": DataType.FLOAT, "CBAInferfp16": DataType.HALF, "CBAInferbfp16": DataType.BFLOAT16}
#: -F values, as MIOpenDriver: C = convolution, B = bias, N = batch-norm, A = activation.
FUSION_MODES = {0: "cbna", 1: "cna", 2: "na", 3: "cn", 4: "cba", 5: "ca", 6: "cb"}
BN_EPSILON = 1e-6  # MIOpenDriver's


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="fusionplan-driver",
        description=__doc__.split("\n\n")[0],
        epilog="Flags follow MIOpenDriver CBAInfer; shape defaults are ResNet-50 layer r50_10 at batch 8.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("command", choices=list(COMMANDS), help="CBAInfer (fp32), CBAInferfp16, CBAInferbfp16")
    p.add_argument(
        "-F",
        type=int,
        default=0,
        choices=list(FUSION_MODES),
        dest="fusion_mode",
        help="fusion mode: " + ", ".join(f"{k} {v}" for k, v in FUSION_MODES.items()) + " (default 0)",
    )
    shape = [
        ("n", "batch size", 8),
        ("c", "input channels", 128),
        ("H", "input height", 28),
        ("W", "input width", 28),
        ("k", "output channels", 128),
        ("g", "group count", 1),
        ("y", "filter height", 3),
        ("x", "filter width", 3),
        ("u", "stride height", 1),
        ("v", "stride width", 1),
        ("p", "pad height", 1),
        ("q", "pad width", 1),
        ("l", "dilation height", 1),
        ("j", "dilation width", 1),
    ]
    for flag, text, default in shape:
        p.add_argument(f"-{flag}", type=int, default=default, dest=f"shape_{flag}", help=f"{text} (default {default})")
    p.add_argument(
        "-m",
        type=int,
        default=3,
        dest="activ_mode",
        choices=[m.value for m in MIOPEN_ACTIVATIONS],
        help="activation mode: " + ", ".join(f"{m.value} {m.name}" for m in MIOPEN_ACTIVATIONS) + " (default 3)",
    )
    p.add_argument("-A", type=float, default=1.0, dest="activ_alpha", help="activation alpha (default 1)")
    p.add_argument("-B", type=float, default=0.0, dest="activ_beta", help="activation beta (default 0)")
    p.add_argument("-G", type=float, default=1.0, dest="activ_gamma", help="activation gamma (default 1)")
    p.add_argument(
        "-M",
        type=int,
        default=0,
        dest="bn_mode",
        choices=[0, 1],
        help="batch-norm mode: 0 per-activation, 1 spatial (default 0)",
    )
    p.add_argument("-V", type=int, default=1, dest="verify", choices=[0, 1], help="verify against float64 (default 1)")
    p.add_argument("-t", type=int, default=0, dest="time", choices=[0, 1], help="time fused vs unfused (default 0)")
    p.add_argument("-i", type=int, default=10, dest="iterations", help="timed iterations (default 10)")
    p.add_argument("--layout", choices=["NCHW", "NHWC"], default="NCHW", help="input and output layout (default NCHW)")
    p.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: a GPU if present, else the CPU)")
    p.add_argument(
        "--backend",
        choices=list(FAMILIES),
        default=None,
        help="restrict compile to one solver family (default: the first applicable solver)",
    )
    p.add_argument("--seed", type=int, default=0, help="random seed of inputs and arguments (default 0)")
    return p


def build_plan(opts: argparse.Namespace, dtype: DataType) -> FusionPlan:
    layout = Layout[opts.layout]
    plan = FusionPlan(TensorDescriptor.packed(dtype, (opts.shape_n, opts.shape_c, opts.shape_H, opts.shape_W), layout))
    conv = ConvolutionDescriptor(
        (opts.shape_p, opts.shape_q), (opts.shape_u, opts.shape_v), (opts.shape_l, opts.shape_j), opts.shape_g
    )
    return add_chain(
        plan,
        FUSION_MODES[opts.fusion_mode],
        conv=conv,
        k=opts.shape_k,
        r=opts.shape_y,
        s=opts.shape_x,
        w_layout=layout,
        bn_mode=BatchNormMode(opts.bn_mode),
        activation=ActivationMode(opts.activ_mode),
        param_dtype=DataType.FLOAT,
    )


def time_ms(fn: Callable[[], None], iterations: int, device: torch.device) -> float:
    """Median milliseconds of ``fn`` over ``iterations`` runs after a warm-up."""
    for _ in range(3):
        fn()
    samples = []
    for _ in range(max(iterations, 1)):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(samples)


def run(opts: argparse.Namespace) -> int:
    dtype = COMMANDS[opts.command]
    handle = Handle(opts.device)
    torch.manual_seed(opts.seed)
    plan = build_plan(opts, dtype)
    solver = plan.compile(handle, opts.backend)
    layout = Layout[opts.layout]
    fmt = torch.channels_last if layout == Layout.NHWC else torch.contiguous_format
    x = random_tensor(plan.input_desc.dims, dtype.torch_dtype, handle.device, layout)
    args = random_args(
        plan,
        handle.device,
        param_dtype=torch.float32,
        activ_params=(opts.activ_alpha, opts.activ_beta, opts.activ_gamma),
        epsilon=BN_EPSILON,
    )
    out_desc = plan.output_desc
    y = torch.full(out_desc.dims, float("nan"), dtype=dtype.torch_dtype, device=handle.device).to(memory_format=fmt)

    print(
        f"fusionplan-driver {opts.command} -F {opts.fusion_mode} ({FUSION_MODES[opts.fusion_mode]}) "
        f"{dtype.name} {opts.layout} on {handle.device}"
    )
    print(plan.describe())
    print(f"solver: {solver}")
    plan.execute(handle, x, y, args)
    status = 0
    if opts.verify:
        ref = reference_output(plan, x, args)
        tf32 = dtype == DataType.FLOAT and handle.device.type == "cuda" and handle.tf32_allowed()
        result = compare(y, ref, TF32_EPS if tf32 else EPS[dtype.torch_dtype])
        verdict = "Verifies OK" if result.rms_ok else "FAILED verification"
        print(f"{verdict} on {handle.device} against the float64 reference: {result}")
        status = 0 if result.rms_ok else 1
    if opts.time:
        fused = time_ms(lambda: plan.execute(handle, x, y, args), opts.iterations, handle.device)
        unfused_kernel = _unfused_kernel(plan, handle)
        records = [args.get(op) for op in plan.ops]
        unfused = time_ms(lambda: unfused_kernel.run(x, y, records, None), opts.iterations, handle.device)
        print(
            f"Fused ({solver}): {fused:.4f} ms   Unfused (one op at a time): {unfused:.4f} ms   "
            f"Speedup: {unfused / fused:.2f}x   (median of {opts.iterations})"
        )
    return status


def _unfused_kernel(plan: FusionPlan, handle: Handle) -> ReferenceKernel:
    """The plan's operators one torch op at a time, in the data's own dtype on a GPU."""
    spec = plan.spec()
    native = spec.dtype.torch_dtype if handle.device.type == "cuda" else None
    return ReferenceKernel(spec, native)


def main(argv: Sequence[str] | None = None) -> int:
    opts = build_parser().parse_args(argv)
    try:
        return run(opts)
    except FusionPlanError as exc:
        print(f"fusionplan-driver: {type(exc).__name__} ({exc.status.name}): {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
