"""Tuning configurations of the Triton kernels, as data.

Each kernel family has a list of candidate configurations and a heuristic that picks one
from the problem's shape class (the FAST choice). Benchmarking the candidates and storing the
winner per signature is the perf database's job; this module only holds the data and the
heuristic.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace

import torch

from fusionplan.errors import BadParmError


@dataclass(frozen=True)
class ConvConfig:
    block_m: int  # output pixels per tile
    block_n: int  # output channels per tile
    block_k: int  # input channels per step of the reduction
    group_m: int  # tiles along M that share a column of weights (L2 reuse)
    num_warps: int
    num_stages: int
    split_k: int = 1  # programs that share a tile's reduction (partials summed by the last one)
    consumers: int = 1  # computing warpgroups taking a program's tiles in turn (gluon-gemm: 2, ping-pong)


@dataclass(frozen=True)
class PointwiseConfig:
    block_p: int  # pixels per tile
    block_c: int  # channels per tile
    num_warps: int


#: Small tiles: Triton's interpreter runs tile by tile in numpy.
CONV_INTERPRETER = ConvConfig(32, 32, 16, 4, 4, 1)
POINTWISE_INTERPRETER = PointwiseConfig(16, 16, 4)

CONV_CANDIDATES: list[ConvConfig] = [
    ConvConfig(128, 128, 64, 8, 8, 3),
    ConvConfig(128, 64, 64, 8, 4, 4),
    ConvConfig(64, 128, 64, 8, 4, 4),
    ConvConfig(64, 64, 64, 8, 4, 4),
    ConvConfig(128, 128, 32, 8, 8, 4),
    ConvConfig(128, 64, 32, 8, 4, 4),
    ConvConfig(64, 64, 32, 8, 4, 4),
    ConvConfig(64, 32, 32, 8, 4, 4),
    ConvConfig(32, 32, 16, 8, 4, 2),
]


def _pow2_at_least(n: int, lo: int, hi: int) -> int:
    p = lo
    while p < n and p < hi:
        p *= 2
    return p


def conv_heuristic(
    m: int,
    k_per_group: int,
    c_per_group: int,
    dtype: torch.dtype,
    interpret: bool,
    groups: int = 1,
    taps: int = 9,
) -> ConvConfig:
    """A configuration for an implicit GEMM of M output pixels, K/groups columns, C/groups depth.

    From H100 measurements of the ResNet-50 layers (bench/NOTES.md): 128x64 tiles when there are
    many output pixels, 64-row tiles when there are few; 3 pipeline stages (``CONV_STAGES``). Grids
    that would leave most multiprocessors idle (batch 1) take ``SMALL_GRID_TILE`` tiles
    (``SMALL_GRID_TILE_1X1`` for filters of one tap) with 4 stages, and split their reduction.
    """
    if interpret:
        return CONV_INTERPRETER
    wide = dtype in (torch.float16, torch.bfloat16)
    block_k = _pow2_at_least(c_per_group, 16, 64 if wide else 32)
    block_n = _pow2_at_least(k_per_group, 16, 64 if m >= 50_000 else 128)
    block_m = 128 if m >= 50_000 else 64
    stages = CONV_STAGES
    small_tiles = [SMALL_GRID_TILE, SMALL_GRID_TILE_1X1] if taps == 1 else [SMALL_GRID_TILE]
    for small in small_tiles:  # smaller tiles while the grid stays small
        if -(-m // block_m) * -(-k_per_group // block_n) * groups >= SMALL_GRID_PROGRAMS:
            break
        block_m, block_n, stages = small[0], min(block_n, small[1]), 4
    return ConvConfig(block_m, block_n, block_k, 8, 4, stages if wide else 3)


#: Pipeline stages of triton-conv's 16-bit tiles (fp32: 3). Three stages of a 64x128 tile take 72 KB
#: of shared memory, so three programs share a multiprocessor where four stages let two: H100, fp16
#: NHWC, batch 32 (`scripts/tile_sweep.py --solver triton-conv`), every layer faster, most where the
#: grid then fits one wave (392 programs: r50_06 30.1 -> 22.2 us, r50_10 30.0 -> 22.3; r50_08 36.8 ->
#: 30.9, r50_02 33.5 -> 29.8); NCHW within 3 % either way.
CONV_STAGES = 3

#: Below this many programs of the default tiles, triton-conv takes SMALL_GRID_TILE tiles (more
#: programs, smaller partial sums when the reduction is split). H100, fp16, batch 1 (GPU time):
#: r50_18 > 10 -> 9.8 us, r50_16 -> 7.9, r50_12 -> 8.0, r50_02 7.5 -> 6.5 (bench/NOTES.md).
#: At batch 32 every ResNet-50 grid has 100 programs or more: unchanged. 1x1 filters (few steps
#: to split) whose 32x64 grid is still small take 32x32 tiles: r50_09 6.5 -> 4.4 us, r50_17 8.0 ->
#: 6.5, r50_19 6.6 -> 4.5, r50_20 8.1 -> 6.6, r50_21 8.0 -> 6.6; those with 98 programs or more of
#: 32x64 lost 0.3-1.1 us on 32x32 (r50_07, r50_08, r50_11), as 3x3 layers did (0.5-1 us).
SMALL_GRID_PROGRAMS = 66
SMALL_GRID_TILE = (32, 64)
SMALL_GRID_TILE_1X1 = (32, 32)


#: GEMM tiles (1x1 convolutions read through tensor descriptors): wide tiles, deep pipelines.
GEMM_CANDIDATES: list[ConvConfig] = [
    ConvConfig(128, 128, 64, 8, 8, 4),
    ConvConfig(128, 256, 64, 8, 8, 3),
    ConvConfig(128, 128, 64, 8, 4, 4),
    ConvConfig(128, 64, 64, 8, 4, 4),
    ConvConfig(64, 128, 64, 8, 4, 4),
    ConvConfig(64, 64, 64, 8, 4, 5),
    ConvConfig(128, 128, 32, 8, 8, 4),
    ConvConfig(64, 64, 32, 8, 4, 4),
]


def gemm_heuristic(m: int, n: int, k: int, dtype: torch.dtype, interpret: bool) -> ConvConfig:
    """A configuration for an [m, k] x [k, n] product: 128x128 tiles over two warp groups when
    they still fill the GPU (about 132 multiprocessors), smaller tiles when the product is small."""
    if interpret:
        return CONV_INTERPRETER
    wide = dtype in (torch.float16, torch.bfloat16)
    block_k = _pow2_at_least(k, 16, 64 if wide else 32)
    stages = 4 if wide else 3
    if wide and k <= GEMM_WIDE_MAX_DEPTH and n >= 256 and -(-m // 128) * -(-n // 256) >= 132:
        return ConvConfig(128, 256, block_k, 8, 8, 3)
    tiles_128 = -(-m // 128) * -(-n // 128)
    if tiles_128 >= 264 and n >= 128:
        return ConvConfig(128, 128, block_k, 8, 8, stages)
    if -(-m // 128) * -(-n // 64) >= 132:
        return ConvConfig(128, _pow2_at_least(n, 16, 64), block_k, 8, 4, stages)
    return ConvConfig(64, _pow2_at_least(n, 16, 64), block_k, 8, 4, stages)


#: Shallow 16-bit products (C up to this) with N >= 256 take 128x256 tiles: each input tile is read
#: once for twice the output channels, and with one or two reduction steps there is little to
#: pipeline (fp32 tiles that size need more shared memory than the H100 has).
#: H100, fp16, batch 32: r50_07 (C=128, K=512) 18.3 -> 16.7 us, r50_03 (C=64, K=256) 29.4 -> 28.8;
#: deeper ones lost (r50_05, C=256: 33.3 -> 38.5; r50_13, C=256: 13.7 -> 14.7).
GEMM_WIDE_MAX_DEPTH = 128

#: Multiprocessors a grid should keep busy (the H100 has 132).
SPLIT_K_TARGET = 132


def split_k_for(programs: int, steps: int, interpret: bool = False) -> int:
    """How many programs share each tile's reduction: grids of fewer programs than half the
    multiprocessors (a 7x7 layer at batch 1: 8 programs of 72 steps each) leave most of the GPU
    idle, so the reduction is split, in powers of two, while the grid stays within the
    multiprocessors and each part keeps at least 4 steps. The interpreter splits small shapes
    too (at most 4 ways), so that the tests cover the split path."""
    target, most = (8, 4) if interpret else (SPLIT_K_TARGET, 16)
    split = 1
    while programs * split * 2 <= target and steps // (split * 2) >= 4 and split < most:
        split *= 2
    return split


#: triton-conv's reduction over filter taps tests one bit per tap, set once per pixel, adds one
#: offset per tap to a per-pixel pointer, and carries its tap and channel block from step to step,
#: where each step divided its index, recomputed every pixel's input row and column and tested four
#: bounds, and drops the channel masks where the channel blocks divide C (sm_90 SASS of r50_02, fp16:
#: about 20 instructions per 16-byte input copy before; the loop 300 -> 144 instructions with
#: Triton 3.6, the GPU's (307 -> 176 with 3.9); Nsight Compute found the loop issue-bound, bench/NOTES.md
#: section 5). -1: where conv_tap_bits_pay says so; 0: never; 1: always (the bench's A/B switch).
CONV_TAP_BITS = -1

#: Output planes of at most this many pixels take tap bits in either layout and precision.
TAP_BITS_MAX_ANY_PLANE = 28 * 28


def conv_tap_bits_pay(taps: int, itemsize: int, channels_last: bool, out_plane: int) -> bool:
    """Whether triton-conv's reduction should test a bit per tap (CONV_TAP_BITS), from the H100's
    A/B columns (`fusionplan-bench --graph --tuning CONV_TAP_BITS=0,1`, bench/NOTES.md section 20):
    filters of several taps gain where the loop's address arithmetic bounds it, 16-bit
    channels-last (r50_02 fp16 30.3 -> 28.2 us at batch 32) and the 28x28 and smaller planes in
    either layout (batch 1: r50_12 29.7 -> 27.3, r50_22 27.5 -> 25.4; NCHW r50_12 58.4 -> 52.8,
    r50_22 62.5 -> 59.5); 56x56 planes of fp32 or NCHW data lose (TF32 r50_02 54.4 -> 55.3, NCHW
    r50_02 44.7 -> 49.0: more registers, 168 -> 212 in NCHW), and so do 1x1 filters (NCHW r50_08
    54.4 -> 60.7, r50_14 46.4 -> 52.6; batch 1 r50_09 26.9 -> 28.0)."""
    if CONV_TAP_BITS >= 0:
        return bool(CONV_TAP_BITS)
    return taps > 1 and ((itemsize == 2 and channels_last) or out_plane <= TAP_BITS_MAX_ANY_PLANE)


#: Below this many programs in its grid (ResNet-50 at batch 1: 8-98; at batch 32: 128 or more)
#: triton-conv is picked over triton-window: faster on every such layer measured (H100, fp16).
WINDOW_MIN_PROGRAMS = 100

#: Strided 1x1 convolutions of 16-bit data with at least this many output pixels run on triton-conv:
#: with 3-stage tiles (``CONV_STAGES``) it measured faster than windows (H100, fp16, batch 32:
#: r50_08 29.7 against 38.9 us, r50_14 22.3 against 26.5), not on 7x7 outputs (1568 pixels: r50_20
#: 26.2 against 19.0). Strided 3x3 layers stay with windows, which read every stride class in one
#: loop (r50_06 21.1 against 22.2, r50_12 19.9 against 26.7).
WINDOW_STRIDED_1X1_MAX_PIXELS = 4096

#: Strided filters of several taps with at least this many output pixels run on triton-conv where
#: it tests a bit per tap (conv_tap_bits_pay: 16-bit data): faster than both window kernels in the
#: H100's fp16 and bf16 suites (bench/NOTES.md section 20; r50_06, 25088 pixels: fp16 21.9 us
#: against 22.9 for gluon-window, bf16 22.2 against 23.2; before tap bits triton-conv took 23.7).
#: The strided 3x3 layers of 6272 pixels and fewer stay with windows (r50_12 23.2 against 18.8).
WINDOW_STRIDED_TAPS_MAX_PIXELS = 16384

#: 1x1 filters on fp32 data with this many output pixels or more run on triton-conv rather than
#: gluon-window's TF32 products (H200, batch 32: r50_09, 25088 pixels, 27.5 us against 24.4).
GLUON_TF32_1X1_MAX_PIXELS = 16384

#: fp32 data (TF32 products) in gluon-window's windows of this many pixels or more runs on
#: triton-window or triton-conv. 256 (28x28 outputs: 16x16 windows over two warpgroups) until its
#: epilogue ran in the accumulator's layout (GLUON_WINDOW_MMA_EPILOGUE): two TF32 suites had
#: triton-window faster there (bf16-tf32-5 and -6: r50_10 36.9-37.1 us against 39.4-40.2, r50_06
#: 48.2-48.7 on triton-window and triton-conv against 51.4-51.7). With that epilogue the next TF32
#: suite's columns (tf32-graph-13, every solver forced side by side) turned both: r50_10 34.5 on
#: gluon-window against 36.9 on triton-window, r50_06 47.6 against 48.1 on triton-conv and 49.0 on
#: triton-window. Confirmed by the A/B (`fusionplan-bench --precisions tf32 --layers r50_06,r50_10
#: --graph --tuning GLUON_TF32_MAX_WINDOW=256,512`, bench/results/2026-11-21-h100-tapbits-1/): r50_06
#: 47.8 -> 46.9 and 48.1 -> 45.9 us, r50_10 39.1 -> 36.4 and 39.5 -> 36.3. No window (at most 256
#: pixels) defers now.
GLUON_TF32_MAX_WINDOW = 512

#: gluon-gemm's tiles of fewer pixels x channels than this (the cost model's pick for small grids:
#: 16x64 to 96x64 at batch 1, 64x128 and up at batch 32) defer: small problems are bound by the
#: ring's fill, the epilogue and the host (a launch with tensor descriptors costs 19-21 us of host
#: time against 13 for pointers, H200), where triton-conv's small-grid tiles measured fastest at
#: batch 1, host time included (bench/NOTES.md, section 13); gluon-gemm is not measured there.
GLUON_GEMM_MIN_TILE = 64 * 128

#: 1x1 layers that need more than one wave of gluon-gemm's programs stay on it, with two computing
#: warpgroups taking 128 x 128 tiles in turn (ping-pong), from this many reduction steps, by
#: (element bytes, output channels at least): the smallest entry that applies.
#: - 16-bit (steps of 64 channels; H200, fp16, batch 32, warm L2): r50_11 (8 steps) 14.6 us against
#:   16.1 for triton-gemm; r50_13 (4 steps, K=1024) 11.2 against 11.4 (H100: 10.8 against 11.7);
#:   slower at 2 and 1 (r50_07 15.9 against 13.5, r50_03 27.1 against 21.9). The 4-step layers of
#:   64 and 128 output channels (r50_04, r50_05: a tile's 128 channels are all or twice K) are not
#:   measured with it.
#: - fp32, TF32 products (steps of 32 channels; H100, batch 32, warm L2, against triton-conv):
#:   r50_13 23.6 us against 27.4, r50_11 35.9 / 43.9, r50_05 63.4 / 66.2, r50_04 52.4 / 55.3, r50_07
#:   37.7 / 39.9, strided r50_14 32.9 / 42.0 and r50_08 39.7 / 52.6 (one warpgroup lost on most:
#:   r50_08 55.3, r50_07 45.5); at 2 steps triton-conv stays faster (r50_03 66.2 against 69.4, r50_01
#:   24.5 against 28.2).
GLUON_GEMM_PINGPONG_MIN_STEPS = {(2, 0): 8, (2, 256): 4, (4, 0): 4}

#: gluon-gemm's epilogue runs the chain in the accumulator's own layout and changes only the
#: 16-bit output's layout for the stores (a quarter of the fp32 accumulator's shared memory, in
#: Triton 3.6 and 3.9 for sm_90: 8 KB against 64 KB for 128 x 128) when True; else the fp32
#: accumulator's layout changes first. Measured faster on every layer tried (H100, fp16 CBNA, batch
#: 32, same tiles and stages: r50_07 16.9 -> 16.0 us, r50_03 28.3 -> 26.0, r50_13 12.4 -> 11.9,
#: r50_11 15.3 -> 14.8, r50_15 9.7 -> 9.4, r50_17 13.6 -> 13.1); the shared memory it frees holds
#: more stages beside persistent programs' epilogues (gluon_gemm.gemm_stages).
GLUON_GEMM_MMA_EPILOGUE = True
#: With GLUON_GEMM_MMA_EPILOGUE, fp32 output (TF32 and fp32 plans) is stored straight from the
#: accumulator's layout: each thread's two neighbouring channels as one 8-byte store, four threads
#: writing 32 contiguous bytes (whole sectors), instead of through a layout change in shared memory
#: (the whole fp32 tile: 16-64 KB per warpgroup, which persistent rings then get as another stage).
#: Measured in the TF32 bench's A/B columns (H100, batch 32, CBNA, rotated inputs): r50_07 37.6 ->
#: 28.2 us, r50_13 24.4 -> 19.0, r50_19 21.6 -> 17.0, r50_17 28.3 -> 24.1, r50_11 36.0 -> 32.4,
#: r50_15 18.6 -> 16.8, r50_21 17.0 -> 16.2; even on the 56x56 layers (r50_04 51.9 / 51.3, r50_05
#: 62.9 / 63.6), which go to triton-gemm (TF32_GEMM_MIN_PIXELS).
GLUON_GEMM_FP32_ACC_STORES = True
#: Tiles of fewer pixels than this (gluon-gemm: the first part; gluon-window: the window) store by
#: pointer even where TMA could: the A/B of H100, batch 32, CBNA, 5 rounds
#: (`--tuning GLUON_GEMM_TMA_STORE=0,1`, `GLUON_WINDOW_TMA_STORE=0,1`) had TMA stores faster from
#: 128 pixels (fp16 / bf16: r50_19, 208 pixels, 11.29 -> 10.87 / 10.80 -> 10.45 us; r50_20, 256:
#: 16.65 -> 16.36 / 16.26 -> 16.08; r50_09 and r50_17, 192: 1.0-1.5 %; r50_10, 256-pixel windows,
#: and r50_12, 128: 0.3-1.8 %) and slower below (r50_21, 64 pixels: 9.89 -> 10.12 / 10.27 -> 10.44;
#: r50_15, 96: 10.61 -> 10.74; r50_16's 64 x 256 windows 0.7-0.9 %; r50_18 and r50_22 within 0.5 %):
#: the store's wait for its tile's read delays a small tile's end more than the layout change it saves.
TMA_STORE_MIN_PIXELS = 128
#: gluon-gemm's persistent programs store by TMA (each computing warpgroup's output tile in a buffer
#: of its own beside the ring, which gives up a stage for them) only for tiles of flat rows with at
#: most this many reduction steps, where a warpgroup's epilogue outlasts the other's products: the
#: A/B (H100, batch 32, CBNA, 5 rounds, `--tuning GLUON_GEMM_TMA_STORE=0,1`) had r50_13 (4 steps of
#: 128 x 128 in turn) 11.51 -> 10.06 us fp16, 11.58 -> 10.28 bf16, and the longer or strided ones
#: slower (r50_11, 8 steps: 18.04 -> 18.28; r50_14, strided, 8: 17.11 -> 17.53 bf16; r50_08,
#: strided, 4: 20.10 -> 20.62).
GLUON_GEMM_PERSISTENT_TMA_MAX_STEPS = 4

#: gluon-gemm reads packed NCHW planes by asynchronous copies from four copying warps into the
#: operand's swizzled rows, each thread's arrival on the stage's barrier, the computing warpgroup's
#: proxy fence after its wait (gluon-stem's input rows alike), the batch's pixels flat:
#: gluon_gemm.plane_copies. 1: planes that start inside 16-byte units (14x14 fp16: 392 bytes, no
#: tensor boxes; 8-byte copies); 2: planes of whole 16-byte units too, in place of the boxes (no
#: image padded to whole tiles; 16-byte copies, no TMA stores) where the output has at most
#: GLUON_GEMM_COPY_MAX_WIDENING times the input's channels. H100, batch 32, CBNA, fp16 / bf16
#: (bench/results/2026-11-25-h100-plane-copies-36/ab-plane-copies.csv): r50_13 19.0 / 18.7 us ->
#: 16.8 / 16.6 (from triton-gemm-nchw), r50_15 15.3 / 15.4 -> 13.4 / 13.2, r50_11 20.6 / 20.3 ->
#: 19.3 / 19.1 (from the boxes), r50_05 32.7 / 32.4 -> 30.9 / 30.7, r50_04 27.0 / 27.0 -> 25.8 /
#: 25.6, r50_01 12.3 / 12.6 -> 11.6 / 11.6; wider outputs slower (ab-copies-all.csv): r50_07 15.9 /
#: 16.1 -> 16.3 / 16.4, r50_03 24.6 / 24.6 -> 24.9 / 24.5 (gluon_gemm.copies_defer_why has the rest).
GLUON_GEMM_PLANE_COPIES = 2
#: Lanes of a warp along a plane's pixels in gluon-gemm's 8-byte pointer stores of channel planes
#: (14x14 planes: 392-byte rows, 8-byte aligned; the other lanes along the channels, 4 pixels a
#: thread). With 4 lanes a warp stored 32 bytes of each of 8 channels' planes, each piece across two
#: 32-byte sectors; with 16, 128 bytes of each of 2. H100, NCHW, batch 32, CBNA (`fusionplan-bench
#: --layers r50_13,r50_15 --layouts NCHW --tuning GLUON_GEMM_PLANE_STORE_LANES=8,16,32`,
#: bench/results/2026-11-25-h100-carveout-37/ab-store-lanes.csv): r50_13 16.7 us at 4 lanes, 13.9 at
#: 8, 12.6 at 16, 12.8 at 32; r50_15 13.3 / 12.8 / 12.7 / 12.6. 16-byte stores keep 4 lanes (64 bytes
#: of each of 8 planes, aligned; the 56x56 and 28x28 layers within 0.4 us either way).
GLUON_GEMM_PLANE_STORE_LANES = 16
#: Copied planes of whole 16-byte units (GLUON_GEMM_PLANE_COPIES 2) where the output has at most this
#: many times the input's channels (r50_11's 0.5, r50_01's 1; not r50_03's or r50_07's 4).
GLUON_GEMM_COPY_MAX_WIDENING = 2
GLUON_GEMM_PAIRS_MAX_WIDENING = 0.25
#: Shared memory of a program reading copied planes by 8-byte copies (gluon_gemm.copies_through_l1)
#: at most, as gluon_gemm.gemm_stages counts it (the ring, and beside it an estimate of the
#: epilogue's scratch, which NCHW output's layout change exceeds by up to 16 KB: r50_13 takes
#: 180 KB). Such copies land in L1 on their way, and Triton gives every kernel of over 48 KB of
#: shared memory the largest carve-out (28 KB of L1 left on an H100): the copies in flight then
#: wait for L1, whatever the ring's depth. Their kernels take their carve-out fitted to their shared
#: memory (launch.Launcher's fit_carveout), the rest L1. H100, fp16 (ab-copy-carveout.csv there):
#: r50_15 17.4 us with the largest carve-out (7 stages), 13.7 within 164 KB (5 stages, 92 KB of
#: L1), 14.2 within 132 KB (4); r50_13 17.9 / 16.7 / 16.8; r50_17 26.0 / 20.7 / 21.9.
GLUON_GEMM_COPY_SHARED_BYTES = 164 * 1024
#: 8-byte copied planes (GLUON_GEMM_COPY_SHARED_BYTES) in tiles of more pixels than this defer to
#: triton-gemm-nchw. r50_17's 192-pixel tiles measured 20.7 / 20.1 us there against 20.2 / 19.6
#: (fp16 / bf16) before their stores took GLUON_GEMM_PLANE_STORE_LANES' 16 lanes, 18.0 / 18.0
#: against 19.2 / 19.2 after (bench/results/2026-11-25-h100-carveout-37/ab-r50_17-copies.csv).
GLUON_GEMM_COPY_L1_MAX_PIXELS = 192

#: gluon-window's epilogue as gluon-gemm's (GLUON_GEMM_MMA_EPILOGUE, GLUON_GEMM_FP32_ACC_STORES):
#: the chain runs in the accumulator's own layout, 16-bit output changes layout only for its stores
#: and fp32 output is stored from the accumulator's layout, where False changes the whole fp32
#: accumulator's layout through shared memory first. The bench's A/B columns (H100, batch 32, CBNA,
#: bench/results/2026-11-21-h100-window-epilogue-1/): TF32 r50_12 35.8 -> 34.0 us, r50_16 33.1 ->
#: 31.3, r50_18 36.4 -> 35.6, r50_22 36.6 -> 35.8; fp16 0.5-1.6 % on all six window layers (r50_10
#: 19.3 -> 19.0, r50_06 23.1 -> 22.9).
GLUON_WINDOW_MMA_EPILOGUE = True


GLUON_ROWS_FILTER_REGS = 160
GLUON_ROWS_MIN_WIDTH = 32
GLUON_ROWS_RING_BYTES = 192 * 1024


GLUON_STEM_SLOTS = 16
GLUON_STEM_SMEM_BYTES = 192 * 1024
#: gluon-stem: the filter's blocks requested before the wait for the kernel before it (their
#: load overlaps that kernel's end under programmatic dependent launch), else by the loading
#: partition.
GLUON_STEM_FILTER_FIRST = True
#: Registers of gluon-stem's loading warps on channel-plane input (gluon_stem.stem_registers: the
#: second computing warpgroup takes as many fewer; channels-last input keeps LOAD_REGS' 40).
GLUON_STEM_PLANE_LOAD_REGS = 64


#: Shared memory of gluon-window's pipeline stages at most (the epilogue's layout change and the
#: barriers take the rest of the 227 KB).
GLUON_WINDOW_RING_BYTES = 160 * 1024

GLUON_NCHW_MAX_PLANE = 784
#: The same for fp32 data (TF32 products): triton-conv stays faster on 28x28 planes (r50_10 55.8 us
#: against 61.1, r50_06 82.2 against 83.8), gluon-nchw on 14x14 and 7x7 (r50_16 66.0 -> 55.2, r50_12
#: 87.1 -> 82.2, r50_22 66.5 -> 57.8, r50_21 41.4 -> 32.1, r50_19 37.9 -> 34.1, r50_18 95.0 -> 92.6).
GLUON_NCHW_FP32_MAX_PLANE = 196
GLUON_NCHW_1X1_MAX_PLANE = 49
#: Strided 1x1 filters of fp32 data (TF32 products) on output planes of at most this many pixels
#: (16-bit data: gluon-nchw-regs' rule; triton-gemm-nchw). H100, NCHW, batch 32, CBNA, with the
#: carve-out fitted (FIT_CARVEOUT; `fusionplan-bench --layers r50_08,r50_14,r50_20 --layouts NCHW
#: --precisions tf32`, bench/results/2026-11-25-h100-carveout-37/tf32-strided-1x1.csv, its solver
#: columns): triton-conv against gluon-nchw r50_08 (28x28 outputs) 80.6 / 73.3 us, r50_14 75.4 /
#: 54.6, r50_20 85.8 / 60.1.
GLUON_NCHW_FP32_STRIDED_1X1_MAX_PLANE = 784
GLUON_NCHW_MIN_PROGRAMS = 64


GLUON_NCHW_SPLIT_MIN_DEPTH = 2048

#: Bytes of a pixel's channels in one of gluon-nchw's reduction steps for strided convolutions (128
#: for the others; gluon-nchw-regs for strided filters of several taps): half-size steps (32 fp16
#: channels) let the ring hold 6 stages of a 64 x 256 tile where 128-byte steps leave it 4. H100,
#: fp16 CBNA, batch 32, warm L2 (bench/NOTES.md section 26): r50_18 45.7 -> 37.8 us, r50_12 36.3 ->
#: 30.3, r50_06 (gluon-nchw-regs) 45.3 -> 35.7; stride 1 loses (r50_22 31.9 -> 35.1, r50_16 25.8 ->
#: 28.5, r50_10 27.2 -> 30.4).
GLUON_NCHW_STRIDED_STEP_BYTES = 64

#: Shared memory of gluon-nchw's pipeline stages at most (the epilogue's layout change and the
#: barriers take the rest of the 227 KB).
GLUON_NCHW_RING_BYTES = 160 * 1024
#: The same for strided convolutions of 16-bit data (gluon-nchw's ring, gluon-nchw-regs' weights
#: ring): with the carve-out fitted to the kernel (FIT_CARVEOUT), a shallower ring leaves more L1
#: to the gathered input. H100, NCHW, batch 32, CBNA, against 160 KB (`fusionplan-bench --layers
#: r50_06,r50_08,r50_12,r50_14,r50_18,r50_20 --layouts NCHW --tuning
#: GLUON_NCHW_STRIDED_RING_BYTES=65536,131072,163840`, bench/results/2026-11-25-h100-carveout-37/):
#: fp16 r50_12 31.8 -> 28.3 us (4 stages of 64 x 256 against 6), r50_20 30.0 -> 29.0 (3 against
#: 4), r50_18 38.3 -> 37.3; 64 KB slower (35.9, 37.6, 45.0); r50_06 unchanged (its ring is
#: smaller). TF32 keeps 160 KB (r50_18 54.9 against 56.6 at 96 KB).
GLUON_NCHW_STRIDED_RING_BYTES = 96 * 1024

#: gluon-nchw's gathering side, where set (0: by the tile, solvers/gluon_nchw.py GATHER_SHAPES):
#: warps of a gathering partition (4 or 8), partitions taking the reduction's steps in turn (1 to
#: 3; each stage's proxy fence waits for its partition's loads in flight, so partitions, not
#: prefetch depth, put more loads in flight), and how many of its steps ahead a partition's loads
#: run (1 to 3).
GLUON_NCHW_GATHER_WARPS = 0
GLUON_NCHW_GATHERERS = 0
GLUON_NCHW_PREFETCH = 0
#: A reduction split in two: the tile's last program adds the other part's fp32 partial to its own
#: accumulator (exactly commutative) rather than loading both in order; 0: both loaded. H100 A/B
#: (fp16 and bf16, CBNA and CBA, 5 rounds; bench/NOTES.md section 49): r50_18 3-4 % faster, r50_22
#: 4-6 %.
GLUON_NCHW_PAIR_SUM = 1

#: gluon-nchw's gathering partition requests a stage's weights (TMA) as soon as the stage is free,
#: before storing its gathered input, rather than after the stores, the proxy fence and the
#: partition's barrier: the weights' L2 round trip then runs under them rather than after them (the
#: fence itself costs 1-4 %, bench/NOTES.md section 49, not the wait for every load in flight that
#: section 27 supposed). H100 A/B (CBNA, batch 32, CUDA-graph replay; section 27): TF32 r50_12 58.3
#: -> 49.4 us, r50_16 43.2 -> 38.8, r50_22 53.2 -> 49.4; fp16 within the runs' spread (r50_21 22.9
#: -> 21.9).
GLUON_NCHW_EARLY_WEIGHTS = True


#: The reduction order of gluon-nchw and gluon-nchw-regs: the filter taps of a channel block one
#: after another (their shifted reads of the same input lines meet in L1), rather than the channel
#: blocks of a tap. H100 A/B (fp16, batch 32, CBNA, CUDA-graph replay; bench/NOTES.md section 22):
#: gluon-nchw r50_18 57.1 -> 45.9 us, r50_12 48.1 -> 46.4, r50_16 34.4 -> 33.5, r50_22 35.7 / 36.1;
#: gluon-nchw-regs r50_10 33.1 -> 30.3, r50_06 53.1 -> 49.4, r50_22 44.8 -> 40.5; TF32 on gluon-nchw
#: r50_18 92.5 -> 75.8, r50_16 55.3 -> 49.0, r50_22 57.5 -> 53.2.
GLUON_NCHW_TAPS_INNER = True

GLUON_ROW_PAIRS_MIN_PLANE = 784
GLUON_ROW_PAIRS_PREFETCH = 2
GLUON_ROW_PAIRS_RESIDENT_BYTES = 0
#: Whether the computing warps run the proxy fence between a stage's gathered stores and wgmma,
#: after their wait (as gluon-gemm's copied planes), rather than the gathering warps before
#: their arrival.
GLUON_ROW_PAIRS_CONSUMER_FENCE = 1
#: Whether gluon-row-pairs' gathers go through asynchronous copies into shared memory (a group a
#: step, PREFETCH groups in flight) rather than loads into registers (whose waits share one
#: scoreboard: waiting for a step's values waits for every step issued after it).
GLUON_ROW_PAIRS_STAGED = 1
#: The most output pixels a thread of gluon-row-pairs stores at once into packed NCHW planes (4 or
#: 2 where the output rows are whole runs of them; 1: one a store).
GLUON_ROW_PAIRS_OUT_VEC = 4
#: Warps of a third partition of gluon-row-pairs that stores each tile's output into NCHW planes
#: from shared memory while the computing warps run the next tile's products (0: the computing
#: warps store it themselves, after a layout change through shared memory, between two tiles'
#: products). H100, batch 32, CBNA (bench/NOTES.md section 53): r50_08 32.9 us with 2 against 33.7
#: with 0 and 33.0 with 4 (fp16; bf16 33.2 against 34.1); 4 leave the gathering warps 128
#: registers, and they spill.
GLUON_ROW_PAIRS_STORE_WARPS = 2
#: Whether gluon-row-pairs' computing partition loads the chain's per-channel parameters once,
#: before its tiles (a program keeps one channel block), rather than in each tile's epilogue: beside
#: its storing partition and where the compiler keeps them in registers without spills
#: (solvers.gluon_row_pairs.pairs_hoist_channels, GluonRowPairsKernel.hoist_channels). H100, Triton
#: 3.6, with the storing partition (bench/NOTES.md section 53): r50_08 32.05 us against 33.15 (fp16),
#: 32.46 against 33.27 (bf16); gluon-plane-chunks' r50_19 no faster (14.50 against 14.43), so that
#: kernel loads them in each epilogue.
GLUON_ROW_PAIRS_HOIST_CHANNELS = 1
#: Whether gluon-row-pairs' computing partition requests each stage's weights by TMA as it frees the
#: stage (streamed weights), rather than the gathering partition as it fills it: one barrier of the
#: gathering warps fewer a step (sm_90: 4 -> 3), two of the computing warps more (1 -> 3). H100, batch 32,
#: CBNA, NCHW (bench/NOTES.md section 54): r50_08 31.05 us against 31.33 (fp16), 31.66 against 32.05
#: (bf16); gluon-plane-chunks' r50_19 slower (15.07 against 14.18), so that kernel never does.
GLUON_ROW_PAIRS_WEIGHTS_BY_MMA = 1

#: gluon-plane-chunks defers where its tiles fill less than this share of the multiprocessors (it
#: does not split its reduction): r50_21's 32 tiles measured 34.2 us (64 of 128 channels 25.9)
#: against 18.0 on gluon-nchw; 128 tiles of one image by 128 channels 16.2 us with the input warm
#: in L2 (scripts/tile_sweep.py) but 19.2-20.9 from inputs rotated out of L2 as the bench times
#: them, against 18.3-18.6 (bench/NOTES.md section 52).
GLUON_PLANE_CHUNKS_MIN_FILL = 0.75
#: Warps of gluon-plane-chunks' gathering partition (4 or 8; the computing warps keep 168 registers,
#: 8 gathering warps 88 each). r50_19: 4 and 8 within 3 % at every depth (13.95-15.12 us).
GLUON_PLANE_CHUNKS_GATHER_WARPS = 4
#: Whether gluon-plane-chunks' runs come by asynchronous copies into shared memory (1) or by loads
#: into registers (0), before the gather. r50_19 (32-channel steps): loads 13.95-14.58 us, copies
#: 14.46-15.12 (the copies add a write and a read of shared memory before the gather's own pass).
GLUON_PLANE_CHUNKS_STAGED = 0
#: Whether gluon-plane-chunks takes each operand row from the runs by shifts in registers (each
#: 8-slot group: its aligned unit, the next unit from the next thread, shifted by the plane's offset
#: in its unit; no pass through shared memory) rather than a gather through shared memory, where
#: the plane allows (chunks_shifted) and the input is 16-byte aligned. H100, batch 32, CBNA, NCHW
#: (bench/NOTES.md section 54): r50_19 13.50 / 13.92 us against 14.05 / 14.22 (fp16, two runs),
#: 13.82 against 14.25 (bf16).
GLUON_PLANE_CHUNKS_SHIFTED = 1
#: Whether gluon-plane-chunks takes tiles of one image by at most 128 output channels where its
#: tiles of two images by 256 fill less than GLUON_PLANE_CHUNKS_MIN_FILL of the multiprocessors and
#: the smaller give more (r50_21: 128 tiles against 32). Off: with the gather through shared memory
#: they measured 16.2 us warm but 19.2-20.9 from rotated inputs against 18.1-18.6 on gluon-nchw
#: (bench/NOTES.md section 52); with the shifts (rotated inputs, 5 rounds; section 55) 18.89 against
#: 18.73 us (H100, fp16), 18.15 against 18.01 (bf16); on an H200 19.28 against 18.30 and 18.74
#: against 17.84: `fusionplan-bench --layers r50_21 --layouts
#: NCHW --precisions fp16,bf16 --modes CBNA --graph --rounds 5 --baselines cudnn --tuning
#: GLUON_PLANE_CHUNKS_IMAGE_TILES=0,1`.
GLUON_PLANE_CHUNKS_IMAGE_TILES = 0

GLUON_HALO_MAX_PLANE = 784
GLUON_HALO_STRIDED_MAX_PLANE = 49
GLUON_HALO_BLOCK_N = 128
GLUON_HALO_STAGES = 4
#: Halo buffers a program cycles through: the gathering partition runs BUFFERS - 1 channel blocks
#: ahead of the products. Three measured no faster (r50_18 22.5 us against 22.5, r50_22 18.4 / 18.4,
#: r50_16 16.6 / 16.6, r50_10 21.1 / 20.7; bench/NOTES.md section 57).
GLUON_HALO_BUFFERS = 2

GLUON_NCHW_REGS_MIN_PLANE = 784
#: It also takes strided 1x1 filters on output planes of at most this many pixels: r50_20 (7x7
#: outputs) 49.4 us against 56.3 for triton-conv (H100, fp16 CBNA, batch 32; 49.5 / 56.5 in an
#: earlier suite); on larger planes triton-conv stayed faster (r50_14 45.8 / 50.4, r50_08 54.9 / 63.1).
GLUON_NCHW_REGS_STRIDED_1X1_MAX_PLANE = 49
#: Its weights ring's stages (16 KB each at 128 output channels, 2 or more: the weights run
#: stages - 1 steps ahead; 3, 4, 6 measured within 2 %) and how many reduction steps ahead its
#: loads run (1 to 3; within 3 % of one another).
GLUON_NCHW_REGS_STAGES = 4
GLUON_NCHW_REGS_AHEAD = 2
#: gluon-nchw-regs' loop takes AHEAD + 1 steps a turn, each step's values in registers of their own
#: (as gluon-nchw's gathering loop: handing values on from step to step copies them, and the copies
#: wait for the loads in flight), where a thread's share of the accumulator is at most
#: GLUON_NCHW_REGS_UNROLLED_MAX_ACC registers; 0: one step a turn everywhere. H100 A/B (fp16 and bf16,
#: batch 32, CBNA, 5 rounds; bench/NOTES.md section 49): 64 x 128 tiles (64 registers) r50_06 33.0 ->
#: 30.2 us, r50_10 28.2 -> 26.8; 128 x 256 tiles of 8 warps (128 registers, 255 a thread) slower,
#: r50_19 17.4 -> 17.8, r50_20 28.5 -> 30.3.
GLUON_NCHW_REGS_UNROLLED = 1
GLUON_NCHW_REGS_UNROLLED_MAX_ACC = 64
#: Its weights ring's stages for strided filters of several taps, whose steps are half as long
#: (GLUON_NCHW_STRIDED_STEP_BYTES; GLUON_NCHW_REGS_STAGES would give them twice the stages: as many
#: bytes): with the carve-out fitted (FIT_CARVEOUT), the shallower ring leaves L1 to the gathered
#: input. H100, fp16, batch 32, NCHW, input warm in L2 (`scripts/tile_sweep.py --layers r50_06
#: --layout NCHW --mode CBNA --batch 32 --tiles keep --tuning GLUON_NCHW_REGS_STAGES=2,3,4,6`,
#: where 2, 3 and 4 gave its ring 4, 6 and 8 stages; bench/results/2026-11-25-h100-carveout-37/
#: sweep-gathers.txt): r50_06 30.1 us at 4 stages, 32.0 at 6, 36.6 at 8; in the bench (cold L2,
#: ab-regs-strided-stages.csv) 33.7 us fp16 and 32.5 bf16 at 4 against 40.0 and 38.9 at 8.
GLUON_NCHW_REGS_STRIDED_STAGES = 4

#: fp32 data (TF32 products) of this many output pixels or more (1x1, stride 1) run on triton-gemm,
#: its weights read along the reduction ([K, C]: TF32 wgmma reads B only that way); fewer stay on
#: gluon-gemm or triton-conv. TF32 bench columns (H100, batch 32, CBNA, every solver forced side by
#: side): the 56x56 layers (100352 pixels) r50_01 21.2 us against 23.6 for triton-conv, r50_03 52.0
#: / 64.9, r50_04 48.1 / 51.3 for gluon-gemm, r50_05 60.4 / 63.6; the 28x28 layers (25088 pixels)
#: r50_07 34.8 against 28.2 for gluon-gemm, r50_09 33.8 / 29.7 for triton-conv, r50_13 23.5 / 19.0.
TF32_GEMM_MIN_PIXELS = 65536


#: triton-gemm-nchw's 16-bit tiles: NCHW_GEMM_PIXELS pixels of one image (two warpgroups, 3 stages
#: of 48 KB) by 128 output channels (64 where K <= 64), fewer pixels (one warpgroup, 4 stages) while
#: the grid has fewer than NCHW_GEMM_MIN_TILES tiles, and never more than the plane holds (rounded
#: up to a power of two). H100, fp16 CBNA, batch 32 (`tile_sweep.py --layout NCHW --solver
#: triton-gemm-nchw`), against 128 x 128 tiles of 8 warps: r50_13 22.9 -> 18.1 us, r50_09 15.4 ->
#: 12.7, r50_11 28.3 -> 24.2, r50_17 26.5 -> 21.1, r50_05 44.7 -> 41.7, r50_03 47.7 -> 43.5, r50_07
#: 27.6 -> 24.7; K=64 at 256 x 64: r50_01 15.3 (128 x 64) -> 14.3, r50_04 35.7 -> 32.6; r50_15 (64
#: tiles of 256 pixels: half the GPU idle) 128 x 128 13.9, 64 x 128 17.3; 7x7 planes 64 x 128.
NCHW_GEMM_PIXELS = 256
NCHW_GEMM_MIN_TILES = 66
#: Where the heuristic's tile is 256 pixels x 128 channels, the plan is stride 1 with at least 256
#: output channels and this many input channels (0: never), triton-gemm-nchw takes 128 x 256
#: instead (solvers/triton_gemm_nchw.py nchw_config): the same grid, each channel tile reading the
#: long reduction's input from L2 half as often. H100, fp16 CBNA, batch 32 (bench/NOTES.md sections
#: 25-26): r50_17 (C=1024) 22.5 -> 19.7 us, r50_11 (C=512) 23.5 -> 21.9 (bf16 23.2 -> 21.4); not
#: r50_13 (C=256 in 4 steps: 19.1 against 17.8, warm L2), nor K=128 (r50_09: half the tile idle,
#: 16.3 -> 21.4), nor the strided r50_14 (its 256 x 256 tile would lose half its pixels: 32.2 -> 39.0).
NCHW_GEMM_WIDE_N_MIN_C = 512
#: Strided plans read through boxes with the even columns kept first (NCHW_GEMM_STRIDED_EVEN_FIRST)
#: take tiles of this many output channels from NCHW_GEMM_STRIDED_WIDE_K of them: each channel tile
#: reads its input rows whole from L2 (the odd columns too), so wider tiles read them fewer times
#: (H100, fp16 CBNA, batch 32, 256 slots: r50_14 30.7 us against 46.9 at 128 channels, r50_08
#: 37.8 / 38.2; `scripts/tile_sweep.py --layout NCHW --solver triton-gemm-nchw`).
NCHW_GEMM_STRIDED_BLOCK_N = 256
NCHW_GEMM_STRIDED_WIDE_K = 512

#: NORMAL find's tiles for triton-gemm-nchw (pixels x channels; the heuristic's pick is timed too).
NCHW_GEMM_CANDIDATES: list[ConvConfig] = [
    ConvConfig(256, 128, 64, 8, 8, 3),
    ConvConfig(256, 64, 64, 8, 8, 3),
    ConvConfig(128, 128, 64, 8, 4, 4),
    ConvConfig(128, 128, 64, 8, 8, 4),
    ConvConfig(128, 64, 64, 8, 4, 4),
    ConvConfig(64, 128, 64, 8, 4, 4),
    ConvConfig(64, 64, 64, 8, 4, 4),
]


def nchw_gemm_plane(hw: int) -> int:
    """The most pixels a triton-gemm-nchw tile takes from a plane of ``hw``: rounded up to a power
    of two, at least 32."""
    return _pow2_at_least(hw, 32, 1 << 30)


def nchw_gemm_heuristic(hw: int, images: int, k: int, c: int, dtype: torch.dtype, interpret: bool) -> ConvConfig:
    """triton-gemm-nchw's tile for images of hw-pixel planes, C input and K output channels: a tile
    holds pixels of one image (at most the plane's, rounded up to a power of two, at least 32).
    32-bit data takes gemm_heuristic's tile with at most 128 channels (the solver defers it)."""
    plane = nchw_gemm_plane(hw)
    if interpret or dtype not in (torch.float16, torch.bfloat16):
        cfg = gemm_heuristic(images * hw, k, c, dtype, interpret)
        if cfg.block_n > 128:
            cfg = replace(cfg, block_n=128, num_stages=4)
        return replace(cfg, block_m=min(cfg.block_m, plane))
    block_n = 64 if k <= 64 else 128
    block_m = min(NCHW_GEMM_PIXELS, plane)
    while block_m > 64 and images * -(-hw // block_m) * -(-k // block_n) < NCHW_GEMM_MIN_TILES:
        block_m //= 2
    block_k = _pow2_at_least(c, 16, 64)
    wide = block_m > 128  # two warpgroups
    return ConvConfig(block_m, block_n, block_k, 8, 8 if wide else 4, 3 if wide else 4)


#: Below this many input channels triton-conv is picked over triton-window (H100: r50_02, C=64,
#: 42 vs 34 µs; C >= 128 layers 5-13 % faster as windows).
WINDOW_MIN_CHANNELS = 128

#: Window tiles (stride-1 convolutions read as input boxes): block_m pixels in a window of
#: ``window_shape`` (NORMAL find skips those whose window does not fit the image).
WINDOW_CANDIDATES: list[ConvConfig] = [
    ConvConfig(64, 128, 64, 8, 4, 4),
    ConvConfig(64, 128, 64, 8, 4, 3),
    ConvConfig(64, 64, 64, 8, 4, 4),
    ConvConfig(64, 64, 64, 8, 4, 3),
    ConvConfig(128, 128, 64, 8, 8, 3),
    ConvConfig(128, 128, 64, 8, 8, 4),
    ConvConfig(128, 128, 64, 8, 4, 3),
    ConvConfig(128, 64, 64, 8, 4, 4),
    ConvConfig(128, 64, 64, 8, 4, 3),
    ConvConfig(256, 128, 64, 8, 8, 3),
    ConvConfig(128, 256, 64, 8, 8, 3),
    ConvConfig(64, 64, 32, 8, 4, 4),
]


#: The most pixels of triton-window's fp32 (TF32) windows. Warm-L2 sweeps (H100, batch 32, CBNA,
#: bench/results/2026-11-21-h100-tf32-7/sweeps/) put 128-pixel windows ahead of 256-pixel ones by
#: 3-4 % (r50_06 42.3 against 43.7 us, r50_10 34.5 / 35.9); such margins have not always held with
#: the bench's rotated inputs, so 256 stays until its A/B columns say otherwise
#: (`fusionplan-bench --precisions tf32 --layers r50_06,r50_10 --tuning WINDOW_FP32_PIXELS=128,256`).
WINDOW_FP32_PIXELS = 256


def window_heuristic(
    m: int, k: int, c: int, out_hw: tuple[int, int], area: tuple[int, int, int], dtype: torch.dtype, interpret: bool
) -> ConvConfig:
    """The largest window (up to 256 pixels) that fits the images and still gives about one program
    per multiprocessor (120 of the H100's 132), 128 output channels, 64 input channels per step.
    H100, fp16, batch 32: r50_10 (28x28) 24.0 us with 16x16 windows against 28.9 with 64-pixel
    ones; r50_16 (14x14) 24.3 us with 8x8 windows and 128 channels against 43.2 with 64. Windows
    must fit in ``area`` (images, rows, columns); the output is ``out_hw``."""
    if interpret:
        return ConvConfig(min(16, largest_window(*area)), 16, 16, 8, 4, 1)  # small tiles for the interpreter
    wide = dtype in (torch.float16, torch.bfloat16)
    block_k = _pow2_at_least(c, 16, 64 if wide else 32)
    block_n = _pow2_at_least(k, 16, 128)
    oh, ow = out_hw
    images = m // (oh * ow)
    pixels = largest_window(*area, 256 if wide else WINDOW_FP32_PIXELS)
    while pixels > 64:
        tile_n, tile_h, tile_w = window_shape(*area, pixels)
        if -(-images // tile_n) * -(-oh // tile_h) * -(-ow // tile_w) * -(-k // block_n) >= 120:
            break
        pixels //= 2
    warps = 8 if pixels * block_n >= 256 * 128 else 4
    stages = (3 if pixels >= 256 else 4) if wide else 3
    return ConvConfig(pixels, block_n, block_k, 8, warps, stages)


def window_shape(images: int, oh: int, ow: int, pixels: int) -> tuple[int, int, int] | None:
    """The TILE_N x TILE_H x TILE_W output window (TILE_N images) of ``pixels`` (a power of two)
    pixels that computes the fewest pixels past ``images`` OH x OW images (28x28 takes 16x16
    windows, not 8x8 ones that compute 31 % more), or None when no such window fits inside them:
    tensor-descriptor boxes larger than the image gave wrong or unwritten outputs on the H100
    with Triton 3.6 (some shapes, not reproducibly; bench/NOTES.md, section 10). Windows span
    several images only where no window of one image fits (7x7 images: 4x4 windows of 4 images
    for 64 pixels). Ties go to the squarest."""
    shapes = []
    for tile_w in (4, 8, 16, 32):
        tile_h = 1
        while tile_h * tile_w <= pixels:
            if tile_w <= ow and tile_h <= oh and pixels == tile_h * tile_w:
                shapes.append((1, tile_h, tile_w))
            tile_h *= 2

    def cost(shape: tuple[int, int, int]) -> tuple[int, int]:
        _, tile_h, tile_w = shape
        computed = -(-oh // tile_h) * tile_h * -(-ow // tile_w) * tile_w
        return computed, abs(tile_h.bit_length() - tile_w.bit_length())

    if shapes:
        return min(shapes, key=cost)
    # several images: the largest window of one image that fits, as many images as make the pixels
    tile_h, tile_w = 1 << (min(oh, 32).bit_length() - 1), 1 << (min(ow, 32).bit_length() - 1)
    if tile_w < 4 or pixels % (tile_h * tile_w) or pixels // (tile_h * tile_w) > images:
        return None
    return pixels // (tile_h * tile_w), tile_h, tile_w


def largest_window(images: int, oh: int, ow: int, most: int = 256) -> int:
    """The most pixels (a power of two, at most ``most``) of a window that fits the images."""
    pixels = most
    while pixels > 1 and window_shape(images, oh, ow, pixels) is None:
        pixels //= 2
    return pixels


#: Stem tiles (few input channels, runs of input rows): block_m runs of pixels x block_n output
#: channels (block_k: the stretch length, which the plan fixes; group_m unused).
STEM_CANDIDATES: list[ConvConfig] = [
    ConvConfig(128, 64, 32, 1, 4, 4),
    ConvConfig(128, 64, 32, 1, 8, 4),
    ConvConfig(128, 64, 32, 1, 4, 3),
    ConvConfig(64, 64, 32, 1, 4, 4),
    ConvConfig(256, 64, 32, 1, 8, 3),
    ConvConfig(128, 128, 32, 1, 8, 3),
    ConvConfig(64, 128, 32, 1, 4, 4),
]


#: triton-stem joins a run's accumulators into one tile of neighbouring pixels before the epilogue
#: where the output's rows are contiguous along the pixels (NCHW), so that its stores write runs of
#: neighbouring pixels, where an epilogue per pixel of the run stores pixels PX apart (2-byte
#: stores, a sector written in pieces by PX instructions).
STEM_JOINED_EPILOGUE = True


def stem_heuristic(runs: int, pixels: int, k: int, stretch: int, interpret: bool) -> ConvConfig:
    """``runs`` runs of ``pixels`` output pixels, ``k`` output channels, ``stretch`` elements per
    step. The run's pixels have an accumulator each: their tiles hold at most 128 x 64 x 2 fp32
    values over 4 warps (more spilled registers on sm_90: runs of 4 pixels in 128-run tiles)."""
    if interpret:
        return ConvConfig(16, 16, stretch, 1, 4, 1)
    block_n = _pow2_at_least(k, 16, 64)
    block_m = 128 if runs >= 50_000 else 64
    while block_m > 16 and pixels * block_m * block_n > 2 * 128 * 64:
        block_m //= 2
    return ConvConfig(block_m, block_n, stretch, 1, 4, 4)


#: Depthwise tiles: block_m pixels x block_n channels (block_k, group_m unused); no pipelining.
DEPTHWISE_CANDIDATES: list[ConvConfig] = [
    ConvConfig(64, 64, 16, 1, 4, 1),
    ConvConfig(128, 32, 16, 1, 4, 1),
    ConvConfig(32, 128, 16, 1, 4, 1),
    ConvConfig(128, 64, 16, 1, 8, 1),
]


def depthwise_heuristic(interpret: bool) -> ConvConfig:
    return ConvConfig(16, 16, 16, 1, 4, 1) if interpret else DEPTHWISE_CANDIDATES[0]


FIND_MODES = ("FAST", "NORMAL")


def find_mode(requested: str | None = None) -> str:
    """FAST: the heuristic's configuration. NORMAL: benchmark the candidates once per signature."""
    mode = (requested or os.environ.get("FUSIONPLAN_FIND_MODE") or "FAST").strip().upper()
    if mode not in FIND_MODES:
        raise BadParmError(f"find mode {mode!r}: choose one of {', '.join(FIND_MODES)}")
    return mode


def find_config(
    solver: str,
    signature: object,
    device: str,
    candidates: list[ConvConfig],
    benchmark,
    db=None,
) -> ConvConfig:
    """NORMAL find mode: the stored winner for this signature if the perf database has a valid one,
    else benchmark every candidate (``benchmark(config)`` returns milliseconds, or raises when the
    configuration cannot run) and store the fastest."""
    from fusionplan.perfdb import default_db

    db = db or default_db()
    stored = db.get(solver, signature, device)
    if stored is not None:
        try:
            config = ConvConfig(**stored)
        except TypeError:  # an entry of another shape: ignored and replaced below
            config = None
        if config is not None and config in candidates:
            return config
    timings = {}
    for config in dict.fromkeys(candidates):
        try:
            timings[config] = benchmark(config)
        except Exception:  # does not fit this device (shared memory, registers): skipped
            continue
    if not timings:
        return candidates[0]
    best = min(timings, key=timings.get)
    db.put(solver, signature, device, dict(vars(best)), timings[best])
    return best


def pointwise_heuristic(channels_last: bool, channels: int, interpret: bool, plane: int) -> PointwiseConfig:
    """Tiles long along the contiguous axis: channels for NHWC, pixels for NCHW (the plane's
    ``plane`` pixels rounded up to a power of two)."""
    if interpret:
        return POINTWISE_INTERPRETER
    if channels_last:
        block_c = _pow2_at_least(channels, 16, 128)
        return PointwiseConfig(max(8192 // block_c, 16), block_c, 8)
    block_p = _pow2_at_least(plane, 16, 1024)
    return PointwiseConfig(block_p, min(4096 // block_p, _pow2_at_least(channels, 4, 256)), 8)


#: Pointwise chains over tensors dense in one element order (input, output and prior all contiguous
#: NCHW, or all channels-last NHWC) run as flat runs of POINTWISE_FLAT_BLOCK consecutive elements,
#: each element's channel computed from its index (the plane size and channel count are constants
#: of the kernel, so the division is a multiply and a shift). Why: every access is 16 bytes wide
#: whatever the plane. Measured (H100, fp16, batch 32, NA, ab-na.csv and ab-block.csv of
#: bench/results/2026-11-26-h100-pointwise-flat-39/): NCHW r50_19 31.0 -> 6.8 us (NHWC 6.4),
#: r50_13 16.8 -> 11.6, r50_18 9.1 -> 3.2; NHWC 2 % faster (geometric mean), r50_03 37.2 -> 35.8.
#: Runs of 2048 beat 1024 and 4096 (4096: NCHW 56x56 planes 8 % slower than the tiles), 8192 lost
#: everywhere. NCHW planes of POINTWISE_FLAT_NCHW_PLANES_BELOW pixels or more keep the tiles unless
#: they hold whole vectors (POINTWISE_FLAT_PLANE_VECTORS): with each element's channel a separate
#: 4-byte load of each parameter, a tile that loads 4 channels' parameters once was faster there
#: (28x28 planes: 6.5 us tiled against 6.8 flat).
POINTWISE_FLAT_BLOCK = 2048
POINTWISE_FLAT_WARPS = 8
POINTWISE_FLAT_NCHW_PLANES_BELOW = 512
#: NCHW planes whose pixels are a multiple of a vector's elements run flat whatever their size, each
#: vector one plane's, so that each parameter is loaded once a vector, not once an element: vectors
#: of 16 bytes, or of at least this many bytes where the plane holds no whole 16-byte ones (8: 14x14
#: fp16 planes in 8-byte vectors); 0: off (the tiles above POINTWISE_FLAT_NCHW_PLANES_BELOW).
#: Measured (H100, batch 32, NA, `--tuning POINTWISE_FLAT_PLANE_VECTORS=0,16,8`, ab-vectors.csv of
#: bench/results/2026-11-26-h100-pointwise-flat-39/): the NCHW planes at their NHWC times, fp16
#: r50_00 (112x112) 38.0 -> 36.3 us (NHWC 36.1), r50_03 38.5 -> 36.2, r50_13 (14x14, 8-byte vectors
#: only) 11.8 -> 10.7 (NHWC 10.5); fp32 r50_03 73.3 -> 70.4 (NHWC 70.3); 7x7 planes unchanged.
POINTWISE_FLAT_PLANE_VECTORS = 8
#: The interpreter's flat runs: short, so that the small test tensors have several and a tail.
POINTWISE_FLAT_INTERPRETER = PointwiseConfig(64, 1, 4)


def pointwise_plane_vector(channels_last: bool, plane: int, element_size: int) -> int:
    """Elements of a flat run's vector that share one NCHW plane (POINTWISE_FLAT_PLANE_VECTORS):
    the widest vector of at most 16 bytes, and at least that many, whose elements the plane holds
    a whole number of; 1 where none (each element its own channel's parameters)."""
    if channels_last or not POINTWISE_FLAT_PLANE_VECTORS:
        return 1
    vec = 16 // element_size
    while vec > 1 and vec * element_size >= POINTWISE_FLAT_PLANE_VECTORS:
        if plane % vec == 0:
            return vec
        vec //= 2
    return 1


def pointwise_flat_config(
    interpret: bool, channels_last: bool, plane: int, element_size: int
) -> PointwiseConfig | None:
    """The flat runs' config (block_p elements per program, block_c 1) for a plan of this layout,
    plane size and element size, None where the tiles serve better."""
    large_plane = plane >= POINTWISE_FLAT_NCHW_PLANES_BELOW and pointwise_plane_vector(False, plane, element_size) == 1
    if not channels_last and large_plane:
        return None
    if interpret:
        return POINTWISE_FLAT_INTERPRETER
    return PointwiseConfig(POINTWISE_FLAT_BLOCK, 1, POINTWISE_FLAT_WARPS)


# ---- overrides of the constants above, for experiments (tile_sweep's and fusionplan-bench's --tuning) ----
def parse_override(text: str) -> tuple[str, int | float]:
    """'GLUON_GEMM_MMA_EPILOGUE=1' -> ('GLUON_GEMM_MMA_EPILOGUE', True): a value for a numeric
    constant of this module that exists (booleans take 0 or 1); ValueError otherwise."""
    name, _, value = text.partition("=")
    current = globals().get(name)
    if not name.isupper() or not isinstance(current, (bool, int, float)):
        raise ValueError(f"{name!r} is not a numeric constant of fusionplan.tuning")
    try:
        number = float(value) if isinstance(current, float) else int(value)
    except ValueError:
        raise ValueError(f"{text!r}: expected NAME=NUMBER") from None
    return name, bool(number) if isinstance(current, bool) else number


def parse_choices(text: str) -> tuple[str, tuple[int | float, ...]]:
    """'STEM_JOINED_EPILOGUE=0,1' -> ('STEM_JOINED_EPILOGUE', (False, True)): each value as parse_override."""
    name, _, values = text.partition("=")
    return name, tuple(parse_override(f"{name}={value}")[1] for value in values.split(","))


def override_combinations(choices: list[tuple[str, tuple]]) -> list[dict[str, int | float]]:
    """Every combination of the chosen values, in order: [{}] when nothing is chosen."""
    combinations: list[dict[str, int | float]] = [{}]
    for name, values in choices:
        combinations = [{**c, name: value} for c in combinations for value in values]
    return combinations


def override_label(values: dict[str, int | float]) -> str:
    """{'A': True, 'B': 3} -> 'A=1,B=3' (parse_override reads each part back)."""
    return ",".join(f"{name}={int(v) if isinstance(v, bool) else v}" for name, v in values.items())


@contextmanager
def overridden(values: dict[str, int | float]) -> Iterator[None]:
    """These constants set to ``values`` for the block's duration, the previous values after it."""
    module = sys.modules[__name__]
    before = {name: getattr(module, name) for name in values}
    try:
        for name, value in values.items():
            setattr(module, name, value)
        yield
    finally:
        for name, value in before.items():
            setattr(module, name, value)


# ---- batch-norm training kernels (triton-batchnorm) ----------------------------------------------
#: The engine of the training plans: -1 the FAST choice (batchnorm_one_launch), 0 three launches
#: (chunked partials, a finalize, the elementwise pass), 1 one launch (a program per feature block
#: takes every row twice). Set for experiments (fusionplan-bench --tuning) and tests.
BATCHNORM_ONE_LAUNCH = -1
#: Features per program of the one-launch engine where the features are contiguous (NHWC spatial,
#: per-activation over NCHW); 4 where the rows are.
BATCHNORM_WHOLE_BLOCK_F = 16
#: The FAST choice's cost model of the two engines (GPU time, us), fitted on the training suite's
#: 104 ResNet-50 and MobileNetV2 shapes at batch 32, fp16, both layouts, forward and backward (H200,
#: docs/decisions/training-kernels.md): within 0.2 % of the faster engine per shape in geomean,
#: where three launches everywhere are 5.9 % slower.
#:   one launch:    BATCHNORM_ONE_LAUNCH_US + bytes / (programs * BATCHNORM_PROGRAM_GBPS), the
#:                  programs counted up to BATCHNORM_PROGRAMS_PER_SM per multiprocessor;
#:   three launches: BATCHNORM_THREE_LAUNCH_US + bytes / BATCHNORM_STREAM_GBPS,
#: bytes being the least traffic (3 tensor sizes forward, 5 backward).
BATCHNORM_ONE_LAUNCH_US = 2.0
BATCHNORM_PROGRAM_GBPS = 15.0
BATCHNORM_PROGRAMS_PER_SM = 2
BATCHNORM_THREE_LAUNCH_US = 6.0
BATCHNORM_STREAM_GBPS = 2500.0


def batchnorm_one_launch(moved_bytes: int, programs: int, multiprocessors: int) -> bool:
    """FAST choice of the training plans' engine: one launch where the cost model above says its
    ``programs`` (one per feature block) move ``moved_bytes`` sooner than three launches would."""
    parallel = min(programs, BATCHNORM_PROGRAMS_PER_SM * multiprocessors)
    one = BATCHNORM_ONE_LAUNCH_US + moved_bytes / (parallel * BATCHNORM_PROGRAM_GBPS * 1e3)
    three = BATCHNORM_THREE_LAUNCH_US + moved_bytes / (BATCHNORM_STREAM_GBPS * 1e3)
    return one < three
