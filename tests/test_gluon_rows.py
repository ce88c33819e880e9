"""gluon-rows without a GPU: which plans it takes and why not, its ring's depth, and its generated
kernels compiled for sm_90 with Triton's own ptxas (tests/gpu runs them)."""

import pytest
import torch

import fusionplan as fp
from fusionplan.solvers import solver_named
from fusionplan.tools.shapes import resnet50_layer
from fusionplan.tools.verify import add_chain, layer_plan

from .util import assert_expects_sum_to_their_loads, compile_sm90, layer_build, plan_for

pytest.importorskip("triton")
gluon_rows = pytest.importorskip("fusionplan.solvers.gluon_rows")
rows_template = pytest.importorskip("fusionplan.solvers.templates.gluon_rows")
if gluon_rows.gluon_why_not():
    pytest.skip(gluon_rows.gluon_why_not(), allow_module_level=True)


def verdict(plan) -> fp.solvers.Verdict:
    return next(v for v in plan.explain(fp.Handle("cpu")) if v.solver == "gluon-rows")


def layer(name: str, dtype=torch.float16, layout: str = "NHWC"):
    s = resnet50_layer(name)
    x = torch.empty(32, s.c, s.h, s.w, dtype=dtype)
    return layer_plan(s, x.to(memory_format=torch.channels_last) if layout == "NHWC" else x, "CBNA")


def conv_plan(c=64, h=20, w=40, k=64, r=3, s=3, pads=(1, 1), strides=(1, 1), dil=1, dtype=torch.float16, layout="NHWC"):
    x = torch.empty(2, c, h, w, dtype=dtype)
    x = x.to(memory_format=torch.channels_last) if layout == "NHWC" else x
    conv = fp.ConvolutionDescriptor(pads, strides, (dil, dil))
    return add_chain(plan_for(x), "CBA", conv=conv, k=k, r=r, s=s, param_dtype="float")


@pytest.mark.parametrize(
    "plan, reason",
    [
        (lambda: layer("r50_02"), "needs a Hopper GPU"),  # the plan fits: only the device is missing
        (lambda: layer("r50_02", torch.bfloat16), "needs a Hopper GPU"),
        (lambda: layer("r50_01"), "needs a Hopper GPU"),  # 1x1 filters fit too (gluon-gemm comes first)
        (lambda: layer("r50_02", torch.float32), "16-bit wgmma operands"),
        (lambda: layer("r50_02", layout="NCHW"), "needs a Hopper GPU"),  # channel planes: the device is missing
        (lambda: layer("r50_10"), "needs a Hopper GPU"),  # 128 channels: two halves of the filter
        (lambda: layer("r50_16"), "C=256 input channels"),
        (lambda: conv_plan(c=128, r=5, s=5, pads=(2, 2)), "takes 400 registers"),
        (lambda: layer("r50_06"), "stride 1 only"),
        (lambda: conv_plan(c=20), "C a multiple of 8"),
        (lambda: conv_plan(r=5, s=5, pads=(2, 2)), "takes 400 registers"),
        (lambda: conv_plan(w=300), "exceed a tensor box's 256"),
    ],
)
def test_why_not_names_what_is_missing(plan, reason):
    assert reason in verdict(plan()).reason


@pytest.mark.parametrize(
    "c, h, w, r, s, pads, reason",
    [
        (64, 8, 8, 1, 7, (0, 3), "take no wgmma swizzle"),  # 8-pixel rows: a 16-byte box row
        (2, 1, 16, 3, 3, (1, 3), "a tap's weights' box starts at column t*C"),  # C=2: taps off 16-byte units
        (37, 13, 16, 1, 1, (0, 3), "a tap's weights' box starts at column t*C"),  # rows of 74 bytes
    ],
)
def test_channel_planes_the_copy_engine_cannot_take_are_refused(c, h, w, r, s, pads, reason):
    """Plans the GPU fuzzer and the sm90 build fuzz found gluon-rows taking and then failing to
    build (an AssertionError from Gluon's layout or descriptor): now refused, with the reason."""
    x = torch.empty(2, c, h, w, dtype=torch.float16)
    plan = add_chain(plan_for(x), "C", conv=fp.ConvolutionDescriptor(pads, (1, 1), (1, 1)), k=32, r=r, s=s)
    assert reason in verdict(plan).reason


def test_grouped_convolutions_are_not_taken():
    x = torch.empty(2, 64, 20, 40, dtype=torch.float16).to(memory_format=torch.channels_last)
    plan = add_chain(plan_for(x), "C", conv=fp.ConvolutionDescriptor((1, 1), groups=2), k=64, r=3, s=3)
    assert "grouped" in verdict(plan).reason


def test_narrow_rows_defer_to_the_windows():
    v = verdict(conv_plan(w=13))
    assert v.reason.startswith("needs a Hopper GPU")  # applicable where the device is
    assert "rows of 13 pixels" in gluon_rows.gluon_rows_defer_why(conv_plan(w=13).spec())
    assert gluon_rows.gluon_rows_defer_why(layer("r50_02").spec()) is None


def test_channel_halves_defer_to_the_windows():
    """Plans of 65-128 input channels (two halves) apply but defer (find may measure them faster);
    64 channels, one half, do not."""
    spec = conv_plan(c=128, w=40).spec()
    assert "C=128 input channels in two halves" in gluon_rows.gluon_rows_defer_why(spec)
    assert gluon_rows.gluon_rows_defer_why(conv_plan(c=64, w=40).spec()) is None


@pytest.mark.parametrize(
    "ow, pixels, c, block_c, r, dil, slots, least, filter_slots",
    [
        (56, 64, 64, 64, 3, 1, 8, 6, 3),  # r50_02: slots of 3 boxes of 8 KB
        (28, 32, 128, 64, 3, 1, 7, 6, 6),  # r50_10: slots of 3 x 2 boxes of 4 KB, 16 KB of exchange
        (28, 32, 72, 64, 3, 1, 7, 6, 6),
        (40, 64, 16, 16, 5, 1, 19, 10, 5),
        (13, 16, 64, 64, 3, 1, 32, 6, 12),
        (7, 8, 48, 64, 3, 2, 32, 10, 24),
        (100, 128, 8, 16, 1, 1, 32, 2, 1),
    ],
)
def test_ring_depths(ow, pixels, c, block_c, r, dil, slots, least, filter_slots):
    """Rows round up to a power of two of at least 8 pixels, channels to one of at least 16; the
    ring holds what tuning.GLUON_ROWS_RING_BYTES allows (at most 32 slots), at least least_slots
    (two warpgroups' rows where a run enters the next image) and the filter's slots."""
    assert gluon_rows.row_pixels(ow) == pixels and gluon_rows.channel_block(c) == block_c
    s = r
    assert gluon_rows.ring_slots(pixels, block_c, s, gluon_rows.channel_splits(c)) == slots
    assert gluon_rows.least_slots(r, dil) == least
    assert gluon_rows.filter_slots(r, pixels) == filter_slots


def test_find_candidates_never_stall():
    """NORMAL find's rings are at least as deep as least_slots and the filter's slots, and so is a
    narrower configuration."""
    kernel = solver_named("gluon-rows").build(layer("r50_02").spec(), fp.Handle("cpu"))
    depths = [cfg.num_stages for cfg in kernel.candidates]
    assert depths[0] == kernel.config.num_stages == 8 and min(depths) == 6
    assert kernel.narrower_config().num_stages == 6
    wide = solver_named("gluon-rows").build(conv_plan(c=16, r=5, s=5, pads=(2, 2)).spec(), fp.Handle("cpu"))
    assert min(c.num_stages for c in wide.candidates) == 10


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_r50_02_kernel_holds_the_filter_in_registers(dtype):
    """Both computing warpgroups issue a wgmma per tap and 16-channel slice (2 x 9 x 4), their A
    operand from registers read from shared memory by ldmatrix, 9 tensor loads of the filter and
    3 per input row (one per filter column), no spills, within sm_90's shared memory."""
    info = compile_sm90(layer_build("r50_02", dtype), "gluon-rows")
    assert info["HGMMA"] == 72 and info["HGMMA shapes"] == ["64x64x16"]
    assert info["LDSM (operand through registers)"] == 72
    assert info["tensor loads (UTMALDG)"] == 12
    assert_expects_sum_to_their_loads(info)
    assert info["register reallocations (SETMAXREG, warp specialization)"] > 0
    assert "LOCAL:0" in info["resources"]
    assert info["shared bytes (dynamic)"] <= 232448


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_r50_10_kernel_splits_the_channels_between_its_warpgroups(dtype):
    """128 input channels: each computing warpgroup holds the filter of one half (9 x 4 wgmma
    64x32x16 a row each, 28-pixel rows in 32), the input boxes come in two halves (6 tensor loads
    a row), the partial sums meet in shared memory; no spills, within sm_90's shared memory."""
    info = compile_sm90(layer_build("r50_10", dtype), "gluon-rows")
    assert info["HGMMA"] == 72 and info["HGMMA shapes"] == ["64x32x16"]
    assert info["LDSM (operand through registers)"] == 72
    assert info["tensor loads (UTMALDG)"] == 24  # 18 of the filter, 6 of an input row
    assert_expects_sum_to_their_loads(info)
    assert "LOCAL:0" in info["resources"]
    assert info["shared bytes (dynamic)"] <= 232448


def test_halves_source_hands_partial_sums_over():
    """With two channel halves every warpgroup computes every row and reads its own half of the
    boxes and the filter; the row's owner takes the other's partial sum before the chain, and only
    the owner stores."""
    source = solver_named("gluon-rows").build(layer("r50_10").spec(), fp.Handle("cpu")).source()
    loop = source[source.index("for u in range(start, end):") :]
    assert "* CH + CONSUMER)" in loop and "w_bufs.index(8 * CH + CONSUMER)" in source
    hand, take = loop.index("_hand_over(acc"), loop.index("acc = _take_over(acc")
    assert hand < take < loop.index("gl.store(y_ptr")
    plain = solver_named("gluon-rows").build(layer("r50_02").spec(), fp.Handle("cpu")).source()
    assert (
        "_hand_over(acc, xchg, full, free, u" not in plain
        and "xchg = gl.allocate" not in plain
        and "* CH + 0)" in plain
    )


def test_a_5x5_filter_of_16_channels_compiles():
    build = (
        "x = torch.empty(2, 16, 20, 45, dtype=torch.float16).to(memory_format=torch.channels_last)\n"
        "conv = fp.ConvolutionDescriptor((2, 2))\n"
        "plan = add_chain(fp.FusionPlan(fp.TensorDescriptor.from_tensor(x)), 'CNA', conv=conv, k=24, r=5, s=5,"
        " param_dtype='float')"
    )
    info = compile_sm90(build, "gluon-rows")
    assert info["HGMMA"] == 2 * 25 and "LOCAL:0" in info["resources"]  # k16 slices: one per tap
    assert info["shared bytes (dynamic)"] <= 232448


def test_channel_parameters_can_be_loaded_once_before_the_tiles():
    """emit_stages' hoist_channels: per-channel scale, shift and prior weights read from ``{p}_v``
    vectors that Epilogue.channel_loads loads (the prior weights under their flag); per-element
    parameters (a per-activation batch-norm) are still loaded with each tile; without it, nothing
    changes."""
    from fusionplan.runtime.epilogue import emit_stages
    from fusionplan.runtime.folding import AffineStage

    stages = [AffineStage((1, 2)), AffineStage((3,), per_element=True)]
    plain = emit_stages(stages, ())
    hoisted = emit_stages(stages, (), hoist_channels=True)
    assert plain.channel_loads == [] and plain.params == hoisted.params
    assert hoisted.channel_loads == [
        "sc0_ptr_v = tl.load(sc0_ptr + ch, mask=ch_mask, other=0.0)",
        "sh0_ptr_v = tl.load(sh0_ptr + ch, mask=ch_mask, other=0.0)",
        "if HAS_Q0:",
        "    q0_ptr_v = tl.load(q0_ptr + ch, mask=ch_mask, other=0.0)",
    ]
    body = "\n".join(hoisted.body)
    assert "h = h * sc0_ptr_v[None, :] + sh0_ptr_v[None, :]" in body and "q0_ptr_v[None, :] * p" in body
    assert "tl.load(sc1_ptr + elem, mask=mask, other=0.0)" in body  # per element: with the tile
    assert "tl.load(sc0_ptr + ch" in "\n".join(plain.body)


def test_gluon_rows_source_loads_channel_parameters_before_its_rows():
    source = solver_named("gluon-rows").build(layer("r50_02").spec(), fp.Handle("cpu")).source()
    loop = source.index("for u in range(start + CONSUMER, end, 2):")
    before, inside = source[:loop], source[loop:]
    assert "sc0_ptr_v = gl.load(sc0_ptr + ch_v, mask=ch_v_mask" in before
    assert "gl.load(sc0_ptr + ch," not in inside


@pytest.mark.parametrize(
    "plan, reason",
    [
        (lambda: layer("r50_02", layout="NCHW"), "needs a Hopper GPU"),
        (lambda: layer("r50_10", layout="NCHW"), "C=128 channel planes"),
        (lambda: conv_plan(w=45, layout="NCHW"), "W a multiple of 8"),
        (lambda: conv_plan(w=72, r=1, s=9, pads=(0, 0), layout="NCHW"), "do not fit an output row's box of 64"),
        (lambda: conv_plan(r=7, s=7, pads=(3, 3), layout="NCHW"), "leaves 0 slots of input rows, 14 needed"),
    ],
)
def test_channel_planes_why_not(plan, reason):
    """At most 64 channel planes, 16-byte rows that an output row's box holds from column 0 (72
    columns into 64 output pixels do not), a ring beside the filter (a 7x7 filter of 64 x 64
    channels alone passes the ring's shared memory)."""
    assert reason in verdict(plan()).reason


#: The build with the shifter refused, as for rows of over 64 pixels: the products are shifted.
NO_SHIFTER = "from fusionplan.solvers import gluon_rows\ngluon_rows.shifted_planes_why_not = lambda spec: 'refused'\n"


def test_channel_planes_kernel_shifts_the_filter_columns():
    """r50_02 on NCHW input with the products shifted (the shifter refused, NO_SHIFTER): per
    output row and computing warpgroup a wgmma per tap and 16-channel slice (2 x 9 x 4), a wait per
    filter column (the sums of columns 0 and 2 then shifted by -1 and +1 pixels by warp shuffles,
    column 1's added as it is), the filter's 9 taps and one box per input row by TMA, the filter
    read from shared memory, the NCHW output along the pixels, 8 a thread (16-byte stores); no
    spills."""
    info = compile_sm90(NO_SHIFTER + layer_build("r50_02", "float16", layout="NCHW"), "gluon-rows")
    assert info["HGMMA"] == 72 and info["wgmma waits (outstanding groups allowed)"] == ["0x0"] * 6
    assert info["tensor loads (UTMALDG)"] == 10
    assert info["source"].count("gl.gather(acc, index, 1)") == 2 and "row = row + acc" in info["source"]
    assert "+ -1\n" in info["source"] and "+ 1\n" in info["source"] and info["global stores by bytes"] == {"16": 8}
    assert "LOCAL:0" in info["resources"]
    assert info["shared bytes (dynamic)"] <= 232448


def test_channel_planes_kernel_shifts_the_input_rows():
    """r50_02 on NCHW input (the default): the shifter moves each input row's box by -1 and +1
    pixels into the slot's other boxes (no gather), the products run as on channels-last rows (the
    filter in registers by ldmatrix, one wait a row and computing warpgroup, 2 x 9 x 4 wgmma), one
    box per input row and the filter's 9 taps by TMA, 16-byte NCHW stores."""
    info = compile_sm90(layer_build("r50_02", "float16", layout="NCHW"), "gluon-rows")
    assert info["HGMMA"] == 72 and info["wgmma waits (outstanding groups allowed)"] == ["0x0"] * 2
    assert info["tensor loads (UTMALDG)"] == 10 and info["LDSM (operand through registers)"] >= 72
    assert_expects_sum_to_their_loads(info)
    source = info["source"]
    assert "gl.gather" not in source and "def _shift_0(x)" in source and "def _shift_2(x)" in source
    assert "def _shift_1(x)" not in source and "column ow -1" in source and "column ow +1" in source
    assert info["global stores by bytes"] == {"16": 8} and info["shared bytes (dynamic)"] <= 232448


def test_channel_planes_store_eight_pixels_a_thread_where_they_are_whole_16_byte_units():
    """PLANE_VEC: 8 pixels a thread for NCHW output whose strides, OW and data are 16-byte units;
    one where the data is not 16-byte aligned, OW is not a multiple of 8 (38), rows have under 16
    pixels; 0 (along the channels) for channels-last output."""

    def rows_kernel(plan):
        return solver_named("gluon-rows").build(plan.spec(), fp.Handle("cpu"))

    kernel = rows_kernel(layer("r50_02", layout="NCHW"))
    out = torch.empty(32, 64, 56, 56, dtype=torch.float16)
    unaligned = torch.empty(out.numel() + 1, dtype=torch.float16)[1:].view(out.shape)
    channels_last = out.to(memory_format=torch.channels_last)
    assert kernel._plane_vector(out, list(out.stride()), 64) == 8
    assert kernel._plane_vector(unaligned, list(unaligned.stride()), 64) == 1
    assert kernel._plane_vector(out, list(out.stride()), 8) == 1
    assert kernel._plane_vector(channels_last, list(channels_last.stride()), 64) == 0
    narrow = rows_kernel(conv_plan(w=40, pads=(0, 0), layout="NCHW"))  # OW = 38
    out38 = torch.empty(2, 64, 18, 38, dtype=torch.float16)
    assert narrow._plane_vector(out38, list(out38.stride()), 64) == 1


def emulated_move(offset: int, length: int, with_next: bool = False):
    """The generated move as a Python function on torch tensors (stand-ins of its halving and
    interleaving and of gl.zeros_like)."""

    def halves(x):
        return x[:, 0::2], x[:, 1::2]

    def interleave(e, o):
        return torch.stack((e, o), dim=2).reshape(e.shape[0], 2 * e.shape[1])

    source = rows_template.move_function("moved", offset, length, with_next).replace("@gluon.jit\n", "")
    scope = {"_halves": halves, "_interleave": interleave, "gl": type("gl", (), {"zeros_like": torch.zeros_like})}
    exec(source, scope)
    return scope["moved"]


@pytest.mark.parametrize("pixels", [8, 16, 64, 128])
@pytest.mark.parametrize("offset", [-3, -2, -1, 1, 2, 3, 7, -8])
def test_shift_functions_move_a_row_by_its_offset(pixels, offset):
    """The generated move, run with torch stand-ins of its halving and interleaving: column ow of
    the result is column ow + offset of the input, zeros past the row's ends."""
    x = torch.randn(5, pixels, dtype=torch.float64)
    expected = torch.zeros_like(x)
    for ow in range(pixels):
        if 0 <= ow + offset < pixels:
            expected[:, ow] = x[:, ow + offset]
    assert torch.equal(emulated_move(offset, pixels)(x), expected)


@pytest.mark.parametrize("offset", [0, 1, 2, 4, 7, 63, 64])
def test_moves_continue_into_the_next_row(offset):
    """With a second argument, the move shifts in its first columns instead of zeros."""
    x, y = torch.randn(3, 64, dtype=torch.float64), torch.randn(3, 64, dtype=torch.float64)
    assert torch.equal(emulated_move(offset, 64, with_next=True)(x, y), torch.cat((x, y), 1)[:, offset : offset + 64])


@pytest.mark.parametrize(
    "plan, mode, reason",
    [
        (lambda: layer("r50_02", layout="NCHW"), 2, None),
        (lambda: conv_plan(w=40, pads=(0, 0), layout="NCHW"), 2, None),  # offsets 0, 1, 2
        (lambda: conv_plan(w=40, r=1, pads=(0, 2), dil=2, layout="NCHW"), 2, None),  # offsets -2, 0, 2
        (lambda: conv_plan(w=40, pads=(2, 2), dil=2, layout="NCHW"), 1, "8 slots of 3 boxes fit, 10 needed"),
        (lambda: conv_plan(w=40, pads=(1, 1), dil=2, layout="NCHW"), 1, "no filter column at offset 0"),
        (lambda: conv_plan(w=200, layout="NCHW"), 1, "rows of 256 pixels"),
        (lambda: conv_plan(w=40, r=5, s=5, pads=(2, 2), layout="NCHW"), 1, "the filter takes 400 registers"),
        (lambda: layer("r50_02"), 0, None),
    ],
)
def test_plane_modes(plan, mode, reason):
    """Channel planes take the shifter where rows fit a thread, a filter column reads offset 0 and
    the filter fits the registers; the shifted products otherwise (channels-last rows: mode 0)."""
    spec = plan().spec()
    assert gluon_rows.plane_mode(spec) == mode
    if mode:
        why = gluon_rows.shifted_planes_why_not(spec)
        assert why is None if reason is None else reason in why


def test_a_built_kernel_keeps_its_plane_mode(monkeypatch):
    """The launch of a kernel built with the shifter (plane_mode 2) keeps its arguments (the filter
    through the ring's first slots, the box of the column at offset 0) after the choice that made
    it would be another: the source and its launches agree."""
    from fusionplan.runtime.sass import captured_launch

    kernel = solver_named("gluon-rows").build(layer("r50_02", layout="NCHW").spec(), fp.Handle("cpu"))
    monkeypatch.setattr(gluon_rows, "shifted_planes_why_not", lambda spec: "refused")
    _, _, args, _, _ = captured_launch(kernel)
    named = dict(zip(kernel.launcher.names, args))
    assert (named["PLANES"], named["ZERO_COL"], named["W_SLOTS"]) == (2, 1, 3)
    assert "def _shift_partition(" in kernel.source()
