"""gluon-gemm without a GPU: which plans it takes and why not, the tiles its cost model picks, and
its generated kernels, compiled for sm_90 with Triton's own ptxas (tests/gpu runs them)."""

import json
from dataclasses import replace

import pytest
import torch

import fusionplan as fp
from fusionplan.tools.shapes import resnet50_layer
from fusionplan.tools.verify import add_chain, layer_plan

from .util import assert_stages_expect_their_boxes, compile_sm90, layer_build, plan_for

pytest.importorskip("triton")
gluon_gemm = pytest.importorskip("fusionplan.solvers.gluon_gemm")
if gluon_gemm.gluon_why_not():
    pytest.skip(gluon_gemm.gluon_why_not(), allow_module_level=True)
from fusionplan.solvers import triton_gemm  # noqa: E402

H100_SMS = 132


def verdict(plan, tf32: bool = True) -> fp.solvers.Verdict:
    return next(v for v in plan.explain(fp.Handle("cpu", allow_tf32=tf32)) if v.solver == "gluon-gemm")


def layer(name: str, dtype=torch.float16, batch: int = 32, layout: str = "NHWC"):
    s = resnet50_layer(name)
    x = torch.empty(batch, s.c, s.h, s.w, dtype=dtype)
    return layer_plan(s, x.to(memory_format=torch.channels_last) if layout == "NHWC" else x, "CBNA")


@pytest.mark.parametrize(
    "plan_args, tf32, reason",
    [
        (("r50_15",), True, "needs a Hopper GPU"),  # the plan fits: only the device is missing
        (("r50_15", torch.float32), True, "needs a Hopper GPU"),  # TF32 products
        (("r50_15", torch.float32), False, "fp32 data without TF32"),
        (("r50_15", torch.float16, 32, "NCHW"), True, "needs a Hopper GPU"),  # 14x14 planes: by copies
        (("r50_19", torch.float16, 32, "NCHW"), True, "7x7 planes of 98 bytes are not whole 16-byte units"),
        (("r50_07", torch.float16, 32, "NCHW"), True, "needs a Hopper GPU"),  # channel planes
        (("r50_07", torch.float32, 32, "NCHW"), True, "32-bit data on NCHW planes"),
        (("r50_08", torch.float16, 32, "NCHW"), True, "strided 1x1 convolutions on NCHW planes"),
        (("r50_16",), True, "only 1x1 convolutions without padding"),
        (("r50_14",), True, "needs a Hopper GPU"),  # strided: rows of the strided view
    ],
)
def test_why_not_names_what_is_missing(plan_args, tf32, reason):
    assert reason in verdict(layer(*plan_args), tf32).reason


def test_rows_of_16_bytes_are_needed():
    x = torch.empty(2, 20, 7, 7, dtype=torch.float16).to(memory_format=torch.channels_last)
    plan = add_chain(plan_for(x), "CBA", conv=fp.ConvolutionDescriptor((0, 0)), k=64, r=1, s=1, param_dtype="float")
    assert "16-byte rows" in verdict(plan).reason


@pytest.mark.parametrize("stride, reason", [(1, "needs a Hopper GPU"), (2, "exceed a tensor box's 256")])
def test_only_strided_rows_are_bound_by_a_box(stride, reason):
    """Output rows wider than a box's 256 pixels: flat rows (stride 1) read them; the strided view
    cannot."""
    x = torch.empty(1, 64, 4, 600, dtype=torch.float16).to(memory_format=torch.channels_last)
    conv = fp.ConvolutionDescriptor((0, 0), (stride, stride))
    plan = add_chain(plan_for(x), "CBA", conv=conv, k=64, r=1, s=1, param_dtype="float")
    assert reason in verdict(plan).reason


def test_strided_inputs_need_a_height_of_whole_strides():
    x = torch.empty(2, 64, 15, 16, dtype=torch.float16).to(memory_format=torch.channels_last)
    conv = fp.ConvolutionDescriptor((0, 0), (2, 2))
    plan = add_chain(plan_for(x), "CBA", conv=conv, k=64, r=1, s=1, param_dtype="float")
    assert "H=15 must be a multiple of the stride 2" in verdict(plan).reason


@pytest.mark.parametrize("name, slots", [("r50_08", 32), ("r50_14", 16), ("r50_20", 8), ("r50_15", 0)])
def test_strided_rows_take_slots_of_a_power_of_two(name, slots):
    """Output rows of 28, 14 and 7 pixels: boxes of 32, 16 and 8 slots per row (12.5 % zero fill)."""
    assert gluon_gemm.row_slots(layer(name).spec()) == slots
    s = resnet50_layer(name)
    oh = (s.h - 1) // s.stride + 1
    rows = 32 * oh * slots if slots else 32 * s.h * s.w
    for dtype in (torch.float16, torch.float32):
        cfg = gluon_gemm.gluon_gemm_config(rows, s.k, s.c, dtype, H100_SMS, slots)
        assert all(part >= slots for part in gluon_gemm.pixel_parts(cfg.block_m)), cfg


@pytest.mark.parametrize(
    "name, dtype, deferred",
    [
        ("r50_08", torch.float16, None),  # 448 programs: beyond one wave, still the fastest
        ("r50_14", torch.bfloat16, None),
        ("r50_20", torch.float16, None),
        ("r50_20", torch.float32, None),  # 112 programs: one wave
        ("r50_08", torch.float32, None),  # 8 steps: ping-pong
        ("r50_14", torch.float32, None),
    ],
)
def test_strided_layers_take_row_boxes_as_measured(name, dtype, deferred):
    """Strided 1x1 (whose other kernels are triton-conv's and the window solvers', not triton-gemm's):
    16-bit always, fp32 within one wave or with two warpgroups taking tiles in turn."""
    why = gluon_gemm.GluonGemmSolver().defer_why(layer(name, dtype).spec(), fp.Handle("cpu"))
    assert why == deferred if deferred is None else deferred in why


def test_strided_batch_1_is_a_small_problem():
    why = gluon_gemm.GluonGemmSolver().defer_why(layer("r50_14", batch=1).spec(), fp.Handle("cpu"))
    assert why is not None and "small problem" in why


@pytest.mark.parametrize("pixels, parts", [(16, (16,)), (96, (64, 32)), (112, (64, 32, 16)), (256, (256,))])
def test_pixels_split_into_power_of_two_parts(pixels, parts):
    assert gluon_gemm.pixel_parts(pixels) == parts


@pytest.mark.parametrize("pixels", [0, 8, 100])
def test_pixels_must_be_whole_parts_of_16(pixels):
    with pytest.raises(ValueError, match="multiple of 16"):
        gluon_gemm.pixel_parts(pixels)


@pytest.mark.parametrize(
    "name, tile",
    [  # measured best of the sweep (H200, fp16, batch 32): cuDNN's own GEMMs take 128x96 and 128x192 there
        ("r50_15", (96, 128)),
        ("r50_17", (192, 128)),
        ("r50_19", (208, 128)),
        ("r50_21", (64, 128)),
    ],
)
def test_cost_model_sizes_the_grid_to_one_wave(name, tile):
    s = resnet50_layer(name)
    cfg = gluon_gemm.gluon_gemm_config(32 * s.h * s.w, s.k, s.c, torch.float16, H100_SMS)
    assert (cfg.block_m, cfg.block_n) == tile
    programs = -(-32 * s.h * s.w // cfg.block_m) * -(-s.k // cfg.block_n)
    assert programs <= H100_SMS


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("batch", [1, 8, 32, 128])
def test_configs_fit_registers_and_shared_memory(dtype, batch):
    """The ring and a persistent program's epilogue scratch (the 16-bit output's layout change:
    measured in test_the_chain_in_the_accumulators_layout_compiles_with_little_shared_memory; none
    for fp32 output stored from the accumulator's layout) fit sm_90."""
    for name in ("r50_01", "r50_05", "r50_09", "r50_13", "r50_15", "r50_17", "r50_19", "r50_21"):
        s = resnet50_layer(name)
        cfg = gluon_gemm.gluon_gemm_config(batch * s.h * s.w, s.k, s.c, dtype, H100_SMS)
        assert len(gluon_gemm.pixel_parts(cfg.block_m)) <= gluon_gemm.MAX_PARTS
        warpgroups = cfg.num_warps // 4  # each consumer's: they split the channels, 128 rows at most each
        assert cfg.block_n in (64 * warpgroups, 128 * warpgroups), (name, cfg)
        assert cfg.block_m * cfg.block_n // (32 * cfg.num_warps) <= 128, (name, cfg)
        row = cfg.block_k * dtype.itemsize
        persistent = -(-batch * s.h * s.w // cfg.block_m) * -(-s.k // cfg.block_n) > H100_SMS
        part = gluon_gemm.pixel_parts(cfg.block_m)[0] * cfg.block_n
        if dtype != torch.float32:
            scratch = cfg.consumers * min(part * 2, {4: 2048, 8: 8192}[cfg.num_warps])
        else:
            scratch = 0
        scratch = scratch if persistent else 0
        ring = cfg.num_stages * (cfg.block_m + cfg.block_n) * row
        assert row == 128 and 2 <= cfg.num_stages and ring + scratch <= 224 * 1024


@pytest.mark.parametrize(
    "name, deferred",
    [
        ("r50_15", None),
        ("r50_17", None),
        ("r50_21", None),
        ("r50_09", None),
        ("r50_13", None),  # 4 steps, 1024 output channels: ping-pong
        ("r50_07", None),  # 2 steps, one warpgroup: its stores by TMA under the next tile's products
        ("r50_05", None),
        ("r50_01", None),
    ],
)
def test_defers_beyond_one_wave(name, deferred):
    why = gluon_gemm.GluonGemmSolver().defer_why(layer(name).spec(), fp.Handle("cpu"))
    assert why == deferred if deferred is None else deferred in why


def test_defers_beyond_one_wave_where_tiles_store_by_pointer(monkeypatch):
    """Persistent tiles of one warpgroup whose stores cannot run by TMA (tiles below
    TMA_STORE_MIN_PIXELS, or reductions of more than GLUON_GEMM_PERSISTENT_TMA_MAX_STEPS steps) defer
    to triton-gemm's persistent programs."""
    monkeypatch.setattr(fp.runtime.tuning, "TMA_STORE_MIN_PIXELS", 1 << 20)
    assert "programs" in gluon_gemm.GluonGemmSolver().defer_why(layer("r50_07").spec(), fp.Handle("cpu"))
    monkeypatch.setattr(fp.runtime.tuning, "TMA_STORE_MIN_PIXELS", 128)
    monkeypatch.setattr(fp.runtime.tuning, "GLUON_GEMM_PERSISTENT_TMA_MAX_STEPS", 1)
    why = gluon_gemm.GluonGemmSolver().defer_why(layer("r50_05").spec(), fp.Handle("cpu"))
    assert "4 reduction steps (< 8)" in why


@pytest.mark.parametrize(
    "name, deferred",
    [
        ("r50_11", None),  # beyond one wave, 16 steps of 32 channels: ping-pong
        ("r50_13", None),
        ("r50_07", None),  # 4 steps
        ("r50_15", None),  # one wave
        ("r50_19", None),
        ("r50_05", "100352 pixels (>= 65536): triton-gemm"),  # 56x56: triton-gemm, weights along K
        ("r50_04", "100352 pixels (>= 65536): triton-gemm"),
        ("r50_03", "100352 pixels (>= 65536): triton-gemm"),
        ("r50_01", "100352 pixels (>= 65536): triton-gemm"),
        ("r50_09", "25088 pixels"),  # one wave, but many pixels: triton-conv
    ],
)
def test_tf32_layers_as_measured(name, deferred):
    why = gluon_gemm.GluonGemmSolver().defer_why(layer(name, torch.float32).spec(), fp.Handle("cpu"))
    assert why == deferred if deferred is None else deferred in why


@pytest.mark.parametrize(
    "name, deferred",
    [
        ("r50_01", None),  # 56x56 planes at batch 32: 100352 pixels
        ("r50_03", None),
        ("r50_04", None),
        ("r50_05", None),
        ("r50_07", "M=25088 pixels < 65536"),  # 28x28: gluon-gemm
        ("r50_09", "M=25088 pixels < 65536"),  # triton-conv
        ("r50_13", "M=6272 pixels < 65536"),
    ],
)
def test_tf32_triton_gemm_takes_the_large_planes(name, deferred):
    """tuning.TF32_GEMM_MIN_PIXELS: triton-gemm (weights along the reduction) on the 56x56 layers."""
    why = triton_gemm.TritonGemmSolver().defer_why(layer(name, torch.float32).spec(), fp.Handle("cpu"))
    assert why == deferred if deferred is None else deferred in why


@pytest.mark.parametrize(
    "name, dtype, consumers",
    [
        ("r50_11", torch.float16, 2),  # 8 steps of 64 channels
        ("r50_11", torch.bfloat16, 2),
        ("r50_13", torch.float16, 2),  # 4 steps, 1024 output channels
        ("r50_05", torch.float16, 1),  # 4 steps, 128 output channels: one warpgroup (then triton-gemm)
        ("r50_07", torch.float16, 1),  # 2 steps
        ("r50_11", torch.float32, 2),  # 16 steps of 32
        ("r50_07", torch.float32, 2),  # 4 steps of 32
        ("r50_03", torch.float32, 1),  # 2 steps
        ("r50_15", torch.float32, 1),  # one wave
    ],
)
def test_deep_layers_beyond_one_wave_take_tiles_in_turn(name, dtype, consumers):
    """Two warpgroups taking 128 x 128 tiles in turn beyond one wave: 16-bit data from 8 reduction
    steps (4 with 256 output channels or more), fp32 (TF32) from 4."""
    s = resnet50_layer(name)
    cfg = gluon_gemm.gluon_gemm_config(32 * s.h * s.w, s.k, s.c, dtype, H100_SMS)
    assert cfg.consumers == consumers, cfg
    if consumers == 2:
        assert (cfg.block_m, cfg.block_n, cfg.num_warps) == (128, 128, 4)


@pytest.mark.parametrize("batch", [1, 4])
@pytest.mark.parametrize("name", ["r50_01", "r50_09", "r50_15", "r50_21"])
def test_small_problems_defer(name, batch):
    """Small tiles fill the GPU at batch 1 and 4: those problems stay with the kernels measured there."""
    why = gluon_gemm.GluonGemmSolver().defer_why(layer(name, batch=batch).spec(), fp.Handle("cpu"))
    assert why is not None and "small problem" in why


def test_batch_1_takes_the_smallest_tiles():
    """r50_21 at batch 1 (49 pixels): 16-pixel tiles of 64 channels fill 32 programs, the most there are."""
    s = resnet50_layer("r50_21")
    cfg = gluon_gemm.gluon_gemm_config(49, s.k, s.c, torch.float16, H100_SMS)
    assert cfg.block_n == 64 and cfg.block_m <= 64


@pytest.mark.parametrize(
    "name, dtype, hgmma",
    [
        ("r50_15", "float16", 8),
        ("r50_19", "bfloat16", 12),
        ("r50_21", "float16", 4),
        ("r50_17", "float32", 8),
        ("r50_07", "float16", 4),  # persistent: 392 tiles of 256 x 128
    ],
)
def test_kernel_is_warp_specialized_with_a_product_per_part(name, dtype, hgmma):
    """A loading partition beside the computing one, a tensor load per part and for the weights, a
    wgmma per part and 16-element slice of the step (fp32: 32 elements, 8 each), this step's products in flight."""
    info = compile_sm90(layer_build(name, dtype), "gluon-gemm")
    pixels = {"r50_15": 96, "r50_19": 208, "r50_21": 64, "r50_17": 192, "r50_07": 256}[name]
    parts = len(gluon_gemm.pixel_parts(pixels))
    assert info["HGMMA"] == hgmma and info["LDSM (operand through registers)"] == 0
    assert info["register reallocations (SETMAXREG, warp specialization)"] > 0
    assert info["tensor loads (UTMALDG)"] == parts + 1
    assert hex(parts) in info["wgmma waits (outstanding groups allowed)"]
    assert_stages_expect_their_boxes(info)
    assert "LOCAL:0" in info["resources"]  # no spills
    assert info["shared bytes (dynamic)"] <= 232448  # sm_90's limit per program


PINGPONG = """
import json
from dataclasses import replace
from fusionplan.runtime import tuning
from fusionplan.runtime.sass import compile_for_hopper, summarize
from fusionplan.solvers.gluon_gemm import gemm_stages
s = resnet50_layer("r50_07")
rows = []
for dtype, pixels in ((torch.float16, 64), (torch.float16, 96), (torch.float16, 128), (torch.float32, 128)):
    x = torch.empty(32, s.c, s.h, s.w, dtype=dtype).to(memory_format=torch.channels_last)
    kernel = solver_named("gluon-gemm").build(layer_plan(s, x, "CBNA").spec(), fp.Handle("cpu", allow_tf32=True))
    block_k = 128 // x.element_size()
    stages = gemm_stages(pixels, 128, block_k, x.element_size(), True, 4, 2)
    kernel.config = tuning.ConvConfig(pixels, 128, block_k, 8, 4, stages, 1, consumers=2)
    info = summarize(compile_for_hopper(kernel, with_prior=True)[1])
    shared = info["shared bytes (dynamic)"]
    rows.append([pixels, info["HGMMA"], info["resources"], shared, info["sass"].count("SETMAXREG")])
print("PINGPONG" + json.dumps(rows))
"""


def test_two_warpgroups_taking_tiles_in_turn_compile_and_fit():
    """Ping-pong (ConvConfig.consumers = 2): two computing warpgroups, each its own copy of the
    products, without spills, in sm_90's shared memory with a prior output and the stages
    gemm_stages gives; fp16 tiles of 64, 96, 128 pixels, TF32 of 128."""
    from .util import COMPILE, compiling_process

    script = COMPILE.split("{build}")[0] + PINGPONG
    stdout = compiling_process(["-c", script])
    rows = json.loads(next(line for line in stdout.splitlines() if line.startswith("PINGPONG"))[8:])
    for pixels, hgmma, resources, shared, setmaxreg in rows:
        # per warpgroup: 128 channels are two 64-row products, for each part and slice of the step
        # (16 elements of 16-bit data, 8 of fp32: four per step either way)
        assert hgmma == 2 * 2 * 4 * len(gluon_gemm.pixel_parts(pixels)), pixels
        assert "LOCAL:0" in resources and shared <= 232448 and setmaxreg > 0, (pixels, resources, shared)


@pytest.mark.parametrize("name, dtype", [("r50_08", "float16"), ("r50_14", "bfloat16"), ("r50_20", "float32")])
def test_strided_kernels_load_whole_rows(name, dtype):
    """Strided: each part's box is 3-D (rows of slots of the strided view), reinterpreted as the
    [pixels, BLOCK_K] operand; a tensor load per part and for the weights, no spills, in sm_90's
    shared memory."""
    info = compile_sm90(layer_build(name, dtype), "gluon-gemm")
    assert "ROW_SLOTS" in info["source"] and info["HGMMA"] > 0
    assert info["tensor loads (UTMALDG)"] >= 2 and "LOCAL:0" in info["resources"]
    assert info["shared bytes (dynamic)"] <= 232448


MMA_EPILOGUE = """
import json
from dataclasses import replace
from fusionplan.runtime import tuning
from fusionplan.runtime.sass import compile_for_hopper, summarize
rows = []
tuning.TMA_STORE_MIN_PIXELS = 1 << 20  # the pointer stores' layout change
for on in (True,):
    for name in ("r50_15", "r50_07"):
        s = resnet50_layer(name)
        x = torch.empty(32, s.c, s.h, s.w, dtype=torch.float16).to(memory_format=torch.channels_last)
        kernel = solver_named("gluon-gemm").build(layer_plan(s, x, "CBNA").spec(), fp.Handle("cpu"))
        info = summarize(compile_for_hopper(kernel)[1])
        c = kernel.config
        ring = c.num_stages * (c.block_m + c.block_n) * c.block_k * 2
        beside = info["shared bytes (dynamic)"] - ring
        rows.append([on, name, info["resources"], beside, c.num_stages, "MMA_EPILOGUE" in kernel.source()])
print("MMA" + json.dumps(rows))
"""


def test_the_chain_in_the_accumulators_layout_compiles_with_little_shared_memory():
    """The chain runs in the accumulator's layout and only the 16-bit output changes layout
    (pointer stores): no spills, and a persistent program (r50_07) needs little shared memory
    beside its ring (what gemm_stages reckons with); a program per tile (r50_15) reuses the
    ring."""
    from .util import COMPILE, compiling_process

    stdout = compiling_process(["-c", COMPILE.split("{build}")[0] + MMA_EPILOGUE])
    rows = json.loads(next(line for line in stdout.splitlines() if line.startswith("MMA"))[3:])
    beside = {(on, name): nbytes for on, name, _, nbytes, _, _ in rows}
    assert all("LOCAL:0" in resources and "STACK:0" in resources and src for _, _, resources, _, _, src in rows)
    assert beside[(True, "r50_07")] <= gluon_gemm.GEMM_MMA_EPILOGUE_BYTES[8] + 1024  # and the barriers
    assert beside[(True, "r50_15")] < 1024


def test_every_epilogue_operator_compiles_in_every_part():
    """Every activation (MIOpen's ten and the extensions), per-channel and per-element batch norm
    and a blend with the prior output (beta) in one chain, emitted for each of three parts."""
    build = (
        "x = torch.empty(4, 128, 13, 11, dtype=torch.float16).to(memory_format=torch.channels_last)\n"
        "plan = fp.FusionPlan(fp.TensorDescriptor.from_tensor(x))\n"
        "add_chain(plan, 'CBN', conv=fp.ConvolutionDescriptor((0, 0)), k=80, r=1, s=1, param_dtype='float')\n"
        "add_chain(plan, 'N', bn_mode=BatchNormMode.PER_ACTIVATION, param_dtype='float')\n"
        "for mode in ActivationMode:\n"
        "    plan.add_activation_forward(mode)"
    )
    info = compile_sm90(build, "gluon-gemm")
    assert "tl." not in info["source"] and info["source"].count("gl.exp(") >= 3 and "HAS_PRIOR" in info["source"]
    assert info["HGMMA"] > 0


@pytest.mark.parametrize(
    "name, dtype", [("r50_15", torch.float16), ("r50_11", torch.float32), ("r50_08", torch.float16)]
)
def test_find_candidates_suit_the_kernels_dtype_and_rows(name, dtype):
    """NORMAL find's configurations: reduction steps of 128-byte rows in the plan's dtype (fp32
    candidates of 16-bit steps needed 400 KB of shared memory: none could launch), a ring that fits
    sm_90 beside a persistent epilogue, and strided, parts that hold whole output rows."""
    plan = layer(name, dtype)
    kernel = gluon_gemm.GluonGemmSolver().build(plan.spec(), fp.Handle("cpu", allow_tf32=True))
    size = dtype.itemsize
    assert kernel.candidates and any(c.consumers == 2 for c in kernel.candidates)
    for c in kernel.candidates:
        assert c.block_k * size == 128, c
        ring = c.num_stages * (c.block_m + c.block_n) * c.block_k * size
        assert ring <= 224 * 1024, c
        assert gluon_gemm.pixel_parts(c.block_m)[-1] >= kernel.pixel_slots, c


@pytest.mark.parametrize(
    "strides, slots, fits",
    [
        ((7 * 7 * 2048, 1, 7 * 2048, 2048), 0, True),  # packed NHWC
        ((7 * 7 * 2048, 49, 7, 1), 0, False),  # NCHW: the channels not contiguous
        ((7 * 7 * 2056, 1, 7 * 2056, 2048), 0, False),  # pixels 2048 apart in rows of 2056: no flat rows
        ((7 * 7 * 2056, 1, 7 * 2056, 2048), 8, True),  # strided: rows by themselves ...
        ((8 * 8 * 2048, 1, 8 * 2048, 2048), 8, False),  # ... but images follow their rows
        ((7 * 7 * 20, 1, 7 * 20, 20), 0, False),  # 40-byte pixels
    ],
)
def test_tma_store_strides(strides, slots, fits):
    assert gluon_gemm.gemm_tma_store_fits(strides, 7, 7, slots) is fits


def test_tma_store_by_plan():
    """16-bit channels-last output goes out by TMA; fp32 output by pointer."""
    assert gluon_gemm.gemm_tma_store(layer("r50_19").spec(), 0)
    assert gluon_gemm.gemm_tma_store(layer("r50_20", torch.bfloat16).spec(), 8)
    assert not gluon_gemm.gemm_tma_store(layer("r50_19", torch.float32).spec(), 0)


@pytest.mark.parametrize(
    "name, dtype, copies",
    [
        ("r50_19", "float16", 6),
        ("r50_20", "bfloat16", 2),
        ("r50_17", "float16", 4),
        ("r50_15", "float16", 0),
        ("r50_13", "float16", 2),
        ("r50_14", "bfloat16", 0),
        ("r50_11", "float16", 0),
    ],
)
def test_tiles_store_by_tma(name, dtype, copies):
    """Tiles whose first part has 128 pixels or more store each part's 64-channel boxes by TMA
    (r50_19: parts of 128, 64 and 16 pixels; r50_20: strided, whole output rows; persistent r50_13:
    each of two warpgroups taking tiles of 4 steps in turn from its own buffer) and nothing by
    pointer, within sm_90's shared memory; smaller tiles (r50_15: 64 + 32 pixels,
    tuning.TMA_STORE_MIN_PIXELS) and persistent ones of longer reductions or strided rows (r50_11,
    r50_14: tuning.GLUON_GEMM_PERSISTENT_TMA_MAX_STEPS) store by pointer."""
    info = compile_sm90(layer_build(name, dtype), "gluon-gemm")
    assert info["tensor stores (UTMASTG)"] == copies * (2 if name == "r50_13" else 1)
    assert (info["global stores by bytes"] == {}) is (copies > 0)
    assert info["shared bytes (dynamic)"] <= 232448 and "LOCAL:0" in info["resources"]


def test_persistent_tiles_make_room_for_their_stores():
    """Persistent tiles of one part, flat rows and at most 4 reduction steps store from a buffer per
    computing warpgroup beside the ring (gemm_store_mode 2), which takes a stage where the output
    may take TMA stores (r50_13: 128 x 128 in turn, 6 stages by pointer, 5 with 64 KB of tiles); a
    ring that leaves no room, longer reductions and strided rows store by pointer; a program per
    tile reuses its ring (1); tiles under 128 pixels by pointer (0)."""
    m, k, c = 32 * 14 * 14, 1024, 256
    by_pointer = gluon_gemm.gluon_gemm_config(m, k, c, torch.float16, H100_SMS)
    by_tma = gluon_gemm.gluon_gemm_config(m, k, c, torch.float16, H100_SMS, tma_store=True)
    assert (by_pointer.consumers, by_pointer.num_stages, by_tma.num_stages) == (2, 6, 5)
    assert gluon_gemm.gemm_store_mode(by_tma, 2, False, 4, False) == 2
    ring = by_tma.num_stages * (by_tma.block_m + by_tma.block_n) * by_tma.block_k * 2
    assert ring + gluon_gemm.tma_store_bytes(by_tma, 2) <= gluon_gemm.GEMM_SHARED_BYTES
    assert gluon_gemm.gemm_store_mode(by_pointer, 2, False, 4, False) == 0  # no room beside 6 stages
    assert gluon_gemm.gemm_store_mode(by_tma, 2, False, 8, False) == 0  # r50_11's 8 steps
    assert gluon_gemm.gemm_store_mode(by_tma, 2, False, 4, True) == 0  # r50_08's rows of slots
    assert gluon_gemm.gemm_store_mode(by_pointer, 2, True, 8, True) == 1
    assert gluon_gemm.gemm_store_mode(replace(by_tma, block_m=96), 2, True, 4, False) == 0
    r50_11 = gluon_gemm.gluon_gemm_config(32 * 28 * 28, 256, 512, torch.float16, H100_SMS, tma_store=True)
    assert (r50_11.consumers, r50_11.num_stages) == (2, 6)  # stores by pointer: no stage given up


def test_channel_planes_need_whole_boxes_of_channels():
    """A box of 64 fp16 planes must not cross into the next image."""
    x = torch.empty(2, 96, 8, 8, dtype=torch.float16)
    plan = add_chain(plan_for(x), "CBA", conv=fp.ConvolutionDescriptor((0, 0)), k=64, r=1, s=1, param_dtype="float")
    assert "C=96: boxes of 64 channel planes would cross into the next image" in verdict(plan).reason
    assert "needs a Hopper GPU" in verdict(layer("r50_03", layout="NCHW")).reason


def test_channel_planes_pad_each_image_to_whole_tiles():
    """Rows of the product: each image's plane in whole tiles (784 pixels: 7 tiles of 112, or 7 of
    128 = 896); the cost model counts the padding (r50_07: no tile that wastes a quarter)."""
    assert gluon_gemm.plane_rows(32 * 784, 112, 784) == 32 * 784
    assert gluon_gemm.plane_rows(32 * 784, 128, 784) == 32 * 896
    assert gluon_gemm.plane_rows(32 * 784, 128, 0) == 32 * 784  # flat rows: no padding
    s = resnet50_layer("r50_07")
    cfg = gluon_gemm.gluon_gemm_config(32 * 784, s.k, s.c, torch.float16, H100_SMS, plane=784)
    padded = gluon_gemm.plane_rows(32 * 784, cfg.block_m, 784)
    assert padded <= 32 * 784 * 8 // 7, cfg


@pytest.mark.parametrize(
    "strides, oh, ow, vector",
    [
        ((64 * 784, 784, 28, 1), 28, 28, 8),  # packed NCHW: each plane one run of pixels
        ((64 * 784, 1, 28 * 64, 64), 28, 28, 0),  # channels-last: stored along the channels
        ((64 * 800, 800, 28, 1), 28, 28, 8),  # planes apart by whole 16-byte units
        ((64 * 784, 784, 32, 1), 28, 28, 1),  # rows padded: no run across them
        ((64 * 787, 787, 28, 1), 28, 28, 1),  # planes not 16-byte aligned
        ((64 * 196, 196, 14, 1), 14, 14, 4),  # 14x14 planes: 392 bytes, 8-byte stores
        ((64 * 200, 200, 14, 1), 14, 14, 4),  # planes apart by 8-byte units
    ],
)
def test_plane_stores_take_16_bytes_where_runs_allow(strides, oh, ow, vector):
    out = torch.empty(64 * 800, dtype=torch.float16)
    assert gluon_gemm.gemm_plane_vector(strides, out, oh, ow) == vector


def test_plane_stores_need_planes_of_whole_stores():
    """The stores' mask runs over a plane's pixels: a plane of 98 pixels (7x14) takes 2-pixel
    stores at most, whatever its strides allow."""
    out = torch.empty(64 * 800, dtype=torch.float16)
    assert gluon_gemm.gemm_plane_vector((64 * 104, 104, 14, 1), out, 7, 14) == 1
    assert gluon_gemm.gemm_plane_vector((64 * 104, 104, 14, 1), out, 8, 14) == 8


@pytest.mark.parametrize(
    "name, dtype, pixels, copies",
    [
        ("r50_03", "float16", 128, 1),  # persistent, 1 step: each warpgroup's tile from its own buffer
        ("r50_09", "bfloat16", 208, 3),  # one wave: a copy per part
        ("r50_11", "float16", 128, 0),  # persistent, 8 steps: stored by pointer
    ],
)
def test_channel_plane_kernels_read_boxes_and_store_along_planes(name, dtype, pixels, copies, monkeypatch):
    """Channel planes read by boxes (tuning.GLUON_GEMM_PLANE_COPIES 0): tensor loads of each part
    and the weights, a wgmma per part and 16-element slice of the step with the planes as B operand
    (no copy through registers of the input); the output stored by TMA a copy per part where
    gemm_store_mode says so (the tile written transposed to shared memory), else along the planes
    16 bytes a thread; no pointer loads, no spills."""
    monkeypatch.setattr(fp.runtime.tuning, "GLUON_GEMM_PLANE_COPIES", 0)
    build = "fp.runtime.tuning.GLUON_GEMM_PLANE_COPIES = 0\n" + layer_build(name, dtype, "CBNA", "NCHW")
    info = compile_sm90(build, "gluon-gemm")
    assert "PLANES" in info["source"]
    kernel = layer(name, getattr(torch, dtype), layout="NCHW").spec()
    cfg = fp.solvers.solver_named("gluon-gemm").build(kernel, fp.Handle("cpu")).config
    parts = len(gluon_gemm.pixel_parts(cfg.block_m))
    assert cfg.block_m == pixels, cfg
    # a box row past the 128-byte swizzle goes as one copy per 64 pixels
    loads = sum(-(-part // 64) for part in gluon_gemm.pixel_parts(cfg.block_m))
    assert info["tensor loads (UTMALDG)"] == loads + 1
    assert_stages_expect_their_boxes(info)
    assert info["HGMMA"] >= 4 * parts and info["async copies (LDGSTS)"] == 0
    assert info["tensor stores (UTMASTG)"] == copies
    assert info["global stores by bytes"] == ({} if copies else {"16": info["global stores by bytes"]["16"]})
    assert "LOCAL:0" in info["resources"] and info["shared bytes (dynamic)"] <= 232448


@pytest.mark.parametrize(
    "strides, fits",
    [
        ((1024 * 784, 784, 28, 1), True),  # packed NCHW
        ((1024 * 784, 1, 28 * 1024, 1024), False),  # channels-last
        ((1024 * 784, 784, 32, 1), False),  # padded rows: a plane is not one run
        ((1024 * 788, 788, 28, 1), False),  # planes 1576 bytes apart
    ],
)
def test_plane_tma_store_strides(strides, fits):
    assert gluon_gemm.plane_tma_store_fits(strides, 28) is fits


def test_plane_layers_defer_as_measured(monkeypatch):
    """Beyond one wave, channel-plane tiles read by boxes (tuning.GLUON_GEMM_PLANE_COPIES 0) with
    short reductions take tiles that persistent programs store by TMA, and stay (stored by pointer
    with one computing warpgroup they measured slower than triton-gemm-nchw)."""
    monkeypatch.setattr(fp.runtime.tuning, "GLUON_GEMM_PLANE_COPIES", 0)
    names = ("r50_01", "r50_03", "r50_04", "r50_05", "r50_07", "r50_09", "r50_11")

    def deferred() -> dict:
        found = {name: gluon_gemm.gluon_gemm_defer_why(layer(name, layout="NCHW").spec(), H100_SMS) for name in names}
        return {name: why for name, why in found.items() if why}

    assert deferred() == {}


@pytest.mark.parametrize("name, tile", [("r50_01", (256, 64)), ("r50_05", (256, 128)), ("r50_07", (128, 256))])
def test_short_plane_reductions_take_tiles_stored_by_tma(name, tile):
    s = resnet50_layer(name)
    cfg = gluon_gemm.gluon_gemm_config(32 * s.h * s.w, s.k, s.c, torch.float16, H100_SMS, 0, True, s.h * s.w)
    assert (cfg.block_m, cfg.block_n) == tile
    steps = -(-s.c // cfg.block_k)
    assert gluon_gemm.gemm_store_mode(cfg, 2, False, steps, False) == 2


@pytest.mark.parametrize(
    "name, dtype, reason",
    [
        ("r50_13", torch.float16, "needs a Hopper GPU"),  # 392-byte planes: by 8-byte copies
        ("r50_17", torch.bfloat16, "needs a Hopper GPU"),
        ("r50_19", torch.float16, "7x7 planes of 98 bytes are not whole 16-byte units"),  # nor 8-byte ones
        ("r50_13", torch.float32, "32-bit data on NCHW planes"),
    ],
)
def test_planes_inside_16_byte_units_come_by_copies(name, dtype, reason, monkeypatch):
    """tuning.GLUON_GEMM_PLANE_COPIES: 14x14 planes, whose starts lie inside 16-byte units where no
    tensor box may start, are read by 8-byte asynchronous copies instead (plane_copies); planes
    that are not whole 8-byte units (7x7: 98 bytes) and 32-bit data stay refused."""
    monkeypatch.setattr(fp.runtime.tuning, "GLUON_GEMM_PLANE_COPIES", True)
    plan = layer(name, dtype, layout="NCHW")
    assert reason in verdict(plan).reason
    assert gluon_gemm.plane_copies(plan.spec()) == (reason == "needs a Hopper GPU")


@pytest.mark.parametrize("mode, copied", [(0, False), (1, False), (2, True)])
def test_planes_of_whole_16_byte_units_are_copied_only_in_mode_2(mode, copied, monkeypatch):
    """tuning.GLUON_GEMM_PLANE_COPIES 2 copies every plane size, in place of the boxes: r50_11's
    784-pixel planes by 16-byte copies (8 pixels), the batch's pixels flat (no image padded to 896)."""
    monkeypatch.setattr(fp.runtime.tuning, "GLUON_GEMM_PLANE_COPIES", mode)
    spec = layer("r50_11", layout="NCHW").spec()
    kernel = fp.solvers.solver_named("gluon-gemm").build(spec, fp.Handle("cpu"))
    assert kernel.copies == copied and gluon_gemm.plane_copy_vec(spec) == 8
    rows = kernel._rows(kernel.config)
    assert (rows == 32 * 784) == copied and (rows == 32 * 896) == (not copied)  # 128-pixel tiles


def test_copied_planes_take_flat_rows(monkeypatch):
    """Copied planes are the batch's pixels without padding (a tile may span two images: each copy
    holds 4 pixels of one, 196 a multiple of 4), stored by pointer 8 bytes a thread (TMA stores
    of plane tiles hold one image)."""
    monkeypatch.setattr(fp.runtime.tuning, "GLUON_GEMM_PLANE_COPIES", 1)
    spec = layer("r50_13", layout="NCHW").spec()
    kernel = fp.solvers.solver_named("gluon-gemm").build(spec, fp.Handle("cpu"))
    assert kernel.copies and kernel.plane == 196 and gluon_gemm.plane_copy_vec(spec) == 4
    assert kernel._rows(kernel.config) == 32 * 196  # no image padded to whole tiles
    assert not kernel.tma_store and gluon_gemm.gluon_gemm_defer_why(spec, H100_SMS) is None
    out = torch.empty(32, 1024, 14, 14, dtype=torch.float16)
    assert gluon_gemm.gemm_plane_vector(out.stride(), out, 14, 14) == 4


@pytest.mark.parametrize(
    "name, dtype, batch", [("r50_13", "float16", 32), ("r50_15", "float16", 3), ("r50_17", "bfloat16", 32)]
)
def test_copied_plane_kernels_load_by_asynchronous_copies(name, dtype, batch, monkeypatch):
    """Copied planes on sm_90: a copying partition's 8-byte asynchronous copies (a 64-channel step
    of P pixels: P / 8 a thread of the four warps') and one tensor load, the weights' (the stage's
    expect counts it alone: the copies arrive on their own barrier), 8-byte NCHW stores, no spills
    (the plane's pixels a constant of the source: the copying warps' addresses fit their registers),
    within sm_90's shared memory. Batch 3: 588 pixels, not a multiple of 16 (the masks still cover
    whole copies)."""
    switches = "fp.runtime.tuning.GLUON_GEMM_PLANE_COPIES = 1\nfp.runtime.tuning.GLUON_GEMM_PAIRS_MAX_WIDENING = 0\n"
    info = compile_sm90(switches + layer_build(name, dtype, "CBNA", "NCHW", batch), "gluon-gemm")
    monkeypatch.setattr(fp.runtime.tuning, "GLUON_GEMM_PLANE_COPIES", 1)
    monkeypatch.setattr(fp.runtime.tuning, "GLUON_GEMM_PAIRS_MAX_WIDENING", 0)
    spec = layer(name, getattr(torch, dtype), batch, layout="NCHW").spec()
    pixels = fp.solvers.solver_named("gluon-gemm").build(spec, fp.Handle("cpu")).config.block_m
    assert "count=4 * 32" in info["source"] and "mbarrier_arrive(copied" in info["source"]  # four copying warps
    assert info["async copies by bytes"] == {"8": pixels // 8} and info["tensor loads (UTMALDG)"] == 1
    assert_stages_expect_their_boxes(info)
    assert info["global stores by bytes"].keys() == {"8"}
    assert "LOCAL:0" in info["resources"] and "STACK:0" in info["resources"]
    assert info["shared bytes (dynamic)"] <= 232448
    assert info["register reallocations (SETMAXREG, warp specialization)"] > 0


@pytest.mark.parametrize(
    "name, copied, l1, deferred",
    [
        ("r50_13", True, True, False),  # 14x14: 8-byte copies, 128-pixel tiles in turn
        ("r50_15", False, True, False),  # 14x14 narrowing: plane pairs (their odd halves copied)
        ("r50_17", True, True, False),  # 192-pixel tiles
        ("r50_19", False, False, False),  # 7x7 planes of 98 bytes: gluon-gemm refuses them
        ("r50_11", True, False, False),  # 28x28: 16-byte copies in place of the boxes (K = C / 2)
        ("r50_01", True, False, False),  # K = C
        ("r50_07", False, False, False),  # K = 4 C: the boxes, their tiles stored by TMA
        ("r50_03", False, False, False),
    ],
)
def test_planes_are_copied_where_measured_faster(name, copied, l1, deferred):
    """The defaults (tuning.GLUON_GEMM_PLANE_COPIES 2): 14x14 planes by 8-byte copies (through L1),
    except in tiles of more than tuning.GLUON_GEMM_COPY_L1_MAX_PIXELS pixels, or as pairs where the
    output is narrow (plane_pairs, whose odd halves also come through L1); planes of whole
    16-byte units by 16-byte copies where the output is at most tuning.GLUON_GEMM_COPY_MAX_WIDENING
    times as wide as the input, else by boxes."""
    spec = layer(name, layout="NCHW").spec()
    assert gluon_gemm.plane_copies(spec) == copied and gluon_gemm.copies_through_l1(spec) == l1
    why = gluon_gemm.gluon_gemm_defer_why(spec, H100_SMS)
    assert (why is not None) == deferred


@pytest.mark.parametrize(
    "name, dtype, pairs",
    [
        ("r50_15", torch.float16, True),  # 14x14, K = C / 4
        ("r50_15", torch.bfloat16, True),
        ("r50_17", torch.float16, False),  # K = C / 2: all by copies
        ("r50_13", torch.float16, False),  # K = 4 C
        ("r50_11", torch.float16, False),  # 28x28: whole 16-byte planes
        ("r50_21", torch.float16, False),  # 7x7: gluon-gemm refuses them
    ],
)
def test_narrow_14x14_planes_come_as_pairs(name, dtype, pairs):
    """Planes that start 8 bytes into a 16-byte unit every other channel
    (14x14, 392 bytes) where the output has at most tuning.GLUON_GEMM_PAIRS_MAX_WIDENING times the
    input's channels come as pairs (plane_pairs): not copied, each image padded to whole tiles as the
    boxes' (r50_15's 128-pixel tiles: 256 rows an image)."""
    spec = layer(name, dtype, layout="NCHW").spec()
    assert gluon_gemm.plane_pairs(spec) == pairs
    if pairs:
        kernel = fp.solvers.solver_named("gluon-gemm").build(spec, fp.Handle("cpu"))
        assert kernel.pairs and not kernel.copies and kernel.padded == 196
        tile = kernel.config.block_m
        assert kernel._rows(kernel.config) == 32 * -(-196 // tile) * tile
        assert gluon_gemm.gluon_gemm_defer_why(spec, H100_SMS) is None


def test_pair_order_puts_each_steps_even_channels_first():
    """The weights' channels as plane pairs read them: within each step of BLOCK_K channels, the even
    ones (the boxes' half of the stage), then the odd ones (the copies' half); a permutation."""
    order = gluon_gemm.pair_order(128, 64)
    assert order[:4] == [0, 2, 4, 6] and order[31] == 62 and order[32:34] == [1, 3] and order[63] == 63
    assert order[64:66] == [64, 66] and order[96] == 65
    assert sorted(order) == list(range(128))


def test_pairs_pack_the_weights_in_pair_order():
    """The packed weights of a plan read as pairs: [K, C], column j holding input channel pair_order[j]."""
    spec = layer("r50_15", layout="NCHW").spec()
    kernel = fp.solvers.solver_named("gluon-gemm").build(spec, fp.Handle("cpu"))
    weight = torch.randn(256, 1024, 1, 1, dtype=torch.float16)
    packed = kernel.pack(weight)
    assert packed.shape == (256, 1024) and packed.is_contiguous()
    order = torch.tensor(gluon_gemm.pair_order(1024, 64))
    assert torch.equal(packed, weight[:, :, 0, 0][:, order])


def emulated_pairs(x: torch.Tensor, weight: torch.Tensor, tile: int) -> torch.Tensor:
    """What the pair kernel computes, in float64, from the template's arithmetic: for each image and
    tile of ``tile`` pixels (each image padded to whole tiles) and each step of 64 channels, the box of
    the input seen as [N*C/2, 2*H*W] at row (image * C + c0) / 2 and column pix0 (zeros past the row's
    end, as TMA fills them; past the plane it reads the odd channel's pixels), the odd channels'
    planes copied where the pixel lies in the plane (zeros past it), both times the packed weights'
    step (pair_order); the padding's columns dropped."""
    n, c, h, w = x.shape
    hw = h * w
    pairs, planes = x.double().reshape(n * c // 2, 2 * hw), x.double().reshape(n * c, hw)
    packed = weight.double()[:, gluon_gemm.pair_order(c, 64)]
    padded = -(-hw // tile) * tile
    out = torch.full((n, weight.shape[0], padded), float("nan"), dtype=torch.float64)
    for img in range(n):
        for pix0 in range(0, padded, tile):
            cols = pix0 + torch.arange(tile)
            acc = torch.zeros(weight.shape[0], tile, dtype=torch.float64)
            for c0 in range(0, c, 64):
                even = torch.zeros(32, tile, dtype=torch.float64)
                in_row = cols < 2 * hw
                even[:, in_row] = pairs[(img * c + c0) // 2 + torch.arange(32)][:, cols[in_row]]
                odd = torch.zeros(32, tile, dtype=torch.float64)
                in_plane = cols < hw
                odd[:, in_plane] = planes[img * c + c0 + 1 + 2 * torch.arange(32)][:, cols[in_plane]]
                acc += packed[:, c0 : c0 + 64] @ torch.cat([even, odd])
            out[img, :, pix0 : pix0 + tile] = acc
    return out[:, :, :hw].reshape(n, -1, h, w)


@pytest.mark.parametrize("h, w, c, tile", [(14, 14, 128, 128), (14, 14, 64, 208), (6, 10, 192, 16), (2, 2, 64, 16)])
def test_emulated_pairs_match_the_convolution(h, w, c, tile):
    """The pairs' boxes (even channels, the odd plane's pixels past 196 in the padding's columns) and
    copies (odd channels) with the weights in pair order give the 1x1 convolution at every pixel."""
    gen = torch.Generator().manual_seed(h * 1000 + c + tile)
    x = torch.randn(3, c, h, w, generator=gen)
    weight = torch.randn(24, c, generator=gen)
    expected = torch.einsum("kc,nchw->nkhw", weight.double(), x.double())
    got = emulated_pairs(x, weight, tile)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, expected)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_pair_kernels_load_even_halves_by_boxes_and_odd_halves_by_copies(dtype):
    """Plane pairs on sm_90: a tensor load per part (the even channels' half box) beside the weights',
    the stage's expect counting both; the odd half by 8-byte asynchronous copies of the four copying
    warps (32 channels of P pixels: P / 16 a thread), on their own barrier; 8-byte NCHW stores; no
    spills, within sm_90's shared memory."""
    info = compile_sm90(layer_build("r50_15", dtype, "CBNA", "NCHW"), "gluon-gemm")
    spec = layer("r50_15", getattr(torch, dtype), layout="NCHW").spec()
    cfg = fp.solvers.solver_named("gluon-gemm").build(spec, fp.Handle("cpu")).config
    assert "count=4 * 32" in info["source"] and "mbarrier_arrive(copied" in info["source"]
    assert_pair_kernel(info, cfg.block_m)
    assert info["global stores by bytes"].keys() == {"8"}


def assert_pair_kernel(info: dict, pixels: int) -> None:
    """A plane-pair kernel of ``pixels``-pixel tiles compiled for sm_90: a tensor load per part (the
    even channels' half box) beside the weights', the stage's expect counting them; the odd halves by
    8-byte copies, pixels / 16 a thread; no spills; within sm_90's shared memory."""
    assert info["tensor loads (UTMALDG)"] == 1 + len(gluon_gemm.pixel_parts(pixels))
    assert_stages_expect_their_boxes(info)
    assert info["async copies by bytes"] == {"8": pixels // 16}
    assert "LOCAL:0" in info["resources"] and "STACK:0" in info["resources"]
    assert info["shared bytes (dynamic)"] <= 232448


def test_8_byte_plane_stores_take_the_lanes_along_the_pixels(monkeypatch):
    """tuning.GLUON_GEMM_PLANE_STORE_LANES lanes along a plane's pixels for 8-byte stores (PLANE_VEC
    4: 14x14 planes), 4 for 16-byte ones; a count that does not divide a warp is refused."""
    spec = layer("r50_13", layout="NCHW").spec()

    def source():
        return fp.solvers.solver_named("gluon-gemm").build(spec, fp.Handle("cpu")).source()

    assert "[PLANE_VEC, 1], [16, 32 // 16]" in source() and "[PLANE_VEC, 1], [4, 8]" in source()
    monkeypatch.setattr(fp.runtime.tuning, "GLUON_GEMM_PLANE_STORE_LANES", 8)
    assert "[PLANE_VEC, 1], [8, 32 // 8]" in source()
    monkeypatch.setattr(fp.runtime.tuning, "GLUON_GEMM_PLANE_STORE_LANES", 12)
    with pytest.raises(ValueError, match="GLUON_GEMM_PLANE_STORE_LANES = 12"):
        source()


def test_larger_tiles_of_8_byte_copies_defer(monkeypatch):
    """8-byte copied planes in tiles of more than tuning.GLUON_GEMM_COPY_L1_MAX_PIXELS pixels defer to
    triton-gemm-nchw (r50_17's 192 against a limit of 128)."""
    monkeypatch.setattr(fp.runtime.tuning, "GLUON_GEMM_COPY_L1_MAX_PIXELS", 128)
    why = gluon_gemm.gluon_gemm_defer_why(layer("r50_17", layout="NCHW").spec(), H100_SMS)
    assert "triton-gemm-nchw" in why and "192 pixels (> 128)" in why


@pytest.mark.parametrize("name, fits", [("r50_13", True), ("r50_15", True), ("r50_11", False), ("r50_07", False)])
def test_kernels_copying_through_l1_fit_their_carveout(name, fits, monkeypatch):
    """Kernels of 8-byte copied planes prefer the smallest shared-memory carve-out they fit (their
    launcher's fit_carveout), their ring held within tuning.GLUON_GEMM_COPY_SHARED_BYTES (fewer
    stages than the largest carve-out would take): the rest of the multiprocessor's memory is L1,
    where their copies land on their way. Others keep their stages; every kernel fits its carve-out."""

    def kernel():
        return fp.solvers.solver_named("gluon-gemm").build(layer(name, layout="NCHW").spec(), fp.Handle("cpu"))

    budgeted = kernel()
    monkeypatch.setattr(fp.runtime.tuning, "GLUON_GEMM_COPY_SHARED_BYTES", gluon_gemm.GEMM_SHARED_BYTES)
    unbounded = kernel()
    assert budgeted.launcher.fit_carveout
    assert (budgeted.config.num_stages < unbounded.config.num_stages) is fits
    if fits:
        cfg = budgeted.config
        assert cfg.num_stages * (cfg.block_m + cfg.block_n) * cfg.block_k * 2 <= 164 * 1024


@pytest.mark.parametrize("solver, name", [("gluon-gemm", "r50_11"), ("triton-conv", "r50_16")])
def test_every_convolution_kernel_fits_its_carveout(solver, name):
    """Every convolution kernel's launcher fits its carve-out, its source marked (CARVEOUT_MARK)."""
    from fusionplan.solvers.conv_kernel import CARVEOUT_MARK

    on = fp.solvers.solver_named(solver).build(layer(name, layout="NCHW").spec(), fp.Handle("cpu"))
    assert on.launcher.fit_carveout is True
    assert on.source().endswith(CARVEOUT_MARK)
