"""gluon-nchw without a GPU: which plans it takes and why not, where it defers to the other NCHW
kernels, the tiles it picks, and its generated kernel compiled for sm_90 with Triton's own ptxas
(tests/gpu runs it)."""

import pytest
import torch

import fusionplan as fp
from fusionplan.runtime import tuning
from fusionplan.tools.shapes import resnet50_layer
from fusionplan.tools.verify import add_chain, layer_plan

from .util import assert_each_expect_counts_its_load, compile_sm90, layer_build, plan_for

pytest.importorskip("triton")
gluon_nchw = pytest.importorskip("fusionplan.solvers.gluon_nchw")
gather_toolkit = pytest.importorskip("fusionplan.solvers.gather_toolkit")
if gluon_nchw.gluon_why_not():
    pytest.skip(gluon_nchw.gluon_why_not(), allow_module_level=True)

H100_SMS = 132


def layer(name: str, dtype=torch.float16, batch: int = 32, layout: str = "NCHW"):
    s = resnet50_layer(name)
    x = torch.empty(batch, s.c, s.h, s.w, dtype=dtype)
    return layer_plan(s, x.to(memory_format=torch.channels_last) if layout == "NHWC" else x, "CBNA")


def reason(plan, tf32: bool = True) -> str | None:
    return next(v for v in plan.explain(fp.Handle("cpu", allow_tf32=tf32)) if v.solver == "gluon-nchw").reason


def deferred(plan) -> str | None:
    return gluon_nchw.GluonNchwSolver().defer_why(plan.spec(), fp.Handle("cpu"))


def odd_plan(c: int, r: int, groups: int = 1, dtype=torch.float16):
    x = torch.empty(2, c, 9, 9, dtype=dtype)
    conv = fp.ConvolutionDescriptor((r // 2, r // 2), groups=groups)
    return add_chain(plan_for(x), "CBA", conv=conv, k=16, r=r, s=r, param_dtype="float")


def test_why_not_names_what_is_missing():
    assert "needs a Hopper GPU" in reason(layer("r50_22"))  # the plan fits: only the device is missing
    assert "needs a Hopper GPU" in reason(layer("r50_22", torch.float32))  # TF32 products
    assert "fp32 data without TF32" in reason(layer("r50_22", torch.float32), tf32=False)
    assert "grouped convolutions (groups=2)" in reason(odd_plan(32, 3, groups=2))
    # each output channel's packed weights, a tensor descriptor's row: 3*3*3 fp16 elements are 54 bytes
    assert "whole 16-byte units" in reason(odd_plan(3, 3))
    assert "needs a Hopper GPU" in reason(odd_plan(8, 3))  # 144 bytes


@pytest.mark.parametrize("c, r, dtype", [(4, 2, torch.float16), (2, 2, torch.float32), (1, 4, torch.float32)])
def test_taps_whose_weights_start_inside_16_byte_units_are_refused(c, r, dtype):
    """A tap's box of weights starts at column t*C; a tensor copy whose innermost coordinate is not
    on a 16-byte unit is an illegal instruction on the GPU (fuzzer: --mode gpu --seed 3 --index 23),
    although the rows (R*S*C elements) are whole units."""
    assert "a tap's" in reason(odd_plan(c, r, dtype=dtype))


def test_one_tap_of_few_channels_is_taken():
    assert "needs a Hopper GPU" in reason(odd_plan(8, 1, dtype=torch.float32))  # 32-byte rows, column 0


@pytest.mark.parametrize(
    "name, batch, why",
    [
        ("r50_22", 32, None),  # 7x7 planes, 3x3
        ("r50_18", 32, None),  # strided to 7x7
        ("r50_16", 32, None),  # 14x14
        ("r50_12", 32, None),
        ("r50_10", 32, None),  # 28x28: the largest plane of several taps
        ("r50_06", 32, None),
        ("r50_19", 32, None),  # 1x1 on 7x7 planes
        ("r50_21", 32, None),
        ("r50_02", 32, "output planes of 3136 pixels (> 784 for several taps)"),
        ("r50_15", 32, "output planes of 196 pixels (> 49 for 1x1 filters)"),
        ("r50_20", 32, "strided 1x1 filters"),  # to 7x7 planes
        ("r50_22", 1, "a grid of 8 programs (< 64)"),  # 49 pixels x 64 channels,
    ],
)
def test_defers_where_the_other_kernels_measured_faster(name, batch, why):
    found = deferred(layer(name, batch=batch))
    assert found == why if why is None else why in found


@pytest.mark.parametrize(
    "name, why",
    [
        ("r50_16", None),
        ("r50_22", None),
        ("r50_10", "784 pixels (> 196 for fp32 data)"),
        ("r50_14", None),  # strided 1x1 onto 14x14 planes
        ("r50_20", None),
        ("r50_08", None),  # onto 28x28
        ("r50_15", "196 pixels (> 49 for 1x1 filters)"),  # stride 1
    ],
)
def test_fp32_data_defers_on_28x28_planes(name, why):
    """fp32 data (TF32): filters of several taps on output planes up to 14x14
    (tuning.GLUON_NCHW_FP32_MAX_PLANE), strided 1x1 filters up to 28x28
    (GLUON_NCHW_FP32_STRIDED_1X1_MAX_PLANE), stride-1 1x1 filters as for 16-bit data (7x7)."""
    found = deferred(layer(name, torch.float32))
    assert found == why if why is None else why in found


def test_channels_last_input_defers():
    assert "channels-last input" in deferred(layer("r50_22", layout="NHWC"))


@pytest.mark.parametrize(
    "name, tile",
    [
        ("r50_16", (64, 256, 1)),
        ("r50_12", (64, 256, 1)),
        ("r50_19", (64, 256, 1)),
        ("r50_22", (64, 256, 2)),
        ("r50_18", (64, 256, 2)),
        ("r50_21", (64, 128, 1)),
    ],
)
def test_tiles_fill_half_the_multiprocessors(name, tile):
    """64 x 256 where its grid fills half the GPU (r50_16, r50_12: 98 programs; r50_19: 200) or
    does so split in two (r50_22, r50_18: 50 x 2 programs, 2304 products a part), else 128 x 128
    or 64 x 128 (r50_21: its 2048 channels split in two parts of 1024, below
    tuning.GLUON_NCHW_SPLIT_MIN_DEPTH: 100 programs of 64 x 128 against 50 and 52); the ring within
    tuning.GLUON_NCHW_RING_BYTES."""
    s = resnet50_layer(name)
    oh = s.h // s.stride
    for dtype in (torch.float16, torch.float32):
        cfg = gluon_nchw.gather_config(32 * oh * oh, s.k, dtype, H100_SMS, s.r * s.s * s.c, s.stride > 1)
        size = torch.empty((), dtype=dtype).element_size()
        row = tuning.GLUON_NCHW_STRIDED_STEP_BYTES if s.stride > 1 else 128
        assert (cfg.block_m, cfg.block_n, cfg.split_k, cfg.block_k) == (*tile, row // size)
        ring = cfg.num_stages * (cfg.block_m + cfg.block_n) * row
        assert 2 <= cfg.num_stages and ring <= tuning.GLUON_NCHW_RING_BYTES


@pytest.mark.parametrize("row, ring, stages", [(64, 96, 4), (128, 96, 2), (64, 160, 6), (128, 160, 4)])
def test_strided_plans_take_shorter_steps_and_a_deeper_ring(row, ring, stages, monkeypatch):
    """r50_18 and r50_12 (3x3, stride 2): steps of tuning.GLUON_NCHW_STRIDED_STEP_BYTES a pixel (64:
    4 stages of a 64 x 256 tile in the 96 KB of tuning.GLUON_NCHW_STRIDED_RING_BYTES, 6 in 160 KB;
    128: 2 and 4); the stride-1 r50_22 keeps 128-byte steps and the 160 KB ring."""
    monkeypatch.setattr(tuning, "GLUON_NCHW_STRIDED_STEP_BYTES", row)
    monkeypatch.setattr(tuning, "GLUON_NCHW_STRIDED_RING_BYTES", ring * 1024)
    for name in ("r50_18", "r50_12"):
        s = resnet50_layer(name)
        m = 32 * (s.h // 2) ** 2
        cfg = gluon_nchw.gather_config(m, s.k, torch.float16, H100_SMS, s.r * s.s * s.c, True)
        assert (cfg.block_m, cfg.block_n, cfg.block_k, cfg.num_stages) == (64, 256, row // 2, stages)
    cfg = gluon_nchw.gather_config(32 * 49, 512, torch.float16, H100_SMS, 4608, False)
    assert (cfg.block_k, cfg.num_stages) == (64, 4)


def test_strided_16_bit_gathers_take_the_strided_ring(monkeypatch):
    """tuning.GLUON_NCHW_STRIDED_RING_BYTES bounds the ring of strided convolutions of 16-bit data;
    stride 1 and fp32 data keep tuning.GLUON_NCHW_RING_BYTES."""
    monkeypatch.setattr(tuning, "GLUON_NCHW_STRIDED_RING_BYTES", 64 * 1024)
    assert gluon_nchw.ring_bytes(True, 2) == 64 * 1024
    assert gluon_nchw.ring_bytes(False, 2) == gluon_nchw.ring_bytes(True, 4) == tuning.GLUON_NCHW_RING_BYTES
    fp16 = gluon_nchw.gather_config(32 * 196, 256, torch.float16, H100_SMS, 2304, True)
    fp32 = gluon_nchw.gather_config(32 * 196, 256, torch.float32, H100_SMS, 2304, True)
    assert fp16.num_stages * (fp16.block_m + fp16.block_n) * fp16.block_k * 2 <= 64 * 1024
    assert fp32.num_stages > fp16.num_stages


@pytest.mark.parametrize(
    "programs, depth, split",
    [
        (50, 4608, 2),
        (33, 4608, 2),
        (33, 16384, 4),
        (16, 4608, 2),
        (8, 65536, 16),
        (50, 2048, 1),
        (50, 4095, 1),
        (66, 4608, 1),
        (67, 4608, 1),
    ],
)
def test_reductions_split_where_the_grid_leaves_half_the_gpu_idle(programs, depth, split):
    """Powers of two while the grid stays within the multiprocessors and each part keeps
    tuning.GLUON_NCHW_SPLIT_MIN_DEPTH products; grids of half the GPU or more stay whole."""
    assert gather_toolkit.gather_split(programs, depth, H100_SMS) == split


def test_split_kernel_sums_fp32_partials_of_the_tile():
    """A split tile stores its fp32 partial in 8-byte pieces (a thread's neighbouring values), counts
    its arrival with an atomic, and keeps the gathering side of the whole tile (no spills)."""
    info = compile_sm90(layer_build("r50_22", "float16", layout="NCHW"), "gluon-nchw")
    assert "SPLIT_K: gl.constexpr" in info["source"] and "gl.atomic_add(cnt_ptr + pid" in info["source"]
    assert info["global stores by bytes"].get("8", 0) > 0
    assert "LOCAL:0" in info["resources"]


def test_split_pair_sums_in_registers():
    """A reduction split in two (r50_22's 64 x 256 tiles): the last program adds the other part's
    partial to its own accumulator (PAIR_SUM), loading only that part: 64 8-byte loads a thread
    of 128 (summing in split order, as for more parts, would load its own too: 64 more)."""
    info = compile_sm90(layer_build("r50_22", "float16", layout="NCHW"), "gluon-nchw")
    assert info["global loads by bytes"].get("8", 0) >= 64 and "if PAIR_SUM:" in info["source"]


@pytest.mark.parametrize(
    "name, dtype, partitions", [("r50_21", "float16", 3), ("r50_16", "bfloat16", 2), ("r50_19", "float32", 2)]
)
def test_kernel_gathers_beside_one_computing_warpgroup(name, dtype, partitions):
    """Warp-specialized (register reallocations), the weights by a tensor load in each step of each
    gathering partition's unrolled loop (64 x 128 tiles: three partitions; 64 x 256: two, the
    ring's four stages; three steps a turn, two of them ahead), the input by plain loads (no
    asynchronous copies: 2-byte elements), products with one in flight, no spills, within sm_90's
    shared memory."""
    info = compile_sm90(layer_build(name, dtype, layout="NCHW"), "gluon-nchw")
    assert "_gather_partition" in info["source"] and info["HGMMA"] > 0
    assert info["register reallocations (SETMAXREG, warp specialization)"] > 0
    assert info["tensor loads (UTMALDG)"] == 3 * partitions and info["async copies (LDGSTS)"] == 0
    assert_each_expect_counts_its_load(info)  # each partition's weights box
    assert "0x1" in info["wgmma waits (outstanding groups allowed)"]
    assert "LOCAL:0" in info["resources"]
    assert info["shared bytes (dynamic)"] <= 232448


def test_weights_requested_before_the_gathers_fence():
    """Each gathering partition (r50_22: two, each three steps a turn) issues its stage's weights
    load before the proxy fence that waits for its gathers, and the stage's ready barrier counts the
    stores' arrival besides the load's."""
    info = compile_sm90(layer_build("r50_22", "float16", layout="NCHW"), "gluon-nchw")
    assert info["tensor loads (T) and fences (F) in order"] == "TF" * 6
    assert ("mbarrier.init(ready.index(i), count=2)" in info["source"]) and "LOCAL:0" in info["resources"]


@pytest.mark.parametrize(
    "name, ring, instruction",
    [("r50_22", 0, "64x256x16"), ("r50_21", 0, "64x128x16"), ("r50_18", 0, "64x256x16"), ("r50_18", 160, "64x64x16")],
)
def test_product_along_the_pixels_where_the_registers_hold_it(name, ring, instruction):
    """wgmma across the tile's pixels and all its channels (64 x BLOCK_N: r50_22's 64 x 256 tile beside
    two gathering partitions, r50_21's 64 x 128 beside three, r50_18's 64 x 256 in a 4-stage ring
    beside two) unless the registers a thread has at launch cannot hold one such instruction's
    accumulator: r50_18's 64 x 256 tile in a 6-stage ring (a strided ring of 160 KB: three gathering
    partitions, 16 warps, 128 registers) keeps the transposed product's 64-channel instructions.
    ptxas compiles each within its registers (no spills)."""
    build = layer_build(name, "float16", layout="NCHW")
    if ring:
        build = f"fp.runtime.tuning.GLUON_NCHW_STRIDED_RING_BYTES = {ring * 1024}\n" + build
    info = compile_sm90(build, "gluon-nchw")
    assert info["HGMMA shapes"] == [instruction] and "LOCAL:0" in info["resources"]


def test_pixel_rows_by_the_registers_at_launch():
    assert gluon_nchw.pixel_rows(256, 12) and gluon_nchw.pixel_rows(128, 16) and gluon_nchw.pixel_rows(64, 16)
    assert not gluon_nchw.pixel_rows(256, 16)


def test_gathering_side_by_the_tile(monkeypatch):
    """64-pixel tiles: three partitions of 4 warps, two steps ahead; 128: one of 8, two ahead; the
    tuning constants override the table, within the registers (at most 12 gathering warps)."""
    assert gluon_nchw.gather_partitions(64) == (4, 3, 2)
    assert gluon_nchw.gather_partitions(128) == (8, 1, 2)
    monkeypatch.setattr(tuning, "GLUON_NCHW_GATHERERS", 2)
    monkeypatch.setattr(tuning, "GLUON_NCHW_GATHER_WARPS", 4)
    assert gluon_nchw.gather_partitions(128) == (4, 2, 2)
    monkeypatch.setattr(tuning, "GLUON_NCHW_GATHER_WARPS", 8)
    with pytest.raises(ValueError, match="at most 12 warps"):
        gluon_nchw.gather_partitions(64)
    # each thread's share of the registers the computing warpgroup leaves
    assert gluon_nchw.gather_regs(4, 3, 176) == 112 and gluon_nchw.gather_regs(8, 1, 176) == 168
    # the computing warpgroup keeps its accumulator and MMA_SPARE_REGS, at least MMA_MIN_REGS
    assert [gluon_nchw.mma_regs(*tile) for tile in ((64, 128), (64, 256), (128, 128))] == [120, 176, 176]


@pytest.mark.parametrize(
    "stages, parts, ring",
    [(6, 3, (6, 3)), (6, 2, (6, 2)), (5, 3, (4, 2)), (4, 3, (4, 2)), (3, 3, (3, 1)), (2, 2, (2, 1)), (6, 1, (6, 1))],
)
def test_each_stage_has_one_gathering_partition(stages, parts, ring):
    """The ring's stages a multiple of the partitions (a partition filling a stage after another's
    could pass its one-bit phase wait a round early), two stages or more per partition."""
    assert gluon_nchw.shared_ring(stages, parts) == ring
