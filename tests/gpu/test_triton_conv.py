"""triton-conv and triton-gemm-nchw on the GPU: tap bits, row slots, the NCHW GEMM layers.

python -m pytest -m gpu tests/gpu -n 12
"""

from __future__ import annotations

import pytest
import torch

import fusionplan as fp
from fusionplan.core.enums import ActivationMode, BatchNormMode
from fusionplan.tools.verify import add_chain, random_record

from ..util import (
    DT_NAME,
    TAP_SHAPES,
    plan_for,
    shape_plan,
)
from .common import LAYERS, PRECISIONS, input_tensor, run_and_check

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


@pytest.mark.parametrize("batch", [1, 8])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("precision", ["fp16", "tf32"])
@pytest.mark.parametrize("name", ["r50_01", "r50_02", "r50_06", "r50_16", "r50_22"])
def test_conv_tap_bits_on_resnet50_layers(name, precision, layout, batch, monkeypatch):
    """triton-conv with tuning.CONV_TAP_BITS on ResNet-50's layers (1x1, 3x3, strided 3x3, 14x14 and
    7x7 outputs; batch 1 splits the reduction), whole channel blocks as the layers have them."""
    from fusionplan.runtime import tuning

    monkeypatch.setattr(tuning, "CONV_TAP_BITS", True)
    layer = next(s for s in LAYERS if s.name == name)
    dtype = PRECISIONS[precision][0]
    x = input_tensor((batch, layer.c, layer.h, layer.w), dtype, layout)
    conv = fp.ConvolutionDescriptor((layer.pad, layer.pad), (layer.stride, layer.stride), (1, 1), 1)
    plan = add_chain(plan_for(x), "CBNA", conv=conv, k=layer.k, r=layer.r, s=layer.s, param_dtype=DT_NAME[dtype])
    run_and_check(plan, precision, x, layout, solver="triton-conv")


@pytest.mark.parametrize("shape_key", list(TAP_SHAPES))
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("precision", ["fp16", "tf32"])
def test_conv_tap_bits_on_odd_shapes(shape_key, layout, precision, monkeypatch):
    """triton-conv with tuning.CONV_TAP_BITS (a bit per filter tap, set once per pixel): padding,
    stride, dilation, groups, channels no block divides; 7x7 keeps the old reduction."""
    from fusionplan.runtime import tuning

    monkeypatch.setattr(tuning, "CONV_TAP_BITS", True)
    plan, x = shape_plan(
        shape_key,
        "CBNA",
        PRECISIONS[precision][0],
        layout,
        BatchNormMode.SPATIAL,
        ActivationMode.ELU,
        device="cuda",
        shapes=TAP_SHAPES,
    )
    run_and_check(plan, precision, x, layout, solver="triton-conv")


# planes of 3136, 784, 196, 49 pixels; stride 2 from 3136, 784, 196
NCHW_GEMM_LAYERS = [s for s in LAYERS if s.r == 1]


@pytest.mark.parametrize("out_layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("prior", [False, True])
@pytest.mark.parametrize("precision", ["fp16", "bf16", "tf32"])
@pytest.mark.parametrize("layer", NCHW_GEMM_LAYERS, ids=[s.name for s in NCHW_GEMM_LAYERS])
def test_nchw_gemm_layers(layer, precision, prior, out_layout):
    """triton-gemm-nchw on every 1x1 ResNet-50 layer with NCHW input (stride 1 and 2): output in
    planes (the contiguous store) or channels-last, with and without a prior output blended in."""
    dtype = PRECISIONS[precision][0]
    x = input_tensor((3, layer.c, layer.h, layer.w), dtype, "NCHW")
    conv = fp.ConvolutionDescriptor((0, 0), (layer.stride, layer.stride))
    plan = add_chain(
        plan_for(x), "CBNA", conv=conv, k=layer.k, r=1, s=1, activation=ActivationMode.ELU, param_dtype="float"
    )
    args = fp.OperatorArgs()
    for op in plan.ops:
        args.set(op, random_record(op, "cuda", param_dtype=torch.float32, beta=0.5 if prior else 0.0))
    prior_tensor = torch.randn(plan.output_desc.dims, device="cuda").to(dtype) if prior else None
    if prior_tensor is not None and out_layout == "NHWC":
        prior_tensor = prior_tensor.to(memory_format=torch.channels_last)
    run_and_check(plan, precision, x, out_layout, args=args, prior=prior_tensor, solver="triton-gemm-nchw")
