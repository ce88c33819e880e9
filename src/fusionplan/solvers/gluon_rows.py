"""Gluon rows solver: a convolution of few input channels (C x R x S small: ResNet's 64-channel
3x3 layers) on packed channels-last 16-bit input, computed one output row at a time by
persistent programs that hold the whole filter of their 64 output channels in registers
(Hopper only).

Why: on such layers the window kernels read every input pixel once per tap (nine times for a 3x3
filter) and the filter once per window, all from L2; that traffic, not the products, bounds them
(r50_02, C = K = 64 on 56x56, fp16, batch 32: about 2.7x its floor on triton-conv, bench/NOTES.md
section 30). Here each program takes a run of output rows (the grid's share of N x OH, image by
image) and

- a loading warp brings each input row of the run to shared memory once per filter column s,
  as a TMA box of the row shifted by s * dil_w - pad_w columns (zero-filled past the image's edges
  and above and below it), into a ring of row slots, each slot ``S`` boxes of [PIX, C];
- two computing warpgroups take the run's output rows in turn: output row oh is the sum over
  the taps (r, s) of W[r, s] (64 x C, in registers: wgmma's A operand) times the box of input row
  oh + r * dil_h - pad_h shifted by s (wgmma's B operand, read from the slot as TMA left it), a
  [64 channels, PIX pixels] accumulator; then the chain after the convolution and the store, while
  the other warpgroup's products run.

The filter comes first, by TMA into the ring's first slots, and each computing warpgroup copies it
into registers by ldmatrix before those slots take input rows (loaded by every warpgroup with
4-byte global loads, it took about half the kernel's time: bench/NOTES.md section 30).

Channel planes (NCHW input, tuning.GLUON_ROWS_PLANES): a row's shifted boxes would start inside
a 16-byte unit, which TMA cannot read, so each input row comes once, as a box of its channel
planes from column 0, into the box of the filter column at offset 0, and a shifter partition
(a thread per plane's row) copies it into the slot's boxes of the other columns, moved by their
offsets s * dil_w - pad_w within its registers (the row split into even and odd halves and
interleaved back: byte permutes, no shuffles); the products then run as on channels-last rows,
the filter in registers (plane_mode 2; r50_02: 42.6 us on triton-conv -> 20.2, 18.5 on NHWC
input). Where the shifter cannot (rows over 64 pixels, no column at offset 0, the filter past
the registers; or tuning.GLUON_ROWS_PLANE_SHIFTS off), the filter stays in shared memory and
each filter column's products over the filter rows are summed, then moved by the column's offset
(gl.gather along the accumulator's rows: warp shuffles) and added into the row (plane_mode 1).
NCHW output of either is stored along the planes, 16 bytes a thread where strides allow.

With 65 to 128 input channels the filter of 64 output channels does not fit one warpgroup's
registers: each computing warpgroup holds one half of the channels (the boxes come in two halves
of 64), both compute every output row over their half, and the row's owner (they alternate) adds
the other's partial sum from shared memory before the chain. Measured slower than the window
kernels on ResNet's r50_10 (tuning.GLUON_ROWS_HALVES_FIRST), such plans defer to them.

An input row is read by up to R consecutive output rows; a slot is refilled once the last output
row of each computing warpgroup that reads it has finished its products (a warpgroup that reads
it in no row: the other releases it for both). Rows of one image follow each other; where a run
crosses into the next image, the ring restarts there with that image's first rows. Output rows
are PIX = OW rounded up to a power of two pixels wide; the columns past OW are computed on zeros
and not stored.

Gluon has no interpreter: the kernel runs on Hopper GPUs only (CPU tests compile it for sm_90).
"""

from __future__ import annotations

from dataclasses import replace

import torch

from fusionplan import tuning
from fusionplan.codegen import indent
from fusionplan.descriptors import Layout, layout_strides
from fusionplan.enums import DataType
from fusionplan.epilogue import TileIndex, emit_stages
from fusionplan.folding import Stage, split_at_conv
from fusionplan.launch import needs_int64
from fusionplan.solvers.base import Kernel, PlanSpec, Solver
from fusionplan.solvers.conv_kernel import TritonConvKernel
from fusionplan.solvers.conv_toolkit import conv_plan_why_not, pack_rows_rsc, triton_cdiv
from fusionplan.solvers.gluon_toolkit import (
    BLOCK_N,
    CONSUMER_REGS,
    LOAD_REGS,
    ROW_CHANNELS,
    ROW_END,
    ROW_RUN,
    ROW_STORE,
    gluon_channel_loads,
    gluon_descriptor,
    gluon_epilogue_tail,
    gluon_header_fields,
    gluon_names,
    gluon_why_not,
    hopper_why_not,
    plane_vector,
    row_run_grid,
)
from fusionplan.solvers.window_toolkit import window_shape_args

Tensor = torch.Tensor


#: Shifted channel planes (plane_mode 2): the shifter's registers, what the computing warpgroups'
#: CONSUMER_REGS leave its warpgroup (a plane's row of up to 64 16-bit pixels and its moved copy,
#: a few spilled; with 208 for the computing warpgroups ptxas serialized every wgmma).
SHIFTER_REGS = 48

_TEMPLATE = '''"""Generated by fusionplan: convolution over output rows (gluon-rows) + {chain} ({n_stages} stages)."""
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


@gluon.jit
def _run_loads(u, start, end, OH, extra):
    # Ring position of the first input row output row u (of the run [start, end)) reads: the
    # run's rows before it, plus ``extra`` rows for each image the run entered before u's; past
    # the run, every load of it.
    if u >= end:
        u = end
        first = (end - 1) // OH + 1
    else:
        first = u // OH
    return (u - start) + (first - start // OH) * extra


@gluon.jit
def _release_rows(
    empty, u, row0, start, end, OH, extra, CONSUMER: gl.constexpr, NUM_SLOTS: gl.constexpr, W_SLOTS: gl.constexpr,
    HALVES: gl.constexpr,
):
    # Output row u (this warpgroup's, its products done) read the ring's rows row0 .. row0 + extra;
    # each is released by the last row of each warpgroup that reads it, twice where the other
    # warpgroup reads it in no row: a slot's "empty" barrier takes two arrivals a row. (HALVES:
    # both warpgroups read every row, each arrives once at the last.) Only rows already read are
    # released: every warp of the warpgroup has passed its wait for them, so none can find the
    # slot's "ready" phase gone on to the next row.
    img = u // OH
    s0 = gl.maximum(start, img * OH)  # the run's first and (one past) last output rows in u's image
    s1 = gl.minimum(end, (img + 1) * OH)
    b0 = _run_loads(s0, start, end, OH, extra)
    for j in range(row0, row0 + extra + 1):
        lo = gl.maximum(s0, s0 + (j - b0) - extra)  # the output rows that read ring row j
        hi = gl.minimum(s1 - 1, s0 + (j - b0))
        slot = (j + W_SLOTS) % NUM_SLOTS
        if HALVES:
            mbarrier.arrive(empty.index(slot), pred=u == hi)
        else:
            last = (u == hi) | ((u == hi - 1) & ((hi - start) % 2 != CONSUMER))
            mbarrier.arrive(empty.index(slot), pred=last)
            mbarrier.arrive(empty.index(slot), pred=last & (lo == hi))


@gluon.jit
def _hand_over(acc, xchg, full, free, i, CONSUMER: gl.constexpr):
    # the partial sum of output row i (the run's i-th, the other warpgroup's) over this
    # warpgroup's half of the channels, into its exchange buffer once the other has taken the last
    mbarrier.wait(free.index(CONSUMER), ((i // 2) & 1) ^ 1)
    xchg.index(CONSUMER).store(acc)
    {thread_barrier}()  # every warp's part stored before the one arrival
    mbarrier.arrive(full.index(CONSUMER))


@gluon.jit
def _take_over(acc, xchg, full, free, i, CONSUMER: gl.constexpr):
    # output row i (this warpgroup's): the other half's partial sum added to this one's
    mbarrier.wait(full.index(1 - CONSUMER), (i // 2) & 1)
    acc = acc + xchg.index(1 - CONSUMER).load(acc.type.layout)
    {thread_barrier}()  # every warp has read it before the buffer is handed back
    mbarrier.arrive(free.index(1 - CONSUMER))
    return acc


@gluon.jit
def _load_partition(
    x_desc, w_desc, x_bufs, w_bufs, w_ready, ready, empty, start, end, C, OH, pad_h, pad_w, dil_h, dil_w,
    R: gl.constexpr, S: gl.constexpr, NUM_SLOTS: gl.constexpr, W_SLOTS: gl.constexpr, CH: gl.constexpr,
    PLANES: gl.constexpr, ZERO_COL: gl.constexpr,
):
    # first the filter (PLANES 1: into its own buffers, on w_ready; else into the ring's first
    # W_SLOTS slots, all on slot 0's barrier, the others' first phase passing at once), then the
    # input rows from ring position W_SLOTS on
    k0 = gl.program_id(1) * w_desc.block_type.shape[0]
    BLOCK_C: gl.constexpr = w_desc.block_type.shape[1]
    if PLANES == 1:
        mbarrier.expect(w_ready, R * S * w_desc.block_type.nbytes)
        for t in gl.static_range(R * S):
            {tma_load}(w_desc, [k0, t * C], w_ready, w_bufs.index(t))
    else:
        mbarrier.expect(ready.index(0), R * S * CH * w_desc.block_type.nbytes)
        for t in gl.static_range(R * S):
            for h in gl.static_range(CH):
                {tma_load}(w_desc, [k0, t * C + h * BLOCK_C], ready.index(0), w_bufs.index(t * CH + h))
        for q in gl.static_range(1, W_SLOTS):
            mbarrier.arrive(ready.index(q))
    extra = (R - 1) * dil_h
    j = W_SLOTS  # the ring's position
    for n in range(start // OH, (end - 1) // OH + 1):
        first_oh = gl.maximum(start - n * OH, 0)
        last_oh = gl.minimum(end - n * OH, OH)  # one past
        for i in range(last_oh - first_oh + extra):
            slot = j % NUM_SLOTS
            # the first round finds every slot free (the phase before a new barrier's first counts as done)
            mbarrier.wait(empty.index(slot), ((j // NUM_SLOTS) & 1) ^ 1)
            ih = first_oh - pad_h + i
            if PLANES == 1:  # each plane's row from column 0 (the filter's columns: shifts of the product)
                mbarrier.expect(ready.index(slot), x_desc.block_type.nbytes)
                {tma_load}(x_desc, [n, 0, ih, 0], ready.index(slot), x_bufs.index(slot))
            elif PLANES == 2:  # the same box, as filter column ZERO_COL's (offset 0; the shifter makes the others)
                mbarrier.expect(ready.index(slot), x_desc.block_type.nbytes)
                {tma_load}(x_desc, [n, 0, ih, 0], ready.index(slot), x_bufs.index(slot * S + ZERO_COL))
            else:
                mbarrier.expect(ready.index(slot), S * CH * x_desc.block_type.nbytes)
                for s in gl.static_range(S):
                    for h in gl.static_range(CH):
                        box = x_bufs.index((slot * S + s) * CH + h)
                        {tma_load}(x_desc, [n, ih, s * dil_w - pad_w, h * BLOCK_C], ready.index(slot), box)
            j += 1


@gluon.jit
def _rows_partition(
    x_bufs, w_bufs, w_ready, ready, empty, {exchange_params}{shifted_params}y_ptr, prior_ptr, start, end,
    {stage_params}
    K, OH, OW, syn, syc, syh, syw, spn, spc, sph, spw, dil_h, pad_w, dil_w,
    R: gl.constexpr, S: gl.constexpr, PIX: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_C: gl.constexpr,
    NUM_SLOTS: gl.constexpr, W_SLOTS: gl.constexpr, SWIZZLE: gl.constexpr, ELEM_BITS: gl.constexpr,
    IDX64: gl.constexpr, HAS_PRIOR: gl.constexpr, CONSUMER: gl.constexpr, CH: gl.constexpr,
    PLANES: gl.constexpr, PLANE_VEC: gl.constexpr,
    {stage_flags}
):
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[gl.num_warps(), 1], instr_shape=[16, PIX, 256 // ELEM_BITS]
    )
    w_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=32 // ELEM_BITS)
    flat: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=SWIZZLE, element_bitwidth=ELEM_BITS, rank=2)
    # the stores' layout, [pixels, channels]: 8 contiguous channels per thread, 16-byte stores;
    # NCHW output of channel planes: lanes along a plane's pixels, PLANE_VEC of them a thread
    if PLANE_VEC > 1:
        out_layout: gl.constexpr = gl.BlockedLayout(
            [PLANE_VEC, 1], [PIX // PLANE_VEC, 32 * PLANE_VEC // PIX], [1, gl.num_warps()], [0, 1]
        )
    elif PLANE_VEC == 1:
        out_layout: gl.constexpr = gl.BlockedLayout([1, 1], [32, 1], [1, gl.num_warps()], [0, 1])
    else:
        out_layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [gl.num_warps(), 1], [1, 0])
    k0 = gl.program_id(1) * BLOCK_N
    if PLANES == 1:  # the filter stays in shared memory: wgmma's A operand from there
        mbarrier.wait(w_ready, 0)
    else:
        # the filter of the program's output channels, a [BLOCK_N, BLOCK_C] operand per tap, in
        # registers for good; then its slots go back to the ring (every warp has read them first)
        mbarrier.wait(ready.index(0), 0)
{weight_loads}
        {thread_barrier}()
        fence_async_shared()
        for q in gl.static_range(W_SLOTS):
            mbarrier.arrive(empty.index(q))
    # the chain's per-channel parameters: constants of the program's channels, loaded once
    ch_tile = gl.permute(gl.zeros((BLOCK_N, PIX), gl.float32, acc_layout), (1, 0))
    ch_v = k0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, ch_tile.type.layout))
    ch_v_mask = ch_v < K
{channel_loads}
    extra = (R - 1) * dil_h
    for u in range({rows}):
        row0 = _run_loads(u, start, end, OH, extra)
        acc = gl.zeros((BLOCK_N, PIX), gl.float32, acc_layout)
{taps}
        _release_rows(empty, u, row0, start, end, OH, extra, CONSUMER, NUM_SLOTS, W_SLOTS, CH == 2)
        acc = gl.permute(acc, (1, 0))  # [pixels, channels]: the chain's orientation, in its own layout
{row_end}


{shift_functions}@gluon.jit
def gluon_rows_kernel(
    x_desc, w_desc, y_ptr, prior_ptr,
    {stage_params}
    N, C, K, H, W, OH, OW,
    syn, syc, syh, syw, spn, spc, sph, spw,
    pad_h, pad_w, dil_h, dil_w,
    R: gl.constexpr, S: gl.constexpr, PIX: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_C: gl.constexpr,
    NUM_SLOTS: gl.constexpr, W_SLOTS: gl.constexpr, CH: gl.constexpr, SWIZZLE: gl.constexpr,
    ELEM_BITS: gl.constexpr, LOAD_REGS: gl.constexpr, CONSUMER_REGS: gl.constexpr, IDX64: gl.constexpr,
    HAS_PRIOR: gl.constexpr, PLANES: gl.constexpr, PLANE_VEC: gl.constexpr, ZERO_COL: gl.constexpr,
    {stage_flags}
):
    # x_desc: the input as [N, H, W, C], boxes of one row's PIX pixels and BLOCK_C channels; slot i
    # of the ring, filter column s, channel block h of CH: x_bufs[(i * S + s) * CH + h]. w_desc: the
    # packed filter [K, R*S*C], boxes of a tap's BLOCK_N x BLOCK_C (tap t, block h: w_bufs[t * CH +
    # h]), first held where the ring's first W_SLOTS slots are.
    # PLANES: x_desc is the input as [N, C, H, W], boxes of a row's PIX pixels of BLOCK_C channel
    # planes from column 0; 1: slot i is x_bufs[i], and the filter's taps have buffers of their
    # own; 2: slot i has a box per filter column s, x_bufs[i * S + s] (ZERO_COL's by TMA, the others
    # moved by the shifter), and the filter first holds the ring's first slots, as channels-last.
    if PLANES == 1:
        x_bufs = gl.allocate_shared_memory(x_desc.dtype, [NUM_SLOTS, 1, BLOCK_C, 1, PIX], x_desc.layout)
        w_bufs = gl.allocate_shared_memory(w_desc.dtype, [R * S, BLOCK_N, BLOCK_C], w_desc.layout)
    elif PLANES == 2:
        x_bufs = gl.allocate_shared_memory(x_desc.dtype, [NUM_SLOTS * S, 1, BLOCK_C, 1, PIX], x_desc.layout)
        w_bufs = x_bufs.{reinterpret}(x_desc.dtype, [R * S, BLOCK_N, BLOCK_C], w_desc.layout)
    else:
        x_bufs = gl.allocate_shared_memory(x_desc.dtype, [NUM_SLOTS * S * CH, 1, 1, PIX, BLOCK_C], x_desc.layout)
        flat: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=SWIZZLE, element_bitwidth=ELEM_BITS, rank=2)
        w_bufs = x_bufs.{reinterpret}(x_desc.dtype, [R * S * CH, BLOCK_N, BLOCK_C], flat)
    w_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    mbarrier.init(w_ready, count=1)
    ready = gl.allocate_shared_memory(gl.int64, [NUM_SLOTS, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [NUM_SLOTS, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(NUM_SLOTS):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=2)  # released by both computing warpgroups
{exchange_alloc}{shifted_alloc}
    fence_async_shared()
{grid_dependency}
{row_run}
    gl.warp_specialize(
        [{consumer_0}, {consumer_1}, {loader}{shifter}],
        [4, 1{shifter_warps}],
        [CONSUMER_REGS, LOAD_REGS{shifter_regs}],
    )
    # every barrier invalidated after the partitions (PTX lets an mbarrier's memory serve nothing
    # else until it is invalidated)
    mbarrier.invalidate(w_ready)
    for i in gl.static_range(NUM_SLOTS):
        mbarrier.invalidate(ready.index(i))
        mbarrier.invalidate(empty.index(i))
{exchange_inval}{shifted_inval}'''

#: The loading partition and its arguments.
_LOADER = """(
            _load_partition,
            (x_desc, w_desc, x_bufs, w_bufs, w_ready, ready, empty, start, end, C, OH, pad_h, pad_w, dil_h, dil_w,
             R, S, NUM_SLOTS, W_SLOTS, CH, PLANES, ZERO_COL),
        )"""

#: Computing warpgroup {consumer} of two and its arguments.
_CONSUMER = """(
            _rows_partition,
            (x_bufs, w_bufs, w_ready, ready, empty, {exchange_args}{shifted_args}y_ptr, prior_ptr, start, end,
             {stage_args}
             K, OH, OW, syn, syc, syh, syw, spn, spc, sph, spw, dil_h, pad_w, dil_w,
             R, S, PIX, BLOCK_N, BLOCK_C, NUM_SLOTS, W_SLOTS, SWIZZLE, ELEM_BITS, IDX64, HAS_PRIOR, {consumer}, CH,
             PLANES, PLANE_VEC, {flag_args}),
        )"""

#: One filter row's products: wait for its input row, then a wgmma per filter column.
_TAP_ROW = """        j = row0 + {r} * dil_h + W_SLOTS
        mbarrier.wait(ready.index(j % NUM_SLOTS), (j // NUM_SLOTS) & 1)
{products}"""

_PRODUCT = """        box = x_bufs.index(((j % NUM_SLOTS) * S + {s}) * CH + {half})
        box = box.{reinterpret}(x_bufs.dtype, [PIX, BLOCK_C], flat)
        acc = warpgroup_mma(w{t}, box.permute((1, 0)), acc, is_async=True)"""

_ROW_DONE = """        acc = warpgroup_mma_wait(num_outstanding=0, deps=[acc])"""

#: Channel planes: a filter column's products over the filter rows (each row's box from column
#: 0, [BLOCK_C, PIX], wgmma's B operand as TMA left it; the filter's tap from shared memory), then
#: the column's sum moved by its offset ({shift}: s * dil_w - pad_w, fixed with the plan) into the
#: row's (warp shuffles); a column of offset 0 is added as it is.
_PLANE_COLUMN = """{zero}{products}
        acc = warpgroup_mma_wait(num_outstanding=0, deps=[acc])
{move}"""

_PLANE_SHIFT = """        # column ow takes the column's sum at ow + {shift} (zeros outside the row's PIX)
        cols = gl.arange(0, PIX, layout=gl.SliceLayout(0, acc_layout)) + {shift}
        index = gl.minimum(gl.maximum(cols, 0), PIX - 1)[None, :] + gl.zeros((BLOCK_N, PIX), gl.int32, acc_layout)
        row = {previous}gl.where(((cols >= 0) & (cols < PIX))[None, :], gl.gather(acc, index, 1), 0.0)"""

_PLANE_UNSHIFTED = """        row = {previous}acc"""

_PLANE_WAIT = """        j = row0 + {r} * dil_h + W_SLOTS
        mbarrier.wait(ready.index(j % NUM_SLOTS), (j // NUM_SLOTS) & 1)"""

_PLANE_PRODUCT = """        j = row0 + {r} * dil_h + W_SLOTS
        box = x_bufs.index(j % NUM_SLOTS).{reinterpret}(x_bufs.dtype, [BLOCK_C, PIX], flat)
        acc = warpgroup_mma(w_bufs.index({t}), box, acc, is_async=True)"""


#: Shifted channel planes: the shifter's partition, its arguments, the barriers it arrives on
#: (a slot's boxes moved) and the consumers' products over a slot's boxes.
_SHIFTER = """(
            _shift_partition,
            (x_bufs, ready, shifted, start, end, OH, dil_h, R, S, PIX, BLOCK_C, NUM_SLOTS, W_SLOTS, SWIZZLE,
             ELEM_BITS, ZERO_COL),
        )"""

_SHIFTED_ALLOC = """
    shifted = gl.allocate_shared_memory(gl.int64, [NUM_SLOTS, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(NUM_SLOTS):
        mbarrier.init(shifted.index(i), count=1)"""
_SHIFTED_INVAL = """    for i in gl.static_range(NUM_SLOTS):
        mbarrier.invalidate(shifted.index(i))
"""

_SHIFT_PARTITION = """@gluon.jit
def _shift_partition(
    x_bufs, ready, shifted, start, end, OH, dil_h,
    R: gl.constexpr, S: gl.constexpr, PIX: gl.constexpr, BLOCK_C: gl.constexpr, NUM_SLOTS: gl.constexpr,
    W_SLOTS: gl.constexpr, SWIZZLE: gl.constexpr, ELEM_BITS: gl.constexpr, ZERO_COL: gl.constexpr,
):
    # each input row's box (filter column ZERO_COL's, offset 0) copied into the slot's boxes of the
    # other filter columns, moved by their offsets: a plane's row is one thread's, so the move is
    # between its registers; the ring's positions as the loader's
    rows: gl.constexpr = gl.BlockedLayout([1, PIX], [32, 1], [gl.num_warps(), 1], [1, 0])
    flat: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=SWIZZLE, element_bitwidth=ELEM_BITS, rank=2)
    # the filter's slots hold no row in the ring's first round: their first phase passes at once
    for q in gl.static_range(W_SLOTS):
        mbarrier.arrive(shifted.index(q))
    extra = (R - 1) * dil_h
    j = W_SLOTS
    for n in range(start // OH, (end - 1) // OH + 1):
        first_oh = gl.maximum(start - n * OH, 0)
        last_oh = gl.minimum(end - n * OH, OH)  # one past
        for i in range(last_oh - first_oh + extra):
            slot = j % NUM_SLOTS
            mbarrier.wait(ready.index(slot), (j // NUM_SLOTS) & 1)
            x = x_bufs.index(slot * S + ZERO_COL).{reinterpret}(x_bufs.dtype, [BLOCK_C, PIX], flat).load(rows)
{stores}
            fence_async_shared()  # the boxes written, for wgmma's reads
            {thread_barrier}()  # every warp's rows written before the one arrival
            mbarrier.arrive(shifted.index(slot))
            j += 1


"""

#: The Gluon functions a move of rows within a thread's registers is built from (move_function's splits and joins).
MOVE_HELPERS = """@gluon.jit
def _halves(x):
    # [BLOCK_C, L] -> its even and its odd columns, [BLOCK_C, L / 2] each (a thread's registers)
    e, o = gl.split(gl.reshape(x, [x.shape[0], x.shape[1] // 2, 2]))
    return e, o


@gluon.jit
def _interleave(e, o):
    # the inverse of _halves: e's columns at the even places, o's at the odd ones
    return gl.reshape(gl.join(gl.convert_layout(e, o.type.layout), o), [e.shape[0], 2 * e.shape[1]])


"""

_SHIFT_STORE = """            box = x_bufs.index(slot * S + {s}).{reinterpret}(x_bufs.dtype, [BLOCK_C, PIX], flat)
            box.store(_shift_{s}(x))"""

_SHIFTED_TAP_ROW = """        j = row0 + {r} * dil_h + W_SLOTS
        mbarrier.wait(ready.index(j % NUM_SLOTS), (j // NUM_SLOTS) & 1)  # TMA's box
        mbarrier.wait(shifted.index(j % NUM_SLOTS), (j // NUM_SLOTS) & 1)  # the shifter's boxes
{products}"""

_SHIFTED_PRODUCT = """        box = x_bufs.index((j % NUM_SLOTS) * S + {s})
        box = box.{reinterpret}(x_bufs.dtype, [BLOCK_C, PIX], flat)
        acc = warpgroup_mma(w{t}, box, acc, is_async=True)"""


def move_function(name: str, offset: int, length: int, with_next: bool = False) -> str:
    """The source of a Gluon function that maps [BLOCK_C, ``length``] tensors, each row one thread's,
    to the tensor whose column p holds column p + ``offset`` of its argument x (zeros past the
    row's ends), or, ``with_next``, of x's row followed by its second argument y's (offset >= 0):
    the columns split into even and odd halves until the move is whole elements of a half, then
    interleaved back (register moves and byte permutes, no shuffles)."""
    assert not with_next or 0 <= offset <= length
    lines: list[str] = []
    halves: dict[str, tuple[str, str]] = {}

    def split(var: str | None) -> tuple[str | None, str | None]:
        if var is None:  # zeros split into zeros
            return None, None
        if var not in halves:
            halves[var] = (f"e{len(halves)}", f"o{len(halves)}")
            lines.append(f"    {halves[var][0]}, {halves[var][1]} = _halves({var})")
        return halves[var]

    def zeros_like(var: str) -> str:
        lines.append(f"    z{len(lines)} = gl.zeros_like({var})")
        return f"z{len(lines) - 1}"

    def moved(a: str | None, b: str | None, n: int, d: int) -> str | None:  # cat(a, b)[p + d], p < n; None: zeros
        if d == 0 or (a is None and b is None):
            return a
        if d == n:
            return b
        ha, hb = split(a), split(b)
        # out[2i + t] = cat[2i + t + d]: the halves of t + d's parity, moved by its floor / 2
        parts = [moved(ha[(t + d) % 2], hb[(t + d) % 2], n // 2, (t + d) // 2) for t in (0, 1)]
        if parts[0] is None and parts[1] is None:
            return None
        even, odd = (part if part is not None else zeros_like(other) for part, other in zip(parts, parts[::-1]))
        lines.append(f"    p{len(lines)} = _interleave({even}, {odd})")
        return f"p{len(lines) - 1}"

    if with_next:
        result, args, what = moved("x", "y", length, offset), "x, y", "x's row followed by y's"
    else:
        moves = moved("x", None, length, offset) if offset >= 0 else moved(None, "x", length, length + offset)
        result, args, what = moves, "x", "x (zeros past the row's ends)"
    result = result if result is not None else zeros_like("x")
    body = "\n".join(lines) or "    pass"
    head = f"@gluon.jit\ndef {name}({args}):\n    # column ow takes column ow {offset:+d} of {what}\n"
    return f"{head}{body}\n    return {result}\n\n\n"


def plane_taps(r_taps: int, shifts: list[int], reinterpret: str) -> list[str]:
    """The row's products on channel planes: the filter columns in turn (column s's offset:
    ``shifts[s]``), each summed over the filter rows into ``acc`` and added, shifted, into ``row``
    (the first column's waits for the row's input rows), then ``acc`` is the row."""
    columns = []
    for s, shift in enumerate(shifts):
        lines = [_PLANE_WAIT.format(r=r) for r in range(r_taps)] if s == 0 else []
        lines += [_PLANE_PRODUCT.format(r=r, t=r * len(shifts) + s, reinterpret=reinterpret) for r in range(r_taps)]
        zero = "" if s == 0 else "        acc = gl.zeros((BLOCK_N, PIX), gl.float32, acc_layout)\n"
        previous = "" if s == 0 else "row + "
        move = (_PLANE_SHIFT if shift else _PLANE_UNSHIFTED).format(shift=shift, previous=previous)
        columns.append(_PLANE_COLUMN.format(zero=zero, products="\n".join(lines), move=move))
    return [*columns, "        acc = row"]


#: The output row's pixels and channels in ``{layout}``.
_COORDINATES = "ow = gl.arange(0, PIX, layout=gl.SliceLayout(1, {layout}))\n" + ROW_CHANNELS


#: Halves: a computing warpgroup's rows alternate between handing its partial sum over and taking
#: the other's (then the row's end).
_HALVES_ROW_END = """        if (u - start) % 2 != CONSUMER:
            _hand_over(acc, xchg, full, free, u - start, CONSUMER)
        else:
            acc = _take_over(acc, xchg, full, free, u - start, CONSUMER)
{row_end}"""

#: Halves: the exchange buffers of the partial sums (one per computing warpgroup) and their barriers.
_EXCHANGE_ALLOC = """    plain: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, order=[1, 0])
    xchg = gl.allocate_shared_memory(gl.float32, [2, PIX, BLOCK_N], plain)
    full = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    free = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(2):
        mbarrier.init(full.index(i), count=1)
        mbarrier.init(free.index(i), count=1)"""
_EXCHANGE_INVAL = """    for i in gl.static_range(2):
        mbarrier.invalidate(full.index(i))
        mbarrier.invalidate(free.index(i))
"""


#: Channel planes: the store of PLANE_VEC pixels a thread where they are whole 16-byte units
#: (the row's start, the planes' strides and OW multiples of PLANE_VEC, told to the compiler).
_PLANE_STORE = """    h = gl.convert_layout(h.to(y_ptr.dtype.element_ty), out_layout)
{coordinates_in_out}
    if PLANE_VEC > 1:
        m_mask = ow < OW // PLANE_VEC * PLANE_VEC  # OW itself: a multiple the compiler can see
        row = gl.multiple_of(n_img * syn + oh * syh, PLANE_VEC)
        plane = gl.multiple_of(ch * syc, PLANE_VEC)
        gl.store(y_ptr + row + ow[:, None] + plane[None, :], h, mask=m_mask[:, None] & n_mask[None, :])
    else:
        mask = m_mask[:, None] & n_mask[None, :]
        gl.store(y_ptr + (n_img * syn + oh * syh + ow * syw)[:, None] + ch[None, :] * syc, h, mask=mask)
"""


def render_gluon_rows_source(spec: PlanSpec, stages: list[Stage], mode: int) -> str:
    """The kernel's source for the plan's filter (a register operand per tap, a product per tap)
    with the epilogue of ``stages`` in Gluon's names. Where the input channels are split in halves
    (channel_splits), each computing warpgroup holds its half of the filter and reads its half of
    the boxes, both compute every output row and the row's owner (they alternate) adds the other's
    partial sum before the chain. ``mode``: the input's reading (plane_mode)."""
    _, conv, _ = split_at_conv(spec.ops)
    assert conv is not None
    r_taps, s_taps = conv.w_desc.dims[2:]
    halves = channel_splits(spec.input_desc.dims[1]) == 2
    half = "CONSUMER" if halves else "0"
    names = gluon_names()
    hoist = tuning.GLUON_ROWS_HOIST_CHANNELS
    # the loads before the row loop index with ch_v (the loop's own ch is in another layout)
    idx = TileIndex(ch="ch_v", ch_mask="ch_v_mask") if hoist else TileIndex()
    epi = emit_stages(stages, spec.ops, idx, hoist_channels=hoist)
    weight_loads = (
        []
        if mode == 1
        else [f"        w{t} = w_bufs.index({t} * CH + {half}).load(w_layout)" for t in range(r_taps * s_taps)]
    )
    if mode == 1:
        taps = plane_taps(r_taps, column_offsets(spec), names["reinterpret"])
    elif mode == 2:
        taps = tap_rows(r_taps, s_taps, _SHIFTED_TAP_ROW, _SHIFTED_PRODUCT, reinterpret=names["reinterpret"])
    else:
        taps = tap_rows(r_taps, s_taps, _TAP_ROW, _PRODUCT, half=half, reinterpret=names["reinterpret"])
    store = (_PLANE_STORE if mode else ROW_STORE).format(
        coordinates_in_out=indent(_COORDINATES.format(layout="out_layout").split("\n"), 4)
    )
    tail = gluon_epilogue_tail(epi, store).rstrip("\n")
    row_end = "\n".join([ROW_END, _COORDINATES.format(layout="acc.type.layout")]).split("\n")
    depth = 12 if halves else 8  # the row's end inside the owner's branch
    row_end = indent(row_end, depth) + "\n" + indent(tail.split("\n"), depth - 4)
    fields = gluon_header_fields(spec, stages, epi)
    exchange = "xchg, full, free, " if halves else ""
    shifted = "shifted, " if mode == 2 else ""
    channel_loads = gluon_channel_loads(epi)
    return _TEMPLATE.format(
        weight_loads="\n".join(weight_loads) or "        pass",
        channel_loads=channel_loads,
        taps="\n".join(taps),
        rows="start, end" if halves else "start + CONSUMER, end, 2",
        row_end=_HALVES_ROW_END.format(row_end=row_end) if halves else row_end,
        exchange_alloc=_EXCHANGE_ALLOC if halves else "",
        exchange_inval=_EXCHANGE_INVAL if halves else "",
        row_run=ROW_RUN,
        exchange_params=exchange,
        shifted_params=shifted,
        loader=_LOADER,
        consumer_0=_CONSUMER.format(consumer=0, exchange_args=exchange, shifted_args=shifted, **fields),
        consumer_1=_CONSUMER.format(consumer=1, exchange_args=exchange, shifted_args=shifted, **fields),
        **(shifter_fields(spec, names) if mode == 2 else NO_SHIFTER),
        **fields,
        **names,
    )


def column_offsets(spec: PlanSpec) -> list[int]:
    """The filter columns' offsets along an input row: s * dil_w - pad_w."""
    _, conv, _ = split_at_conv(spec.ops)
    assert conv is not None
    return [s * conv.conv.dilations[1] - conv.conv.pads[1] for s in range(conv.w_desc.dims[3])]


def tap_rows(r_taps: int, s_taps: int, row: str, product: str, **fields: str) -> list[str]:
    """A row's products as one wgmma per tap: each filter row's ``row`` (its waits, then its
    ``product`` per filter column, formatted with ``fields``), then one wait for them all."""
    rows = [
        row.format(r=r, products="\n".join(product.format(s=s, t=r * s_taps + s, **fields) for s in range(s_taps)))
        for r in range(r_taps)
    ]
    return [*rows, _ROW_DONE]


#: The template's shifter fields of plans without one (plane_mode 0 and 1).
NO_SHIFTER = dict(shift_functions="", shifter="", shifter_warps="", shifter_regs="", shifted_alloc="", shifted_inval="")


def shifter_fields(spec: PlanSpec, names: dict[str, str]) -> dict[str, str]:
    """The template's fields of the shifter of a plan of plane_mode 2: its partition and the
    functions moving a box's columns, its warps (a thread a channel plane's row), registers and
    barriers."""
    offsets = column_offsets(spec)
    pixels = row_pixels(spec.output_desc.dims[3])
    stores = [_SHIFT_STORE.format(s=s, reinterpret=names["reinterpret"]) for s, offset in enumerate(offsets) if offset]
    functions = [move_function(f"_shift_{s}", offset, pixels) for s, offset in enumerate(offsets) if offset]
    partition = _SHIFT_PARTITION.format(
        stores="\n".join(stores), reinterpret=names["reinterpret"], thread_barrier=names["thread_barrier"]
    )
    return dict(
        shift_functions=partition + MOVE_HELPERS + "".join(functions),
        shifter=", " + _SHIFTER,
        shifter_warps=f", {shifter_warps(spec.input_desc.dims[1])}",
        shifter_regs=f", {SHIFTER_REGS}",
        shifted_alloc=_SHIFTED_ALLOC,
        shifted_inval=_SHIFTED_INVAL,
    )


def shifter_warps(c: int) -> int:
    """The shifter's warps: a thread per channel plane's row of the box (channel_block(C) rows)."""
    return max(1, channel_block(c) // 32)


def plane_mode(spec: PlanSpec) -> int:
    """How the kernel reads the plan's input: 0 channels-last rows; channel planes from column 0
    with the filter's columns as shifts of the product (1) or of the input rows' boxes, moved by
    the shifter (2, where shifted_planes_why_not has no objection)."""
    if not plane_rows(spec):
        return 0
    return 2 if shifted_planes_why_not(spec) is None else 1


def shifted_planes_why_not(spec: PlanSpec) -> str | None:
    """Why the shifter does not take the plan's channel planes, or None: tuning.GLUON_ROWS_PLANE_SHIFTS,
    rows of at most 64 pixels (a plane's row in a thread's registers), a filter column at offset
    0 (the box TMA reads), the filter in registers (tuning.GLUON_ROWS_FILTER_REGS) and the
    shallowest ring of slots of S boxes within tuning.GLUON_ROWS_RING_BYTES."""
    if not tuning.GLUON_ROWS_PLANE_SHIFTS:
        return "tuning.GLUON_ROWS_PLANE_SHIFTS is off"
    _, conv, _ = split_at_conv(spec.ops)
    assert conv is not None
    pixels = row_pixels(spec.output_desc.dims[3])
    if pixels > 64:
        return f"output rows of {pixels} pixels: a shifter's thread holds a plane's row of at most 64"
    if 0 not in column_offsets(spec):
        return f"no filter column at offset 0 (offsets {column_offsets(spec)}): TMA reads boxes from column 0"
    c = spec.input_desc.dims[1]
    r, s = conv.w_desc.dims[2:]
    regs = filter_registers(c, r, s)
    if regs > tuning.GLUON_ROWS_FILTER_REGS:
        return f"the filter takes {regs} registers a thread (> {tuning.GLUON_ROWS_FILTER_REGS})"
    slots = channel_ring_slots(pixels, c, s)
    fewest = fewest_slots(r, conv.conv.dilations[0], pixels)
    if slots < fewest:
        return f"{slots} slots of {s} boxes fit, {fewest} needed"
    return None


def plane_rows(spec: PlanSpec) -> bool:
    """Whether the kernel reads the plan's input as rows of packed channel planes (NCHW; boxes
    from column 0, plane_mode 1 or 2) rather than channels-last rows."""
    x = spec.input_desc
    return x.dims[1] > 1 and x.same_strides(layout_strides(x.dims, Layout.NCHW))


def row_pixels(ow: int) -> int:
    """An output row's pixels in the product: OW rounded up to a power of two, at least 8 (a
    wgmma's pixels come in multiples of 8; a box's side is a power of two in Gluon)."""
    return max(8, 1 << (ow - 1).bit_length())


def channel_splits(c: int) -> int:
    """Blocks of the input channels, one per computing warpgroup where there are two: a box holds
    at most 64 (128-byte rows), a warpgroup's registers at most one block's filter."""
    return 1 if c <= 64 else 2


def channel_block(c: int) -> int:
    """The boxes' and the filter's channels: C rounded up to a power of two, at least 16 (a 16-bit
    wgmma's reduction slice), at most 64 (beyond: two blocks of 64); the channels past C are zeros."""
    return min(64, max(16, 1 << (c - 1).bit_length()))


def filter_holder(c: int) -> str:
    """Whose filter filter_registers counts, for messages: the plan's, or where the channels are
    split a computing warpgroup's half."""
    return "the" if channel_splits(c) == 1 else "a computing warpgroup's half of the"


def filter_registers(c: int, r: int, s: int) -> int:
    """Registers a computing thread spends holding its filter of BLOCK_N output channels in
    16-bit data: BLOCK_N x channel_block(C) x R x S elements over 128 threads, two a register."""
    return BLOCK_N * channel_block(c) * r * s // (128 * 2)


def gluon_rows_why_not(spec: PlanSpec) -> str | None:
    """Why the plan does not fit this kernel, or None: an ungrouped stride-1 convolution on
    packed channels-last fp16 or bf16 input with 16-byte pixels (any K: the output is stored by
    pointer), at most 128 input channels (a box's 128-byte rows hold 64, two computing warpgroups
    a box each), a filter that fits tuning.GLUON_ROWS_FILTER_REGS registers a thread,
    output rows of at most 256 pixels; or packed channel planes as plane_rows_why_not says."""
    _, conv, _ = split_at_conv(spec.ops)
    assert conv is not None
    c = conv.conv
    if not tuning.GLUON_ROWS:
        return "tuning.GLUON_ROWS is off"
    if spec.dtype not in (DataType.HALF, DataType.BFLOAT16):
        return f"{spec.dtype.name} data: the filter is held in registers as 16-bit wgmma operands (fp16, bf16)"
    if c.groups != 1:
        return "grouped convolutions: the filter is one product per tap"
    if c.strides != (1, 1):
        return f"stride {c.strides}: output rows read consecutive input rows (stride 1 only)"
    x = spec.input_desc
    if plane_rows(spec):
        return plane_rows_why_not(spec)
    if not x.same_strides(layout_strides(x.dims, Layout.NHWC)):
        return (
            "the input must be packed channels-last (NHWC) or channel planes (NCHW) to be read in boxes of rows; "
            f"it is {x.layout_name}"
        )
    channels = x.dims[1]
    if channels * 2 % 16:
        return f"C={channels}: a tensor box's pixels must be whole 16-byte units (C a multiple of 8)"
    if channels > 128:
        return (
            f"C={channels} input channels: a row's box holds at most 64 (128-byte rows), each of the two computing "
            "warpgroups one box (at most 128)"
        )
    r, s = conv.w_desc.dims[2:]
    regs = filter_registers(channels, r, s)
    if regs > tuning.GLUON_ROWS_FILTER_REGS:
        return (
            f"{filter_holder(channels)} filter of {BLOCK_N} output channels ({channel_block(channels)} channels x "
            f"{r}x{s}) takes {regs} "
            f"registers a thread (> {tuning.GLUON_ROWS_FILTER_REGS})"
        )
    ow = spec.output_desc.dims[3]
    if ow > 256:
        return f"output rows of {ow} pixels exceed a tensor box's 256"
    pixels = row_pixels(ow)
    slots = channel_ring_slots(pixels, channels, s)
    fewest = fewest_slots(r, c.dilations[0], pixels)
    if slots < fewest:
        return (
            f"a {r}x{s} filter of dilation {c.dilations[0]} on output rows of {ow} pixels needs "
            f"{fewest} slots of input rows in shared memory, {slots} fit"
        )
    return None


def plane_rows_why_not(spec: PlanSpec) -> str | None:
    """Why gluon-rows does not take the plan's channel planes, or None (tuning.GLUON_ROWS_PLANES,
    at most 64 channels and a multiple of 8, rows of whole 16-byte units that an output row's box of at least 16 pixels
    (a swizzled box row) holds from column 0, the filter and the shallowest ring within
    tuning.GLUON_ROWS_RING_BYTES)."""
    _, conv, _ = split_at_conv(spec.ops)
    assert conv is not None
    if not tuning.GLUON_ROWS_PLANES:
        return "channel planes (NCHW): tuning.GLUON_ROWS_PLANES is off"
    n, c, h, w = spec.input_desc.dims
    if c > 64:
        return f"C={c} channel planes: a box holds at most 64"
    if c * 2 % 16:
        return f"C={c} channel planes: a tap's weights' box starts at column t*C, a tensor copy's on 16-byte units"
    if w * 2 % 16:
        return f"rows of {w} pixels: a tensor box's rows must be whole 16-byte units (W a multiple of 8)"
    pixels = row_pixels(spec.output_desc.dims[3])
    if w > pixels or pixels > 256:
        return f"input rows of {w} pixels do not fit an output row's box of {pixels}"
    if pixels * 2 < 32:
        return (
            f"output rows of {pixels} pixels: a box's {pixels * 2}-byte rows take no wgmma swizzle (32 bytes or more)"
        )
    if shifted_planes_why_not(spec) is None:
        return None
    r, s = conv.w_desc.dims[2:]
    slots = plane_ring_slots(pixels, c, r, s)
    fewest = least_slots(r, conv.conv.dilations[0])
    if slots < fewest:
        return f"a {r}x{s} filter in shared memory leaves {slots} slots of input rows, {fewest} needed"
    return None


def plane_ring_slots(pixels: int, c: int, r: int, s: int) -> int:
    """Slots of channel-plane rows (a box of channel_block(C) x ``pixels``) that
    tuning.GLUON_ROWS_RING_BYTES holds beside the filter (R x S tiles of BLOCK_N x
    channel_block(C)), at most 32."""
    block_c = channel_block(c)
    return max(0, min(32, (tuning.GLUON_ROWS_RING_BYTES - r * s * BLOCK_N * block_c * 2) // (pixels * block_c * 2)))


def gluon_rows_defer_why(spec: PlanSpec) -> str | None:
    """Output rows narrower than tuning.GLUON_ROWS_MIN_WIDTH: products of so few pixels were not
    measured faster than the window kernels'; input channels in two halves unless
    tuning.GLUON_ROWS_HALVES_FIRST (measured slower on r50_10)."""
    ow = spec.output_desc.dims[3]
    if ow < tuning.GLUON_ROWS_MIN_WIDTH:
        return f"output rows of {ow} pixels (< {tuning.GLUON_ROWS_MIN_WIDTH}): not measured faster than the windows"
    channels = spec.input_desc.dims[1]
    if channel_splits(channels) == 2 and not tuning.GLUON_ROWS_HALVES_FIRST:
        return f"C={channels} input channels in two halves: measured slower than the windows (GLUON_ROWS_HALVES_FIRST)"
    return None


def ring_slots(pixels: int, block_c: int, s: int, splits: int = 1) -> int:
    """Slots of input rows that tuning.GLUON_ROWS_RING_BYTES holds beside the exchange buffers of
    channel halves (a slot: ``s`` x ``splits`` boxes of ``pixels`` x ``block_c`` 16-bit
    elements), at most 32."""
    return min(
        32, (tuning.GLUON_ROWS_RING_BYTES - exchange_bytes(pixels, splits)) // (s * splits * pixels * block_c * 2)
    )


def channel_ring_slots(pixels: int, c: int, s: int) -> int:
    """ring_slots for ``c`` input channels: their channel block and splits."""
    return ring_slots(pixels, channel_block(c), s, channel_splits(c))


def exchange_bytes(pixels: int, splits: int) -> int:
    """Shared memory of the partial sums handed between the computing warpgroups of channel
    halves: one fp32 tile of BLOCK_N x ``pixels`` each."""
    return 0 if splits == 1 else 2 * BLOCK_N * pixels * 4


def filter_slots(r: int, pixels: int) -> int:
    """Ring slots the filter takes at the program's start: R x S tiles of BLOCK_N x C against
    slots of S boxes of ``pixels`` x C."""
    return triton_cdiv(r * BLOCK_N, pixels)


def least_slots(r: int, dil_h: int) -> int:
    """The shallowest ring that cannot stall: an output row reads (R - 1) * dil_h + 1 input rows,
    and where a run enters the next image, the two computing warpgroups' rows (the last of one
    image, the first of the next) hold 2 * (R - 1) * dil_h + 2 of them between them."""
    return 2 * (r - 1) * dil_h + 2


def fewest_slots(r: int, dil_h: int, pixels: int) -> int:
    """The shallowest ring a plan may take: one that cannot stall and that holds the filter."""
    return max(least_slots(r, dil_h), filter_slots(r, pixels))


class GluonRowsKernel(TritonConvKernel):
    reads_descriptors = True
    solver_name = "gluon-rows"
    stem = "gluon_rows"
    splits_reduction = False

    def __init__(self, spec: PlanSpec, handle) -> None:
        # the input's reading (plane_mode), fixed when built: the source rendered now and every
        # launch take it from here, whatever the tuning switches it reads say later
        self.mode = plane_mode(spec)
        super().__init__(spec, handle)

    def pack(self, weight: Tensor) -> Tensor:
        return pack_rows_rsc(weight)

    @property
    def candidates(self) -> list[tuning.ConvConfig]:  # type: ignore[override]
        """NORMAL find's configurations: the heuristic's ring, the shallowest that cannot stall
        (least_slots) and one between."""
        cfg = self.heuristic(0, 0, self.geometry[1], self.spec.dtype.torch_dtype)
        least = self._fewest_slots(cfg.block_m)
        depths = dict.fromkeys((cfg.num_stages, (cfg.num_stages + least) // 2, least))
        return [replace(cfg, num_stages=n) for n in depths]

    def render(self, spec: PlanSpec, stages: list[Stage]) -> str:
        return render_gluon_rows_source(spec, stages, self.mode)

    def heuristic(self, m: int, k_per_group: int, c_per_group: int, dtype: torch.dtype) -> tuning.ConvConfig:
        """An output row's pixels, 64 output channels, the whole input channels, the deepest ring."""
        r, s = self.conv.w_desc.dims[2:]
        pixels = row_pixels(self.out_hw[1])
        if self.mode == 1:
            slots = plane_ring_slots(pixels, c_per_group, r, s)
        else:
            slots = channel_ring_slots(pixels, c_per_group, s)
        return tuning.ConvConfig(pixels, BLOCK_N, channel_block(c_per_group), 1, 4, slots, 1, 2)

    def programs_and_steps(self, cfg: tuning.ConvConfig) -> tuple[int, int]:
        """Programs of the grid and the products per output row (one per tap)."""
        r, s = self.conv.w_desc.dims[2:]
        programs, blocks, _ = self._grid()
        return programs * blocks, r * s

    def _grid(self) -> tuple[int, int, int]:
        return row_run_grid(self._handle, self.spec.input_desc.dims[0] * self.out_hw[0], self.k)

    def narrower_config(self) -> tuning.ConvConfig | None:
        """Two slots fewer, down to least_slots and the filter's slots (a specialization reading a
        prior output needs more shared memory)."""
        least = self._fewest_slots(self.config.block_m)
        if self.config.num_stages <= least:
            return None
        return replace(self.config, num_stages=max(least, self.config.num_stages - 2))

    def _plane_vector(self, out: Tensor, strides: list[int], pixels: int) -> int:
        """PLANE_VEC of channel-plane input: plane_vector's (0: channels-last output), 1 instead of
        8 where tuning.GLUON_ROWS_PLANE_VECTOR_STORES is off, OW is not a multiple of 8 (the row's
        mask would split a thread's pixels) or rows are under 16 pixels (one lane along them)."""
        vector = plane_vector(tuple(strides), out)
        whole = tuning.GLUON_ROWS_PLANE_VECTOR_STORES and self.out_hw[1] % 8 == 0 and pixels >= 16
        return 1 if vector == 8 and not whole else vector

    def _fewest_slots(self, pixels: int) -> int:
        """fewest_slots for the plan's filter rows and their dilation (channel planes whose filter
        has buffers of its own: least_slots)."""
        r, dil_h = self.conv.w_desc.dims[2], self.conv_args[4]
        return least_slots(r, dil_h) if self.mode == 1 else fewest_slots(r, dil_h, pixels)

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
        bits = x.element_size() * 8
        mode = self.mode
        w_swizzle = min(128, cfg.block_k * bits // 8)
        if mode:  # boxes [BLOCK_C planes, 1 row, PIX pixels] from column 0, swizzled along the pixels
            swizzle = min(128, cfg.block_m * bits // 8)
            box = [1, cfg.block_k, 1, cfg.block_m]
            x_desc = gluon_descriptor(x, [n, c, h, w], [c * h * w, h * w, w, 1], box, swizzle, bits)
        else:
            swizzle = w_swizzle
            box = [1, 1, cfg.block_m, cfg.block_k]
            x_desc = gluon_descriptor(x, [n, h, w, c], [h * w * c, w * c, c, 1], box, swizzle, bits)
        r, s = self.conv.w_desc.dims[2:]
        depth = r * s * c
        w_desc = gluon_descriptor(packed, [self.k, depth], [depth, 1], [BLOCK_N, cfg.block_k], w_swizzle, bits)
        shape_args = window_shape_args(self, out, p, strides)
        consts = (
            r,
            s,
            cfg.block_m,
            BLOCK_N,
            cfg.block_k,
            cfg.num_stages,
            0 if mode == 1 else filter_slots(r, cfg.block_m),
            channel_splits(c),
            swizzle,
            bits,
            LOAD_REGS,
            CONSUMER_REGS,
            needs_int64(out, p) if idx64 is None else idx64,
            has_prior,
            mode,
            self._plane_vector(out, shape_args[7:11], cfg.block_m) if mode else 0,
            column_offsets(self.spec).index(0) if mode == 2 else 0,
            *flags.values(),
        )
        args = [x_desc, w_desc, out, p, *values, *shape_args, *consts]
        return self._grid(), cfg, args

    def pointer_slots(self, args: list) -> tuple[int | tuple[int, ...], ...]:
        """The input's descriptor, the output, the prior."""
        return (0, 2, 3)


class GluonRowsSolver(Solver):
    name = "gluon-rows"
    family = "triton"

    def why_not(self, spec: PlanSpec, handle) -> str | None:
        return conv_plan_why_not(spec) or gluon_rows_why_not(spec) or gluon_why_not() or hopper_why_not(handle)

    def defer_why(self, spec: PlanSpec, handle) -> str | None:
        return gluon_rows_defer_why(spec)

    def build(self, spec: PlanSpec, handle) -> Kernel:
        return GluonRowsKernel(spec, handle)
