"""The odd-planes probe (bench/gluon/odd_planes_gemm.py) without a GPU: its 4-byte copies of NCHW
planes of an odd pixel count (the channels split by parity, odd channels' copies an element
early), the two products per step and the odd rows' product shifted by a slot, emulated with
torch against the 1x1 convolution; its kernel compiled for sm_90."""

import sys
from pathlib import Path

import pytest
import torch

from .util import compiling_process

BENCH = Path(__file__).parent.parent / "bench" / "gluon"
sys.path.insert(0, str(BENCH))

pytest.importorskip("triton")
probe = pytest.importorskip("odd_planes_gemm")


def emulate(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor, geo) -> torch.Tensor:
    """The probe's programs in float64: each step's operand copied pair by pair as _copy_step does
    (every copy checked whole, 4-byte aligned and inside the input), the even rows' and odd rows'
    products apart, the odd one read a slot later, the stores' mask; unwritten outputs stay NaN."""
    n, c, h, wd = x.shape
    k = w.shape[0]
    flat = x.reshape(-1)
    packed = probe.pack_weights(w)
    y = torch.full((n, k, h, wd), float("nan"), dtype=torch.float64)
    y_flat = y.view(n, k, h * wd)
    for n0 in range(0, n, geo.images):
        offsets, live = probe.slot_pixels(geo, n0, c, n)
        acc_even = torch.zeros(k, probe.SLOTS, dtype=torch.float64)
        acc_odd = torch.zeros_like(acc_even)
        for c0 in range(0, c, probe.BLOCK_K):
            channels, shifts = probe.operand_rows(c0)
            operand = torch.zeros(probe.BLOCK_K, probe.SLOTS, dtype=torch.float64)
            for r, (channel, shift) in enumerate(zip(channels, shifts)):
                row = channel * geo.hw - shift
                for slot in range(0, probe.SLOTS, 2):  # a copy: slots (slot, slot + 1)
                    assert live[slot] == live[slot + 1] and offsets[slot + 1] == offsets[slot] + 1
                    if live[slot]:
                        start = row + offsets[slot]
                        assert start % 2 == 0 and 0 <= start and start + 1 < flat.numel()
                        operand[r, slot : slot + 2] = flat[start : start + 2]
            acc_even += packed[:, c0 : c0 + probe.HALF] @ operand[: probe.HALF]
            acc_odd += packed[:, c0 + probe.HALF : c0 + probe.BLOCK_K] @ operand[probe.HALF :]
        after = [min(slot + 1, probe.SLOTS - 1) for slot in range(probe.SLOTS)]
        out = torch.relu(acc_even + acc_odd[:, after] + bias[:, None])
        for slot in range(probe.SLOTS):
            image, pixel = n0 + slot // geo.stride, slot % geo.stride
            if pixel < geo.hw and slot < geo.images * geo.stride and image < n:  # the stores' mask
                y_flat[image, :, pixel] = out[:, slot]
    return y


@pytest.mark.parametrize("n, c, side", [(3, 128, 7), (2, 64, 7), (4, 128, 5), (1, 64, 3)])
def test_odd_plane_copies_compute_the_convolution(n, c, side):
    """Odd batches (the last program's second image absent), one and two steps, 7x7, 5x5 and 3x3
    planes: every output written, equal to relu(conv1x1 + bias)."""
    geo = probe.Geometry(side * side)
    assert geo.why_not(c, 64) is None
    x = torch.randn(n, c, side, side, dtype=torch.float64)
    w = torch.randn(8, c, dtype=torch.float64)
    bias = torch.randn(8, dtype=torch.float64)
    y = emulate(x, w, bias, geo)
    expected = torch.relu(torch.nn.functional.conv2d(x, w[:, :, None, None]) + bias[None, :, None, None])
    assert not y.isnan().any()
    assert torch.allclose(y, expected)


def test_packed_weights_hold_each_blocks_even_channels_then_its_odd_ones():
    w = torch.arange(2 * 128, dtype=torch.float64).reshape(2, 128)
    channels = probe.operand_rows(0)[0] + probe.operand_rows(64)[0]
    assert torch.equal(probe.pack_weights(w), w[:, channels])


def test_why_not():
    assert probe.Geometry(49).why_not(2048, 512) is None
    assert "4-byte units" in probe.Geometry(196).why_not()
    assert "exceed" in probe.Geometry(81).why_not()  # 9x9: two images of 82 slots
    assert "multiples" in probe.Geometry(49).why_not(96, 64)


def test_odd_planes_probe_compiles_for_sm90():
    """One and two computing warpgroups: two products a step in each (4 HGMMA of k16), the weights'
    two boxes a step whose bytes the stage's barrier expects, 32 copies of 4 bytes a copying thread
    a step, each channel's pixels stored 2 bytes a thread, no spills."""
    lines = [
        line
        for line in compiling_process([str(BENCH / "odd_planes_gemm.py"), "--sass"]).splitlines()
        if "odd planes" in line
    ]
    assert len(lines) == 2
    for line, consumers in zip(lines, (1, 2)):
        assert f"'HGMMA': {4 * consumers}" in line and "'UTMALDG': 2" in line, line
        assert "copies by bytes {4: 32}" in line and f"expects [{8192 * consumers}]" in line, line
        assert f"stores by bytes {{2: {64 * consumers}}}" in line and "STACK:0" in line and "LOCAL:0" in line, line
