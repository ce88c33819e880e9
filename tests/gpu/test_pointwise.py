"""triton-pointwise on the GPU: chains, tiles into other strides, priors, large tensors.

python -m pytest -m gpu tests/gpu -n 12
"""

from __future__ import annotations

import pytest
import torch

import fusionplan as fp
from fusionplan.core.enums import ActivationMode, BatchNormMode
from fusionplan.tools.verify import add_chain, random_args

from ..util import (
    DT_NAME,
    plan_for,
    poisoned,
    seeded_alpha_beta_args,
)
from .common import PRECISIONS, check_in_slices, input_tensor, run_and_check

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


@pytest.mark.parametrize("chain", ["NA", "BA", "NAN", "AA", "ABNA"])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("precision", ["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("bn_mode", list(BatchNormMode))
@pytest.mark.parametrize("shape", [(8, 64, 28, 28), (4, 64, 14, 14), (8, 96, 7, 7)], ids=["28x28", "14x14", "7x7"])
def test_pointwise_chains(chain, layout, precision, bn_mode, shape):
    """Dense tensors: flat runs (NHWC, and NCHW planes below 28x28 or of whole vectors) or tiles."""
    dtype = PRECISIONS[precision][0]
    x = input_tensor(shape, dtype, layout)
    plan = add_chain(
        plan_for(x), chain, bn_mode=bn_mode, activation=ActivationMode.LEAKYRELU, param_dtype=DT_NAME[dtype]
    )
    run_and_check(plan, precision, x, layout)


@pytest.mark.parametrize("in_layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("plane", [7, 28])
def test_pointwise_tiles_into_other_strides(in_layout, plane):
    """Outputs in the other layout, or a strided view: the [pixels, channels] tiles."""
    x = input_tensor((4, 48, plane, plane), torch.float16, in_layout)
    plan = add_chain(
        plan_for(x), "NA", bn_mode=BatchNormMode.SPATIAL, activation=ActivationMode.RELU, param_dtype="half"
    )
    run_and_check(plan, "fp16", x, "NHWC" if in_layout == "NCHW" else "NCHW")
    view = torch.full((4, 48, plane + 3, plane + 1), float("nan"), dtype=torch.float16, device="cuda")
    run_and_check(plan, "fp16", x, "NCHW", y=view[:, :, 2 : plane + 2, 1:])


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("shape", [(4, 64, 28, 28), (4, 96, 7, 7)], ids=["28x28", "7x7"])
@pytest.mark.parametrize("prior_layout", ["same", "other"])
def test_pointwise_chains_blend_a_prior(layout, shape, prior_layout):
    """alpha and beta on every operator; the prior in the output's layout (flat runs) or in the
    other one (the tiles)."""
    x = input_tensor(shape, torch.float16, layout)
    plan = add_chain(
        plan_for(x), "NAB", bn_mode=BatchNormMode.SPATIAL, activation=ActivationMode.ELU, param_dtype="float"
    )
    args = seeded_alpha_beta_args(plan, shape[3] + len(layout) + len(prior_layout), "cuda", torch.float32)
    other = "NHWC" if layout == "NCHW" else "NCHW"
    prior = input_tensor(plan.output_desc.dims, torch.float16, layout if prior_layout == "same" else other)
    run_and_check(plan, "fp16", x, layout, args=args, prior=prior)


def test_pointwise_large_tensor(gigabytes):
    """A 1 GiB fp16 tensor (2^29 elements) through an NA chain."""
    x = input_tensor((64, 256, 128, 256), torch.float16, "NHWC")
    plan = add_chain(
        plan_for(x), "NA", bn_mode=BatchNormMode.SPATIAL, activation=ActivationMode.RELU, param_dtype="half"
    )
    run_and_check(plan, "fp16", x, "NHWC")


@pytest.mark.parametrize("in_layout, out_layout", [("NCHW", "NCHW"), ("NHWC", "NHWC"), ("NCHW", "NHWC")])
def test_pointwise_past_int32_offsets(in_layout, out_layout, gigabytes):
    """2^31 + 2^21 fp16 elements (4.3 GB a tensor): 64-bit offsets in the flat runs (NCHW planes in
    vectors, channels-last) and in the tiles (orders that differ); compared in slices of rows
    against the reference in fp32, every element written."""
    shape = (2, 64, 4096, 4100)
    x = input_tensor(shape, torch.float16, in_layout)
    plan = add_chain(
        plan_for(x), "NA", bn_mode=BatchNormMode.SPATIAL, activation=ActivationMode.RELU, param_dtype="float"
    )
    handle = fp.Handle("cuda")
    plan.compile(handle)
    args = random_args(plan, "cuda", param_dtype=torch.float32)
    y = poisoned(plan.output_desc, out_layout, "cuda")
    assert x.numel() > 2**31
    plan.execute(handle, x, y, args)
    check_in_slices(plan, x, y, args, [(slice(None), slice(None), slice(h, h + 1024)) for h in range(0, 4096, 1024)])
