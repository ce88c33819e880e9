"""Shared by the tests, the driver and the benchmarks: random arguments and verification.

Verification compares with the float64 reference implementation by relative norm and by
MIOpen's rule, rms(out - ref) / (sqrt(n) * max|ref|) < 80 * eps(T).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from fusionplan.core.descriptors import ConvolutionDescriptor, TensorDescriptor
from fusionplan.core.enums import ActivationMode, BatchNormMode, DataType, Layout
from fusionplan.core.samples import ACTIV_PARAMS, random_record, random_tensor  # noqa: F401 (re-exported)
from fusionplan.oracle.reference import run_reference
from fusionplan.plan import FusionPlan, OperatorArgs

#: Machine epsilon of each data type (TF32 has fp16's 10-bit mantissa).
EPS = {torch.float32: 2.0**-23, torch.float16: 2.0**-10, torch.bfloat16: 2.0**-7, torch.float64: 2.0**-52}
TF32_EPS = 2.0**-10
#: Relative-norm tolerance against the float64 reference, by data type.
TOLERANCE = {torch.float32: 1e-5, torch.float16: 1e-2, torch.bfloat16: 1e-2, torch.float64: 1e-12}


def add_chain(
    plan: FusionPlan,
    chain: str,
    *,
    conv: ConvolutionDescriptor | None = None,
    k: int = 1,
    r: int = 1,
    s: int = 1,
    w_layout: Layout | str = Layout.NCHW,
    bn_mode: BatchNormMode = BatchNormMode.SPATIAL,
    activation: ActivationMode = ActivationMode.RELU,
    param_dtype: DataType | str | None = None,
) -> FusionPlan:
    """Add operators named by letters in data order (C convolution, B bias, N batch-norm inference,
    A activation, S batch-norm statistics, either case) to ``plan``: a K x C/groups x R x S filter
    for C, parameters shaped for the current channels (batch-norm parameters in ``param_dtype``,
    default the data's)."""
    dtype = plan.input_desc.dtype
    for letter in chain.upper():
        channels = plan.output_desc.dims[1]
        if letter == "C":
            conv_desc = conv or ConvolutionDescriptor()
            w = TensorDescriptor.packed(dtype, (k, channels // conv_desc.groups, r, s), w_layout)
            plan.add_conv_forward(conv_desc, w)
        elif letter == "B":
            plan.add_bias_forward(TensorDescriptor.packed(dtype, (1, channels, 1, 1)))
        elif letter == "N":
            dims = (1, channels, 1, 1) if bn_mode == BatchNormMode.SPATIAL else (1, *plan.output_desc.dims[1:])
            plan.add_batchnorm_inference(bn_mode, TensorDescriptor.packed(param_dtype or dtype, dims))
        elif letter == "A":
            plan.add_activation_forward(activation)
        elif letter == "S":
            plan.add_batchnorm_statistics(bn_mode, True)
        else:
            raise ValueError(f"chain {chain!r}: letters are C, B, N, A, S")
    return plan


def layer_plan(shape, x: torch.Tensor, chain: str) -> FusionPlan:
    """The plan of ``chain`` (letters C B N A) on ``x`` for a benchmark layer ``shape`` (a
    fusionplan.tools.shapes.ConvShape): its padding, stride and groups, NHWC weights, fp32 parameters."""
    conv = ConvolutionDescriptor(shape.pads, shape.strides, (shape.dilation,) * 2, shape.groups)
    plan = FusionPlan(TensorDescriptor.from_tensor(x))
    return add_chain(plan, chain, conv=conv, k=shape.k, r=shape.r, s=shape.s, w_layout="NHWC", param_dtype="float")


def random_args(plan: FusionPlan, device: torch.device | str = "cpu", **kw) -> OperatorArgs:
    args = OperatorArgs()
    for op in plan.ops:
        args.set(op, random_record(op, device, **kw))
    return args


@dataclass(frozen=True)
class Comparison:
    rel_norm: float  # ||out - ref|| / ||ref||
    max_abs: float
    max_rel: float
    rms_ratio: float  # rms(out - ref) / max|ref|, MIOpen's measure
    nonfinite: int  # NaN/Inf elements in the output (unwritten or overflowed)
    eps: float

    @property
    def rms_ok(self) -> bool:
        return self.nonfinite == 0 and self.rms_ratio < 80 * self.eps

    def __str__(self) -> str:
        return (
            f"max abs err {self.max_abs:.3e}, max rel err {self.max_rel:.3e}, rel norm {self.rel_norm:.3e}, "
            f"rms/max|ref| {self.rms_ratio:.3e} (limit {80 * self.eps:.3e}), non-finite {self.nonfinite}"
        )


def compare(out: torch.Tensor, ref: torch.Tensor, eps: float | None = None) -> Comparison:
    """Compare ``out`` with the float64 ``ref``; ``eps`` defaults to out's dtype's epsilon."""
    eps = EPS[out.dtype] if eps is None else eps
    o, r = out.detach().double().cpu(), ref.detach().double().cpu()
    nonfinite = int((~torch.isfinite(o)).sum())
    diff = (o - r).abs()
    ref_max = max(r.abs().max().item(), 1e-300)
    ref_norm = r.norm().item()
    return Comparison(
        rel_norm=(o - r).norm().item() / (ref_norm if ref_norm > 0 else 1.0),
        max_abs=diff.max().item(),
        max_rel=(diff / r.abs().clamp_min(1e-6 * ref_max)).max().item(),
        rms_ratio=diff.norm().item() / math.sqrt(max(r.numel(), 1)) / ref_max,
        nonfinite=nonfinite,
        eps=eps,
    )


def reference_output(
    plan: FusionPlan, x: torch.Tensor, args: OperatorArgs, prior: torch.Tensor | None = None
) -> torch.Tensor:
    """The float64 reference result of ``plan`` (on x's device)."""
    return run_reference(plan.ops, x, [args.get(op) for op in plan.ops], prior, torch.float64).output
