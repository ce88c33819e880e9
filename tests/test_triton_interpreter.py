"""The Triton solvers' real kernels, run through Triton's interpreter on CPU tensors.

FUSIONPLAN_BACKEND=triton: nothing may fall back silently. bf16 is tested on the GPU only
(the interpreter's bf16 dot products are not exact).
"""

import dataclasses
import random

import pytest
import torch

import fusionplan as fp
from fusionplan.core.enums import ActivationMode, BatchNormMode
from fusionplan.runtime import tuning
from fusionplan.solvers.window_toolkit import reads_one_view
from fusionplan.tools.verify import add_chain

from .util import (
    CONV_SHAPES,
    DT_NAME,
    TAP_SHAPES,
    check_against_reference,
    make_input,
    plan_for,
    poisoned,
    random_args,
    random_conv_plan,
    random_record,
    seeded_alpha_beta_args,
    shape_plan,
)

pytest.importorskip("triton")
from fusionplan.runtime.codegen import interpreter_active  # noqa: E402

pytestmark = pytest.mark.skipif(not interpreter_active(), reason="Triton's interpreter is off (a GPU is present)")

DTYPES = [torch.float32, torch.float16]


@pytest.fixture(autouse=True)
def interpreter(monkeypatch, tmp_path_factory):
    monkeypatch.setenv("FUSIONPLAN_BACKEND", "triton")
    monkeypatch.setenv("FUSIONPLAN_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "fusionplan-cache"))


def compile_triton(plan):
    handle = fp.Handle("cpu")
    name = plan.compile(handle)
    assert name.startswith("triton-"), name
    return handle


def compile_named(plan, solver):
    """Compile with one solver (it may defer to others by default, for speed, but must accept)."""
    handle = fp.Handle("cpu")
    assert plan.compile(handle, solver=solver) == solver
    return handle


def conv_case(
    shape_key,
    chain,
    dtype,
    layout,
    out_layout=None,
    bn_mode=BatchNormMode.SPATIAL,
    act=ActivationMode.RELU,
    w_layout="NCHW",
):
    plan, x = shape_plan(shape_key, chain, dtype, layout, bn_mode, act, w_layout)
    handle = compile_triton(plan)  # the default choice compiles ...
    assert plan.compile(handle, solver="triton-conv") == "triton-conv"  # ... and the implicit GEMM is tested
    check_against_reference(plan, handle, x, random_args(plan), poisoned(plan.output_desc, out_layout or layout))
    return plan, handle


@pytest.mark.parametrize("shape_key", list(CONV_SHAPES))
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "fp16"])
def test_conv_shapes(shape_key, layout, dtype):
    conv_case(shape_key, "CBNA", dtype, layout)


@pytest.mark.parametrize("shape_key", list(TAP_SHAPES))
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "fp16"])
def test_conv_tap_bits(shape_key, layout, dtype, monkeypatch):
    """tuning.CONV_TAP_BITS: each pixel's taps inside the image as bits, set once, and one offset
    per tap, on padding, stride, dilation, groups, rectangular filters and channels no block
    divides; a 7x7 filter (49 taps) keeps the old reduction."""
    monkeypatch.setattr(fp.runtime.tuning, "CONV_TAP_BITS", True)
    plan, x = shape_plan(shape_key, "CBNA", dtype, layout, shapes=TAP_SHAPES)
    handle = compile_named(plan, "triton-conv")
    assert plan._entry(handle).kernel._tap_bits() == (shape_key != "7x7")
    check_against_reference(plan, handle, x, random_args(plan), poisoned(plan.output_desc, layout))


#: ResNet-50 layers at batch 1 as (N, C, H, W, K, R, S, pad, stride, dilation, groups)
_RULE_LAYERS = {
    "r50_02": (1, 64, 56, 56, 64, 3, 3, (1, 1), (1, 1), (1, 1), 1),
    "r50_12": (1, 256, 56, 56, 256, 3, 3, (1, 1), (2, 2), (1, 1), 1),
    "r50_09": (1, 512, 28, 28, 128, 1, 1, (0, 0), (1, 1), (1, 1), 1),
}


@pytest.mark.parametrize(
    "layer, dtype, layout, expected",
    [
        ("r50_02", torch.float16, "NHWC", True),  # 16-bit channels-last, several taps
        ("r50_02", torch.float32, "NHWC", False),  # a 56x56 plane of fp32
        ("r50_02", torch.float16, "NCHW", False),  # a 56x56 plane in NCHW
        ("r50_12", torch.float32, "NCHW", True),  # a 28x28 output plane, any layout and precision
        ("r50_09", torch.float16, "NHWC", False),  # a 1x1 filter
    ],
)
def test_conv_tap_bits_rule(layer, dtype, layout, expected, monkeypatch):
    """By default (tuning.CONV_TAP_BITS = -1) triton-conv takes tap bits where the bench's A/B
    columns found them faster (tuning.conv_tap_bits_pay); 0 and 1 force them off and on."""
    plan, _ = shape_plan(layer, "CBA", dtype, layout, shapes=_RULE_LAYERS)
    handle = compile_named(plan, "triton-conv")
    kernel = plan._entry(handle).kernel
    assert kernel._tap_bits() == expected
    for forced in (0, 1):
        monkeypatch.setattr(fp.runtime.tuning, "CONV_TAP_BITS", forced)
        assert kernel._tap_bits() == bool(forced)


@pytest.mark.parametrize("chain", ["CBNA", "CBA", "CA", "CB", "CN", "CNA", "C", "CAN", "CNANB", "CAAB"])
@pytest.mark.parametrize("bn_mode", list(BatchNormMode))
def test_conv_chains(chain, bn_mode):
    conv_case("stride2", chain, torch.float32, "NHWC", bn_mode=bn_mode)


@pytest.mark.parametrize("act", list(ActivationMode))
def test_every_activation_in_the_epilogue(act):
    conv_case("stem-C3", "CBA", torch.float32, "NCHW", act=act)


def test_layout_change_and_weight_layout():
    conv_case("grouped", "CBNA", torch.float16, "NCHW", out_layout="NHWC", w_layout="NHWC")
    conv_case("1x1", "CNA", torch.float32, "NHWC", out_layout="NCHW")


def test_strided_input_view():
    big = torch.randn(2, 6, 20, 20)
    x = big[:, 1:5, 3:16, 2:13]  # not packed in any layout
    plan = fp.FusionPlan(fp.TensorDescriptor.from_tensor(x))
    plan.add_conv_forward(fp.ConvolutionDescriptor((1, 1), (1, 2)), fp.TensorDescriptor.packed("float", (7, 4, 3, 3)))
    plan.add_activation_forward(ActivationMode.LEAKYRELU)
    handle = compile_triton(plan)
    check_against_reference(plan, handle, x, random_args(plan), poisoned(plan.output_desc))


@pytest.mark.parametrize("chain", ["CBNA", "CAB"])
def test_alpha_beta_and_prior(chain):
    x = make_input((2, 4, 6, 5), torch.float32, "NHWC")
    plan = add_chain(
        plan_for(x),
        chain,
        conv=fp.ConvolutionDescriptor((1, 1), (1, 1), (1, 1), 1),
        k=4,
        r=3,
        s=3,
        bn_mode=BatchNormMode.PER_ACTIVATION,
        activation=ActivationMode.TANH,
        param_dtype="float",
    )
    handle = compile_triton(plan)
    args = seeded_alpha_beta_args(plan, 3)
    check_against_reference(plan, handle, x, args, torch.randn(plan.output_desc.dims))
    check_against_reference(plan, handle, x, args, poisoned(plan.output_desc), prior=torch.randn(plan.output_desc.dims))


def test_conv_in_place_output_is_safe():
    x = torch.randn(1, 4, 8, 8)
    plan = fp.FusionPlan(fp.TensorDescriptor.from_tensor(x))
    plan.add_conv_forward(fp.ConvolutionDescriptor((1, 1)), fp.TensorDescriptor.packed("float", (4, 4, 3, 3)))
    handle = compile_triton(plan)
    args = random_args(plan)
    from fusionplan.tools.verify import reference_output

    ref = reference_output(plan, x, args)
    plan.execute(handle, x, x, args)
    torch.testing.assert_close(x.double(), ref, rtol=1e-5, atol=1e-5)


def test_argument_changes_reach_the_kernel():
    x = make_input((1, 4, 6, 6), torch.float32)
    plan = add_chain(
        plan_for(x),
        "CBNA",
        conv=fp.ConvolutionDescriptor((1, 1), (1, 1), (1, 1), 1),
        k=5,
        r=3,
        s=3,
        bn_mode=BatchNormMode.SPATIAL,
        activation=ActivationMode.RELU,
        param_dtype="float",
    )
    handle = compile_triton(plan)
    args = random_args(plan)
    check_against_reference(plan, handle, x, args, poisoned(plan.output_desc))
    args.get(plan.ops[0]).weight.mul_(-2)  # in place: version counter
    args.get(plan.ops[2]).mean.add_(1)
    check_against_reference(plan, handle, x, args, poisoned(plan.output_desc))
    args.set(plan.ops[1], random_record(plan.ops[1]))  # a new record
    check_against_reference(plan, handle, x, args, poisoned(plan.output_desc))


def test_kernel_source_is_generated_from_the_chain():
    x = make_input((1, 3, 6, 6), torch.float32)
    plan = add_chain(
        plan_for(x),
        "CBNAN",
        conv=fp.ConvolutionDescriptor((1, 1), (1, 1), (1, 1), 1),
        k=4,
        r=3,
        s=3,
        bn_mode=BatchNormMode.PER_ACTIVATION,
        activation=ActivationMode.ELU,
        param_dtype="float",
    )
    handle = compile_named(plan, "triton-conv")
    src = plan.kernel_source(handle)
    assert "def conv_kernel" in src and "activation ELU" in src and "operators [1, 2] folded" in src
    assert "operators [4] folded" in src


@pytest.mark.parametrize("chain", ["NA", "BA", "NAN", "AA", "B", "ABNA"])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("bn_mode", list(BatchNormMode))
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "fp16"])
def test_pointwise_chains(chain, layout, bn_mode, dtype):
    x = make_input((2, 5, 7, 3), dtype, layout)
    plan = add_chain(
        plan_for(x), chain, bn_mode=bn_mode, activation=ActivationMode.SOFTRELU, param_dtype=DT_NAME[dtype]
    )
    handle = compile_triton(plan)
    assert plan.compiled_solver(handle) == "triton-pointwise"
    check_against_reference(plan, handle, x, random_args(plan), poisoned(plan.output_desc, layout))


@pytest.mark.parametrize("tile", [(64, 8), (16, 4)], ids=["plane-64x8", "16x4"])
def test_pointwise_nchw_tiles_past_the_plane(tile, monkeypatch):
    """NCHW tiles with more pixel slots than a 7x7 plane holds (64: one pixel tile, 15 slots past
    the plane; 8 channels, the second tile half past C=12) or fewer (16: four pixel tiles, the last
    with one pixel). The flat runs made to step aside for the tiles."""
    monkeypatch.setattr(tuning, "POINTWISE_FLAT_NCHW_PLANES_BELOW", 0)
    monkeypatch.setattr(tuning, "POINTWISE_FLAT_PLANE_VECTORS", 0)
    x = make_input((2, 12, 7, 7), torch.float16, "NCHW")
    plan = add_chain(
        plan_for(x), "NA", bn_mode=BatchNormMode.SPATIAL, activation=ActivationMode.RELU, param_dtype="float"
    )
    handle = compile_triton(plan)
    kernel = plan._entry(handle).kernel
    kernel.config = dataclasses.replace(kernel.config, block_p=tile[0], block_c=tile[1])
    check_against_reference(plan, handle, x, random_args(plan), poisoned(plan.output_desc, "NCHW"))


def flat_plan(shape, layout, chain, bn_mode, monkeypatch, dtype=torch.float16):
    """A pointwise plan with flat runs on, and the list that records each flat launch's order
    (True: channels last)."""
    x = make_input(shape, dtype, layout)
    plan = add_chain(plan_for(x), chain, bn_mode=bn_mode, activation=ActivationMode.ELU, param_dtype="float")
    handle = compile_triton(plan)
    kernel = plan._entry(handle).kernel
    launches = []
    launch = kernel._flat_launch
    monkeypatch.setattr(kernel, "_flat_launch", lambda *a: launches.append(a[-1]) or launch(*a))
    return plan, handle, x, launches


@pytest.mark.parametrize("chain", ["NA", "NAN", "ABNA"])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("bn_mode", list(BatchNormMode))
def test_pointwise_flat_runs(chain, layout, bn_mode, monkeypatch):
    """Flat runs over dense tensors: 210 elements are four runs of 64, the last with 18; the
    channel of each element from its index in either order, per-element batch norm from both."""
    plan, handle, x, launches = flat_plan((2, 5, 7, 3), layout, chain, bn_mode, monkeypatch)
    check_against_reference(plan, handle, x, random_args(plan), poisoned(plan.output_desc, layout))
    assert launches == [layout == "NHWC"]


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_pointwise_flat_runs_blend_a_prior(layout, monkeypatch):
    plan, handle, x, launches = flat_plan((2, 6, 5, 4), layout, "NAB", BatchNormMode.SPATIAL, monkeypatch)
    args = seeded_alpha_beta_args(plan, 3)
    prior = make_input(plan.output_desc.dims, torch.float16, layout)
    check_against_reference(plan, handle, x, args, poisoned(plan.output_desc, layout), prior=prior)
    assert launches == [layout == "NHWC"]


@pytest.mark.parametrize("shape", [(3, 1, 5, 6), (4, 7, 1, 1)], ids=["one-channel", "one-pixel"])
def test_pointwise_flat_runs_where_both_orders_are_dense(shape, monkeypatch):
    """One channel or one pixel: a tensor is dense in both orders, and the NCHW formula serves."""
    plan, handle, x, launches = flat_plan(shape, "NHWC", "NA", BatchNormMode.SPATIAL, monkeypatch)
    check_against_reference(plan, handle, x, random_args(plan), poisoned(plan.output_desc, "NHWC"))
    assert launches == [False]


@pytest.mark.parametrize("chain", ["NA", "NAN"])
@pytest.mark.parametrize("bn_mode", list(BatchNormMode))
@pytest.mark.parametrize(
    "dtype, shape, least",
    [(torch.float16, (3, 5, 4, 6), 16), (torch.float32, (2, 7, 2, 6), 16), (torch.float16, (2, 5, 2, 6), 8)],
    ids=["fp16", "fp32", "fp16-8-bytes"],
)
def test_pointwise_flat_runs_in_plane_vectors(chain, bn_mode, dtype, shape, least, monkeypatch):
    """NCHW planes of whole vectors (24 fp16 pixels: three of 8; 12 fp32: three of 4; 12 fp16 in
    8-byte vectors: three of 4), each vector's parameters loaded once: 360, 168 and 120 elements,
    runs of 64 with a tail."""
    monkeypatch.setattr(tuning, "POINTWISE_FLAT_PLANE_VECTORS", least)
    monkeypatch.setattr(tuning, "POINTWISE_FLAT_NCHW_PLANES_BELOW", 8)
    plan, handle, x, launches = flat_plan(shape, "NCHW", chain, bn_mode, monkeypatch, dtype)
    check_against_reference(plan, handle, x, random_args(plan), poisoned(plan.output_desc, "NCHW"))
    assert launches == [False]
    assert tuning.pointwise_plane_vector(False, shape[2] * shape[3], x.element_size()) > 1


def test_pointwise_tiles_on_large_nchw_planes(monkeypatch):
    """NCHW planes of POINTWISE_FLAT_NCHW_PLANES_BELOW pixels or more, not of whole 16-byte
    vectors: the tiles, dense or not."""
    monkeypatch.setattr(tuning, "POINTWISE_FLAT_NCHW_PLANES_BELOW", 30)
    plan, handle, x, launches = flat_plan((2, 3, 6, 5), "NCHW", "NA", BatchNormMode.SPATIAL, monkeypatch)
    check_against_reference(plan, handle, x, random_args(plan), poisoned(plan.output_desc, "NCHW"))
    assert launches == []


def test_pointwise_tiles_where_orders_differ(monkeypatch):
    """An NCHW input into an NHWC output, or into a strided view: the [pixels, channels] tiles."""
    plan, handle, x, launches = flat_plan((2, 5, 7, 3), "NCHW", "NA", BatchNormMode.SPATIAL, monkeypatch)
    check_against_reference(plan, handle, x, random_args(plan), poisoned(plan.output_desc, "NHWC"))
    view = torch.full((2, 5, 9, 4), float("nan"), dtype=torch.float16)[:, :, 1:8, :3]
    check_against_reference(plan, handle, x, random_args(plan), view)
    assert launches == []


def test_pointwise_in_place_and_strided():
    x = torch.randn(2, 3, 5, 6)
    plan = add_chain(
        plan_for(x), "NA", bn_mode=BatchNormMode.SPATIAL, activation=ActivationMode.CLIPPEDRELU, param_dtype="float"
    )
    handle = compile_triton(plan)
    args = random_args(plan)
    from fusionplan.tools.verify import reference_output

    ref = reference_output(plan, x, args)
    plan.execute(handle, x, x, args)
    torch.testing.assert_close(x.double(), ref, rtol=1e-5, atol=1e-6)
    big = torch.randn(2, 3, 9, 9)
    view = big[:, :, 2:7, 1:7]
    check_against_reference(plan, handle, torch.randn(2, 3, 5, 6), args, view.fill_(float("nan")))


@pytest.mark.parametrize("seed", range(16))
def test_random_plans(seed):
    torch.manual_seed(seed)
    drawn = random_conv_plan(random.Random(1000 + seed), DTYPES, batch=(1, 2), channels=(1, 3, 4, 6, 8))
    if drawn is None:
        return
    plan, x, out_layout = drawn
    handle = compile_triton(plan)
    check_against_reference(plan, handle, x, random_args(plan), poisoned(plan.output_desc, out_layout))


def test_backend_triton_refuses_what_it_cannot_fuse():
    plan = fp.FusionPlan(fp.TensorDescriptor.packed("double", (2, 3, 5, 5)))
    plan.add_batchnorm_forward(BatchNormMode.SPATIAL)
    with pytest.raises(fp.UnsupportedOpError, match="triton-batchnorm .*DOUBLE data is not supported"):
        plan.compile(fp.Handle("cpu"))
    plan = fp.FusionPlan(fp.TensorDescriptor.packed("double", (1, 3, 4, 4)))
    plan.add_activation_forward(ActivationMode.RELU)
    with pytest.raises(fp.UnsupportedOpError, match="DOUBLE"):
        plan.compile(fp.Handle("cpu"))


# ---- 1x1 convolutions as GEMMs read through tensor descriptors -------------------------------------------
def gemm_plan(n, c, h, w, k, dtype, chain="CBNA", layout="NHWC", **kw):
    x = make_input((n, c, h, w), dtype, layout)
    kw.setdefault("param_dtype", DT_NAME[dtype])
    return add_chain(plan_for(x), chain, k=k, r=1, s=1, **kw), x


@pytest.mark.parametrize("dims", [(1, 8, 5, 7, 8), (2, 24, 6, 5, 40), (3, 32, 4, 4, 16)], ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "fp16"])
@pytest.mark.parametrize("out_layout", ["NHWC", "NCHW"])
def test_gemm_solver(dims, dtype, out_layout):
    """Tails in every dimension: 35 pixels, C=24 against 16-wide K steps, K=40 against 32-wide tiles."""
    plan, x = gemm_plan(*dims, dtype)
    handle = compile_named(plan, "triton-gemm")
    check_against_reference(plan, handle, x, random_args(plan), poisoned(plan.output_desc, out_layout))


@pytest.mark.parametrize("solver, layout", [("triton-gemm", "NHWC"), ("triton-gemm-nchw", "NCHW")])
@pytest.mark.parametrize("chain", ["C", "CNA", "CBNAB", "CANB"])
@pytest.mark.parametrize("bn_mode", list(BatchNormMode))
def test_gemm_chains_with_alpha_beta(solver, layout, chain, bn_mode):
    """Every epilogue stage, per-channel and per-element batch norm, blends with a prior output."""
    kw = dict(bn_mode=bn_mode, activation=ActivationMode.ELU)
    plan, x = gemm_plan(2, 16, 3, 5, 24, torch.float32, chain, layout, **kw)
    handle = compile_named(plan, solver)
    args = seeded_alpha_beta_args(plan, len(chain))
    check_against_reference(plan, handle, x, args, torch.randn(plan.output_desc.dims))


def test_gemm_misaligned_input_takes_the_implicit_gemm():
    plan, x = gemm_plan(2, 8, 4, 3, 8, torch.float32)
    handle = compile_triton(plan)
    shifted = torch.empty(x.numel() + 1)[1:].view(2, 4, 3, 8).permute(0, 3, 1, 2)  # 4 bytes into its storage
    shifted.copy_(x)
    assert shifted.data_ptr() % 16 and shifted.stride() == x.stride()
    check_against_reference(plan, handle, shifted, random_args(plan), poisoned(plan.output_desc, "NHWC"))


@pytest.mark.parametrize(
    "case, reason",
    [
        (dict(n=1, c=8, h=5, w=5, k=8, r=3), "1x1"),
        (dict(n=1, c=8, h=5, w=5, k=8, layout="NCHW"), "channels-last"),
        (dict(n=1, c=3, h=5, w=5, k=8, dtype=torch.float16), "16-byte rows"),
    ],
)
def test_gemm_solver_says_why_not(case, reason):
    dtype = case.get("dtype", torch.float32)
    x = make_input((case["n"], case["c"], case["h"], case["w"]), dtype, case.get("layout", "NHWC"))
    r = case.get("r", 1)
    plan = add_chain(plan_for(x), "CA", k=case["k"], r=r, s=r, conv=fp.ConvolutionDescriptor((r // 2, r // 2)))
    verdict = next(v for v in plan.explain(fp.Handle("cpu")) if v.solver == "triton-gemm")
    assert reason in verdict.reason
    handle = compile_triton(plan)
    assert plan.compiled_solver(handle) in ("triton-window", "triton-stem", "triton-conv")  # a later solver takes it


# ---- triton-conv over whole output rows (NCHW input) -------------------------------------------------


# ---- 1x1 convolutions on NCHW planes -------------------------------------------------------------------
def nchw_gemm_plan(n, c, h, w, k, dtype, chain="CBNA", **kw):
    return gemm_plan(n, c, h, w, k, dtype, chain, "NCHW", **kw)


NCHW_GEMM_CASES = {  # (n, c, h, w, k); the interpreter's tiles are 32 pixels x 32 channels x 16 deep
    "C3-K17-13x11": (2, 3, 13, 11, 17),  # 143 pixels: 5 tiles per image, the last of 15; C < a step
    "C40-7x7": (1, 40, 7, 7, 24),  # 49 pixels: 2 tiles; C=40 against 16-deep steps
    "small-planes": (3, 16, 4, 6, 40),  # 24 pixels: one partial tile per image; K=40 two tiles
    "boxes-8x10": (2, 24, 8, 10, 40),  # 80-pixel planes (whole 16-byte units): tensor boxes, 3 per image
}


@pytest.mark.parametrize("case", list(NCHW_GEMM_CASES))
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "fp16"])
@pytest.mark.parametrize("out_layout", ["NCHW", "NHWC"])
def test_nchw_gemm_solver(case, dtype, out_layout):
    """Tiles of one image's pixels (tails in every image), channel and reduction tails, two
    persistent programs walking the tiles; output in planes (the contiguous store) or channels-last."""
    plan, x = nchw_gemm_plan(*NCHW_GEMM_CASES[case], dtype)
    handle = compile_named(plan, "triton-gemm-nchw")
    check_against_reference(plan, handle, x, random_args(plan), poisoned(plan.output_desc, out_layout))


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "fp16"])
def test_nchw_gemm_reads_boxes_where_planes_allow(dtype):
    """80-pixel planes through tensor boxes of the input and weights (the persistent loop flattened)
    and of the output planes; 13x11 planes (143 pixels, not whole 16-byte units) by pointer, as are
    weights of K=36 output channels in fp16 (72-byte rows) and channels-last output."""
    fp16 = dtype == torch.float16
    cases = (
        ((2, 24, 8, 10, 40), "NCHW", True, True),
        ((2, 24, 8, 10, 40), "NHWC", True, None),  # pointer stores in the output's strides
        ((2, 8, 13, 11, 8), "NCHW", False, False),
        ((2, 16, 4, 8, 36), "NCHW", not fp16, True),
    )
    for dims, out_layout, boxes, stores in cases:
        plan, x = nchw_gemm_plan(*dims, dtype)
        handle = compile_named(plan, "triton-gemm-nchw")
        kernel = plan._entry(handle).kernel
        y = poisoned(plan.output_desc, out_layout)
        assert (kernel._input_tiles(x, kernel.config) is not None) == boxes
        if stores is not None:
            assert (kernel._output_tiles(y, kernel.config) is not None) == stores
        check_against_reference(plan, handle, x, random_args(plan), y)


STRIDED_NCHW_GEMM_CASES = {  # (n, c, h, w, k): stride 2, no padding; input read as boxes in (fp32, fp16)
    # rows of 7 in 8 slots, 4 rows to a 32-slot tile (the last half empty); 14-pixel row pairs: 112
    # bytes of fp32, boxes; 56 of fp16, pointers
    "14x14": ((2, 24, 14, 14, 40), (True, False)),
    "odd-13x11": ((2, 3, 13, 11, 17), (False, False)),  # 7x6 outputs: the last input column is an odd one
    "wide-9x20": ((1, 16, 9, 20, 8), (False, False)),  # rows of 10 in 16 slots, 2 to a tile; 5 rows
    # 16-pixel rows: 8 slots, boxes of 2 rows of 16 columns (an even row's, then the odd row's)
    "boxes-16x16": ((2, 24, 16, 16, 40), (True, True)),
    # rows of 10 in 16 slots: a box row's last 12 columns are the odd row's first (dropped); K=8
    "boxes-12x20": ((1, 16, 12, 20, 8), (True, True)),
}


def strided_nchw_gemm(case: str, dtype):
    """A stride-2 1x1 CBNA plan on a case's NCHW input compiled for triton-gemm-nchw: the plan, its
    handle, its kernel and the input."""
    (n, c, h, w, k), _ = STRIDED_NCHW_GEMM_CASES[case]
    x = make_input((n, c, h, w), dtype, "NCHW")
    conv = fp.ConvolutionDescriptor((0, 0), (2, 2))
    plan = add_chain(plan_for(x), "CBNA", conv=conv, k=k, r=1, s=1, param_dtype=DT_NAME[dtype])
    handle = compile_named(plan, "triton-gemm-nchw")
    return plan, handle, plan._entry(handle).kernel, x


@pytest.mark.parametrize("case", list(STRIDED_NCHW_GEMM_CASES))
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "fp16"])
@pytest.mark.parametrize("out_layout", ["NCHW", "NHWC"])
def test_strided_nchw_gemm(case, dtype, out_layout):
    """Stride 2: tiles of whole output rows of slots, each row reading its input row's contiguous
    columns and keeping the even ones, by pointer or (an even number of rows, row pairs of whole
    16-byte units) through boxes of the input's row pairs; output in planes or channels-last."""
    plan, handle, kernel, x = strided_nchw_gemm(case, dtype)
    boxes = STRIDED_NCHW_GEMM_CASES[case][1]
    expect_boxes = boxes[dtype == torch.float16]
    assert (kernel._input_tiles(x, kernel.config) is not None) == expect_boxes and "SLOTS" in kernel.source()
    check_against_reference(plan, handle, x, random_args(plan), poisoned(plan.output_desc, out_layout))


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "fp16"])
def test_strided_nchw_gemm_even_columns_by_pointer(dtype):
    """The even columns kept before the product by pointer, where a plan read through boxes gets an
    input that is not 16-byte aligned (no descriptor: the pointer path keeps the boxes' tiles)."""
    plan, handle, kernel, x = strided_nchw_gemm("boxes-16x16", dtype)
    # the same values one element into a buffer: 2 or 4 bytes past a 16-byte boundary
    x = torch.empty(x.numel() + 1, dtype=dtype)[1:].view(x.shape).copy_(x)
    assert kernel._input_tiles(x, kernel.config) is None and even_first_of(kernel)
    check_against_reference(plan, handle, x, random_args(plan), poisoned(plan.output_desc))


def even_first_of(kernel) -> bool:
    from fusionplan.solvers.triton_gemm_nchw import even_first

    return even_first(kernel.spec)


def test_nchw_gemm_reruns_with_new_tensors():
    plan, x = nchw_gemm_plan(2, 8, 5, 5, 8, torch.float32)
    handle = compile_named(plan, "triton-gemm-nchw")
    for _ in range(2):
        x = make_input(tuple(x.shape), torch.float32, "NCHW")
        check_against_reference(plan, handle, x, random_args(plan), poisoned(plan.output_desc))


@pytest.mark.parametrize(
    "case, reason",
    [
        (dict(r=3), "1x1"),
        (dict(stride=3), "stride 1 or 2"),
        (dict(stride=2, r=3), "1x1"),
        (dict(stride=2, width=300), "at most 128"),  # 150-pixel output rows: 256 slots, 512 columns
        (dict(groups=2), "grouped"),
        (dict(layout="NHWC"), "packed NCHW planes"),
        (dict(sliced=True), "packed NCHW planes"),
    ],
)
def test_nchw_gemm_solver_says_why_not(case, reason):
    x = make_input((2, 8, 6, case.get("width", 6)), torch.float32, case.get("layout", "NCHW"))
    if case.get("sliced"):
        x = x[:, :, :, :5]  # rows of 6 holding 5 pixels: not packed planes
    r, stride = case.get("r", 1), case.get("stride", 1)
    conv = fp.ConvolutionDescriptor((r // 2, r // 2), (stride, stride), groups=case.get("groups", 1))
    plan = add_chain(plan_for(x), "CA", k=8, r=r, s=r, conv=conv)
    verdict = next(v for v in plan.explain(fp.Handle("cpu")) if v.solver == "triton-gemm-nchw")
    assert verdict.reason is not None and reason in verdict.reason, verdict


def nchw_gemm_verdict(dims, dtype):
    *dims, stride = dims if len(dims) == 6 else (*dims, 1)
    plan, _ = nchw_gemm_plan(*dims, dtype, conv=fp.ConvolutionDescriptor((0, 0), (stride, stride)))
    verdicts = plan.explain(fp.Handle("cpu"))
    chosen = next(v.solver for v in verdicts if v.applicable and not v.deferred)
    return next(v for v in verdicts if v.solver == "triton-gemm-nchw"), chosen


@pytest.mark.parametrize(
    "dims, dtype, deferred",
    [
        ((32, 256, 14, 14, 1024), torch.float16, None),  # r50_13: taken
        ((32, 512, 28, 28, 128), torch.float16, None),  # r50_09
        ((32, 1024, 14, 14, 256), torch.float16, None),  # r50_15
        ((32, 256, 14, 14, 1024), torch.float32, "32-bit"),  # TF32 or fp32: triton-conv
        ((32, 512, 7, 7, 2048), torch.float16, "7x7 planes"),  # r50_19: element loads and stores
        ((32, 2048, 7, 7, 512), torch.float16, "7x7 planes"),  # r50_21
        ((32, 64, 56, 56, 64), torch.float16, None),  # r50_01: 64-channel tiles read by tensor boxes
        ((32, 256, 56, 56, 64), torch.float16, None),  # r50_04
        ((32, 256, 14, 14, 64), torch.float16, "K=64"),  # 64-channel tiles of 392-byte planes: by pointer
        ((1, 256, 14, 14, 1024), torch.float16, "small grid"),  # batch 1: 32 tiles of 64 x 128
        ((32, 512, 28, 28, 1024, 2), torch.float16, None),  # r50_14: row pairs through boxes
        ((32, 256, 56, 56, 512, 2), torch.float16, None),  # r50_08: 56-pixel input rows
        ((32, 1024, 14, 14, 2048, 2), torch.float16, "stride 2 on input rows of fewer than 56"),  # r50_20
    ],
    ids=[
        "r50_13",
        "r50_09",
        "r50_15",
        "fp32",
        "r50_19",
        "r50_21",
        "r50_01",
        "r50_04",
        "narrow-14x14",
        "batch1",
        "r50_14",
        "r50_08",
        "r50_20",
    ],
)
def test_nchw_gemm_takes_the_layers_it_was_measured_faster_on(dims, dtype, deferred):
    """16-bit 1x1 layers on NCHW planes at batch 32 are triton-gemm-nchw's; 32-bit data, 7x7 planes,
    64 output channels read by pointer and small grids defer to triton-conv, saying why."""
    verdict, chosen = nchw_gemm_verdict(dims, dtype)
    assert verdict.applicable
    if deferred is None:
        assert verdict.deferred is None and chosen == "triton-gemm-nchw", verdict
    else:
        assert deferred in verdict.deferred and chosen == "triton-conv", (verdict, chosen)


@pytest.mark.parametrize(
    "dims, tile",
    [
        ((32, 256, 56, 56, 512), (256, 256, True)),  # r50_08: boxes, even columns first, 256 channels
        ((32, 512, 28, 28, 1024), (256, 256, True)),  # r50_14
        ((32, 1024, 14, 14, 2048), (128, 128, False)),  # r50_20: 28-byte input rows, by pointer
        ((32, 64, 56, 56, 128), (256, 128, True)),  # K=128: 128-channel tiles
    ],
    ids=["r50_08", "r50_14", "r50_20", "K128"],
)
def test_strided_nchw_gemm_tiles(dims, tile):
    """Strided plans read through boxes keep the even columns first and take 256-channel tiles from
    K=512 (each channel tile reads its input rows whole from L2); pointer reads keep 128 x 128."""
    from fusionplan.solvers.triton_gemm_nchw import even_first, nchw_config

    plan, _ = nchw_gemm_plan(*dims, torch.float16, conv=fp.ConvolutionDescriptor((0, 0), (2, 2)))
    spec = plan.spec()
    cfg = nchw_config(spec, interpret=False)
    assert (cfg.block_m, cfg.block_n, even_first(spec)) == tile, cfg
    assert cfg.num_warps == 8


def test_nchw_gemm_deferring_plans_compile_elsewhere():
    plan, _ = nchw_gemm_plan(2, 8, 5, 5, 8, torch.float32)
    handle = compile_triton(plan)
    assert plan.compiled_solver(handle) != "triton-gemm-nchw"


@pytest.mark.parametrize(
    "hw, images, k, tile",
    [
        (49, 32, 512, (64, 128, 4)),  # a 7x7 plane: 64 pixels, one warpgroup
        (196, 32, 1024, (256, 128, 8)),  # r50_13: 256 tiles of a whole 14x14 plane
        (196, 32, 256, (128, 128, 4)),  # r50_15: 64 tiles of 256 pixels would leave half the GPU idle
        (3136, 32, 64, (256, 64, 8)),  # r50_01: K=64
        (196, 1, 1024, (64, 128, 4)),  # batch 1: down to 64 pixels
        (9, 32, 512, (32, 128, 4)),  # a 3x3 plane: 32 pixels at least
    ],
)
def test_nchw_gemm_tiles_hold_one_images_pixels(hw, images, k, tile):
    from fusionplan.runtime import tuning

    cfg = tuning.nchw_gemm_heuristic(hw, images, k, 256, torch.float16, False)
    assert (cfg.block_m, cfg.block_n, cfg.num_warps) == tile, cfg
    fp32 = tuning.nchw_gemm_heuristic(hw, images, k, 256, torch.float32, False)
    assert fp32.block_m <= max(32, 1 << (hw - 1).bit_length()) and fp32.block_n <= 128


@pytest.mark.parametrize(
    "name, dtype, min_c, tile",
    [
        ("r50_17", torch.float16, 512, (128, 256, 8)),  # C=1024 into K=512, 14x14: the same 128 tiles
        ("r50_11", torch.bfloat16, 512, (128, 256, 8)),  # C=512 into K=256, 28x28
        ("r50_11", torch.float16, 1024, (256, 128, 8)),
        ("r50_17", torch.float16, 0, (256, 128, 8)),  # 0: never
        ("r50_13", torch.float16, 512, (256, 128, 8)),  # C=256: a short reduction
        ("r50_09", torch.float16, 512, (256, 128, 8)),  # K=128: half a 256-channel tile idle
        ("r50_14", torch.float16, 512, (256, 256, 8)),  # strided: its own wide tile of whole input rows
        ("r50_17", torch.float32, 512, None),  # 32-bit data: at most 128 channels
    ],
)
def test_nchw_gemm_long_reductions_take_wide_channel_tiles(name, dtype, min_c, tile, monkeypatch):
    """128 x 256 in place of 256 x 128 for stride-1 plans of tuning.NCHW_GEMM_WIDE_N_MIN_C input
    channels or more into 256 output channels or more; other plans keep their tiles."""
    from fusionplan.runtime import tuning
    from fusionplan.solvers.triton_gemm_nchw import nchw_config
    from fusionplan.tools.shapes import resnet50_layer
    from fusionplan.tools.verify import layer_plan

    monkeypatch.setattr(tuning, "NCHW_GEMM_WIDE_N_MIN_C", min_c)
    s = resnet50_layer(name)
    plan = layer_plan(s, torch.empty(32, s.c, s.h, s.w, dtype=dtype), "CBNA")
    cfg = nchw_config(plan.spec(), False)
    if tile is None:
        assert cfg.block_n <= 128, cfg
    else:
        assert (cfg.block_m, cfg.block_n, cfg.num_warps) == tile, cfg


# ---- stride-1 convolutions over windows read as input boxes --------------------------------------------
WINDOW_CASES = {  # name: (n, c, h, w, k, r, s, pads, dilations); the window solver takes C >= 128
    "3x3-edges": (2, 128, 13, 11, 8, 3, 3, (1, 1), (1, 1)),
    "channel-tail": (1, 136, 8, 9, 40, 3, 3, (1, 1), (1, 1)),  # C=136 against 16-wide K steps
    "5x5-no-pad": (1, 128, 12, 12, 16, 5, 5, (0, 0), (1, 1)),
    "dilation2": (1, 128, 10, 10, 8, 3, 3, (2, 2), (2, 2)),
    "1x5-asymmetric": (1, 144, 8, 10, 8, 1, 5, (0, 2), (1, 1)),
    "small-images": (9, 128, 2, 5, 8, 3, 3, (1, 1), (1, 1)),  # windows span several images
}


@pytest.mark.parametrize("case", list(WINDOW_CASES))
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "fp16"])
@pytest.mark.parametrize("out_layout", ["NHWC", "NCHW"])
def test_window_solver(case, dtype, out_layout):
    n, c, h, w, k, r, s, pads, dils = WINDOW_CASES[case]
    x = make_input((n, c, h, w), dtype, "NHWC")
    conv = fp.ConvolutionDescriptor(pads, (1, 1), dils)
    plan = add_chain(plan_for(x), "CBNA", conv=conv, k=k, r=r, s=s, param_dtype=DT_NAME[dtype])
    handle = compile_named(plan, "triton-window")  # on the GPU small grids go to triton-conv
    check_against_reference(plan, handle, x, random_args(plan), poisoned(plan.output_desc, out_layout))


STRIDED_WINDOW_CASES = {  # name: (n, c, h, w, k, r, s, pads, strides); even sizes: one view of all classes
    "3x3-stride2": (1, 128, 17, 16, 8, 3, 3, (1, 1), (2, 2)),
    "3x3-stride2-even": (2, 128, 16, 14, 8, 3, 3, (1, 1), (2, 2)),
    "3x3-stride2-even-channel-tail": (1, 136, 16, 16, 8, 3, 3, (1, 1), (2, 2)),  # C=136: a view per class
    "3x3-stride3-even-no-pad": (1, 144, 27, 24, 8, 3, 3, (0, 0), (3, 3)),
    "5x5-stride-2x1-even": (1, 128, 16, 9, 8, 5, 5, (2, 2), (2, 1)),
    "1x1-stride2": (2, 128, 16, 18, 24, 1, 1, (0, 0), (2, 2)),
    "3x3-stride3": (1, 128, 25, 24, 8, 3, 3, (1, 1), (3, 3)),
    "5x5-stride-2x1": (1, 136, 17, 9, 8, 5, 5, (2, 2), (2, 1)),
}


#: sides multiples of the stride, C of the interpreter's 16-channel steps: one view of all classes
ONE_VIEW_CASES = {"1x1-stride2", "3x3-stride2-even", "3x3-stride3-even-no-pad", "5x5-stride-2x1-even"}


@pytest.mark.parametrize("case", list(STRIDED_WINDOW_CASES))
@pytest.mark.parametrize("out_layout", ["NHWC", "NCHW"])
def test_strided_window_solver(case, out_layout):
    n, c, h, w, k, r, s, pads, strides = STRIDED_WINDOW_CASES[case]
    x = make_input((n, c, h, w), torch.float16, "NHWC")
    plan = add_chain(
        plan_for(x), "CBNA", conv=fp.ConvolutionDescriptor(pads, strides), k=k, r=r, s=s, param_dtype="half"
    )
    handle = compile_named(plan, "triton-window")  # fp32 strided: after triton-conv
    kernel = plan._entry(handle).kernel
    assert reads_one_view(kernel.spec, kernel.config) == (case in ONE_VIEW_CASES)
    x32 = make_input((n, c, h, w), torch.float32, "NHWC")
    plan32 = add_chain(plan_for(x32), "CBNA", conv=fp.ConvolutionDescriptor(pads, strides), k=k, r=r, s=s)
    verdict = next(v for v in plan32.explain(fp.Handle("cpu")) if v.solver == "triton-window")
    assert verdict.applicable and "after others" in str(verdict)  # strided, or a small grid
    assert ("a view per stride class" in verdict.deferred) == (case not in ONE_VIEW_CASES)
    assert plan32.compile(fp.Handle("cpu")) == "triton-conv"
    check_against_reference(plan, handle, x, random_args(plan), poisoned(plan.output_desc, out_layout))


@pytest.mark.parametrize("case", ["3x3-stride2-even", "3x3-stride3-even-no-pad"])
def test_strided_window_solver_fp32_one_view(case):
    """fp32 windows (run when named: they defer to triton-conv) through the one view of every
    stride class: exact in the interpreter, so the fp32 tolerance holds."""
    n, c, h, w, k, r, s, pads, strides = STRIDED_WINDOW_CASES[case]
    x = make_input((n, c, h, w), torch.float32, "NHWC")
    plan = add_chain(plan_for(x), "CBNA", conv=fp.ConvolutionDescriptor(pads, strides), k=k, r=r, s=s)
    handle = compile_named(plan, "triton-window")
    assert reads_one_view(plan._entry(handle).kernel.spec, plan._entry(handle).kernel.config)
    check_against_reference(plan, handle, x, random_args(plan), poisoned(plan.output_desc, "NHWC"))


ALPHA_BETA_CASES = [("C", (2, 8, 9)), ("CBNAB", (2, 8, 9)), ("CANB", (2, 8, 9)), ("CBNAB", (9, 2, 5))]


@pytest.mark.parametrize("chain, dims", ALPHA_BETA_CASES)
def test_window_chains_with_alpha_beta_and_misaligned_input(chain, dims):
    """Priors blended by alpha/beta, windows of one image and (2x5 images) of several."""
    n, h, w = dims
    x = make_input((n, 128, h, w), torch.float32, "NHWC")
    conv = fp.ConvolutionDescriptor((1, 1))
    plan = add_chain(plan_for(x), chain, conv=conv, k=16, r=3, s=3, bn_mode=BatchNormMode.PER_ACTIVATION)
    handle = compile_named(plan, "triton-window")  # on the GPU small grids go to triton-conv
    args = seeded_alpha_beta_args(plan, len(chain))
    check_against_reference(plan, handle, x, args, torch.randn(plan.output_desc.dims))
    shifted = torch.empty(x.numel() + 1)[1:].view(n, h, w, 128).permute(0, 3, 1, 2)  # 4 bytes into its storage
    shifted.copy_(x)
    check_against_reference(plan, handle, shifted, args, torch.randn(plan.output_desc.dims))


@pytest.mark.parametrize("shape_key", ["stem-C3", "7x7-stride2-pad3", "depthwise", "dilation2", "asymmetric"])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_small_channel_counts_reduce_over_whole_filter_rows(shape_key, layout):
    plan, x = shape_plan(shape_key, "CBNA", torch.float32, layout)
    handle = compile_named(plan, "triton-conv")
    assert plan._entry(handle).kernel.fold_s
    check_against_reference(plan, handle, x, random_args(plan), poisoned(plan.output_desc, layout))


# ---- reductions split over several programs (grids that would leave the GPU idle) ---------------------------
SPLIT_CASES = {  # name: (solver, n, c, h, w, k, r, pads, strides)
    "conv-7x7-image": ("triton-conv", 1, 64, 7, 7, 24, 3, (1, 1), (1, 1)),
    "conv-strided": ("triton-conv", 1, 48, 9, 8, 16, 3, (1, 1), (2, 2)),
    "window-8x8": ("triton-window", 1, 128, 8, 8, 16, 3, (1, 1), (1, 1)),
    "window-strided": ("triton-window", 1, 128, 16, 16, 16, 3, (1, 1), (2, 2)),
}


@pytest.mark.parametrize("case", list(SPLIT_CASES))
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "fp16"])
def test_split_reduction(case, dtype):
    """Each part of a tile's reduction stores its partial; the last sums them and runs the chain.
    Run three times (the arrival counters must be back at zero), the last with a residual prior."""
    solver, n, c, h, w, k, r, pads, strides = SPLIT_CASES[case]
    x = make_input((n, c, h, w), dtype, "NHWC")
    plan = add_chain(
        plan_for(x), "CBNAB", conv=fp.ConvolutionDescriptor(pads, strides), k=k, r=r, s=r, param_dtype=DT_NAME[dtype]
    )
    handle = compile_named(plan, solver)
    assert plan._entry(handle).kernel.config.split_k > 1
    for beta in (0.0, 0.0, 0.7):
        args = fp.OperatorArgs()
        for op in plan.ops:
            args.set(op, random_record(op, beta=beta if op is plan.ops[-1] else 0.0, param_dtype=dtype))
        x = make_input((n, c, h, w), dtype, "NHWC")
        check_against_reference(plan, handle, x, args, torch.randn(plan.output_desc.dims).to(dtype))


# ---- few input channels read as stretches of input rows (the stem) ----------------------------------------
STEM_CASES = {  # name: (n, c, h, w, k, r, s, pads, strides, dilations)
    "resnet-stem": (1, 3, 16, 18, 8, 7, 7, (3, 3), (2, 2), (1, 1)),  # runs of 2 pixels
    "3x3-odd": (2, 3, 13, 11, 17, 3, 3, (1, 1), (1, 1), (1, 1)),
    "dilation2-C5": (1, 5, 12, 10, 7, 3, 3, (2, 2), (1, 1), (2, 2)),
    "1x5-stride-1x2": (2, 4, 9, 13, 5, 1, 5, (0, 2), (1, 2), (1, 1)),
    "5x3-stride3-C1": (1, 1, 14, 17, 9, 5, 3, (2, 0), (3, 3), (1, 1)),  # single channel, no column padding
    "C15-K40": (1, 15, 7, 9, 40, 3, 3, (1, 1), (1, 1), (1, 1)),  # the widest input; channel tiles of K
}


@pytest.mark.parametrize("case", list(STEM_CASES))
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "fp16"])
@pytest.mark.parametrize("layout, out_layout", [("NHWC", "NHWC"), ("NHWC", "NCHW"), ("NCHW", "NCHW"), ("NCHW", "NHWC")])
def test_stem_solver(case, dtype, layout, out_layout):
    """Channels-last rows (channels in the stretch) and channel planes (a step per channel)."""
    n, c, h, w, k, r, s, pads, strides, dils = STEM_CASES[case]
    x = make_input((n, c, h, w), dtype, layout)
    conv = fp.ConvolutionDescriptor(pads, strides, dils)
    plan = add_chain(plan_for(x), "CBNA", conv=conv, k=k, r=r, s=s, param_dtype=DT_NAME[dtype])
    handle = compile_triton(plan)
    assert plan.compiled_solver(handle) == "triton-stem"
    check_against_reference(plan, handle, x, random_args(plan), poisoned(plan.output_desc, out_layout))


@pytest.mark.parametrize("chain", ["C", "CBNAB", "CANB"])
def test_stem_chains_with_alpha_beta_and_misaligned_input(chain):
    """Priors blended by alpha/beta; an input 2 bytes into its storage (no aligned vector loads)."""
    n, c, h, w = 2, 3, 11, 12
    x = make_input((n, c, h, w), torch.float16, "NHWC")
    conv = fp.ConvolutionDescriptor((3, 3), (2, 2))
    plan = add_chain(plan_for(x), chain, conv=conv, k=16, r=7, s=7, param_dtype="half")
    handle = compile_triton(plan)
    assert plan.compiled_solver(handle) == "triton-stem"
    args = seeded_alpha_beta_args(plan, len(chain), param_dtype=torch.float16)
    check_against_reference(plan, handle, x, args, torch.randn(plan.output_desc.dims).half())
    shifted = torch.empty(x.numel() + 1, dtype=torch.float16)[1:].view(n, h, w, c).permute(0, 3, 1, 2)
    shifted.copy_(x)
    check_against_reference(plan, handle, shifted, args, torch.randn(plan.output_desc.dims).half())


@pytest.mark.parametrize(
    "case, reason",
    [
        (dict(c=16), "C=16 > 15"),
        (dict(w_stride=2), "rows must be contiguous"),
        (dict(groups=3, k=6), "grouped"),
        (dict(r=1, s=45, w=48), "longer than 128"),
    ],
)
def test_stem_solver_says_why_not(case, reason):
    c, k, r, s = case.get("c", 3), case.get("k", 8), case.get("r", 3), case.get("s", 3)
    x = make_input((1, c, 8, case.get("w", 9) * case.get("w_stride", 1)), torch.float32, "NHWC")[
        ..., :: case.get("w_stride", 1)
    ]
    conv = fp.ConvolutionDescriptor((0, 0), groups=case.get("groups", 1))
    plan = add_chain(plan_for(x), "CA", k=k, r=r, s=s, conv=conv)
    verdict = next(v for v in plan.explain(fp.Handle("cpu")) if v.solver == "triton-stem")
    assert reason in verdict.reason, verdict.reason
    assert plan.compiled_solver(compile_triton(plan)) != "triton-stem"


# ---- depthwise convolutions computed directly (before triton-conv) -----------------------------------------
DEPTHWISE_CASES = {  # name: (n, c, h, w, multiplier, r, pads, strides, dilations)
    "3x3": (2, 8, 13, 11, 1, 3, (1, 1), (1, 1), (1, 1)),
    "stride2": (1, 24, 12, 9, 1, 3, (1, 1), (2, 2), (1, 1)),
    "5x5-dilation2": (1, 5, 14, 13, 1, 5, (4, 4), (1, 1), (2, 2)),
    "multiplier2": (2, 6, 7, 8, 2, 3, (0, 0), (1, 1), (1, 1)),
}


@pytest.mark.parametrize("case", list(DEPTHWISE_CASES))
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "fp16"])
def test_depthwise_solver(case, layout, dtype):
    n, c, h, w, mult, r, pads, strides, dils = DEPTHWISE_CASES[case]
    x = make_input((n, c, h, w), dtype, layout)
    conv = fp.ConvolutionDescriptor(pads, strides, dils, groups=c)
    plan = add_chain(plan_for(x), "CBNA", conv=conv, k=c * mult, r=r, s=r, param_dtype=DT_NAME[dtype])
    handle = fp.Handle("cpu")
    assert plan.compile(handle, solver="triton-depthwise") == "triton-depthwise"
    check_against_reference(plan, handle, x, random_args(plan), poisoned(plan.output_desc, layout))


def test_depthwise_solver_is_chosen_before_triton_conv_and_says_why_not():
    x = make_input((1, 8, 6, 6), torch.float32, "NHWC")
    plan = add_chain(plan_for(x), "CA", k=8, r=3, s=3, conv=fp.ConvolutionDescriptor((1, 1), groups=8))
    assert plan.compiled_solver(compile_triton(plan)) == "triton-depthwise"
    dense = add_chain(plan_for(x), "CA", k=8, r=3, s=3, conv=fp.ConvolutionDescriptor((1, 1)))
    verdict = next(v for v in dense.explain(fp.Handle("cpu")) if v.solver == "triton-depthwise")
    assert "not depthwise" in verdict.reason


def test_gemm_defers_where_it_measured_slower():
    """1x1 layers with few pixels and C >= 4K run on the convolution kernels unless the GEMM is named."""
    x = make_input((1, 64, 4, 4), torch.float16, "NHWC")
    plan = add_chain(plan_for(x), "CA", k=16, r=1, s=1, conv=fp.ConvolutionDescriptor((0, 0)), param_dtype="half")
    verdict = next(v for v in plan.explain(fp.Handle("cpu")) if v.solver == "triton-gemm")
    assert verdict.applicable and "M=16 pixels < 4096" in verdict.deferred
    wide = add_chain(plan_for(make_input((1, 64, 64, 80), torch.float16, "NHWC")), "CA", k=16, param_dtype="half")
    assert "C=64 >= 2K" in next(v for v in wide.explain(fp.Handle("cpu")) if v.solver == "triton-gemm").deferred
    x32 = make_input((1, 64, 4, 4), torch.float32, "NHWC")
    plan32 = add_chain(plan_for(x32), "CA", k=64, r=1, s=1, conv=fp.ConvolutionDescriptor((0, 0)))
    assert "fp32" in next(v for v in plan32.explain(fp.Handle("cpu")) if v.solver == "triton-gemm").deferred
    handle = compile_triton(plan)
    assert plan.compiled_solver(handle) != "triton-gemm-nchw"
    assert plan.compile(handle, solver="triton-gemm") == "triton-gemm"
    check_against_reference(plan, handle, x, random_args(plan), poisoned(plan.output_desc, "NHWC"))


@pytest.mark.parametrize(
    "layer, batch, solver, deferred",
    [
        ("r50_10", 32, "triton-window", None),  # 128 programs
        ("r50_10", 1, "triton-window", "14 programs < 100"),
        ("r50_09", 1, "triton-gemm", "M=784 pixels < 4096"),  # triton-conv's small tiles as fast
        ("r50_13", 1, "triton-gemm", "M=196 pixels < 4096"),  # C=256: triton-conv faster
        ("r50_19", 32, "triton-gemm", "M=1568 pixels < 4096"),  # windows of 128 programs faster
        ("r50_08", 32, "triton-window", "strided 1x1 filter, 25088 >= 4096"),  # triton-conv's 3-stage tiles
        ("r50_14", 32, "triton-window", "strided 1x1 filter, 6272 >= 4096"),
        ("r50_06", 32, "triton-window", "strided 3x3 filter, 25088 >= 16384"),  # triton-conv's tap bits
        ("r50_12", 32, "triton-window", None),
        ("r50_18", 32, "triton-window", None),  # 7x7 outputs
    ],
)
def test_small_grids_defer_where_measured_slower(layer, batch, solver, deferred):
    """Choices at batch 1 and 32 follow the H100 measurements (descriptors only: nothing runs)."""
    from fusionplan.tools.shapes import resnet50_layer
    from fusionplan.tools.verify import layer_plan

    s = resnet50_layer(layer)
    x = torch.empty(batch, s.c, s.h, s.w, dtype=torch.float16).to(memory_format=torch.channels_last)
    verdict = next(v for v in layer_plan(s, x, "CBA").explain(fp.Handle("cpu")) if v.solver == solver)
    assert verdict.applicable
    assert verdict.deferred == deferred if deferred is None else deferred in verdict.deferred


def test_triton_window_leaves_tensors_past_2_to_the_31_elements_to_the_64_bit_kernels():
    big = fp.TensorDescriptor.packed("half", (1, 128, 4096, 4096), "NHWC")
    plan = fp.FusionPlan(big)
    plan.add_conv_forward(fp.ConvolutionDescriptor((1, 1)), fp.TensorDescriptor.packed("half", (128, 128, 3, 3)))
    verdicts = {v.solver: v.reason for v in plan.explain(fp.Handle("cpu"))}
    assert "2^31" in verdicts["triton-window"] and "gluon-window" in verdicts["triton-window"]
    assert "2^31" not in verdicts["gluon-window"]  # there, only the device is missing


def out_of_resources():
    from triton.runtime.errors import OutOfResources

    return OutOfResources(245784, 232448, "shared memory")


@pytest.mark.parametrize("wide", [True, False])
def test_launches_that_do_not_fit_the_device_run_narrower_or_on_triton_conv(wide):
    """A specialization first compiled at a launch (reading a prior output: compile builds the plain
    one ahead) may not fit the device's shared memory: triton-gemm's 128x256 tiles did, at 240 KB.
    The call then runs with the kernel's narrower tiles, or else on triton-conv's implicit GEMM; the
    result is the same and complete."""
    x = make_input((2, 64, 6, 7), torch.float16, "NHWC")
    plan = add_chain(plan_for(x), "CNA", k=64, r=1, s=1, conv=fp.ConvolutionDescriptor((0, 0)), param_dtype="half")
    handle = compile_named(plan, "triton-gemm")
    kernel = plan._entry(handle).kernel
    if wide:
        kernel.config = dataclasses.replace(kernel.config, block_n=64)
        kernel.narrower_config = lambda: dataclasses.replace(kernel.config, block_n=32)
    tried = []

    class TooLargeFirst:  # the kernel's launcher, except that its own configuration does not fit
        def __init__(self, real) -> None:
            self.real, self.direct = real, real.direct

        def __call__(self, grid, cfg, args, num_warps, num_stages):
            tried.append(cfg.block_n)
            if cfg == kernel.config:
                raise out_of_resources()
            return self.real(grid, cfg, args, num_warps, num_stages)

    kernel.launcher = TooLargeFirst(kernel.launcher)
    args = seeded_alpha_beta_args(plan, 3)
    prior = torch.randn(plan.output_desc.dims).half().to(memory_format=torch.channels_last)
    check_against_reference(plan, handle, x, args, prior.clone(), prior=prior)
    assert tried == ([64, 32] if wide else [kernel.config.block_n])
    assert (kernel._conv_kernel is None) == wide  # triton-conv ran the call where no narrower tile was tried


def test_launcher_remembers_specializations_that_do_not_fit():
    """Triton raises OutOfResources when it loads a kernel too large for the device; the launcher
    raises it again for the same specialization without compiling anew."""
    from fusionplan.runtime.launch import Launcher

    calls = []

    class Fn:
        arg_names = ["a"]

        def __getitem__(self, grid):
            def launch(**kwargs):
                calls.append(kwargs)
                raise out_of_resources()

            return launch

    launcher = Launcher(Fn())
    for _ in range(3):
        with pytest.raises(Exception, match="shared memory"):
            launcher((1, 1, 1), "cfg", [7], 4, 3)
    assert len(calls) == 1
    with pytest.raises(Exception, match="shared memory"):
        launcher((1, 1, 1), "cfg", [16], 4, 3)  # another specialization: an integer that divides by 16
    assert len(calls) == 2
