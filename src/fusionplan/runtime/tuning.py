"""Tuning configurations of the Triton kernels, as data.

Each kernel family has a list of candidate configurations and a heuristic that picks one
from the problem's shape class (the FAST choice). Benchmarking the candidates and storing the
winner per signature is the perf database's job; this module only holds the data and the
heuristic. Each constant's line names the measurement behind it; docs/decisions/tuning.md has
the numbers and the commands.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace

import torch


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

    From H100 measurements of the ResNet-50 layers (lab/NOTES.md): 128x64 tiles when there are
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


#: triton-conv's 16-bit stages: three let three programs share a multiprocessor (H100 tile sweep, fp16 NHWC).
CONV_STAGES = 3

#: Small grids take smaller tiles, 1x1 filters smaller still (H100, batch 1 and 32).
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


#: Shallow 16-bit products with N >= 256 take 128x256 tiles (H100, fp16, r50_07 / r50_03).
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


#: triton-conv's bit per filter tap: -1 where conv_tap_bits_pay says, 0 never, 1 always (H100 A/B).
CONV_TAP_BITS = -1

#: Output planes of at most this many pixels take tap bits in either layout and precision.
TAP_BITS_MAX_ANY_PLANE = 28 * 28


def conv_tap_bits_pay(taps: int, itemsize: int, channels_last: bool, out_plane: int) -> bool:
    """Whether triton-conv's reduction should test a bit per tap (CONV_TAP_BITS), from the H100's
    A/B columns (`fusionplan-bench --graph --tuning CONV_TAP_BITS=0,1`, lab/NOTES.md section 20):
    filters of several taps gain where the loop's address arithmetic bounds it, 16-bit
    channels-last (r50_02 fp16 30.3 -> 28.2 us at batch 32) and the 28x28 and smaller planes in
    either layout (batch 1: r50_12 29.7 -> 27.3, r50_22 27.5 -> 25.4; NCHW r50_12 58.4 -> 52.8,
    r50_22 62.5 -> 59.5); 56x56 planes of fp32 or NCHW data lose (TF32 r50_02 54.4 -> 55.3, NCHW
    r50_02 44.7 -> 49.0: more registers, 168 -> 212 in NCHW), and so do 1x1 filters (NCHW r50_08
    54.4 -> 60.7, r50_14 46.4 -> 52.6; batch 1 r50_09 26.9 -> 28.0)."""
    if CONV_TAP_BITS >= 0:
        return bool(CONV_TAP_BITS)
    return taps > 1 and ((itemsize == 2 and channels_last) or out_plane <= TAP_BITS_MAX_ANY_PLANE)


#: Grids of fewer programs go to triton-conv rather than triton-window (H100, fp16, batch 1).
WINDOW_MIN_PROGRAMS = 100

#: Strided 16-bit 1x1 layers this large run on triton-conv (H100, r50_08 / r50_14 / r50_20).
WINDOW_STRIDED_1X1_MAX_PIXELS = 4096

#: Strided multi-tap layers this large run on triton-conv's tap bits (H100, r50_06).
WINDOW_STRIDED_TAPS_MAX_PIXELS = 16384

#: fp32 1x1 layers this large run on triton-conv, not gluon-window (H200, r50_09).
GLUON_TF32_1X1_MAX_PIXELS = 16384

#: TF32 windows this large defer from gluon-window (H100 A/B, r50_06 / r50_10).
GLUON_TF32_MAX_WINDOW = 512

#: gluon-gemm defers smaller tiles: triton-conv's small grids are faster there (H200, batch 1).
GLUON_GEMM_MIN_TILE = 64 * 128

#: Reduction steps from which two warpgroups take tiles in turn, by (size, K) (H100, fp16 / TF32).
GLUON_GEMM_PINGPONG_MIN_STEPS = {(2, 0): 8, (2, 256): 4, (4, 0): 4}

#: Tiles and windows of fewer pixels store by pointer, not TMA (H100 A/B, fp16 / bf16).
TMA_STORE_MIN_PIXELS = 128
#: Persistent gluon-gemm programs store by TMA up to this many steps (H100 A/B, r50_13).
GLUON_GEMM_PERSISTENT_TMA_MAX_STEPS = 4

#: NCHW planes by copies: 1 unaligned planes, 2 aligned ones too (H100, plane-copies-36).
GLUON_GEMM_PLANE_COPIES = 2
#: Lanes along a plane in 8-byte NCHW stores (H100, carveout-37 ab-store-lanes).
GLUON_GEMM_PLANE_STORE_LANES = 16
#: Aligned planes are copied where K is at most this many times C (H100, r50_11 / r50_07).
GLUON_GEMM_COPY_MAX_WIDENING = 2
#: 14x14 planes come as pairs where K is at most this times C (H100, r50_15 / r50_17).
GLUON_GEMM_PAIRS_MAX_WIDENING = 0.25
#: Shared memory of 8-byte copied planes, the rest L1 (H100, ab-copy-carveout).
GLUON_GEMM_COPY_SHARED_BYTES = 164 * 1024
#: 8-byte copied planes in larger tiles defer to triton-gemm-nchw (H100, r50_17).
GLUON_GEMM_COPY_L1_MAX_PIXELS = 192


#: gluon-rows: the filter's registers a thread, the narrowest row and the ring's bytes at most.
GLUON_ROWS_FILTER_REGS = 160
GLUON_ROWS_MIN_WIDTH = 32
GLUON_ROWS_RING_BYTES = 192 * 1024


#: gluon-stem: the ring's slots and the kernel's shared memory at most.
GLUON_STEM_SLOTS = 16
GLUON_STEM_SMEM_BYTES = 192 * 1024
#: Registers of gluon-stem's loading warps on channel-plane input.
GLUON_STEM_PLANE_LOAD_REGS = 64


#: gluon-window's ring at most (the epilogue and barriers take the rest of 227 KB).
GLUON_WINDOW_RING_BYTES = 160 * 1024

#: gluon-nchw's limits: output planes, grids and split depth where it measured faster (H100).
GLUON_NCHW_MAX_PLANE = 784
#: TF32 filters of several taps on planes up to 14x14 (H100, r50_10 / r50_16).
GLUON_NCHW_FP32_MAX_PLANE = 196
GLUON_NCHW_1X1_MAX_PLANE = 49
#: TF32 strided 1x1 filters on planes up to 28x28 (H100, carveout-37).
GLUON_NCHW_FP32_STRIDED_1X1_MAX_PLANE = 784
GLUON_NCHW_MIN_PROGRAMS = 64


GLUON_NCHW_SPLIT_MIN_DEPTH = 2048

#: Strided plans' reduction steps in bytes a pixel: a deeper ring (H100, r50_18 / r50_12).
GLUON_NCHW_STRIDED_STEP_BYTES = 64

#: gluon-nchw's ring at most (the epilogue and barriers take the rest of 227 KB).
GLUON_NCHW_RING_BYTES = 160 * 1024
#: Strided 16-bit rings: L1 left to the gathered input (H100, carveout-37).
GLUON_NCHW_STRIDED_RING_BYTES = 96 * 1024

#: gluon-nchw's gathering side where set (0: by the tile, GATHER_SHAPES); experiments only.
GLUON_NCHW_GATHER_WARPS = 0
GLUON_NCHW_GATHERERS = 0
GLUON_NCHW_PREFETCH = 0


#: gluon-row-pairs: the smallest output plane, its prefetch depth and resident bytes.
GLUON_ROW_PAIRS_MIN_PLANE = 784
GLUON_ROW_PAIRS_PREFETCH = 2
GLUON_ROW_PAIRS_RESIDENT_BYTES = 0
#: gluon-row-pairs' computing warps run the proxy fence after their wait.
GLUON_ROW_PAIRS_CONSUMER_FENCE = 1
#: gluon-row-pairs' gathers go through asynchronous copies into shared memory.
GLUON_ROW_PAIRS_STAGED = 1
#: Output pixels a thread of gluon-row-pairs stores at once into NCHW planes.
GLUON_ROW_PAIRS_OUT_VEC = 4
#: Warps of gluon-row-pairs' storing partition (H100, r50_08: 2 against 0 and 4).
GLUON_ROW_PAIRS_STORE_WARPS = 2
#: gluon-row-pairs loads per-channel parameters once, before its tiles (H100, r50_08).
GLUON_ROW_PAIRS_HOIST_CHANNELS = 1
#: gluon-row-pairs' computing partition streams the weights (H100, r50_08).
GLUON_ROW_PAIRS_WEIGHTS_BY_MMA = 1

#: gluon-plane-chunks defers where its tiles fill less of the GPU (H100, r50_21).
GLUON_PLANE_CHUNKS_MIN_FILL = 0.75
#: Warps of gluon-plane-chunks' gathering partition (H100, r50_19: 4 and 8 within 3 %).
GLUON_PLANE_CHUNKS_GATHER_WARPS = 4
#: gluon-plane-chunks' runs by loads into registers, not copies (H100, r50_19).
GLUON_PLANE_CHUNKS_STAGED = 0
#: gluon-plane-chunks shifts operand rows in registers where it can (H100, r50_19).
GLUON_PLANE_CHUNKS_SHIFTED = 1
#: One-image tiles for small grids: off, slower than gluon-nchw (H100 and H200, r50_21).
GLUON_PLANE_CHUNKS_IMAGE_TILES = 0

#: gluon-halo: its output planes, channel tile and stages.
GLUON_HALO_MAX_PLANE = 784
GLUON_HALO_STRIDED_MAX_PLANE = 49
GLUON_HALO_BLOCK_N = 128
GLUON_HALO_STAGES = 4
#: Halo buffers a program cycles through (three measured no faster, H100).
GLUON_HALO_BUFFERS = 2

#: gluon-nchw-regs takes output planes this large and up.
GLUON_NCHW_REGS_MIN_PLANE = 784
#: gluon-nchw-regs' strided 1x1 filters up to 7x7 outputs (H100, r50_20).
GLUON_NCHW_REGS_STRIDED_1X1_MAX_PLANE = 49
#: gluon-nchw-regs' weights ring and how far its loads run ahead (within 2-3 %, H100).
GLUON_NCHW_REGS_STAGES = 4
GLUON_NCHW_REGS_AHEAD = 2
#: gluon-nchw-regs unrolls AHEAD + 1 steps up to this accumulator (H100 A/B, r50_06 / r50_19).
GLUON_NCHW_REGS_UNROLLED = 1
GLUON_NCHW_REGS_UNROLLED_MAX_ACC = 64
#: Strided multi-tap weights ring: L1 left to the gathered input (H100, r50_06).
GLUON_NCHW_REGS_STRIDED_STAGES = 4

#: TF32 1x1 layers this large run on triton-gemm (H100, TF32 solver columns).
TF32_GEMM_MIN_PIXELS = 65536


#: triton-gemm-nchw's tiles: pixels of one image, small grids narrower (H100 tile sweep).
NCHW_GEMM_PIXELS = 256
NCHW_GEMM_MIN_TILES = 66
#: Deep stride-1 plans take 128x256 tiles on triton-gemm-nchw (H100, r50_17 / r50_11).
NCHW_GEMM_WIDE_N_MIN_C = 512
#: Strided box plans take wide channel tiles from this K (H100, r50_14 / r50_08).
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


#: Below this many input channels triton-conv rather than triton-window (H100, r50_02).
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


#: The most pixels of triton-window's TF32 windows (H100 sweeps; A/B pending).
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
    with Triton 3.6 (some shapes, not reproducibly; lab/NOTES.md, section 10). Windows span
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


#: triton-stem joins a run's accumulators for NCHW output's stores.
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
    from fusionplan.runtime.perfdb import default_db

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


#: Dense pointwise chains as flat runs; large NCHW planes keep tiles (H100, pointwise-flat-39).
POINTWISE_FLAT_BLOCK = 2048
POINTWISE_FLAT_WARPS = 8
POINTWISE_FLAT_NCHW_PLANES_BELOW = 512
#: NCHW planes of whole vectors run flat at any size (H100, pointwise-flat-39).
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
    """'GLUON_PLANE_CHUNKS_IMAGE_TILES=1' -> ('GLUON_PLANE_CHUNKS_IMAGE_TILES', 1): a value for a numeric
    constant of this module that exists (booleans take 0 or 1); ValueError otherwise."""
    name, _, value = text.partition("=")
    current = globals().get(name)
    if not name.isupper() or not isinstance(current, (bool, int, float)):
        raise ValueError(f"{name!r} is not a numeric constant of fusionplan.runtime.tuning")
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
#: The training plans' engine: -1 FAST's choice, 0 three launches, 1 one launch.
BATCHNORM_ONE_LAUNCH = -1
#: Features per program of the one-launch engine (4 where the rows are contiguous).
BATCHNORM_WHOLE_BLOCK_F = 16
#: FAST's cost model of the two engines (H200, 104 training shapes; batchnorm_one_launch).
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
