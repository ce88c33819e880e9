"""Gluon column-pairs solver: a convolution of 3x3 filters at stride 1 or 2 with padding 1, or of
1x1 filters at stride 2, on packed NCHW input of even width (ResNet's 3x3 layers but the 7x7 one:
r50_02, r50_06, r50_10, r50_12, r50_16, r50_18; its strided 1x1 layers r50_08, r50_14, r50_20),
followed by any chain of bias, batch-norm inference and activations, as ONE warp-specialized
kernel (Hopper only).

An output pixel's filter row meets three neighbouring input columns (stride 2: 2 * ow - 1 .. 2 *
ow + 1): no tensor box starts on a column of an NCHW plane's row unless it is whole 16-byte units
away, nor takes every other column, and the gather kernels load each element alone (r50_18 at
1.91x its NHWC time on gluon-nchw; bench/NOTES.md sections 41-42). But with the rows even (W
even, so every row and plane starts on an even element), the columns (2j, 2j + 1) are one
aligned 4-byte unit. At stride 2 the unit j = ow holds two of the pixel's taps (filter columns 1
and 2), and the unit before it the third (column 0) beside a column the filter never meets. At
stride 1, for even output columns ow = 2j the same (units j and j - 1); for odd ones ow = 2j + 1
unit j holds filter columns 0 and 1, and the unit after it column 2 beside an unused one: the two
classes of output columns take different weights, so each program computes one class (stride 1:
two classes, their programs side by side). ``cp.async`` copies such units whole, and a unit is
one pixel's two neighbouring reduction elements in wgmma's K-major operand [pixels, K] (K = a
channel's pair after another's): a reduction step is 32 input channels of one filter row, their
"main" units or their other ones: 4 reduction elements for 3 taps, 4/3 of the products. Both
halves of a unit share their mask (the same input row, both columns inside it), so the filter's
padding is a whole unit zero-filled. A 1x1 filter at stride 2 reads column 2 * ow alone: its
unit (2 * ow, 2 * ow + 1) is the one kind, the odd column's weight zero (twice the products, where
the gathers load each element alone).

The weights are packed to match ([classes * K, R * (C / 32) * 2 * 64]: for each class, 32-channel
block, filter row and kind, each channel's pair of weights, a zero for the unused column). A
partition of COPY_WARPS warps requests each step's weights by TMA and copies its input units
(a warp's copies: 8 neighbouring output pixels' units of 4 channels, each channel's 8 units one
32-byte run of an input row, each pixel's 4 units 16 bytes of its operand row, so that the rows'
swizzle spreads the 8 pixels over every shared-memory bank), and the stage's ``copied`` barrier
announces the
step once every copying thread's copies have landed and its unused halves are zeroed; the
computing warps run the products [pixels, channels] with one step in flight. Tiles of a class's
flat output pixels (any images, rows and columns) x output channels; gluon-nchw's epilogue and
stores.

A unit's unused column meets a zero weight, and 0 x Inf (or NaN) is NaN: so that a NaN or Inf in
the input reaches only the outputs whose windows hold it, each copying thread waits for its copies
of a step once it has issued the next step's, zeroes the unused halves of its own units in shared
memory, and only then is the step announced (one arrival after a barrier of the copying warps).
Off until measured (tuning.GLUON_COLUMN_PAIRS): `fusionplan-bench
--tuning GLUON_COLUMN_PAIRS=0,1`.
Gluon has no interpreter: the kernel runs on Hopper GPUs only (CPU tests compile it for sm_90).
"""

from __future__ import annotations

import torch

from fusionplan import tuning
from fusionplan.folding import Stage, split_at_conv
from fusionplan.launch import needs_int64
from fusionplan.solvers.base import Kernel, PlanSpec, Solver
from fusionplan.solvers.gluon_gemm import multiprocessors
from fusionplan.solvers.gluon_nchw import _STORE, OUT_LAYOUT
from fusionplan.solvers.gluon_odd_planes import (
    COPY_RING,
    COPY_RING_INVALIDATION,
    COPY_WARPS,
    off_until_measured,
    packed_nchw_why_not,
    paired_copies_why_not,
)
from fusionplan.solvers.gluon_window import gluon_descriptor, gluon_epilogue, gluon_names, gluon_why_not, hopper_why_not
from fusionplan.solvers.triton_conv import TritonConvKernel, conv_plan_why_not, triton_cdiv

Tensor = torch.Tensor

#: Input channels a reduction step (their units: 64 reduction elements, 128 bytes a pixel), and
#: the copying partition's registers (its threads also hold a step's units to zero their unused
#: halves, 32 words at 128 pixels: at 56 registers ptxas spilled 8 bytes, at 72 the 1x1 filters'
#: kernel, zeroing every step, 24-48, at 96 with rings of 2 or 3 stages 16-32; none at 112 for
#: any tile and ring of 2 to 4 stages, Triton 3.6 and 3.9).
STEP_CHANNELS = 32
BLOCK_K = 2 * STEP_CHANNELS
COPY_REGS = 112

#: Tiles (output pixels, output channels, warps: a warpgroup per 64 pixels) in order of preference:
#: the first whose grid fills half the multiprocessors.
PAIR_TILES = ((128, 128, 8), (64, 128, 4), (64, 64, 4))

_TEMPLATE = '''"""Generated by fusionplan: 3x3 convolution, NCHW input by column pairs, + {chain} ({n_stages})."""
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)


@gluon.jit
def _tile_pixels(
    m0, par, M, OH, OWC, W, sxn, HW: gl.constexpr, R: gl.constexpr, STRIDE: gl.constexpr, PIXELS: gl.constexpr,
    BLOCK_K: gl.constexpr, WARPS_M: gl.constexpr,
):
    # what every step's copies share, computed once (a program's copying warps issue one step after
    # another, a warp each scheduler: each instruction of a step is on their critical path): the
    # tile's pixels (output columns j of its class; stride 1: columns 2 * j + par) as the first
    # input row and column of their windows and the offset of their first main unit; the channels'
    # offsets in a 32-channel block. A unit a thread; a warp's lanes 8 pixels x 4 channels (a
    # channel's 8 units are 32 contiguous bytes of an input row; a pixel's 4 units 16 bytes of its
    # swizzled operand row, the 8 rows in 8 different 16-byte columns: no bank conflicts), WARPS_M
    # warps along the pixels, the rest along the channels.
    layout: gl.constexpr = gl.BlockedLayout([1, 2], [8, 4], [WARPS_M, gl.num_warps() // WARPS_M], [1, 0])
    m = m0 + gl.arange(0, PIXELS, layout=gl.SliceLayout(1, layout))
    image = m // (OH * OWC)
    pix = m % (OH * OWC)
    ih0 = STRIDE * (pix // OWC) - R // 2  # padding R // 2: 1 for 3x3 filters, 0 for 1x1
    col0 = 2 * (pix % OWC)
    base = image.to(gl.int64) * sxn + ih0 * W + col0
    e = gl.arange(0, BLOCK_K, layout=gl.SliceLayout(0, layout))
    channels = (e // 2).to(gl.int64) * HW + e % 2
    channels = gl.max_contiguous(gl.multiple_of(channels, 2), 2)  # a channel's unit: two elements
    return base, gl.where(m < M, ih0, -R - 1), col0, channels  # a pixel past the last: a row no step reads


@gluon.jit
def _copy_step(
    x_ptr, buf, base, ih0, col0, channels, kb, par, H, W, HW: gl.constexpr, R: gl.constexpr, KINDS: gl.constexpr,
    BLOCK_K: gl.constexpr,
):
    # step kb's [PIXELS, BLOCK_K] operand: its 32-channel block, filter row and kind, each pixel's
    # units of the block's channels side by side. Kind 0, the main units: columns (2 * j, 2 * j +
    # 1); kind 1: the unit before (stride 2, and stride 1's even columns) or after (stride 1's odd
    # columns).
    cb = kb // (KINDS * R)
    dh = (kb // KINDS) % R
    shift = 2 * (kb % KINDS) * (2 * par - 1)
    ih = ih0 + dh
    col = col0 + shift
    live = (ih >= 0) & (ih < H) & (col >= 0) & (col < W)
    offset = (cb * (BLOCK_K // 2)).to(gl.int64) * HW + dh * W + shift
    pixels = gl.multiple_of(base + offset, 2)  # W, HW and sxn even: even elements
    {async_copy}(buf, x_ptr + pixels[:, None] + channels[None, :], mask=live[:, None])


@gluon.jit
def _load_partition(
    x_ptr, w_desc, x_bufs, w_bufs, ready, copied, empty, m0, par, k0, w_row, M, H, W, OH, OWC, sxn, steps,
    HW: gl.constexpr, R: gl.constexpr, KINDS: gl.constexpr, STRIDE: gl.constexpr, PIXELS: gl.constexpr,
    BLOCK_K: gl.constexpr, NUM_STAGES: gl.constexpr, WARPS_M: gl.constexpr, LAG: gl.constexpr,
):
    # a step's weights by TMA on ``ready``, its input units by copies; a step is announced on
    # ``copied`` (_land_step) once its own copies have landed and LAG later steps' are issued, so
    # that LAG + 1 steps' copies are in flight (announce_lag: at most NUM_STAGES - 2)
    base, ih0, col0, channels = _tile_pixels(m0, par, M, OH, OWC, W, sxn, HW, R, STRIDE, PIXELS, BLOCK_K, WARPS_M)
    for kb in range(steps):
        stage = kb % NUM_STAGES
        # the first round finds every buffer free (the phase before a new barrier's first counts as done)
        mbarrier.wait(empty.index(stage), ((kb // NUM_STAGES) & 1) ^ 1)
        mbarrier.expect(ready.index(stage), w_desc.block_type.nbytes)
        {tma_load}(w_desc, [w_row, kb * BLOCK_K], ready.index(stage), w_bufs.index(stage))
        _copy_step(x_ptr, x_bufs.index(stage), base, ih0, col0, channels, kb, par, H, W, HW, R, KINDS, BLOCK_K)
        async_copy.commit_group()
        if kb >= LAG:
            _land_step(x_bufs, copied, kb - LAG, par, LAG, KINDS, PIXELS, BLOCK_K, NUM_STAGES, WARPS_M)
    for j in gl.static_range(LAG):  # the last LAG steps, each with one group fewer left in flight
        _land_step(x_bufs, copied, steps - LAG + j, par, LAG - 1 - j, KINDS, PIXELS, BLOCK_K, NUM_STAGES, WARPS_M)


@gluon.jit
def _land_step(
    x_bufs, copied, kb, par, OUTSTANDING: gl.constexpr, KINDS: gl.constexpr, PIXELS: gl.constexpr,
    BLOCK_K: gl.constexpr, NUM_STAGES: gl.constexpr, WARPS_M: gl.constexpr,
):
    # Step kb's copies landed (each thread's own: OUTSTANDING later steps' groups may still fly);
    # the column no tap reads zeroed, so that its zero weight never meets an Inf or NaN (0 x Inf is
    # NaN): in units of kind 1 the first half (at stride 1's odd columns the second), in a 1x1
    # filter's every unit the second (the odd column). The units seen as 32-bit words (the same
    # bytes and swizzle); then the step announced.
    async_copy.wait_group(OUTSTANDING)
    stage = kb % NUM_STAGES
    if (kb % 2 == 1) | (KINDS == 1):
        words: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=32, rank=2)
        units = x_bufs.index(stage).{reinterpret}(gl.int32, [PIXELS, BLOCK_K // 2], words)
        mine: gl.constexpr = gl.BlockedLayout([1, 1], [8, 4], [WARPS_M, gl.num_warps() // WARPS_M], [1, 0])
        if KINDS == 1:
            keep = 65535  # 0x0000FFFF: the first half kept
        else:
            keep = gl.where(par == 0, -65536, 65535)  # 0xFFFF0000: the second half kept; or the first
        units.store(units.load(mine) & keep)
        fence_async_shared()  # the stores (generic proxy), before wgmma reads them through the async proxy
    {thread_barrier}()  # every copying thread's units, before the step is announced
    mbarrier.arrive(copied.index(stage))


@gluon.jit
def _mma_partition(
    x_bufs, w_bufs, ready, copied, empty, steps,
    PIXELS: gl.constexpr, BLOCK_N: gl.constexpr, NUM_STAGES: gl.constexpr,
):
    # [pixels, channels] = input units @ weights^T, one step's product in flight
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[gl.num_warps(), 1], instr_shape=[16, BLOCK_N, 16]
    )
    acc = gl.zeros((PIXELS, BLOCK_N), gl.float32, acc_layout)
    for kb in range(steps):
        stage = kb % NUM_STAGES
        mbarrier.wait(ready.index(stage), (kb // NUM_STAGES) & 1)
        mbarrier.wait(copied.index(stage), (kb // NUM_STAGES) & 1)
        fence_async_shared()  # the copies' writes (generic proxy) before wgmma's reads
        acc = warpgroup_mma(x_bufs.index(stage), w_bufs.index(stage).permute((1, 0)), acc, is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=1, deps=[acc])
        # the product of the step before has finished: its stage may be refilled
        mbarrier.arrive(empty.index((kb + NUM_STAGES - 1) % NUM_STAGES), pred=kb > 0)
    acc = warpgroup_mma_wait(num_outstanding=0, deps=[acc])
    mbarrier.arrive(empty.index((steps - 1) % NUM_STAGES))  # the last stage
    return (acc,)


@gluon.jit
def gluon_column_pairs_kernel(
    x_ptr, w_desc, y_ptr, prior_ptr,
    {stage_params}
    M, C, K, H, W, OH, OW, OWC,
    sxn, syn, syc, syh, syw, spn, spc, sph, spw,
    HW: gl.constexpr, R: gl.constexpr, KINDS: gl.constexpr, STRIDE: gl.constexpr, CLASSES: gl.constexpr,
    PIXELS: gl.constexpr,
    BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr,
    NUM_STAGES: gl.constexpr, COPY_WARPS: gl.constexpr, COPY_REGS: gl.constexpr, COPY_WARPS_M: gl.constexpr,
    LAG: gl.constexpr, IDX64: gl.constexpr, HAS_PRIOR: gl.constexpr, OUT_PIXEL_MAJOR: gl.constexpr,
    {stage_flags}
):
    # w_desc: the packed weights [CLASSES * K, steps * BLOCK_K] (a class's after another's), boxes
    # of [BLOCK_N, BLOCK_K]. M: the output pixels of a class (N * OH * OWC). Channel tiles first,
    # then the classes, so that programs running side by side copy the same input rows.
    pid = gl.program_id(0)
    n_tiles = gl.cdiv(K, BLOCK_N)
    k0 = (pid % n_tiles) * BLOCK_N
    par = (pid // n_tiles) % CLASSES
    m0 = (pid // (n_tiles * CLASSES)) * PIXELS
    steps = (C // (BLOCK_K // 2)) * R * KINDS
    COPIED_ARRIVALS: gl.constexpr = 1  # _land_step's, once every copying thread's units are in place

    units: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
    x_bufs = gl.allocate_shared_memory(x_ptr.dtype.element_ty, [NUM_STAGES, PIXELS, BLOCK_K], units)
    w_bufs = gl.allocate_shared_memory(w_desc.dtype, [NUM_STAGES, BLOCK_N, BLOCK_K], w_desc.layout)
{copy_ring}{grid_dependency}
    (acc,) = gl.warp_specialize(
        [
            (_mma_partition, (x_bufs, w_bufs, ready, copied, empty, steps, PIXELS, BLOCK_N, NUM_STAGES)),
            (_load_partition, (x_ptr, w_desc, x_bufs, w_bufs, ready, copied, empty, m0, par, k0, par * K + k0, M,
                               H, W, OH, OWC, sxn, steps, HW, R, KINDS, STRIDE, PIXELS, BLOCK_K, NUM_STAGES,
                               COPY_WARPS_M,
                               LAG)),
        ],
        [COPY_WARPS],
        [COPY_REGS],
    )
{copy_ring_invalidation}
{out_layout}{coordinates_in_acc}
{tail}'''


#: The tile's pixels and channels in ``{layout}``: pixel m of the class is output column
#: CLASSES * (m % OWC) + par of row (m // OWC) % OH of image m // (OH * OWC).
_COORDINATES = """offs_m = m0 + gl.arange(0, PIXELS, layout=gl.SliceLayout(1, {layout}))
offs_n = k0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, {layout}))
m_mask = offs_m < M
n_mask = offs_n < K
if IDX64:  # offsets of outputs past 2^31 elements
    offs_m = offs_m.to(gl.int64)
    offs_n = offs_n.to(gl.int64)
n_img = offs_m // (OH * OWC)
oh = (offs_m // OWC) % OH
ow = (offs_m % OWC) * CLASSES + par
pix = oh * OW + ow
ch = offs_n"""


def render_gluon_column_pairs_source(spec: PlanSpec, stages: list[Stage]) -> str:
    """The kernel's source: _TEMPLATE with the epilogue of ``stages`` in Gluon's names."""
    epilogue = gluon_epilogue(spec, stages, _COORDINATES, _STORE, 4)
    return _TEMPLATE.format(
        out_layout=OUT_LAYOUT,
        copy_ring=COPY_RING,
        copy_ring_invalidation=COPY_RING_INVALIDATION,
        **epilogue,
        **gluon_names(),
    )


def pack_pairs(weight: Tensor, stride: int = 2) -> Tensor:
    """The R x 3 filter [K, C, R, 3] as [classes * K, (C / 32) * R * 2 * 64], in the filter's
    dtype: for each 32-channel block, filter row and kind, each channel's two weights. Even output
    columns (every column at stride 2): main (filter columns 1, 2), left (a zero, column 0); at
    stride 1 the odd output columns' after them: main (columns 0, 1), right (column 2, a zero).
    A 1x1 filter (stride 2) as [K, (C / 32) * 64]: each channel's weight, then a zero."""
    k, c, r, s = weight.shape
    if s == 1:
        w = weight.reshape(k, c)
        return torch.stack((w, torch.zeros_like(w)), dim=-1).reshape(k, -1).contiguous()
    w = weight.reshape(k, c // STEP_CHANNELS, STEP_CHANNELS, r, 3).permute(0, 1, 3, 2, 4)  # [K, block, row, ch, col]
    zero = torch.zeros_like(w[..., 0])
    even = torch.stack((w[..., 1:3], torch.stack((zero, w[..., 0]), dim=-1)), dim=3)  # [K, block, row, kind, ch, 2]
    classes = [even]
    if stride == 1:
        classes.append(torch.stack((w[..., 0:2], torch.stack((w[..., 2], zero), dim=-1)), dim=3))
    return torch.cat([packing.reshape(k, -1) for packing in classes]).contiguous()


def unit_kinds(filter_cols: int) -> int:
    """Kinds of units a filter row takes: 3 columns, the main units and the others; 1 column (a 1x1
    filter at stride 2), the main units (the column and its odd neighbour, which no tap reads)."""
    return 2 if filter_cols == 3 else 1


def column_classes(stride: int) -> int:
    """Programs' classes of output columns: at stride 1 the even and the odd ones (their units
    hold different taps), at stride 2 one."""
    return 2 if stride == 1 else 1


def column_pairs_why_not(spec: PlanSpec) -> str | None:
    """Why the kernel cannot run the plan's convolution, or None: 16-bit data, an ungrouped 3x3
    filter at stride 1 or 2 with padding 1, no dilation; packed NCHW input of even width (every
    input row and plane starts on an even element); input channels a multiple of 32, output
    channels of 64."""
    _, conv, _ = split_at_conv(spec.ops)
    assert conv is not None
    k, c, r, s = conv.w_desc.dims
    why = paired_copies_why_not(spec, conv.groups, "columns")
    if why:
        return why
    strides, pads, dilations = conv.conv.strides, conv.conv.pads, conv.conv.dilations
    three = (r, s) == (3, 3) and strides in ((1, 1), (2, 2)) and pads == (1, 1)
    one = (r, s) == (1, 1) and strides == (2, 2) and pads == (0, 0)
    if not (three or one) or dilations != (1, 1):
        return (
            f"a {r}x{s} filter, stride {strides}, padding {pads}, dilation {dilations}: 3x3 filters at "
            "stride 1 or 2 with padding 1, or 1x1 at stride 2 without, and no dilation only"
        )
    why = packed_nchw_why_not(spec)
    if why:
        return why
    w = spec.input_desc.dims[3]
    if w % 2:
        return f"input rows of {w} pixels: an even width (column pairs on 4-byte units) only"
    if c % STEP_CHANNELS or k % 64:
        return f"{c} input and {k} output channels: multiples of {STEP_CHANNELS} and 64"
    return None


def pairs_config(m: int, k: int, multiprocessors: int) -> tuning.ConvConfig:
    """The first of PAIR_TILES no wider than the output channels whose grid fills half the
    multiprocessors (the last otherwise), a ring of tuning.GLUON_COLUMN_PAIRS_STAGES stages:
    r50_18's 1568 pixels x 512 channels, 100 programs of 64 x 128; r50_12's 6272 x 256, 98 of
    128 x 128."""
    tiles = [t for t in PAIR_TILES if t[1] <= max(64, k)]
    pixels, block_n, warps = next(
        (t for t in tiles if triton_cdiv(m, t[0]) * triton_cdiv(k, t[1]) >= multiprocessors // 2), tiles[-1]
    )
    return tuning.ConvConfig(pixels, block_n, BLOCK_K, 8, warps, tuning.GLUON_COLUMN_PAIRS_STAGES, 1)


def announce_lag(stages: int, steps: int) -> int:
    """How many later steps' copies the copying partition issues before it announces a step (so
    that lag + 1 steps' copies fly at once): at most 2, at most ``stages`` - 2, and fewer than the
    steps (landed_steps: with more, its last loop would land steps before the first). It waits for
    a stage before issuing into it, and the stage frees only once the products have moved past
    the step it held, stages - 1 behind; that step must already be announced, or both sides wait
    for ever (pipeline_finishes)."""
    if stages < 2:
        raise ValueError(f"a ring of {stages} stages: gluon-column-pairs needs 2 or more")
    return max(0, min(2, stages - 2, steps - 1))


def two_programs_registers(warps: int) -> int | None:
    """Registers a thread may hold for two programs of ``warps`` warps to fit a multiprocessor's
    65536 (a multiple of 8, as setmaxnreg counts them), or None where that leaves a thread fewer
    than the copying warps take (COPY_REGS): 128 at 8 warps, none at 12."""
    registers = 65536 // (2 * 32 * warps) // 8 * 8
    return registers if registers > COPY_REGS else None


def landed_steps(steps: int, lag: int) -> list[int]:
    """The steps _load_partition lands, in its order: in its main loop each step ``lag`` behind the
    one it issued, then the last ``lag`` ones."""
    return [kb - lag for kb in range(lag, steps)] + [steps - lag + j for j in range(lag)]


def pipeline_finishes(stages: int, lag: int, steps: int) -> bool:
    """Whether the ring's protocol as the kernel runs it ends, step by step: the copying side waits
    for a stage to be free (``empty``), issues the step, then announces the step ``lag`` behind
    (the rest after its last); the computing side waits for a step's announcement, issues its
    product and frees the stage of the step before (the last stage after the last). False where
    neither side can move before the end."""
    issued = announced = products = freed = 0
    while products < steps:
        if issued < steps and issued - freed < stages:  # the stage of step ``issued`` is free
            issued += 1
            announced = max(announced, min(issued - lag, steps) if issued < steps else steps)
        elif products < announced:  # the next product's step is announced
            products += 1
            freed = products - 1 if products < steps else steps
        else:
            return False
    return True


class GluonColumnPairsKernel(TritonConvKernel):
    solver_name = "gluon-column-pairs"
    stem = "gluon_column_pairs"
    splits_reduction = False

    def __init__(self, spec: PlanSpec, handle) -> None:
        self._handle = handle
        super().__init__(spec, handle)

    @staticmethod
    def render(spec: PlanSpec, stages: list[Stage]) -> str:
        return render_gluon_column_pairs_source(spec, stages)

    def heuristic(self, m: int, k_per_group: int, c_per_group: int, dtype: torch.dtype) -> tuning.ConvConfig:
        return pairs_config(m, k_per_group, multiprocessors(self._handle))  # m: the classes' pixels together

    @property
    def candidates(self) -> list[tuning.ConvConfig]:  # type: ignore[override]
        """NORMAL find's configurations: every tile of PAIR_TILES."""
        stages = tuning.GLUON_COLUMN_PAIRS_STAGES
        return [tuning.ConvConfig(p, n, BLOCK_K, 8, w, stages, 1) for p, n, w in PAIR_TILES]

    @property
    def classes(self) -> int:
        """Classes of output columns (column_classes)."""
        return column_classes(self.conv_args[2])

    def pack(self, weight: Tensor) -> Tensor:
        return pack_pairs(weight, self.conv_args[2])

    def programs_and_steps(self, cfg: tuning.ConvConfig) -> tuple[int, int]:
        m, c, k = self.geometry[:3]
        r = self.conv.w_desc.dims[2]
        tiles = self.classes * triton_cdiv(m // self.classes, cfg.block_m) * triton_cdiv(k, cfg.block_n)
        return tiles, (c // STEP_CHANNELS) * r * unit_kinds(self.conv.w_desc.dims[3])

    def registers(self, cfg: tuning.ConvConfig) -> int | None:
        """Where the grid is more than a wave of 64-pixel tiles (r50_02: 1568 programs), room for two
        programs a multiprocessor (two_programs_registers); else as Triton gives: it gives a
        warp-specialized kernel the whole register file (255 a thread at 8 warps), one program a
        multiprocessor, whose copying warps then issue alone, one warp a scheduler."""
        programs, _ = self.programs_and_steps(cfg)
        if programs <= multiprocessors(self._handle):
            return None
        return two_programs_registers(cfg.num_warps + COPY_WARPS)

    def _launch_args(
        self,
        cfg: tuning.ConvConfig,
        x: Tensor,
        packed: Tensor,
        out: Tensor,
        p: Tensor,
        values: list,
        flags: dict[str, bool],
        has_prior: bool,
        strides: tuple[int, ...] | None = None,
        idx64: bool | None = None,
    ) -> tuple[tuple[int, int, int], tuple, list]:
        m, c, k, h, w, oh, ow = self.geometry
        classes = self.classes
        programs, steps = self.programs_and_steps(cfg)
        columns = steps * BLOCK_K  # pack_pairs' columns
        w_desc = gluon_descriptor(packed, [classes * k, columns], [columns, 1], [cfg.block_n, BLOCK_K], 128, 16)
        strides = strides or (*x.stride(), *out.stride(), *p.stride())
        consts = (
            h * w,
            self.conv.w_desc.dims[2],
            unit_kinds(self.conv.w_desc.dims[3]),
            self.conv_args[2],  # the stride
            classes,
            cfg.block_m,
            cfg.block_n,
            BLOCK_K,
            cfg.num_stages,
            COPY_WARPS,
            COPY_REGS,
            min(COPY_WARPS, cfg.block_m // 8),  # copying warps along the pixels (8 a warp)
            announce_lag(cfg.num_stages, steps),
            needs_int64(x, out, p) if idx64 is None else idx64,
            has_prior,
            strides[5] != 1,  # output channels apart: lanes along the pixels
            *flags.values(),
        )
        grid = (programs, 1, 1)
        geometry = (m // classes, c, k, h, w, oh, ow, ow // classes)  # M and OWC: a class's
        args = [x, w_desc, out, p, *values, *geometry, strides[0], *strides[4:], *consts]
        return grid, cfg, args


class GluonColumnPairsSolver(Solver):
    name = "gluon-column-pairs"
    family = "triton"

    def why_not(self, spec: PlanSpec, handle) -> str | None:
        return conv_plan_why_not(spec) or column_pairs_why_not(spec) or gluon_why_not() or hopper_why_not(handle)

    def defer_why(self, spec: PlanSpec, handle) -> str | None:
        return off_until_measured("GLUON_COLUMN_PAIRS")

    def build(self, spec: PlanSpec, handle) -> Kernel:
        return GluonColumnPairsKernel(spec, handle)
