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


def random_conv_plan(
    rng,
    dtypes,
    device="cpu",
    batch=(1, 3),
    channels=(1, 3, 4, 6),
    hw=(5, 14),
    filters=(1, 3, 5),
    strides=(1, 2),
    max_pad=2,
    pre_ops=0,
    post_ops=4,
):
    """A randomly drawn convolution plan and its input: shapes, groups/depthwise, padding, stride,
    dilation, chain, dtype, layouts. Returns (plan, x, output layout), or None when the draw gives an
    empty output (which must be the only reason to refuse it)."""
    from fusionplan.enums import ActivationMode, BatchNormMode
    from fusionplan.testing import add_chain

    n, c = rng.randint(*batch), rng.choice(list(channels))
    h, w = rng.randint(*hw), rng.randint(*hw)
    groups = rng.choice([1, 1, c])
    k = groups * rng.randint(1, 5)
    conv = fp.ConvolutionDescriptor(
        (rng.randint(0, max_pad), rng.randint(0, max_pad)),
        (rng.randint(*strides), rng.randint(*strides)),
        (rng.randint(1, 2), rng.randint(1, 2)),
        groups,
    )
    dtype = rng.choice(list(dtypes))
    layout = rng.choice(["NCHW", "NHWC"])
    chain = "".join(rng.choice("BNA") for _ in range(rng.randint(0, pre_ops)))
    chain += "C" + "".join(rng.choice("BNA") for _ in range(rng.randint(0, post_ops)))
    x = make_input((n, c, h, w), dtype, layout, device)
    try:
        plan = add_chain(
            fp.FusionPlan(fp.TensorDescriptor.from_tensor(x)),
            chain,
            conv=conv,
            k=k,
            r=rng.choice(list(filters)),
            s=rng.choice(list(filters)),
            w_layout=rng.choice(["NCHW", "NHWC"]),
            bn_mode=rng.choice(list(BatchNormMode)),
            activation=rng.choice(list(ActivationMode)),
        )
    except fp.BadParmError as exc:
        assert "empty" in str(exc)
        return None
    return plan, x, rng.choice(["NCHW", "NHWC"])
