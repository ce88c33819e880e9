"""Probe: a 1x1 convolution (+ bias, ReLU) on NCHW input of 14x14 planes through TMA boxes of plane
pairs, the odd planes' products moved into place once a tile (lab/probes/shift_gather.py's move),
against cuDNN and fusionplan's own kernels for the layer (CUDA only; `--sass` compiles for sm_90
without a GPU).

    python lab/probes/plane_pairs_gemm.py --layers r50_13,r50_15,r50_17
    python lab/probes/plane_pairs_gemm.py --sass

Two 14x14 fp16 planes are 784 bytes, whole 16-byte units, so the input seen as [N * C / 2, 392] is
a valid tensor descriptor. An even plane starts its row (a box at column p holds its pixels p..);
an odd one starts 196 elements in, 8 bytes into a 16-byte unit where no box may start, so its boxes
start at column 192 + p and hold its pixels p - 4... Unlike the plane-groups probe (section 38),
nothing moves the boxes: the even and the odd planes' boxes are each wgmma's B operand as TMA left
them, their products go to accumulators of their own (the filter packed by parity, [2K, C / 2]),
and after the reduction each odd accumulator part is moved 4 columns left in registers
(``gl.gather``), its last 4 columns from the next part (the last part's from a 16-pixel neighbour
box), and added to the even one.

A program computes half an image's plane (112 pixels: parts of 64, 32 and 16; the image padded to
224) for 128 output channels, two computing warpgroups of 64 each; each reduction step takes 32
pairs (64 input channels) through a ring filled by a loading warp: 3 even boxes, 3 odd boxes, the
neighbour and the two parities' filter tiles. The epilogue adds the bias, applies ReLU and stores
each channel's pixels by pointer (4 pixels a thread).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))

from plane_groups_gemm import compile_probe, fusionplan_times, graph_time_us, layer_tensors, summary_line  # noqa: E402

from fusionplan.runtime.codegen import load_module  # noqa: E402

PLANE = 196  # pixels of a 14x14 plane
TILE = 112  # pixels of a program's tile: half an image, padded
PARTS = (64, 32, 16)  # the tile's parts (power-of-two boxes)
NEIGHBOUR = 16  # the box past the last odd part (its last 4 pixels)
SHIFT = 4  # elements an odd plane sits inside its boxes
ODD_START = PLANE - SHIFT  # the column of an odd plane's boxes (a 16-byte unit)
PAIRS = 32  # plane pairs a step (64 input channels)
BLOCK_K = 128  # output channels of a program


def offsets() -> list[int]:
    """Each part's first pixel in the tile."""
    return [sum(PARTS[:q]) for q in range(len(PARTS))]


def stages() -> int:
    """Ring stages whose boxes and filter tiles fit 200 KB."""
    boxes = (2 * TILE + NEIGHBOUR) * PAIRS * 2
    weights = 2 * BLOCK_K * PAIRS * 2
    return min(6, 200 * 1024 // (boxes + weights))


_SOURCE = """
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared, mbarrier, tma, warpgroup_mma, warpgroup_mma_wait,
)


@gluon.jit
def _load(x_desc0, x_desc1, x_desc2, n_desc, w_desc, {bufs}, w_bufs, ready, empty, C, K,
          NUM_STAGES: gl.constexpr):
    tile = gl.program_id(0)
    row0 = (tile // 2) * (C // 2)  # the image's first pair
    p0 = (tile % 2) * {tile}  # the tile's first pixel
    k0 = gl.program_id(1) * {block_k}
    nbytes: gl.constexpr = (
        2 * (x_desc0.block_type.nbytes + x_desc1.block_type.nbytes + x_desc2.block_type.nbytes)
        + n_desc.block_type.nbytes + 2 * w_desc.block_type.nbytes
    )
    for i in range(C // {step_channels}):
        s = i % NUM_STAGES
        mbarrier.wait(empty.index(s), ((i // NUM_STAGES) & 1) ^ 1)
        mbarrier.expect(ready.index(s), nbytes)
        row = row0 + i * {pairs}
{box_loads}
        {tma_load}(n_desc, [row, {odd_start} + p0 + {tile}], ready.index(s), nbuf.index(s))
        for j in gl.static_range(2):
            {tma_load}(w_desc, [j * K + k0, i * {pairs}], ready.index(s), w_bufs.index(s * 2 + j))


@gluon.jit
def _moved(part, after, SHIFT: gl.constexpr):
    # part's columns SHIFT.. then after's first SHIFT columns, in part's layout (warp shuffles)
    W: gl.constexpr = part.shape[1]
    c = gl.arange(0, W, layout=gl.SliceLayout(0, part.type.layout))
    cols = gl.zeros_like(part).to(gl.int32) + c[None, :]
    own = gl.gather(part, gl.minimum(cols + SHIFT, W - 1), 1)
    past = gl.gather(gl.convert_layout(after, part.type.layout), gl.maximum(cols - (W - SHIFT), 0), 1)
    return gl.where(cols < W - SHIFT, own, past)


@gluon.jit
def _compute(
    {bufs}, w_bufs, ready, empty, y_ptr, bias_ptr, C, K,
    NUM_STAGES: gl.constexpr, CONSUMER: gl.constexpr, PLANE: gl.constexpr,
):
{acc_init}
    for i in range(C // {step_channels}):
        s = i % NUM_STAGES
        mbarrier.wait(ready.index(s), (i // NUM_STAGES) & 1)
        w_even = w_bufs.index(s * 2).slice(CONSUMER * 64, 64)
        w_odd = w_bufs.index(s * 2 + 1).slice(CONSUMER * 64, 64)
{products}
        {accs} = warpgroup_mma_wait(num_outstanding=0, deps=[{accs}])
        mbarrier.arrive(empty.index(s))
{moves}
    tile = gl.program_id(0)
    k0 = gl.program_id(1) * {block_k} + CONSUMER * 64
    out_layout: gl.constexpr = gl.BlockedLayout([1, 4], [4, 8], [gl.num_warps(), 1], [1, 0])
    r = gl.arange(0, 64, layout=gl.SliceLayout(1, out_layout))
    bias = gl.load(bias_ptr + k0 + r)
    plane = ((tile // 2) * K + k0 + r) * PLANE
{stores}


@gluon.jit
def plane_pairs_gemm_kernel(
    x_desc0, x_desc1, x_desc2, n_desc, w_desc, y_ptr, bias_ptr, C, K,
    NUM_STAGES: gl.constexpr, PLANE: gl.constexpr,
):
{allocs}
    w_bufs = gl.allocate_shared_memory(w_desc.dtype, [NUM_STAGES * 2, {block_k}, {pairs}], w_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(NUM_STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=2)
    fence_async_shared()
    gl.warp_specialize(
        [
            (_compute, ({bufs}, w_bufs, ready, empty, y_ptr, bias_ptr, C, K, NUM_STAGES, 0, PLANE)),
            (_compute, ({bufs}, w_bufs, ready, empty, y_ptr, bias_ptr, C, K, NUM_STAGES, 1, PLANE)),
            (_load, (x_desc0, x_desc1, x_desc2, n_desc, w_desc, {bufs}, w_bufs, ready, empty, C, K,
                     NUM_STAGES)),
        ],
        [4, 1],
        [232, 40],
    )
    for i in gl.static_range(NUM_STAGES):  # after their last use (PTX, before the memory serves anything else)
        mbarrier.invalidate(ready.index(i))
        mbarrier.invalidate(empty.index(i))
"""


def _buffer(kind: str, q: int) -> str:
    """Part q's box of a stage: the even planes' (``kind`` "e") or the odd ones' ("o")."""
    return f"{kind}{q}_bufs.index(s)"


#: The ring's buffers of boxes: each part's even and odd planes, and the neighbour of the last.
BUFFERS = ", ".join([f"e{q}_bufs, o{q}_bufs" for q in range(len(PARTS))] + ["nbuf"])


def render() -> str:
    """The probe's kernel source."""
    from fusionplan.solvers.gluon_toolkit import gluon_names

    names = gluon_names()
    box_loads, products, moves, stores, accs = [], [], [], [], []
    for q, (width, off) in enumerate(zip(PARTS, offsets())):
        box_loads += [
            f"        {names['tma_load']}(x_desc{q}, [row, p0 + {off}], ready.index(s), {_buffer('e', q)})",
            f"        {names['tma_load']}(x_desc{q}, [row, {ODD_START} + p0 + {off}], ready.index(s), "
            f"{_buffer('o', q)})",
        ]
        products += [
            f"        e{q} = warpgroup_mma(w_even, {_buffer('e', q)}, e{q}, is_async=True)",
            f"        o{q} = warpgroup_mma(w_odd, {_buffer('o', q)}, o{q}, is_async=True)",
        ]
        accs += [f"e{q}", f"o{q}"]
        after = f"o{q + 1}" if q + 1 < len(PARTS) else "nb"
        moves.append(f"    e{q} = e{q} + _moved(o{q}, {after}, {SHIFT})")
        stores += [
            f"    c{q} = (tile % 2) * {TILE} + {off} + gl.arange(0, {width}, layout=gl.SliceLayout(0, out_layout))",
            f"    h = gl.maximum(gl.convert_layout(e{q}, out_layout) + bias[:, None], 0.0).to(y_ptr.dtype.element_ty)",
            f"    gl.store(y_ptr + plane[:, None] + c{q}[None, :], h, mask=(c{q} < PLANE)[None, :])",
        ]
    products.append("        nb = warpgroup_mma(w_odd, nbuf.index(s), nb, is_async=True)")
    accs.append("nb")
    acc_init = []
    for q, width in enumerate(PARTS):
        layout = f"gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, {width}, 16])"
        acc_init += [f"    e{q} = gl.zeros((64, {width}), gl.float32, {layout})", f"    o{q} = gl.zeros_like(e{q})"]
    layout = f"gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, {NEIGHBOUR}, 16])"
    acc_init.append(f"    nb = gl.zeros((64, {NEIGHBOUR}), gl.float32, {layout})")
    allocs = [
        f"    {kind}{q}_bufs = gl.allocate_shared_memory("
        f"x_desc{q}.dtype, [NUM_STAGES, {PAIRS}, {width}], x_desc{q}.layout)"
        for q, width in enumerate(PARTS)
        for kind in "eo"
    ]
    allocs.append(
        f"    nbuf = gl.allocate_shared_memory(n_desc.dtype, [NUM_STAGES, {PAIRS}, {NEIGHBOUR}], n_desc.layout)"
    )
    return _SOURCE.format(
        bufs=BUFFERS,
        allocs="\n".join(allocs),
        tile=TILE,
        block_k=BLOCK_K,
        pairs=PAIRS,
        step_channels=2 * PAIRS,
        odd_start=ODD_START,
        box_loads="\n".join(box_loads),
        products="\n".join(products),
        moves="\n".join(moves),
        stores="\n".join(stores),
        acc_init="\n".join(acc_init),
        accs=", ".join(accs),
        tma_load=names["tma_load"],
    )


def build():
    return load_module(render(), "plane_pairs_gemm")[0].plane_pairs_gemm_kernel


def pack_by_parity(w: torch.Tensor) -> torch.Tensor:
    """[K, C] (or [K, C, 1, 1]) -> [2K, C / 2]: the even input channels' filter, then the odd ones'."""
    k = w.shape[0]
    w = w.reshape(k, -1)
    return torch.cat((w[:, 0::2], w[:, 1::2])).contiguous()


def launch(kernel, x: torch.Tensor, w_packed: torch.Tensor, bias: torch.Tensor, y: torch.Tensor) -> None:
    """y = relu(conv1x1(x, w) + bias), x [N, C, 14, 14] and y [N, K, 14, 14] NCHW fp16."""
    from triton.experimental.gluon import language as gl

    from fusionplan.solvers.gluon_toolkit import gluon_descriptor

    n, c = x.shape[:2]
    k = w_packed.shape[0] // 2
    pairs = x.reshape(n * c // 2, 2 * PLANE)
    view = list(pairs.shape), [2 * PLANE, 1]
    boxes = [gluon_descriptor(pairs, *view, [PAIRS, width], min(128, 2 * width), 16) for width in PARTS]
    neighbour = gluon_descriptor(pairs, *view, [PAIRS, NEIGHBOUR], 2 * NEIGHBOUR, 16)
    w_desc = gluon_descriptor(w_packed, [2 * k, c // 2], [c // 2, 1], [BLOCK_K, PAIRS], 2 * PAIRS, 16)
    assert all(isinstance(d.layout, gl.NVMMASharedLayout) for d in boxes)
    kernel[(2 * n, k // BLOCK_K)](*boxes, neighbour, w_desc, y, bias, c, k, stages(), PLANE, num_warps=4)


def measure(layer: str) -> None:
    from fusionplan.tools.shapes import resnet50_layer

    s = resnet50_layer(layer)
    assert (s.h, s.w, s.r, s.stride) == (14, 14, 1, 1), f"{layer}: a stride-1 1x1 layer on 14x14 planes"
    x, w, bias = layer_tensors(s)
    y = torch.full((32, s.k, s.h, s.w), float("nan"), device="cuda", dtype=torch.float16)
    kernel, packed = build(), pack_by_parity(w)
    launch(kernel, x, packed, bias, y)
    expected = torch.relu(torch.nn.functional.conv2d(x.float(), w.float()) + bias[None, :, None, None])
    err = ((y.float() - expected).norm() / expected.norm()).item()
    probe = graph_time_us(lambda: launch(kernel, x, packed, bias, y))
    cudnn = graph_time_us(lambda: torch.relu(torch.nn.functional.conv2d(x, w, bias.half())))
    times = fusionplan_times(s, x)
    print(
        f"{layer}: probe {probe:.2f} us (rel. error {err:.1e}, NaN left {int(y.isnan().sum())}); fusionplan NCHW "
        f"{times['NCHW'][0]} {times['NCHW'][1]:.2f}, NHWC {times['NHWC'][0]} {times['NHWC'][1]:.2f}; "
        f"cuDNN conv+bias+relu (unfused calls, NCHW) {cudnn:.2f}"
    )


def print_sass() -> None:
    from triton.experimental.gluon import language as gl

    def box(width: int) -> str:
        layout = gl.NVMMASharedLayout(swizzle_byte_width=min(128, 2 * width), element_bitwidth=16, rank=2)
        return f"tensordesc<fp16[{PAIRS},{width}],{layout!r}>"

    w_layout = gl.NVMMASharedLayout(swizzle_byte_width=2 * PAIRS, element_bitwidth=16, rank=2)
    descriptors = {f"x_desc{q}": box(width) for q, width in enumerate(PARTS)}
    descriptors |= {"n_desc": box(NEIGHBOUR), "w_desc": f"tensordesc<fp16[{BLOCK_K},{PAIRS}],{w_layout!r}>"}
    info = compile_probe(build(), descriptors, {"NUM_STAGES": stages(), "PLANE": PLANE})
    expects, boxes = info["bytes barriers expect (TTGIR)"], sum(info["tensor loads' box bytes (TTGIR)"])
    print("14x14 plane pairs:", summary_line(info), "expects", expects, "boxes", boxes)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", default="r50_13,r50_15,r50_17")
    p.add_argument("--sass", action="store_true", help="compile for sm_90 and print the SASS summary")
    a = p.parse_args()
    if a.sass or not torch.cuda.is_available():
        print_sass()
        return
    for layer in a.layers.split(","):
        measure(layer)


if __name__ == "__main__":
    main()
