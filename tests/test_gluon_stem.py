"""gluon-stem without a GPU: which plans it takes and why not, its ring and packed filter, and its
generated kernel compiled for sm_90 with Triton's own ptxas (tests/test_gpu.py runs it)."""

import pytest
import torch

import fusionplan as fp
from fusionplan.shapes import resnet50_layer
from fusionplan.solvers import solver_named
from fusionplan.testing import add_chain, layer_plan

from .util import compile_sm90, layer_build, plan_for

pytest.importorskip("triton")
gluon_stem = pytest.importorskip("fusionplan.solvers.gluon_stem")
if gluon_stem.gluon_why_not():
    pytest.skip(gluon_stem.gluon_why_not(), allow_module_level=True)


def verdict(plan) -> fp.solvers.Verdict:
    return next(v for v in plan.explain(fp.Handle("cpu")) if v.solver == "gluon-stem")


def stem(dtype=torch.float16, layout: str = "NHWC", n: int = 32):
    s = resnet50_layer("r50_00")
    x = torch.empty(n, s.c, s.h, s.w, dtype=dtype)
    return layer_plan(s, x.to(memory_format=torch.channels_last) if layout == "NHWC" else x, "CBNA")


def conv_plan(c=3, h=20, w=40, k=64, r=7, s=7, pads=(3, 3), strides=(2, 2), dil=1, dtype=torch.float16, groups=1):
    x = torch.empty(2, c, h, w, dtype=dtype).to(memory_format=torch.channels_last)
    conv = fp.ConvolutionDescriptor(pads, strides, (dil, dil), groups=groups)
    return add_chain(plan_for(x), "CBA", conv=conv, k=k, r=r, s=s, param_dtype="float")


@pytest.mark.parametrize(
    "plan, reason",
    [
        (lambda: stem(), "needs a Hopper GPU"),  # the plan fits: only the device is missing
        (lambda: stem(torch.bfloat16), "needs a Hopper GPU"),
        (lambda: stem(torch.float32), "16-bit wgmma"),
        (lambda: stem(layout="NCHW"), "must be channels-last"),
        (lambda: conv_plan(c=16, r=3, s=3, pads=(1, 1)), "C=16 > 15"),
        (lambda: conv_plan(c=4, groups=2, k=8), "grouped"),
        (lambda: conv_plan(w=300), "more than 64 runs"),
        (lambda: conv_plan(c=3, w=11, r=3, s=3, pads=(1, 1)), "4-byte units"),  # rows of 33 elements
        (lambda: conv_plan(c=15, r=7, s=7, strides=(1, 1)), "longer than a tile's 64"),
        (lambda: conv_plan(c=3, w=12, r=3, s=3, pads=(1, 1)), "needs a Hopper GPU"),
        (lambda: conv_plan(c=1, w=40, r=1, s=1, pads=(0, 0), strides=(1, 1)), "runs of 8 pixels"),
    ],
)
def test_why_not_names_what_is_missing(plan, reason):
    assert reason in verdict(plan()).reason


def test_filter_too_large_for_shared_memory(monkeypatch):
    from fusionplan import tuning

    monkeypatch.setattr(tuning, "GLUON_STEM_SMEM_BYTES", 64 * 1024)
    assert "Toeplitz blocks and 14 input-row tiles take" in verdict(stem()).reason


def test_ring_and_config():
    """The ResNet stem: runs of 2 pixels (56 of a 112-pixel row), stretches of 32 elements copied 8
    bytes at a time, 16 slots of 4 KB beside the filter's 14 blocks (57 KB); the shallowest ring
    that cannot stall holds two output rows' 7 input rows each."""
    kernel = solver_named("gluon-stem").build(stem().spec(), fp.Handle("cpu"))
    runs = kernel.runs
    assert (runs.pixels, runs.step, runs.lead, runs.block_e) == (2, 12, 12, 32)
    assert gluon_stem.copy_vector(runs, 2, 224 * 3, 224 * 224 * 3, 224 * 3) == 4
    assert kernel.config.num_stages == 16 and kernel.config.block_k == 32
    assert [c.num_stages for c in kernel.candidates] == [16, 14]
    assert kernel.narrower_config().num_stages == 14
    assert gluon_stem.stem_smem_bytes(7, runs, 16, 2) == (14 * 64 + 16 * 64) * 32 * 2
    tiles = 2 * 2 * 64 * 64 * 2  # the output tiles of TMA stores: a warpgroup's, a pixel's
    assert gluon_stem.stem_smem_bytes(7, runs, 16, 2, tma_store=True) == (14 * 64 + 16 * 64) * 32 * 2 + tiles
    assert gluon_stem.least_slots(7, 1) == 14 and gluon_stem.least_slots(3, 2) == 10


def test_packed_filter_is_triton_stems_blocks_padded_to_whole_channel_blocks():
    """[R * PX * KP, BLOCK_E]: block (r, p) of K output channels, then zero rows up to KP."""
    plan = conv_plan(k=17)
    kernel = solver_named("gluon-stem").build(plan.spec(), fp.Handle("cpu"))
    weight = torch.randn(17, 3, 7, 7, dtype=torch.float16)
    packed = kernel.pack(weight)
    toeplitz = solver_named("triton-stem").build(plan.spec(), fp.Handle("cpu")).pack(weight)  # [R, 1, PX, K, E]
    r, _, px, k, e = toeplitz.shape
    assert packed.shape == (r * px * 64, e)
    blocks = packed.reshape(r, px, 64, e)
    assert torch.equal(blocks[:, :, :17], toeplitz[:, 0]) and not blocks[:, :, 17:].any()


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_stem_kernel_gathers_each_input_row_once(dtype):
    """Both computing warpgroups issue a wgmma per filter row, pixel of a run and 16-element slice of
    the stretch (2 x 7 x 2 x 2), both operands from shared memory; the loading warpgroup gathers an
    input row's tile with four 8-byte asynchronous copies a thread and one arrival on the row's
    barrier; 14 tensor loads of the filter; the output tiles stored by TMA; no spills, within
    sm_90's shared memory."""
    info = compile_sm90(layer_build("r50_00", dtype), "gluon-stem")
    assert info["HGMMA"] == 56 and info["HGMMA shapes"] == ["64x64x16"]
    assert info["async copies by bytes"].get("8") == 4
    assert info["tensor loads (UTMALDG)"] == 14
    # the output tiles by TMA: a store per warpgroup and pixel of a run, no pointer stores
    assert info["tensor stores (UTMASTG)"] == 4 and not info["global stores by bytes"]
    assert "mbarrier_arrive(ready.index(slot), increment_count=False)" in info["source"]
    assert info["register reallocations (SETMAXREG, warp specialization)"] > 0
    assert "LOCAL:0" in info["resources"]
    assert info["shared bytes (dynamic)"] <= 232448


def test_odd_stem_compiles():
    """C = 4 and 136 output channels (three blocks), a 3x3 stride-1 filter of dilation 2 (runs of
    more pixels: an accumulator each)."""
    build = (
        "x = torch.empty(2, 4, 20, 40, dtype=torch.float16).to(memory_format=torch.channels_last)\n"
        "conv = fp.ConvolutionDescriptor((2, 2), (1, 1), (2, 2))\n"
        "plan = add_chain(fp.FusionPlan(fp.TensorDescriptor.from_tensor(x)), 'CNA', conv=conv, k=136, r=3, s=3,"
        " param_dtype='float')"
    )
    info = compile_sm90(build, "gluon-stem")
    assert info["HGMMA"] > 0 and "LOCAL:0" in info["resources"]
    assert info["shared bytes (dynamic)"] <= 232448


@pytest.mark.parametrize(
    "c, r, stride, pixels",
    [(2, 7, 2, 1), (1, 3, 2, 4)],
)
def test_runs_of_one_and_four_pixels_compile(c, r, stride, pixels):
    """An accumulator per pixel of a run, one wait for all their products, no spills."""
    build = (
        f"x = torch.empty(2, {c}, 20, 64, dtype=torch.float16).to(memory_format=torch.channels_last)\n"
        f"conv = fp.ConvolutionDescriptor((0, 0), ({stride}, {stride}))\n"
        f"plan = add_chain(fp.FusionPlan(fp.TensorDescriptor.from_tensor(x)), 'CBA', conv=conv, k=32, r={r}, s={r},"
        " param_dtype='float')"
    )
    info = compile_sm90(build, "gluon-stem")
    assert f"acc{pixels - 1} = gl.zeros" in info["source"] and f"acc{pixels} = gl.zeros" not in info["source"]
    assert info["HGMMA"] > 0 and "LOCAL:0" in info["resources"]


def test_tma_store_by_plan(monkeypatch):
    """The stem's channels-last output takes TMA stores unless switched off; 17 output channels
    (34-byte pixels) and outputs that the tiles' shared memory would not fit store by pointer."""
    from fusionplan import tuning

    kernel = solver_named("gluon-stem").build(stem().spec(), fp.Handle("cpu"))
    assert gluon_stem.plan_tma_store(stem().spec(), kernel.runs)
    assert not gluon_stem.plan_tma_store(conv_plan(k=17).spec(), kernel.runs)
    monkeypatch.setattr(tuning, "GLUON_STEM_SMEM_BYTES", 140 * 1024)  # 16 slots fit, 14 and the tiles do not
    assert not gluon_stem.plan_tma_store(stem().spec(), kernel.runs)
    assert solver_named("gluon-stem").build(stem().spec(), fp.Handle("cpu")).config.num_stages == 16
    monkeypatch.setattr(tuning, "GLUON_STEM_SMEM_BYTES", 192 * 1024)
    monkeypatch.setattr(tuning, "GLUON_STEM_TMA_STORE", False)
    assert not gluon_stem.plan_tma_store(stem().spec(), kernel.runs)
