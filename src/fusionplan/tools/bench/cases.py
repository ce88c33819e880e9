"""Benchmark cases: a plan on one shape, and the ways to compute it that are timed against each other.

Variants of a case (each verified against the float64 reference before it is timed; a wrong
result is recorded as a failure and never timed):
- ``fused``: the plan compiled with the first applicable solver;
- ``solver:NAME``: the plan compiled with one solver forced, for every applicable solver;
- ``tuning:NAME=V[,NAME=V]``: the plan compiled and run with constants of fusionplan.runtime.tuning set
  (an experiment's switch or threshold, beside the defaults' ``fused`` in the same process);
- ``unfused``: the same operators one launch each (the reference implementation in the data's dtype);
- ``eager``: PyTorch eager, conv2d -> batch_norm -> activation as a framework user writes it;
- ``cudnn``: cuDNN's fused conv+bias+ReLU with batch-norm folded into the weights (ReLU chains);
- ``compile`` / ``compile-max``: torch.compile of the eager module (default / max-autotune).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

import fusionplan as fp
from fusionplan import solvers
from fusionplan.api import empty_like_layout
from fusionplan.core.enums import ActivationMode, DataType, Layout
from fusionplan.core.ops import ConvForwardOp
from fusionplan.runtime import tuning
from fusionplan.solvers import find
from fusionplan.solvers.reference_solver import ReferenceKernel
from fusionplan.tools.shapes import ConvShape
from fusionplan.tools.verify import (
    EPS,
    TF32_EPS,
    TOLERANCE,
    add_chain,
    compare,
    random_args,
    random_tensor,
    reference_output,
)

#: precision name -> (dtype, TF32 allowed)
PRECISIONS = {
    "fp32": (torch.float32, False),
    "tf32": (torch.float32, True),
    "fp16": (torch.float16, False),
    "bf16": (torch.bfloat16, False),
}
DT_NAME = {torch.float32: DataType.FLOAT, torch.float16: DataType.HALF, torch.bfloat16: DataType.BFLOAT16}


@dataclass(frozen=True)
class Case:
    layer: ConvShape
    batch: int
    precision: str
    layout: str  # NCHW or NHWC, for input and output
    mode: str  # operator letters in data order: CBNA, CBA, NA, ...
    activation: ActivationMode = ActivationMode.RELU

    @property
    def dtype(self) -> torch.dtype:
        return PRECISIONS[self.precision][0]

    @property
    def tf32(self) -> bool:
        return PRECISIONS[self.precision][1]

    @property
    def has_conv(self) -> bool:
        return "C" in self.mode

    @property
    def name(self) -> str:
        return f"{self.layer.name}-{self.mode}-{self.precision}-{self.layout}-n{self.batch}"

    def input_dims(self) -> tuple[int, int, int, int]:
        if self.has_conv:
            return (self.batch, self.layer.c, self.layer.h, self.layer.w)
        # pointwise chains run on the layer's output activation
        oh, ow = self.layer.out_hw()
        return (self.batch, self.layer.k, oh, ow)

    def flops(self) -> int:
        return self.layer.flops(self.batch) if self.has_conv else 0


def build_plan(case: Case) -> fp.FusionPlan:
    plan = fp.FusionPlan(fp.TensorDescriptor.packed(DT_NAME[case.dtype], case.input_dims(), Layout[case.layout]))
    layer = case.layer
    conv = fp.ConvolutionDescriptor(layer.pads, layer.strides, (layer.dilation,) * 2, layer.groups)
    try:
        return add_chain(
            plan,
            case.mode,
            conv=conv,
            k=layer.k,
            r=layer.r,
            s=layer.s,
            w_layout=Layout[case.layout],
            activation=case.activation,
            param_dtype=DataType.FLOAT,
        )
    except ValueError as exc:
        raise fp.BadParmError(f"mode {case.mode!r}: {exc}") from None


class EagerChain(nn.Module):
    """The plan's operators as a PyTorch user writes them (bias folded into conv2d when it follows)."""

    def __init__(self, plan: fp.FusionPlan, args: fp.OperatorArgs) -> None:
        super().__init__()
        self.steps: list[tuple[str, dict]] = []
        ops = plan.ops
        i = 0
        while i < len(ops):
            op, rec = ops[i], args.get(ops[i])
            if isinstance(op, ConvForwardOp):
                bias = None
                if i + 1 < len(ops) and isinstance(ops[i + 1], fp.core.ops.BiasForwardOp):
                    bias = args.get(ops[i + 1]).bias.flatten().to(rec.weight.dtype)
                    i += 1
                c = op.conv
                self.steps.append(
                    (
                        "conv",
                        dict(
                            weight=rec.weight,
                            bias=bias,
                            stride=c.strides,
                            padding=c.pads,
                            dilation=c.dilations,
                            groups=c.groups,
                        ),
                    )
                )
            elif isinstance(op, fp.core.ops.BiasForwardOp):
                self.steps.append(("bias", dict(bias=rec.bias.to(op.input_desc.dtype.torch_dtype))))
            elif isinstance(op, fp.core.ops.BatchNormInferenceOp):
                self.steps.append(
                    (
                        "bn",
                        dict(
                            mean=rec.mean.flatten(),
                            var=rec.variance.flatten(),
                            weight=rec.scale.flatten(),
                            bias=rec.bias.flatten(),
                            eps=rec.epsilon,
                        ),
                    )
                )
            elif isinstance(op, fp.core.ops.BatchNormStatisticsOp):
                self.steps.append(("stats", dict(record=rec)))
            else:
                self.steps.append(("act", dict(mode=op.mode, alpha=rec.alpha_argument())))
            i += 1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for kind, p in self.steps:
            if kind == "conv":
                x = F.conv2d(x, p["weight"], p["bias"], p["stride"], p["padding"], p["dilation"], p["groups"])
            elif kind == "bias":
                x = x + p["bias"]
            elif kind == "bn":
                x = F.batch_norm(x, p["mean"], p["var"], p["weight"], p["bias"], False, 0.0, p["eps"])
            elif kind == "stats":  # what a training batch-norm computes besides its output (discarded)
                _batch_statistics(x, p["record"])
            else:
                x = _torch_activation(p["mode"], x, p["alpha"])
        return x


def _batch_statistics(x: torch.Tensor, rec: fp.BatchNormStatisticsArgs) -> None:
    """The statistics into the record's tensors as eager PyTorch takes them: a training batch-norm
    (the running statistics updated in place), its mean and inverse deviation saved."""
    var, mean = torch.var_mean(x.float(), dim=(0, 2, 3), unbiased=False)
    if rec.saved_mean is not None:
        rec.saved_mean.copy_(mean.view_as(rec.saved_mean))
    if rec.saved_inv_variance is not None:
        rec.saved_inv_variance.copy_(torch.rsqrt(var + rec.epsilon).view_as(rec.saved_inv_variance))
    if rec.running_mean is not None and rec.running_variance is not None:
        count = x.numel() // x.shape[1]
        f = rec.exp_avg_factor
        rec.running_mean.mul_(1 - f).add_(mean.view_as(rec.running_mean), alpha=f)
        unbiased = var * (count / max(count - 1, 1))
        rec.running_variance.mul_(1 - f).add_(unbiased.view_as(rec.running_variance), alpha=f)


def _torch_activation(mode: ActivationMode, x: torch.Tensor, alpha: float | torch.Tensor) -> torch.Tensor:
    """``alpha``: activAlpha, or PReLU's slopes (1, C, 1, 1)."""
    if mode == ActivationMode.PRELU:
        return F.prelu(x, alpha.flatten().to(x.dtype))
    if mode == ActivationMode.RELU:
        return torch.relu(x)
    if mode == ActivationMode.LEAKYRELU:
        return F.leaky_relu(x, alpha)
    if mode == ActivationMode.CLIPPEDRELU:
        return F.hardtanh(x, 0.0, alpha)
    if mode == ActivationMode.LOGISTIC:
        return torch.sigmoid(x)
    if mode == ActivationMode.ELU:
        return F.elu(x, alpha)
    if mode in _TORCH_EXTENSIONS:
        return _TORCH_EXTENSIONS[mode](x)
    raise fp.UnsupportedOpError(f"no eager baseline for activation {mode.name}")


#: fusionplan's extension activations as PyTorch users write them
_TORCH_EXTENSIONS = {
    ActivationMode.SILU: F.silu,
    ActivationMode.HARDSWISH: F.hardswish,
    ActivationMode.HARDSIGMOID: F.hardsigmoid,
    ActivationMode.GELU: F.gelu,
    ActivationMode.GELU_TANH: lambda x: F.gelu(x, approximate="tanh"),
    ActivationMode.MISH: F.mish,
}


def cudnn_fused(plan: fp.FusionPlan, args: fp.OperatorArgs) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """cuDNN's conv+bias+ReLU with the plan's bias and batch-norm folded into weights and bias,
    for plans of the form C [B] [N] [B] A(ReLU); None for any other plan."""
    ops = plan.ops
    if not ops or not isinstance(ops[0], ConvForwardOp) or not isinstance(ops[-1], fp.core.ops.ActivationForwardOp):
        return None
    if ops[-1].mode != ActivationMode.RELU or not all(
        isinstance(op, (fp.core.ops.BiasForwardOp, fp.core.ops.BatchNormInferenceOp)) for op in ops[1:-1]
    ):
        return None
    conv = ops[0]
    w = args.get(conv).weight.float()
    scale = torch.ones(w.shape[0], device=w.device)
    shift = torch.zeros(w.shape[0], device=w.device)
    for op in ops[1:-1]:
        rec = args.get(op)
        if isinstance(op, fp.core.ops.BiasForwardOp):
            shift = shift + rec.bias.float().flatten()
        else:
            inv = torch.rsqrt(rec.variance.float().flatten() + rec.epsilon)
            s = rec.scale.float().flatten() * inv
            scale, shift = scale * s, shift * s + rec.bias.float().flatten() - rec.mean.float().flatten() * s
    dtype = args.get(conv).weight.dtype
    fmt = torch.channels_last if args.get(conv).weight.is_contiguous(memory_format=torch.channels_last) else None
    w_folded = (w * scale.view(-1, 1, 1, 1)).to(dtype)
    if fmt is not None:
        w_folded = w_folded.to(memory_format=fmt)
    b_folded = shift.to(dtype)
    c = conv.conv
    return lambda x: torch.cudnn_convolution_relu(x, w_folded, b_folded, c.strides, c.pads, c.dilations, c.groups)


@dataclass
class Variant:
    name: str
    run: Callable[[int], object]  # run(i): compute on input set i (the output of the last run is read back)
    output: Callable[[int], torch.Tensor]  # output(i): what run(i) produced
    solver: str = ""  # for the plan's variants: the solver that compiled it


@dataclass
class PreparedCase:
    case: Case
    plan: fp.FusionPlan
    args: fp.OperatorArgs
    xs: list[torch.Tensor]
    ys: list[torch.Tensor]
    reference: torch.Tensor  # float64 result of input set 0
    variants: list[Variant] = field(default_factory=list)

    @property
    def bytes_moved(self) -> int:
        """Fewest bytes a kernel must move: input, output and weights once each."""
        x, y = self.xs[0], self.ys[0]
        weights = sum(t.numel() * t.element_size() for op in self.plan.ops for t in self.args.get(op).tensors())
        return x.numel() * x.element_size() + y.numel() * y.element_size() + weights


def prepare(case: Case, device: torch.device, rotation_bytes: int, gen: torch.Generator | None = None) -> PreparedCase:
    """Inputs (rotated copies), arguments and the float64 reference of one case."""
    plan = build_plan(case)
    layout = Layout[case.layout]
    x0 = random_tensor(plan.input_desc.dims, case.dtype, device, layout, gen=gen)
    out_bytes = math.prod(plan.output_desc.dims) * x0.element_size()
    copies = max(1, min(16, math.ceil(rotation_bytes / max(1, x0.numel() * x0.element_size() + out_bytes))))
    xs = [x0] + [random_tensor(plan.input_desc.dims, case.dtype, device, layout, gen=gen) for _ in range(copies - 1)]
    ys = [empty_like_layout(plan.output_desc, device, layout) for _ in xs]
    args = random_args(plan, device, param_dtype=torch.float32, gen=gen)
    reference = reference_output(plan, x0, args)
    return PreparedCase(case, plan, args, xs, ys, reference)


def tolerance(case: Case) -> tuple[float, float]:
    """(relative-norm tolerance, epsilon of MIOpen's rms rule) of the case's precision."""
    if case.tf32:
        return 1e-3, TF32_EPS
    return TOLERANCE[case.dtype], EPS[case.dtype]


def failed_variant(name: str, error: Exception) -> Variant:
    """A variant that could not be built: running it raises ``error``, which the runner records as
    that variant's failure."""

    def run(i: int) -> None:
        raise error

    return Variant(name, run, run)


#: A baseline of this prefix and an override label (tuning.override_label) is a ``tuning:`` variant.
TUNING_PREFIX = "tuning:"


def tuned_variant(name: str, plan: fp.FusionPlan, xs: list, ys: list, args: fp.OperatorArgs, handle) -> Variant:
    """The plan compiled on ``handle`` and run with the constants that ``name`` (TUNING_PREFIX and
    NAME=V,...) sets, each call under them (launches read some of them: an epilogue's switch)."""
    values = dict(tuning.parse_override(part) for part in name[len(TUNING_PREFIX) :].split(","))
    n = len(xs)
    try:
        with tuning.overridden(values):
            plan.compile(handle)
    except fp.InternalError as exc:
        return failed_variant(name, exc)

    def run(i: int) -> None:
        with tuning.overridden(values):
            plan.execute(handle, xs[i % n], ys[i % n], args)

    return Variant(name, run, lambda i: ys[i % n], plan.compiled_solver(handle))


def make_variants(prep: PreparedCase, device: torch.device, baselines: list[str]) -> list[Variant]:
    case, plan, args = prep.case, prep.plan, prep.args
    xs, ys = prep.xs, prep.ys
    n = len(xs)
    variants: list[Variant] = []

    def plan_variant(name: str, handle: fp.Handle) -> Variant:
        return Variant(
            name,
            lambda i: plan.execute(handle, xs[i % n], ys[i % n], args),
            lambda i: ys[i % n],
            plan.compiled_solver(handle),
        )

    def module_variant(name: str, module: Callable[[torch.Tensor], torch.Tensor]) -> Variant:
        results: dict[int, torch.Tensor] = {}

        def run(i: int) -> None:
            results[i % n] = module(xs[i % n])

        return Variant(name, run, lambda i: results[i % n])

    handle = fp.Handle(device, allow_tf32=case.tf32)
    plan.compile(handle)
    variants.append(plan_variant("fused", handle))
    if "find" in baselines:  # the solver that find measured fastest (its times go to the perf database)
        found = fp.Handle(device, allow_tf32=case.tf32, find_mode="NORMAL")
        plan.compile(found)
        variants.append(plan_variant("find", found))
    for verdict in plan.explain(handle):
        if verdict.applicable and find.runs_natively(verdict.family, device):
            forced = fp.Handle(device, allow_tf32=case.tf32)
            try:
                plan.compile(forced, solver=verdict.solver)
            except fp.InternalError as exc:  # its kernel does not build here: that column fails, not the case
                variants.append(failed_variant(f"solver:{verdict.solver}", exc))
                continue
            variants.append(plan_variant(f"solver:{verdict.solver}", forced))
    for baseline in baselines:
        if baseline.startswith(TUNING_PREFIX):
            variants.append(tuned_variant(baseline, plan, xs, ys, args, fp.Handle(device, allow_tf32=case.tf32)))
    if "unfused" in baselines:
        spec = plan.spec()
        kernel = ReferenceKernel(spec, case.dtype if device.type == "cuda" else None)
        records = [args.get(op) for op in plan.ops]
        variants.append(
            Variant("unfused", lambda i: kernel.run(xs[i % n], ys[i % n], records, None), lambda i: ys[i % n])
        )
    eager = EagerChain(plan, args)
    if "eager" in baselines:
        variants.append(module_variant("eager", eager))
    if "cudnn" in baselines and device.type == "cuda":
        fused = cudnn_fused(plan, args)
        if fused is not None:
            variants.append(module_variant("cudnn", fused))
    if "compile" in baselines:
        variants.append(module_variant("compile", torch.compile(eager)))
    if "compile-max" in baselines:
        variants.append(module_variant("compile-max", torch.compile(eager, mode="max-autotune")))
    return variants


def verify(prep: PreparedCase, variant: Variant) -> str | None:
    """None when the variant computes the reference (input set 0), else why not."""
    tol, eps = tolerance(prep.case)
    ys0 = prep.ys[0]
    ys0.fill_(float("nan"))
    variant.run(0)
    result = compare(variant.output(0), prep.reference, eps)
    if result.rel_norm < tol and result.rms_ok:
        return None
    return f"wrong result: {result}"


def solver_names() -> list[str]:
    return [s.name for s in solvers.REGISTRY]
