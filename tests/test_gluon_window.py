"""gluon-window without a GPU: which plans it takes and why not, and its generated kernels, compiled
for sm_90 with Triton's own ptxas (Gluon has no interpreter; tests/gpu runs them)."""

import pytest
import torch

import fusionplan as fp
from fusionplan.runtime.sass import captured_launch
from fusionplan.solvers import solver_named
from fusionplan.solvers.triton_window import window_defer_why
from fusionplan.solvers.window_toolkit import window_tiles
from fusionplan.tools.shapes import resnet50_layer
from fusionplan.tools.verify import add_chain, layer_plan

from .util import HOPPER_SHARED_BYTES, compile_sm90, layer_build, plan_for

pytest.importorskip("triton")
gluon_window = pytest.importorskip("fusionplan.solvers.gluon_window")
if gluon_window.gluon_why_not():
    pytest.skip(gluon_window.gluon_why_not(), allow_module_level=True)


def verdict(plan, tf32: bool = True) -> fp.solvers.Verdict:
    """gluon-window's verdict for a CPU handle (``tf32``: whether it allows TF32 products)."""
    return next(v for v in plan.explain(fp.Handle("cpu", allow_tf32=tf32)) if v.solver == "gluon-window")


def layer(name: str, dtype=torch.float16, batch: int = 32, layout: str = "NHWC", chain: str = "CBNA"):
    s = resnet50_layer(name)
    x = torch.empty(batch, s.c, s.h, s.w, dtype=dtype)
    return layer_plan(s, x.to(memory_format=torch.channels_last) if layout == "NHWC" else x, chain)


@pytest.mark.parametrize(
    "plan_args, tf32, reason",
    [
        (("r50_22",), True, "needs a Hopper GPU"),  # the plan fits: only the device is missing
        (("r50_18", torch.bfloat16), True, "needs a Hopper GPU"),  # strided, every stride class in one view
        (("r50_22", torch.float32), True, "needs a Hopper GPU"),  # TF32 products
        (("r50_22", torch.float32), False, "fp32 data without TF32"),
        (("r50_22", torch.float16, 32, "NCHW"), True, "channels-last"),
    ],
)
def test_why_not_names_what_is_missing(plan_args, tf32, reason):
    assert reason in verdict(layer(*plan_args), tf32).reason


def test_takes_tensors_past_2_to_the_31_elements():
    """Host descriptors read the input and the output's offsets go 64-bit (IDX64), so gluon-window
    takes what triton-window's 32-bit views cannot: here 2.2e9 elements in one image."""
    x = torch.empty(1, 128, 4096, 4160, dtype=torch.float16, device="meta").to(memory_format=torch.channels_last)
    plan = add_chain(plan_for(x), "CBA", conv=fp.ConvolutionDescriptor((1, 1)), k=128, r=3, s=3, param_dtype="float")
    assert x.numel() > 2**31 and "needs a Hopper GPU" in verdict(plan).reason
    assert gluon_window.gluon_defer_why(plan.spec()) is None
    kernel = solver_named("gluon-window").build(plan.spec(), fp.Handle("cpu"))
    args = captured_launch(kernel)[2]
    assert dict(zip((p.name for p in kernel.launcher.fn.params), args))["IDX64"] is True


@pytest.mark.parametrize("tma_store", [True, False])
def test_kernel_past_2_to_the_31_elements_compiles(tma_store):
    """The one-image plan above (its output's offsets in an image pass 2^31) with 64-bit offsets,
    its output stored by TMA or by pointer: builds for sm_90 without spills."""
    build = (
        f"fp.runtime.tuning.TMA_STORE_MIN_PIXELS = {128 if tma_store else 1 << 20}\n"
        "x = torch.empty(1, 128, 4096, 4160, dtype=torch.float16, device='meta')\n"
        "plan = fp.FusionPlan(fp.TensorDescriptor.from_tensor(x.to(memory_format=torch.channels_last)))\n"
        "add_chain(plan, 'CBNA', conv=fp.ConvolutionDescriptor((1, 1)), k=128, r=3, s=3, param_dtype='float')"
    )
    info = compile_sm90(build, "gluon-window")
    assert info["HGMMA"] > 0 and (info["tensor stores (UTMASTG)"] > 0) == tma_store
    assert "STACK:0" in info["resources"] and "LOCAL:0" in info["resources"]


def test_strided_inputs_must_split_into_whole_stride_classes():
    x = torch.empty(8, 128, 15, 16, dtype=torch.float16).to(memory_format=torch.channels_last)
    conv = fp.ConvolutionDescriptor((1, 1), (2, 2))
    plan = add_chain(plan_for(x), "CBA", conv=conv, k=128, r=3, s=3, param_dtype="float")
    assert "H=15 and W=16 multiples of the stride 2x2" in verdict(plan).reason


def test_defers_where_triton_window_does_for_16_bit_data():
    """Batch 1 grids are small, strided 1x1 filters of many pixels as fast on triton-conv: triton-conv
    first (triton-window's measured rules)."""
    assert "programs < 100" in gluon_window.gluon_defer_why(layer("r50_10", batch=1).spec())
    for name in ("r50_10", "r50_18", "r50_20"):
        assert gluon_window.gluon_defer_why(layer(name).spec()) is None
    for name in ("r50_08", "r50_14"):
        assert "strided 1x1" in gluon_window.gluon_defer_why(layer(name).spec())
        assert gluon_window.gluon_defer_why(layer(name).spec()) == window_defer_why(layer(name).spec())


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_strided_3x3_of_many_pixels_defers_to_triton_conv_with_tap_bits(dtype, monkeypatch):
    """16-bit strided 3x3 of 16384 output pixels or more (r50_06, 25088) defers to triton-conv, whose
    tap bits measured faster; fewer pixels (r50_12, r50_18), fp32, and tap bits switched off do not."""
    why = gluon_window.gluon_defer_why(layer("r50_06", dtype).spec())
    assert "strided 3x3 filter, 25088 >= 16384" in why
    assert why == window_defer_why(layer("r50_06", dtype).spec())
    for name in ("r50_12", "r50_18", "r50_10"):
        assert gluon_window.gluon_defer_why(layer(name, dtype).spec()) is None
    assert gluon_window.gluon_defer_why(layer("r50_06", torch.float32).spec()) is None
    monkeypatch.setattr(fp.runtime.tuning, "CONV_TAP_BITS", 0)
    assert gluon_window.gluon_defer_why(layer("r50_06", dtype).spec()) is None


def test_tf32_windows_defer_from_the_measured_size(monkeypatch):
    """fp32 data in windows of tuning.GLUON_TF32_MAX_WINDOW pixels or more defers to the Triton
    kernels. With the epilogue in the accumulator's layout no window size does (r50_10 and strided
    r50_06, 256-pixel windows, measured faster on gluon-window); with the earlier threshold, 256,
    those two defer and smaller windows (r50_12, r50_16, r50_22) and 16-bit data do not."""
    for name in ("r50_10", "r50_06", "r50_12", "r50_16", "r50_22"):
        assert gluon_window.gluon_defer_why(layer(name, torch.float32).spec()) is None
    monkeypatch.setattr(fp.runtime.tuning, "GLUON_TF32_MAX_WINDOW", 256)
    for name in ("r50_10", "r50_06"):
        assert "windows of 256 pixels" in gluon_window.gluon_defer_why(layer(name, torch.float32).spec())
    # (16-bit r50_06 defers to triton-conv's tap bits whatever this threshold)
    assert gluon_window.gluon_defer_why(layer("r50_10", torch.float16).spec()) is None
    for name in ("r50_12", "r50_16", "r50_22"):
        assert gluon_window.gluon_defer_why(layer(name, torch.float32).spec()) is None


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_configs_fit_one_warpgroup_per_64_channels_and_the_shared_memory(dtype):
    for name in ("r50_10", "r50_15", "r50_16", "r50_17", "r50_18", "r50_19", "r50_21", "r50_22"):
        cfg = gluon_window.gluon_config(layer(name, dtype).spec())
        assert cfg.block_n >= 16 * cfg.num_warps and cfg.block_m * cfg.block_n // (32 * cfg.num_warps) <= 128
        row = cfg.block_k * dtype.itemsize
        assert row <= 128 and cfg.num_stages * (cfg.block_m + cfg.block_n) * row <= 200 * 1024, (name, cfg)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_stride_1_windows_of_wide_layers_take_256_channels_over_two_warpgroups(dtype):
    """r50_16 (stride 1, 256 channels) runs 64-pixel windows of 256 channels over two warpgroups, as
    many programs as 128 x 128; the strided r50_12 and the 128-channel r50_10 keep their windows."""
    wide = gluon_window.gluon_config(layer("r50_16", dtype).spec())
    assert (wide.block_m, wide.block_n, wide.num_warps, wide.num_stages) == (64, 256, 8, 4)
    assert wide.block_k == 128 // dtype.itemsize
    assert gluon_window.gluon_config(layer("r50_12", dtype).spec()).block_m == 128
    assert gluon_window.gluon_config(layer("r50_10", dtype).spec()).block_n == 128
    spec = layer("r50_16", dtype).spec()
    assert window_tiles(spec, 64)[1] * (256 // 256) == window_tiles(spec, 128)[1] * (256 // 128) == 128


@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_wide_windows_compile_pipelined_within_shared_memory(dtype):
    """r50_16's 64 x 256 windows (two warpgroups, four stages of 40 KB): products in flight, no
    spills, the shared memory within Hopper's."""
    info = compile_sm90(layer_build("r50_16", dtype), "gluon-window")
    assert "0x1" in info["wgmma waits (outstanding groups allowed)"]
    assert "STACK:0" in info["resources"] and "LOCAL:0" in info["resources"]
    assert info["shared bytes (dynamic)"] <= HOPPER_SHARED_BYTES


@pytest.mark.parametrize(
    "name, dtype, first_weights",
    [
        ("r50_22", "float16", 6),
        ("r50_18", "bfloat16", 6),
        ("r50_22", "float32", 6),
        ("r50_10", "float16", 0),
        ("r50_15", "float32", 0),
    ],
)
def test_kernel_is_warp_specialized_with_overlapping_products(name, dtype, first_weights):
    """A loading partition beside the computing one (register reallocation between them), tensor
    loads (each stage's expect counts its window's box and the weights'), wgmma from shared memory
    with one group in flight. 64-pixel windows of one warpgroup (16-bit and TF32) request the first
    round of weights (a stage's tile each) before the partitions, each with its stage's expect of
    both boxes."""
    info = compile_sm90(layer_build(name, dtype), "gluon-window")
    assert info["HGMMA"] > 0 and info["LDSM (operand through registers)"] == 0
    assert info["register reallocations (SETMAXREG, warp specialization)"] > 0
    assert info["tensor loads (UTMALDG)"] == 2 + first_weights
    loads, expects = info["tensor loads' box bytes (TTGIR)"], info["bytes barriers expect (TTGIR)"]
    box, weights = loads[-2:]  # the loading partition's two loads a step
    assert loads == [weights] * first_weights + [box, weights]
    assert expects == [box + weights] * (first_weights + 1)
    assert "0x1" in info["wgmma waits (outstanding groups allowed)"]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_first_weights_before_the_wait_where_they_measured_faster(dtype):
    """64 x 128 windows of one warpgroup (r50_22, r50_18), 16-bit or TF32, request their first
    weights before the grid-dependency wait; r50_16's 64 x 256 windows over two warpgroups and the
    128-pixel r50_12 do not."""

    def first() -> dict[str, int]:
        return {
            name: gluon_window.window_weights_first(gluon_window.gluon_config(layer(name, dtype).spec()))
            for name in ("r50_22", "r50_18", "r50_16", "r50_12")
        }

    assert first() == {"r50_22": 1, "r50_18": 1, "r50_16": 0, "r50_12": 0}


@pytest.mark.parametrize("name, late", [("r50_22", True), ("r50_10", False)])
def test_64_pixel_windows_invalidate_their_barriers_after_the_epilogue(name, late):
    """r50_22's 64-pixel windows invalidate the ring's
    barriers at the kernel's end, after the output's stores (in the PTX every invalidation after every
    store; ptxas may then schedule some among the stores), r50_10's larger windows right after the
    partitions join (every one before the first store); every barrier invalidated either way."""
    info = compile_sm90(layer_build(name, "float16"), "gluon-window")
    assert info["barrier invalidations (I) and global stores (S) in order (PTX)"] == ("SI" if late else "IS")
    assert info["barriers invalidated (PTX mbarrier.inval)"] == info["barriers initialized (PTX mbarrier.init)"]
    cfg = gluon_window.gluon_config(layer(name, torch.float16).spec())
    assert gluon_window.window_late_invalidation(cfg) is late


def test_every_epilogue_operator_compiles_in_gluon():
    """All ten activations, per-channel and per-element batch norm and a blend with the prior output
    (beta) in one chain: the generated epilogue in Gluon's names builds."""
    build = (
        "x = torch.empty(4, 128, 13, 11, dtype=torch.float16).to(memory_format=torch.channels_last)\n"
        "plan = fp.FusionPlan(fp.TensorDescriptor.from_tensor(x))\n"
        "add_chain(plan, 'CBN', conv=fp.ConvolutionDescriptor((1, 1)), k=80, r=3, s=3, param_dtype='float')\n"
        "add_chain(plan, 'N', bn_mode=BatchNormMode.PER_ACTIVATION, param_dtype='float')\n"
        "for mode in ActivationMode:\n"
        "    plan.add_activation_forward(mode)"
    )
    info = compile_sm90(build, "gluon-window")
    assert "tl." not in info["source"] and "gl.exp(" in info["source"] and "HAS_PRIOR" in info["source"]
    assert info["HGMMA"] > 0


@pytest.mark.parametrize(
    "name, deferred",
    [
        ("r50_09", "25088 output pixels"),  # 28x28 1x1: triton-conv measured faster
        ("r50_13", "256 windows"),  # 14x14 1x1 of 1024 channels: two waves of programs
        ("r50_15", None),  # 14x14 1x1, 128 windows: 16.4 us against 26.6 (H200)
        ("r50_21", None),
        ("r50_18", None),  # strided 3x3, every stride class in one view
    ],
)
def test_tf32_choices_follow_the_measurements(name, deferred):
    why = gluon_window.GluonWindowSolver().defer_why(layer(name, torch.float32).spec(), fp.Handle("cpu"))
    assert why == deferred if deferred is None else deferred in why


@pytest.mark.parametrize(
    "strides, ow, pixels, fits",
    [
        ((112 * 112 * 64, 1, 112 * 64, 64), 112, 2, True),  # NHWC, 64 channels
        ((112 * 112 * 64, 112 * 112, 112, 1), 112, 2, False),  # NCHW: the channels not contiguous
        ((26 * 26 * 17, 1, 26 * 17, 17), 26, 2, False),  # 17 channels: pixels 34 bytes apart
        ((30 * 31 * 64, 1, 31 * 64, 64), 31, 2, False),  # a row of 31 pixels: half a run at its end
        ((32 * 32 * 72 + 8, 1, 32 * 72, 72), 32, 4, True),  # images 16 bytes apart beyond their extent
        ((32 * 32 * 72 + 4, 1, 32 * 72, 72), 32, 4, False),  # ... 8 bytes: not a TMA stride
        ((7 * 7 * 512, 1, 7 * 512, 512), 7, 1, True),  # a window's pixels: any row
        ((7 * 7 * 24, 1, 7 * 24, 24), 7, 1, True),
    ],
)
def test_tma_store_strides(strides, ow, pixels, fits):
    """Strides that let TMA store the stem's runs of pixels (``pixels`` > 1) and windows (1)."""
    assert gluon_window.tma_store_strides_fit(strides, ow, pixels, 2) is fits


def test_window_tma_store_by_plan():
    """16-bit channels-last windows go out by TMA; fp32 output and 17 output
    channels (34-byte pixels) store by pointer (and so does an output of other strides at launch:
    tests/gpu)."""
    assert gluon_window.window_tma_store(layer("r50_22").spec())
    assert gluon_window.window_tma_store(layer("r50_18", torch.bfloat16).spec())
    assert not gluon_window.window_tma_store(layer("r50_22", torch.float32).spec())
    x = torch.empty(4, 128, 13, 11, dtype=torch.float16).to(memory_format=torch.channels_last)
    conv = fp.ConvolutionDescriptor((1, 1))
    assert gluon_window.window_tma_store(add_chain(plan_for(x), "CBNA", conv=conv, k=24, r=3, s=3).spec())
    assert not gluon_window.window_tma_store(add_chain(plan_for(x), "CBNA", conv=conv, k=17, r=3, s=3).spec())


@pytest.mark.parametrize(
    "name, dtype, copies", [("r50_12", "float16", 2), ("r50_10", "bfloat16", 2), ("r50_22", "float16", 0)]
)
def test_windows_store_by_tma(name, dtype, copies):
    """Windows of 128 pixels and more (r50_12: 128, r50_10: 256) store a box per 64 channels by TMA
    and nothing by pointer, in no more shared memory than the ring's (the output's tile takes the
    ring's memory after its last use); smaller ones (r50_22: 64) by pointer
    (tuning.TMA_STORE_MIN_PIXELS)."""
    info = compile_sm90(layer_build(name, dtype), "gluon-window")
    assert info["tensor stores (UTMASTG)"] == copies
    assert (info["global stores by bytes"] == {}) is (copies > 0)
    assert info["shared bytes (dynamic)"] <= HOPPER_SHARED_BYTES and "LOCAL:0" in info["resources"]
