"""Gluon stem solver: triton-stem's convolution over stretches of input rows (few input channels
on 16-bit input, channels-last or channel planes: ResNet's stem, C = 3, 7x7, stride 2), as a
warp-specialized persistent kernel over output rows (Hopper only).

Why: triton-stem issues about 45 warp instructions per output pixel (each tile gathers its own
stretches, eight 8-byte copies and their addresses and masks a step, then two per-pixel
epilogues); it is bound by instruction issue and latency, not by memory or the tensor pipe
(bench/NOTES.md section 32: the ResNet stem at 48-49 us against a floor of 20.6). Here each
program takes a run of output rows (its share of N x OH, image by image) and

- a loading warpgroup gathers each input row the run reads ONCE, as a [RUNS, BLOCK_E] tile of
  stretches (row q: the stretch of output run q, triton_stem.Stretches) with 8-byte asynchronous
  copies (zeros past the row's ends and above and below the image), into a ring of slots; a
  stride-2 7-row filter reads each input row from up to four output rows;
- the filter's Toeplitz blocks (triton_stem's packing: R x PX blocks of [BLOCK_N, BLOCK_E]) come
  once by TMA and stay in shared memory;
- two computing warpgroups take the run's output rows in turn: output row oh is, for each pixel
  p of a run, the sum over the filter rows r of the tile of input row oh * stride + r * dil_h -
  pad_h times Toeplitz block (r, p): a [RUNS, BLOCK_N] accumulator per p, pixel q * PX + p of the
  row in its row q. Then the chain and the stores, while the other warpgroup's products run:
  each pixel's [runs, channels] tile written to shared memory and stored by TMA where the output
  is channels-last with 16-byte aligned strides and rows of whole runs (the ResNet stem, fp16:
  33.3 us against 34.1 by pointer after a layout change, which other outputs take). NCHW output
  rows are stored with their runs' pixels joined in order, 16 bytes a thread where the planes
  are aligned (the NCHW stem: 45.7 us against 130 pixel by pixel).

Channel-plane (NCHW) input: the planes' stretches lie side by side in a tile's row (each at a
multiple of the copies' width, so that no copy straddles two planes), and the Toeplitz blocks hold
each plane's taps at its place: as many products as channels-last input (the NCHW stem: three
10-element stretches in a 32-element row, 38.5 us against 45.7 with a 16-element tile per plane
and triton-stem's 68.6). Runs are as short as 64 runs a row allow (stem_arrangement: the fewest
products per output row).

A ring slot goes back to the loader once each computing warpgroup has passed the last of its
output rows that read it (a warpgroup hands back, after each of its rows, every slot before the
first that its next row reads). The copies land by mbarrier (each loading thread's arrival when
its copies are done); the generic-proxy writes are fenced before wgmma reads them.

Gluon has no interpreter: the kernel runs on Hopper GPUs only (CPU tests compile it for sm_90).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from fusionplan import tuning
from fusionplan.codegen import indent
from fusionplan.enums import DataType
from fusionplan.epilogue import TileIndex, emit_stages
from fusionplan.folding import Stage, split_at_conv
from fusionplan.launch import needs_int64
from fusionplan.solvers.base import Kernel, PlanSpec, Solver
from fusionplan.solvers.conv_kernel import DescriptorConvKernel
from fusionplan.solvers.conv_toolkit import conv_plan_why_not, triton_cdiv
from fusionplan.solvers.gluon_gemm import CONSUMER_REGS
from fusionplan.solvers.gluon_rows import BLOCK_N, ROW_CHANNELS, ROW_END, ROW_RUN, ROW_STORE, row_run_grid
from fusionplan.solvers.gluon_window import (
    LOAD_REGS,
    gluon_channel_loads,
    gluon_descriptor,
    gluon_epilogue_tail,
    gluon_header_fields,
    gluon_names,
    gluon_why_not,
    hopper_why_not,
    plane_vector,
    sixteen_bit_output,
    tma_store_strides_fit,
)
from fusionplan.solvers.triton_stem import (
    STEM_MAX_CHANNELS,
    Stretches,
    TritonStemKernel,
    channels_interleaved,
    joined_pixels,
    positions_expression,
    stretch_candidates,
    stretch_geometry,
    stretches,
    tap_positions,
)

Tensor = torch.Tensor

#: Runs of an output row in a product: one warpgroup's wgmma rows (a row of at most 64 runs).
RUNS = 64
#: Pixels of a run at most: each its [RUNS, BLOCK_N] fp32 accumulator, 32 registers a thread.
MAX_PIXELS = 4
#: Computing warpgroups taking output rows in turn (CONSUMER_REGS registers each): three (160
#: registers each) measured 41.7-42.3 us on the ResNet stem against two's 37.1-37.4 (H100, fp16);
#: two partitions of 8 warps (each warpgroup half the channels: 64x32 products) 41.5 against 33.2.
CONSUMERS = 2
#: Warps of the loading partition: four 8-byte copies a thread for a [64, 32] tile of 16-bit data
#: (one warp, sixteen a thread: 37.4 us against 37.1 on the ResNet stem).
LOAD_WARPS = 4

_TEMPLATE = '''"""Generated by fusionplan: convolution over row stretches (gluon-stem) + {chain} ({n_stages} stages)."""
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
def _ring_row(u, start, end, OH, STR_H: gl.constexpr, SPAN: gl.constexpr):
    # Ring position of the first input row that output row u of the run [start, end) reads; past
    # the run, the run's loads in all. Each image's share of m output rows loads (m - 1) * STR_H +
    # SPAN input rows.
    if u >= end:
        u = end
        img = (end - 1) // OH + 1
    else:
        img = u // OH
    return (u - start) * STR_H + (img - start // OH) * (SPAN - STR_H)


@gluon.jit
def _hand_back(ready, empty, lo, hi, seen, NUM_SLOTS: gl.constexpr):
    # The ring's rows lo .. hi - 1 go back to the loader. Those from ``seen`` on (not yet waited
    # for by this warpgroup) are waited for first: a row that this warpgroup never read may not
    # have landed yet, and an arrival must count for its own load. (Below ``seen``, only the
    # second warpgroup's first hand-back meets rows it never waited for: those before its first
    # row, in the ring's first round, whose barriers have no earlier phase to confuse.)
    for j in range(lo, hi):
        if j >= seen:
            mbarrier.wait(ready.index(j % NUM_SLOTS), (j // NUM_SLOTS) & 1)
        mbarrier.arrive(empty.index(j % NUM_SLOTS))
    return hi


@gluon.jit
def _load_filter(w_desc, w_bufs, w_ready, KP, TAPS: gl.constexpr):
    # the filter's Toeplitz blocks, once: block t of the program's channels at rows t * KP + k0
    k0 = gl.program_id(1) * w_desc.block_type.shape[0]
    mbarrier.expect(w_ready, TAPS * w_desc.block_type.nbytes)
    for t in gl.static_range(TAPS):
        {tma_load}(w_desc, [t * KP + k0, 0], w_ready, w_bufs.index(t))


@gluon.jit
def _load_partition(
    x_ptr, w_desc, x_bufs, w_bufs, w_ready, ready, empty, start, end, H, OH, KP, ROW_VECS, sxn_vecs, sxh_vecs,
    sxc_vecs, pad_h,
    STEP: gl.constexpr, LEAD: gl.constexpr, VEC: gl.constexpr, RUNS: gl.constexpr, BLOCK_E: gl.constexpr,
    TAPS: gl.constexpr, SIDE: gl.constexpr, PITCH: gl.constexpr, NUM_SLOTS: gl.constexpr,
    STR_H: gl.constexpr, SPAN: gl.constexpr, LOAD_WARPS: gl.constexpr, IDX64: gl.constexpr,
    FILTER_FIRST: gl.constexpr,
):
    if not FILTER_FIRST:
        _load_filter(w_desc, w_bufs, w_ready, KP, TAPS)
    # tile row q: run q's stretch, LEAD elements before its first pixel's column; VEC elements a copy
    gather: gl.constexpr = gl.BlockedLayout(
        [1, VEC], [32 // (BLOCK_E // VEC), BLOCK_E // VEC], [LOAD_WARPS, 1], [1, 0]
    )
    # the strides in whole copies, so that every copy's address is seen aligned
    sxn = sxn_vecs * VEC
    sxh = sxh_vecs * VEC
    sxc = sxc_vecs * VEC
    q = gl.arange(0, RUNS, layout=gl.SliceLayout(1, gather))
    e = gl.arange(0, BLOCK_E, layout=gl.SliceLayout(0, gather))
    if SIDE > 1:  # SIDE channel planes' stretches side by side, PITCH elements apart
        plane = e // PITCH
        e = e % PITCH
    col = (q * STEP - LEAD)[:, None] + e[None, :]
    col_ok = (col >= 0) & (col < ROW_VECS * VEC)
    if SIDE > 1:
        col_ok = col_ok & (plane < SIDE)[None, :]
        col = col + (plane * sxc)[None, :]
    col = gl.max_contiguous(gl.multiple_of(col, [1, VEC]), [1, VEC])
    j = 0  # the ring's position
    for n in range(start // OH, (end - 1) // OH + 1):
        first_oh = gl.maximum(start - n * OH, 0)
        last_oh = gl.minimum(end - n * OH, OH)  # one past
        if IDX64:  # offsets of inputs past 2^31 elements
            x_img = x_ptr + n.to(gl.int64) * sxn
        else:
            x_img = x_ptr + n * sxn
        ih0 = first_oh * STR_H - pad_h
        for i in range((last_oh - first_oh - 1) * STR_H + SPAN):
            slot = j % NUM_SLOTS
            # the first round finds every slot free (the phase before a new barrier's first counts as done)
            mbarrier.wait(empty.index(slot), ((j // NUM_SLOTS) & 1) ^ 1)
            ih = ih0 + i
            if IDX64:
                ih = ih.to(gl.int64)
            ok = col_ok & (ih >= 0) & (ih < H)  # rows above and below the image: zeros
            {async_copy}(x_bufs.index(slot), x_img + ih * sxh + col, mask=ok)
            # each loading thread's arrival, when its copies have landed
            async_copy.mbarrier_arrive(ready.index(slot), increment_count=False)
            j += 1


@gluon.jit
def _rows_partition(
    x_bufs, w_bufs, w_ready, ready, empty, y_ptr, prior_ptr, y_desc, y_bufs, start, end,
    {stage_params}
    K, OH, OW, syn, syc, syh, syw, spn, spc, sph, spw, dil_h,
    R: gl.constexpr, PX: gl.constexpr, RUNS: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_E: gl.constexpr,
    NUM_SLOTS: gl.constexpr, STR_H: gl.constexpr, SPAN: gl.constexpr, ELEM_BITS: gl.constexpr, IDX64: gl.constexpr,
    HAS_PRIOR: gl.constexpr, CONSUMER: gl.constexpr, CONSUMERS: gl.constexpr, TMA_STORE: gl.constexpr,
    PLANE_VEC: gl.constexpr, PLANE_LANES: gl.constexpr,
    {stage_flags}
):
    # [runs, channels] accumulators, one per pixel of a run
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BLOCK_N, 256 // ELEM_BITS]
    )
    # the stores' layout: 8 contiguous channels per thread, 16-byte stores
    out_layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    # rows with a NaN taken again: the stretches as wgmma's register operand
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=32 // ELEM_BITS)
    # NCHW output: the row's joined pixels, PLANE_VEC contiguous a thread, lanes along the row
    plane_layout: gl.constexpr = gl.BlockedLayout(
        [PLANE_VEC if PLANE_VEC else 1, 1], [PLANE_LANES, 32 // PLANE_LANES], [1, 4], [0, 1]
    )
    # TMA stores: a pixel's [runs, channels] tile as the product reads a tile of shared memory
    y_flat: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=ELEM_BITS, rank=2)
    k0 = gl.program_id(1) * BLOCK_N
    # the chain's per-channel parameters: constants of the program's channels, loaded once
    ch_v = k0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, acc_layout))
    ch_v_mask = ch_v < K
{channel_loads}
    mbarrier.wait(w_ready, 0)
    handed = 0  # the ring's rows this warpgroup has handed back
    seen = 0  # the ring's rows before this one: waited for by this warpgroup
    for u in range(start + CONSUMER, end, CONSUMERS):
        row0 = _ring_row(u, start, end, OH, STR_H, SPAN)
{zeros}
        # the input rows of the output row's window that this warpgroup has not waited for yet (its
        # previous row read the first ones: a wait for each filter row's measured 35.5 us on the
        # ResNet stem against 33.7, H100, fp16)
        for j in range(gl.maximum(row0, seen), row0 + SPAN):
            mbarrier.wait(ready.index(j % NUM_SLOTS), (j // NUM_SLOTS) & 1)
        seen = gl.maximum(seen, row0 + SPAN)
{taps}
{row_end}
{pixels}
    # a warpgroup with no row left (or none at all) hands back the rest
    _hand_back(ready, empty, handed, _ring_row(end, start, end, OH, STR_H, SPAN), seen, NUM_SLOTS)
    if TMA_STORE:
        tma.store_wait(0)  # the buffers stay allocated until the last stores have read them


@gluon.jit
def gluon_stem_kernel(
    x_ptr, w_desc, y_ptr, prior_ptr, y_desc,
    {stage_params}
    N, K, H, OH, OW, KP, ROW_VECS, sxn_vecs, sxh_vecs, sxc_vecs,
    syn, syc, syh, syw, spn, spc, sph, spw,
    pad_h, dil_h,
    R: gl.constexpr, SIDE: gl.constexpr, PITCH: gl.constexpr, PX: gl.constexpr, STEP: gl.constexpr,
    LEAD: gl.constexpr, VEC: gl.constexpr,
    RUNS: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_E: gl.constexpr, NUM_SLOTS: gl.constexpr,
    STR_H: gl.constexpr, SPAN: gl.constexpr, SWIZZLE: gl.constexpr, ELEM_BITS: gl.constexpr,
    LOAD_WARPS: gl.constexpr, LOAD_REGS: gl.constexpr, CONSUMER_REGS: gl.constexpr, CONSUMERS: gl.constexpr,
    FILTER_FIRST: gl.constexpr, IDX64: gl.constexpr, HAS_PRIOR: gl.constexpr, TMA_STORE: gl.constexpr,
    PLANE_VEC: gl.constexpr, PLANE_LANES: gl.constexpr,
    {stage_flags}
):
    # x_bufs: the ring of input-row tiles [RUNS, BLOCK_E] (channel planes: SIDE planes' stretches side
    # by side in a row); w_bufs: the Toeplitz blocks [BLOCK_N, BLOCK_E], block r * PX + p for filter
    # row r and pixel p of a run (w_desc: the packed filter [R * PX * KP, BLOCK_E], KP the output
    # channels rounded up to BLOCK_N)
    tile: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=SWIZZLE, element_bitwidth=ELEM_BITS, rank=2)
    x_bufs = gl.allocate_shared_memory(x_ptr.dtype.element_ty, [NUM_SLOTS, RUNS, BLOCK_E], tile)
    w_bufs = gl.allocate_shared_memory(x_ptr.dtype.element_ty, [R * PX, BLOCK_N, BLOCK_E], tile)
    # TMA stores: a tile per computing warpgroup and pixel of a run, y_desc's boxes [1, 1, RUNS, 1,
    # BLOCK_N] of the output seen as [N, OH, OW / PX, PX, K] (a token tile where stores are by pointer)
    y_box: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=ELEM_BITS, rank=5)
    y_tiles: gl.constexpr = CONSUMERS * PX if TMA_STORE else 1
    y_rows: gl.constexpr = RUNS if TMA_STORE else 8
    y_bufs = gl.allocate_shared_memory(y_ptr.dtype.element_ty, [y_tiles, 1, 1, y_rows, 1, BLOCK_N], y_box)
    w_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    ready = gl.allocate_shared_memory(gl.int64, [NUM_SLOTS, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [NUM_SLOTS, 1], mbarrier.MBarrierLayout())
    mbarrier.init(w_ready, count=1)
    for i in gl.static_range(NUM_SLOTS):
        mbarrier.init(ready.index(i), count=LOAD_WARPS * 32)  # every loading thread's copies
        mbarrier.init(empty.index(i), count=CONSUMERS)  # handed back by every computing warpgroup
    fence_async_shared()
    if FILTER_FIRST:
        # The filter's blocks before the wait for the kernel before this one: no kernel that may
        # still run writes them (the packed weights are written by plain stream-ordered copies)
        _load_filter(w_desc, w_bufs, w_ready, KP, R * PX)
{grid_dependency}
{row_run}
    gl.warp_specialize(
        [{consumers}, {loader}],
        [{worker_warps}LOAD_WARPS],
        [{worker_regs}LOAD_REGS],
    )
    # every barrier invalidated after the partitions (PTX lets an mbarrier's memory serve nothing
    # else until it is invalidated)
    mbarrier.invalidate(w_ready)
    for i in gl.static_range(NUM_SLOTS):
        mbarrier.invalidate(ready.index(i))
        mbarrier.invalidate(empty.index(i))
'''

#: The loading partition and its arguments.
_LOADER = """(
            _load_partition,
            (x_ptr, w_desc, x_bufs, w_bufs, w_ready, ready, empty, start, end, H, OH, KP, ROW_VECS, sxn_vecs,
             sxh_vecs, sxc_vecs, pad_h, STEP, LEAD, VEC, RUNS, BLOCK_E, R * PX, SIDE, PITCH, NUM_SLOTS, STR_H,
             SPAN, LOAD_WARPS, IDX64, FILTER_FIRST),
        )"""

#: Computing warpgroup {consumer} of CONSUMERS and its arguments.
_CONSUMER = """(
            _rows_partition,
            (x_bufs, w_bufs, w_ready, ready, empty, y_ptr, prior_ptr, y_desc, y_bufs, start, end, {stage_args}
             K, OH, OW, syn, syc, syh, syw, spn, spc, sph, spw, dil_h,
             R, PX, RUNS, BLOCK_N, BLOCK_E, NUM_SLOTS, STR_H, SPAN, ELEM_BITS, IDX64, HAS_PRIOR, {consumer}, CONSUMERS,
             TMA_STORE, PLANE_VEC, PLANE_LANES, {flag_args}),
        )"""

#: One filter row's products (every input row of the window waited for, then one proxy fence: the
#: copies wrote through the generic proxy, wgmma reads through the async one; a fence per filter
#: row, each a MEMBAR.ALL.CTA, measured 38.4 us on the ResNet stem against 37.0: H100, fp16).
_TAP_PRODUCTS = """        stretches = x_bufs.index((row0 + {r} * dil_h) % NUM_SLOTS)
{products}"""

_PRODUCT = """        acc{p} = warpgroup_mma(stretches, w_bufs.index({block}).permute((1, 0)), acc{p}, is_async=True)"""

#: The row's products done, then the ring's rows before the first that this warpgroup's next
#: output row reads go back to the loader. (Each pixel's epilogue as soon as its own products were
#: done, under the next pixel's, measured 41.6 us on the ResNet stem against 35.6: H100, fp16.)
_WAIT = """        {accs} = warpgroup_mma_wait(num_outstanding=0, deps=[{accs}])"""

#: A NaN came out where a Toeplitz block's zeros may have met an infinite (or NaN) input that the
#: pixel does not read (0 * inf): the row again, each pixel's copy of the stretches zeroed off its
#: taps (exact; only rows with a NaN take it, before their ring slots go back).
_EXACT = """        row_sum = {sum}
        spoiled = gl.sum(gl.sum(row_sum - row_sum, axis=1), axis=0)  # 0, or NaN where an infinity or NaN came out
        if spoiled != spoiled:
            offs_e = gl.arange(0, BLOCK_E, layout=gl.SliceLayout(0, out_layout))[None, :]
{zeros}
            for r in gl.static_range(R):
                row_tile = x_bufs.index((row0 + r * dil_h) % NUM_SLOTS).load(out_layout)
{products}"""
_EXACT_PRODUCT = """                taps = gl.convert_layout(gl.where({taps}, row_tile, 0.0), a_layout)
                acc{p} = warpgroup_mma(taps, w_bufs.index(r * PX + {p}).permute((1, 0)), acc{p})"""
_HAND_BACK = """        following = _ring_row(u + CONSUMERS, start, end, OH, STR_H, SPAN)
        handed = _hand_back(ready, empty, handed, following, seen, NUM_SLOTS)
        seen = gl.maximum(seen, following)"""

#: Pixel {p}'s tile by TMA: written to shared memory (the warpgroup's previous row's stores have
#: read the buffers first), the row's last pixel's then fences every thread's writes for the async
#: proxy once and stores the row's tiles (``copies``); else by pointer (``pointer_store``).
_STORE = """    if TMA_STORE:
{wait}        y_tile = y_bufs.index(CONSUMER * PX + {p})
        y_tile.{reinterpret}(y_ptr.dtype.element_ty, [RUNS, BLOCK_N], y_flat).store(h.to(y_ptr.dtype.element_ty))
{copies}    elif PLANE_VEC:
        h{p} = h.to(y_ptr.dtype.element_ty)
{joined}    else:
{pointer_store}"""

#: Channel planes (NCHW output): the row's pixels joined after the last one's chain, in order (pixel
#: p of run q at q * PX + p), then stored with lanes along the plane's pixels, PLANE_VEC of them a
#: thread (16-byte stores where the planes' strides are multiples of 8 elements).
_JOINED_STORE = """        h = {joined}
        h = gl.convert_layout(h, plane_layout)
        ow = gl.arange(0, RUNS * PX, layout=gl.SliceLayout(1, plane_layout))
        offs_n = k0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, plane_layout))
        ch = offs_n
        if IDX64:
            ch = ch.to(gl.int64)
        plane = gl.multiple_of(n_img * syn + oh * syh + ch * syc, PLANE_VEC)
        mask = (ow < OW)[:, None] & (offs_n < K)[None, :]
        gl.store(y_ptr + plane[None, :] + ow[:, None], h, mask=mask)
"""
_STORE_WAIT = """        tma.store_wait(0)
"""
_STORE_FENCE = """        fence_async_shared()
"""
_STORE_COPY = """        {tma_store}(y_desc, [u // OH, oh, 0, {p}, k0], y_bufs.index(CONSUMER * PX + {p}))
"""

#: Pixel {p} of each run of the output row, in ``{layout}``: its column, the channels.
_COORDINATES = "q = gl.arange(0, RUNS, layout=gl.SliceLayout(1, {layout}))\now = q * PX + {p}\n" + ROW_CHANNELS


def joined_row(px: int) -> str:
    """The expression of an output row's [RUNS * PX, BLOCK_N] tile from its pixels' tiles h0 ..
    h{PX-1} ([RUNS, BLOCK_N] each): joined, the pixels' bits moved before the channels."""
    if px == 1:
        return "h0"
    bits = px.bit_length() - 1
    order = (0, *range(2, 2 + bits), 1)
    joined = joined_pixels([f"h{p}" for p in range(px)]).replace("tl.join", "gl.join")
    return f"gl.reshape(gl.permute({joined}, {order}), [RUNS * PX, BLOCK_N])"


def render_gluon_stem_source(spec: PlanSpec, stages: list[Stage], arrangement: Arrangement) -> str:
    """The kernel's source for the plan's filter rows and ``arrangement`` (a product per filter row
    and pixel of a run, an epilogue per pixel of a run) with the epilogue of ``stages`` in Gluon's
    names, CONSUMERS computing warpgroups taking output rows in turn."""
    _, conv, _ = split_at_conv(spec.ops)
    assert conv is not None
    r_taps = conv.w_desc.dims[2]
    px = arrangement.runs.pixels
    names = gluon_names()
    epi = emit_stages(stages, spec.ops, TileIndex(ch="ch_v", ch_mask="ch_v_mask"), hoist_channels=True)
    products = ["\n".join(_PRODUCT.format(p=p, block=r * px + p) for p in range(px)) for r in range(r_taps)]
    taps = ["        fence_async_shared()"]
    taps += [_TAP_PRODUCTS.format(r=r, products=products[r]) for r in range(r_taps)]
    accs = ", ".join(f"acc{p}" for p in range(px))  # the wait gives one dependency back itself, several as a tuple
    exact = _EXACT.format(
        sum=" + ".join(f"acc{p}" for p in range(px)),
        zeros="\n".join(f"            acc{p} = gl.zeros((RUNS, BLOCK_N), gl.float32, acc_layout)" for p in range(px)),
        products="\n".join(
            _EXACT_PRODUCT.format(
                p=p,
                taps=positions_expression(
                    tap_positions(spec, arrangement.runs, p, arrangement.side, arrangement.pitch), "offs_e"
                ),
            )
            for p in range(px)
        ),
    )
    pixels = [_WAIT.format(accs=accs) + "\n" + exact + "\n" + _HAND_BACK]
    for p in range(px):
        pointer_store = ROW_STORE.format(
            coordinates_in_out=indent(_COORDINATES.format(layout="out_layout", p=p).split("\n"), 4)
        ).rstrip("\n")
        copies = [_STORE_COPY.format(p=i, tma_store=names["tma_store"]) for i in range(px)]
        store = _STORE.format(
            p=p,
            wait=_STORE_WAIT if p == 0 else "",
            copies="".join([_STORE_FENCE, *copies]) if p == px - 1 else "",
            joined=_JOINED_STORE.format(joined=joined_row(px)) if p == px - 1 else "",
            pointer_store=indent(pointer_store.split("\n"), 4),
            reinterpret=names["reinterpret"],
        )
        tail = gluon_epilogue_tail(epi, store).rstrip("\n")
        head = [f"# pixel {p} of each run", f"acc = acc{p}", *_COORDINATES.format(layout="acc_layout", p=p).split("\n")]
        pixels.append(indent(head, 8) + "\n" + indent(tail.split("\n"), 4))
    zeros = [f"        acc{p} = gl.zeros((RUNS, BLOCK_N), gl.float32, acc_layout)" for p in range(px)]
    channel_loads = gluon_channel_loads(epi)
    fields = gluon_header_fields(spec, stages, epi)
    return _TEMPLATE.format(
        channel_loads=channel_loads,
        zeros="\n".join(zeros),
        taps="\n".join(taps),
        row_end=indent(ROW_END.split("\n"), 8),
        pixels="\n".join(pixels),
        loader=_LOADER,
        consumers=", ".join(_CONSUMER.format(consumer=c, **fields) for c in range(CONSUMERS)),
        worker_warps="4, " * (CONSUMERS - 1),
        worker_regs="CONSUMER_REGS, " * (CONSUMERS - 1),
        row_run=ROW_RUN,
        **fields,
        **names,
    )


@dataclass(frozen=True)
class Arrangement:
    """How a tile holds an input row: ``runs`` (their block_e: a tile row's elements) and, for
    channel planes, ``side`` planes' stretches side by side in a row, ``pitch`` elements apart (1
    and 0 where rows are channels-last: all channels in one stretch)."""

    runs: Stretches
    side: int = 1
    pitch: int = 0

    @property
    def products(self) -> int:
        """16-element products per filter row and output row: a [RUNS, BLOCK_E] tile per input row
        whatever the runs' length, a product per pixel of a run."""
        return self.runs.pixels * self.runs.block_e // 16


def side_by_side(runs: Stretches, vector: int, planes: int) -> Arrangement:
    """``planes`` channel planes' stretches of ``runs`` side by side in a tile's row, each at a
    multiple of ``vector`` (no copy straddles two planes)."""
    pitch = -(-runs.used // vector) * vector
    block_e = max(16, 1 << (planes * pitch - 1).bit_length())
    return Arrangement(replace(runs, block_e=block_e, used=(planes - 1) * pitch + runs.used), planes, pitch)


def stem_arrangement(spec: PlanSpec) -> Arrangement:
    """The runs with the fewest products per output row among those of at most MAX_PIXELS pixels
    and RUNS runs a row whose stretches are copied at least 4 bytes at a time (channel planes: all
    planes' stretches side by side); among equals the shorter tiles (fewer gathered elements), then
    the widest copies. Where none fits, triton-stem's runs (gluon_stem_why_not says why)."""
    geometry = stretch_geometry(spec)
    interleaved, *_, out_w, itemsize = geometry
    planes = spec.input_desc.dims[1] // interleaved
    fits = [
        (side_by_side(runs, vector, planes) if planes > 1 else Arrangement(runs), vector)
        for runs, vector in stretch_candidates(*geometry)
        if runs.pixels <= MAX_PIXELS and triton_cdiv(out_w, runs.pixels) <= RUNS and vector * itemsize >= 4
    ]
    if not fits:
        runs = stretches(*geometry)
        return side_by_side(runs, 1, planes) if planes > 1 else Arrangement(runs)
    return min(fits, key=lambda item: (item[0].products, item[0].runs.block_e, -item[1]))[0]


def copy_vector(arrangement: Arrangement, itemsize: int, row: int, *strides: int) -> int:
    """Elements of one asynchronous copy: the widest power of two (at most 16 bytes) that divides
    the runs' step, their lead, the planes' pitch, the input row (no copy straddles a row's end)
    and the input's image, row and plane ``strides`` (which the kernel takes in copies, so that the
    compiler sees every copy aligned)."""
    vector = 16 // itemsize
    runs = arrangement.runs
    for n in (runs.step, runs.lead, arrangement.pitch, row, *strides):
        if n:
            vector = min(vector, n & -n)
    return vector


def stem_smem_bytes(r: int, runs: Stretches, slots: int, itemsize: int, tma_store: bool = False) -> int:
    """Shared memory of the filter's Toeplitz blocks and of ``slots`` input-row tiles (and, with
    ``tma_store``, of the output tiles: one per computing warpgroup and pixel of a run)."""
    tiles = CONSUMERS * runs.pixels * RUNS * BLOCK_N if tma_store else 0
    return (r * runs.pixels * BLOCK_N + slots * RUNS) * runs.block_e * itemsize + tiles * itemsize


def joined_plane_vector(strides: tuple[int, ...], out: Tensor) -> int:
    """Output pixels a thread stores together where rows are stored joined (0: not joined, as on
    channels-last output or with tuning.GLUON_STEM_JOINED_PLANES off): plane_vector's."""
    return plane_vector(strides, out) if tuning.GLUON_STEM_JOINED_PLANES else 0


def plan_tma_store(spec: PlanSpec, runs: Stretches) -> bool:
    """Whether the plan's output takes TMA stores (tuning.GLUON_STEM_TMA_STORE, its strides, the
    output tiles beside the shallowest ring within tuning.GLUON_STEM_SMEM_BYTES)."""
    _, conv, _ = split_at_conv(spec.ops)
    assert conv is not None
    out = spec.output_desc
    itemsize = spec.dtype.torch_dtype.itemsize
    if not tuning.GLUON_STEM_TMA_STORE or not sixteen_bit_output(spec):
        return False
    if not tma_store_strides_fit(out.strides, out.dims[3], runs.pixels, itemsize):
        return False
    r = conv.w_desc.dims[2]
    least = least_slots(r, conv.conv.dilations[0])
    return stem_smem_bytes(r, runs, least, itemsize, True) <= tuning.GLUON_STEM_SMEM_BYTES


def copied_row(spec: PlanSpec, strides: tuple[int, ...]) -> tuple[int, ...]:
    """What a copy must divide besides the runs' step and lead (copy_vector's ``row`` and
    ``strides``): an input row's elements, the image and row strides and, for channel planes, the
    plane stride (``strides``: the input's, N C H W order)."""
    interleaved = channels_interleaved(spec)
    assert interleaved is not None
    sxn, sxc, sxh, _ = strides[:4]
    planes = (sxc,) if spec.input_desc.dims[1] > interleaved else ()
    return (spec.input_desc.dims[3] * interleaved, sxn, sxh, *planes)


def least_slots(r: int, dil_h: int) -> int:
    """The shallowest ring that cannot stall: a warpgroup's row reads (R - 1) * dil_h + 1 input
    rows, and the other's may hold as many where a run enters the next image."""
    return 2 * ((r - 1) * dil_h + 1)


def gluon_stem_why_not(spec: PlanSpec) -> str | None:
    """Why the plan does not fit this kernel, or None: an ungrouped convolution of at most
    STEM_MAX_CHANNELS input channels on fp16 or bf16 input of channels-last rows or channel planes,
    stretches of at most 64 elements copied at least 4 bytes at a time, output rows of at most 64
    runs, the filter's blocks and the shallowest ring within tuning.GLUON_STEM_SMEM_BYTES."""
    _, conv, _ = split_at_conv(spec.ops)
    assert conv is not None
    if not tuning.GLUON_STEM:
        return "tuning.GLUON_STEM is off"
    if spec.dtype not in (DataType.HALF, DataType.BFLOAT16):
        return f"{spec.dtype.name} data: the products are 16-bit wgmma (fp16, bf16)"
    if conv.groups != 1:
        return "grouped convolutions are not read as row stretches"
    x = spec.input_desc
    c = x.dims[1]
    if c > STEM_MAX_CHANNELS:
        return f"C={c} > {STEM_MAX_CHANNELS}: channel blocks fill reduction steps (the window kernels)"
    if channels_interleaved(spec) is None:
        return (
            "the input must be channels-last (NHWC) or channel planes (NCHW) to be read in stretches of rows; "
            f"its strides are {x.strides}"
        )
    arrangement = stem_arrangement(spec)
    runs = arrangement.runs
    if arrangement.side > 1 and x.strides[1] * c >= 2**31:
        # the loader adds a plane's offset to its row's in 32 bits (64-bit offsets are the images')
        return f"channel planes of {x.strides[1]} elements: their offsets in an image pass 2^31"
    if runs.block_e > 64:
        planes = f" ({arrangement.side} channel planes side by side)" if arrangement.side > 1 else ""
        return f"a stretch of {runs.used} input elements per filter row{planes} is longer than a tile's 64"
    itemsize = spec.dtype.torch_dtype.itemsize
    row, *strides = copied_row(spec, x.strides)
    if copy_vector(arrangement, itemsize, row, *strides) * itemsize < 4:
        return (
            f"stretches {runs.step} elements apart in rows of {row} (strides {tuple(strides)}): "
            "asynchronous copies need 4-byte units"
        )
    if runs.pixels > MAX_PIXELS:
        return (
            f"runs of {runs.pixels} pixels: an accumulator of {RUNS} x {BLOCK_N} each, more than {MAX_PIXELS} "
            "do not fit a computing warpgroup's registers"
        )
    ow = spec.output_desc.dims[3]
    if triton_cdiv(ow, runs.pixels) > RUNS:
        return f"output rows of {ow} pixels: more than {RUNS} runs of {runs.pixels}"
    r = conv.w_desc.dims[2]
    least = least_slots(r, conv.conv.dilations[0])
    need = stem_smem_bytes(r, runs, least, itemsize)
    if need > tuning.GLUON_STEM_SMEM_BYTES:
        return (
            f"the filter's {r * runs.pixels} Toeplitz blocks and {least} input-row tiles take {need} bytes "
            f"of shared memory (> {tuning.GLUON_STEM_SMEM_BYTES})"
        )
    return None


def stem_registers(planes: bool) -> tuple[int, int]:
    """(LOAD_REGS, CONSUMER_REGS) of a launch: channel planes side by side (twice the copies, of 4
    bytes: their addresses held in more registers) take tuning.GLUON_STEM_PLANE_LOAD_REGS for the
    loading warps and the second computing warpgroup as many fewer (the ResNet stem on NCHW input,
    H100, fp16: 40.2 us at 40, 38.5 at 64, 39.0 at 88; channels-last input unchanged at 33.2-33.6:
    bench/NOTES.md section 58); channels-last input LOAD_REGS and CONSUMER_REGS."""
    load = tuning.GLUON_STEM_PLANE_LOAD_REGS if planes else LOAD_REGS
    return load, CONSUMER_REGS - (load - LOAD_REGS)


class GluonStemKernel(DescriptorConvKernel, TritonStemKernel):
    solver_name = "gluon-stem"
    stem = "gluon_stem"
    splits_reduction = False

    def plan_runs(self, spec: PlanSpec) -> Stretches:
        self.arrangement = stem_arrangement(spec)
        return self.arrangement.runs

    @property
    def candidates(self) -> list[tuning.ConvConfig]:  # type: ignore[override]
        """NORMAL find's configurations: the heuristic's ring and the shallowest that cannot stall."""
        cfg = self.heuristic(0, 0, 0, self.spec.dtype.torch_dtype)
        return [cfg, replace(cfg, num_stages=self._least_slots())]

    def render(self, spec: PlanSpec, stages: list[Stage]) -> str:
        return render_gluon_stem_source(spec, stages, self.arrangement)

    def heuristic(self, m: int, k_per_group: int, c_per_group: int, dtype: torch.dtype) -> tuning.ConvConfig:
        """Runs of an output row, 64 output channels, the stretch, the ring that
        tuning.GLUON_STEM_SLOTS asks for (at least the shallowest that cannot stall, at most what
        the shared memory holds beside the filter and, where stores are by TMA, the output tiles)."""
        r = self.conv.w_desc.dims[2]
        itemsize = self.spec.dtype.torch_dtype.itemsize
        slots = max(tuning.GLUON_STEM_SLOTS, self._least_slots())
        least = self._least_slots()
        tma_store = plan_tma_store(self.spec, self.runs)
        limit = tuning.GLUON_STEM_SMEM_BYTES
        while slots > least and stem_smem_bytes(r, self.runs, slots, itemsize, tma_store) > limit:
            slots -= 1
        return tuning.ConvConfig(RUNS, BLOCK_N, self.runs.block_e, 1, 4, slots, 1, 2)

    def pack(self, weight: Tensor) -> Tensor:
        """The Toeplitz blocks [R, 1, PX, K, BLOCK_E] (triton-stem's for channels-last rows,
        side_by_side_blocks for channel planes) as [R * PX * KP, BLOCK_E], the output channels
        padded with zeros to KP, a multiple of BLOCK_N (a tensor box of a block's channels never
        reaches into the next block)."""
        blocks = self.side_by_side_blocks(weight) if self.arrangement.side > 1 else super().pack(weight)
        r, _, px, k, e = blocks.shape
        kp = triton_cdiv(k, BLOCK_N) * BLOCK_N
        padded = blocks.new_zeros((r, px, kp, e))
        padded[:, :, :k] = blocks[:, 0]
        return padded.reshape(r * px * kp, e)

    def side_by_side_blocks(self, weight: Tensor) -> Tensor:
        """[K, C, R, S] -> [R, 1, PX, K, BLOCK_E]: block p of filter row r holds tap s of channel c at
        pixel p's position in plane c's stretch (c * pitch on in the tile's row), zeros elsewhere."""
        k, c, r, s = weight.shape
        runs, pitch = self.runs, self.arrangement.pitch
        pad_w, stride_w, dil_w = self.conv_args[1], self.conv_args[3], self.conv_args[5]
        blocks = weight.new_zeros((r, 1, runs.pixels, k, runs.block_e))
        for p in range(runs.pixels):
            for tap in range(s):
                at = runs.position(p, tap, stride_w, pad_w, dil_w)
                blocks[:, 0, p, :, at : at + c * pitch : pitch] = weight[:, :, :, tap].permute(2, 0, 1)
        return blocks

    def programs_and_steps(self, cfg: tuning.ConvConfig) -> tuple[int, int]:
        """Programs of the grid and the products per output row (one per filter row and pixel of a run)."""
        programs, blocks, _ = self._grid()
        return programs * blocks, self.conv.w_desc.dims[2] * self.runs.pixels

    def _grid(self) -> tuple[int, int, int]:
        return row_run_grid(self._handle, self.spec.input_desc.dims[0] * self.out_hw[0], self.k)

    def narrower_config(self) -> tuning.ConvConfig | None:
        """The shallowest ring that cannot stall (a specialization reading a prior output needs more
        shared memory)."""
        least = self._least_slots()
        return None if self.config.num_stages <= least else replace(self.config, num_stages=least)

    def _least_slots(self) -> int:
        return least_slots(self.conv.w_desc.dims[2], self.conv_args[4])

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
        n, c, h, w = self.spec.input_desc.dims
        oh, ow = self.out_hw
        runs = self.runs
        r = self.conv.w_desc.dims[2]
        pad_h, str_h, dil_h = self.conv_args[0], self.conv_args[2], self.conv_args[4]
        itemsize = self.spec.dtype.torch_dtype.itemsize
        bits = itemsize * 8
        swizzle = min(128, runs.block_e * itemsize)
        kp = triton_cdiv(self.k, BLOCK_N) * BLOCK_N
        arrangement = self.arrangement
        depth = r * runs.pixels * kp
        box = [BLOCK_N, runs.block_e]
        w_desc = gluon_descriptor(packed, [depth, runs.block_e], [runs.block_e, 1], box, swizzle, bits)
        strides = strides or (*x.stride(), *out.stride(), *p.stride())
        sxn, sxc, sxh, _ = strides[:4]
        tma_store = (
            plan_tma_store(self.spec, runs)
            and tma_store_strides_fit(strides[4:8], ow, runs.pixels, itemsize)
            and out.data_ptr() % 16 == 0
        )
        y_desc = self._output_descriptor(out, strides[4:8], bits) if tma_store else w_desc  # a token where unused
        plane_vec = 0 if tma_store else joined_plane_vector(strides[4:8], out)
        plane_lanes = min(32, RUNS * runs.pixels // max(plane_vec, 1))
        row = copied_row(self.spec, strides)
        vector = copy_vector(arrangement, itemsize, *row)
        consts = (
            r,
            arrangement.side,
            arrangement.pitch,
            runs.pixels,
            runs.step,
            runs.lead,
            vector,
            RUNS,
            BLOCK_N,
            runs.block_e,
            cfg.num_stages,
            str_h,
            (r - 1) * dil_h + 1,
            swizzle,
            bits,
            LOAD_WARPS,
            *stem_registers(arrangement.side > 1),
            CONSUMERS,
            tuning.GLUON_STEM_FILTER_FIRST,
            needs_int64(x, out, p) if idx64 is None else idx64,
            has_prior,
            tma_store,
            plane_vec,
            plane_lanes,
            *flags.values(),
        )
        # the input's row and strides in whole copies (a plane's stride unused for channels-last rows)
        geometry = (n, self.k, h, oh, ow, kp, row[0] // vector, sxn // vector, sxh // vector, sxc // vector)
        args = [x, w_desc, out, p, y_desc, *values, *geometry, *strides[4:], pad_h, dil_h, *consts]
        return self._grid(), cfg, args

    def _output_descriptor(self, out: Tensor, strides: tuple[int, ...], bits: int):
        """The output seen as [N, OH, OW / PX, PX, K] (pixel p of run q at [n, oh, q, p]), boxes of
        one pixel of every run of a row and BLOCK_N channels."""
        syn, _, syh, syw = strides
        oh, ow = self.out_hw
        px = self.runs.pixels
        shape = [self.spec.input_desc.dims[0], oh, ow // px, px, self.k]
        return gluon_descriptor(out, shape, [syn, syh, px * syw, syw, 1], [1, 1, RUNS, 1, BLOCK_N], 128, bits)

    def pointer_slots(self, args: list) -> tuple[int | tuple[int, ...], ...]:
        """The input, the output's pointer and, where tiles are stored by TMA, its descriptor, the prior."""
        return (0, (2, 4) if args[4].base is args[2] else 2, 3)


class GluonStemSolver(Solver):
    name = "gluon-stem"
    family = "triton"

    def why_not(self, spec: PlanSpec, handle) -> str | None:
        return conv_plan_why_not(spec) or gluon_stem_why_not(spec) or gluon_why_not() or hopper_why_not(handle)

    def build(self, spec: PlanSpec, handle) -> Kernel:
        return GluonStemKernel(spec, handle)
