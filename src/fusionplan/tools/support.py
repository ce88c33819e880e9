"""The supported-fusions table, generated from the solvers' own applicability rules.

``python -m fusionplan.tools.support`` prints it as Markdown; the README's copy is tested against it,
so the documentation cannot drift from the code.
"""

from __future__ import annotations

import types
from collections.abc import Callable

import torch

from fusionplan import solvers
from fusionplan.core.descriptors import ConvolutionDescriptor, TensorDescriptor
from fusionplan.core.enums import ActivationMode, BatchNormMode, DataType
from fusionplan.core.settings import Settings
from fusionplan.plan import FusionPlan

Builder = Callable[[FusionPlan], None]


def _conv(groups: int = 1, stride: int = 1, dilation: int = 1, size: int = 3) -> Builder:
    def add(plan: FusionPlan) -> None:
        c = plan.output_desc.dims[1]
        pad = size // 2
        conv = ConvolutionDescriptor((pad, pad), (stride, stride), (dilation, dilation), groups)
        plan.add_conv_forward(conv, TensorDescriptor.packed(plan.input_desc.dtype, (c, c // groups, size, size)))

    return add


def _bias(plan: FusionPlan) -> None:
    plan.add_bias_forward(TensorDescriptor.packed(plan.input_desc.dtype, (1, plan.output_desc.dims[1], 1, 1)))


def _bn(plan: FusionPlan) -> None:
    plan.add_batchnorm_inference(
        BatchNormMode.SPATIAL, TensorDescriptor.packed(DataType.FLOAT, (1, plan.output_desc.dims[1], 1, 1))
    )


def _act(plan: FusionPlan) -> None:
    plan.add_activation_forward(ActivationMode.RELU)


LETTERS: dict[str, Builder] = {"C": _conv(), "B": _bias, "N": _bn, "A": _act}

#: (what the row stands for, the representative chain it is checked with)
ROWS: list[tuple] = [  # (title, builders[, input channels (default 64)])
    ("CBNA, CBA, CNA, CN, CA, CB (MIOpen's set)", [LETTERS[c] for c in "CBNA"]),
    ("convolution + any chain of B/N/A, any order, repeats", [LETTERS[c] for c in "CANBAB"]),
    ("1x1 stride-1 convolution chains (NCHW, NHWC)", [_conv(size=1), _bn, _act], 256),
    ("stride-1 convolution chains with C >= 128 (NCHW, NHWC)", [_conv(), _bn, _act], 128),
    (
        "convolution chains on few input channels, C <= 15 (the stem: C=3, 7x7, stride 2)",
        [_conv(stride=2, size=7), _bn, _act],
        3,
    ),
    ("pointwise ops before the convolution (e.g. NAC)", [LETTERS[c] for c in "NAC"]),
    ("grouped / depthwise convolution chains", [_conv(groups=4), _bias, _act]),
    ("strided / dilated convolution chains", [_conv(stride=2, dilation=2), _bn, _act]),
    ("pointwise chains without a convolution (NA, BA, NAN, AA)", [LETTERS[c] for c in "NAN"]),
    (
        "convolution chains ending in batch-norm statistics (CS, CBAS)",
        [LETTERS["C"], lambda p: p.add_batchnorm_statistics(BatchNormMode.SPATIAL)],
    ),
    ("batch-norm forward training [+ activation]", [lambda p: p.add_batchnorm_forward(BatchNormMode.SPATIAL), _act]),
    (
        "batch-norm backward [+ activation backward]",
        [
            lambda p: p.add_batchnorm_backward(BatchNormMode.SPATIAL),
            lambda p: p.add_activation_backward(ActivationMode.RELU),
        ],
    ),
]

#: column: (device, its compute capability); Hopper GPUs run the warp-specialized Gluon kernels
DEVICES = {
    "CPU": (torch.device("cpu"), None),
    "CUDA GPU": (torch.device("cuda", 0), (8, 0)),
    "Hopper GPU (H100, H200)": (torch.device("cuda", 0), (9, 0)),
}
DTYPES = (DataType.FLOAT, DataType.HALF, DataType.BFLOAT16)


def _solver_for(builders: list[Builder], device: tuple, channels: int = 64) -> str:
    """Names of the solvers chosen for the row's plan in each dtype and layout (deduplicated) on
    ``device``: (torch device, compute capability)."""
    where, capability = device
    # verdicts only read these
    handle = types.SimpleNamespace(
        device=where, tf32_allowed=lambda: True, compute_capability=lambda: capability, settings=Settings()
    )
    chosen: list[str] = []
    for dtype in DTYPES:
        for layout in ("NCHW", "NHWC"):
            plan = FusionPlan(TensorDescriptor.packed(dtype, (2, channels, 64, 64), layout))
            for build in builders:
                build(plan)
            verdict = solvers.choice(solvers.verdicts(plan.spec(), handle))
            found = "none" if verdict is None else verdict.solver
            if found not in chosen:
                chosen.append(found)
    return ", ".join(chosen)


def support_table() -> str:
    """The Markdown table: for each kind of plan, the solver compile picks on each device."""
    lines = ["| plan | " + " | ".join(DEVICES) + " |", "|---" * (len(DEVICES) + 1) + "|"]
    for title, builders, *channels in ROWS:
        solvers_by_device = (_solver_for(builders, d, *channels) for d in DEVICES.values())
        lines.append(f"| {title} | " + " | ".join(solvers_by_device) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(support_table())
