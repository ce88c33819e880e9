"""Probe: a 1x1 convolution (+ bias, ReLU) on NCHW input of odd planes (7x7: 98 bytes) by 4-byte
asynchronous copies, the input channels split by parity, against cuDNN and fusionplan's own
kernels for the layer (CUDA only; `--sass` compiles for sm_90 without a GPU).

    python bench/gluon/odd_planes_gemm.py --layers r50_19,r50_21 [--consumers 1|2] [--stages 3,4]
    python bench/gluon/odd_planes_gemm.py --sass

A 7x7 plane is 49 16-bit pixels: no tensor box starts on it (16-byte units) and no copy of 4
bytes or more either, so r50_19 and r50_21 run on the gather kernels at 1.8-2.0x their NHWC time
(bench/NOTES.md sections 41-42). Yet every plane of an even channel starts on a 4-byte boundary
(C even: plane c of image n starts (n * C + c) * 49 elements in, even when c is), and every odd
channel's plane one element after one. So the pixel pairs (p, p + 1) of even channels, p even,
and (p - 1, p) of odd channels are 4-byte units, copied whole. A stage's operand [64 channels,
P slots] holds the step's 32 even channels in its first 32 rows and the 32 odd ones after; image
i of the program's IMAGES sits at slots S * i .. with S = HW + 1 (50): an even channel's pixel p
at slot S * i + p, an odd channel's at S * i + p + 1 (slot S * i holds its previous plane's last
pixel, an even channel's slot S * i + 49 the next plane's first: read, never stored). The weights
are packed to match (each 64-channel block's even channels, then its odd ones) and come by TMA as
two boxes [BLOCK_N, 32]. Each step is two products, into two accumulators: the even rows' and the
odd rows'; the epilogue adds the odd one shifted by a slot (a gather along the slots), the bias,
applies ReLU and stores each channel's 49 pixels by pointer (2 bytes a thread).

A program computes IMAGES (2) images' planes, P = 128 slots (100 used), for BLOCK_N output
channels: one computing warpgroup of 64 channels or two side by side (``--consumers``), beside
4 copying warps that also request the weights. Barriers per stage: ``ready`` (the weights' TMA),
``copied`` (every copying thread's arrival once its copies have landed), ``empty`` (the computing
warpgroups' products done).

Predicted before any run (H100, fp16, batch 32): r50_21 (C 2048, K 512: 32 steps a program) is
bound by L2 traffic, the input read once per channel tile and the weights once per image pair:
one consumer (128 programs) 51 + 32 MB, about 12-14 us; two (64 programs) 26 + 32 MB on half the
multiprocessors, about 11-13 us; against 18.6 on gluon-nchw and 9.2 on NHWC. r50_19 (C 512: 8
steps a program, 256 or 512 programs) pays its ring fill and epilogue per program: about 14 us
against 17.3.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))

from plane_groups import compile_summary  # noqa: E402
from plane_groups_gemm import fusionplan_times, graph_time_us, layer_tensors, summary_line  # noqa: E402

from fusionplan.codegen import load_module  # noqa: E402

BLOCK_K = 64  # input channels a step: 32 even, then 32 odd
HALF = BLOCK_K // 2
SLOTS = 128  # a program's slots (P)
COPY_WARPS = 4


@dataclass(frozen=True)
class Geometry:
    """An odd plane of ``hw`` pixels; ``images`` of them a program at a stride of hw + 1 slots."""

    hw: int
    images: int = 2

    @property
    def stride(self) -> int:
        return self.hw + 1

    def why_not(self, c: int = BLOCK_K, k: int = 64) -> str | None:
        if self.hw % 2 == 0:
            return f"planes of {self.hw} pixels start on 4-byte units: plain 4-byte copies read them"
        if self.images * self.stride > SLOTS:
            return f"{self.images} images of {self.stride} slots exceed {SLOTS}"
        if c % BLOCK_K or k % 64:
            return f"C = {c} and K = {k}: multiples of {BLOCK_K} and 64"
        return None


def pack_weights(w2d: torch.Tensor) -> torch.Tensor:
    """[K, C] with each 64-channel block's even channels first, then its odd ones (the operand's rows)."""
    k, c = w2d.shape
    blocks = w2d.reshape(k, c // BLOCK_K, HALF, 2)  # [K, block, pair, parity]
    return blocks.permute(0, 1, 3, 2).reshape(k, c).contiguous()


def operand_rows(c0: int) -> tuple[list[int], list[int]]:
    """A step's 64 operand rows: their input channels and each row's shift back in elements (the
    odd channels' copies start a pixel early)."""
    channels = [c0 + 2 * r for r in range(HALF)] + [c0 + 2 * r + 1 for r in range(HALF)]
    return channels, [c & 1 for c in channels]


def slot_pixels(geo: Geometry, n0: int, c: int, n: int) -> tuple[list[int], list[bool]]:
    """Each of a program's SLOTS slots: its element offset in its image's first plane (an even
    row's pixel; an odd row's copies start an element earlier, operand_rows) and whether it is
    copied at all (its image in the batch, the slot within the program's images); _copy_step's
    arithmetic."""
    offsets, live = [], []
    for slot in range(SLOTS):
        image = n0 + slot // geo.stride
        offsets.append(image * c * geo.hw + slot % geo.stride)
        live.append(slot < geo.images * geo.stride and image < n)
    return offsets, live


_SOURCE = """
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared, mbarrier, tma, warpgroup_mma, warpgroup_mma_wait,
)


@gluon.jit
def _copy_step(x_ptr, buf, n0, c0, N, C, HW: gl.constexpr, S: gl.constexpr, IMAGES: gl.constexpr,
               P: gl.constexpr):
    # [64 channels, P slots]: rows 0-31 the even channels c0, c0 + 2, .., rows 32-63 the odd ones;
    # slot S * i + j of image n0 + i holds pixel j (even rows) or j - 1 (odd rows), two slots a copy
    layout: gl.constexpr = gl.BlockedLayout([1, 2], [1, 32], [gl.num_warps(), 1], [1, 0])
    r = gl.arange(0, {block_k}, layout=gl.SliceLayout(1, layout))
    odd = r // {half}
    channel = c0 + 2 * (r % {half}) + odd
    rows = gl.multiple_of(channel.to(gl.int64) * HW - odd, 2)  # every row's first copy on 4 bytes
    slot = gl.arange(0, P, layout=gl.SliceLayout(0, layout))
    image = n0 + slot // S
    pixels = image.to(gl.int64) * C * HW + slot % S  # C even: an even slot is an even element
    pixels = gl.max_contiguous(gl.multiple_of(pixels, 2), 2)
    live = (slot < IMAGES * S) & (image < N)
    {async_copy}(buf, x_ptr + rows[:, None] + pixels[None, :], mask=live[None, :])


@gluon.jit
def _load(x_ptr, w_desc, x_bufs, w_bufs, ready, copied, empty, N, C,
          NUM_STAGES: gl.constexpr, HW: gl.constexpr, S: gl.constexpr, IMAGES: gl.constexpr, P: gl.constexpr,
          BLOCK_N: gl.constexpr):
    n0 = gl.program_id(0) * IMAGES
    k0 = gl.program_id(1) * BLOCK_N
    for i in range(C // {block_k}):
        s = i % NUM_STAGES
        mbarrier.wait(empty.index(s), ((i // NUM_STAGES) & 1) ^ 1)
        mbarrier.expect(ready.index(s), 2 * w_desc.block_type.nbytes)
        {tma_load}(w_desc, [k0, i * {block_k}], ready.index(s), w_bufs.index(2 * s))
        {tma_load}(w_desc, [k0, i * {block_k} + {half}], ready.index(s), w_bufs.index(2 * s + 1))
        _copy_step(x_ptr, x_bufs.index(s), n0, i * {block_k}, N, C, HW, S, IMAGES, P)
        async_copy.mbarrier_arrive(copied.index(s), increment_count=False)


@gluon.jit
def _compute(
    x_bufs, w_bufs, ready, copied, empty, y_ptr, bias_ptr, N, C, K,
    NUM_STAGES: gl.constexpr, CONSUMER: gl.constexpr, HW: gl.constexpr, S: gl.constexpr,
    IMAGES: gl.constexpr, P: gl.constexpr, BLOCK_N: gl.constexpr,
):
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, P, 16])
    acc_even = gl.zeros((64, P), gl.float32, mma)
    acc_odd = gl.zeros((64, P), gl.float32, mma)
    steps = C // {block_k}
    for i in range(steps):
        s = i % NUM_STAGES
        mbarrier.wait(ready.index(s), (i // NUM_STAGES) & 1)
        mbarrier.wait(copied.index(s), (i // NUM_STAGES) & 1)
        fence_async_shared()  # the copies' writes (generic proxy) before wgmma's reads
        x = x_bufs.index(s)
        w_even = w_bufs.index(2 * s).slice(CONSUMER * 64, 64)
        w_odd = w_bufs.index(2 * s + 1).slice(CONSUMER * 64, 64)
        acc_even = warpgroup_mma(w_even, x.slice(0, {half}), acc_even, is_async=True)
        acc_odd = warpgroup_mma(w_odd, x.slice({half}, {half}), acc_odd, is_async=True)
        # this step's products in flight, the step before's done: free its stage
        acc_even, acc_odd = warpgroup_mma_wait(num_outstanding=2, deps=[acc_even, acc_odd])
        mbarrier.arrive(empty.index((i + NUM_STAGES - 1) % NUM_STAGES), pred=i > 0)
    acc_even, acc_odd = warpgroup_mma_wait(num_outstanding=0, deps=[acc_even, acc_odd])
    mbarrier.arrive(empty.index((steps - 1) % NUM_STAGES))
    # pixel j of image i: the even rows' slot S * i + j plus the odd rows' slot S * i + j + 1
    out_layout: gl.constexpr = gl.BlockedLayout([1, 4], [4, 8], [4, 1], [1, 0])
    even = gl.convert_layout(acc_even, out_layout)
    odd = gl.convert_layout(acc_odd, out_layout)
    slot = gl.arange(0, P, layout=gl.SliceLayout(0, out_layout))
    ch = gl.arange(0, 64, layout=gl.SliceLayout(1, out_layout))
    after = gl.minimum(slot + 1, P - 1)
    h = even + gl.gather(odd, gl.zeros((64, P), gl.int32, out_layout) + after[None, :], 1)
    k0 = gl.program_id(1) * BLOCK_N + CONSUMER * 64
    h = gl.maximum(h + gl.load(bias_ptr + k0 + ch)[:, None], 0.0)
    image = gl.program_id(0) * IMAGES + slot // S
    pixel = slot % S
    plane = (image.to(gl.int64)[None, :] * K + (k0 + ch)[:, None]) * HW
    mask = ((pixel < HW) & (slot < IMAGES * S) & (image < N))[None, :]
    gl.store(y_ptr + plane + pixel[None, :], h.to(y_ptr.dtype.element_ty), mask=mask)


@gluon.jit
def odd_planes_gemm_kernel(
    w_desc, y_ptr, bias_ptr, C, K, x_ptr, N,
    NUM_STAGES: gl.constexpr, CONSUMERS: gl.constexpr, HW: gl.constexpr, S: gl.constexpr,
    IMAGES: gl.constexpr, P: gl.constexpr,
):
    BLOCK_N: gl.constexpr = 64 * CONSUMERS
    # [channels, slots], the slots contiguous: wgmma's B operand as gluon-gemm's plane boxes lay it out
    planes: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
    x_bufs = gl.allocate_shared_memory(gl.float16, [NUM_STAGES, {block_k}, P], planes)
    w_bufs = gl.allocate_shared_memory(w_desc.dtype, [2 * NUM_STAGES, BLOCK_N, {half}], w_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    copied = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(NUM_STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(copied.index(i), count={copy_warps} * 32)
        mbarrier.init(empty.index(i), count=CONSUMERS)
    fence_async_shared()
    if CONSUMERS == 2:
        gl.warp_specialize(
            [
                (_compute, (x_bufs, w_bufs, ready, copied, empty, y_ptr, bias_ptr, N, C, K, NUM_STAGES, 0,
                            HW, S, IMAGES, P, BLOCK_N)),
                (_compute, (x_bufs, w_bufs, ready, copied, empty, y_ptr, bias_ptr, N, C, K, NUM_STAGES, 1,
                            HW, S, IMAGES, P, BLOCK_N)),
                (_load, (x_ptr, w_desc, x_bufs, w_bufs, ready, copied, empty, N, C, NUM_STAGES, HW, S, IMAGES, P,
                         BLOCK_N)),
            ],
            [4, {copy_warps}],
            [224, 56],
        )
    else:
        gl.warp_specialize(
            [
                (_compute, (x_bufs, w_bufs, ready, copied, empty, y_ptr, bias_ptr, N, C, K, NUM_STAGES, 0,
                            HW, S, IMAGES, P, BLOCK_N)),
                (_load, (x_ptr, w_desc, x_bufs, w_bufs, ready, copied, empty, N, C, NUM_STAGES, HW, S, IMAGES, P,
                         BLOCK_N)),
            ],
            [{copy_warps}],
            [56],
        )
    for i in gl.static_range(NUM_STAGES):  # after their last use (PTX, before the memory serves anything else)
        mbarrier.invalidate(ready.index(i))
        mbarrier.invalidate(copied.index(i))
        mbarrier.invalidate(empty.index(i))
"""


def render() -> str:
    """The probe's kernel source."""
    from fusionplan.solvers.gluon_window import gluon_names

    return _SOURCE.format(block_k=BLOCK_K, half=HALF, copy_warps=COPY_WARPS, **gluon_names())


def build():
    return load_module(render(), "odd_planes_gemm")[0].odd_planes_gemm_kernel


def launch(kernel, geo: Geometry, x, packed, bias, y, consumers: int, stages: int) -> None:
    """y = relu(conv1x1(x, w) + bias): x [N, C, H, W] and y [N, K, H, W] NCHW fp16, ``packed`` the
    weights as pack_weights leaves them."""
    from fusionplan.solvers.gluon_window import gluon_descriptor

    n, c = x.shape[:2]
    k = packed.shape[0]
    block_n = 64 * consumers
    w_desc = gluon_descriptor(packed, [k, c], [c, 1], [block_n, HALF], 2 * HALF, 16)
    grid = (-(-n // geo.images), k // block_n)
    constants = (stages, consumers, geo.hw, geo.stride, geo.images, SLOTS)
    kernel[grid](w_desc, y, bias, c, k, x, n, *constants, num_warps=4)


def measure(layer: str, variants: list[tuple[int, int]]) -> None:
    """The probe's time and error on ``layer`` for each (computing warpgroups, stages), beside
    fusionplan's NCHW and NHWC plans of it and cuDNN."""
    from fusionplan.shapes import resnet50_layer

    s = resnet50_layer(layer)
    assert (s.r, s.stride, s.pad) == (1, 1, 0), f"{layer}: a 1x1 layer of stride 1"
    geo = Geometry(s.h * s.w)
    why = geo.why_not(s.c, s.k)
    if why:
        print(f"{layer}: {why}")
        return
    x, w, bias = layer_tensors(s)
    expected = torch.relu(torch.nn.functional.conv2d(x.float(), w.float()) + bias[None, :, None, None])
    kernel, packed = build(), pack_weights(w.reshape(s.k, s.c))
    cudnn = graph_time_us(lambda: torch.relu(torch.nn.functional.conv2d(x, w, bias.half())))
    (nchw_solver, nchw_us), (nhwc_solver, nhwc_us) = fusionplan_times(s, x).values()
    print(
        f"{layer}: fusionplan NCHW {nchw_solver} {nchw_us:.2f} us, NHWC {nhwc_solver} {nhwc_us:.2f}; "
        f"cuDNN conv+bias+relu (unfused calls, NCHW) {cudnn:.2f}"
    )
    for consumers, stages in variants:
        y = torch.full((32, s.k, s.h, s.w), float("nan"), device="cuda", dtype=torch.float16)
        launch(kernel, geo, x, packed, bias, y, consumers, stages)
        err = ((y.float() - expected).norm() / expected.norm()).item()
        probe = graph_time_us(lambda c=consumers, d=stages, out=y: launch(kernel, geo, x, packed, bias, out, c, d))
        print(
            f"{layer} probe ({consumers} computing warpgroups, {stages} stages): {probe:.2f} us "
            f"(rel. error {err:.1e}, NaN left {int(y.isnan().sum())})"
        )


def print_sass(name: str, geo: Geometry, consumers: int, stages: int) -> None:
    from triton.experimental.gluon import language as gl

    w_layout = gl.NVMMASharedLayout(swizzle_byte_width=2 * HALF, element_bitwidth=16, rank=2)
    signature = {
        "w_desc": f"tensordesc<fp16[{64 * consumers},{HALF}],{w_layout!r}>",
        "y_ptr": "*fp16",
        "bias_ptr": "*fp32",
        "C": "i32",
        "K": "i32",
        "x_ptr": "*fp16",
        "N": "i32",
    }
    names = ("NUM_STAGES", "CONSUMERS", "HW", "S", "IMAGES", "P")
    values = (stages, consumers, geo.hw, geo.stride, geo.images, SLOTS)
    constexprs = {(len(signature) + i,): v for i, v in enumerate(values)}
    signature |= {name: "constexpr" for name in names}
    aligned = [["tt.divisibility", 16]]  # as a launch specializes 16-byte aligned pointers and sizes
    attrs = {(1,): aligned, (2,): aligned, (3,): aligned, (4,): aligned, (5,): aligned}
    info = compile_summary(build(), signature, constexprs, attrs)
    print(
        f"{name} odd planes ({consumers} computing warpgroups):",
        summary_line(info),
        "copies by bytes",
        info["async copies by bytes"],
        "expects",
        info["bytes barriers expect (TTGIR)"],
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", default="r50_19,r50_21")
    p.add_argument("--consumers", type=int, default=0, choices=(0, 1, 2), help="computing warpgroups (0: both)")
    p.add_argument(
        "--stages", default="3,4", help="ring stages, comma-separated (16 KB of input, 8 KB of weights a warpgroup)"
    )
    p.add_argument("--sass", action="store_true", help="compile for sm_90 and print the SASS summaries")
    a = p.parse_args()
    consumers = (1, 2) if a.consumers == 0 else (a.consumers,)
    stages = [int(x) for x in a.stages.split(",")]
    if a.sass or not torch.cuda.is_available():
        for n in consumers:
            print_sass("7x7", Geometry(49), n, stages[0])
        return
    for layer in a.layers.split(","):
        measure(layer, [(n, depth) for n in consumers for depth in stages])


if __name__ == "__main__":
    main()
