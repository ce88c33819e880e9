"""Convolution chains on tensors past 2^31 elements: each solver that takes the plan, timed side by
side with cuDNN's convolution (torch's, channels-last), on the GPU.

    python lab/huge_tensors.py

CBNA-ReLU, 3x3, 128 -> 128 channels, fp16 channels-last, 4.4 GB input and output: many images
(17 x 1024 x 1024) and one image (4096 x 4160). Times are CUDA-event medians of 10 runs after 2;
each solver's output is compared with the first's (largest difference, relative to the largest
value), where the GPU tests (tests/gpu -k int32_offsets) check them against the reference.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

import fusionplan as fp
from fusionplan.tools.bench.timing import median_ms
from fusionplan.tools.verify import random_args

SHAPES = ((17, 128, 1024, 1024), (1, 128, 4096, 4160))
SOLVERS = ("gluon-window", "triton-conv")


def cbna_plan(x: torch.Tensor, r: int = 3) -> fp.FusionPlan:
    """CBNA-ReLU on fp16 ``x``: an r x r filter padded to keep the size, as many channels out as in."""
    k, pad = x.shape[1], (r - 1) // 2
    plan = fp.FusionPlan(fp.TensorDescriptor.from_tensor(x))
    plan.add_conv_forward(fp.ConvolutionDescriptor((pad, pad)), fp.TensorDescriptor.packed("half", (k, k, r, r)))
    plan.add_bias_forward(fp.TensorDescriptor.packed("half", (1, k, 1, 1)))
    plan.add_batchnorm_inference(fp.BatchNormMode.SPATIAL, fp.TensorDescriptor.packed("float", (1, k, 1, 1)))
    plan.add_activation_forward(fp.ActivationMode.RELU)
    return plan


def gpu_ms(run) -> float:
    """fusionplan.tools.bench.timing's CUDA-event median of ``run``, 10 runs after 2 (each launch is
    milliseconds: no rotated inputs or graph replay needed)."""
    return median_ms(lambda i: run(), torch.device("cuda"), iters=10, warmup=2)


def report(shape: tuple[int, ...]) -> None:
    x = torch.randn(shape, device="cuda", dtype=torch.float16).to(memory_format=torch.channels_last)
    plan = cbna_plan(x)
    handle = fp.Handle("cuda")
    args = random_args(plan, "cuda", param_dtype=torch.float32)
    y = torch.empty_like(x)
    first = None
    for solver in SOLVERS:
        plan.compile(handle, solver=solver)
        y.fill_(float("nan"))
        plan.execute(handle, x, y, args)
        if first is None:
            first, diff = y.clone(), 0.0
        else:
            diff = ((y.float() - first.float()).abs().max() / first.float().abs().max()).item()
        ms = gpu_ms(lambda: plan.execute(handle, x, y, args))
        print(f"| {shape} | {solver} | {ms:.2f} | {diff:.1e} |")
    del first
    conv = plan.ops[0]
    w = args.get(conv).weight
    try:
        ms = gpu_ms(lambda: F.conv2d(x, w, padding=1))
        print(f"| {shape} | cuDNN convolution alone | {ms:.2f} | |")
    except RuntimeError as error:  # cuDNN's limits on tensor sizes, where it has them
        print(f"| {shape} | cuDNN convolution alone | {str(error).splitlines()[0][:80]} | |")


def main() -> None:
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}")
    print("| N, C, H, W | solver | ms | largest difference to the first |")
    print("|---|---|---|---|")
    for shape in SHAPES:
        report(shape)
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
