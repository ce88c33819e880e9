"""Test helpers: random arguments, poisoned outputs, and the float64 oracle comparison."""

from __future__ import annotations

import torch

import fusionplan as fp
from fusionplan.reference import run_reference
from fusionplan.testing import ACTIV_PARAMS, EPS, TOLERANCE, compare, random_args, random_record  # noqa: F401

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def make_input(shape, dtype, layout: str = "NCHW", device="cpu", gen=None) -> torch.Tensor:
    x = torch.randn(shape, generator=gen, dtype=torch.float32).to(dtype)
    if layout == "NHWC":
        x = x.to(memory_format=torch.channels_last)
    return x.to(device)


def poisoned(desc: fp.TensorDescriptor, layout: str = "NCHW", device="cpu") -> torch.Tensor:
    fmt = torch.channels_last if layout == "NHWC" else torch.contiguous_format
    return torch.full(desc.dims, float("nan"), dtype=desc.dtype.torch_dtype, device=device).to(memory_format=fmt)


def check_against_reference(plan, handle, x, args, y, prior=None, tol=None):
    """Execute ``plan`` into poisoned-or-prior ``y``; compare with the float64 oracle."""
    records = [args.get(op) for op in plan.ops]
    y_prior = y.clone() if prior is None else prior
    needs_prior = any(r.beta != 0 for r in records)
    ref = run_reference(plan.ops, x, records, y_prior if needs_prior else None, torch.float64).output
    plan.execute(handle, x, y, args, prior=prior)
    assert not torch.isnan(y).any(), "some output elements were not written"
    result = compare(y, ref)
    assert result.rel_norm < (tol or TOLERANCE[x.dtype]), f"{plan.combination} {x.dtype}: {result}"
    assert result.rms_ok, f"MIOpen rms rule failed for {plan.combination} {x.dtype}: {result}"
    return result.rel_norm
