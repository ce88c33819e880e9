"""Probe: a 3x3 convolution (stride 1, padding 1) on NCHW input whose nine taps read ONE halo in
shared memory, each tap a view of it shifted by whole pixel rows.

A program owns one image's band of TILE_H output rows and BLOCK_N output channels. For each step of
BLOCK_K input channels it gathers the band's halo once ([HALO rows, BLOCK_K channels]: halo row
r = (band row r // P) * P + r % P with a pitch of P >= W + 1 columns, column 0 and columns past W
zero, so the right padding of one row is the left padding of the next) into registers and stores
it to a 128-byte-swizzled buffer; output pixel (i, j) is row i * P + j of the product, and tap
(dh, dw) reads the halo from row dh * P + dw on. Gluon 3.6 refuses a view whose offset is not a
multiple of its size ("the split offset may not touch the tile"); the view here is taken as
``buf.reinterpret([HALO, 1, BLOCK_K]).index(shift).reinterpret([PIXELS, BLOCK_K])``, and wgmma's
descriptor then starts ``shift`` 128-byte rows in. The H100 applies the 128-byte swizzle by
address bits, so any row offset reads the rows as stored (checked by ``--shift-check``: 64- and
32-byte swizzles do not work this way). The weights come by TMA through a ring.

    python lab/probes/halo_probe.py --shift-check
    python lab/probes/halo_probe.py --layers r50_22,r50_16 [--dtype fp16]
"""

from __future__ import annotations

import argparse
import math

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

#: Depths of the weights' ring timed.
STAGES = (4, 6)

TMA_LOAD = tma.async_load if hasattr(tma, "async_load") else tma.async_copy_global_to_shared


@gluon.jit
def _shifted(buf, shift, ROWS: gl.constexpr, PIXELS: gl.constexpr, BLOCK_K: gl.constexpr, layout: gl.constexpr):
    # rows shift .. shift + PIXELS of a [ROWS, BLOCK_K] buffer as a [PIXELS, BLOCK_K] view
    one_row = buf._reinterpret(buf.dtype, [ROWS, 1, BLOCK_K], layout).index(shift)
    return one_row._reinterpret(buf.dtype, [PIXELS, BLOCK_K], layout)


@gluon.jit
def shift_check_kernel(x_ptr, w_ptr, out_ptr, SHIFT: gl.constexpr, SWZ: gl.constexpr):
    ld: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    r = gl.arange(0, 128, layout=gl.SliceLayout(1, ld))
    c = gl.arange(0, 64, layout=gl.SliceLayout(0, ld))
    lay: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=SWZ, element_bitwidth=16, rank=2)
    buf = gl.allocate_shared_memory(gl.float16, [128, 64], lay, gl.load(x_ptr + r[:, None] * 64 + c[None, :]))
    wl: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
    wr = gl.arange(0, 64, layout=gl.SliceLayout(1, ld))
    wc = gl.arange(0, 128, layout=gl.SliceLayout(0, ld))
    wbuf = gl.allocate_shared_memory(gl.float16, [64, 128], wl, gl.load(w_ptr + wr[:, None] * 128 + wc[None, :]))
    fence_async_shared()
    acc_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 128, 16])
    acc = warpgroup_mma(_shifted(buf, SHIFT, 128, 64, 64, lay), wbuf, gl.zeros([64, 128], gl.float32, acc_l))
    acc = warpgroup_mma_wait(0, deps=[acc])
    orow = gl.arange(0, 64, layout=gl.SliceLayout(1, acc_l))
    ocol = gl.arange(0, 128, layout=gl.SliceLayout(0, acc_l))
    gl.store(out_ptr + orow[:, None] * 128 + ocol[None, :], acc)


@gluon.jit
def _tile_origin(H: gl.constexpr, TILE_H: gl.constexpr, BLOCK_N: gl.constexpr):
    # the program's image, first output row and first output channel
    bands: gl.constexpr = (H + TILE_H - 1) // TILE_H
    pid = gl.program_id(0)
    return pid // bands, (pid % bands) * TILE_H, gl.program_id(1) * BLOCK_N


@gluon.jit
def _halo_rows(oh0, H: gl.constexpr, W: gl.constexpr, P: gl.constexpr, HALO: gl.constexpr, BLOCK_K: gl.constexpr):
    # a thread gathers one halo row's BLOCK_K channels (8 at a time: 16-byte shared stores); a
    # warp's load is 32 neighbouring halo rows of one channel: each row's offset in a plane, whether
    # it lies in the image, and the channels
    gather_l: gl.constexpr = gl.BlockedLayout([1, 8], [32, 1], [gl.num_warps(), 1], [1, 0])
    rows = gl.arange(0, HALO, layout=gl.SliceLayout(1, gather_l))
    ih = oh0 + rows // P - 1
    iw = rows % P - 1
    rows_ok = (ih >= 0) & (ih < H) & (iw >= 0) & (iw < W)
    return gl.where(rows_ok, ih * W + iw, 0), rows_ok, gl.arange(0, BLOCK_K, layout=gl.SliceLayout(0, gather_l))


@gluon.jit
def _bias_relu_store(
    acc,
    b_ptr,
    y_ptr,
    n,
    oh0,
    k0,
    K,
    H: gl.constexpr,
    W: gl.constexpr,
    P: gl.constexpr,
    TILE_H: gl.constexpr,
    PIXELS: gl.constexpr,
    BLOCK_N: gl.constexpr,
):
    # the [channels, slots] tile + bias, ReLU, into the NCHW output (slot i * P + j: pixel (oh0 + i, j))
    acc_l: gl.constexpr = acc.type.layout
    ch = k0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, acc_l))
    slot = gl.arange(0, PIXELS, layout=gl.SliceLayout(0, acc_l))
    oh = oh0 + slot // P
    ow = slot % P
    valid = (slot // P < TILE_H) & (oh < H) & (ow < W)
    h = gl.maximum(acc + gl.load(b_ptr + ch)[:, None], 0.0)
    y_img = y_ptr + n.to(gl.int64) * K * (H * W)
    mask = valid[None, :] & (ch < K)[:, None]
    gl.store(y_img + ch[:, None] * (H * W) + (oh * W + ow)[None, :], h.to(y_ptr.dtype.element_ty), mask=mask)


@gluon.jit
def _gather_halo(x_img, rows_off, rows_ok, chans, c0, HW: gl.constexpr):
    # the halo's [HALO, BLOCK_K] elements of channels c0.. (zero where the row is padding)
    # (the block's first plane as one scalar: each thread's channels are constant offsets from it)
    return gl.load((x_img + c0 * HW) + rows_off[:, None] + chans[None, :] * HW, mask=rows_ok[:, None], other=0.0)


@gluon.jit
def _request_weights(w_desc, w_bufs, ready, s, k0, C, W_STAGES: gl.constexpr, BLOCK_K: gl.constexpr):
    # step s = channel block * 9 + tap: the tap's columns of the packed [K, 9 * C] weights
    stage = s % W_STAGES
    mbarrier.expect(ready.index(stage), w_desc.block_type.nbytes)
    TMA_LOAD(w_desc, [k0, (s % 9) * C + (s // 9) * BLOCK_K], ready.index(stage), w_bufs.index(stage))


@gluon.jit
def halo_conv_kernel(
    x_ptr,
    w_desc,
    b_ptr,
    y_ptr,
    C,
    K,
    H: gl.constexpr,
    W: gl.constexpr,
    P: gl.constexpr,
    TILE_H: gl.constexpr,
    HALO: gl.constexpr,
    PIXELS: gl.constexpr,
    BLOCK_N: gl.constexpr,
    BLOCK_K: gl.constexpr,
    W_STAGES: gl.constexpr,
):
    HW: gl.constexpr = H * W
    n, oh0, k0 = _tile_origin(H, TILE_H, BLOCK_N)
    dtype: gl.constexpr = w_desc.dtype

    halo_l: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
    halos = gl.allocate_shared_memory(dtype, [2, HALO, BLOCK_K], halo_l)
    w_bufs = gl.allocate_shared_memory(dtype, [W_STAGES, BLOCK_N, BLOCK_K], w_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [W_STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(W_STAGES):
        mbarrier.init(ready.index(i), count=1)
    fence_async_shared()

    num_cb = C // BLOCK_K
    steps = num_cb * 9
    for i in gl.static_range(W_STAGES - 1):
        _request_weights(w_desc, w_bufs, ready, i, k0, C, W_STAGES, BLOCK_K)

    rows_off, rows_ok, chans = _halo_rows(oh0, H, W, P, HALO, BLOCK_K)
    x_img = x_ptr + n.to(gl.int64) * C * HW

    halos.index(0).store(_gather_halo(x_img, rows_off, rows_ok, chans, 0, HW))
    fence_async_shared()
    gl.thread_barrier()

    acc_l: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[gl.num_warps(), 1], instr_shape=[16, PIXELS, 16]
    )
    acc = gl.zeros((BLOCK_N, PIXELS), gl.float32, acc_l)
    for cb in range(num_cb):
        buf = cb % 2
        # the next block's halo, loaded under this block's products
        nxt = _gather_halo(x_img, rows_off, rows_ok & (cb + 1 < num_cb), chans, (cb + 1) * BLOCK_K, HW)
        for t in gl.static_range(9):
            s = cb * 9 + t
            mbarrier.wait(ready.index(s % W_STAGES), (s // W_STAGES) & 1)
            view = _shifted(halos.index(buf), (t // 3) * P + t % 3, HALO, PIXELS, BLOCK_K, halo_l)
            acc = warpgroup_mma(w_bufs.index(s % W_STAGES), view.permute((1, 0)), acc, is_async=True)
            acc = warpgroup_mma_wait(num_outstanding=1, deps=[acc])
            # step s - 1's product has finished: its stage takes step s + W_STAGES - 1's weights
            if s + W_STAGES - 1 < steps:
                _request_weights(w_desc, w_bufs, ready, s + W_STAGES - 1, k0, C, W_STAGES, BLOCK_K)
        # every product of the block before has finished: its halo buffer takes the next block's
        halos.index(1 - buf).store(nxt)
        fence_async_shared()
        gl.thread_barrier()
    acc = warpgroup_mma_wait(num_outstanding=0, deps=[acc])
    for i in gl.static_range(W_STAGES):
        mbarrier.invalidate(ready.index(i))

    _bias_relu_store(acc, b_ptr, y_ptr, n, oh0, k0, K, H, W, P, TILE_H, PIXELS, BLOCK_N)


@gluon.jit
def _ws_weights_partition(w_desc, w_bufs, ready, empty, k0, C, steps, W_STAGES: gl.constexpr, BLOCK_K: gl.constexpr):
    # one warp: each step's weights tile into the ring once the product before has freed its stage
    for s in range(steps):
        stage = s % W_STAGES
        mbarrier.wait(empty.index(stage), ((s // W_STAGES) & 1) ^ 1)
        mbarrier.expect(ready.index(stage), w_desc.block_type.nbytes)
        TMA_LOAD(w_desc, [k0, (s % 9) * C + (s // 9) * BLOCK_K], ready.index(stage), w_bufs.index(stage))


@gluon.jit
def _ws_mma_partition(
    x_img,
    halos,
    w_bufs,
    ready,
    empty,
    oh0,
    num_cb,
    H: gl.constexpr,
    W: gl.constexpr,
    P: gl.constexpr,
    HALO: gl.constexpr,
    PIXELS: gl.constexpr,
    BLOCK_N: gl.constexpr,
    BLOCK_K: gl.constexpr,
    W_STAGES: gl.constexpr,
):
    # the computing warps gather each block's halo themselves, under the block before's products
    HW: gl.constexpr = H * W
    halo_l: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
    rows_off, rows_ok, chans = _halo_rows(oh0, H, W, P, HALO, BLOCK_K)
    halos.index(0).store(_gather_halo(x_img, rows_off, rows_ok, chans, 0, HW))
    fence_async_shared()
    gl.thread_barrier()
    acc_l: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[gl.num_warps(), 1], instr_shape=[16, PIXELS, 16]
    )
    acc = gl.zeros((BLOCK_N, PIXELS), gl.float32, acc_l)
    for cb in range(num_cb):
        buf = cb % 2
        nxt = _gather_halo(x_img, rows_off, rows_ok & (cb + 1 < num_cb), chans, (cb + 1) * BLOCK_K, HW)
        for t in gl.static_range(9):
            s = cb * 9 + t
            mbarrier.wait(ready.index(s % W_STAGES), (s // W_STAGES) & 1)
            view = _shifted(halos.index(buf), (t // 3) * P + t % 3, HALO, PIXELS, BLOCK_K, halo_l)
            acc = warpgroup_mma(w_bufs.index(s % W_STAGES), view.permute((1, 0)), acc, is_async=True)
            acc = warpgroup_mma_wait(num_outstanding=1, deps=[acc])
            mbarrier.arrive(empty.index((s + W_STAGES - 1) % W_STAGES), pred=s > 0)
        halos.index(1 - buf).store(nxt)
        fence_async_shared()
        gl.thread_barrier()
    acc = warpgroup_mma_wait(num_outstanding=0, deps=[acc])
    return (acc,)


@gluon.jit
def halo_ws_kernel(
    x_ptr,
    w_desc,
    b_ptr,
    y_ptr,
    C,
    K,
    H: gl.constexpr,
    W: gl.constexpr,
    P: gl.constexpr,
    TILE_H: gl.constexpr,
    HALO: gl.constexpr,
    PIXELS: gl.constexpr,
    BLOCK_N: gl.constexpr,
    BLOCK_K: gl.constexpr,
    W_STAGES: gl.constexpr,
):
    HW: gl.constexpr = H * W
    n, oh0, k0 = _tile_origin(H, TILE_H, BLOCK_N)
    dtype: gl.constexpr = w_desc.dtype
    halo_l: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
    halos = gl.allocate_shared_memory(dtype, [2, HALO, BLOCK_K], halo_l)
    w_bufs = gl.allocate_shared_memory(dtype, [W_STAGES, BLOCK_N, BLOCK_K], w_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [W_STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [W_STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(W_STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=1)
    fence_async_shared()
    num_cb = C // BLOCK_K
    x_img = x_ptr + n.to(gl.int64) * C * HW
    (acc,) = gl.warp_specialize(
        [
            (
                _ws_mma_partition,
                (x_img, halos, w_bufs, ready, empty, oh0, num_cb, H, W, P, HALO, PIXELS, BLOCK_N, BLOCK_K, W_STAGES),
            ),
            (_ws_weights_partition, (w_desc, w_bufs, ready, empty, k0, C, num_cb * 9, W_STAGES, BLOCK_K)),
        ],
        [1],
        [40],
    )
    for i in gl.static_range(W_STAGES):
        mbarrier.invalidate(ready.index(i))
        mbarrier.invalidate(empty.index(i))
    _bias_relu_store(acc, b_ptr, y_ptr, n, oh0, k0, K, H, W, P, TILE_H, PIXELS, BLOCK_N)


@gluon.jit
def _g_gather_partition(
    x_img,
    halos,
    halo_ready,
    halo_empty,
    oh0,
    num_cb,
    H: gl.constexpr,
    W: gl.constexpr,
    P: gl.constexpr,
    HALO: gl.constexpr,
    BLOCK_K: gl.constexpr,
):
    # gathering warps of their own: their loads' scoreboard never holds up the products
    HW: gl.constexpr = H * W
    rows_off, rows_ok, chans = _halo_rows(oh0, H, W, P, HALO, BLOCK_K)
    for cb in range(num_cb):
        buf = cb % 2
        vals = _gather_halo(x_img, rows_off, rows_ok, chans, cb * BLOCK_K, HW)
        mbarrier.wait(halo_empty.index(buf), ((cb // 2) & 1) ^ 1)
        halos.index(buf).store(vals)
        fence_async_shared()
        mbarrier.arrive(halo_ready.index(buf))


@gluon.jit
def _g_mma_partition(
    halos,
    w_bufs,
    ready,
    empty,
    halo_ready,
    halo_empty,
    num_cb,
    P: gl.constexpr,
    HALO: gl.constexpr,
    PIXELS: gl.constexpr,
    BLOCK_N: gl.constexpr,
    BLOCK_K: gl.constexpr,
    W_STAGES: gl.constexpr,
):
    halo_l: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
    acc_l: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[gl.num_warps(), 1], instr_shape=[16, PIXELS, 16]
    )
    acc = gl.zeros((BLOCK_N, PIXELS), gl.float32, acc_l)
    for cb in range(num_cb):
        buf = cb % 2
        mbarrier.wait(halo_ready.index(buf), (cb // 2) & 1)
        for t in gl.static_range(9):
            s = cb * 9 + t
            mbarrier.wait(ready.index(s % W_STAGES), (s // W_STAGES) & 1)
            view = _shifted(halos.index(buf), (t // 3) * P + t % 3, HALO, PIXELS, BLOCK_K, halo_l)
            acc = warpgroup_mma(w_bufs.index(s % W_STAGES), view.permute((1, 0)), acc, is_async=True)
            acc = warpgroup_mma_wait(num_outstanding=1, deps=[acc])
            mbarrier.arrive(empty.index((s + W_STAGES - 1) % W_STAGES), pred=s > 0)
            if t == 0:  # every product of the block before has finished: its halo may be refilled
                mbarrier.arrive(halo_empty.index(1 - buf), pred=cb > 0)
    acc = warpgroup_mma_wait(num_outstanding=0, deps=[acc])
    return (acc,)


@gluon.jit
def halo_g_kernel(
    x_ptr,
    w_desc,
    b_ptr,
    y_ptr,
    C,
    K,
    H: gl.constexpr,
    W: gl.constexpr,
    P: gl.constexpr,
    TILE_H: gl.constexpr,
    HALO: gl.constexpr,
    PIXELS: gl.constexpr,
    BLOCK_N: gl.constexpr,
    BLOCK_K: gl.constexpr,
    W_STAGES: gl.constexpr,
    GATHER_WARPS: gl.constexpr,
    GATHER_REGS: gl.constexpr,
):
    HW: gl.constexpr = H * W
    n, oh0, k0 = _tile_origin(H, TILE_H, BLOCK_N)
    dtype: gl.constexpr = w_desc.dtype
    halo_l: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
    halos = gl.allocate_shared_memory(dtype, [2, HALO, BLOCK_K], halo_l)
    w_bufs = gl.allocate_shared_memory(dtype, [W_STAGES, BLOCK_N, BLOCK_K], w_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [W_STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [W_STAGES, 1], mbarrier.MBarrierLayout())
    halo_ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    halo_empty = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(W_STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=1)
    for i in gl.static_range(2):
        mbarrier.init(halo_ready.index(i), count=1)
        mbarrier.init(halo_empty.index(i), count=1)
    fence_async_shared()
    num_cb = C // BLOCK_K
    x_img = x_ptr + n.to(gl.int64) * C * HW
    (acc,) = gl.warp_specialize(
        [
            (
                _g_mma_partition,
                (
                    halos,
                    w_bufs,
                    ready,
                    empty,
                    halo_ready,
                    halo_empty,
                    num_cb,
                    P,
                    HALO,
                    PIXELS,
                    BLOCK_N,
                    BLOCK_K,
                    W_STAGES,
                ),
            ),
            (_ws_weights_partition, (w_desc, w_bufs, ready, empty, k0, C, num_cb * 9, W_STAGES, BLOCK_K)),
            (_g_gather_partition, (x_img, halos, halo_ready, halo_empty, oh0, num_cb, H, W, P, HALO, BLOCK_K)),
        ],
        [1, GATHER_WARPS],
        [40, GATHER_REGS],
    )
    for i in gl.static_range(W_STAGES):
        mbarrier.invalidate(ready.index(i))
        mbarrier.invalidate(empty.index(i))
    for i in gl.static_range(2):
        mbarrier.invalidate(halo_ready.index(i))
        mbarrier.invalidate(halo_empty.index(i))
    _bias_relu_store(acc, b_ptr, y_ptr, n, oh0, k0, K, H, W, P, TILE_H, PIXELS, BLOCK_N)


def shift_check() -> None:
    torch.manual_seed(0)
    x = torch.randn(128, 64, device="cuda", dtype=torch.float16)
    w = torch.randn(64, 128, device="cuda", dtype=torch.float16)
    for swz in (128, 64, 32):
        res = []
        for shift in list(range(17)) + [20, 33, 63]:
            out = torch.full((64, 128), float("nan"), device="cuda")
            shift_check_kernel[(1,)](x, w, out, SHIFT=shift, SWZ=swz, num_warps=4)
            ref = x[shift : shift + 64].float() @ w.float()
            err = ((out - ref).norm() / ref.norm()).item()
            res.append(f"{shift}:{'ok' if err < 1e-3 else f'BAD {err:.2f}'}")
        print("swizzle", swz, " ".join(res), flush=True)


def halo_config(h: int, w: int) -> dict:
    """Pitch, band rows, halo rows and pixels of a plane of h x w (3x3, padding 1)."""
    p = 1 << math.ceil(math.log2(w + 1))
    pixels = 64 if h * p <= 64 else 128
    tile_h = min(h, pixels // p)
    halo = 1 << math.ceil(math.log2(2 * p + 2 + pixels))
    return {"P": p, "TILE_H": tile_h, "HALO": halo, "PIXELS": pixels}


def run_halo(x, w_packed_desc, bias, y, c, k, h, w, cfg, block_n=128, stages=4, ws=True):
    bands = -(-h // cfg["TILE_H"])
    grid = (x.shape[0] * bands, k // block_n)
    if ws == "gather":  # a gathering partition of its own
        gather_warps = cfg["HALO"] // 32
        halo_g_kernel[grid](
            x,
            w_packed_desc,
            bias,
            y,
            c,
            k,
            H=h,
            W=w,
            **cfg,
            BLOCK_N=block_n,
            BLOCK_K=64,
            W_STAGES=stages,
            GATHER_WARPS=gather_warps,
            GATHER_REGS=152,
            num_warps=4 if cfg["PIXELS"] == 64 else 8,
        )
        return
    (halo_ws_kernel if ws else halo_conv_kernel)[grid](
        x,
        w_packed_desc,
        bias,
        y,
        c,
        k,
        H=h,
        W=w,
        **cfg,
        BLOCK_N=block_n,
        BLOCK_K=64,
        W_STAGES=stages,
        num_warps=4 if cfg["PIXELS"] == 64 else 8,
    )


def layer(name: str, dtype: torch.dtype, iters: int, profile: bool = False) -> None:
    import fusionplan as fp
    from fusionplan.tools.bench.timing import median_ms
    from fusionplan.tools.shapes import resnet50_layer
    from fusionplan.tools.verify import layer_plan, random_args

    s = resnet50_layer(name)
    assert (s.r, s.s, s.stride, s.pad) == (3, 3, 1, 1), name
    batch = 32
    sets = 8
    xs = [torch.randn(batch, s.c, s.h, s.w, device="cuda").to(dtype) for _ in range(sets)]
    wt = (torch.randn(s.k, s.c, 3, 3, device="cuda") / (3 * s.c**0.5)).to(dtype)
    bias = torch.randn(s.k, device="cuda")
    packed = wt.permute(0, 2, 3, 1).reshape(s.k, 9 * s.c).contiguous()
    layout = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
    desc = TensorDescriptor(packed, list(packed.shape), list(packed.stride()), [128, 64], layout)
    cfg = halo_config(s.h, s.w)
    ys = [torch.full((batch, s.k, s.h, s.w), float("nan"), device="cuda", dtype=dtype) for _ in range(sets)]
    run_halo(xs[0], desc, bias, ys[0], s.c, s.k, s.h, s.w, cfg)
    torch.cuda.synchronize()
    ref = torch.relu(torch.nn.functional.conv2d(xs[0].double(), wt.double(), bias.double(), padding=1))
    err = ((ys[0].double() - ref).norm() / ref.norm()).item()
    nan = ys[0].isnan().sum().item()
    if profile:  # one launch of each: the halo kernels', the NHWC plan's
        for ws in (False, True):
            run_halo(xs[1], desc, bias, ys[1], s.c, s.k, s.h, s.w, cfg, ws=ws)
        xx = xs[1].to(memory_format=torch.channels_last)
        plan = layer_plan(s, xx, "CBA")
        handle = fp.Handle("cuda")
        plan.compile(handle)
        args = random_args(plan, "cuda", param_dtype=torch.float32, gen=torch.Generator().manual_seed(0))
        plan.execute(handle, xx, torch.empty_like(xx), args)
        torch.cuda.synchronize()
        return
    t_halo = {}
    for ws in (False, True, "gather"):
        for stages in STAGES:
            ys[0].fill_(float("nan"))
            run_halo(xs[0], desc, bias, ys[0], s.c, s.k, s.h, s.w, cfg, ws=ws, stages=stages)
            torch.cuda.synchronize()
            err = max(err, ((ys[0].double() - ref).norm() / ref.norm()).item())
            nan += ys[0].isnan().sum().item()
            t_halo[ws, stages] = (
                median_ms(
                    lambda i, ws=ws, stages=stages: run_halo(
                        xs[i % sets], desc, bias, ys[i % sets], s.c, s.k, s.h, s.w, cfg, ws=ws, stages=stages
                    ),
                    torch.device("cuda"),
                    iters=iters,
                    graph=True,
                )
                * 1e3
            )
    best = min(t_halo.values())

    times = {}
    for label, fmt in (("nchw", torch.contiguous_format), ("nhwc", torch.channels_last)):
        xx = [x.to(memory_format=fmt) for x in xs]
        yy = [torch.empty(batch, s.k, s.h, s.w, device="cuda", dtype=dtype, memory_format=fmt) for _ in range(sets)]
        plan = layer_plan(s, xx[0], "CBA")
        handle = fp.Handle("cuda")
        plan.compile(handle)
        args = random_args(plan, "cuda", param_dtype=torch.float32, gen=torch.Generator().manual_seed(0))
        times[label] = (
            median_ms(
                lambda i, plan=plan, handle=handle, xx=xx, yy=yy, args=args: plan.execute(
                    handle, xx[i % sets], yy[i % sets], args
                ),
                torch.device("cuda"),
                iters=iters,
                graph=True,
            )
            * 1e3
        )
        times[label + " solver"] = plan.compiled_solver(handle)
    halo = " ".join(
        f"{ {False: 'one', True: 'ws', 'gather': 'gather'}[ws] }/{st} {t:.1f}" for (ws, st), t in t_halo.items()
    )
    print(
        f"{name} {cfg} err {err:.1e} nan {nan} | halo (partitions/weight stages) {halo} us | nchw "
        f"{times['nchw']:.1f} ({times['nchw solver']}) | nhwc {times['nhwc']:.1f} ({times['nhwc solver']}) | "
        f"best halo/nhwc {best / times['nhwc']:.2f} nchw/nhwc {times['nchw'] / times['nhwc']:.2f}",
        flush=True,
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shift-check", action="store_true")
    p.add_argument("--layers", default="r50_22,r50_16,r50_10")
    p.add_argument("--dtype", default="fp16", choices=["fp16", "bf16"])
    p.add_argument("--iters", type=int, default=30)
    p.add_argument("--profile", action="store_true", help="one launch of each kernel, untimed (for a profiler)")
    a = p.parse_args()
    if a.shift_check:
        shift_check()
        return
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}[a.dtype]
    for name in a.layers.split(","):
        layer(name, dtype, a.iters, a.profile)


if __name__ == "__main__":
    main()
