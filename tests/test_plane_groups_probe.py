"""The plane-groups probes (bench/gluon/plane_groups.py, plane_groups_gemm.py) without a GPU: their
boxes, moves (gluon_rows.move_function, tested in test_gluon_rows.py) and residue-packed filter
emulated with torch against a 1x1 convolution, and their kernels compiled for sm_90; the
accumulator-shift probe (bench/gluon/shift_gather.py) compiled for sm_90."""

import sys
from pathlib import Path

import pytest
import torch

from .util import compiling_process

BENCH = Path(__file__).parent.parent / "bench" / "gluon"
sys.path.insert(0, str(BENCH))

pytest.importorskip("triton")
probe = pytest.importorskip("plane_groups_gemm")


@pytest.mark.parametrize("plane, hw", [(196, (14, 14)), (49, (7, 7))])
def test_plane_group_boxes_compute_the_convolution(plane, hw):
    """The probe's geometry in torch: each step's boxes of plane groups (TMA's zero fill past the
    row), each residue's part moved by its shift (the next box shifted in where the part reaches
    it), times the filter packed by residue, equals the 1x1 convolution on every pixel."""
    geo = probe.GEOMETRIES[plane]
    g, n, c, k = geo.residues, 2, 2 * geo.groups * geo.residues, 8
    x = torch.randn(n, c, *hw, dtype=torch.float64)
    w = torch.randn(k, c, dtype=torch.float64)
    rows = x.reshape(n * c // g, g * plane)
    padded = torch.zeros(rows.shape[0], max(geo.columns()) + 64, dtype=torch.float64)
    padded[:, : g * plane] = rows
    by_residue = w.reshape(k, c // g, g).permute(2, 0, 1)
    y = torch.zeros(n, k, 64 * geo.parts, dtype=torch.float64)

    def box(r0, col):
        assert col in geo.columns()  # a box the probe's loading warp brings
        return padded[r0 : r0 + geo.groups, col : col + 64]

    for img in range(n):
        for i in range(c // (g * geo.groups)):
            r0 = img * (c // g) + i * geo.groups

            for q in range(geo.parts):
                for j in range(g):
                    col = geo.start(j) + 64 * q
                    b = box(r0, col)
                    if geo.shift(j):
                        after = box(r0, col + 64) if geo.fills(j, q) else torch.zeros_like(b)
                        b = torch.cat((b, after), 1)[:, geo.shift(j) : geo.shift(j) + 64]
                    y[img, :, 64 * q : 64 * q + 64] += by_residue[j][:, i * geo.groups : (i + 1) * geo.groups] @ b
    expected = torch.einsum("kc,ncp->nkp", w, x.reshape(n, c, plane))
    assert torch.allclose(y[:, :, :plane], expected)


def test_probe_kernels_compile_for_sm90():
    """Both probes' kernels: no shuffles; the plane-groups GEMM's products wait once a step in each
    computing warpgroup, without spills."""
    out = compiling_process([str(BENCH / "plane_groups.py"), "--sass"])
    assert "'SHFL': 0" in out.splitlines()[-1]
    lines = compiling_process([str(BENCH / "plane_groups_gemm.py"), "--sass"]).splitlines()
    summaries = [line for line in lines if "planes:" in line]
    assert len(summaries) == 2
    for line in summaries:
        assert "'SHFL': 0" in line and "waits 2" in line and "STACK:0" in line


def test_accumulator_shift_probe_stays_in_registers():
    """bench/gluon/shift_gather.py: an accumulator part moved by 4 columns (its neighbour's first
    columns moved in) compiles for sm_90 to warp shuffles alone, no shared memory, for the parts of
    64, 32 and 8 columns."""
    lines = [line for line in compiling_process([str(BENCH / "shift_gather.py"), "--sass"]).splitlines() if line]
    assert [line.split(":")[0] for line in lines] == ["width 64", "width 32", "width 8"]
    for line in lines:
        assert "'LDS': 0" in line and "'STS': 0" in line and "'SHFL': 0" not in line


def test_plane_pair_boxes_compute_the_convolution():
    """bench/gluon/plane_pairs_gemm.py's geometry in torch: per half-image tile and step, the even
    planes' boxes at the tile's columns and the odd planes' 4 pixels early (TMA's zero fill past the
    pair row), each parity times its half of the filter packed by parity, the odd parts moved 4
    columns left with the next part's (the neighbour box's) first columns; every pixel equals the
    1x1 convolution."""
    pairs_probe = pytest.importorskip("plane_pairs_gemm")
    plane, n, c, k = pairs_probe.PLANE, 2, 4 * pairs_probe.PAIRS, 8
    x = torch.randn(n, c, 14, 14, dtype=torch.float64)
    w = torch.randn(k, c, dtype=torch.float64)
    packed = pairs_probe.pack_by_parity(w)
    rows = x.reshape(n * c // 2, 2 * plane)
    padded = torch.zeros(rows.shape[0], 512, dtype=torch.float64)
    padded[:, : 2 * plane] = rows
    y = torch.zeros(n, k, 2 * pairs_probe.TILE, dtype=torch.float64)
    start, parts, offsets = pairs_probe.ODD_START, pairs_probe.PARTS, pairs_probe.offsets()
    assert start % 8 == 0 and all(off % 8 == 0 for off in offsets)  # boxes start at 16-byte units
    for img in range(n):
        for p0 in (0, pairs_probe.TILE):
            even = [torch.zeros(k, width, dtype=torch.float64) for width in parts]
            odd = [torch.zeros(k, width, dtype=torch.float64) for width in parts]
            nb = torch.zeros(k, pairs_probe.NEIGHBOUR, dtype=torch.float64)
            for i in range(c // (2 * pairs_probe.PAIRS)):
                r = slice(img * c // 2 + i * pairs_probe.PAIRS, img * c // 2 + (i + 1) * pairs_probe.PAIRS)
                cols = slice(r.start - img * c // 2, r.stop - img * c // 2)
                w_even, w_odd = packed[:k, cols], packed[k:, cols]
                for q, (width, off) in enumerate(zip(parts, offsets)):
                    even[q] += w_even @ padded[r, p0 + off : p0 + off + width]
                    odd[q] += w_odd @ padded[r, start + p0 + off : start + p0 + off + width]
                after = start + p0 + pairs_probe.TILE
                nb += w_odd @ padded[r, after : after + pairs_probe.NEIGHBOUR]
            for q, (width, off) in enumerate(zip(parts, offsets)):
                nxt = odd[q + 1] if q + 1 < len(parts) else nb
                moved = torch.cat((odd[q], nxt), 1)[:, pairs_probe.SHIFT : pairs_probe.SHIFT + width]
                y[img, :, p0 + off : p0 + off + width] = even[q] + moved
    expected = torch.einsum("kc,ncp->nkp", w, x.reshape(n, c, plane))
    assert torch.allclose(y[:, :, :plane], expected)


def test_plane_pairs_probe_compiles_for_sm90():
    """The plane-pairs probe: 9 tensor loads a step (3 parts of each parity, the neighbour, the two
    filter halves) whose boxes are what the stage's barrier expects, 7 products of 32 channels in
    each computing warpgroup (28 HGMMA), 8-byte stores, no spills, within sm_90's shared memory."""
    line = compiling_process([str(BENCH / "plane_pairs_gemm.py"), "--sass"]).splitlines()[-1]
    assert "'HGMMA': 28" in line and "'UTMALDG': 9" in line and "{8: " in line
    assert "LOCAL:0" in line and "STACK:0" in line
    expects, boxes = line.split("expects ")[1].split(" boxes ")
    assert expects.strip() == f"[{int(boxes)}]"
    assert int(line.split("shared ")[1].split()[0]) <= 232448
