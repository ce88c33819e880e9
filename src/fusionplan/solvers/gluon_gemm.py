"""Gluon GEMM solver: a 1x1 convolution without padding (the product [N*H*W, C] x [C, K]; strided,
of the rows and columns the stride picks) on channels-last rows or NCHW channel planes, followed
by any chain of bias, batch-norm inference and activations, as ONE warp-specialized kernel
(Hopper only; the template in templates/gluon_gemm.py). Tiles of a power-of-two part or up to
three (96 = 64 + 32 pixels) sized for about one program per multiprocessor; a program per tile,
persistent programs, or two computing warpgroups taking tiles in turn. Channel planes come by
TMA boxes, by asynchronous copies (planes inside 16-byte units) or as pairs. docs/solvers.md
gives the measurements behind each choice; Gluon has no interpreter: CPU tests compile it for
sm_90.
"""

from __future__ import annotations

from dataclasses import replace
from functools import cached_property

import torch

from fusionplan.core.enums import DataType
from fusionplan.runtime import tuning
from fusionplan.runtime.folding import Stage, split_at_conv
from fusionplan.runtime.launch import needs_int64
from fusionplan.solvers.base import Kernel, PlanSpec, Solver
from fusionplan.solvers.conv_kernel import TritonConvKernel
from fusionplan.solvers.conv_toolkit import conv_plan_why_not, gemm_input_why_not, pack_rows_rsc, triton_cdiv
from fusionplan.solvers.gluon_toolkit import (
    CONSUMER_REGS,
    LOAD_REGS,
    box_swizzle_and_bits,
    channel_planes,
    epilogue_mode,
    gluon_descriptor,
    gluon_dtype_why_not,
    gluon_why_not,
    hopper_why_not,
    multiprocessors,
    sixteen_bit_output,
    tma_store_strides_fit,
)
from fusionplan.solvers.templates.gluon_gemm import (
    MAX_PARTS,
    PLANE_COPY_VEC,
    render_gluon_gemm_source,
)

Tensor = torch.Tensor


#: Registers of each copying warp (templates.gluon_gemm.COPY_WARPS of them; sm_90: no spills at 48)
#: and of each of the two computing warpgroups beside them (what the multiprocessor's 64K leaves;
#: no spills for 128 x 128 tiles in turn).
COPY_REGS = 56
COPY_CONSUMER_REGS = 224


def pixel_parts(pixels: int) -> tuple[int, ...]:
    """A tile's pixels as power-of-two parts of at least 16, largest first (96 -> (64, 32))."""
    if pixels <= 0 or pixels % 16:
        raise ValueError(f"a tile's pixels must be a positive multiple of 16, not {pixels}")
    return tuple(1 << b for b in range(pixels.bit_length() - 1, 3, -1) if pixels & (1 << b))


#: Shared memory a program may take for its ring of stages and the epilogue's layout change
#: (sm_90 gives a program 227 KB; a little is left for the barriers).
GEMM_SHARED_BYTES = 224 * 1024
#: The ring of a program per tile (its epilogue reuses the ring's memory): r50_15 (96 x 128 tiles)
#: measured 8.7 us with 5 stages, 8.9 with 7 (H200, fp16).
GEMM_RING_BYTES = 200 * 1024
#: Shared memory of the epilogue in the accumulator's layout, which changes only the 16-bit output's
#: layout, at most, per computing warpgroup (Triton 3.6 and 3.9 for
#: sm_90: 8 KB with 8 warps, 2 KB with 4; persistent r50_07, 256 x 128: 213052 -> 155708 bytes).
GEMM_MMA_EPILOGUE_BYTES = {4: 2048, 8: 8192}
#: At most this many stages (deeper rings measured no faster on windows: GLUON_STAGES).
GEMM_MAX_STAGES = 8
#: Accumulator registers per computing thread, at most (gluon-window's largest tile has 128).
GEMM_MAX_ACC_REGS = 128
#: The per-program cost of the ring's fill and the epilogue, in reduction steps.
GEMM_FIXED_STEPS = 3
#: A part beyond the first costs about as much per step as this many more pixels (a smaller wgmma).
GEMM_PART_COST = 16


def gemm_tile_cost(m: int, k: int, steps: int, pixels: int, block_n: int, multiprocessors: int) -> float:
    """A tile's predicted time, in units of bytes per step: waves of programs, each running its
    steps at the pace of its operands' loads from L2 (pixels + channels rows per step; Nsight
    Compute and the window sweeps: the computing warpgroups wait for loads at about 30 bytes per
    cycle per multiprocessor, not for the tensor cores), plus the ring's fill and the epilogue."""
    programs = triton_cdiv(m, pixels) * triton_cdiv(k, block_n)
    waves = triton_cdiv(programs, multiprocessors)
    per_step = pixels + block_n + GEMM_PART_COST * (len(pixel_parts(pixels)) - 1)
    return waves * (steps + GEMM_FIXED_STEPS) * per_step


def plane_swizzle(pixels: int, bits: int) -> int:
    """The swizzle of a channel-plane box or tile of ``pixels`` along its rows: rows swizzled as wide
    as they are, up to 128 bytes (the kernel's _plane_layout, for its copied planes and plane tiles)."""
    return min(128, pixels * bits // 8)


def plane_rows(m: int, pixels: int, plane: int) -> int:
    """Rows of the product for ``m`` pixels in tiles of ``pixels``: channel planes (``plane`` > 0
    pixels an image) pad each image's pixels to whole tiles; else ``m``."""
    return m // plane * triton_cdiv(plane, pixels) * pixels if plane else m


def gluon_gemm_config(
    m: int,
    k: int,
    c: int,
    dtype: torch.dtype,
    multiprocessors: int,
    row_slots: int = 0,
    tma_store: bool = False,
    plane: int = 0,
    shared: int = GEMM_SHARED_BYTES,
) -> tuning.ConvConfig:
    """The tile of least predicted time (gemm_tile_cost; ties: fewer parts, then fewer programs):
    64, 128 or 256 output channels (one warpgroup per 64, two for 256: 128 rows each) by 16 to 256
    pixels in at most MAX_PARTS parts, with as many stages as shared memory holds (gemm_stages).
    Beyond one wave, with pingpong_min_steps reduction steps or more, two warpgroups take 128 x 128
    tiles in turn. ``m``: rows (pixels, or strided, slots of
    whole output rows of ``row_slots`` each: every part a multiple of them); ``tma_store``: the
    output may take TMA stores (gemm_tma_store), whose persistent tiles take shared memory beside
    the ring (gemm_store_mode); ``plane``: pixels of an image's channel planes (plane_rows);
    ``shared``: the program's shared memory at most (gemm_stages)."""
    size = torch.empty((), dtype=dtype).element_size()
    block_k = step_channels(size)
    steps = triton_cdiv(c, block_k)

    def beyond_one_wave(pixels: int, block_n: int) -> bool:
        return triton_cdiv(plane_rows(m, pixels, plane), pixels) * triton_cdiv(k, block_n) > multiprocessors

    pixels, block_n, warps = best_tile(m, k, steps, multiprocessors, row_slots, plane)
    persistent = beyond_one_wave(pixels, block_n)
    short = steps <= tuning.GLUON_GEMM_PERSISTENT_TMA_MAX_STEPS
    if plane and tma_store and persistent and short:
        # channel planes beyond one wave with short reductions: a tile that persistent TMA stores
        # take (gemm_store_mode 2: its epilogue under the next tile's products), whatever it pads
        pixels, block_n, warps = best_tile(m, k, steps, multiprocessors, row_slots, plane, stored_by_tma=True)
        persistent = beyond_one_wave(pixels, block_n)
    if persistent and steps >= pingpong_min_steps(size, k) and row_slots <= 128:
        # deep reductions beyond one wave: two warpgroups taking 128 x 128 tiles in turn
        stages = gemm_stages(128, 128, block_k, size, True, 4, 2, shared=shared)
        cfg = tuning.ConvConfig(128, 128, block_k, 8, 4, stages, 1, consumers=2)
    else:
        stages = gemm_stages(pixels, block_n, block_k, size, persistent, warps, shared=shared)
        cfg = tuning.ConvConfig(pixels, block_n, block_k, 8, warps, stages, 1)
    if not (
        tma_store and persistent and gemm_store_mode(replace(cfg, num_stages=2), size, False, steps, row_slots > 0)
    ):
        return cfg
    # the output tiles beside the ring take the place of the layout change's scratch
    tiles = tma_store_bytes(cfg, size)
    stages = gemm_stages(cfg.block_m, cfg.block_n, block_k, size, True, tma_tiles=tiles, shared=shared)
    return replace(cfg, num_stages=stages)


def best_tile(
    m: int, k: int, steps: int, multiprocessors: int, row_slots: int, plane: int, stored_by_tma: bool = False
) -> tuple[int, int, int]:
    """gluon_gemm_config's tile of least predicted time: (pixels, output channels, warps);
    ``stored_by_tma``: only tiles of one part of tuning.TMA_STORE_MIN_PIXELS pixels or more (those
    that persistent programs store by TMA)."""
    best = None
    for block_n in (64, 128, 256):
        warps = 4 if block_n == 64 else 8
        for pixels in range(16, 257, 16):
            parts = pixel_parts(pixels)
            if len(parts) > MAX_PARTS or block_n * pixels // (warps * 32) > GEMM_MAX_ACC_REGS:
                continue
            if parts[-1] < row_slots:  # a part holds whole output rows
                continue
            if stored_by_tma and (len(parts) > 1 or pixels < tuning.TMA_STORE_MIN_PIXELS):
                continue
            rows = plane_rows(m, pixels, plane)
            cost = gemm_tile_cost(rows, k, steps, pixels, block_n, multiprocessors)
            rank = (cost, len(parts), triton_cdiv(rows, pixels) * triton_cdiv(k, block_n))
            if best is None or rank < best[0]:
                best = (rank, pixels, block_n, warps)
    assert best is not None
    return best[1:]


def step_channels(size: int) -> int:
    """Channels of one reduction step (BLOCK_K) for data of ``size`` bytes: rows of 128 bytes, the
    widest swizzle. Every configuration gluon-gemm makes takes it, and plane pairs' packed weights
    are ordered by it (pair_order)."""
    return 128 // size


def pingpong_min_steps(size: int, k: int) -> int:
    """Reduction steps from which tiles beyond one wave are taken in turn by two warpgroups, for
    data of ``size`` bytes and ``k`` output channels (tuning.GLUON_GEMM_PINGPONG_MIN_STEPS)."""
    table = tuning.GLUON_GEMM_PINGPONG_MIN_STEPS
    return min((steps for (nbytes, min_k), steps in table.items() if nbytes == size and k >= min_k), default=2**31)


def gemm_stages(
    pixels: int,
    block_n: int,
    block_k: int,
    size: int,
    persistent: bool,
    warps: int = 8,
    consumers: int = 1,
    tma_tiles: int = 0,
    shared: int = GEMM_SHARED_BYTES,
) -> int:
    """As many stages as ``shared`` bytes hold, 2 to GEMM_MAX_STAGES; ``persistent``: beside the
    epilogue's layout change (of each of ``consumers`` warpgroups of ``warps`` warps), or beside
    ``tma_tiles`` bytes of output tiles for TMA stores (tma_store_bytes), which the epilogues use
    while the ring holds the next tile's stages (a program per tile reuses the ring's memory)."""
    scratch = tma_tiles or consumers * epilogue_scratch_bytes(pixel_parts(pixels)[0] * block_n, size, warps)
    ring = shared - scratch if persistent else min(shared, GEMM_RING_BYTES)
    return max(2, min(GEMM_MAX_STAGES, ring // ((pixels + block_n) * block_k * size)))


def gemm_epilogue_mode(size: int) -> int:
    """gluon-gemm's epilogue_mode."""
    return epilogue_mode(size)


def epilogue_scratch_bytes(part_elements: int, size: int, warps: int) -> int:
    """Shared memory a computing warpgroup's epilogue stages a part's outputs of ``size`` bytes
    through (gemm_epilogue_mode): the 16-bit output's layout change, none for fp32 output stored
    from the accumulator's layout."""
    if gemm_epilogue_mode(size) == 2:
        return 0
    return min(part_elements * size, GEMM_MMA_EPILOGUE_BYTES[warps])


def row_slots(spec: PlanSpec) -> int:
    """Strided: the slots of an output row in the input's boxes (OW rounded up to a power of two,
    at least 8: a wgmma's pixels come in multiples of 8); 0 for stride 1 (flat rows of pixels)."""
    _, conv, _ = split_at_conv(spec.ops)
    assert conv is not None
    if conv.conv.strides == (1, 1):
        return 0
    return max(8, 1 << (spec.output_desc.dims[3] - 1).bit_length())


def gluon_gemm_input_why_not(spec: PlanSpec) -> str | None:
    """Why the plan's convolution is not a product over rows of its input, or None: a 1x1 filter
    without padding, ungrouped, on packed channels-last input with 16-byte rows; with a stride, the
    height a multiple of it (images and output rows are then one dimension of the strided view)
    and output rows of at most 256 pixels (a box's side)."""
    _, conv, _ = split_at_conv(spec.ops)
    assert conv is not None
    c = conv.conv
    if conv.w_desc.dims[2:] != (1, 1) or c.pads != (0, 0):
        return "only 1x1 convolutions without padding are products over the input's rows"
    if channel_planes(spec):
        return planes_why_not(spec)
    why = gemm_input_why_not(spec, "read as rows of pixels")
    if why:
        return why
    if c.strides == (1, 1):
        return None  # flat rows of pixels: any image
    h = spec.input_desc.dims[2]
    stride_h = c.strides[0]
    if h % stride_h:
        return f"strided: H={h} must be a multiple of the stride {stride_h} (images and rows in one view)"
    if spec.output_desc.dims[3] > 256:
        return f"strided: output rows of {spec.output_desc.dims[3]} pixels exceed a tensor box's 256"
    return None


def planes_why_not(spec: PlanSpec) -> str | None:
    """Why gluon-gemm cannot read the plan's packed NCHW input as channel planes, or None: the
    input seen as [N*C, H*W] is a tensor descriptor where the planes are whole 16-byte units, a box
    of BLOCK_K planes must not cross into the next image (C a multiple of BLOCK_K), and wgmma reads
    the box along its pixels only for 16-bit data."""
    _, conv, _ = split_at_conv(spec.ops)
    assert conv is not None
    if conv.conv.groups != 1:
        return "grouped convolutions are not one GEMM"
    if conv.conv.strides != (1, 1):
        # boxes of the input rows hold the odd columns too; splitting them out in shared memory measured
        # 1.4-1.8x slower than triton-gemm-nchw (lab/NOTES.md section 39: two stages of raw boxes
        # in the ring, each waited for through TMA, then the split, then the products)
        return "strided 1x1 convolutions on NCHW planes: the boxes would hold the odd columns too (triton-gemm-nchw)"
    n, c, h, w = spec.input_desc.dims
    size = spec.dtype.torch_dtype.itemsize
    if size != 2:
        return (
            "32-bit data on NCHW planes: wgmma reads 32-bit operands only along the reduction, "
            "the planes run along the pixels"
        )
    if h * w * size % 16 and (h * w % PLANE_COPY_VEC or not tuning.GLUON_GEMM_PLANE_COPIES):
        # planes of whole 8-byte units may come by asynchronous copies instead (plane_copies)
        return f"{h}x{w} planes of {h * w * size} bytes are not whole 16-byte units (a tensor descriptor's rows)"
    block_k = step_channels(size)
    if c % block_k:
        return f"C={c}: boxes of {block_k} channel planes would cross into the next image (C a multiple of {block_k})"
    if n * c >= 2**31:
        return "more than 2^31 - 1 channel planes do not fit a tensor descriptor's dimension"
    return None


def plane_copies(spec: PlanSpec) -> bool:
    """Whether gluon-gemm reads the plan's channel planes by asynchronous copies (COPIES): packed
    NCHW input read as planes (planes_why_not) whose planes start inside 16-byte units, where no
    tensor box may start (14x14 fp16: 392 bytes; tuning.GLUON_GEMM_PLANE_COPIES 1), or (2) planes
    of whole 16-byte units too, in place of the boxes (the batch's pixels flat, no image padded to
    whole tiles), where the output has at most tuning.GLUON_GEMM_COPY_MAX_WIDENING times the input's
    channels (wider outputs measured faster from the boxes' tiles, stored by TMA)."""
    if not channel_planes(spec) or planes_why_not(spec) is not None or plane_pairs(spec):
        return False
    _, c, h, w = spec.input_desc.dims
    if h * w * spec.dtype.torch_dtype.itemsize % 16:
        return tuning.GLUON_GEMM_PLANE_COPIES >= 1
    k = spec.output_desc.dims[1]
    return tuning.GLUON_GEMM_PLANE_COPIES >= 2 and k <= tuning.GLUON_GEMM_COPY_MAX_WIDENING * c


def plane_pairs(spec: PlanSpec) -> bool:
    """Whether gluon-gemm reads the plan's channel planes as pairs (COPIES 2):
    packed NCHW input read as planes (planes_why_not) whose planes start 8 bytes into a 16-byte unit
    every other channel (14x14 fp16: 392 bytes), so that two channels' planes are whole 16-byte
    units: the even channels' planes come by boxes of the input seen as [N*C/2, 2*H*W], the odd
    ones' by 8-byte asynchronous copies, each image's pixels padded to whole tiles as the boxes';
    where the output has at most tuning.GLUON_GEMM_PAIRS_MAX_WIDENING times the input's channels
    (wider outputs measured faster all by copies, their tiles unpadded)."""
    if not channel_planes(spec) or planes_why_not(spec) is not None:
        return False
    _, c, h, w = spec.input_desc.dims
    narrow = spec.output_desc.dims[1] <= tuning.GLUON_GEMM_PAIRS_MAX_WIDENING * c
    return narrow and h * w * spec.dtype.torch_dtype.itemsize % 16 == 8


def plane_copy_mode(spec: PlanSpec) -> int:
    """The kernel's COPIES: 2 for plane pairs (plane_pairs), 1 for copied planes (plane_copies), 0
    where the input comes by tensor boxes alone."""
    return 2 if plane_pairs(spec) else int(plane_copies(spec))


def pair_order(c: int, block_k: int) -> list[int]:
    """The weights' input channels in the order plane pairs read them (plane_pairs): each reduction
    step's BLOCK_K channels as its even channels, then its odd ones."""
    return [b + j for b in range(0, c, block_k) for parity in (0, 1) for j in range(parity, block_k, 2)]


def padded_plane(spec: PlanSpec) -> int:
    """Pixels of an image's planes that tiles may not cross (plane_rows pads each image to whole
    tiles): the channel planes tensor boxes read; 0 for channels-last input and for copied planes
    (plane_copies: the batch's pixels flat, a copy never straddles two images)."""
    if not channel_planes(spec) or plane_copies(spec):
        return 0
    _, _, h, w = spec.input_desc.dims
    return h * w


def copies_through_l1(spec: PlanSpec) -> bool:
    """Whether copied planes (plane_copies) or the odd halves of plane pairs (plane_pairs) come by
    8-byte copies, which land in L1 on their way (16-byte ones bypass it): their program takes
    tuning.GLUON_GEMM_COPY_SHARED_BYTES of shared memory at most, and the rest of the
    multiprocessor's memory is left to L1 (Launcher.fit_carveout)."""
    eight_byte = plane_copies(spec) and plane_copy_vec(spec) * spec.dtype.torch_dtype.itemsize < 16
    return eight_byte or plane_pairs(spec)


def gemm_shared_bytes(spec: PlanSpec) -> int:
    """Shared memory a program of the plan's kernel takes at most (gluon_gemm_config's ``shared``)."""
    return tuning.GLUON_GEMM_COPY_SHARED_BYTES if copies_through_l1(spec) else GEMM_SHARED_BYTES


def plane_copy_vec(spec: PlanSpec) -> int:
    """Pixels a copy of copied planes (plane_copies) holds: 8 (16 bytes) where the planes are whole
    16-byte units, else PLANE_COPY_VEC (8 bytes)."""
    _, _, h, w = spec.input_desc.dims
    return 8 if h * w % 8 == 0 else PLANE_COPY_VEC


def gluon_gemm_defer_why(spec: PlanSpec, sms: int) -> str | None:
    """Where another kernel measured faster. Within one wave gluon-gemm is faster than every other
    kernel (fp16: r50_15 10.0-10.4 us against 11.0 for gluon-window, r50_17 13.6-13.9 against
    16.2, r50_21 9.7-10.0 against 10.5, r50_09 13.0 against 14.1 for triton-gemm), except on fp32
    data of many pixels (tuning.GLUON_TF32_1X1_MAX_PIXELS; r50_09, H100: 33.7 us against 31.4 for
    triton-conv). Beyond one wave with one computing warpgroup (reductions too short for
    ping-pong: pingpong_min_steps) the persistent kernel runs each tile's products and epilogue in
    turn (only the loads run ahead), where triton-gemm measured faster on 16-bit data (fp16, H200,
    batch 32: r50_13 12.1 us against 12.5, r50_07 14.8 against 17.4, r50_03 21.7 against 27.1) and
    triton-conv on fp32 data; unless its tiles' stores run by TMA under the next tile's products
    (gemm_store_mode 2; H100, fp16 / bf16, batch 32, the suites' solver columns,
    lab/results/2026-11-23-h100-tma-stores-31/: r50_07 14.26 / 14.23 us against 15.24 / 15.16 for
    triton-gemm, r50_05 29.71 / 29.52 against 31.12 / 30.81, r50_03 25.02 / 24.49 against 26.33 /
    25.95, r50_01 10.95 / 10.70 against 11.06 / 11.02; r50_04 24.92 / 25.01 against 24.68 / 24.71).
    Strided, where triton-gemm does not apply: strided_defer_why. Channel planes, against
    triton-gemm-nchw, by the same rule (H100, fp16, batch 32, lab/results/2026-11-25-h100-nchw-planes-34/:
    stored by pointer beyond one wave, r50_01 14.4 us against 12.7, r50_05 35.4 / 33.6, r50_07 19.5 /
    18.8; by TMA, r50_03 24.5 / 29.6, r50_07 16.2 / 18.4 in tiles stored by TMA;
    ping-pong, r50_11 20.6 / 21.1)."""
    n, c, _, _ = spec.input_desc.dims
    oh, ow = spec.output_desc.dims[2:]
    k = spec.output_desc.dims[1]
    slots = row_slots(spec)
    rows = n * oh * (slots or ow)
    tma_store = gemm_tma_store(spec, slots)
    copies = plane_copies(spec)
    plane = padded_plane(spec)
    shared = gemm_shared_bytes(spec)
    cfg = gluon_gemm_config(rows, k, c, spec.dtype.torch_dtype, sms, slots, tma_store, plane, shared)
    programs = triton_cdiv(plane_rows(rows, cfg.block_m, plane), cfg.block_m) * triton_cdiv(k, cfg.block_n)
    if cfg.block_m * cfg.block_n < tuning.GLUON_GEMM_MIN_TILE:
        return (
            f"a small problem: its best tile is {cfg.block_m} pixels x {cfg.block_n} channels "
            f"(< {tuning.GLUON_GEMM_MIN_TILE}); triton-conv's small-grid tiles measured fastest there"
        )
    if slots:
        return strided_defer_why(spec, programs, sms, cfg)
    fp32 = spec.dtype == DataType.FLOAT
    if fp32 and n * oh * ow >= tuning.TF32_GEMM_MIN_PIXELS:
        return (
            f"fp32 data of {n * oh * ow} pixels (>= {tuning.TF32_GEMM_MIN_PIXELS}): triton-gemm, its weights "
            "along the reduction, measured faster"
        )
    if copies:
        return copies_defer_why(spec, cfg)
    if plane_pairs(spec):
        return None  # measured against the copies (docs/decisions/tuning.md, GLUON_GEMM_PLANE_PAIRS)
    if programs <= sms:
        if fp32 and n * oh * ow >= tuning.GLUON_TF32_1X1_MAX_PIXELS:
            return (
                f"fp32 data of {n * oh * ow} pixels (>= {tuning.GLUON_TF32_1X1_MAX_PIXELS}) in one wave: "
                "triton-conv measured faster"
            )
        return None
    if cfg.consumers > 1:
        return None
    size = spec.dtype.torch_dtype.itemsize
    if tma_store and gemm_store_mode(cfg, size, False, triton_cdiv(c, cfg.block_k), False) == 2:
        return None  # each tile's stores run on under the next tile's products
    least = pingpong_min_steps(spec.dtype.torch_dtype.itemsize, k)
    steps = f"{triton_cdiv(c, cfg.block_k)} reduction steps (< {least})"
    if fp32:
        return f"fp32 data beyond one wave ({programs} tiles) with {steps}: triton-conv measured faster"
    other = "triton-gemm-nchw" if plane else "triton-gemm"
    return (
        f"{programs} programs of its best tile ({cfg.block_m} pixels x {cfg.block_n} channels) on {sms} "
        f"multiprocessors, {steps}: {other}'s persistent programs measured faster beyond one wave"
    )


def copies_defer_why(spec: PlanSpec, cfg: tuning.ConvConfig) -> str | None:
    """Copied planes (plane_copies) run wherever they apply (H100, fp16 / bf16, batch 32, CBNA,
    lab/results/2026-11-25-h100-plane-copies-36/ab-plane-copies.csv: against triton-gemm-nchw,
    r50_13 16.8 / 16.6 us against 19.0 / 18.7, r50_15 13.4 / 13.2 against 15.3 / 15.4; against the
    boxes, r50_01 11.6 / 11.6 against 12.3 / 12.6, r50_04 25.8 / 25.6 against 27.0 / 27.0, r50_05
    30.9 / 30.7 against 32.7 / 32.4, r50_11 19.3 / 19.1 against 20.6 / 20.3), except 8-byte copies
    (copies_through_l1) in tiles of more than tuning.GLUON_GEMM_COPY_L1_MAX_PIXELS pixels (r50_17's
    192, four 40 KB stages within tuning.GLUON_GEMM_COPY_SHARED_BYTES, 18.0 us against
    triton-gemm-nchw's 19.2 since the 14x14 planes' stores took 16 lanes a plane)."""
    if copies_through_l1(spec) and cfg.block_m > tuning.GLUON_GEMM_COPY_L1_MAX_PIXELS:
        return (
            f"channel planes by 8-byte copies in tiles of {cfg.block_m} pixels "
            f"(> {tuning.GLUON_GEMM_COPY_L1_MAX_PIXELS}): triton-gemm-nchw measured faster"
        )
    return None


def gemm_plane_vector(strides: tuple[int, ...], out: Tensor, oh: int, ow: int) -> int:
    """PLANE_VEC of channel-plane input: 0 for output whose channels are contiguous (stored along
    them); else lanes along the planes' pixels, 8 (16 bytes) a store where each plane's rows follow
    one another (one run of pixels), the image and plane strides are multiples of 8 and the 16-bit
    output 16-byte aligned; 4 (8 bytes) where they are multiples of 4 and it 8-byte aligned (14x14
    planes); 1 where not."""
    syn, syc, syh, syw = strides
    if syc == 1 or syw != 1:
        return 0
    if syh != ow or out.element_size() != 2:
        return 1
    runs = (syn, syc, oh * ow)  # a plane's pixels in whole stores too (the mask's runs)
    return next((v for v in (8, 4) if all(r % v == 0 for r in runs) and out.data_ptr() % (2 * v) == 0), 1)


def gemm_tma_store_fits(strides: tuple[int, ...], oh: int, ow: int, slots: int) -> bool:
    """Whether output strides (syn, syc, syh, syw) let TMA store a part's tiles: the output seen as
    [N*OH*OW, K] (strided, ``slots`` > 0: [N*OH, OW, K]) needs contiguous channels, images and (flat)
    rows that follow one another, strides of whole 16-byte units (16-bit data)."""
    syn, syc, syh, syw = strides
    rows_follow = slots > 0 or syh == ow * syw
    return syc == 1 and syn == oh * syh and rows_follow and tma_store_strides_fit(strides, 1, 1, 2)


def gemm_store_mode(cfg: tuning.ConvConfig, size: int, one_wave: bool, steps: int, strided: bool) -> int:
    """The kernel's TMA_STORE for a tile of ``cfg`` (``steps`` reduction steps; ``strided``: rows of
    slots) whose output may take TMA stores (gemm_tma_store and the launch's strides): 1, a program
    per tile; 2, persistent programs of one-part tiles of flat rows and at most
    tuning.GLUON_GEMM_PERSISTENT_TMA_MAX_STEPS steps, each computing warpgroup's output tile beside
    the ring; 0 (pointer stores) for tiles of fewer than tuning.TMA_STORE_MIN_PIXELS pixels in the
    first part, and other persistent tiles (or buffers that do not fit beside the ring)."""
    parts = pixel_parts(cfg.block_m)
    if parts[0] < tuning.TMA_STORE_MIN_PIXELS:
        return 0
    if one_wave:
        return 1
    if len(parts) > 1 or strided or steps > tuning.GLUON_GEMM_PERSISTENT_TMA_MAX_STEPS:
        return 0
    ring = cfg.num_stages * (cfg.block_m + cfg.block_n) * cfg.block_k * size
    return 2 if ring + tma_store_bytes(cfg, size) <= GEMM_SHARED_BYTES else 0


def tma_store_bytes(cfg: tuning.ConvConfig, size: int) -> int:
    """Shared memory of persistent programs' TMA stores: an output tile per computing warpgroup
    (one part: block_m pixels)."""
    return cfg.consumers * cfg.block_m * cfg.block_n * size


def gemm_tma_store(spec: PlanSpec, slots: int) -> bool:
    """Whether gluon-gemm stores a program's tiles by TMA: 16-bit output
    of the plan's dtype whose strides fit (gemm_tma_store_fits; ``slots``: row_slots; channel-plane
    input: plane_tma_store_fits)."""
    out = spec.output_desc
    if plane_copies(spec):
        return False  # flat rows: a tile may span two images, a plane tile's copy holds one
    if channel_planes(spec):
        fits = plane_tma_store_fits(out.strides, out.dims[3])
    else:
        fits = gemm_tma_store_fits(out.strides, *out.dims[2:], slots)
    return sixteen_bit_output(spec) and fits


def plane_tma_store_fits(strides: tuple[int, ...], ow: int) -> bool:
    """Whether output strides (syn, syc, syh, syw) let TMA store channel-plane tiles: the output seen
    as [N, K, OH*OW] needs each plane's rows to follow one another and image and plane strides of
    whole 16-byte units (16-bit data)."""
    syn, syc, syh, syw = strides
    return syw == 1 and syh == ow and syn % 8 == 0 and syc % 8 == 0


def strided_defer_why(spec: PlanSpec, programs: int, sms: int, cfg: tuning.ConvConfig) -> str | None:
    """Strided 1x1: boxes of whole output rows, against triton-conv and the window solvers (H100,
    batch 32, CBNA): 16-bit always faster (fp16 r50_08 24.5 us against 30.0 for triton-conv, r50_14
    17.5 against 22.6, r50_20 16.1 against 16.3 for gluon-window); fp32 (TF32) within one wave
    (r50_20 29.6 against 31.6) or with two warpgroups taking tiles in turn (warm L2: r50_08 39.7
    against 52.6, r50_14 32.9 against 42.0), not with one beyond a wave (r50_08 56.7 against 50.4,
    r50_14 41.6 against 39.9)."""
    if spec.dtype != DataType.FLOAT or programs <= sms or cfg.consumers > 1:
        return None
    return f"fp32 strided beyond one wave ({programs} tiles on {sms} multiprocessors): triton-conv measured faster"


#: NORMAL find's tiles of one computing warpgroup (pixels x channels): around what the cost model
#: picks at batch 32.
FIND_TILES = ((96, 128), (128, 128), (192, 128), (64, 128), (208, 128), (112, 64), (64, 256), (96, 256))


class GluonGemmKernel(TritonConvKernel):
    reads_descriptors = True
    splits_reduction = False
    solver_name = "gluon-gemm"
    stem = "gluon_gemm"

    @property
    def candidates(self) -> list[tuning.ConvConfig]:  # type: ignore[override]
        """NORMAL find's configurations: FIND_TILES with one computing warpgroup and 64 to 128 pixels
        with two taking tiles in turn, in steps of 128-byte rows of the plan's dtype with the
        stages gemm_stages gives; strided, only tiles whose parts hold whole output rows."""
        size = self.spec.dtype.torch_dtype.itemsize
        block_k = step_channels(size)
        found = [
            tuning.ConvConfig(p, n, block_k, 8, w, gemm_stages(p, n, block_k, size, True, w), 1)
            for p, n in FIND_TILES
            for w in (4 if n == 64 else 8,)
        ] + [
            tuning.ConvConfig(p, 128, block_k, 8, 4, gemm_stages(p, 128, block_k, size, True, 4, 2), 1, consumers=2)
            for p in (64, 96, 128)
        ]
        return [c for c in found if pixel_parts(c.block_m)[-1] >= self.pixel_slots]

    @staticmethod
    def render(spec: PlanSpec, stages: list[Stage]) -> str:
        return render_gluon_gemm_source(spec, stages, plane_copy_vec(spec) if plane_copy_mode(spec) > 0 else None)

    def _pixel_slots(self, spec: PlanSpec) -> int:
        """Strided, the rows of the product are slots of whole output rows (row_slots: decided once,
        the heuristic, the grid and every launch read them; the base class counts the product's
        rows, _m, from them); 0 for flat rows of pixels."""
        return row_slots(spec)

    def heuristic(self, m: int, k_per_group: int, c_per_group: int, dtype: torch.dtype) -> tuning.ConvConfig:
        sms = multiprocessors(self._handle)
        shared = gemm_shared_bytes(self.spec)
        return gluon_gemm_config(
            m, k_per_group, c_per_group, dtype, sms, self.pixel_slots, self.tma_store, self.padded, shared
        )

    @cached_property
    def copies(self) -> bool:
        """Whether the input's channel planes come by asynchronous copies (plane_copies)."""
        return plane_copies(self.spec)

    @cached_property
    def pairs(self) -> bool:
        """Whether the input's channel planes come as pairs, the even ones by boxes (plane_pairs)."""
        return plane_pairs(self.spec)

    @cached_property
    def copy_mode(self) -> int:
        """The kernel's COPIES (plane_copy_mode), worked out once: the source and every launch read it."""
        return plane_copy_mode(self.spec)

    def pack(self, weight: Tensor) -> Tensor:
        """[K, C]; plane pairs: each reduction step's channels even ones first (pair_order)."""
        packed = pack_rows_rsc(weight)
        if not self.pairs:
            return packed
        order = pair_order(packed.shape[1], step_channels(packed.element_size()))
        order = torch.tensor(order, device=packed.device)
        return packed.index_select(1, order).contiguous()

    @cached_property
    def plane(self) -> int:
        """Pixels of an image's channel planes where the input is read as planes (channel_planes), else 0."""
        _, _, h, w = self.spec.input_desc.dims
        return h * w if channel_planes(self.spec) else 0

    @cached_property
    def padded(self) -> int:
        """Pixels of an image's planes that tiles may not cross (padded_plane), worked out once: every
        launch's rows read it."""
        return padded_plane(self.spec)

    def _rows(self, cfg: tuning.ConvConfig) -> int:
        """Rows of the product in tiles of ``cfg`` (plane_rows of the padded planes)."""
        return plane_rows(self._m(), cfg.block_m, self.padded)

    def programs_and_steps(self, cfg: tuning.ConvConfig) -> tuple[int, int]:
        """Tiles of the product's rows (not triton-window's windows) and reduction steps."""
        _, c, k = self.geometry[:3]
        return triton_cdiv(self._rows(cfg), cfg.block_m) * triton_cdiv(k, cfg.block_n), triton_cdiv(c, cfg.block_k)

    def narrower_config(self) -> tuning.ConvConfig | None:
        """Two stages fewer (a specialization reading a prior output needs more shared memory)."""
        if self.config.num_stages <= 2:
            return None
        return replace(self.config, num_stages=max(2, self.config.num_stages - 2))

    def _launch_args(
        self,
        cfg: tuning.ConvConfig,
        x: Tensor,
        packed: Tensor,
        out: Tensor,
        p: Tensor,
        values: list,
        flags: dict[str, bool],
        has_prior: bool,
        strides: tuple[int, ...] | None = None,
        idx64: bool | None = None,
    ) -> tuple[tuple[int, int, int], tuple, list]:
        _, c, k = self.geometry[:3]
        m, slots, plane = self._rows(cfg), self.pixel_slots, self.plane
        oh, ow = self.out_hw
        parts = pixel_parts(cfg.block_m)
        if slots and parts[-1] < slots:
            raise ValueError(f"tile {cfg}: each part of its pixels must hold whole output rows of {slots} slots")
        unused = max(16, slots)  # unused parts: the smallest box, never loaded
        sizes = (*parts, *(unused,) * (MAX_PARTS - len(parts)))
        tiles = triton_cdiv(k, cfg.block_n) * triton_cdiv(m, cfg.block_m)
        grid = (min(tiles, multiprocessors(self._handle)), 1, 1)  # persistent: a program per multiprocessor
        swizzle, bits = box_swizzle_and_bits(self.spec, cfg)
        w_desc = gluon_descriptor(packed, [k, c], [c, 1], [cfg.block_n, cfg.block_k], swizzle, bits)
        if self.copies:
            a_descs = [w_desc] * MAX_PARTS  # tokens: the planes come by asynchronous copies from x
        elif self.pairs:
            a_descs = [self._pair_descriptor(x, size, cfg.block_k, bits) for size in sizes]
        elif plane:
            a_descs = [self._plane_descriptor(x, size, cfg.block_k, bits) for size in sizes]
        else:
            a_descs = [self._input_descriptor(x, size, cfg.block_k, swizzle, bits) for size in sizes]
        out_strides = strides[4:] if strides else (*out.stride(), *p.stride())
        one_wave = tiles <= grid[0]
        fits = self.tma_store and self._tma_store_fits(out_strides[:4]) and out.data_ptr() % 16 == 0
        store_mode = gemm_store_mode(cfg, bits // 8, one_wave, triton_cdiv(c, cfg.block_k), slots > 0) if fits else 0
        y_descs = [w_desc] * MAX_PARTS  # tokens where stores are by pointer
        if store_mode:
            y_descs = [self._part_output_descriptor(out, out_strides[:4], size, bits, cfg.block_n) for size in sizes]
        consts = (
            cfg.block_n,
            cfg.block_k,
            *sizes,
            len(parts),
            cfg.num_stages,
            bits,
            COPY_REGS if self.copy_mode else LOAD_REGS,
            needs_int64(out, p) if idx64 is None else idx64,
            has_prior,
            not one_wave,  # persistent
            cfg.consumers,
            COPY_CONSUMER_REGS if self.copy_mode else CONSUMER_REGS,
            slots,
            gemm_epilogue_mode(x.element_size()),
            store_mode,
            bool(plane),
            gemm_plane_vector(out_strides[:4], out, oh, ow) if plane else 0,
            self.copy_mode,
            *flags.values(),
        )
        hwp = m // self.spec.input_desc.dims[0] if plane else 1  # an image's padded pixels
        sizes_and_strides = [m, c, k, oh * ow, ow, hwp, *out_strides]
        args = [*a_descs, w_desc, out, p, x, *y_descs, *values, *sizes_and_strides, *consts]
        return grid, cfg, args

    def _input_descriptor(self, x: Tensor, size: int, block_k: int, swizzle: int, bits: int):
        """A part's descriptor of the input: [N*H*W, C], boxes of ``size`` pixels; strided, the
        output's rows of the input, [N*OH, OW, C] (rows stride_h*W*C apart, pixels stride_w*C),
        boxes of ``size`` / row_slots whole rows, the slots past OW zero-filled."""
        n, c, h, w = self.spec.input_desc.dims
        slots = self.pixel_slots
        if not slots:
            return gluon_descriptor(x, [n * h * w, c], [c, 1], [size, block_k], swizzle, bits)
        stride_h, stride_w = self.conv_args[2:4]
        oh, ow = self.out_hw
        view = [n * oh, ow, c], [stride_h * w * c, stride_w * c, 1]
        return gluon_descriptor(x, *view, [size // slots, slots, block_k], swizzle, bits)

    def _tma_store_fits(self, strides: tuple[int, ...]) -> bool:
        """Whether a launch's output strides let TMA store its tiles (plane_tma_store_fits for
        channel-plane input, else gemm_tma_store_fits)."""
        oh, ow = self.out_hw
        if self.plane:
            return plane_tma_store_fits(strides, ow)
        return gemm_tma_store_fits(strides, oh, ow, self.pixel_slots)

    def _plane_descriptor(self, x: Tensor, size: int, block_k: int, bits: int):
        """A part's descriptor of channel-plane input: [N*C, H*W], boxes of ``block_k`` planes by
        ``size`` pixels (rows of ``size`` elements swizzled as wide as they are, up to 128 bytes)."""
        n, c, h, w = self.spec.input_desc.dims
        return gluon_descriptor(x, [n * c, h * w], [h * w, 1], [block_k, size], plane_swizzle(size, bits), bits)

    def _pair_descriptor(self, x: Tensor, size: int, block_k: int, bits: int):
        """A part's descriptor of plane pairs (plane_pairs): [N*C/2, 2*H*W], boxes of the even halves of
        ``block_k`` channels by ``size`` pixels."""
        n, c, h, w = self.spec.input_desc.dims
        view = [n * c // 2, 2 * h * w], [2 * h * w, 1]
        return gluon_descriptor(x, *view, [block_k // 2, size], plane_swizzle(size, bits), bits)

    def pointer_slots(self, args: list) -> tuple[int | tuple[int, ...], ...]:
        """The input's three descriptors (tokens where the planes come by copies) and pointer, the
        output's pointer and, where tiles are stored by TMA, its three descriptors, the prior."""
        return (6 if self.copies else (0, 1, 2, 6), (4, 7, 8, 9) if args[7].base is args[4] else 4, 5)

    @cached_property
    def tma_store(self) -> bool:
        """Whether the plan's output may take TMA stores (gemm_tma_store, worked out once: every
        launch reads it); each launch checks its output's strides and address, and its tile
        (gemm_store_mode)."""
        return gemm_tma_store(self.spec, self.pixel_slots)

    def _part_output_descriptor(self, out: Tensor, strides: tuple[int, ...], size: int, bits: int, block_n: int):
        """A part's descriptor of the output: [N*OH*OW, K], boxes of ``size`` pixels and 64 channels;
        strided, [N*OH, OW, K], boxes of ``size`` / row_slots whole rows (TMA clips the slots past OW);
        channel-plane input: [N, K, OH*OW], boxes of the tile's ``block_n`` planes by ``size`` pixels."""
        n = self.spec.input_desc.dims[0]
        oh, ow = self.out_hw
        syn, syc, syh, syw = strides
        if self.plane:
            view = [n, self.k, oh * ow], [syn, syc, 1]
            return gluon_descriptor(out, *view, [1, block_n, size], plane_swizzle(size, bits), bits)
        slots = self.pixel_slots
        if not slots:
            return gluon_descriptor(out, [n * oh * ow, self.k], [syw, 1], [size, 64], 128, bits)
        return gluon_descriptor(out, [n * oh, ow, self.k], [syh, syw, 1], [size // slots, slots, 64], 128, bits)


class GluonGemmSolver(Solver):
    name = "gluon-gemm"
    family = "triton"

    def why_not(self, spec: PlanSpec, handle) -> str | None:
        return (
            conv_plan_why_not(spec)
            or gluon_gemm_input_why_not(spec)
            or gluon_dtype_why_not(spec, handle.tf32_allowed(), "triton-gemm")
            or gluon_why_not()
            or hopper_why_not(handle)
        )

    def defer_why(self, spec: PlanSpec, handle) -> str | None:
        return gluon_gemm_defer_why(spec, multiprocessors(handle))

    def build(self, spec: PlanSpec, handle) -> Kernel:
        return GluonGemmKernel(spec, handle)
