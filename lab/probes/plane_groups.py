"""Prototype for the NCHW 14x14 and 7x7 planes (lab/NOTES.md section 37, Next): a channel plane
whose start is not a 16-byte unit, read by TMA all the same and moved into place in registers.

An image's planes of 14x14 fp16 pixels are 392 bytes, so planes 2i and 2i+1 together are 784: the
input seen as [N * C / 2, 392] is a valid tensor descriptor (rows of whole 16-byte units). Plane
2i + 1 starts 196 elements into its row, inside a 16-byte unit, where no box may start; boxes from
column 192 hold it 4 elements in. Here a warpgroup loads five such [BC, 64] boxes (128-byte
swizzle) of BC odd planes, moves each box's rows left by 4 elements with the next box's first
elements shifted in (the rows split into even and odd halves until the move is whole elements of
a half, then interleaved back: register moves, no shuffles; odd moves would add byte permutes),
stores them as wgmma's MN-major B operand and multiplies by a [64, BC] filter tile:
y[k, p] = sum_c W[k, c] * plane(2c + 1)[p] for the 256 columns p (196 of them pixels).

    python lab/probes/plane_groups.py            # on a Hopper GPU: run and compare with torch
    python lab/probes/plane_groups.py --sass     # anywhere: compile for sm_90, print the SASS summary
"""

from __future__ import annotations

import argparse
import collections
import re

import torch

from fusionplan.runtime.codegen import load_module

#: Odd planes a box holds (the product's reduction), the pixels a plane has, where its boxes start.
BC = 32
PLANE = 196
FIRST_BOX = 192

_SOURCE = """
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared, mbarrier, tma, warpgroup_mma, warpgroup_mma_wait,
)


{helpers}{moved}


@gluon.jit
def plane_groups_kernel(x_desc, w_desc, y_ptr, FIRST_BOX: gl.constexpr):
    BC: gl.constexpr = x_desc.block_type.shape[0]
    flat: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
    boxes = gl.allocate_shared_memory(x_desc.dtype, [5, BC, 64], x_desc.layout)
    moved = gl.allocate_shared_memory(x_desc.dtype, [4, BC, 64], flat)
    w = gl.allocate_shared_memory(w_desc.dtype, [64, BC], w_desc.layout)
    bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    mbarrier.init(bar, count=1)
    mbarrier.expect(bar, 5 * x_desc.block_type.nbytes + w_desc.block_type.nbytes)
    for k in gl.static_range(5):
        {tma_load}(x_desc, [0, FIRST_BOX + 64 * k], bar, boxes.index(k))
    {tma_load}(w_desc, [0, 0], bar, w)
    mbarrier.wait(bar, 0)
    mbarrier.invalidate(bar)  # before its memory may serve anything else (PTX)
    rows: gl.constexpr = gl.BlockedLayout([1, 64], [32, 1], [gl.num_warps(), 1], [1, 0])
    for k in gl.static_range(4):
        moved.index(k).store(_moved(boxes.index(k).load(rows), boxes.index(k + 1).load(rows)))
    fence_async_shared()
    {thread_barrier}()
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[gl.num_warps(), 1], instr_shape=[16, 64, 16]
    )
    out_layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [gl.num_warps(), 1], [1, 0])
    for k in gl.static_range(4):
        acc = warpgroup_mma(w, moved.index(k), gl.zeros((64, 64), gl.float32, acc_layout), is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=[acc])
        h = gl.convert_layout(acc.to(y_ptr.dtype.element_ty), out_layout)
        r = gl.arange(0, 64, layout=gl.SliceLayout(1, out_layout))
        c = gl.arange(0, 64, layout=gl.SliceLayout(0, out_layout))
        gl.store(y_ptr + r[:, None] * 256 + k * 64 + c[None, :], h)
"""


def build():
    """The prototype's kernel, generated for an offset of PLANE - FIRST_BOX elements."""
    from fusionplan.solvers.gluon_toolkit import gluon_names
    from fusionplan.solvers.templates.gluon_rows import MOVE_HELPERS, move_function

    names = gluon_names()
    source = _SOURCE.format(
        helpers=MOVE_HELPERS,
        moved=move_function("_moved", PLANE - FIRST_BOX, 64, with_next=True),
        tma_load=names["tma_load"],
        thread_barrier=names["thread_barrier"],
    )
    return load_module(source, "plane_groups")[0].plane_groups_kernel


def descriptors(x: torch.Tensor, w: torch.Tensor):
    """x as [N * C / 2, 392] (pairs of 14x14 planes) in [BC, 64] boxes, w [64, BC], both swizzled."""
    from fusionplan.solvers.gluon_toolkit import gluon_descriptor

    pairs = x.reshape(-1, 2 * PLANE)
    x_desc = gluon_descriptor(pairs, list(pairs.shape), [2 * PLANE, 1], [BC, 64], 128, 16)
    w_desc = gluon_descriptor(w, [64, BC], [BC, 1], [64, BC], 64, 16)
    return x_desc, w_desc


def run_and_check() -> None:
    x = torch.randn(1, 2 * BC, 14, 14, device="cuda").half()
    w = torch.randn(64, BC, device="cuda").half()
    y = torch.full((64, 256), float("nan"), device="cuda", dtype=torch.float16)
    build()[(1,)](*descriptors(x, w), y, FIRST_BOX, num_warps=4)
    odd = x.reshape(2 * BC, PLANE)[1::2].float()  # [BC, 196]
    expected = w.float() @ odd
    got = y[:, :PLANE].float()
    err = ((got - expected).norm() / expected.norm()).item()
    print(f"relative error over the 196 pixels: {err:.2e} ({'ok' if err < 1e-2 else 'WRONG'})")


def compile_summary(fn, signature: dict, constexprs: dict, attrs: dict) -> dict:
    """Compile the Gluon kernel ``fn`` for sm_90 with Triton's ASTSource arguments: the SASS
    summary (fusionplan.runtime.sass) with counts of the instructions these probes are about."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    from fusionplan.runtime.sass import summarize

    source = GluonASTSource(fn, signature, constexprs, attrs)
    info = summarize(triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4}))
    pattern = r"^\s+/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9]*)"
    info.pop("hex_sass")
    counts = collections.Counter(re.findall(pattern, info.pop("sass"), re.M))
    info["counts"] = {k: counts.get(k, 0) for k in ("SHFL", "PRMT", "LDS", "STS", "HGMMA", "UTMALDG", "STG")}
    return info


def print_sass() -> None:
    from triton.experimental.gluon import language as gl

    x_layout = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
    w_layout = gl.NVMMASharedLayout(swizzle_byte_width=64, element_bitwidth=16, rank=2)
    signature = {
        "x_desc": f"tensordesc<fp16[{BC},64],{x_layout!r}>",
        "w_desc": f"tensordesc<fp16[64,{BC}],{w_layout!r}>",
        "y_ptr": "*fp16",
        "FIRST_BOX": "constexpr",
    }
    info = compile_summary(build(), signature, {(3,): FIRST_BOX}, {})
    print(info["counts"], info["resources"])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sass", action="store_true", help="compile for sm_90 and print the SASS summary")
    if p.parse_args().sass or not torch.cuda.is_available():
        print_sass()
    else:
        run_and_check()


if __name__ == "__main__":
    main()
