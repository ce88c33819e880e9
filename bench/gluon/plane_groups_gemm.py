"""Probe: a 1x1 convolution (+ bias, ReLU) on NCHW input of 14x14 planes through TMA boxes of
plane pairs (bench/gluon/plane_groups.py's move, in a pipelined warp-specialized kernel), against
cuDNN and fusionplan's own NCHW kernel for the layer (CUDA only; `--sass` compiles for sm_90).

    python bench/gluon/plane_groups_gemm.py --layers r50_13,r50_15,r50_17
    python bench/gluon/plane_groups_gemm.py --sass

A program computes one image's 196 pixels (four 64-pixel parts, 256 columns) for 128 output
channels, two computing warpgroups of 64 each. Each reduction step takes 64 input channels, 32
pairs of planes: the input seen as [N * C / 2, 392] is read in eight [32, 64] boxes from column 0
to 448 (the even planes are columns 0-195 of their pair's row: the first four boxes, wgmma's B
operand as TMA leaves them; the odd planes start at column 196, 4 elements into the box from
192: a shifter warp moves boxes 3-7 left by 4 into four more), and the filter's even and odd
input channels are two [128, 32] tiles of their own (packed apart on the host). A loading warp
fills a ring of such steps; ``ready`` (TMA), ``shifted`` (the shifter) and ``empty`` (both
warpgroups' products done) barriers per stage. The epilogue adds the bias, applies ReLU and
stores each channel's 196 pixels, 4 a thread (the planes are 8-byte aligned).
"""

from __future__ import annotations

import argparse
import collections
import re
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))

from plane_groups import moved_source  # noqa: E402

from fusionplan.codegen import load_module  # noqa: E402

PLANE = 196  # pixels of a 14x14 plane
BLOCK_K = 128  # output channels of a program
STEP = 64  # input channels of a reduction step (32 pairs)
STAGES = 3

_SOURCE = """
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared, mbarrier, tma, warpgroup_mma, warpgroup_mma_wait,
)


{helpers}{moved}


@gluon.jit
def _load(x_desc, we_desc, wo_desc, boxes, w_even, w_odd, ready, empty, C, NUM_STAGES: gl.constexpr):
    n = gl.program_id(0)
    k0 = gl.program_id(1) * we_desc.block_type.shape[0]
    PAIRS: gl.constexpr = x_desc.block_type.shape[0]
    nbytes: gl.constexpr = 8 * x_desc.block_type.nbytes + 2 * we_desc.block_type.nbytes
    for i in range(C // (2 * PAIRS)):
        s = i % NUM_STAGES
        mbarrier.wait(empty.index(s), ((i // NUM_STAGES) & 1) ^ 1)
        mbarrier.expect(ready.index(s), nbytes)
        row = n * (C // 2) + i * PAIRS
        for b in gl.static_range(8):
            {tma_load}(x_desc, [row, 64 * b], ready.index(s), boxes.index(s * 8 + b))
        {tma_load}(we_desc, [k0, i * PAIRS], ready.index(s), w_even.index(s))
        {tma_load}(wo_desc, [k0, i * PAIRS], ready.index(s), w_odd.index(s))


@gluon.jit
def _shift(boxes, moved, ready, shifted, C, NUM_STAGES: gl.constexpr, PAIRS: gl.constexpr):
    # the odd planes: boxes 3-7 of a step moved left by 4 columns into the step's four moved boxes
    rows: gl.constexpr = gl.BlockedLayout([1, 64], [32, 1], [gl.num_warps(), 1], [1, 0])
    for i in range(C // (2 * PAIRS)):
        s = i % NUM_STAGES
        mbarrier.wait(ready.index(s), (i // NUM_STAGES) & 1)
        for q in gl.static_range(4):
            x = boxes.index(s * 8 + 3 + q).load(rows)
            y = boxes.index(s * 8 + 4 + q).load(rows)
            moved.index(s * 4 + q).store(_moved(x, y))
        fence_async_shared()
        {thread_barrier}()
        mbarrier.arrive(shifted.index(s))


@gluon.jit
def _compute(
    boxes, moved, w_even, w_odd, ready, shifted, empty, y_ptr, bias_ptr, C, K,
    NUM_STAGES: gl.constexpr, PAIRS: gl.constexpr, CONSUMER: gl.constexpr, PLANE: gl.constexpr,
):
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[gl.num_warps(), 1], instr_shape=[16, 64, 16]
    )
    a0 = gl.zeros((64, 64), gl.float32, acc_layout)
    a1 = gl.zeros((64, 64), gl.float32, acc_layout)
    a2 = gl.zeros((64, 64), gl.float32, acc_layout)
    a3 = gl.zeros((64, 64), gl.float32, acc_layout)
    for i in range(C // (2 * PAIRS)):
        s = i % NUM_STAGES
        phase = (i // NUM_STAGES) & 1
        mbarrier.wait(ready.index(s), phase)
        mbarrier.wait(shifted.index(s), phase)
        we = w_even.index(s).slice(CONSUMER * 64, 64)
        wo = w_odd.index(s).slice(CONSUMER * 64, 64)
        a0 = warpgroup_mma(we, boxes.index(s * 8 + 0), a0, is_async=True)
        a0 = warpgroup_mma(wo, moved.index(s * 4 + 0), a0, is_async=True)
        a1 = warpgroup_mma(we, boxes.index(s * 8 + 1), a1, is_async=True)
        a1 = warpgroup_mma(wo, moved.index(s * 4 + 1), a1, is_async=True)
        a2 = warpgroup_mma(we, boxes.index(s * 8 + 2), a2, is_async=True)
        a2 = warpgroup_mma(wo, moved.index(s * 4 + 2), a2, is_async=True)
        a3 = warpgroup_mma(we, boxes.index(s * 8 + 3), a3, is_async=True)
        a3 = warpgroup_mma(wo, moved.index(s * 4 + 3), a3, is_async=True)
        a0, a1, a2, a3 = warpgroup_mma_wait(num_outstanding=0, deps=[a0, a1, a2, a3])
        mbarrier.arrive(empty.index(s))
    n = gl.program_id(0)
    k0 = gl.program_id(1) * 128 + CONSUMER * 64
    out_layout: gl.constexpr = gl.BlockedLayout([1, 4], [2, 16], [gl.num_warps(), 1], [1, 0])
    r = gl.arange(0, 64, layout=gl.SliceLayout(1, out_layout))
    c = gl.arange(0, 64, layout=gl.SliceLayout(0, out_layout))
    bias = gl.load(bias_ptr + k0 + r)
    plane = gl.multiple_of((n * K + k0 + r) * PLANE, 4)
    for q in gl.static_range(4):
        acc = (a0, a1, a2, a3)[q]
        h = gl.convert_layout(acc, out_layout) + bias[:, None]
        h = gl.maximum(h, 0.0).to(y_ptr.dtype.element_ty)
        col = q * 64 + c
        gl.store(y_ptr + plane[:, None] + col[None, :], h, mask=(col < PLANE)[None, :])


@gluon.jit
def plane_groups_gemm_kernel(
    x_desc, we_desc, wo_desc, y_ptr, bias_ptr, C, K, NUM_STAGES: gl.constexpr, PLANE: gl.constexpr,
):
    PAIRS: gl.constexpr = x_desc.block_type.shape[0]
    flat: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
    boxes = gl.allocate_shared_memory(x_desc.dtype, [NUM_STAGES * 8, PAIRS, 64], x_desc.layout)
    moved = gl.allocate_shared_memory(x_desc.dtype, [NUM_STAGES * 4, PAIRS, 64], flat)
    w_even = gl.allocate_shared_memory(we_desc.dtype, [NUM_STAGES, 128, PAIRS], we_desc.layout)
    w_odd = gl.allocate_shared_memory(wo_desc.dtype, [NUM_STAGES, 128, PAIRS], wo_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    shifted = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(NUM_STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(shifted.index(i), count=1)
        mbarrier.init(empty.index(i), count=2)
    fence_async_shared()
    gl.warp_specialize(
        [
            (_compute, (boxes, moved, w_even, w_odd, ready, shifted, empty, y_ptr, bias_ptr, C, K,
                        NUM_STAGES, PAIRS, 0, PLANE)),
            (_compute, (boxes, moved, w_even, w_odd, ready, shifted, empty, y_ptr, bias_ptr, C, K,
                        NUM_STAGES, PAIRS, 1, PLANE)),
            (_load, (x_desc, we_desc, wo_desc, boxes, w_even, w_odd, ready, empty, C, NUM_STAGES)),
            (_shift, (boxes, moved, ready, shifted, C, NUM_STAGES, PAIRS)),
        ],
        [4, 1, 1],
        [208, 96, 96],
    )
"""


def build():
    from fusionplan.solvers.gluon_rows import MOVE_HELPERS
    from fusionplan.solvers.gluon_window import gluon_names

    names = gluon_names()
    source = _SOURCE.format(
        helpers=MOVE_HELPERS,
        moved=moved_source(PLANE - 192),
        tma_load=names["tma_load"],
        thread_barrier=names["thread_barrier"],
    )
    return load_module(source, "plane_groups_gemm")[0].plane_groups_gemm_kernel


def launch(kernel, x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor, y: torch.Tensor) -> None:
    """y = relu(conv1x1(x, w) + bias), x [N, C, 14, 14] and y [N, K, 14, 14] NCHW fp16."""
    from fusionplan.solvers.gluon_window import gluon_descriptor

    n, c = x.shape[:2]
    k = w.shape[0]
    pairs = x.reshape(n * c // 2, 2 * PLANE)
    x_desc = gluon_descriptor(pairs, list(pairs.shape), [2 * PLANE, 1], [STEP // 2, 64], 128, 16)
    w2 = w.reshape(k, c)
    w_even, w_odd = w2[:, 0::2].contiguous(), w2[:, 1::2].contiguous()
    we_desc = gluon_descriptor(w_even, [k, c // 2], [c // 2, 1], [BLOCK_K, STEP // 2], 64, 16)
    wo_desc = gluon_descriptor(w_odd, [k, c // 2], [c // 2, 1], [BLOCK_K, STEP // 2], 64, 16)
    kernel[(n, k // BLOCK_K)](x_desc, we_desc, wo_desc, y, bias, c, k, STAGES, PLANE, num_warps=4)


def graph_time_us(fn, reps: int = 20, rounds: int = 15) -> float:
    """Median time of ``fn`` in a CUDA graph of ``reps`` calls, per call."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(reps):
            fn()
    times = []
    for _ in range(rounds):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1000 / reps)
    return sorted(times)[len(times) // 2]


def measure(layer: str) -> None:
    import fusionplan as fp
    from fusionplan.shapes import resnet50_layer
    from fusionplan.testing import layer_plan, random_args

    s = resnet50_layer(layer)
    assert (s.h, s.w, s.r, s.stride) == (14, 14, 1, 1), f"{layer}: a stride-1 1x1 layer on 14x14 planes"
    x = torch.randn(32, s.c, 14, 14, device="cuda").half()
    w = (torch.randn(s.k, s.c, 1, 1, device="cuda") / s.c**0.5).half()
    bias = torch.randn(s.k, device="cuda")
    y = torch.full((32, s.k, 14, 14), float("nan"), device="cuda", dtype=torch.float16)
    kernel = build()
    launch(kernel, x, w, bias, y)
    expected = torch.relu(torch.nn.functional.conv2d(x.float(), w.float()) + bias[None, :, None, None])
    err = ((y.float() - expected).norm() / expected.norm()).item()
    probe = graph_time_us(lambda: launch(kernel, x, w, bias, y))
    cudnn = graph_time_us(lambda: torch.relu(torch.nn.functional.conv2d(x, w, bias.half())))
    plan = layer_plan(s, x, "CBA")
    handle = fp.Handle("cuda")
    plan.compile(handle)
    args = random_args(plan, "cuda", param_dtype=torch.float32)
    out = torch.empty(plan.output_desc.dims, device="cuda", dtype=torch.float16)
    ours = graph_time_us(lambda: plan.execute(handle, x, out, args))
    print(
        f"{layer}: probe {probe:.2f} us (rel. error {err:.1e}), {plan.compiled_solver(handle)} {ours:.2f}, "
        f"cuDNN conv+bias+relu (unfused calls) {cudnn:.2f}"
    )


def print_sass() -> None:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon._runtime import GluonASTSource

    from fusionplan.sass import summarize

    x_layout = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
    w_layout = gl.NVMMASharedLayout(swizzle_byte_width=64, element_bitwidth=16, rank=2)
    signature = {
        "x_desc": f"tensordesc<fp16[{STEP // 2},64],{x_layout!r}>",
        "we_desc": f"tensordesc<fp16[{BLOCK_K},{STEP // 2}],{w_layout!r}>",
        "wo_desc": f"tensordesc<fp16[{BLOCK_K},{STEP // 2}],{w_layout!r}>",
        "y_ptr": "*fp16",
        "bias_ptr": "*fp32",
        "C": "i32",
        "K": "i32",
        "NUM_STAGES": "constexpr",
        "PLANE": "constexpr",
    }
    aligned = [["tt.divisibility", 16]]  # as a launch specializes 16-byte aligned pointers
    source = GluonASTSource(build(), signature, {(7,): STAGES, (8,): PLANE}, {(3,): aligned, (4,): aligned})
    compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
    info = summarize(compiled)
    sass = info.pop("sass")
    pattern = r"^\s+/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9]*)"
    counts = collections.Counter(re.findall(pattern, sass, re.M))
    keys = ("SHFL", "PRMT", "LDS", "STS", "HGMMA", "UTMALDG", "STG")
    waits = info["wgmma waits (outstanding groups allowed)"]
    stores = info["global stores by bytes"]
    print({k: counts.get(k, 0) for k in keys}, "stores by bytes", stores, "waits", len(waits), info["resources"])


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
