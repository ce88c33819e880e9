"""What the stem kernels share (triton-stem, gluon-stem): the stretches a run of output pixels
reads, their geometry and candidates, the taps each pixel meets, and the filter's Toeplitz
blocks."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fusionplan.runtime.folding import split_at_conv
from fusionplan.solvers.base import PlanSpec

Tensor = torch.Tensor


#: Input channels from which a tap fills a reduction step by itself (triton-conv, triton-window).
STEM_MAX_CHANNELS = 15


@dataclass(frozen=True)
class Stretches:
    """How runs of output pixels read input rows: ``pixels`` per run; neighbouring runs start
    ``step`` elements apart; a run's stretch starts ``lead`` elements before its first pixel's
    column (padding included) and is ``block_e`` elements long, ``used`` of them met by a tap.
    Rows hold ``interleaved`` channels per pixel (channels-last: C; channel planes: 1, and each
    reduction step reads one channel's plane)."""

    pixels: int
    step: int
    lead: int
    block_e: int
    used: int
    interleaved: int

    def position(self, p: int, s: int, stride_w: int, pad_w: int, dil_w: int) -> int:
        """Where pixel p's tap s (its first interleaved channel) lies in the run's stretch."""
        return self.lead + (p * stride_w + s * dil_w - pad_w) * self.interleaved


def stretch_candidates(
    interleaved: int, filter_w: int, stride_w: int, pad_w: int, dil_w: int, out_w: int, itemsize: int
) -> list[tuple[Stretches, int]]:
    """Every run length (1, 2, 4, 8 pixels, at most the row's) with every vector width that aligns
    its stretches (step and lead multiples of it): (stretches, vector elements) pairs."""
    found = []
    for pixels in (1, 2, 4, 8):
        if pixels > 1 and pixels > out_w:
            break
        step = pixels * stride_w * interleaved
        vector = min(16 // itemsize, step & -step)
        while vector >= 1:
            lead = -(-pad_w * interleaved // vector) * vector
            used = lead + ((pixels - 1) * stride_w + (filter_w - 1) * dil_w + 1 - pad_w) * interleaved
            block_e = max(16, 1 << (used - 1).bit_length())
            found.append((Stretches(pixels, step, lead, block_e, used, interleaved), vector))
            vector //= 2
    return found


def stretches(
    interleaved: int, filter_w: int, stride_w: int, pad_w: int, dil_w: int, out_w: int, itemsize: int
) -> Stretches:
    """The run length and vector width with the shortest stretch per pixel of tensor-core work
    (BLOCK_E, a power of two of at least 16); among equals the longest run (fewer gathered
    elements per pixel), then the widest vector loads (aligned when step and lead are multiples)."""
    found = stretch_candidates(interleaved, filter_w, stride_w, pad_w, dil_w, out_w, itemsize)
    return min(found, key=lambda item: (item[0].block_e, -item[0].pixels, -item[1]))[0]


def joined_pixels(accs: list[str]) -> str:
    """The expression joining a run's accumulators ([runs, channels] each, pixel p's at ``accs[p]``,
    a power of two of them) into [runs, channels, 2, ..., 2] whose trailing indices are p's bits,
    the highest first: its pixels in order once the channels go last."""
    if len(accs) == 1:
        return accs[0]
    return f"tl.join({joined_pixels(accs[0::2])}, {joined_pixels(accs[1::2])})"


def channels_interleaved(spec: PlanSpec) -> int | None:
    """C when the input's rows are channels-last (pixels side by side, channels innermost), 1 when
    they are rows of channel planes (W contiguous), None when neither."""
    x = spec.input_desc
    c = x.dims[1]
    if x.same_strides((x.strides[0], 1, x.strides[2], c)):
        return c
    if x.same_strides((*x.strides[:3], 1)):
        return 1
    return None


def stretch_geometry(spec: PlanSpec) -> tuple[int, int, int, int, int, int, int]:
    """What runs and stretches depend on (stretches' arguments, in order): the input rows'
    interleaved channels, the filter's width, the stride, padding and dilation along the rows, the
    output's width and the data's bytes."""
    _, conv, _ = split_at_conv(spec.ops)
    assert conv is not None
    interleaved = channels_interleaved(spec)
    assert interleaved is not None
    c = conv.conv
    out_w, itemsize = conv.output_desc.dims[3], spec.dtype.torch_dtype.itemsize
    return interleaved, conv.w_desc.dims[3], c.strides[1], c.pads[1], c.dilations[1], out_w, itemsize


def tap_positions(spec: PlanSpec, runs: Stretches, p: int, side: int = 1, pitch: int = 0) -> list[int]:
    """The places in a row of stretches that pixel p's taps meet (its Toeplitz block's nonzero
    columns): each tap's ``runs.interleaved`` channels side by side, in each of ``side`` channel
    planes' stretches ``pitch`` apart (gluon-stem's rows of planes side by side)."""
    _, filter_w, stride_w, pad_w, dil_w, _, _ = stretch_geometry(spec)
    starts = [runs.position(p, tap, stride_w, pad_w, dil_w) for tap in range(filter_w)]
    return sorted({at + j + k * pitch for at in starts for j in range(runs.interleaved) for k in range(side)})


def positions_expression(positions: list[int], name: str) -> str:
    """A boolean expression over the index tensor ``name`` that holds exactly at ``positions``
    (sorted): a union of the runs of consecutive ones."""
    spans, first = [], positions[0]
    for prev, cur in zip(positions, [*positions[1:], None]):
        if cur != prev + 1:
            spans.append(f"(({name} >= {first}) & ({name} <= {prev}))")
            first = cur
    return " | ".join(spans)


def toeplitz_pack(weight: Tensor, runs: Stretches, conv_args: tuple[int, ...]) -> Tensor:
    """[K, C, R, S] -> Toeplitz blocks [R, CH_STEPS, PX, K, BLOCK_E]: block p of a step holds
    tap s (channel c) at pixel p's position of the stretch, zeros elsewhere; the reduction
    contiguous (K-major, as wgmma reads its A operand for every dtype)."""
    k, c, r, s = weight.shape
    pad_w, stride_w, dil_w = conv_args[1], conv_args[3], conv_args[5]
    steps = c // runs.interleaved
    packed = weight.new_zeros((r, steps, runs.pixels, k, runs.block_e))
    for p in range(runs.pixels):
        for tap in range(s):
            at = runs.position(p, tap, stride_w, pad_w, dil_w)
            if steps == 1:  # the channels side by side in the stretch
                packed[:, 0, p, :, at : at + c] = weight[:, :, :, tap].permute(2, 0, 1)
            else:  # one channel per step
                packed[:, :, p, :, at] = weight[:, :, :, tap].permute(2, 1, 0)
    return packed
