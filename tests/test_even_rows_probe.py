"""The even-rows probe (bench/gluon/even_rows_gemm.py) without a GPU: its boxes of even input rows
(TMA's zero fill past the row), seen as wgmma's operand along the pixels, the product over every
column and the even columns kept, emulated with torch against the strided 1x1 convolution; its
kernel compiled for sm_90."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from .util import compiling_process

BENCH = Path(__file__).parent.parent / "bench" / "gluon"
sys.path.insert(0, str(BENCH))

pytest.importorskip("triton")
probe = pytest.importorskip("even_rows_gemm")


@pytest.mark.parametrize("layer, pixels", [("r50_08", 128), ("r50_14", 128), ("r50_14", 256), ("r50_08", 64)])
def test_even_row_boxes_compute_the_strided_convolution(layer, pixels):
    """Per program (R output rows of an image) and step: the box [R, 64 channels, WB columns] of the
    input seen as [OH, N * C, W] with strides [2W, H * W, 1], its R chunks side by side as the
    operand [64, R * WB], times the filter's step; the even columns of the product, at output row
    oh0 + j // (WB / 2) and column j % (WB / 2), equal the convolution with stride 2 on every pixel."""
    base = probe.GEOMETRIES[layer]
    geo = probe.Geometry(base.w, base.oh, base.ow, pixels)
    assert geo.why_not() is None
    n, c, k = 2, 2 * probe.BLOCK_K, 8
    h = w_in = geo.w
    x = torch.randn(n, c, h, w_in, dtype=torch.float64)
    w = torch.randn(k, c, dtype=torch.float64)
    view = x.as_strided((geo.oh, n * c, w_in), (2 * w_in, h * w_in, 1))
    padded = torch.zeros(geo.tiles_h * geo.rows, n * c, geo.wb, dtype=torch.float64)  # TMA's zero fill
    padded[: geo.oh, :, :w_in] = view
    y = torch.full((n, k, geo.oh, geo.ow), float("nan"), dtype=torch.float64)
    half = geo.wb // 2
    for tile in range(n * geo.tiles_h):
        img, oh0 = tile // geo.tiles_h, (tile % geo.tiles_h) * geo.rows
        acc = torch.zeros(k, geo.pixels, dtype=torch.float64)
        for i in range(c // probe.BLOCK_K):
            planes = slice(img * c + i * probe.BLOCK_K, img * c + (i + 1) * probe.BLOCK_K)
            box = padded[oh0 : oh0 + geo.rows, planes]  # [R, 64, WB]
            operand = box.permute(1, 0, 2).reshape(probe.BLOCK_K, geo.pixels)  # the chunks side by side
            acc += w[:, i * probe.BLOCK_K : (i + 1) * probe.BLOCK_K] @ operand
        even = acc.reshape(k, geo.pixels // 2, 2)[:, :, 0]
        for j in range(geo.pixels // 2):
            oh, ow = oh0 + j // half, j % half
            if oh < geo.oh and ow < geo.ow:  # the stores' mask
                y[img, :, oh, ow] = even[:, j]
    expected = torch.nn.functional.conv2d(x, w[:, :, None, None], stride=2)
    assert not y.isnan().any()
    assert torch.allclose(y, expected)


def test_row_pairs_stride_must_be_whole_16_byte_units():
    assert probe.Geometry(56, 28, 28).why_not() is None
    assert "not a multiple of 16" in probe.Geometry(14, 7, 7).why_not()  # r50_20: 56-byte row pairs


@pytest.mark.parametrize("row_boxes", [False, True])
def test_even_rows_probe_compiles_for_sm90(row_boxes):
    """Both layers' kernels: the input's box (or a box per output row: r50_08's 2, r50_14's 4) and the
    weights' a step, their bytes what the stage's barrier expects, a product of 64 channels a step
    in each computing warpgroup (8 HGMMA), no shuffles, the even columns stored 8 bytes a thread
    on 28-pixel rows (4 on 14), no spills, two programs a multiprocessor in shared memory."""
    args = [str(BENCH / "even_rows_gemm.py"), "--sass"] + (["--row-boxes"] if row_boxes else [])
    summaries = [line for line in compiling_process(args).splitlines() if "even rows" in line]
    assert [line.split()[0] for line in summaries] == ["r50_08", "r50_14"]
    for line, store, loads in zip(summaries, ("{8: 16}", "{4: 32}"), (3, 5) if row_boxes else (2, 2)):
        assert "'HGMMA': 8" in line and f"'UTMALDG': {loads}" in line and "'SHFL': 0" in line
        assert f"stores by bytes {store}" in line and "STACK:0" in line and "expects [32768] boxes 32768" in line
        assert int(line.split("shared ")[1].split()[0]) <= 113 * 1024


def test_a_stage_is_the_box_and_the_operand_at_once():
    """The probe's stage [R * 64, WB] (rows of WB * 2 bytes, swizzled as wide): every shared-memory
    offset holds the same element seen as the box [R, 64, WB] (the descriptor's rank-3 layout, which
    TMA fills) and as wgmma's operand [64, R * WB] (channel c, pixel r * WB + col), by Triton's linear
    layouts of the three (even_rows_gemm.py --check-layouts, a process of its own)."""
    done = subprocess.run(
        [sys.executable, str(BENCH / "even_rows_gemm.py"), "--check-layouts"], capture_output=True, text=True
    )
    if "cannot give" in done.stdout or "Expected input dimension 0 to be 'register'" in done.stderr:
        # Triton 3.6 builds linear layouts of distributed layouts only (it aborts on shared ones)
        pytest.skip("this Triton cannot give a shared layout's linear layout")
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["agree", "64x2", "agree", "32x4", "agree", "64x4"]
