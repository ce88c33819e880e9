"""gluon-nchw-regs without a GPU: which plans it takes and why not, where it defers to gluon-nchw,
the tiles it picks, and its generated kernel compiled for sm_90 with Triton's own ptxas
(tests/gpu runs it)."""

import pytest
import torch

import fusionplan as fp
from fusionplan.runtime import tuning

from .test_gluon_nchw import layer, odd_plan
from .util import assert_each_expect_counts_its_load, compile_sm90, layer_build

pytest.importorskip("triton")
regs = pytest.importorskip("fusionplan.solvers.gluon_nchw_regs")
if regs.gluon_why_not():
    pytest.skip(regs.gluon_why_not(), allow_module_level=True)

H100_SMS = 132


def reason(plan, tf32: bool = True) -> str | None:
    return next(v for v in plan.explain(fp.Handle("cpu", allow_tf32=tf32)) if v.solver == "gluon-nchw-regs").reason


def deferred(plan) -> str | None:
    return regs.GluonNchwRegsSolver().defer_why(plan.spec(), fp.Handle("cpu"))


def test_why_not_names_what_is_missing():
    assert "needs a Hopper GPU" in reason(layer("r50_10"))  # the plan fits: only the device is missing
    assert "needs a Hopper GPU" in reason(layer("r50_10", torch.bfloat16))
    assert "FLOAT data: the register operand is written for 16-bit data" in reason(layer("r50_10", torch.float32))
    assert "grouped convolutions (groups=2)" in reason(odd_plan(32, 3, groups=2))
    assert "whole 16-byte units" in reason(odd_plan(3, 3))


@pytest.mark.parametrize(
    "name, why",
    [
        ("r50_10", None),  # 28x28 output planes, 3x3
        ("r50_06", None),  # strided to 28x28
        ("r50_16", "output planes of 196 pixels (< 784)"),
        ("r50_22", "output planes of 49 pixels (< 784)"),
        ("r50_21", "1x1 filters on grids too small for its 128 x 256 tile"),  # 26 programs of it
        ("r50_19", None),  # 1x1 to 7x7 planes, 2048 channels: 104 programs of 128 x 256
        ("r50_02", "output planes of 3136 pixels (> 784 for several taps)"),  # gluon-nchw's own limit
        ("r50_20", None),  # strided 1x1 to 7x7 planes: faster than triton-conv
        ("r50_14", "strided 1x1 filters on output planes of 196 pixels (> 49)"),
        ("r50_08", "strided 1x1 filters on output planes of 784 pixels (> 49)"),
    ],
)
def test_defers_where_gluon_nchw_measured_faster(name, why):
    found = deferred(layer(name))
    assert found == why if why is None else why in found


def test_takes_the_28x28_layers_by_default():
    plan = layer("r50_10")
    verdicts = {v.solver: v for v in plan.explain(fp.Handle("cpu"))}
    assert verdicts["gluon-nchw-regs"].reason and "Hopper" in verdicts["gluon-nchw-regs"].reason
    assert deferred(plan) is None and deferred(layer("r50_10", layout="NHWC"))  # channels-last: tensor boxes


def test_stride_1_1x1_filters_only_where_the_wide_tile_fills_the_gpu():
    assert "1x1 filters on grids too small" in deferred(layer("r50_21"))
    assert deferred(layer("r50_20")) is None  # strided 1x1: taken on its own rule


def test_tiles_and_rings():
    # r50_10: 25088 pixels x 128 channels -> 392 programs of 64 x 128, two warpgroups
    cfg = regs.regs_config(25088, 128, torch.float16, H100_SMS)
    assert (cfg.block_m, cfg.block_n, cfg.block_k, cfg.num_warps) == (64, 128, 64, 8)
    assert cfg.num_stages == tuning.GLUON_NCHW_REGS_STAGES
    # 64 output channels: a 64-channel tile (r50_02: 100352 pixels)
    cfg = regs.regs_config(100352, 64, torch.float16, H100_SMS)
    assert (cfg.block_m, cfg.block_n, cfg.num_warps) == (64, 64, 4)
    # a grid below half the multiprocessors takes the last tile that fits
    cfg = regs.regs_config(64, 256, torch.float16, H100_SMS)
    assert (cfg.block_m, cfg.block_n, cfg.num_warps) == regs.REGS_TILES[-1]
    cfg = regs.regs_config(64, 64, torch.float16, H100_SMS)
    assert (cfg.block_m, cfg.block_n) == (64, 64)
    with pytest.raises(ValueError, match="2 or more"):
        regs.ring_stages(1)


def test_wide_tile_for_one_tap(monkeypatch):
    """1x1 filters take 128 x 256 (two warpgroups along the pixels) where its grid fills half the
    GPU (r50_20: 1568 pixels x 2048 channels, 104 programs); filters of several taps never; the
    ring within tuning.GLUON_NCHW_RING_BYTES whatever stages are asked for."""
    cfg = regs.regs_config(1568, 2048, torch.float16, H100_SMS, taps=1)
    assert (cfg.block_m, cfg.block_n, cfg.num_warps) == regs.WIDE_1X1_TILE
    cfg = regs.regs_config(1568, 2048, torch.float16, H100_SMS, taps=9)
    assert (cfg.block_m, cfg.block_n, cfg.num_warps) == (64, 128, 8)
    # a grid below half the GPU, or output channels fewer than the tile's: the usual tiles
    assert regs.regs_config(256, 2048, torch.float16, H100_SMS, taps=1).block_m == 64
    assert regs.regs_config(25088, 128, torch.float16, H100_SMS, taps=1).block_n == 128
    monkeypatch.setattr(tuning, "GLUON_NCHW_REGS_STAGES", 8)
    cfg = regs.regs_tile(*regs.WIDE_1X1_TILE, 2)
    assert cfg.num_stages * cfg.block_n * 128 <= tuning.GLUON_NCHW_RING_BYTES
    assert regs.regs_tile(64, 128, 8, 2).num_stages == 8


@pytest.mark.parametrize("row", [64, 128])
def test_strided_filters_of_several_taps_take_shorter_steps(row, monkeypatch):
    """r50_06 (3x3, stride 2): steps of tuning.GLUON_NCHW_STRIDED_STEP_BYTES a pixel, the weights
    ring of tuning.GLUON_NCHW_REGS_STRIDED_STAGES stages where they are 64 bytes
    (GLUON_NCHW_REGS_STAGES where 128); stride 1 (r50_10) and the strided 1x1 r50_20 keep 128-byte
    steps."""
    monkeypatch.setattr(tuning, "GLUON_NCHW_STRIDED_STEP_BYTES", row)
    monkeypatch.setattr(tuning, "GLUON_NCHW_REGS_STRIDED_STAGES", 3)
    cfg = regs.regs_config(25088, 128, torch.float16, H100_SMS, taps=9, strided=True)
    assert (cfg.block_k, cfg.num_stages) == (row // 2, 3 if row == 64 else tuning.GLUON_NCHW_REGS_STAGES)
    assert regs.regs_config(25088, 128, torch.float16, H100_SMS, taps=9).block_k == 64
    assert regs.regs_config(1568, 2048, torch.float16, H100_SMS, taps=1, strided=True).block_k == 64


def test_sm90_kernel_takes_its_operand_from_registers():
    """The product reads the input operand from registers (matrix loads
    from the layout-change buffers, no wgmma of a shared input tile), weights by TMA, global loads,
    no spills, one product in flight at each step of the unrolled loop (the registers it reads are
    not kept past it)."""
    build = layer_build("r50_10", "float16", layout="NCHW")
    info = compile_sm90(build, "gluon-nchw-regs")
    assert info["HGMMA"] >= 4 and info["LDSM (operand through registers)"] >= 4
    assert info["tensor loads (UTMALDG)"] >= 2 and info["async copies (LDGSTS)"] == 0
    assert_each_expect_counts_its_load(info)  # the weights ring's boxes
    assert set(info["wgmma waits (outstanding groups allowed)"]) == {"0x0"}
    assert "STACK:0" in info["resources"] and "LOCAL:0" in info["resources"]


def test_loop_unrolled_where_the_accumulator_leaves_registers(monkeypatch):
    """Three steps' values a thread beside a 64-register share of the accumulator (64 x 128, four
    warps); not beside the 128 x 256 tile's 128 of 8 warps, nor with the switch off."""
    small, wide = tuning.ConvConfig(64, 128, 64, 8, 4, 4, 1), tuning.ConvConfig(128, 256, 64, 8, 8, 4, 1)
    assert regs.regs_unrolled(small) and not regs.regs_unrolled(wide)
    monkeypatch.setattr(tuning, "GLUON_NCHW_REGS_UNROLLED", 0)
    assert not regs.regs_unrolled(small)
