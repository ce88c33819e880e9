"""Probe: a strided (2x2) 1x1 convolution (+ bias, ReLU) on NCHW input through TMA boxes of the even
input rows whole, the product over every column and the odd columns dropped in the epilogue,
against cuDNN and fusionplan's own kernels for the layer (CUDA only; `--sass` compiles for sm_90
without a GPU).

    python lab/probes/even_rows_gemm.py --layers r50_08,r50_14 [--row-boxes] [--pixels 256 --stages 4]
    python lab/probes/even_rows_gemm.py --sass
    python lab/probes/even_rows_gemm.py --check-layouts   # the box is the operand (Triton's linear layouts)

No tensor box takes every other column, and splitting boxes of row pairs in shared memory measured
1.4-1.8x slower than triton-gemm-nchw (lab/NOTES.md section 39). Here nothing is split: the
input seen as [OH, N * C, W] with strides [2W, H * W, 1] (the even rows only; the row pairs' stride
2W * 2 bytes must be a multiple of 16: r50_08's 224, r50_14's 112, not r50_20's 56) is read in
boxes [R rows, 64 channels, WB columns], WB the row's width rounded up to a power of two (TMA
zero-fills the columns past W). Such a box lands in shared memory as R chunks of [64, WB], which
is wgmma's MN-major B operand [64 channels, R * WB pixels] as an NVMMA layout of WB * 2-byte rows
holds it (column chunks of WB outermost: `--check-layouts` compares the three views' linear
layouts), so the product [output channels, R * WB] runs on the raw boxes: 2 * WB / W times the
products the output needs (r50_08: 64 / 28, 2.3x; about 15 GFLOP against 6.6). The epilogue keeps
the even columns (a reshape and split of each thread's column pairs), adds the bias, applies ReLU
and stores each channel's output rows by pointer. ``--row-boxes`` reads the same rows as R boxes
[64 channels, 1 row, WB columns] of the view [N * C, OH, W] (strides in decreasing order), each
into its chunk, should a driver refuse the first view's order of strides.

A program computes R output rows of one image (R * WB = 128 pixels) for 128 output channels, two
computing warpgroups of 64 each, reduction steps of 64 input channels through a ring filled by a
loading warp. Predicted before any run (H100, fp16, batch 32): compute-bound at 2.3x the products,
r50_08 about 25-33 us at 450-600 TFLOP/s against 38 on triton-gemm-nchw (NHWC 19), r50_14 about
the same as its 31.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))

from plane_groups_gemm import compile_probe, fusionplan_times, graph_time_us, layer_tensors, summary_line  # noqa: E402

from fusionplan.runtime.codegen import load_module  # noqa: E402

BLOCK_N = 128  # output channels of a program (two warpgroups of 64)
BLOCK_K = 64  # input channels a reduction step


@dataclass(frozen=True)
class Geometry:
    """A strided layer's input width W and output plane (OH, OW), with the probe's box width WB
    and output rows a program R (R * WB pixels)."""

    w: int
    oh: int
    ow: int
    pixels: int = 128

    @property
    def wb(self) -> int:
        return max(16, 1 << (self.w - 1).bit_length())

    @property
    def rows(self) -> int:
        return self.pixels // self.wb

    @property
    def tiles_h(self) -> int:
        return -(-self.oh // self.rows)

    def why_not(self) -> str | None:
        if (2 * self.w * 2) % 16:
            return f"input rows of {self.w} pixels: the row pairs' stride ({4 * self.w} bytes) is not a multiple of 16"
        if self.pixels % self.wb or self.wb > 64:
            return f"{self.pixels}-pixel tiles of {self.wb}-pixel rows"
        return None


_SOURCE = """
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared, mbarrier, tma, warpgroup_mma, warpgroup_mma_wait,
)


@gluon.jit
def _load(x_desc, w_desc, x_bufs, w_bufs, ready, empty, C,
          NUM_STAGES: gl.constexpr, R: gl.constexpr, WB: gl.constexpr, TILES_H: gl.constexpr,
          ROW_BOXES: gl.constexpr):
    # a stage's input, [R * 64, WB]: row r's 64 planes at rows r * 64.. (the operand's chunk r);
    # one box [R, 64, WB] of the view [OH, N * C, W], or (ROW_BOXES) R boxes [64, 1, WB] of the view
    # [N * C, OH, W] (strides in decreasing order, should a driver refuse the other)
    tile = gl.program_id(0)
    row0 = (tile // TILES_H) * C  # the image's first plane
    oh0 = (tile % TILES_H) * R
    k0 = gl.program_id(1) * {block_n}
    nbytes: gl.constexpr = (R if ROW_BOXES else 1) * x_desc.block_type.nbytes + w_desc.block_type.nbytes
    for i in range(C // {block_k}):
        s = i % NUM_STAGES
        mbarrier.wait(empty.index(s), ((i // NUM_STAGES) & 1) ^ 1)
        mbarrier.expect(ready.index(s), nbytes)
        if ROW_BOXES:
            for r in gl.static_range(R):
                chunk = x_bufs.index(s).slice(r * {block_k}, {block_k})
                {tma_load}(x_desc, [row0 + i * {block_k}, oh0 + r, 0], ready.index(s),
                           chunk.{reinterpret}(x_bufs.dtype, [{block_k}, 1, WB], x_desc.layout))
        else:
            box = x_bufs.index(s).{reinterpret}(x_bufs.dtype, [R, {block_k}, WB], x_desc.layout)
            {tma_load}(x_desc, [oh0, row0 + i * {block_k}, 0], ready.index(s), box)
        {tma_load}(w_desc, [k0, i * {block_k}], ready.index(s), w_bufs.index(s))


@gluon.jit
def _compute(
    x_bufs, w_bufs, ready, empty, y_ptr, bias_ptr, C, K,
    NUM_STAGES: gl.constexpr, CONSUMER: gl.constexpr, R: gl.constexpr, WB: gl.constexpr,
    OH: gl.constexpr, OW: gl.constexpr, TILES_H: gl.constexpr,
):
    P: gl.constexpr = R * WB
    acc = gl.zeros((64, P), gl.float32, gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, P, 16]))
    for i in range(C // {block_k}):
        s = i % NUM_STAGES
        mbarrier.wait(ready.index(s), (i // NUM_STAGES) & 1)
        w = w_bufs.index(s).slice(CONSUMER * 64, 64)
        # the stage's R chunks of [64 channels, WB columns] as one [64, R * WB] operand along its pixels
        b = x_bufs.index(s).{reinterpret}(x_bufs.dtype, [{block_k}, P], x_bufs.type.layout)
        acc = warpgroup_mma(w, b, acc, is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=[acc])
        mbarrier.arrive(empty.index(s))
    tile = gl.program_id(0)
    n = tile // TILES_H
    oh0 = (tile % TILES_H) * R
    k0 = gl.program_id(1) * {block_n} + CONSUMER * 64
    # 8 neighbouring columns a thread: each column pair in one thread, so the split keeps the even ones
    out_layout: gl.constexpr = gl.BlockedLayout([1, 8], [8, 4], [4, 1], [1, 0])
    h = gl.convert_layout(acc, out_layout)
    ch = gl.arange(0, 64, layout=gl.SliceLayout(1, out_layout))
    bias = gl.load(bias_ptr + k0 + ch)
    h = gl.maximum(h + bias[:, None], 0.0)
    even, odd = gl.split(gl.reshape(h, [64, P // 2, 2]))
    even = gl.convert_layout(even, gl.BlockedLayout([1, 4], [4, 8], [4, 1], [1, 0]))
    j = gl.arange(0, P // 2, layout=gl.SliceLayout(0, even.type.layout))
    oh = oh0 + j // (WB // 2)
    ow = j % (WB // 2)
    c = gl.arange(0, 64, layout=gl.SliceLayout(1, even.type.layout))
    plane = (n * K + k0 + c).to(gl.int64) * (OH * OW)
    mask = ((ow < OW) & (oh < OH))[None, :]
    gl.store(y_ptr + plane[:, None] + (oh * OW + ow)[None, :], even.to(y_ptr.dtype.element_ty), mask=mask)


@gluon.jit
def even_rows_gemm_kernel(
    x_desc, w_desc, y_ptr, bias_ptr, C, K,
    NUM_STAGES: gl.constexpr, R: gl.constexpr, WB: gl.constexpr, OH: gl.constexpr, OW: gl.constexpr,
    TILES_H: gl.constexpr, ROW_BOXES: gl.constexpr,
):
    # rows of WB columns (WB * 2 bytes, swizzled as wide), R * 64 of them a stage
    flat: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=2 * WB, element_bitwidth=16, rank=2)
    x_bufs = gl.allocate_shared_memory(x_desc.dtype, [NUM_STAGES, R * {block_k}, WB], flat)
    w_bufs = gl.allocate_shared_memory(w_desc.dtype, [NUM_STAGES, {block_n}, {block_k}], w_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(NUM_STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=2)
    fence_async_shared()
    gl.warp_specialize(
        [
            (_compute, (x_bufs, w_bufs, ready, empty, y_ptr, bias_ptr, C, K, NUM_STAGES, 0, R, WB, OH, OW, TILES_H)),
            (_compute, (x_bufs, w_bufs, ready, empty, y_ptr, bias_ptr, C, K, NUM_STAGES, 1, R, WB, OH, OW, TILES_H)),
            (_load, (x_desc, w_desc, x_bufs, w_bufs, ready, empty, C, NUM_STAGES, R, WB, TILES_H, ROW_BOXES)),
        ],
        [4, 1],
        [232, 40],
    )
    for i in gl.static_range(NUM_STAGES):  # after their last use (PTX, before the memory serves anything else)
        mbarrier.invalidate(ready.index(i))
        mbarrier.invalidate(empty.index(i))
"""


def render() -> str:
    """The probe's kernel source."""
    from fusionplan.solvers.gluon_toolkit import gluon_names

    return _SOURCE.format(block_n=BLOCK_N, block_k=BLOCK_K, **gluon_names())


def build():
    return load_module(render(), "even_rows_gemm")[0].even_rows_gemm_kernel


def input_descriptor(x, geo: Geometry, row_boxes: bool):
    """The even input rows: the view [OH, N * C, W] in boxes [R, 64, WB], or (``row_boxes``) the view
    [N * C, OH, W] in boxes [64, 1, WB]."""
    from fusionplan.solvers.gluon_toolkit import gluon_descriptor

    n, c, h, w = x.shape
    if row_boxes:
        return gluon_descriptor(x, [n * c, geo.oh, w], [h * w, 2 * w, 1], [BLOCK_K, 1, geo.wb], 2 * geo.wb, 16)
    return gluon_descriptor(x, [geo.oh, n * c, w], [2 * w, h * w, 1], [geo.rows, BLOCK_K, geo.wb], 2 * geo.wb, 16)


def launch(kernel, geo: Geometry, x, w2d, bias, y, stages: int, row_boxes: bool = False) -> None:
    """y = relu(conv1x1(x, w, stride 2) + bias): x [N, C, H, W] and y [N, K, OH, OW] NCHW, 16-bit."""
    from fusionplan.solvers.gluon_toolkit import gluon_descriptor

    n, c = x.shape[:2]
    k = w2d.shape[0]
    x_desc = input_descriptor(x, geo, row_boxes)
    w_desc = gluon_descriptor(w2d, [k, c], [c, 1], [BLOCK_N, BLOCK_K], 2 * BLOCK_K, 16)
    grid = (n * geo.tiles_h, k // BLOCK_N)
    constants = (stages, geo.rows, geo.wb, geo.oh, geo.ow, geo.tiles_h, row_boxes)
    kernel[grid](x_desc, w_desc, y, bias, c, k, *constants, num_warps=4)


def measure(layer: str, pixels: int, stages: int, row_boxes: bool) -> None:
    from fusionplan.tools.shapes import resnet50_layer

    s = resnet50_layer(layer)
    assert (s.r, s.stride, s.pad) == (1, 2, 0), f"{layer}: a strided 1x1 layer"
    oh, ow = s.h // 2, s.w // 2
    geo = Geometry(s.w, oh, ow, pixels)
    why = geo.why_not()
    if why:
        print(f"{layer}: {why}")
        return
    x, w, bias = layer_tensors(s)
    y = torch.full((32, s.k, oh, ow), float("nan"), device="cuda", dtype=torch.float16)
    kernel, w2d = build(), w.reshape(s.k, s.c).contiguous()
    launch(kernel, geo, x, w2d, bias, y, stages, row_boxes)
    expected = torch.relu(torch.nn.functional.conv2d(x.float(), w.float(), stride=2) + bias[None, :, None, None])
    err = ((y.float() - expected).norm() / expected.norm()).item()
    probe = graph_time_us(lambda: launch(kernel, geo, x, w2d, bias, y, stages, row_boxes))
    cudnn = graph_time_us(lambda: torch.relu(torch.nn.functional.conv2d(x, w, bias.half(), stride=2)))
    times = fusionplan_times(s, x)
    boxes = "row boxes" if row_boxes else "one box"
    (nchw_solver, nchw_us), (nhwc_solver, nhwc_us) = times["NCHW"], times["NHWC"]
    print(
        f"{layer} ({pixels}-pixel tiles, {stages} stages, {boxes}): probe {probe:.2f} us "
        f"(rel. error {err:.1e}, NaN left {int(y.isnan().sum())}); fusionplan NCHW {nchw_solver} {nchw_us:.2f}, "
        f"NHWC {nhwc_solver} {nhwc_us:.2f}; cuDNN conv+bias+relu (unfused calls, NCHW) {cudnn:.2f}"
    )


def print_sass(name: str, geo: Geometry, stages: int, row_boxes: bool) -> None:
    from triton.experimental.gluon import language as gl

    x_layout = gl.NVMMASharedLayout(swizzle_byte_width=2 * geo.wb, element_bitwidth=16, rank=3)
    w_layout = gl.NVMMASharedLayout(swizzle_byte_width=2 * BLOCK_K, element_bitwidth=16, rank=2)
    box = f"{BLOCK_K},1,{geo.wb}" if row_boxes else f"{geo.rows},{BLOCK_K},{geo.wb}"
    descriptors = {
        "x_desc": f"tensordesc<fp16[{box}],{x_layout!r}>",
        "w_desc": f"tensordesc<fp16[{BLOCK_N},{BLOCK_K}],{w_layout!r}>",
    }
    names = ("NUM_STAGES", "R", "WB", "OH", "OW", "TILES_H", "ROW_BOXES")
    values = (stages, geo.rows, geo.wb, geo.oh, geo.ow, geo.tiles_h, row_boxes)
    info = compile_probe(build(), descriptors, dict(zip(names, values)))
    expects, boxes = info["bytes barriers expect (TTGIR)"], sum(info["tensor loads' box bytes (TTGIR)"])
    kind = "row boxes" if row_boxes else "one box"
    print(f"{name} even rows ({kind}):", summary_line(info), "expects", expects, "boxes", boxes)


def offsets_to_coordinates(builder, layout, shape: list[int]) -> list[tuple[int, ...]]:
    """Each shared-memory offset's element under ``layout``: Triton's linear layout of it (the XOR
    of the bases of the offset's set bits)."""
    bases = builder.to_linear_layout(layout._to_ir(builder), shape).offset_bases
    coordinates = []
    for offset in range(1 << len(bases)):
        coordinate = [0] * len(shape)
        for bit, base in enumerate(bases):
            if offset >> bit & 1:
                coordinate = [a ^ b for a, b in zip(coordinate, base)]
        coordinates.append(tuple(coordinate))
    return coordinates


def check_layouts() -> None:
    """Whether a stage [R * 64, WB] holds at every offset the same element seen as the box
    [R, 64, WB] and as the operand [64, R * WB] (channel c, pixel r * WB + col): 'agree WBxR' per
    geometry, or why it cannot be told."""
    from triton._C.libtriton import gluon_ir, ir
    from triton.experimental.gluon import language as gl

    context = ir.context()
    ir.load_dialects(context)
    builder = gluon_ir.GluonOpBuilder(context)
    if not hasattr(builder, "to_linear_layout"):
        print("this Triton cannot give a shared layout's linear layout")
        return
    for wb, rows in ((64, 2), (32, 4), (64, 4)):

        def layout(rank, wb=wb):
            return gl.NVMMASharedLayout(swizzle_byte_width=2 * wb, element_bitwidth=16, rank=rank)

        flat = offsets_to_coordinates(builder, layout(2), [rows * BLOCK_K, wb])
        box = offsets_to_coordinates(builder, layout(3), [rows, BLOCK_K, wb])
        operand = offsets_to_coordinates(builder, layout(2), [BLOCK_K, rows * wb])
        same = len(flat) == len(box) == len(operand) == rows * BLOCK_K * wb and all(
            (row, col) == (r * BLOCK_K + c, col3) and (c2, pixel) == (c, r * wb + col3)
            for (row, col), (r, c, col3), (c2, pixel) in zip(flat, box, operand)
        )
        print("agree" if same else "DIFFER", f"{wb}x{rows}")


#: The strided 1x1 layers of ResNet-50 the probe compiles for (input width, output plane).
GEOMETRIES = {"r50_08": Geometry(56, 28, 28), "r50_14": Geometry(28, 14, 14)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", default="r50_08,r50_14")
    p.add_argument("--pixels", type=int, default=128, choices=(64, 128, 256), help="computed pixels a program")
    p.add_argument("--stages", type=int, default=3, help="ring stages (32 KB each at 128 pixels)")
    p.add_argument("--row-boxes", action="store_true", help="a box per output row (the view [N * C, OH, W])")
    p.add_argument("--sass", action="store_true", help="compile for sm_90 and print the SASS summaries")
    p.add_argument(
        "--check-layouts", action="store_true", help="whether a stage is the box and the operand at once (no GPU)"
    )
    a = p.parse_args()
    if a.check_layouts:
        check_layouts()
        return
    if a.sass or not torch.cuda.is_available():
        for name, geo in GEOMETRIES.items():
            print_sass(name, Geometry(geo.w, geo.oh, geo.ow, a.pixels), a.stages, a.row_boxes)
        return
    for layer in a.layers.split(","):
        measure(layer, a.pixels, a.stages, a.row_boxes)


if __name__ == "__main__":
    main()
