"""gluon-column-pairs without a GPU: which plans it takes and why not, its switch and tiles, the
arithmetic of its column-pair copies and packed weights emulated with torch against the strided
convolution, and its generated kernel compiled for sm_90 with Triton's own ptxas (tests/test_gpu.py
runs it)."""

import pytest
import torch

import fusionplan as fp
from fusionplan import tuning
from fusionplan.testing import add_chain

from .test_gluon_nchw import layer
from .util import compile_sm90, layer_build, plan_for

pytest.importorskip("triton")
pairs = pytest.importorskip("fusionplan.solvers.gluon_column_pairs")
if pairs.gluon_why_not():
    pytest.skip(pairs.gluon_why_not(), allow_module_level=True)

H100_SMS = 132


def reason(plan) -> str | None:
    return next(v for v in plan.explain(fp.Handle("cpu")) if v.solver == "gluon-column-pairs").reason


def three_by_three(c=32, h=14, w=14, k=64, dtype=torch.float16, stride=2, pad=1, r=3, groups=1, dil=1):
    x = torch.empty(2, c, h, w, dtype=dtype)
    conv = fp.ConvolutionDescriptor((pad, pad), (stride, stride), (dil, dil), groups=groups)
    return add_chain(plan_for(x), "CBA", conv=conv, k=k, r=r, s=r, param_dtype="float")


def test_why_not_names_what_is_missing():
    for name in ("r50_06", "r50_12", "r50_18", "r50_10", "r50_16", "r50_02", "r50_08", "r50_14", "r50_20"):
        assert "needs a Hopper GPU" in reason(layer(name))  # the plan fits: only the device is missing
    assert "needs a Hopper GPU" in reason(layer("r50_18", torch.bfloat16))
    assert "FLOAT data: the copies pair 16-bit columns" in reason(layer("r50_18", torch.float32))
    assert "input rows of 7 pixels" in reason(layer("r50_22"))  # 7x7 planes
    assert "3x3 filters at stride 1 or 2 with padding 1, or 1x1 at stride 2" in reason(layer("r50_21"))  # 1x1 stride 1
    assert "or 1x1 at stride 2 without" in reason(three_by_three(dil=2, pad=2))
    assert "or 1x1 at stride 2 without" in reason(three_by_three(stride=3))
    assert "or 1x1 at stride 2 without" in reason(three_by_three(r=1, pad=1))
    assert "grouped convolutions (groups=2)" in reason(three_by_three(groups=2))
    assert "packed NCHW planes only" in reason(layer("r50_18", layout="NHWC"))
    assert "input rows of 15 pixels" in reason(three_by_three(w=15))
    assert "48 input and 64 output channels" in reason(three_by_three(c=48))
    assert "32 input and 96 output channels" in reason(three_by_three(k=96))


def test_off_until_measured(monkeypatch):
    solver = pairs.GluonColumnPairsSolver()
    assert "off (tuning.GLUON_COLUMN_PAIRS)" in solver.defer_why(layer("r50_18").spec(), fp.Handle("cpu"))
    monkeypatch.setattr(tuning, "GLUON_COLUMN_PAIRS", True)
    assert solver.defer_why(layer("r50_18").spec(), fp.Handle("cpu")) is None


def test_tiles():
    """The first tile whose grid fills half the GPU: r50_12 (6272 pixels x 256) 98 programs of 128 x
    128, r50_18 (1568 x 512) 100 of 64 x 128; 64 output channels take the 64-channel tile."""
    cfg = pairs.pairs_config(6272, 256, H100_SMS)
    assert (cfg.block_m, cfg.block_n, cfg.block_k, cfg.num_warps) == (128, 128, 64, 8)
    assert cfg.num_stages == tuning.GLUON_COLUMN_PAIRS_STAGES
    cfg = pairs.pairs_config(1568, 512, H100_SMS)
    assert (cfg.block_m, cfg.block_n, cfg.num_warps) == (64, 128, 4)
    assert pairs.pairs_config(100, 64, H100_SMS).block_n == 64  # a small grid: the last tile


@pytest.mark.parametrize("stages", [2, 3, 4, 6, 8])
def test_copies_announced_late_enough_to_run_and_early_enough_to_end(stages):
    """The copying side announces a step once it has issued announce_lag(stages, steps) later
    ones: the ring's protocol ends for any number of steps, every step is landed once and in order
    (one step of a 1x1 filter on 32 channels too: a lag of 2 there landed step -1, a barrier
    outside the ring), and one step more of lag would leave both sides waiting for ever (the stage
    it waits for frees only after that step's product)."""
    assert pairs.announce_lag(stages, 48) == min(2, stages - 2)
    for steps in (1, 2, 3, 5, 6, 48, 96):
        lag = pairs.announce_lag(stages, steps)
        assert pairs.pipeline_finishes(stages, lag, steps)
        assert pairs.landed_steps(steps, lag) == list(range(steps))
    assert not pairs.pipeline_finishes(stages, stages - 1, 48)
    assert pairs.landed_steps(1, 2) != [0]  # what the lag of 2 did on one step
    with pytest.raises(ValueError, match="2 or more"):
        pairs.announce_lag(1, 48)


def emulate(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor, stride: int, pixels: int) -> torch.Tensor:
    """The kernel's programs in float64: for each class of output columns (stride 1: even, odd;
    stride 2: all), each step's operand [pixels, 64] copied unit by unit as _copy_step computes the
    addresses (every unit 4-byte aligned and inside the input row, both its halves under one
    mask), the unused half zeroed as _land_step does, the product with the class's packed weights,
    the stores' mask and coordinates; unwritten outputs stay NaN. 3x3 filters with padding 1, or
    1x1 at stride 2."""
    n, c, h, wd = x.shape
    k, _, r, cols = w.shape
    pad, kinds = r // 2, pairs.unit_kinds(cols)
    oh_, ow_ = (h + 2 * pad - r) // stride + 1, (wd + 2 * pad - cols) // stride + 1
    classes = pairs.column_classes(stride)
    owc = ow_ // classes
    m_class, hw, sxn = n * oh_ * owc, h * wd, c * h * wd
    flat, packed = x.reshape(-1), pairs.pack_pairs(w, stride)
    steps = (c // pairs.STEP_CHANNELS) * r * kinds
    assert packed.shape == (classes * k, steps * pairs.BLOCK_K)
    y = torch.full((n, k, oh_, ow_), float("nan"), dtype=torch.float64)
    for par in range(classes):
        weights = packed[par * k : (par + 1) * k]
        for m0 in range(0, m_class, pixels):
            acc = torch.zeros(pixels, k, dtype=torch.float64)
            for kb in range(steps):
                cb, dh, kind = kb // (kinds * r), (kb // kinds) % r, kb % kinds
                operand = torch.zeros(pixels, pairs.BLOCK_K, dtype=torch.float64)
                for i in range(pixels):
                    m = m0 + i
                    image, pix = m // (oh_ * owc), m % (oh_ * owc)
                    ih = stride * (pix // owc) + dh - pad
                    col = 2 * (pix % owc) + 2 * kind * (2 * par - 1)
                    if not (m < m_class and 0 <= ih < h and 0 <= col < wd):
                        continue
                    assert col % 2 == 0 and col + 1 < wd  # both halves of the unit in the row
                    for e in range(0, pairs.BLOCK_K, 2):
                        start = image * sxn + (cb * pairs.STEP_CHANNELS + e // 2) * hw + ih * wd + col
                        assert start % 2 == 0 and start + 1 < flat.numel()
                        operand[i, e : e + 2] = flat[start : start + 2]
                        if kinds == 1:  # _land_step: the odd column zeroed
                            operand[i, e + 1] = 0.0
                        elif kind == 1:  # the column no tap reads zeroed
                            operand[i, e + par] = 0.0
                acc += operand @ weights[:, kb * pairs.BLOCK_K : (kb + 1) * pairs.BLOCK_K].T
            out = torch.relu(acc + bias[None, :])
            for i in range(pixels):
                m = m0 + i
                if m < m_class:  # the stores' mask, then the coordinates
                    y[m // (oh_ * owc), :, (m // owc) % oh_, (m % owc) * classes + par] = out[i]
    return y


@pytest.mark.parametrize(
    "n, c, h, w, r, stride, pixels",
    [
        (2, 32, 14, 14, 3, 2, 64),
        (1, 64, 8, 8, 3, 2, 128),
        (2, 32, 7, 10, 3, 2, 64),
        (2, 32, 6, 6, 3, 1, 64),
        (1, 64, 5, 8, 3, 1, 64),
        (2, 32, 14, 14, 1, 2, 64),
        (1, 64, 7, 6, 1, 2, 64),
    ],
)
def test_column_pairs_compute_the_convolution(n, c, h, w, r, stride, pixels):
    """3x3 at stride 2 (7x7 and 4x4 outputs, an odd input height: the last output row's third
    filter row past the input) and stride 1 (even and odd output columns apart, an odd height), 1x1
    at stride 2 (an odd height too), tiles across images with a partial last one, one and two
    channel blocks: every output written, equal to relu(conv + bias)."""
    x = torch.randn(n, c, h, w, dtype=torch.float64)
    weight = torch.randn(8, c, r, r, dtype=torch.float64)
    bias = torch.randn(8, dtype=torch.float64)
    y = emulate(x, weight, bias, stride, pixels)
    conv = torch.nn.functional.conv2d(x, weight, stride=stride, padding=r // 2)
    expected = torch.relu(conv + bias[None, :, None, None])
    assert not y.isnan().any()
    assert torch.allclose(y, expected)


@pytest.mark.parametrize("r, stride", [(3, 1), (3, 2), (1, 2)])
def test_non_finite_input_reaches_only_the_windows_that_hold_it(r, stride):
    """An Inf and a NaN in the input (even and odd columns, inside and at a row's end): the outputs
    whose windows hold them are non-finite, every other output finite and equal to the
    convolution's, as with the unused halves zeroed (without, 0 x Inf would be NaN beside them)."""
    x = torch.randn(2, 32, 6, 8, dtype=torch.float64)
    x[0, 3, 2, 4] = float("inf")
    x[1, 7, 5, 7] = float("nan")
    x[1, 30, 0, 2] = float("-inf")
    x[0, 5, 2, 3] = float("inf")  # an odd column: read by 1x1 filters at stride 2 only as a unit's other half
    weight = torch.randn(8, 32, r, r, dtype=torch.float64)
    bias = torch.randn(8, dtype=torch.float64)
    y = emulate(x, weight, bias, stride, 64)
    conv = torch.nn.functional.conv2d(x, weight, stride=stride, padding=r // 2)
    expected = torch.relu(conv + bias[None, :, None, None])
    finite = torch.isfinite(expected)
    assert (~finite).any() and finite.any()
    assert torch.equal(torch.isfinite(y), finite)
    assert torch.allclose(y[finite], expected[finite])


@pytest.mark.parametrize("name, copies", [("r50_18", 16), ("r50_12", 32), ("r50_16", 32), ("r50_08", 32)])
def test_sm90_kernel_copies_column_pairs(name, copies):
    """r50_18 (64 x 128 tiles), r50_12, the stride-1 r50_16 and the 1x1 r50_08 (128 x 128): one product a step (4
    HGMMA of k16) with one in flight, the weights' box a step whose bytes the stage's barrier
    expects, each copying thread's copies of 4 bytes a step, the output stored 2 bytes a thread
    along the planes, every barrier invalidated, no spills."""
    info = compile_sm90(layer_build(name, "float16", layout="NCHW"), "gluon-column-pairs")
    assert info["HGMMA"] == 4 and info["wgmma waits (outstanding groups allowed)"] == ["0x1", "0x0"]
    assert info["bytes barriers expect (TTGIR)"] == info["tensor loads' box bytes (TTGIR)"] == [128 * 128]
    assert info["async copies by bytes"] == {"4": copies}
    assert info["global stores by bytes"] == {"2": 64}
    assert info["barriers invalidated (PTX mbarrier.inval)"] == info["barriers initialized (PTX mbarrier.init)"] > 0
    assert "STACK:0" in info["resources"] and "LOCAL:0" in info["resources"]


def test_two_programs_a_multiprocessor_where_the_registers_allow():
    """Registers for two programs of 8 warps (64-pixel tiles and the 4 copying warps): 128 a thread;
    at 12 warps the 85 left are fewer than the copying warps take: none."""
    assert pairs.two_programs_registers(8) == 128
    assert pairs.two_programs_registers(12) is None


def test_sm90_kernel_of_many_waves_fits_two_programs_a_multiprocessor():
    """r50_02 (1568 programs of 64 x 64 pixels, far more than a wave): compiled for 128 registers a
    thread (Triton would give its 8 warps 255, one program a multiprocessor), no spills; the
    copying warps hold their registers (the computing ones take the rest of the 128 x 8 warps)."""
    info = compile_sm90(layer_build("r50_02", "float16", layout="NCHW"), "gluon-column-pairs")
    assert "REG:128" in info["resources"]
    assert "STACK:0" in info["resources"] and "LOCAL:0" in info["resources"]
    assert info["async copies by bytes"] == {"4": 16}
