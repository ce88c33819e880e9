"""Gluon gather solver: a convolution (any filter, stride, padding, dilation; ungrouped) on input
that tensor boxes cannot read, NCHW above all, followed by any chain of bias, batch-norm inference
and activations, as ONE warp-specialized kernel (Hopper only).

NCHW planes of 14x14 and 7x7 pixels are 392 and 98 bytes: no tensor box (16-byte strides) and no
16-byte copy reads them, and a filter tap shifts a plane by one element, so every input element
is a 2-byte load. triton-conv issues those loads from its computing warps, stores the operand to
shared memory and waits for each product before the next store (bench/NOTES.md, section 18: 2-4x
its NHWC time on those layers). Here a gathering partition of its own warps does the loads: a
warp's load is 32 neighbouring pixels of one channel (contiguous along a plane's row), each
thread holds 8 channels of its pixel and stores them as one 16-byte row piece of the stage's
[pixels, channels] operand, the layout gluon-gemm's TMA boxes leave; the weights' tile of the
stage comes by TMA. The computing warpgroup is gluon-window's: it waits for each stage, issues its
wgmma with one product in flight and frees the stage before it, so the gathers of the next stages
run under the products. A stage's stores need a proxy fence before wgmma reads them. One to
three gathering partitions take the reduction's steps in turn (gather_partitions), each with its
own loads and fences, its loop unrolled by the steps it has in flight so that no loaded value is
copied before it is stored (a copy waits for the load; bench/NOTES.md sections 21, 48 and 49).

A program computes one tile of flat output pixels (any images, rows and columns) x output
channels; programs that share pixels run side by side (channel tiles first) and find the
input's lines in L2. Gluon has no interpreter: the kernel runs on Hopper GPUs only (CPU tests
compile it for sm_90).
"""

from __future__ import annotations

from dataclasses import replace

import torch

from fusionplan import tuning
from fusionplan.enums import DataType
from fusionplan.folding import Stage, split_at_conv
from fusionplan.launch import needs_int64
from fusionplan.solvers.base import Kernel, PlanSpec, Solver
from fusionplan.solvers.conv_kernel import TritonConvKernel
from fusionplan.solvers.conv_toolkit import conv_plan_why_not, pack_rows_rsc, triton_cdiv
from fusionplan.solvers.gluon_toolkit import (
    GATHER_STORE,
    OUT_LAYOUT,
    gather_why_not,
    gluon_descriptor,
    gluon_dtype_why_not,
    gluon_epilogue,
    gluon_names,
    gluon_why_not,
    hopper_why_not,
    multiprocessors,
)

Tensor = torch.Tensor

#: A tile's gathered pixels and one reduction step's input operand, gathered in the layout of
#: its pointers (both gluon-nchw kernels).
GATHER_STEP = """@gluon.jit
def _tap_and_block(kb, num_cb, TAPS: gl.constexpr, TAPS_INNER: gl.constexpr):
    # Step kb's filter tap and channel block: the taps of a channel block one after another
    # (TAPS_INNER: their shifted reads of the same input lines meet in L1), or the channel blocks
    # of a tap.
    if TAPS_INNER:
        return kb % TAPS, kb // TAPS
    else:
        return kb // num_cb, kb % num_cb


@gluon.jit
def _weights_column(kb, num_cb, C, TAPS: gl.constexpr, BLOCK_K: gl.constexpr, TAPS_INNER: gl.constexpr):
    # step kb's first column of the packed weights ([K, R*S*C], a tap's C channels after another's)
    t, cb = _tap_and_block(kb, num_cb, TAPS, TAPS_INNER)
    return t * C + cb * BLOCK_K


@gluon.jit
def _gather_pixels(
    m0, M, OH, OW, sxn, pad_h, pad_w, layout: gl.constexpr, STR_H: gl.constexpr, STR_W: gl.constexpr,
    PIXELS: gl.constexpr, BLOCK_K: gl.constexpr, IDX64: gl.constexpr,
):
    # The tile's flat output pixels in ``layout`` (of the [pixels, BLOCK_K] operand): each one's
    # image offset, first tap's input row and column, and mask; and the channels' offsets.
    offs_m = m0 + gl.arange(0, PIXELS, layout=gl.SliceLayout(1, layout))
    offs_c = gl.arange(0, BLOCK_K, layout=gl.SliceLayout(0, layout))
    m_mask = offs_m < M
    if IDX64:  # offsets of inputs past 2^31 elements
        offs_m = offs_m.to(gl.int64)
        offs_c = offs_c.to(gl.int64)
    ohw = OH * OW
    pix = offs_m % ohw
    ih0 = (pix // OW) * STR_H - pad_h
    iw0 = (pix % OW) * STR_W - pad_w
    base = (offs_m // ohw) * sxn
    return base, ih0, iw0, m_mask, offs_c


@gluon.jit
def _gather_step(
    x_ptr, base, ih0, iw0, m_mask, offs_c, kb, steps, num_cb, C, H, W, sxh, sxw, dil_h, dil_w,
    SXC: gl.constexpr, R: gl.constexpr, S: gl.constexpr, BLOCK_K: gl.constexpr, WHOLE_CB: gl.constexpr,
    TAPS_INNER: gl.constexpr,
):
    # Step kb's [pixels, BLOCK_K] operand (zeros past the last step): its tap's input pixels, each
    # thread's channels of its pixel one address and constant offsets (SXC, the channel stride, is
    # a constant of the plan: immediates of the loads).
    t, cb = _tap_and_block(kb, num_cb, R * S, TAPS_INNER)
    c0 = cb * BLOCK_K
    ih = ih0 + (t // S) * dil_h
    iw = iw0 + (t % S) * dil_w
    inside = m_mask & (ih >= 0) & (ih < H) & (iw >= 0) & (iw < W) & (kb < steps)
    ptrs = (x_ptr + (base + ih * sxh + iw * sxw + c0 * SXC))[:, None] + (offs_c * SXC)[None, :]
    if WHOLE_CB:  # C a multiple of BLOCK_K: no channel past C
        mask = inside[:, None]
    else:  # channels past C read zeros, so the weight columns of the next tap they meet add nothing
        mask = inside[:, None] & ((c0 + offs_c) < C)[None, :]
    return gl.load(ptrs, mask=mask, other=0.0)


"""

_TEMPLATE = '''"""Generated by fusionplan: warp-specialized convolution, gathered input, + {chain} ({n_stages})."""
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)


{gather_step}@gluon.jit
def _load_weights(w_desc, w_bufs, ready, stage, k0, kb, num_cb, C, TAPS: gl.constexpr, BLOCK_K: gl.constexpr,
                  TAPS_INNER: gl.constexpr):
    # step kb's weights tile into the stage by TMA; the expect is one of the stage's arrivals
    mbarrier.expect(ready.index(stage), w_desc.block_type.nbytes)
    {tma_load}(w_desc, [k0, _weights_column(kb, num_cb, C, TAPS, BLOCK_K, TAPS_INNER)], ready.index(stage),
               w_bufs.index(stage))


@gluon.jit
def _fill_stage(
    v, kb, kb_lo, k0, num_cb, C, w_desc, a_bufs, w_bufs, ready, empty, TAPS: gl.constexpr, BLOCK_K: gl.constexpr,
    NUM_STAGES: gl.constexpr, TAPS_INNER: gl.constexpr, EARLY_WEIGHTS: gl.constexpr,
):
    # Step kb's stage once it is free: its gathered input ``v`` stored, fenced and announced, its
    # weights requested. With EARLY_WEIGHTS the weights are requested as soon as the stage is free
    # and the stage's ready barrier counts two arrivals (the weights' expect, the stores' arrival);
    # else one, the weights requested after the stores.
    stage = kb % NUM_STAGES
    # the first round finds every buffer free (the phase before a new barrier's first counts as done)
    mbarrier.wait(empty.index(stage), ((kb // NUM_STAGES) & 1) ^ 1)
    if EARLY_WEIGHTS:  # the weights' load runs under the stores and the fence
        _load_weights(w_desc, w_bufs, ready, stage, k0, kb_lo + kb, num_cb, C, TAPS, BLOCK_K, TAPS_INNER)
    a_bufs.index(stage).store(v)
    fence_async_shared()  # the stores, before wgmma reads them through the async proxy
    {thread_barrier}()  # every gathering warp's stores, before the stage is announced
    if EARLY_WEIGHTS:
        mbarrier.arrive(ready.index(stage))  # the stage's second arrival: its input is stored
    else:
        _load_weights(w_desc, w_bufs, ready, stage, k0, kb_lo + kb, num_cb, C, TAPS, BLOCK_K, TAPS_INNER)


@gluon.jit
def _gather_partition(
    x_ptr, w_desc, a_bufs, w_bufs, ready, empty,
    m0, k0, M, C, H, W, OH, OW, sxn, sxh, sxw, pad_h, pad_w, dil_h, dil_w, kb_lo, kb_hi, num_cb,
    SXC: gl.constexpr, R: gl.constexpr, S: gl.constexpr, STR_H: gl.constexpr, STR_W: gl.constexpr,
    PIXELS: gl.constexpr, BLOCK_K: gl.constexpr, NUM_STAGES: gl.constexpr, WARPS_M: gl.constexpr, IDX64: gl.constexpr,
    WHOLE_CB: gl.constexpr, PREFETCH: gl.constexpr, PART: gl.constexpr, GATHERERS: gl.constexpr,
    TAPS_INNER: gl.constexpr, EARLY_WEIGHTS: gl.constexpr,
):
    # Lanes along the pixels (a warp's load: 32 neighbouring pixels of one channel), 8 channels
    # per thread (a 16-byte piece of its pixel's row in the stage's [pixels, BLOCK_K] operand).
    # The loads run PREFETCH of this partition's steps ahead of its stores (1 to 3); GATHERERS
    # partitions take the steps in turn (this one: PART, PART + GATHERERS, ...), each with its own
    # loads and fences. The program's steps are kb_lo .. kb_hi - 1 of the reduction (a part of it
    # where it is split); kb counts from 0 (the ring's stages and phases), kb_lo + kb is the step
    # gathered.
    # A turn of the loop is PREFETCH + 1 steps, statically unrolled, the tuple of the steps' values
    # rotated at each: renamings, so the values of each step keep their registers. A loop of one
    # step hands its values on (v0 = v1), and the copies wait for the loads in flight (the compiler
    # packs the loaded halves in pairs to move them): the steps ahead had arrived before the next
    # step's loads were issued, one step in flight whatever PREFETCH said (bench/NOTES.md section 49).
    layout: gl.constexpr = gl.BlockedLayout([1, 8], [32, 1], [WARPS_M, gl.num_warps() // WARPS_M], [1, 0])
    base, ih0, iw0, m_mask, offs_c = _gather_pixels(
        m0, M, OH, OW, sxn, pad_h, pad_w, layout, STR_H, STR_W, PIXELS, BLOCK_K, IDX64
    )
    TAPS: gl.constexpr = R * S
    G: gl.constexpr = GATHERERS
    n = kb_hi - kb_lo
    # the values of this partition's next PREFETCH steps, the oldest first
    vals = ()
    for j in gl.static_range(PREFETCH):
        vals = vals + (
            _gather_step(
                x_ptr, base, ih0, iw0, m_mask, offs_c, kb_lo + PART + j * G, kb_hi, num_cb, C, H, W, sxh, sxw,
                dil_h, dil_w, SXC, R, S, BLOCK_K, WHOLE_CB, TAPS_INNER,
            ),
        )
    for kb in range(PART, n, (PREFETCH + 1) * G):
        for j in gl.static_range(PREFETCH + 1):
            # step kb + j * G: the loads of the step PREFETCH ahead issued before its stores wait for
            # its own values; the values of steps past the end are masked loads (no memory access),
            # never stored
            ahead = _gather_step(
                x_ptr, base, ih0, iw0, m_mask, offs_c, kb_lo + kb + (j + PREFETCH) * G, kb_hi, num_cb, C, H, W,
                sxh, sxw, dil_h, dil_w, SXC, R, S, BLOCK_K, WHOLE_CB, TAPS_INNER,
            )
            if kb + j * G < n:
                _fill_stage(vals[0], kb + j * G, kb_lo, k0, num_cb, C, w_desc, a_bufs, w_bufs, ready, empty, TAPS,
                            BLOCK_K, NUM_STAGES, TAPS_INNER, EARLY_WEIGHTS)
            vals = vals[1:] + (ahead,)


@gluon.jit
def _mma_partition(
    a_bufs, w_bufs, ready, empty, steps,
    BLOCK_N: gl.constexpr, PIXELS: gl.constexpr, NUM_STAGES: gl.constexpr, ELEM_BITS: gl.constexpr,
    PIXEL_ROWS: gl.constexpr,
):
    # Both operands read by wgmma from shared memory. PIXEL_ROWS: [pixels, channels] = input @
    # weights^T, each instruction the tile's pixels x all its channels (one read of the input rows
    # for BLOCK_N channels); else [channels, pixels] = weights @ input^T, an instruction for every
    # 64 channels, each reading the stage's input again.
    ROWS: gl.constexpr = PIXELS if PIXEL_ROWS else BLOCK_N  # the accumulator's rows and columns
    COLS: gl.constexpr = BLOCK_N if PIXEL_ROWS else PIXELS
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[gl.num_warps(), 1], instr_shape=[16, COLS, 256 // ELEM_BITS]
    )
    acc = gl.zeros((ROWS, COLS), gl.float32, acc_layout)
    for kb in range(steps):
        stage = kb % NUM_STAGES
        mbarrier.wait(ready.index(stage), (kb // NUM_STAGES) & 1)
        if PIXEL_ROWS:
            acc = warpgroup_mma(a_bufs.index(stage), w_bufs.index(stage).permute((1, 0)), acc, is_async=True)
        else:
            acc = warpgroup_mma(w_bufs.index(stage), a_bufs.index(stage).permute((1, 0)), acc, is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=1, deps=[acc])
        # the product of the step before has finished: its stage may be refilled
        mbarrier.arrive(empty.index((kb + NUM_STAGES - 1) % NUM_STAGES), pred=kb > 0)
    acc = warpgroup_mma_wait(num_outstanding=0, deps=[acc])
    return (acc,)


@gluon.jit
def gluon_nchw_kernel(
    x_ptr, w_desc, y_ptr, prior_ptr, ws_ptr, cnt_ptr,
    {stage_params}
    M, C, K, H, W, OH, OW,
    sxn, sxh, sxw, syn, syc, syh, syw, spn, spc, sph, spw,
    pad_h, pad_w, dil_h, dil_w,
    SXC: gl.constexpr, R: gl.constexpr, S: gl.constexpr, STR_H: gl.constexpr, STR_W: gl.constexpr,
    PIXELS: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr, NUM_STAGES: gl.constexpr,
    SWIZZLE: gl.constexpr, ELEM_BITS: gl.constexpr, GATHER_WARPS: gl.constexpr, WARPS_M: gl.constexpr,
    GATHER_REGS: gl.constexpr, PREFETCH: gl.constexpr, GATHERERS: gl.constexpr, SPLIT_K: gl.constexpr,
    EARLY_WEIGHTS: gl.constexpr, PIXEL_ROWS: gl.constexpr, PAIR_SUM: gl.constexpr, IDX64: gl.constexpr,
    HAS_PRIOR: gl.constexpr,
    WHOLE_CB: gl.constexpr, OUT_PIXEL_MAJOR: gl.constexpr, TAPS_INNER: gl.constexpr,
    {stage_flags}
):
    # w_desc: the weights as [K, R*S*C], boxes of [BLOCK_N, BLOCK_K]. Tiles in order of their
    # channel blocks first, so that programs running side by side gather the same input pixels.
    pid = gl.program_id(0)
    n_tiles = gl.cdiv(K, BLOCK_N)
    k0 = (pid % n_tiles) * BLOCK_N
    m0 = (pid // n_tiles) * PIXELS

    flat: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=SWIZZLE, element_bitwidth=ELEM_BITS, rank=2)
    a_bufs = gl.allocate_shared_memory(x_ptr.dtype.element_ty, [NUM_STAGES, PIXELS, BLOCK_K], flat)
    w_bufs = gl.allocate_shared_memory(w_desc.dtype, [NUM_STAGES, BLOCK_N, BLOCK_K], w_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(NUM_STAGES):
        if EARLY_WEIGHTS:
            mbarrier.init(ready.index(i), count=2)
        else:
            mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=1)
    fence_async_shared()
{grid_dependency}
    num_cb = gl.cdiv(C, BLOCK_K)
    # this program's part of the reduction's steps (all of them unless it is split)
    pid_k = gl.program_id(2)
    per_part = gl.cdiv(R * S * num_cb, SPLIT_K)
    kb_lo = pid_k * per_part
    kb_hi = gl.minimum(kb_lo + per_part, R * S * num_cb)
    steps = kb_hi - kb_lo
    # the computing warpgroup (the default partition) and GATHERERS gathering partitions
    if GATHERERS == 1:
        (acc,) = gl.warp_specialize([{mma}, {gatherer_0_of_1}], [GATHER_WARPS], [GATHER_REGS])
    elif GATHERERS == 2:
        (acc,) = gl.warp_specialize(
            [{mma}, {gatherer_0_of_2}, {gatherer_1_of_2}], [GATHER_WARPS, GATHER_WARPS], [GATHER_REGS, GATHER_REGS]
        )
    else:
        (acc,) = gl.warp_specialize(
            [{mma}, {gatherer_0_of_3}, {gatherer_1_of_3}, {gatherer_2_of_3}],
            [GATHER_WARPS, GATHER_WARPS, GATHER_WARPS],
            [GATHER_REGS, GATHER_REGS, GATHER_REGS],
        )
    # the ring's barriers invalidated after their last use, before the epilogue's buffers may take
    # their memory (PTX lets an mbarrier's memory serve nothing else until it is invalidated)
    for i in gl.static_range(NUM_STAGES):
        mbarrier.invalidate(ready.index(i))
        mbarrier.invalidate(empty.index(i))

{out_layout}    if not PIXEL_ROWS:
        acc = gl.permute(acc, (1, 0))  # the chain in the accumulator's own layout, [pixels, channels]
{split}{coordinates_in_acc}
{tail}'''


#: A split reduction's end (conv_kernel.SPLIT_K_REDUCE in Gluon's terms): each of a tile's
#: SPLIT_K programs stores its fp32 partial of the accumulator; the last to arrive sums them in
#: split order (the same result whichever arrives last), resets the tile's counter for the next
#: launch and goes on to the epilogue; the others end here.
GLUON_SPLIT_REDUCE = """    if SPLIT_K > 1:
        # the tile as wgmma left it ([pixels, channels] with PIXEL_ROWS, else [channels, pixels]): a
        # thread's neighbouring values are one 8-byte store
        tile_px = gl.arange(0, PIXELS, layout=gl.SliceLayout(1, acc.type.layout))[:, None]
        tile_ch = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, acc.type.layout))[None, :]
        if PIXEL_ROWS:
            offs_tile = tile_px * BLOCK_N + tile_ch
        else:
            offs_tile = tile_px + tile_ch * PIXELS
        tile_ws = ws_ptr + pid * (SPLIT_K * PIXELS * BLOCK_N)
        gl.store(tile_ws + pid_k * (PIXELS * BLOCK_N) + offs_tile, acc, cache_modifier=".cg")
        {thread_barrier}()  # the whole partial is written before the arrival is counted
        arrived = gl.atomic_add(cnt_ptr + pid, 1, sem="acq_rel", scope="gpu")
        if arrived < SPLIT_K - 1:
            return
        if PAIR_SUM:  # two parts: p0 + p1 == p1 + p0 exactly, so the other part's partial onto this one's
            acc += gl.load(tile_ws + (1 - pid_k) * (PIXELS * BLOCK_N) + offs_tile, cache_modifier=".cg")
        else:
            acc = gl.load(tile_ws + offs_tile, cache_modifier=".cg")
            for part in range(1, SPLIT_K):
                acc += gl.load(tile_ws + part * (PIXELS * BLOCK_N) + offs_tile, cache_modifier=".cg")
        gl.atomic_xchg(cnt_ptr + pid, 0, sem="relaxed", scope="gpu")
"""

#: The computing partition and its arguments.
_MMA = "(_mma_partition, (a_bufs, w_bufs, ready, empty, steps, BLOCK_N, PIXELS, NUM_STAGES, ELEM_BITS, PIXEL_ROWS))"

#: A gathering partition and its arguments: partition {part} of {parts}.
_GATHERER = """(
                _gather_partition,
                (x_ptr, w_desc, a_bufs, w_bufs, ready, empty, m0, k0, M, C, H, W, OH, OW, sxn, sxh, sxw,
                 pad_h, pad_w, dil_h, dil_w, kb_lo, kb_hi, num_cb, SXC, R, S, STR_H, STR_W, PIXELS, BLOCK_K, NUM_STAGES,
                 WARPS_M, IDX64, WHOLE_CB, PREFETCH, {part}, {parts}, TAPS_INNER, EARLY_WEIGHTS),
            )"""

#: A tile's flat pixels and channels in ``{layout}``: masks, image, row, column, offsets.
_COORDINATES = """offs_m = m0 + gl.arange(0, PIXELS, layout=gl.SliceLayout(1, {layout}))
offs_n = k0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, {layout}))
m_mask = offs_m < M
n_mask = offs_n < K
if IDX64:  # offsets of outputs past 2^31 elements
    offs_m = offs_m.to(gl.int64)
    offs_n = offs_n.to(gl.int64)
n_img = offs_m // ohw
pix = offs_m % ohw
oh = pix // OW
ow = pix % OW
ch = offs_n"""


#: Registers a thread of the computing warpgroup keeps beside its accumulator (the epilogue's, the
#: addresses): the gathering partitions share the rest of the multiprocessor's 64K (mma_regs).
MMA_SPARE_REGS = 48
#: The least the computing warpgroup keeps (64-value accumulators: 128 left to 12 gathering warps,
#: the three steps' values of an unrolled loop two steps ahead without spilling).
MMA_MIN_REGS = 120

#: Gathering warps at most beside the computing warpgroup: the largest side measured (three
#: partitions of 4); with 24 (three of 8) ptxas had 72 registers a thread and refused to compile.
MAX_GATHER_WARPS = 12

#: The gathering side by the tile's pixels: (warps of a partition, partitions, prefetch steps).
#: H100 A/B (fp16, batch 32, CBNA, CUDA-graph replay, bench/NOTES.md section 21): 64-pixel tiles
#: with three partitions of 4 warps: r50_22 44.9 -> 35.7 us, r50_18 62.9 -> 56.7, r50_21 27.0 ->
#: 22.0; two steps ahead rather than one (section 48, fp16 and bf16, CBNA and CBA, 5 rounds):
#: r50_21 3-5 % faster, r50_22 1-5 %, r50_12 1-2 %, r50_18 0.5-1.3 %, r50_16 within 1 %; three
#: no faster. With the loop unrolled (section 49: the copies of the rolled loop had waited for the
#: loads ahead), fp16 and bf16 r50_12 5-6 % faster, r50_16 4-5 %, r50_18 3.5-4 %, r50_21 3 %, r50_22
#: 1-2 %; TF32's 3x3 layers two steps ahead too (r50_12 4 %, r50_16 3 %, r50_18 and r50_22 2 %; one
#: step ahead had measured faster with the rolled loop). 128-pixel tiles keep one partition of 8
#: warps two steps ahead (their 64 values a thread and step spill with more partitions: r50_16 34.7
#: against 98.7 with three).
GATHER_SHAPES = {128: (8, 1, 2), 64: (4, 3, 2)}


def gather_partitions(pixels: int) -> tuple[int, int, int]:
    """(warps of a gathering partition, partitions, prefetch steps) for tiles of ``pixels``:
    GATHER_SHAPES, or the tuning.GLUON_NCHW_GATHER_WARPS / _GATHERERS / _PREFETCH set (0: the
    table's)."""
    warps, parts, prefetch = GATHER_SHAPES[pixels]
    warps = tuning.GLUON_NCHW_GATHER_WARPS or warps
    parts = tuning.GLUON_NCHW_GATHERERS or parts
    prefetch = tuning.GLUON_NCHW_PREFETCH or prefetch
    if warps * parts > MAX_GATHER_WARPS or parts > 3 or warps not in (4, 8) or prefetch not in (1, 2, 3):
        raise ValueError(
            f"gathering side of {parts} partitions of {warps} warps, {prefetch} steps ahead: 4 or 8 warps, "
            f"1 to 3 partitions, at most {MAX_GATHER_WARPS} warps in all, 1 to 3 steps"
        )
    return warps, parts, prefetch


def shared_ring(stages: int, parts: int) -> tuple[int, int]:
    """(stages, partitions): the ring's stages a multiple of the gathering partitions, so that each
    stage has one partition filling it (a barrier's phase is one bit: a partition filling a stage
    after another's could pass its wait a whole round early), fewer partitions than 2 stages each
    where the ring is shallow."""
    parts = max(1, min(parts, stages // 2 if stages >= 4 else 1))
    return stages - stages % parts, parts


#: Registers beside one wgmma instruction's accumulator (BLOCK_N / 2 fp32 values a thread of the
#: [64, BLOCK_N] product) that ptxas asks for: 154 for 64 x 256 (C7602, "insufficient registers").
PIXEL_ROWS_SPARE_REGS = 26


def pixel_rows(block_n: int, warps: int) -> bool:
    """Whether the product is [pixels, channels] (tuning.GLUON_NCHW_PIXEL_ROWS): ptxas compiles the
    kernel within the registers a thread has at launch (64K over ``warps`` warps, before the
    partitions reallocate them), and one instruction of that product holds BLOCK_N / 2 accumulator
    registers: 64 x 256 tiles beside 12 gathering warps (128 registers at launch) keep the
    transposed product, whose instructions cover 64 channels."""
    at_launch = 65536 // (32 * warps) // 8 * 8
    return tuning.GLUON_NCHW_PIXEL_ROWS and block_n // 2 + PIXEL_ROWS_SPARE_REGS <= at_launch


def mma_regs(pixels: int, block_n: int) -> int:
    """Registers of a thread of the computing warpgroup: its share of the accumulator (pixels x
    block_n fp32 values over 128 threads) and MMA_SPARE_REGS, at least MMA_MIN_REGS (176 for 128 x
    128 and 64 x 256 tiles, 120 for 64 x 128)."""
    return max(MMA_MIN_REGS, pixels * block_n // 128 + MMA_SPARE_REGS)


def gather_regs(warps: int, gatherers: int, computing: int) -> int:
    """Registers of each thread of ``gatherers`` gathering partitions of ``warps`` warps: the
    multiprocessor's 64K less the computing warpgroup's ``computing`` a thread (mma_regs), in steps
    of 8, at most 232."""
    share = (65536 - 128 * computing) // (gatherers * warps * 32)
    return min(232, share // 8 * 8)


def render_gluon_nchw_source(spec: PlanSpec, stages: list[Stage]) -> str:
    """The kernel's source: _TEMPLATE with the epilogue of ``stages`` in Gluon's names."""
    gatherers = {f"gatherer_{i}_of_{n}": _GATHERER.format(part=i, parts=n) for n in (1, 2, 3) for i in range(n)}
    epilogue = gluon_epilogue(spec, stages, _COORDINATES, GATHER_STORE, 4)
    shared = {"gather_step": GATHER_STEP, "out_layout": OUT_LAYOUT}
    names = gluon_names()
    split = GLUON_SPLIT_REDUCE.format(**names)
    return _TEMPLATE.format(mma=_MMA, split=split, **shared, **gatherers, **epilogue, **names)


def gather_defer_why(spec: PlanSpec, multiprocessors: int, strided_1x1: bool = False) -> str | None:
    """Where other kernels measured faster (tuning.GLUON_NCHW and the limits beside it): packed
    channels-last input goes through tensor boxes (gluon-gemm, gluon-window, triton-gemm,
    triton-conv's 16-byte copies); NCHW-like input (unit-stride pixels) on large output planes
    through triton-conv's rows of slots and triton-gemm-nchw's boxes, strided 1x1 filters of
    16-bit data unless ``strided_1x1`` (the caller's own rule for them); small grids through
    triton-conv's split reductions."""
    x = spec.input_desc
    if x.strides[1] == 1:
        return "channels-last input: the tensor-box and 16-byte-copy kernels read it"
    if not tuning.GLUON_NCHW:
        return "off (tuning.GLUON_NCHW)"
    _, conv, _ = split_at_conv(spec.ops)
    assert conv is not None
    k, c, r, s = conv.w_desc.dims
    oh, ow = conv.output_desc.dims[2:]
    several = r * s > 1
    strided = conv.conv.strides != (1, 1)
    fp32 = spec.dtype == DataType.FLOAT
    if not several and strided and not strided_1x1 and not fp32:
        return "strided 1x1 filters: triton-conv and triton-gemm-nchw measured faster (r50_20 56.4 us against 65.4)"
    if not several and strided and fp32:
        limit = tuning.GLUON_NCHW_FP32_STRIDED_1X1_MAX_PLANE
    elif not several:
        limit = tuning.GLUON_NCHW_1X1_MAX_PLANE
    elif fp32:
        limit = tuning.GLUON_NCHW_FP32_MAX_PLANE
    else:
        limit = tuning.GLUON_NCHW_MAX_PLANE
    if oh * ow > limit:
        kind = "1x1 filters" if not several else "fp32 data" if fp32 else "several taps"
        return (
            f"output planes of {oh * ow} pixels (> {limit} for {kind}): triton-conv's rows of slots and "
            "triton-gemm-nchw's tensor boxes measured faster"
        )
    m = x.dims[0] * oh * ow
    cfg = gather_config(m, k, spec.dtype.torch_dtype, multiprocessors, r * s * c, strided)
    programs = triton_cdiv(m, cfg.block_m) * triton_cdiv(k, cfg.block_n) * cfg.split_k
    if programs < tuning.GLUON_NCHW_MIN_PROGRAMS:
        return (
            f"a grid of {programs} programs (< {tuning.GLUON_NCHW_MIN_PROGRAMS}): triton-conv splits the "
            "reduction of small grids"
        )
    return None


def gather_config(
    m: int, k: int, dtype: torch.dtype, multiprocessors: int, depth: int = 0, strided: bool = False
) -> tuning.ConvConfig:
    """The first tile of gather_tiles whose grid, its reduction split as gather_split allows for a
    reduction of ``depth`` products (R*S*C), still fills half the multiprocessors (the smallest
    otherwise; fp16, batch 32: 128 x 128 on r50_16's 98 programs 32.4 us against 44.5 for 64 x 128,
    64 x 128 on r50_21's 100, 64 x 256 split in two on r50_22's 50 x 2), with reduction steps of
    step_bytes(strided) and as many stages as ring_bytes holds (2 to 6)."""
    size = torch.empty((), dtype=dtype).element_size()
    row, ring = step_bytes(strided), ring_bytes(strided, size)
    tiles = gather_tiles()
    for pixels, block_n in tiles:
        programs = triton_cdiv(m, pixels) * triton_cdiv(k, block_n)
        split = gather_split(programs, depth, multiprocessors)
        if programs * split >= multiprocessors // 2:
            return replace(gather_tile(pixels, block_n, size, row, ring), split_k=split)
    return gather_tile(*tiles[-1], size, row, ring)


def step_bytes(strided: bool) -> int:
    """Bytes of a pixel's channels in one reduction step: 128 (a swizzled row), or for strided
    convolutions tuning.GLUON_NCHW_STRIDED_STEP_BYTES."""
    return tuning.GLUON_NCHW_STRIDED_STEP_BYTES if strided else 128


def ring_bytes(strided: bool, size: int = 2) -> int:
    """Shared memory of the pipeline's stages at most: tuning.GLUON_NCHW_STRIDED_RING_BYTES for
    strided convolutions of 16-bit data (``size`` bytes an element), else
    tuning.GLUON_NCHW_RING_BYTES."""
    return tuning.GLUON_NCHW_STRIDED_RING_BYTES if strided and size == 2 else tuning.GLUON_NCHW_RING_BYTES


def gather_split(programs: int, depth: int, multiprocessors: int) -> int:
    """How many programs share each tile's reduction of ``depth`` products: grids below half the
    multiprocessors split in powers of two (fp32 partial sums, summed by a tile's last program)
    while the grid stays within the multiprocessors and each part keeps at least
    tuning.GLUON_NCHW_SPLIT_MIN_DEPTH products; 1 with tuning.GLUON_NCHW_SPLIT off. H100, fp16,
    batch 32, warm L2 (bench/NOTES.md section 26): 64 x 256 in two parts on r50_22 32.0 us against
    36.0 for 64 x 128 whole, r50_18 46.9 / 50.3; not r50_21's 2048 channels: 23.2 / 19.9."""
    split = 1
    if not tuning.GLUON_NCHW_SPLIT or programs >= multiprocessors // 2:
        return split
    while programs * split * 2 <= multiprocessors and depth // (split * 2) >= tuning.GLUON_NCHW_SPLIT_MIN_DEPTH:
        split *= 2
    return split


#: gluon-nchw's tiles (pixels x output channels) in order of preference. 64 x 256 first: each
#: pixel tile reads its channel tile's weights from L2, each channel tile its gathered input, and
#: a tile twice as wide reads the input half as often (H100, fp16 CBNA, batch 32, warm L2: r50_16
#: 25.1 us against 31.6 for 128 x 128, r50_12 31.9 / 42.2, r50_19 20.2 / 21.6; r50_22, r50_18 and
#: r50_21 keep 64 x 128: their 50 programs of 64 x 256 leave most of the GPU idle; bench/NOTES.md
#: section 25).
GATHER_TILES = ((64, 256), (128, 128), (64, 128), (128, 64), (64, 64))


def gather_tiles() -> tuple[tuple[int, int], ...]:
    """GATHER_TILES, without the 64 x 256 tile where tuning.GLUON_NCHW_WIDE is off."""
    return GATHER_TILES if tuning.GLUON_NCHW_WIDE else GATHER_TILES[1:]


def gather_tile(
    pixels: int, block_n: int, size: int, row_bytes: int = 128, ring: int | None = None
) -> tuning.ConvConfig:
    """A tile of ``pixels`` x ``block_n`` for data of ``size`` bytes: reduction steps of
    ``row_bytes`` a pixel (64 or 128), as many stages as ``ring`` bytes hold (2 to 6; default
    ring_bytes(False)), one computing warpgroup."""
    block_k = row_bytes // size
    ring = ring_bytes(False) if ring is None else ring
    stages = max(2, min(6, ring // ((pixels + block_n) * block_k * size)))
    return tuning.ConvConfig(pixels, block_n, block_k, 8, 4, stages, 1)


class GluonNchwKernel(TritonConvKernel):
    solver_name = "gluon-nchw"
    stem = "gluon_nchw"
    splits_reduction = True  # where tuning.GLUON_NCHW_SPLIT is on (gather_split)

    def __init__(self, spec: PlanSpec, handle) -> None:
        self._handle = handle
        super().__init__(spec, handle)

    @staticmethod
    def render(spec: PlanSpec, stages: list[Stage]) -> str:
        return render_gluon_nchw_source(spec, stages)

    @property
    def taps(self) -> int:
        """The filter's taps (R*S)."""
        r, s = self.conv.w_desc.dims[2:]
        return r * s

    @property
    def strided(self) -> bool:
        """Whether the convolution's stride is above 1 in either dimension."""
        return self.conv_args[2:4] != (1, 1)

    @property
    def depth(self) -> int:
        """Products in a tile's reduction for each of its outputs (R*S*C)."""
        return self.taps * self.geometry[1]

    def with_split(self, cfg: tuning.ConvConfig) -> tuning.ConvConfig:
        """``cfg`` with its reduction split as gather_split decides for its grid."""
        if not self.splits_reduction:
            return cfg
        programs = self.programs_and_steps(cfg)[0]
        return replace(cfg, split_k=gather_split(programs, self.depth, multiprocessors(self._handle)))

    def heuristic(self, m: int, k_per_group: int, c_per_group: int, dtype: torch.dtype) -> tuning.ConvConfig:
        return gather_config(m, k_per_group, dtype, multiprocessors(self._handle), self.depth, self.strided)

    @property
    def candidates(self) -> list[tuning.ConvConfig]:  # type: ignore[override]
        """NORMAL find's configurations: the tiles of gather_config with their stages."""
        size = self.spec.dtype.torch_dtype.itemsize
        row, ring = step_bytes(self.strided), ring_bytes(self.strided, size)
        return [gather_tile(p, n, size, row, ring) for p, n in gather_tiles()]

    def pack(self, weight: Tensor) -> Tensor:
        return pack_rows_rsc(weight)

    def programs_and_steps(self, cfg: tuning.ConvConfig) -> tuple[int, int]:
        c = self.geometry[1]
        r, s = self.conv.w_desc.dims[2:]
        tiles = triton_cdiv(self.geometry[0], cfg.block_m) * triton_cdiv(self.k, cfg.block_n)
        return tiles, r * s * triton_cdiv(c, cfg.block_k)

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
        """The gather kernels' launch (gather_launch), with each kernel's own constants
        (launch_constants) and grid (launch_grid)."""
        stages, own, workspace = self.launch_constants(cfg, x, out, strides)
        grid, cfg, args = self.gather_launch(
            cfg, stages, own, x, packed, out, p, values, flags, has_prior, strides, idx64, workspace
        )
        return self.launch_grid(cfg, grid), cfg, args

    def launch_constants(
        self, cfg: tuning.ConvConfig, x: Tensor, out: Tensor, strides: tuple[int, ...] | None
    ) -> tuple[int, tuple, tuple[Tensor, ...]]:
        """The ring's stages, the kernel's own constants in its template's order and a split
        reduction's workspace (gather_launch's), for a launch of ``cfg`` reading ``x`` into ``out``
        (``strides``: the tensors' strides where the launch gives them)."""
        warps, parts, prefetch = gather_partitions(cfg.block_m)
        stages, parts = shared_ring(cfg.num_stages, parts)
        # warps of a gathering partition, warps along the pixels, registers, steps ahead, partitions,
        # programs sharing a tile's reduction, whether a stage's weights are requested before its stores,
        # the product's orientation
        own = (
            warps,
            min(warps, cfg.block_m // 32),
            gather_regs(warps, parts, mma_regs(cfg.block_m, cfg.block_n)),
            prefetch,
            parts,
            cfg.split_k,
            tuning.GLUON_NCHW_EARLY_WEIGHTS,
            pixel_rows(cfg.block_n, cfg.num_warps + warps * parts),
            cfg.split_k == 2 and bool(tuning.GLUON_NCHW_PAIR_SUM),
        )
        tiles = self.programs_and_steps(cfg)[0]
        return stages, own, self._workspace(x.device, cfg, tiles, cfg.block_m * cfg.block_n)

    def launch_grid(self, cfg: tuning.ConvConfig, grid: tuple[int, int, int]) -> tuple[int, int, int]:
        """The launch's grid: gather_launch's (a program a tile, ``cfg.split_k`` a tile)."""
        return grid

    def gather_launch(
        self,
        cfg: tuning.ConvConfig,
        stages: int,
        own: tuple,
        x: Tensor,
        packed: Tensor,
        out: Tensor,
        p: Tensor,
        values: list,
        flags: dict[str, bool],
        has_prior: bool,
        strides: tuple[int, ...] | None,
        idx64: bool | None,
        workspace: tuple[Tensor, ...] = (),
    ) -> tuple[tuple[int, int, int], tuple, list]:
        """A gather kernel's launch (this one's and gluon-nchw-regs'): the weights' descriptor, the
        shapes and strides, then the constants in the templates' order: the plan's and the tile's
        (``stages`` in the ring), the kernel's ``own``, the index width, prior, whole channel
        blocks, output layout, reduction order and the chain's flags. ``workspace``: a split
        reduction's partial sums and counters (gluon-nchw's), after the prior; ``cfg.split_k``
        programs along the grid's third axis."""
        c, k = self.geometry[1:3]  # input and output channels
        r, s = self.conv.w_desc.dims[2:]
        bits = x.element_size() * 8
        swizzle = min(128, cfg.block_k * bits // 8)
        w_desc = gluon_descriptor(packed, [k, r * s * c], [r * s * c, 1], [cfg.block_n, cfg.block_k], swizzle, bits)
        strides = strides or (*x.stride(), *out.stride(), *p.stride())
        pads, conv_strides, dilations = self.conv_args[:2], self.conv_args[2:4], self.conv_args[4:]
        consts = (
            strides[1],  # the input's channel stride: fixed by the plan (execute checks the input's strides)
            r,
            s,
            *conv_strides,
            cfg.block_m,
            cfg.block_n,
            cfg.block_k,
            stages,
            swizzle,
            bits,
            *own,
            needs_int64(x, out, p) if idx64 is None else idx64,
            has_prior,
            c % cfg.block_k == 0,
            strides[5] != 1,  # output channels apart: lanes along the pixels
            tuning.GLUON_NCHW_TAPS_INNER,
            *flags.values(),
        )
        grid = (self.programs_and_steps(cfg)[0], 1, cfg.split_k)
        runtime_strides = (strides[0], *strides[2:])  # the channel stride is a constant
        args = [x, w_desc, out, p, *workspace, *values, *self.geometry, *runtime_strides, *pads, *dilations, *consts]
        return grid, cfg, args


class GluonNchwSolver(Solver):
    name = "gluon-nchw"
    family = "triton"

    def why_not(self, spec: PlanSpec, handle) -> str | None:
        return (
            conv_plan_why_not(spec)
            or gather_why_not(spec)
            or gluon_dtype_why_not(spec, handle.tf32_allowed(), "triton-conv")
            or gluon_why_not()
            or hopper_why_not(handle)
        )

    def defer_why(self, spec: PlanSpec, handle) -> str | None:
        return gather_defer_why(spec, multiprocessors(handle))

    def build(self, spec: PlanSpec, handle) -> Kernel:
        return GluonNchwKernel(spec, handle)
