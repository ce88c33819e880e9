"""gluon-odd-windows without a GPU: which plans it takes and why not, its switch, the arithmetic
of its taps in turn (gluon-odd-planes' channel-parity copies held whole, each tap's sums added
shifted into the output) emulated with torch against the convolution, and its generated kernel
compiled for sm_90 with Triton's own ptxas (tests/test_gpu.py runs it)."""

import pytest
import torch

import fusionplan as fp
from fusionplan import tuning
from fusionplan.testing import add_chain

from .test_gluon_nchw import layer
from .test_gluon_odd_planes import parity_operands, store_slots
from .util import compile_sm90, layer_build, plan_for

pytest.importorskip("triton")
windows = pytest.importorskip("fusionplan.solvers.gluon_odd_windows")
odd = pytest.importorskip("fusionplan.solvers.gluon_odd_planes")
if windows.gluon_why_not():
    pytest.skip(windows.gluon_why_not(), allow_module_level=True)


def reason(plan) -> str | None:
    return next(v for v in plan.explain(fp.Handle("cpu")) if v.solver == "gluon-odd-windows").reason


def three_by_three(c=64, h=7, w=7, k=64, stride=1, pad=1, groups=1, dtype=torch.float16):
    x = torch.empty(2, c, h, w, dtype=dtype)
    conv = fp.ConvolutionDescriptor((pad, pad), (stride, stride), groups=groups)
    return add_chain(plan_for(x), "CBA", conv=conv, k=k, r=3, s=3, param_dtype="float")


def test_why_not_names_what_is_missing():
    assert "needs a Hopper GPU" in reason(layer("r50_22"))  # the plan fits: only the device is missing
    assert "needs a Hopper GPU" in reason(layer("r50_22", torch.bfloat16))
    assert "FLOAT data" in reason(layer("r50_22", torch.float32))
    assert "3x3 at stride 1 with padding 1 only" in reason(layer("r50_18"))  # stride 2
    assert "3x3 at stride 1 with padding 1 only" in reason(layer("r50_21"))  # 1x1
    assert "grouped convolutions (groups=2)" in reason(three_by_three(groups=2))
    assert "packed NCHW planes only" in reason(layer("r50_22", layout="NHWC"))
    assert "planes of 196 pixels: an odd number" in reason(layer("r50_16"))
    assert "planes of 81 pixels" in reason(three_by_three(h=9, w=9))
    assert "1024 input and 64 output channels: at most 512" in reason(three_by_three(c=1024))
    assert "96 input" in reason(three_by_three(c=96))


def test_off_until_measured(monkeypatch):
    solver = windows.GluonOddWindowsSolver()
    assert "off (tuning.GLUON_ODD_WINDOWS)" in solver.defer_why(layer("r50_22").spec(), fp.Handle("cpu"))
    monkeypatch.setattr(tuning, "GLUON_ODD_WINDOWS", True)
    assert solver.defer_why(layer("r50_22").spec(), fp.Handle("cpu")) is None


def test_packed_taps_hold_each_taps_channels_in_parity_order():
    w = torch.randn(3, 128, 3, 3, dtype=torch.float64)
    packed = windows.pack_taps(w)
    assert packed.shape == (3, 9 * 128)
    for t in range(9):
        tap = w[:, :, t // 3, t % 3]
        assert torch.equal(packed[:, t * 128 : (t + 1) * 128], odd.pack_parity(tap[:, :, None, None]))


def emulate(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """The kernel's programs in float64: the images' planes copied once as gluon-odd-planes' copies
    do (parity_operands), per tap the even rows' and odd rows' products over the packed weights,
    then out[s] += even[s + o] + odd[s + o + 1] (o the tap's offset in slots) where the tap's input
    pixel is inside the image, as selects; the stores' mask; unwritten outputs stay NaN."""
    n, c, h, wd = x.shape
    hw, k = h * wd, w.shape[0]
    stride, packed, half, slots = odd.slot_stride(hw), windows.pack_taps(w), odd.BLOCK_K // 2, odd.SLOTS
    y = torch.full((n, k, hw), float("nan"), dtype=torch.float64)
    for n0 in range(0, n, odd.images_per_program(hw)):
        operands = parity_operands(x, n0)
        out = torch.zeros(k, slots, dtype=torch.float64)
        for t in range(9):
            dh, dw = t // 3, t % 3
            even = torch.zeros(k, slots, dtype=torch.float64)
            odd_sums = torch.zeros_like(even)
            for cb, operand in enumerate(operands):
                col = t * c + cb * odd.BLOCK_K
                even += packed[:, col : col + half] @ operand[:half]
                odd_sums += packed[:, col + half : col + odd.BLOCK_K] @ operand[half:]
            for s in range(slots):
                p = s % stride
                ih, iw = p // wd + dh - 1, p % wd + dw - 1
                if p < hw and 0 <= ih < h and 0 <= iw < wd:
                    src = min(max(s + (dh - 1) * wd + (dw - 1), 0), slots - 2)
                    out[:, s] += even[:, src] + odd_sums[:, src + 1]
        store_slots(y, torch.relu(out + bias[:, None]), n0)
    return y.view(n, k, h, wd)


@pytest.mark.parametrize("n, c, side", [(3, 128, 7), (2, 64, 5), (13, 64, 3)])
def test_taps_in_turn_compute_the_convolution(n, c, side):
    """7x7, 5x5 and 3x3 planes, odd batches (the last program's images partly absent), one and two
    channel blocks, with an Inf in one plane: every output written, the non-finite ones exactly
    where the convolution's are, the rest equal to relu(conv3x3 padding 1 + bias)."""
    x = torch.randn(n, c, side, side, dtype=torch.float64)
    x[0, 3, side // 2, side - 1] = float("inf")
    weight = torch.randn(8, c, 3, 3, dtype=torch.float64)
    bias = torch.randn(8, dtype=torch.float64)
    y = emulate(x, weight, bias)
    expected = torch.relu(torch.nn.functional.conv2d(x, weight, padding=1) + bias[None, :, None, None])
    finite = torch.isfinite(expected)
    assert not y.isnan().all() and torch.equal(torch.isfinite(y), finite) and (~finite).any()
    assert torch.allclose(y[finite], expected[finite])


def test_sm90_kernel_takes_the_taps_in_turn():
    """r50_22: two products a step (4 HGMMA of k16 in the code), the weights' two boxes a step whose
    bytes the stage's barrier expects, 32 copies of 4 bytes a copying thread a block, each channel's
    pixels stored 2 bytes a thread, every barrier invalidated, within the shared memory, a spill of
    at most 160 bytes."""
    info = compile_sm90(layer_build("r50_22", "float16", layout="NCHW"), "gluon-odd-windows")
    assert info["HGMMA"] == 4 and info["async copies by bytes"] == {"4": 32}
    assert info["bytes barriers expect (TTGIR)"] == [2 * 64 * 32 * 2]
    assert info["global stores by bytes"] == {"2": 32}  # 64 channels x 128 slots over 8 warps
    assert info["barriers invalidated (PTX mbarrier.inval)"] == info["barriers initialized (PTX mbarrier.init)"] > 0
    assert info["shared bytes (dynamic)"] <= 232448 and "LOCAL:0" in info["resources"]
    assert int(info["resources"].split("STACK:")[1].split()[0]) <= 160  # a small spill (COPY_REGS)
