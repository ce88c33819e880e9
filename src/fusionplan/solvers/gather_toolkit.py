"""What the gather kernels share (gluon-nchw, -nchw-regs, -row-pairs, and -plane-chunks through
row-pairs): their tiles and rings, their configurations, the coordinates their epilogue takes,
and their launch (gather_launch_args, which each kernel's launch_constants and launch_grid
complete)."""

from __future__ import annotations

from dataclasses import replace

import torch

from fusionplan.core.enums import DataType
from fusionplan.runtime import tuning
from fusionplan.runtime.folding import split_at_conv
from fusionplan.runtime.launch import needs_int64
from fusionplan.solvers.base import PlanSpec
from fusionplan.solvers.conv_kernel import TritonConvKernel
from fusionplan.solvers.conv_toolkit import triton_cdiv
from fusionplan.solvers.gluon_toolkit import gluon_descriptor

Tensor = torch.Tensor


#: A tile's gathered pixels and one reduction step's input operand, gathered in the layout of
#: its pointers (both gluon-nchw kernels).
GATHER_STEP = """@gluon.jit
def _tap_and_block(kb, TAPS: gl.constexpr):
    # Step kb's filter tap and channel block: the taps of a channel block one after another (their
    # shifted reads of the same input lines meet in L1)
    return kb % TAPS, kb // TAPS


@gluon.jit
def _weights_column(kb, num_cb, C, TAPS: gl.constexpr, BLOCK_K: gl.constexpr):
    # step kb's first column of the packed weights ([K, R*S*C], a tap's C channels after another's)
    t, cb = _tap_and_block(kb, TAPS)
    return t * C + cb * BLOCK_K


@gluon.jit
def _gather_pixels(
    m0, M, OH, OW, sxn, pad_h, pad_w, layout: gl.constexpr, STR_H: gl.constexpr, STR_W: gl.constexpr,
    PIXELS: gl.constexpr, BLOCK_K: gl.constexpr, IDX64: gl.constexpr,
):
    # The tile's flat output pixels in ``layout`` (of the [pixels, BLOCK_K] operand): each one's
    # image offset, first tap's input row and column, and mask; and the channels' offsets.
    offs_m = m0 + gl.arange(0, PIXELS, layout=gl.SliceLayout(1, layout))
    offs_c = gl.arange(0, BLOCK_K, layout=gl.SliceLayout(0, layout))
    m_mask = offs_m < M
    if IDX64:  # offsets of inputs past 2^31 elements
        offs_m = offs_m.to(gl.int64)
        offs_c = offs_c.to(gl.int64)
    ohw = OH * OW
    pix = offs_m % ohw
    ih0 = (pix // OW) * STR_H - pad_h
    iw0 = (pix % OW) * STR_W - pad_w
    base = (offs_m // ohw) * sxn
    return base, ih0, iw0, m_mask, offs_c


@gluon.jit
def _gather_step(
    x_ptr, base, ih0, iw0, m_mask, offs_c, kb, steps, num_cb, C, H, W, sxh, sxw, dil_h, dil_w,
    SXC: gl.constexpr, R: gl.constexpr, S: gl.constexpr, BLOCK_K: gl.constexpr, WHOLE_CB: gl.constexpr,
):
    # Step kb's [pixels, BLOCK_K] operand (zeros past the last step): its tap's input pixels, each
    # thread's channels of its pixel one address and constant offsets (SXC, the channel stride, is
    # a constant of the plan: immediates of the loads).
    t, cb = _tap_and_block(kb, R * S)
    c0 = cb * BLOCK_K
    ih = ih0 + (t // S) * dil_h
    iw = iw0 + (t % S) * dil_w
    inside = m_mask & (ih >= 0) & (ih < H) & (iw >= 0) & (iw < W) & (kb < steps)
    ptrs = (x_ptr + (base + ih * sxh + iw * sxw + c0 * SXC))[:, None] + (offs_c * SXC)[None, :]
    if WHOLE_CB:  # C a multiple of BLOCK_K: no channel past C
        mask = inside[:, None]
    else:  # channels past C read zeros, so the weight columns of the next tap they meet add nothing
        mask = inside[:, None] & ((c0 + offs_c) < C)[None, :]
    return gl.load(ptrs, mask=mask, other=0.0)


"""


#: A tile's flat pixels and channels in ``{layout}``: masks, image, row, column, offsets.
GATHER_COORDINATES = """offs_m = m0 + gl.arange(0, PIXELS, layout=gl.SliceLayout(1, {layout}))
offs_n = k0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, {layout}))
m_mask = offs_m < M
n_mask = offs_n < K
if IDX64:  # offsets of outputs past 2^31 elements
    offs_m = offs_m.to(gl.int64)
    offs_n = offs_n.to(gl.int64)
n_img = offs_m // ohw
pix = offs_m % ohw
oh = pix // OW
ow = pix % OW
ch = offs_n"""


def gather_defer_why(spec: PlanSpec, multiprocessors: int, strided_1x1: bool = False) -> str | None:
    """Where other kernels measured faster (the limits in tuning.GLUON_NCHW_*): packed
    channels-last input goes through tensor boxes (gluon-gemm, gluon-window, triton-gemm,
    triton-conv's 16-byte copies); NCHW-like input (unit-stride pixels) on large output planes
    through triton-conv's rows of slots and triton-gemm-nchw's boxes, strided 1x1 filters of
    16-bit data unless ``strided_1x1`` (the caller's own rule for them); small grids through
    triton-conv's split reductions."""
    x = spec.input_desc
    if x.strides[1] == 1:
        return "channels-last input: the tensor-box and 16-byte-copy kernels read it"
    _, conv, _ = split_at_conv(spec.ops)
    assert conv is not None
    k, c, r, s = conv.w_desc.dims
    oh, ow = conv.output_desc.dims[2:]
    several = r * s > 1
    strided = conv.conv.strides != (1, 1)
    fp32 = spec.dtype == DataType.FLOAT
    if not several and strided and not strided_1x1 and not fp32:
        return "strided 1x1 filters: triton-conv and triton-gemm-nchw measured faster (r50_20 56.4 us against 65.4)"
    if not several and strided and fp32:
        limit = tuning.GLUON_NCHW_FP32_STRIDED_1X1_MAX_PLANE
    elif not several:
        limit = tuning.GLUON_NCHW_1X1_MAX_PLANE
    elif fp32:
        limit = tuning.GLUON_NCHW_FP32_MAX_PLANE
    else:
        limit = tuning.GLUON_NCHW_MAX_PLANE
    if oh * ow > limit:
        kind = "1x1 filters" if not several else "fp32 data" if fp32 else "several taps"
        return (
            f"output planes of {oh * ow} pixels (> {limit} for {kind}): triton-conv's rows of slots and "
            "triton-gemm-nchw's tensor boxes measured faster"
        )
    m = x.dims[0] * oh * ow
    cfg = gather_config(m, k, spec.dtype.torch_dtype, multiprocessors, r * s * c, strided)
    programs = triton_cdiv(m, cfg.block_m) * triton_cdiv(k, cfg.block_n) * cfg.split_k
    if programs < tuning.GLUON_NCHW_MIN_PROGRAMS:
        return (
            f"a grid of {programs} programs (< {tuning.GLUON_NCHW_MIN_PROGRAMS}): triton-conv splits the "
            "reduction of small grids"
        )
    return None


def gather_config(
    m: int, k: int, dtype: torch.dtype, multiprocessors: int, depth: int = 0, strided: bool = False
) -> tuning.ConvConfig:
    """The first tile of gather_tiles whose grid, its reduction split as gather_split allows for a
    reduction of ``depth`` products (R*S*C), still fills half the multiprocessors (the smallest
    otherwise; fp16, batch 32: 128 x 128 on r50_16's 98 programs 32.4 us against 44.5 for 64 x 128,
    64 x 128 on r50_21's 100, 64 x 256 split in two on r50_22's 50 x 2), with reduction steps of
    step_bytes(strided) and as many stages as ring_bytes holds (2 to 6)."""
    size = torch.empty((), dtype=dtype).element_size()
    row, ring = step_bytes(strided), ring_bytes(strided, size)
    tiles = GATHER_TILES
    for pixels, block_n in tiles:
        programs = triton_cdiv(m, pixels) * triton_cdiv(k, block_n)
        split = gather_split(programs, depth, multiprocessors)
        if programs * split >= multiprocessors // 2:
            return replace(gather_tile(pixels, block_n, size, row, ring), split_k=split)
    return gather_tile(*tiles[-1], size, row, ring)


def step_bytes(strided: bool) -> int:
    """Bytes of a pixel's channels in one reduction step: 128 (a swizzled row), or for strided
    convolutions tuning.GLUON_NCHW_STRIDED_STEP_BYTES."""
    return tuning.GLUON_NCHW_STRIDED_STEP_BYTES if strided else 128


def ring_bytes(strided: bool, size: int = 2) -> int:
    """Shared memory of the pipeline's stages at most: tuning.GLUON_NCHW_STRIDED_RING_BYTES for
    strided convolutions of 16-bit data (``size`` bytes an element), else
    tuning.GLUON_NCHW_RING_BYTES."""
    return tuning.GLUON_NCHW_STRIDED_RING_BYTES if strided and size == 2 else tuning.GLUON_NCHW_RING_BYTES


def gather_split(programs: int, depth: int, multiprocessors: int) -> int:
    """How many programs share each tile's reduction of ``depth`` products: grids below half the
    multiprocessors split in powers of two (fp32 partial sums, summed by a tile's last program)
    while the grid stays within the multiprocessors and each part keeps at least
    tuning.GLUON_NCHW_SPLIT_MIN_DEPTH products. H100, fp16,
    batch 32, warm L2 (lab/NOTES.md section 26): 64 x 256 in two parts on r50_22 32.0 us against
    36.0 for 64 x 128 whole, r50_18 46.9 / 50.3; not r50_21's 2048 channels: 23.2 / 19.9."""
    split = 1
    if programs >= multiprocessors // 2:
        return split
    while programs * split * 2 <= multiprocessors and depth // (split * 2) >= tuning.GLUON_NCHW_SPLIT_MIN_DEPTH:
        split *= 2
    return split


#: gluon-nchw's tiles (pixels x output channels) in order of preference. 64 x 256 first: each
#: pixel tile reads its channel tile's weights from L2, each channel tile its gathered input, and
#: a tile twice as wide reads the input half as often (H100, fp16 CBNA, batch 32, warm L2: r50_16
#: 25.1 us against 31.6 for 128 x 128, r50_12 31.9 / 42.2, r50_19 20.2 / 21.6; r50_22, r50_18 and
#: r50_21 keep 64 x 128: their 50 programs of 64 x 256 leave most of the GPU idle; lab/NOTES.md
#: section 25).
GATHER_TILES = ((64, 256), (128, 128), (64, 128), (128, 64), (64, 64))


def gather_tile(
    pixels: int, block_n: int, size: int, row_bytes: int = 128, ring: int | None = None
) -> tuning.ConvConfig:
    """A tile of ``pixels`` x ``block_n`` for data of ``size`` bytes: reduction steps of
    ``row_bytes`` a pixel (64 or 128), as many stages as ``ring`` bytes hold (2 to 6; default
    ring_bytes(False)), one computing warpgroup."""
    block_k = row_bytes // size
    ring = ring_bytes(False) if ring is None else ring
    stages = max(2, min(6, ring // ((pixels + block_n) * block_k * size)))
    return tuning.ConvConfig(pixels, block_n, block_k, 8, 4, stages, 1)


# ---- a gather kernel's launch (kernel: gluon-nchw's, -nchw-regs', -row-pairs' or -plane-chunks') ----
def gather_programs_and_steps(kernel: TritonConvKernel, cfg: tuning.ConvConfig) -> tuple[int, int]:
    c = kernel.geometry[1]
    r, s = kernel.conv.w_desc.dims[2:]
    tiles = triton_cdiv(kernel.geometry[0], cfg.block_m) * triton_cdiv(kernel.k, cfg.block_n)
    return tiles, r * s * triton_cdiv(c, cfg.block_k)


def gather_launch_args(
    kernel: TritonConvKernel,
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
    """The gather kernels' launch (gather_launch), with each kernel's own constants
    (launch_constants) and grid (launch_grid)."""
    stages, own, workspace = kernel.launch_constants(cfg, x, out, strides)
    grid, cfg, args = gather_launch(
        kernel, cfg, stages, own, x, packed, out, p, values, flags, has_prior, strides, idx64, workspace
    )
    return kernel.launch_grid(cfg, grid), cfg, args


def gather_launch(
    kernel: TritonConvKernel,
    cfg: tuning.ConvConfig,
    stages: int,
    own: tuple,
    x: Tensor,
    packed: Tensor,
    out: Tensor,
    p: Tensor,
    values: list,
    flags: dict[str, bool],
    has_prior: bool,
    strides: tuple[int, ...] | None,
    idx64: bool | None,
    workspace: tuple[Tensor, ...] = (),
) -> tuple[tuple[int, int, int], tuple, list]:
    """A gather kernel's launch (this one's and gluon-nchw-regs'): the weights' descriptor, the
    shapes and strides, then the constants in the templates' order: the plan's and the tile's
    (``stages`` in the ring), the kernel's ``own``, the index width, prior, whole channel
    blocks, output layout, reduction order and the chain's flags. ``workspace``: a split
    reduction's partial sums and counters (gluon-nchw's), after the prior; ``cfg.split_k``
    programs along the grid's third axis."""
    c, k = kernel.geometry[1:3]  # input and output channels
    r, s = kernel.conv.w_desc.dims[2:]
    bits = x.element_size() * 8
    swizzle = min(128, cfg.block_k * bits // 8)
    w_desc = gluon_descriptor(packed, [k, r * s * c], [r * s * c, 1], [cfg.block_n, cfg.block_k], swizzle, bits)
    strides = strides or (*x.stride(), *out.stride(), *p.stride())
    pads, conv_strides, dilations = kernel.conv_args[:2], kernel.conv_args[2:4], kernel.conv_args[4:]
    consts = (
        strides[1],  # the input's channel stride: fixed by the plan (execute checks the input's strides)
        r,
        s,
        *conv_strides,
        cfg.block_m,
        cfg.block_n,
        cfg.block_k,
        stages,
        swizzle,
        bits,
        *own,
        needs_int64(x, out, p) if idx64 is None else idx64,
        has_prior,
        c % cfg.block_k == 0,
        strides[5] != 1,  # output channels apart: lanes along the pixels
        *flags.values(),
    )
    grid = (kernel.programs_and_steps(cfg)[0], 1, cfg.split_k)
    runtime_strides = (strides[0], *strides[2:])  # the channel stride is a constant
    args = [x, w_desc, out, p, *workspace, *values, *kernel.geometry, *runtime_strides, *pads, *dilations, *consts]
    return grid, cfg, args
