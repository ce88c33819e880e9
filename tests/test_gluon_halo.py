"""gluon-halo without a GPU: which plans it takes and why not, its halo's geometry, the kernel's
halo rows and shifted tap views emulated with torch against the convolution (stride 1 and the four
phases of stride 2, odd planes), and its generated kernel compiled for sm_90 with Triton's own ptxas
(tests/gpu runs it)."""

import pytest
import torch

import fusionplan as fp
from fusionplan.tools.shapes import resnet50_layer
from fusionplan.tools.verify import add_chain

from .test_gluon_nchw import layer
from .test_sass import GRID_DEPENDENCY_ON
from .util import compile_sm90, layer_build, plan_for

pytest.importorskip("triton")
halo = pytest.importorskip("fusionplan.solvers.gluon_halo")
gluon = pytest.importorskip("fusionplan.solvers.gluon_window")
if gluon.gluon_why_not():
    pytest.skip(gluon.gluon_why_not(), allow_module_level=True)


def conv_plan(c: int, h: int, w: int, k: int = 64, dtype=torch.float16, r: int = 3, stride: int = 1, dil: int = 1):
    x = torch.empty(2, c, h, w, dtype=dtype)
    conv = fp.ConvolutionDescriptor((r // 2 * dil, r // 2 * dil), (stride, stride), (dil, dil))
    return add_chain(plan_for(x), "CBA", conv=conv, k=k, r=r, s=r, param_dtype="float")


def reason(plan) -> str | None:
    return next(v for v in plan.explain(fp.Handle("cpu")) if v.solver == "gluon-halo").reason


#: What a plan the kernel fits is told here: a Hopper GPU is missing, or (Triton 3.9) the views.
FITS = "needs a Hopper GPU" if halo.shifted_views_why_not() is None else "refuses shared-memory views shifted"
#: The sm_90 compilations need a Triton whose Gluon takes the shifted views.
needs_shifted_views = pytest.mark.skipif(halo.shifted_views_why_not() is not None, reason="this Triton's Gluon")


def test_why_not_names_what_is_missing():
    for name in ("r50_22", "r50_18", "r50_16", "r50_12", "r50_10", "r50_06"):
        assert FITS in reason(layer(name))  # the plan fits: only the device (or the Triton) is missing
    assert FITS in reason(layer("r50_22", torch.bfloat16))
    assert "FLOAT data: the halo's rows are 64 channels of 16-bit data" in reason(layer("r50_22", torch.float32))
    assert "a 1x1 filter, padding (0, 0)" in reason(layer("r50_21"))
    assert "the halo is gathered from packed NCHW planes" in reason(layer("r50_22", layout="NHWC"))
    assert "C=40: the halo's channel blocks are 64 channels" in reason(conv_plan(40, 7, 7))
    assert "dilation (2, 2)" in reason(conv_plan(64, 9, 9, dil=2))
    assert "a 5x5 filter" in reason(conv_plan(64, 9, 9, r=5))
    assert "stride (3, 3)" in reason(conv_plan(64, 9, 9, stride=3))
    assert "output rows of 130 pixels" in reason(conv_plan(64, 4, 130))


def test_wide_strided_planes_that_do_not_fit_say_why():
    """Stride 2 onto rows of 100 pixels: the four phases of one output row (a pitch of 101) need halos
    that do not fit the shared memory beside any ring in 128-slot tiles, and 64 slots cannot hold
    a row: the plan is refused with the bytes, never given a tile of no rows."""
    plan = conv_plan(64, 8, 200, stride=2)
    assert "bytes of shared memory" in halo.halo_why_not(plan.spec())
    assert halo.halo_config(plan.spec()).block_m == 128


def test_in_the_registry_before_the_gather_kernels():
    """Before gluon-nchw-regs and gluon-nchw, which took these layers before it; where it measured
    faster (stride 1 up to 28x28 planes, stride 2 on 7x7 outputs); a switch."""
    from fusionplan.solvers import REGISTRY

    names = [s.name for s in REGISTRY]
    assert names.index("gluon-halo") < min(names.index("gluon-nchw-regs"), names.index("gluon-nchw"))
    solver = halo.GluonHaloSolver()
    for name in ("r50_22", "r50_18", "r50_16", "r50_10"):
        assert solver.defer_why(layer(name).spec(), fp.Handle("cpu")) is None, name
    assert "196 pixels (> 49 at stride 2)" in solver.defer_why(layer("r50_12").spec(), fp.Handle("cpu"))
    assert "784 pixels (> 49 at stride 2)" in solver.defer_why(layer("r50_06").spec(), fp.Handle("cpu"))
    assert "3136 pixels (> 784 at stride 1)" in solver.defer_why(layer("r50_02").spec(), fp.Handle("cpu"))


@pytest.mark.parametrize(
    "name, p, tile_h, pixels, stages, phase_rows, rows, gather_rows, pieces",
    [
        ("r50_22", 8, 7, 64, 4, 128, 128, 128, 1),  # 7x7: one tile an image; rows 0 .. 72 gathered
        ("r50_16", 15, 8, 128, 4, 256, 256, 256, 1),  # 14x14: two bands of 8 rows
        ("r50_10", 29, 4, 128, 4, 256, 256, 256, 1),  # 28x28: seven bands of 4 rows
        ("r50_18", 8, 7, 64, 4, 64, 512, 256, 1),  # stride 2 to 7x7: four phases of 64 rows
        ("r50_12", 15, 8, 128, 3, 136, 640, 128, 5),  # stride 2 to 14x14: 3 stages beside 640-row halos
        ("r50_06", 29, 4, 128, 3, 152, 640, 128, 5),  # stride 2 to 28x28
    ],
)
def test_geometry(name, p, tile_h, pixels, stages, phase_rows, rows, gather_rows, pieces):
    plan = layer(name)
    cfg = halo.halo_config(plan.spec())
    oh, ow = plan.output_desc.dims[2:]
    geo = halo.halo_geometry(oh, ow, resnet50_layer(name).stride, cfg.block_m, cfg.block_n, cfg.num_stages)
    assert (geo.p, geo.tile_h, geo.pixels, cfg.num_stages) == (p, tile_h, pixels, stages)
    assert (geo.phase_rows, geo.halo, geo.gather_rows, geo.pieces) == (phase_rows, rows, gather_rows, pieces)
    assert cfg.num_warps == geo.computing_warps and geo.halo % geo.gather_rows == 0
    # about 64 loaded values a gathering thread at once
    assert geo.group * geo.gather_rows * halo.BLOCK_K // (32 * geo.gather_warps) == 64
    assert halo.shared_bytes(geo, cfg.num_stages) <= halo.SHARED_BYTES


@pytest.mark.parametrize("name", ["r50_22", "r50_18", "r50_12", "r50_06"])
def test_find_tries_only_rings_that_fit(name):
    """NORMAL find's candidates keep the heuristic's tile and take only the weights rings whose shared
    memory fits beside its halos (r50_12's and r50_06's 640-row halos leave room for 3 stages)."""
    plan = layer(name)
    kernel = halo.GluonHaloSolver().build(plan.spec(), fp.Handle("cpu"))  # rendered, not compiled
    cfg = halo.halo_config(plan.spec())
    stages = [c.num_stages for c in kernel.candidates]
    assert cfg.num_stages in stages and 2 in stages
    for c in kernel.candidates:
        assert (c.block_m, c.block_n, c.num_warps) == (cfg.block_m, cfg.block_n, cfg.num_warps)
        assert halo.shared_bytes(kernel.geometry_of(c), c.num_stages) <= halo.SHARED_BYTES
    assert (max(stages) == 3) == (name in ("r50_12", "r50_06"))


def emulated_output(x: torch.Tensor, weight: torch.Tensor, stride: int, pixels: int) -> torch.Tensor:
    """What the kernel computes, in float64: for each image and band, each channel block's halo as the
    gathering partition builds it (the template's arithmetic; rows past the gathered pieces NaN, as
    unwritten shared memory may be), the nine products over views of it starting at each tap's row
    (the computing partition's arithmetic), and the band's slots placed in the output as the
    epilogue's coordinates place them (slots outside the output dropped)."""
    n, c, h, w = x.shape
    k = weight.shape[0]
    oh, ow = (h - 1) // stride + 1, (w - 1) // stride + 1
    geo = halo.halo_geometry(oh, ow, stride, pixels)
    out = torch.full((n, k, oh, ow), float("nan"), dtype=torch.float64)
    r = torch.arange(geo.halo)
    q, u, v = r // geo.phase_rows, (r % geo.phase_rows) // geo.p, (r % geo.phase_rows) % geo.p
    gathered = r < geo.pieces * geo.gather_rows
    slot = torch.arange(geo.pixels)
    for img in range(n):
        for oh0 in range(0, oh, geo.tile_h):
            ih = stride * (oh0 + u - 1) + q // stride
            iw = stride * (v - 1) + q % stride
            inside = (q < stride * stride) & (ih >= 0) & (ih < h) & (iw >= 0) & (iw < w)
            rows = torch.zeros(geo.halo, c, dtype=torch.float64)
            rows[inside] = x[img, :, ih[inside], iw[inside]].double().T
            rows[~gathered] = float("nan")
            acc = torch.zeros(geo.pixels, k, dtype=torch.float64)
            for t in range(9):
                dh, dw = divmod(t, 3)
                a, b = (dh + stride - 1) % stride, (dw + stride - 1) % stride
                du, dv = (dh - 1 - a + stride) // stride - 1, (dw - 1 - b + stride) // stride - 1
                start = (a * stride + b) * geo.phase_rows + (du + 1) * geo.p + dv + 1
                assert start + geo.pixels <= geo.halo  # the view lies within the buffer
                acc += rows[start : start + geo.pixels] @ weight[:, :, dh, dw].double().T
            oh_s, ow_s = oh0 + slot // geo.p, slot % geo.p
            valid = (slot // geo.p < geo.tile_h) & (oh_s < oh) & (ow_s < ow)
            out[img, :, oh_s[valid], ow_s[valid]] = acc[valid].T
    return out


@pytest.mark.parametrize(
    "h, w, stride, pixels",
    [
        (7, 7, 1, 64),
        (14, 14, 1, 128),
        (13, 11, 1, 64),
        (13, 11, 1, 128),
        (28, 28, 1, 128),
        (5, 3, 1, 64),
        (14, 14, 2, 64),
        (13, 13, 2, 64),
        (15, 9, 2, 64),
        (28, 28, 2, 64),
        (28, 28, 2, 128),
        (4, 6, 2, 64),
        (1, 1, 1, 64),  # degenerate planes: a single pixel, a single row or column
        (1, 5, 1, 64),
        (6, 1, 1, 64),
        (1, 1, 2, 64),
        (3, 2, 2, 64),
    ],
)
def test_emulated_halo_matches_the_convolution(h, w, stride, pixels):
    """The halo's rows and the taps' shifted views give the convolution (padding 1) at every output
    pixel, none of them reading a row the gathering partition does not write."""
    gen = torch.Generator().manual_seed(h * 100 + w * 10 + stride)
    x = torch.randn(2, 8, h, w, generator=gen)
    weight = torch.randn(5, 8, 3, 3, generator=gen)
    expected = torch.nn.functional.conv2d(x.double(), weight.double(), stride=stride, padding=1)
    got = emulated_output(x, weight, stride, pixels)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, expected)


@needs_shifted_views
@pytest.mark.parametrize("name", ["r50_22", "r50_18"])
def test_compiles_for_hopper(name):
    """The kernel compiles for sm_90: wgmma from shared memory with one product in flight, no spills,
    its shared memory within the multiprocessor's; launched with programmatic dependent launch, it
    waits for the kernel before it before its partitions start (programmatic dependent launch)."""
    info = compile_sm90(GRID_DEPENDENCY_ON + layer_build(name, "float16", layout="NCHW"), "gluon-halo")
    assert info["HGMMA"] > 0
    assert "0x1" in info["wgmma waits (outstanding groups allowed)"]
    assert "LOCAL:0" in info["resources"] and "STACK:0" in info["resources"]
    assert info["shared bytes (dynamic)"] <= 227 * 1024
    source = info["source"]
    assert info["programmatic dependent launch"]
    wait, trigger = source.index("griddepcontrol.wait"), source.index("griddepcontrol.launch_dependents")
    assert wait < trigger < source.index("gl.warp_specialize(")
