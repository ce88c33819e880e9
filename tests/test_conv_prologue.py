"""Operators before the convolution (batch-norm, bias, activation: NAC, BAC, AC, NACBNA) fused by
triton-conv into its input loads, through Triton's interpreter, against the float64 reference:
both layouts, fp32 and fp16, odd channels, stride, dilation, groups, padding (which the
convolution applies to the operators' output, so it stays zero), and the few-channel fold."""

import dataclasses

import pytest
import torch

import fusionplan as fp
from fusionplan.core.enums import ActivationMode, BatchNormMode
from fusionplan.tools.verify import add_chain, random_args

from .util import check_against_reference, make_input, poisoned

CASES = [
    # (chain, input shape, k, r, s, pads, strides, dilations, groups)
    ("NAC", (2, 17, 9, 7), 8, 3, 3, (1, 1), (1, 1), (1, 1), 1),
    ("NACBNA", (2, 16, 13, 11), 17, 3, 3, (1, 1), (2, 2), (1, 1), 1),
    ("BAC", (1, 24, 8, 8), 16, 3, 3, (2, 2), (1, 1), (2, 2), 2),
    ("AC", (2, 32, 6, 6), 16, 1, 1, (0, 0), (1, 1), (1, 1), 1),
    ("NAC", (2, 3, 12, 10), 8, 7, 7, (3, 3), (2, 2), (1, 1), 1),  # few channels: the fold's loop
]


@pytest.fixture(autouse=True)
def triton_only(monkeypatch):
    monkeypatch.setenv("FUSIONPLAN_BACKEND", "triton")


def _plan(x, chain, k, r, s, pads, strides, dilations, groups, activation=ActivationMode.ELU):
    plan = fp.FusionPlan(fp.TensorDescriptor.from_tensor(x))
    conv = fp.ConvolutionDescriptor(pads, strides, dilations, groups)
    return add_chain(plan, chain, conv=conv, k=k, r=r, s=s, activation=activation, param_dtype="float")


@pytest.mark.parametrize("case", CASES, ids=[f"{c[0]}-{c[1][1]}ch-{c[3]}x{c[4]}" for c in CASES])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_operators_before_the_convolution_run_in_its_loads(case, layout, dtype):
    chain, shape, *geometry = case
    x = make_input(shape, dtype, layout)
    plan = _plan(x, chain, *geometry)
    handle = fp.Handle("cpu", allow_tf32=False)
    assert plan.compile(handle) == "triton-conv"
    args = random_args(plan, param_dtype=torch.float32)
    y = poisoned(plan.output_desc, layout)
    check_against_reference(plan, handle, x, args, y)
    source = plan.kernel_source(handle)
    assert "the operators before the convolution, on the input tile as it is loaded" in source


def test_the_padding_stays_zero_where_the_operators_would_not_give_zero():
    """A shift of 5 through ReLU is 5 everywhere in the image, while the convolution's padding is
    0: a kernel applying the operators to the padding too would be off at every border pixel."""
    x = make_input((1, 4, 5, 5), torch.float32, "NHWC")
    plan = _plan(x, "BAC", 4, 3, 3, (1, 1), (1, 1), (1, 1), 1, ActivationMode.RELU)
    handle = fp.Handle("cpu", allow_tf32=False)
    plan.compile(handle)
    args = random_args(plan, param_dtype=torch.float32)
    args.set(plan.ops[0], fp.BiasArgs(bias=torch.full((1, 4, 1, 1), 5.0)))
    check_against_reference(plan, handle, x, args, poisoned(plan.output_desc, "NHWC"))


def test_beta_before_the_convolution_blends_the_prior_as_the_contract_says():
    """An operator before the convolution whose result is shaped like the output (stride 1, K = C)
    may blend in the prior output; the prologue reads none, so such a call runs unfused, right."""
    x = make_input((1, 8, 6, 6), torch.float32, "NCHW")
    plan = _plan(x, "NAC", 8, 3, 3, (1, 1), (1, 1), (1, 1), 1)
    handle = fp.Handle("cpu", allow_tf32=False)
    assert plan.compile(handle) == "triton-conv"
    args = random_args(plan, param_dtype=torch.float32)
    args.set(plan.ops[0], dataclasses.replace(args.get(plan.ops[0]), beta=0.5))
    prior = make_input((1, 8, 6, 6), torch.float32, "NCHW")
    check_against_reference(plan, handle, x, args, poisoned(plan.output_desc), prior=prior)


def test_a_per_activation_batch_norm_before_the_convolution_is_left_to_the_reference():
    x = make_input((1, 8, 6, 6), torch.float32, "NCHW")
    plan = fp.FusionPlan(fp.TensorDescriptor.from_tensor(x))
    add_chain(plan, "NAC", k=8, r=3, s=3, conv=fp.ConvolutionDescriptor((1, 1)), bn_mode=BatchNormMode.PER_ACTIVATION)
    verdicts = {v.solver: v for v in plan.explain(fp.Handle("cpu"))}
    assert "per-activation batch-norm before the convolution" in verdicts["triton-conv"].reason
    others = [v.reason for v in verdicts.values() if v.reason and "triton-conv applies them" in v.reason]
    assert others, "the other Triton convolution solvers name triton-conv as the one for such plans"


@pytest.mark.parametrize("tap_bits", [True, False])
@pytest.mark.parametrize("channels", [16, 17])  # whole channel blocks, and a masked last one
def test_both_reduction_loops_of_the_taps_apply_the_operators(tap_bits, channels, monkeypatch):
    from fusionplan.solvers.conv_kernel import TritonConvKernel

    monkeypatch.setattr(TritonConvKernel, "_tap_bits", lambda self: tap_bits)
    x = make_input((2, channels, 7, 9), torch.float16, "NHWC")
    plan = _plan(x, "NACB", 8, 3, 3, (1, 2), (1, 1), (2, 1), 1)
    handle = fp.Handle("cpu")
    plan.compile(handle)
    args = random_args(plan, param_dtype=torch.float32)
    check_against_reference(plan, handle, x, args, poisoned(plan.output_desc, "NHWC"))


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_a_densenet_layer_with_its_prologue_compiles_for_hopper(layout):
    """DenseNet's BN -> ReLU -> 1x1 conv (128 channels of 28x28, fp16, batch 32) on triton-conv,
    compiled for sm_90: tensor-core products, no spill (NHWC: 178 registers, 134 without the
    prologue)."""
    import re

    from .util import compile_sm90

    to_layout = ".to(memory_format=torch.channels_last)" if layout == "NHWC" else ""
    build = (
        f"x = torch.empty(32, 128, 28, 28, dtype=torch.float16){to_layout}\n"
        "plan = add_chain(fp.FusionPlan(fp.TensorDescriptor.from_tensor(x)), 'NAC', k=128, param_dtype='float')"
    )
    info = compile_sm90(build, "triton-conv")
    assert "on the input tile as it is loaded" in info["source"]
    assert info["HGMMA"] > 0 and "LOCAL:0" in info["resources"], info["resources"]
    if layout == "NHWC":  # (triton-conv's NCHW loads keep a stack frame with or without a prologue)
        assert int(re.search(r"STACK:(\d+)", info["resources"]).group(1)) == 0, info["resources"]
