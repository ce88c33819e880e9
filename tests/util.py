"""Test helpers: random arguments, poisoned outputs, and the float64 oracle comparison."""

from __future__ import annotations

import math

import torch

import fusionplan as fp
from fusionplan.enums import ActivationMode, Layout
from fusionplan.ops import (
    ActivationArgs,
    ActivationForwardOp,
    BatchNormInferenceArgs,
    BatchNormInferenceOp,
    BiasArgs,
    BiasForwardOp,
    ConvArgs,
    ConvForwardOp,
)
from fusionplan.reference import run_reference

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
TOLERANCE = {torch.float32: 1e-5, torch.float16: 1e-2, torch.bfloat16: 1e-2, torch.float64: 1e-12}
EPS = {torch.float32: 2.0**-23, torch.float16: 2.0**-10, torch.bfloat16: 2.0**-7, torch.float64: 2.0**-52}

# Activation parameters that exercise each formula's alpha/beta/gamma.
ACTIV_PARAMS = {
    ActivationMode.PASTHRU: (1.0, 0.0, 1.0),
    ActivationMode.LOGISTIC: (1.0, 0.0, 1.0),
    ActivationMode.TANH: (0.7, 1.3, 1.0),
    ActivationMode.RELU: (1.0, 0.0, 1.0),
    ActivationMode.SOFTRELU: (1.0, 0.0, 1.0),
    ActivationMode.ABS: (1.0, 0.0, 1.0),
    ActivationMode.POWER: (0.5, 0.8, 2.0),
    ActivationMode.CLIPPEDRELU: (0.6, 0.0, 1.0),
    ActivationMode.LEAKYRELU: (0.1, 0.0, 1.0),
    ActivationMode.ELU: (0.9, 0.0, 1.0),
}


def make_input(shape, dtype, layout: str = "NCHW", device="cpu", gen=None) -> torch.Tensor:
    x = torch.randn(shape, generator=gen, dtype=torch.float32).to(dtype)
    if layout == "NHWC":
        x = x.to(memory_format=torch.channels_last)
    return x.to(device)


def poisoned(desc: fp.TensorDescriptor, layout: str = "NCHW", device="cpu") -> torch.Tensor:
    fmt = torch.channels_last if layout == "NHWC" else torch.contiguous_format
    return torch.full(desc.dims, float("nan"), dtype=desc.dtype.torch_dtype, device=device).to(memory_format=fmt)


def random_record(op, device="cpu", param_dtype=None, alpha=1.0, beta=0.0, gen=None):
    """A fresh random argument record for an inference operator."""
    dt = op.input_desc.dtype.torch_dtype
    pdt = param_dtype or dt

    def rnd(shape, dtype=pdt, scale=1.0, shift=0.0):
        return (torch.randn(shape, generator=gen) * scale + shift).to(dtype).to(device)

    if isinstance(op, ConvForwardOp):
        fan_in = math.prod(op.w_desc.dims[1:])
        w = rnd(op.w_desc.dims, dt, 1.0 / math.sqrt(fan_in))
        if op.w_desc.layout == Layout.NHWC:
            w = w.to(memory_format=torch.channels_last)
        return ConvArgs(weight=w, alpha=alpha, beta=beta)
    if isinstance(op, BiasForwardOp):
        return BiasArgs(bias=rnd(op.param_dims), alpha=alpha, beta=beta)
    if isinstance(op, BatchNormInferenceOp):
        var = (torch.rand(op.param_dims, generator=gen) + 0.5).to(pdt).to(device)
        return BatchNormInferenceArgs(scale=rnd(op.param_dims), bias=rnd(op.param_dims), mean=rnd(op.param_dims, scale=0.5),
                                      variance=var, epsilon=1e-5, alpha=alpha, beta=beta)
    if isinstance(op, ActivationForwardOp):
        a, b, g = ACTIV_PARAMS[op.mode]
        return ActivationArgs(activ_alpha=a, activ_beta=b, activ_gamma=g, alpha=alpha, beta=beta)
    raise TypeError(op)


def random_args(plan: fp.FusionPlan, device="cpu", **kw) -> fp.OperatorArgs:
    args = fp.OperatorArgs()
    for op in plan.ops:
        args.set(op, random_record(op, device, **kw))
    return args


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    out64, ref64 = out.double().cpu(), ref.double().cpu()
    denom = ref64.norm().item()
    return (out64 - ref64).norm().item() / (denom if denom > 0 else 1.0)


def rms_ok(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype) -> bool:
    """MIOpen's test rule: rms(a - b) / (sqrt(n) * max|ref|) < 80 * eps(T)."""
    out64, ref64 = out.double().cpu(), ref.double().cpu()
    scale = max(ref64.abs().max().item(), 1e-30)
    rms = (out64 - ref64).norm().item() / math.sqrt(ref64.numel())
    return rms / scale < 80 * EPS[dtype]


def check_against_reference(plan, handle, x, args, y, prior=None, tol=None):
    """Execute ``plan`` into poisoned-or-prior ``y``; compare with the float64 oracle."""
    records = [args.get(op) for op in plan.ops]
    y_prior = y.clone() if prior is None else prior
    needs_prior = any(r.beta != 0 for r in records)
    ref = run_reference(plan.ops, x, records, y_prior if needs_prior else None, torch.float64).output
    plan.execute(handle, x, y, args, prior=prior)
    assert not torch.isnan(y).any(), "some output elements were not written"
    dtype = x.dtype
    err = rel_err(y, ref)
    assert err < (tol or TOLERANCE[dtype]), f"relative error {err:.3e} for {plan.combination} {dtype}"
    assert rms_ok(y, ref, dtype), f"MIOpen rms rule failed for {plan.combination} {dtype}"
    return err
