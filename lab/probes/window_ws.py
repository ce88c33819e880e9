"""Prototype for measurement (lab/probes/probe.py): the window kernel (stride 1, NHWC, 16-bit, output
padded "same") with a loading warp and computing warpgroups, in Gluon (Triton 3.6's explicit dialect).

The loading partition (one warp) runs ahead through a ring of NUM_STAGES input boxes and weight tiles,
each with a "ready" barrier (its bytes landed) and an "empty" one (its product finished); the default
partition (NUM_WARPS warps: one or two warpgroups over 128 output channels) waits for each stage,
issues its wgmma with one product in flight and frees the stage before. The epilogue (per-channel
scale and shift, ReLU) runs in the default partition. Compiles for sm_90 with Triton 3.6 (SASS: 4-8
HGMMA, waits for one outstanding group, register reallocation between partitions)."""

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
def _loader(
    x_desc,
    w_desc,
    x_bufs,
    w_bufs,
    ready,
    empty,
    n0,
    oh0,
    ow0,
    k0,
    C,
    S,
    pad_h,
    pad_w,
    steps,
    num_cb,
    BLOCK_K: gl.constexpr,
    NUM_STAGES: gl.constexpr,
):
    for kb in range(steps):
        stage = kb % NUM_STAGES
        phase = (kb // NUM_STAGES) & 1
        mbarrier.wait(empty.index(stage), phase ^ 1)  # the first round finds every buffer free
        mbarrier.expect(ready.index(stage), x_desc.block_type.nbytes + w_desc.block_type.nbytes)
        t = kb // num_cb
        c0 = (kb % num_cb) * BLOCK_K
        tma.async_copy_global_to_shared(
            x_desc, [n0, oh0 + t // S - pad_h, ow0 + t % S - pad_w, c0], ready.index(stage), x_bufs.index(stage)
        )
        tma.async_copy_global_to_shared(w_desc, [k0, t * C + c0], ready.index(stage), w_bufs.index(stage))


@gluon.jit
def _computer(
    x_bufs,
    w_bufs,
    ready,
    empty,
    steps,
    BLOCK_N: gl.constexpr,
    PIXELS: gl.constexpr,
    BLOCK_K: gl.constexpr,
    NUM_STAGES: gl.constexpr,
    NUM_WARPS: gl.constexpr,
):
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[NUM_WARPS, 1], instr_shape=[16, PIXELS, 16]
    )
    flat: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
    acc = gl.zeros((BLOCK_N, PIXELS), gl.float32, acc_layout)
    for kb in range(steps):
        stage = kb % NUM_STAGES
        mbarrier.wait(ready.index(stage), (kb // NUM_STAGES) & 1)
        box = x_bufs.index(stage)._reinterpret(gl.float16, [PIXELS, BLOCK_K], flat)
        acc = warpgroup_mma(w_bufs.index(stage), box.permute((1, 0)), acc, is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=1, deps=[acc])
        # the product of the step before has finished: its buffers may be refilled
        mbarrier.arrive(empty.index((kb + NUM_STAGES - 1) % NUM_STAGES), pred=kb > 0)
    acc = warpgroup_mma_wait(num_outstanding=0, deps=[acc])
    return (acc,)


@gluon.jit
def window_ws_kernel(
    x_desc,
    w_desc,
    y_ptr,
    scale_ptr,
    shift_ptr,
    N,
    C,
    K,
    H,
    W,
    pad_h,
    pad_w,
    R: gl.constexpr,
    S: gl.constexpr,
    TILE_N: gl.constexpr,
    TILE_H: gl.constexpr,
    TILE_W: gl.constexpr,
    BLOCK_N: gl.constexpr,
    BLOCK_K: gl.constexpr,
    NUM_STAGES: gl.constexpr,
    NUM_WARPS: gl.constexpr,
):
    PIXELS: gl.constexpr = TILE_N * TILE_H * TILE_W
    pid = gl.program_id(0)
    pid_n = gl.program_id(1)
    tiles_w = gl.cdiv(W, TILE_W)
    tiles_h = gl.cdiv(H, TILE_H)
    ow0 = (pid % tiles_w) * TILE_W
    oh0 = ((pid // tiles_w) % tiles_h) * TILE_H
    n0 = (pid // (tiles_w * tiles_h)) * TILE_N
    k0 = pid_n * BLOCK_N

    x_bufs = gl.allocate_shared_memory(gl.float16, [NUM_STAGES, TILE_N, TILE_H, TILE_W, BLOCK_K], x_desc.layout)
    w_bufs = gl.allocate_shared_memory(gl.float16, [NUM_STAGES, BLOCK_N, BLOCK_K], w_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(NUM_STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=1)
    fence_async_shared()

    num_cb = gl.cdiv(C, BLOCK_K)
    steps = R * S * num_cb
    (acc,) = gl.warp_specialize(
        [
            (_computer, (x_bufs, w_bufs, ready, empty, steps, BLOCK_N, PIXELS, BLOCK_K, NUM_STAGES, NUM_WARPS)),
            (
                _loader,
                (
                    x_desc,
                    w_desc,
                    x_bufs,
                    w_bufs,
                    ready,
                    empty,
                    n0,
                    oh0,
                    ow0,
                    k0,
                    C,
                    S,
                    pad_h,
                    pad_w,
                    steps,
                    num_cb,
                    BLOCK_K,
                    NUM_STAGES,
                ),
            ),
        ],
        [1],
        [40],
    )
    for i in gl.static_range(NUM_STAGES):  # after their last use (PTX, before the memory serves anything else)
        mbarrier.invalidate(ready.index(i))
        mbarrier.invalidate(empty.index(i))

    # epilogue: per-channel scale and shift, ReLU, NHWC store ([channels, pixels] tile)
    out_layout: gl.constexpr = gl.BlockedLayout([8, 1], [16, 2], [1, NUM_WARPS], [0, 1])
    h = gl.convert_layout(acc, out_layout)
    ch = k0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, out_layout))
    px = gl.arange(0, PIXELS, layout=gl.SliceLayout(0, out_layout))
    n_img = n0 + px // (TILE_H * TILE_W)
    oh = oh0 + (px // TILE_W) % TILE_H
    ow = ow0 + px % TILE_W
    ch_ok = ch < K
    scale = gl.load(scale_ptr + ch, mask=ch_ok, other=0.0)
    shift = gl.load(shift_ptr + ch, mask=ch_ok, other=0.0)
    h = gl.maximum(h * scale[:, None] + shift[:, None], 0.0)
    offs = ((n_img * H + oh) * W + ow)[None, :] * K + ch[:, None]
    mask = ch_ok[:, None] & ((n_img < N) & (oh < H) & (ow < W))[None, :]
    gl.store(y_ptr + offs, h.to(gl.float16), mask=mask)


@gluon.jit
def window_ws_device_desc_kernel(
    x_ptr,
    w_ptr,
    y_ptr,
    scale_ptr,
    shift_ptr,
    N,
    C,
    K,
    H,
    W,
    pad_h,
    pad_w,
    R: gl.constexpr,
    S: gl.constexpr,
    TILE_N: gl.constexpr,
    TILE_H: gl.constexpr,
    TILE_W: gl.constexpr,
    BLOCK_N: gl.constexpr,
    BLOCK_K: gl.constexpr,
    NUM_STAGES: gl.constexpr,
    NUM_WARPS: gl.constexpr,
):
    """window_ws_kernel with its tensor descriptors built on the device (as fusionplan's kernels
    build theirs), to measure what that costs."""
    x_desc = tma.make_tensor_descriptor(
        x_ptr,
        shape=[N, H, W, C],
        strides=[H * W * C, W * C, C, 1],
        block_shape=[TILE_N, TILE_H, TILE_W, BLOCK_K],
        layout=gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=4),
    )
    w_desc = tma.make_tensor_descriptor(
        w_ptr,
        shape=[K, R * S * C],
        strides=[R * S * C, 1],
        block_shape=[BLOCK_N, BLOCK_K],
        layout=gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2),
    )
    window_ws_kernel(
        x_desc,
        w_desc,
        y_ptr,
        scale_ptr,
        shift_ptr,
        N,
        C,
        K,
        H,
        W,
        pad_h,
        pad_w,
        R,
        S,
        TILE_N,
        TILE_H,
        TILE_W,
        BLOCK_N,
        BLOCK_K,
        NUM_STAGES,
        NUM_WARPS,
    )
