"""Plans on the GPU against the float64 reference: the ResNet-50 layers at batch 8 x {fp32, TF32,
fp16, bf16} x {NCHW, NHWC} x eight chains, odd shapes, activations, alpha/beta with a prior,
every applicable solver forced, random plans.

    python -m pytest -m gpu tests/gpu -n 12
"""

from __future__ import annotations

import random

import pytest
import torch

import fusionplan as fp
from fusionplan.core.enums import ActivationMode, BatchNormMode
from fusionplan.tools.verify import EPS, add_chain, compare, random_args, reference_output

from ..util import (
    CONV_SHAPES,
    DT_NAME,
    plan_for,
    random_conv_plan,
    seeded_alpha_beta_args,
    shape_plan,
)
from .common import LAYERS, PRECISIONS, input_tensor, run_and_check

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


CHAINS = ["CBNA", "CBA", "CA", "CB", "CN", "CNA", "CANB", "CNAAB"]  # MIOpen's six and two unusual orders


@pytest.mark.parametrize("chain", CHAINS)
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("precision", list(PRECISIONS))
@pytest.mark.parametrize("layer", LAYERS, ids=[s.name for s in LAYERS])
def test_resnet50_layer(layer, precision, layout, chain):
    dtype = PRECISIONS[precision][0]
    x = input_tensor((8, layer.c, layer.h, layer.w), dtype, layout)
    plan = add_chain(
        plan_for(x),
        chain,
        conv=fp.ConvolutionDescriptor((layer.pad, layer.pad), (layer.stride, layer.stride), (1, 1), 1),
        k=layer.k,
        r=layer.r,
        s=layer.s,
        bn_mode=BatchNormMode.SPATIAL,
        activation=ActivationMode.RELU,
        param_dtype=DT_NAME[dtype],
    )
    run_and_check(plan, precision, x, layout)


@pytest.mark.parametrize("shape_key", list(CONV_SHAPES))
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("precision", list(PRECISIONS))
@pytest.mark.parametrize("bn_mode", list(BatchNormMode))
def test_odd_shapes(shape_key, layout, precision, bn_mode):
    plan, x = shape_plan(
        shape_key, "CBNA", PRECISIONS[precision][0], layout, bn_mode, ActivationMode.ELU, device="cuda"
    )
    run_and_check(plan, precision, x, "NHWC" if layout == "NCHW" else "NCHW")


@pytest.mark.parametrize("act", list(ActivationMode))
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_activations(act, precision):
    dtype = PRECISIONS[precision][0]
    x = input_tensor((4, 16, 15, 13), dtype, "NHWC")
    plan = add_chain(
        plan_for(x),
        "CBA",
        conv=fp.ConvolutionDescriptor((1, 1), (1, 1), (1, 1), 1),
        k=24,
        r=3,
        s=3,
        bn_mode=BatchNormMode.SPATIAL,
        activation=act,
        param_dtype=DT_NAME[dtype],
    )
    run_and_check(plan, precision, x, "NHWC")


@pytest.mark.parametrize("precision", list(PRECISIONS))
def test_alpha_beta_prior(precision):
    dtype = PRECISIONS[precision][0]
    x = input_tensor((4, 32, 14, 14), dtype, "NHWC")
    plan = add_chain(
        plan_for(x),
        "CBNAB",
        conv=fp.ConvolutionDescriptor((1, 1), (1, 1), (1, 1), 1),
        k=48,
        r=3,
        s=3,
        bn_mode=BatchNormMode.PER_ACTIVATION,
        activation=ActivationMode.TANH,
        param_dtype=DT_NAME[dtype],
    )
    args = seeded_alpha_beta_args(plan, 5, "cuda", torch.float32)
    y = torch.randn(plan.output_desc.dims, device="cuda").to(dtype)
    run_and_check(plan, precision, x, "NHWC", args=args, y=y)
    # priors of other dtypes and layouts, one after the other: each needs its own compiled kernel
    for prior_dtype, fmt in ((torch.float32, torch.contiguous_format), (torch.float16, torch.channels_last)):
        prior = torch.randn(plan.output_desc.dims, device="cuda").to(prior_dtype).to(memory_format=fmt)
        run_and_check(plan, precision, x, "NHWC", args=args, prior=prior)


#: Shapes beside CONV_SHAPES that select the other convolution solvers: (n, c, h, w, k, r, s, pad, stride, groups)
SOLVER_SHAPES = {
    "window-C128": (2, 128, 9, 10, 24, 3, 3, (1, 1), (1, 1), 1),
    "window-5x5": (1, 128, 12, 7, 16, 5, 5, (2, 2), (1, 1), 1),
    "gemm-1x1": (3, 64, 7, 9, 40, 1, 1, (0, 0), (1, 1), 1),
    "depthwise-x2": (2, 16, 13, 11, 32, 3, 3, (1, 1), (1, 1), 16),
    "depthwise-stride2": (2, 32, 14, 15, 32, 3, 3, (1, 1), (2, 2), 32),
    "depthwise-5x5": (1, 24, 9, 9, 24, 5, 5, (2, 2), (1, 1), 24),
}


def solver_plan(key, dtype, layout):
    n, c, h, w, k, r, s, pad, stride, groups = SOLVER_SHAPES[key]
    x = input_tensor((n, c, h, w), dtype, layout)
    plan = add_chain(
        plan_for(x),
        "CBNA",
        conv=fp.ConvolutionDescriptor(pad, stride, (1, 1), groups),
        k=k,
        r=r,
        s=s,
        bn_mode=BatchNormMode.SPATIAL,
        activation=ActivationMode.ELU,
        param_dtype=DT_NAME[dtype],
    )
    return plan, x


@pytest.mark.parametrize("key", list(CONV_SHAPES) + list(SOLVER_SHAPES))
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("precision", ["fp32", "tf32", "fp16", "bf16"])
def test_every_applicable_solver(key, layout, precision):
    """Each Triton solver that accepts a plan computes it, not only the one the registry picks first."""
    dtype = PRECISIONS[precision][0]
    if key in CONV_SHAPES:
        plan, x = shape_plan(key, "CBNA", dtype, layout, act=ActivationMode.ELU, device="cuda")
    else:
        plan, x = solver_plan(key, dtype, layout)
    handle = fp.Handle("cuda", allow_tf32=PRECISIONS[precision][1])  # the handle run_and_check compiles for
    applicable = [v.solver for v in plan.explain(handle) if v.applicable and v.family == "triton"]
    assert applicable, f"no Triton solver for {key}: {plan.explain(handle)}"
    for name in applicable:
        run_and_check(plan, precision, x, "NHWC" if layout == "NCHW" else "NCHW", solver=name)


@pytest.mark.parametrize("seed", range(24))
def test_random_plans(seed):
    torch.manual_seed(seed)
    rng = random.Random(7000 + seed)
    precision = rng.choice(list(PRECISIONS))
    drawn = random_conv_plan(
        rng,
        [PRECISIONS[precision][0]],
        "cuda",
        batch=(1, 4),
        channels=(1, 3, 4, 8, 16, 17),
        hw=(5, 40),
        filters=(1, 3, 5, 7),
        strides=(1, 3),
        max_pad=3,
        post_ops=5,
    )
    if drawn is None:
        return
    plan, x, out_layout = drawn
    run_and_check(plan, precision, x, out_layout)


def _check_rows(plan, x, y, args, rows):
    """Compare output rows ``rows`` (an H slice) with the reference computed on the matching input rows."""
    ref = reference_output(plan, x[:, :, rows], args)
    result = compare(y[:, :, rows], ref, EPS[y.dtype])
    assert result.nonfinite == 0 and result.rel_norm < 1e-2, str(result)


@pytest.mark.parametrize("chain, tap_bits", [("NA", False), ("C", False), ("C", True)])
def test_tensors_past_2_to_the_31_elements(chain, tap_bits, monkeypatch):
    """64-bit offsets: 2.3e9-element fp16 tensors (4.6 GB each); first and last rows verified; the
    convolution also on triton-conv with tuning.CONV_TAP_BITS (its per-pixel pointers past 2^31)."""
    from fusionplan.runtime import tuning

    monkeypatch.setattr(tuning, "CONV_TAP_BITS", tap_bits)
    if torch.cuda.get_device_properties(0).total_memory < 24 * 2**30:
        pytest.skip("needs 24 GiB of GPU memory")
    x = torch.empty((1, 4, 24000, 24000), device="cuda", dtype=torch.float16).normal_()
    plan = fp.FusionPlan(fp.TensorDescriptor.from_tensor(x))
    if chain == "C":
        plan.add_conv_forward(fp.ConvolutionDescriptor((0, 0)), fp.TensorDescriptor.packed("half", (4, 4, 1, 1)))
    else:
        plan.add_batchnorm_inference(BatchNormMode.SPATIAL, fp.TensorDescriptor.packed("float", (1, 4, 1, 1)))
        plan.add_activation_forward(ActivationMode.LEAKYRELU)
    handle = fp.Handle("cuda")
    plan.compile(handle, solver="triton-conv" if tap_bits else None)
    args = random_args(plan, "cuda", param_dtype=torch.float32)
    y = torch.full(plan.output_desc.dims, float("nan"), device="cuda", dtype=torch.float16)
    plan.execute(handle, x, y, args)
    torch.cuda.synchronize()
    _check_rows(plan, x, y, args, slice(0, 8))
    _check_rows(plan, x, y, args, slice(23992, 24000))
    assert not torch.isnan(y[:, :, ::997]).any()
    del x, y
    torch.cuda.empty_cache()


@pytest.mark.slow
def test_resnet50_fused_at_batch_32_matches_eager():
    """The whole network through fusionplan.torch (residual chains read a prior output: kernels
    compiled at their first call), fp16 channels-last, against eager."""
    import importlib.util
    from pathlib import Path

    import fusionplan.torch as fpt

    path = Path(__file__).resolve().parents[1] / "examples" / "resnet50.py"
    spec = importlib.util.spec_from_file_location("resnet50_example", path)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    torch.manual_seed(0)
    model = example.resnet50().eval()
    example.randomize_batchnorm(model)
    model = model.cuda().half().to(memory_format=torch.channels_last)
    x = torch.randn(32, 3, 224, 224, device="cuda").half().to(memory_format=torch.channels_last)
    with torch.no_grad():
        ref = model(x).double()
        out = fpt.fuse(model)(x).double()
    assert torch.isfinite(out).all()
    assert ((out - ref).norm() / ref.norm()).item() < 1e-2  # examples/resnet50.py: 9.4e-4 on the H100
    assert (out.argmax(1) == ref.argmax(1)).float().mean().item() > 0.9
