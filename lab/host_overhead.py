"""Host (CPU) time per execute, broken down, for a convolution plan and a pointwise plan on the GPU.

    python lab/host_overhead.py

execute = fusionplan's checks + the kernel's run; run = argument cache + launch; launch = the
kernel launch alone. Times are CPU microseconds per call (the GPU queue absorbs the kernels).
"""

from __future__ import annotations

import torch
from compile_and_launch import per_call_us  # lab/ is the script's directory

import fusionplan as fp
from fusionplan.tools.verify import random_args


def plan_for(chain: str) -> tuple[fp.FusionPlan, torch.Tensor]:
    x = torch.randn(8, 64, 14, 14, device="cuda").half().to(memory_format=torch.channels_last)
    plan = fp.FusionPlan(fp.TensorDescriptor.from_tensor(x))
    for letter in chain:
        if letter == "C":
            plan.add_conv_forward(fp.ConvolutionDescriptor((1, 1)), fp.TensorDescriptor.packed("half", (64, 64, 3, 3)))
        elif letter == "B":
            plan.add_bias_forward(fp.TensorDescriptor.packed("half", (1, 64, 1, 1)))
        elif letter == "N":
            plan.add_batchnorm_inference(fp.BatchNormMode.SPATIAL, fp.TensorDescriptor.packed("float", (1, 64, 1, 1)))
        else:
            plan.add_activation_forward(fp.ActivationMode.RELU)
    return plan, x


def main() -> None:
    empty = torch.empty(1, device="cuda")
    print(f"an empty torch launch (add_): {per_call_us(lambda: empty.add_(1.0)):.1f} us")
    for chain in ("CBNA", "NA"):
        report(chain)


def report(chain: str) -> None:
    plan, x = plan_for(chain)
    handle = fp.Handle("cuda")
    plan.compile(handle)
    args = random_args(plan, "cuda", param_dtype=torch.float32)
    y = torch.empty(plan.output_desc.dims, device="cuda", dtype=torch.float16).to(memory_format=torch.channels_last)
    kernel = plan._entry(handle).kernel
    records = [args.get(op) for op in plan.ops]
    execute = per_call_us(lambda: plan.execute(handle, x, y, args))
    run = per_call_us(lambda: kernel.run(x, y, records, None))
    print(
        f"{chain} ({kernel.solver_name}): execute {execute:.1f} us, kernel.run {run:.1f} us, "
        f"direct launches cached: {len(kernel.launcher._compiled)}, direct path on: {kernel.launcher.direct}"
    )


if __name__ == "__main__":
    main()
