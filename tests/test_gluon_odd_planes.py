"""gluon-odd-planes without a GPU: which plans it takes and why not, its switch and tiles, the
arithmetic of its copies and products emulated with torch against the convolution, and its
generated kernel compiled for sm_90 with Triton's own ptxas (tests/test_gpu.py runs it)."""

import pytest
import torch

import fusionplan as fp
from fusionplan import tuning
from fusionplan.testing import add_chain

from .test_gluon_nchw import layer
from .util import compile_sm90, layer_build, plan_for

pytest.importorskip("triton")
odd = pytest.importorskip("fusionplan.solvers.gluon_odd_planes")
if odd.gluon_why_not():
    pytest.skip(odd.gluon_why_not(), allow_module_level=True)

H100_SMS = 132


def reason(plan) -> str | None:
    return next(v for v in plan.explain(fp.Handle("cpu")) if v.solver == "gluon-odd-planes").reason


def one_by_one(n=2, c=64, h=7, w=7, k=64, dtype=torch.float16, stride=1, pad=0, r=1, groups=1, layout="NCHW"):
    x = torch.empty(n, c, h, w, dtype=dtype)
    x = x.to(memory_format=torch.channels_last) if layout == "NHWC" else x
    conv = fp.ConvolutionDescriptor((pad, pad), (stride, stride), groups=groups)
    return add_chain(plan_for(x), "CBA", conv=conv, k=k, r=r, s=r, param_dtype="float")


def test_why_not_names_what_is_missing():
    assert "needs a Hopper GPU" in reason(layer("r50_21"))  # the plan fits: only the device is missing
    assert "needs a Hopper GPU" in reason(layer("r50_19", torch.bfloat16))
    assert "FLOAT data: the copies pair 16-bit pixels" in reason(layer("r50_21", torch.float32))
    assert "a 3x3 filter: 1x1 filters only" in reason(layer("r50_22"))
    assert "grouped convolutions (groups=2)" in reason(one_by_one(groups=2))
    assert "stride (2, 2)" in reason(layer("r50_20"))
    assert "packed NCHW planes only" in reason(layer("r50_21", layout="NHWC"))
    assert "planes of 196 pixels: gluon-gemm reads them" in reason(layer("r50_15"))
    assert "planes of 1 pixels: gluon-gemm reads them" in reason(one_by_one(h=1, w=1))
    assert "planes of 81 pixels: at most 63" in reason(one_by_one(h=9, w=9))
    assert "96 input and 64 output channels" in reason(one_by_one(c=96))
    assert "64 input and 80 output channels" in reason(one_by_one(k=80))


def test_off_until_measured(monkeypatch):
    solver = odd.GluonOddPlanesSolver()
    assert "off (tuning.GLUON_ODD_PLANES)" in solver.defer_why(layer("r50_21").spec(), fp.Handle("cpu"))
    monkeypatch.setattr(tuning, "GLUON_ODD_PLANES", True)
    assert solver.defer_why(layer("r50_21").spec(), fp.Handle("cpu")) is None


def test_tiles(monkeypatch):
    """128 output channels where that grid fills half the GPU (r50_19: 16 image pairs x 16), else 64
    (r50_21: 16 x 4 = 64 programs of 128 channels, so 128 of 64; 3x3 planes: 12 images a program);
    the switch sets it."""
    assert odd.odd_planes_config(32, 49, 2048, H100_SMS).block_n == 128
    cfg = odd.odd_planes_config(32, 49, 512, H100_SMS)
    assert (cfg.block_m, cfg.block_n, cfg.block_k, cfg.num_warps) == (odd.SLOTS, 64, odd.BLOCK_K, 4)
    assert cfg.num_stages == tuning.GLUON_ODD_PLANES_STAGES
    assert odd.odd_planes_config(32, 49, 320, H100_SMS).block_n == 64
    assert odd.odd_planes_config(132 * 12, 9, 128, H100_SMS).block_n == 128  # 132 programs of 12 images
    assert odd.odd_planes_config(132 * 5, 9, 128, H100_SMS).block_n == 64  # 55 programs of 128: below half
    monkeypatch.setattr(tuning, "GLUON_ODD_PLANES_BLOCK_N", 128)
    assert odd.odd_planes_config(32, 49, 512, H100_SMS).num_warps == 8
    assert [odd.images_per_program(hw) for hw in (49, 25, 9, 3)] == [2, 4, 12, 32]


def test_packed_weights_hold_each_blocks_even_channels_then_its_odd_ones():
    w = torch.arange(2 * 128, dtype=torch.float64).reshape(2, 128, 1, 1)
    block = [2 * i for i in range(32)] + [2 * i + 1 for i in range(32)]
    assert torch.equal(odd.pack_parity(w), w.reshape(2, 128)[:, block + [64 + c for c in block]])


def program_slots(n0: int, n: int, hw: int) -> tuple[list[int], list[bool]]:
    """The program of images n0..'s slots: each slot's image, and whether it is copied (its image in
    the batch, the slot within the program's images)."""
    stride, images = odd.slot_stride(hw), odd.images_per_program(hw)
    image = [n0 + slot // stride for slot in range(odd.SLOTS)]
    return image, [slot < images * stride and image[slot] < n for slot in range(odd.SLOTS)]


def parity_operands(x: torch.Tensor, n0: int) -> list[torch.Tensor]:
    """The program of images n0..'s operand of every channel block, [BLOCK_K, SLOTS] each, copied
    pair by pair as _copy_step computes the addresses: every copy whole (both slots live or
    neither, contiguous), 4-byte aligned and inside the input; slots not copied stay zero."""
    n, c, h, wd = x.shape
    hw, stride, half = h * wd, odd.slot_stride(h * wd), odd.BLOCK_K // 2
    flat = x.reshape(-1)
    image, live = program_slots(n0, n, hw)
    pixels = [image[slot] * c * hw + slot % stride for slot in range(odd.SLOTS)]
    operands = []
    for c0 in range(0, c, odd.BLOCK_K):
        operand = torch.zeros(odd.BLOCK_K, odd.SLOTS, dtype=torch.float64)
        for r in range(odd.BLOCK_K):
            parity = r // half
            row = (c0 + 2 * (r % half) + parity) * hw - parity
            for slot in range(0, odd.SLOTS, 2):  # a copy: slots (slot, slot + 1)
                assert live[slot] == live[slot + 1] and pixels[slot + 1] == pixels[slot] + 1
                if live[slot]:
                    start = row + pixels[slot]
                    assert start % 2 == 0 and 0 <= start and start + 1 < flat.numel()
                    operand[r, slot : slot + 2] = flat[start : start + 2]
        operands.append(operand)
    return operands


def store_slots(y: torch.Tensor, out: torch.Tensor, n0: int) -> None:
    """The program of images n0..'s stores into y [N, K, H*W]: slot s of out [K, SLOTS] where it
    holds a pixel of an image in the batch (the stores' mask)."""
    hw = y.shape[2]
    stride = odd.slot_stride(hw)
    image, live = program_slots(n0, y.shape[0], hw)
    for slot in range(odd.SLOTS):
        if slot % stride < hw and live[slot]:
            y[image[slot], :, slot % stride] = out[:, slot]


def emulate(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """The kernel's programs in float64: each step's operand as parity_operands copies it, the even
    rows' and odd rows' products apart over the packed weights, the odd one read a slot later, the
    stores' mask; unwritten outputs stay NaN."""
    n, c, h, wd = x.shape
    hw, k = h * wd, w.shape[0]
    packed, half = odd.pack_parity(w), odd.BLOCK_K // 2
    y = torch.full((n, k, hw), float("nan"), dtype=torch.float64)
    for n0 in range(0, n, odd.images_per_program(hw)):
        acc_even = torch.zeros(k, odd.SLOTS, dtype=torch.float64)
        acc_odd = torch.zeros_like(acc_even)
        for cb, operand in enumerate(parity_operands(x, n0)):
            c0 = cb * odd.BLOCK_K
            acc_even += packed[:, c0 : c0 + half] @ operand[:half]
            acc_odd += packed[:, c0 + half : c0 + odd.BLOCK_K] @ operand[half:]
        after = [min(slot + 1, odd.SLOTS - 1) for slot in range(odd.SLOTS)]
        store_slots(y, torch.relu(acc_even + acc_odd[:, after] + bias[:, None]), n0)
    return y.view(n, k, h, wd)


@pytest.mark.parametrize("n, c, side", [(3, 128, 7), (2, 64, 7), (5, 128, 5), (13, 64, 3)])
def test_parity_pairs_compute_the_convolution(n, c, side):
    """Odd batches (the last program's images partly absent), one and two steps, 7x7, 5x5 and 3x3
    planes: every output written, equal to relu(conv1x1 + bias)."""
    x = torch.randn(n, c, side, side, dtype=torch.float64)
    w = torch.randn(8, c, 1, 1, dtype=torch.float64)
    bias = torch.randn(8, dtype=torch.float64)
    y = emulate(x, w, bias)
    expected = torch.relu(torch.nn.functional.conv2d(x, w) + bias[None, :, None, None])
    assert not y.isnan().any()
    assert torch.allclose(y, expected)


@pytest.mark.parametrize("name, block_n", [("r50_21", 64), ("r50_19", 128)])
def test_sm90_kernel_copies_parity_pairs_and_runs_two_products_a_step(name, block_n):
    """r50_21 (one computing warpgroup) and r50_19 (two): two products a step (4 HGMMA of k16 in
    the code), the weights' two boxes a step, whose bytes the stage's barrier expects; 32 copies of
    4 bytes a copying thread a step; each channel's pixels stored 2 bytes a thread; every barrier
    invalidated; no spills."""
    info = compile_sm90(layer_build(name, "float16", layout="NCHW"), "gluon-odd-planes")
    assert info["HGMMA"] == 4 and info["tensor loads (UTMALDG)"] == 2
    assert info["async copies by bytes"] == {"4": 32}
    assert info["bytes barriers expect (TTGIR)"] == [2 * block_n * 32 * 2]
    assert info["global stores by bytes"] == {"2": 64}
    assert info["barriers invalidated (PTX mbarrier.inval)"] == info["barriers initialized (PTX mbarrier.init)"] > 0
    assert "STACK:0" in info["resources"] and "LOCAL:0" in info["resources"]
