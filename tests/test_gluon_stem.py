"""gluon-stem without a GPU: which plans it takes and why not, its ring and packed filter, and its
generated kernel compiled for sm_90 with Triton's own ptxas (tests/gpu runs it)."""

import pytest
import torch

import fusionplan as fp
from fusionplan.solvers import solver_named
from fusionplan.tools.shapes import resnet50_layer
from fusionplan.tools.verify import add_chain, layer_plan

from .util import assert_expects_sum_to_their_loads, compile_sm90, layer_build, plan_for

pytest.importorskip("triton")
gluon_stem = pytest.importorskip("fusionplan.solvers.gluon_stem")
stem_template = pytest.importorskip("fusionplan.solvers.templates.gluon_stem")
triton_stem = pytest.importorskip("fusionplan.solvers.triton_stem")
if gluon_stem.gluon_why_not():
    pytest.skip(gluon_stem.gluon_why_not(), allow_module_level=True)


def verdict(plan) -> fp.solvers.Verdict:
    return next(v for v in plan.explain(fp.Handle("cpu")) if v.solver == "gluon-stem")


def stem(dtype=torch.float16, layout: str = "NHWC", n: int = 32):
    s = resnet50_layer("r50_00")
    x = torch.empty(n, s.c, s.h, s.w, dtype=dtype)
    return layer_plan(s, x.to(memory_format=torch.channels_last) if layout == "NHWC" else x, "CBNA")


def huge_planes():
    """The stem on one NCHW image of 3 planes of 2^30 elements (descriptors only, no data)."""
    x = fp.TensorDescriptor.packed("half", (1, 3, 32768, 32768))
    conv = fp.ConvolutionDescriptor((3, 3), (2, 2))
    return add_chain(fp.FusionPlan(x), "CBA", conv=conv, k=64, r=7, s=7, param_dtype="float")


def conv_plan(
    c=3, h=20, w=40, k=64, r=7, s=7, pads=(3, 3), strides=(2, 2), dil=1, dtype=torch.float16, groups=1, layout="NHWC"
):
    """A convolution and bias-activation chain on ``layout`` input (NWHC: columns innermost-but-one,
    neither rows of channels nor channel planes)."""
    x = torch.empty(2, c, h, w, dtype=dtype)
    if layout == "NHWC":
        x = x.to(memory_format=torch.channels_last)
    elif layout == "NWHC":
        x = torch.empty(2, w, h, c, dtype=dtype).permute(0, 3, 2, 1)
    conv = fp.ConvolutionDescriptor(pads, strides, (dil, dil), groups=groups)
    return add_chain(plan_for(x), "CBA", conv=conv, k=k, r=r, s=s, param_dtype="float")


@pytest.mark.parametrize(
    "plan, reason",
    [
        (lambda: stem(), "needs a Hopper GPU"),  # the plan fits: only the device is missing
        (lambda: stem(torch.bfloat16), "needs a Hopper GPU"),
        (lambda: stem(torch.float32), "16-bit wgmma"),
        (lambda: stem(layout="NCHW"), "needs a Hopper GPU"),  # channel planes: a stretch per channel
        (lambda: conv_plan(layout="NWHC"), "channels-last (NHWC) or channel planes (NCHW)"),
        (lambda: conv_plan(c=9, layout="NCHW"), "(9 channel planes side by side) is longer than a tile's 64"),
        (lambda: huge_planes(), "their offsets in an image pass 2^31"),
        (lambda: conv_plan(c=16, r=3, s=3, pads=(1, 1)), "C=16 > 15"),
        (lambda: conv_plan(c=4, groups=2, k=8), "grouped"),
        (lambda: conv_plan(w=600), "more than 64 runs"),
        (lambda: conv_plan(c=3, w=11, r=3, s=3, pads=(1, 1)), "4-byte units"),  # rows of 33 elements
        (lambda: conv_plan(c=15, r=7, s=7, strides=(1, 1)), "longer than a tile's 64"),
        (lambda: conv_plan(c=3, w=12, r=3, s=3, pads=(1, 1)), "needs a Hopper GPU"),
        (lambda: conv_plan(c=1, w=600, r=1, s=1, pads=(0, 0), strides=(1, 1)), "runs of 8 pixels"),
    ],
)
def test_why_not_names_what_is_missing(plan, reason):
    assert reason in verdict(plan()).reason


def test_filter_too_large_for_shared_memory(monkeypatch):
    from fusionplan.runtime import tuning

    monkeypatch.setattr(tuning, "GLUON_STEM_SMEM_BYTES", 64 * 1024)
    assert "Toeplitz blocks and 14 input-row tiles take" in verdict(stem()).reason


def test_ring_and_config():
    """The ResNet stem: runs of 2 pixels (56 of a 112-pixel row), stretches of 32 elements copied 8
    bytes at a time, 16 slots of 4 KB beside the filter's 14 blocks (57 KB); the shallowest ring
    that cannot stall holds two output rows' 7 input rows each."""
    kernel = solver_named("gluon-stem").build(stem().spec(), fp.Handle("cpu"))
    runs = kernel.runs
    assert (runs.pixels, runs.step, runs.lead, runs.block_e) == (2, 12, 12, 32)
    assert gluon_stem.copy_vector(kernel.arrangement, 2, 224 * 3, 224 * 224 * 3, 224 * 3) == 4
    assert kernel.config.num_stages == 16 and kernel.config.block_k == 32
    assert [c.num_stages for c in kernel.candidates] == [16, 14]
    assert kernel.narrower_config().num_stages == 14
    assert gluon_stem.stem_smem_bytes(7, runs, 16, 2) == (14 * 64 + 16 * 64) * 32 * 2
    tiles = 2 * 2 * 64 * 64 * 2  # the output tiles of TMA stores: a warpgroup's, a pixel's
    assert gluon_stem.stem_smem_bytes(7, runs, 16, 2, tma_store=True) == (14 * 64 + 16 * 64) * 32 * 2 + tiles
    assert gluon_stem.least_slots(7, 1) == 14 and gluon_stem.least_slots(3, 2) == 10


def test_ring_and_config_on_channel_planes():
    """The ResNet stem on NCHW input: the three planes' stretches side by side in a 32-element row
    (10 elements each, from 4 before the run's first column: copies of 4 bytes never straddle two
    planes), runs of 2 pixels: as many products per output row as channels-last input (a
    16-element tile per plane would take 3 x 2 per filter row; triton-stem's runs of 4, 4)."""
    spec = stem(layout="NCHW").spec()
    kernel = solver_named("gluon-stem").build(spec, fp.Handle("cpu"))
    arrangement = kernel.arrangement
    runs = kernel.runs
    assert (runs.pixels, runs.step, runs.lead, runs.block_e, runs.used) == (2, 4, 4, 32, 30)
    assert (arrangement.side, arrangement.pitch, arrangement.products) == (3, 10, 4)
    assert triton_stem.plan_stretches(spec).pixels == 4  # triton-stem's own choice
    row = gluon_stem.copied_row(spec, spec.input_desc.strides)
    assert row == (224, 3 * 224 * 224, 224, 224 * 224) and gluon_stem.copy_vector(arrangement, 2, *row) == 2
    assert kernel.config.num_stages == 16 and kernel.programs_and_steps(kernel.config)[1] == 7 * 2


@pytest.mark.parametrize(
    "c, w, stride, pixels",
    [(1, 64, 2, 1), (2, 160, 1, 4), (2, 64, 1, 2)],
)
def test_runs_of_fewest_products(c, w, stride, pixels):
    """Runs as short as 64 runs a row allow (the [64, BLOCK_E] tile is gathered whatever their
    length, each pixel of a run its own products), and long enough that copies are 4 bytes: C = 1
    stride 2 on 64 columns one pixel (triton-stem: four), 160 columns four, stride 1 on channel
    planes two (one pixel would step 2 bytes)."""
    plan = conv_plan(c=c, w=w, r=3, s=3, pads=(1, 1), strides=(stride, stride), layout="NCHW")
    assert solver_named("gluon-stem").build(plan.spec(), fp.Handle("cpu")).runs.pixels == pixels


#: (c, w, k, r, s, pads, strides, dilation) whose packed blocks the emulation checks in both layouts.
EMULATED = {
    "stem": (3, 40, 17, 7, 7, (3, 3), (2, 2), 1),
    "C4-3x3": (4, 36, 24, 3, 3, (1, 1), (1, 1), 1),
    "C8-dilated": (8, 40, 8, 3, 3, (2, 2), (1, 1), 2),
    "stride-3": (4, 48, 8, 5, 5, (2, 2), (3, 3), 1),
    "1x7": (3, 64, 8, 1, 7, (0, 3), (1, 2), 1),
    "four-pixel-runs": (2, 160, 8, 3, 3, (1, 1), (1, 1), 1),
}


@pytest.mark.parametrize("layout", ["NHWC", "NCHW"])
@pytest.mark.parametrize("case", list(EMULATED))
def test_packed_blocks_times_gathered_tiles_is_the_convolution(case, layout):
    """What the kernel computes, in torch: each input row's [RUNS, BLOCK_E] tile gathered as the
    loader does (run q's stretch from q * step - lead; channel planes side by side, plane c's from
    c * pitch), times the packed Toeplitz blocks of each filter row, summed over the filter rows,
    is the convolution's output row (pixel p of run q at column q * PX + p); K padded to 64."""
    c, w, k, r, s, pads, strides, dil = EMULATED[case]
    h = 9
    plan = conv_plan(c=c, h=h, w=w, k=k, r=r, s=s, pads=pads, strides=strides, dil=dil, layout=layout)
    kernel = solver_named("gluon-stem").build(plan.spec(), fp.Handle("cpu"))
    arrangement, runs = kernel.arrangement, kernel.runs
    assert (arrangement.side > 1) == (layout == "NCHW")
    x = torch.randn(2, c, h, w, dtype=torch.float64)
    weight = torch.randn(k, c, r, s, dtype=torch.float64)
    blocks = kernel.pack(weight).reshape(r, runs.pixels, -1, runs.block_e)[:, :, :k]  # [R, PX, K, E]
    expected = torch.nn.functional.conv2d(x, weight, padding=pads, stride=strides, dilation=dil)
    oh, ow = expected.shape[2:]
    q = torch.arange(-(-ow // runs.pixels))
    e = torch.arange(runs.block_e)
    if arrangement.side > 1:  # plane e // pitch, its element e % pitch
        col = (q * runs.step - runs.lead)[:, None] + (e % arrangement.pitch)[None, :]
        chans = (e // arrangement.pitch)[None, :].expand_as(col)
        ok = (col >= 0) & (col < w) & (chans < c)
        cols = col
    else:  # channels-last: element i of the row is column i // C, channel i % C
        col = (q * runs.step - runs.lead)[:, None] + e[None, :]
        ok = (col >= 0) & (col < w * c)
        cols, chans = col // c, col % c
    for n in range(2):
        for row in range(oh):
            acc = torch.zeros(len(q), runs.pixels, k, dtype=torch.float64)
            for fr in range(r):
                ih = row * strides[0] + fr * dil - pads[0]
                if 0 <= ih < h:
                    tile = torch.where(ok, x[n, chans.clamp(0, c - 1), ih, cols.clamp(0, w - 1)], 0.0)
                    acc += torch.einsum("qe,pke->qpk", tile, blocks[fr])
            torch.testing.assert_close(acc.reshape(-1, k)[:ow], expected[n, :, row].T)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_stem_kernel_gathers_each_input_row_once(dtype):
    """Both computing warpgroups issue a wgmma per filter row, pixel of a run and 16-element slice of
    the stretch (2 x 7 x 2 x 2), both operands from shared memory; the loading warpgroup gathers an
    input row's tile with four 8-byte asynchronous copies a thread and one arrival on the row's
    barrier; 14 tensor loads of the filter; the output tiles stored by TMA; no spills, within
    sm_90's shared memory. As many again, with the stretches through registers (56 matrix loads),
    on the exact path of rows where a NaN came out (the Toeplitz zeros times an infinite input)."""
    info = compile_sm90(layer_build("r50_00", dtype), "gluon-stem")
    assert info["HGMMA"] == 2 * 56 and info["HGMMA shapes"] == ["64x64x16"]
    assert info["LDSM (operand through registers)"] == 56
    assert info["async copies by bytes"] == {"8": 4}
    assert info["tensor loads (UTMALDG)"] == 14
    assert_expects_sum_to_their_loads(info)  # the filter's blocks (the input rows by asynchronous copies)
    # the output tiles by TMA: a store per warpgroup and pixel of a run, no pointer stores
    assert info["tensor stores (UTMASTG)"] == 4 and not info["global stores by bytes"]
    assert "mbarrier_arrive(ready.index(slot), increment_count=False)" in info["source"]
    assert info["register reallocations (SETMAXREG, warp specialization)"] > 0
    assert "LOCAL:0" in info["resources"]
    assert info["shared bytes (dynamic)"] <= 232448


@pytest.mark.parametrize("layout", ["NHWC", "NCHW"])
@pytest.mark.parametrize("c, w, stride, dil", [(3, 7, 2, 1), (4, 5, 1, 2), (2, 3, 1, 1), (3, 7, 2, 2)])
def test_tap_positions_are_the_toeplitz_blocks_nonzero_columns(layout, c, w, stride, dil):
    """The exact path's masks: pixel p's taps are where its packed Toeplitz block has weights."""
    from fusionplan.solvers.gluon_stem import GluonStemKernel
    from fusionplan.solvers.stem_toolkit import positions_expression, tap_positions

    plan = conv_plan(c=c, h=12, w=w * 5, k=8, r=3, s=w, pads=(1, w // 2), strides=(1, stride), dil=dil, layout=layout)
    kernel = GluonStemKernel(plan.spec(), fp.Handle("cpu"))
    blocks = kernel.pack(torch.ones(8, c, 3, w)).reshape(3, kernel.runs.pixels, -1, kernel.runs.block_e)
    offs_e = torch.arange(kernel.runs.block_e)  # noqa: F841 (the expression names it)
    for p in range(kernel.runs.pixels):
        arrangement = kernel.arrangement
        positions = tap_positions(plan.spec(), arrangement.runs, p, arrangement.side, arrangement.pitch)
        assert positions == torch.nonzero(blocks[0, p, 0]).flatten().tolist()
        mask = eval(positions_expression(positions, "offs_e"))
        assert torch.equal(mask, blocks[0, p, 0] != 0)


def test_stem_on_channel_planes_gathers_each_input_row_once():
    """NCHW input: as many wgmma as channels-last input (2 x 7 x 2 x 2: the planes side by side in
    one 32-element row), eight 4-byte copies a thread for a row's tile, the filter's 14 blocks by
    tensor loads; the NCHW output's rows joined and stored 16 bytes at a time (8 per thread and
    warpgroup); no spills, within sm_90's shared memory. (As many wgmma again on the exact path.)"""
    info = compile_sm90(layer_build("r50_00", "float16", layout="NCHW"), "gluon-stem")
    assert info["HGMMA"] == 2 * 56 and info["HGMMA shapes"] == ["64x64x16"]
    assert info["global stores by bytes"] == {"16": 16}
    assert info["async copies by bytes"] == {"4": 8}
    assert info["tensor loads (UTMALDG)"] == 14
    assert_expects_sum_to_their_loads(info)
    assert "LOCAL:0" in info["resources"]
    assert info["shared bytes (dynamic)"] <= 232448


def test_loading_warps_on_channel_planes_take_more_registers(monkeypatch):
    """Channel planes side by side copy twice as often (4-byte copies): their loading warps take
    tuning.GLUON_STEM_PLANE_LOAD_REGS and the second computing warpgroup as many fewer, so that the
    multiprocessor's registers add up as for channels-last input (LOAD_REGS, CONSUMER_REGS)."""
    from fusionplan.solvers.gluon_toolkit import CONSUMER_REGS, LOAD_REGS

    assert gluon_stem.stem_registers(False) == (LOAD_REGS, CONSUMER_REGS)
    load, consumer = gluon_stem.stem_registers(True)
    assert (
        load == fp.runtime.tuning.GLUON_STEM_PLANE_LOAD_REGS > LOAD_REGS
        and load + consumer == LOAD_REGS + CONSUMER_REGS
    )
    monkeypatch.setattr(fp.runtime.tuning, "GLUON_STEM_PLANE_LOAD_REGS", 88)
    assert gluon_stem.stem_registers(True) == (88, CONSUMER_REGS - 48)


def test_odd_stem_compiles():
    """C = 4 and 136 output channels (three blocks), a 3x3 stride-1 filter of dilation 2 (runs of
    more pixels: an accumulator each)."""
    build = (
        "x = torch.empty(2, 4, 20, 40, dtype=torch.float16).to(memory_format=torch.channels_last)\n"
        "conv = fp.ConvolutionDescriptor((2, 2), (1, 1), (2, 2))\n"
        "plan = add_chain(fp.FusionPlan(fp.TensorDescriptor.from_tensor(x)), 'CNA', conv=conv, k=136, r=3, s=3,"
        " param_dtype='float')"
    )
    info = compile_sm90(build, "gluon-stem")
    assert info["HGMMA"] > 0 and "LOCAL:0" in info["resources"]
    assert info["shared bytes (dynamic)"] <= 232448


@pytest.mark.parametrize(
    "c, r, stride, w, pixels",
    [(2, 7, 2, 64, 1), (1, 3, 2, 400, 4)],
)
def test_runs_of_one_and_four_pixels_compile(c, r, stride, w, pixels):
    """An accumulator per pixel of a run (four where rows of 199 pixels need them: at most 64
    runs), one wait for all their products, no spills."""
    build = (
        f"x = torch.empty(2, {c}, 20, {w}, dtype=torch.float16).to(memory_format=torch.channels_last)\n"
        f"conv = fp.ConvolutionDescriptor((0, 0), ({stride}, {stride}))\n"
        f"plan = add_chain(fp.FusionPlan(fp.TensorDescriptor.from_tensor(x)), 'CBA', conv=conv, k=32, r={r}, s={r},"
        " param_dtype='float')"
    )
    info = compile_sm90(build, "gluon-stem")
    assert f"acc{pixels - 1} = gl.zeros" in info["source"] and f"acc{pixels} = gl.zeros" not in info["source"]
    assert info["HGMMA"] > 0 and "LOCAL:0" in info["resources"]


def test_tma_store_by_plan(monkeypatch):
    """The stem's channels-last output takes TMA stores; 17 output channels
    (34-byte pixels) and outputs that the tiles' shared memory would not fit store by pointer."""
    from fusionplan.runtime import tuning

    kernel = solver_named("gluon-stem").build(stem().spec(), fp.Handle("cpu"))
    assert gluon_stem.plan_tma_store(stem().spec(), kernel.runs)
    assert not gluon_stem.plan_tma_store(conv_plan(k=17).spec(), kernel.runs)
    monkeypatch.setattr(tuning, "GLUON_STEM_SMEM_BYTES", 140 * 1024)  # 16 slots fit, 14 and the tiles do not
    assert not gluon_stem.plan_tma_store(stem().spec(), kernel.runs)
    assert solver_named("gluon-stem").build(stem().spec(), fp.Handle("cpu")).config.num_stages == 16


def test_joined_rows_put_each_runs_pixels_in_order():
    """The row's tile from its pixels' tiles: pixel p of run q at row q * PX + p (the pixels' bits
    moved before the channels, the highest first), a single pixel's tile as it is."""
    assert stem_template.joined_row(1) == "h0"
    assert stem_template.joined_row(2) == "gl.reshape(gl.permute(gl.join(h0, h1), (0, 2, 1)), [RUNS * PX, BLOCK_N])"
    four = stem_template.joined_row(4)
    assert "gl.join(gl.join(h0, h2), gl.join(h1, h3))" in four and "(0, 2, 3, 1)" in four
    q, p = torch.meshgrid(torch.arange(5), torch.arange(4), indexing="ij")
    tiles = [q[:, i, None].expand(5, 3) * 4 + i for i in range(4)]  # [runs, channels]: the pixel's column
    joined = torch.stack([torch.stack([tiles[0], tiles[2]], -1), torch.stack([tiles[1], tiles[3]], -1)], -1)
    rows = joined.permute(0, 2, 3, 1).reshape(20, 3)  # gl.join(a, b) stacks along a new last axis
    assert torch.equal(rows[:, 0], torch.arange(20))


def test_joined_plane_vector():
    """16-byte stores where NCHW output planes are aligned (8 elements), single elements where only
    the pixels are contiguous (13-pixel rows), none for channels-last output."""
    planes = torch.empty(2, 64, 56, 56, dtype=torch.float16)
    assert gluon_stem.joined_plane_vector(planes.stride(), planes) == 8
    odd = torch.empty(2, 64, 11, 13, dtype=torch.float16)
    assert gluon_stem.joined_plane_vector(odd.stride(), odd) == 1
    last = planes.to(memory_format=torch.channels_last)
    assert gluon_stem.joined_plane_vector(last.stride(), last) == 0
