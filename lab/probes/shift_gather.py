"""Probe for a lead on the NCHW 14x14 planes (lab/NOTES.md, Next): an accumulator part moved left
by 4 columns in registers, its last 4 columns taken from a narrow neighbour.

Odd 14x14 planes start 8 bytes into a 16-byte unit, so their boxes start 4 pixels early; their
products would go to accumulators of their own and be moved into place once a tile, after the
reduction. Gluon's shared-memory views cannot start 4 columns in ("the split offset may not touch
the tile": a view's offset must be a multiple of its size), so the move is ``gl.gather`` along the
columns of wgmma's accumulator layout: the part's own columns shifted, and the 4 that lie past its
end from an 8-column neighbour (a source narrower than the index along the gathered axis).

    python lab/probes/shift_gather.py           # on a GPU: the moved parts against torch
    python lab/probes/shift_gather.py --sass    # anywhere: compile for sm_90, the instruction counts
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))

from plane_groups import compile_summary  # noqa: E402

from fusionplan.runtime.codegen import load_module  # noqa: E402

#: Widths of a tile's parts (a 104-pixel tile: 64 + 32 + 8) and the move.
WIDTHS = (64, 32, 8)
SHIFT = 4

SOURCE = """
from triton.experimental import gluon
from triton.experimental.gluon import language as gl


@gluon.jit
def shift_kernel(part_ptr, next_ptr, out_ptr, W: gl.constexpr, SHIFT: gl.constexpr):
    # part [64, W] and its neighbour [64, 8], each in wgmma's accumulator layout of its width; out:
    # the part's columns SHIFT.. W - 1, then the neighbour's first SHIFT
    acc_w: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, W, 16])
    acc_8: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 8, 16])
    r = gl.arange(0, 64, layout=gl.SliceLayout(1, acc_w))
    c = gl.arange(0, W, layout=gl.SliceLayout(0, acc_w))
    part = gl.load(part_ptr + r[:, None] * W + c[None, :])
    r8 = gl.arange(0, 64, layout=gl.SliceLayout(1, acc_8))
    c8 = gl.arange(0, 8, layout=gl.SliceLayout(0, acc_8))
    after = gl.convert_layout(gl.load(next_ptr + r8[:, None] * 8 + c8[None, :]), acc_w)
    cols = gl.zeros([64, W], gl.int32, acc_w) + c[None, :]
    own = gl.gather(part, gl.minimum(cols + SHIFT, W - 1), 1)
    past = gl.gather(after, gl.maximum(cols - (W - SHIFT), 0), 1)
    gl.store(out_ptr + r[:, None] * W + c[None, :], gl.where(cols < W - SHIFT, own, past))
"""


def kernel():
    return load_module(SOURCE, "shift_gather")[0].shift_kernel


def run() -> None:
    fn = kernel()
    for w in WIDTHS:
        part = torch.randn(64, w, device="cuda")
        after = torch.randn(64, 8, device="cuda")
        out = torch.full((64, w), float("nan"), device="cuda")
        fn[(1,)](part, after, out, w, SHIFT, num_warps=4)
        want = torch.cat((part, after), 1)[:, SHIFT : SHIFT + w]
        print(f"width {w}: max error {(out - want).abs().max().item():.3g}, NaN left {out.isnan().sum().item()}")


def print_sass() -> None:
    signature = {"part_ptr": "*fp32", "next_ptr": "*fp32", "out_ptr": "*fp32", "W": "constexpr", "SHIFT": "constexpr"}
    for w in WIDTHS:
        info = compile_summary(kernel(), signature, {(3,): w, (4,): SHIFT}, {})
        print(f"width {w}:", info["counts"])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sass", action="store_true", help="compile for sm_90 and print instruction counts")
    if p.parse_args().sass:
        print_sass()
    else:
        run()


if __name__ == "__main__":
    main()
