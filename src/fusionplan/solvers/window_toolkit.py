"""What the kernels over windows share (triton-window, gluon-window, and gluon-gemm and -rows
for their descriptors and shape arguments): which plans windows take, the window a
configuration reads, its tiles and programs, and the geometry of the input's and weights'
tensor descriptors."""

from __future__ import annotations

import torch

from fusionplan.core.enums import DataType
from fusionplan.runtime import tuning
from fusionplan.runtime.folding import split_at_conv
from fusionplan.runtime.tma import host_descriptor
from fusionplan.solvers.base import PlanSpec
from fusionplan.solvers.conv_kernel import TritonConvKernel
from fusionplan.solvers.conv_toolkit import (
    descriptor_input_why_not,
    triton_cdiv,
)

Tensor = torch.Tensor


def window_area(spec: PlanSpec) -> tuple[int, int, int]:
    """The images, rows and columns a window may span: the output's, within the smallest view of
    the input that one stride class of pixels forms (H // stride rows), since boxes must fit inside."""
    _, conv, _ = split_at_conv(spec.ops)
    assert conv is not None
    (h, w), (oh, ow) = spec.input_desc.dims[2:], conv.output_desc.dims[2:]
    str_h, str_w = conv.conv.strides
    return spec.input_desc.dims[0], min(oh, h // str_h), min(ow, w // str_w)


def window_tiles(spec: PlanSpec, pixels: int) -> tuple[tuple[int, int, int], int] | None:
    """The window (TILE_N, TILE_H, TILE_W) of ``pixels`` pixels and how many cover the output, or
    None when no such window fits."""
    window = tuning.window_shape(*window_area(spec), pixels)
    if window is None:
        return None
    n = spec.input_desc.dims[0]
    oh, ow = spec.output_desc.dims[2:]
    tile_n, tile_h, tile_w = window
    return window, triton_cdiv(n, tile_n) * triton_cdiv(oh, tile_h) * triton_cdiv(ow, tile_w)


def one_view_why_not(spec: PlanSpec, block_k: int) -> str | None:
    """Why the window kernel cannot read every stride class through one view of the input (one loop
    over all taps), or None: it can with stride 1, or where the image's height and width are
    multiples of the stride and C of the step's ``block_k`` channels (a step's box must not reach
    the next class's channels)."""
    _, conv, _ = split_at_conv(spec.ops)
    assert conv is not None
    _, c, h, w = spec.input_desc.dims
    str_h, str_w = conv.conv.strides
    if (str_h, str_w) == (1, 1) or (h % str_h == 0 and w % str_w == 0 and c % block_k == 0):
        return None
    return (
        f"strided: one view of every stride class needs H={h} and W={w} multiples of the stride "
        f"{str_h}x{str_w} and C={c} of {block_k}"
    )


# ---- the geometry of a window kernel's launch (kernel: a TritonConvKernel reading windows) --------
def windows(kernel: TritonConvKernel, cfg: tuning.ConvConfig) -> tuple[tuple[int, int, int], int]:
    """The window of ``cfg.block_m`` pixels and how many cover the output (window_tiles)."""
    tiles = window_tiles(kernel.spec, cfg.block_m)
    if tiles is None:  # NORMAL find skips such a candidate
        n = kernel.spec.input_desc.dims[0]
        oh, ow = kernel.out_hw
        raise ValueError(f"no window of {cfg.block_m} pixels fits {n} {oh}x{ow} outputs")
    return tiles


def window_programs_and_steps(kernel: TritonConvKernel, cfg: tuning.ConvConfig) -> tuple[int, int]:
    """Programs (windows times channel tiles) and reduction steps (taps times channel steps)."""
    c = kernel.spec.input_desc.dims[1]
    r, s = kernel.conv.w_desc.dims[2:]
    return windows(kernel, cfg)[1] * triton_cdiv(kernel.k, cfg.block_n), r * s * triton_cdiv(c, cfg.block_k)


def reads_one_view(spec: PlanSpec, cfg: tuning.ConvConfig) -> bool:
    """Whether the kernel reads the input through one view of every stride class (one_view_why_not)."""
    return one_view_why_not(spec, cfg.block_k) is None


def one_view_geometry(kernel: TritonConvKernel, cfg: tuning.ConvConfig, window: tuple[int, int, int]):
    """Shape, strides and box (elements) of the input's one view of every stride class,
    [N, H/s, s, W/s, s*C], read a window and a step of channels at a time."""
    n, c, h, w = kernel.spec.input_desc.dims
    str_h, str_w = kernel.conv_args[2:4]
    view = [n, h // str_h, str_h, w // str_w, str_w * c]
    strides = [h * w * c, str_h * w * c, w * c, str_w * c, 1]
    return view, strides, [window[0], window[1], 1, window[2], cfg.block_k]


def weight_geometry(kernel: TritonConvKernel, cfg: tuning.ConvConfig) -> tuple[list, list, list]:
    """Shape, strides and box of the packed weights, [K, R*S*C], read BLOCK_N x BLOCK_K at a time."""
    depth = kernel.conv.w_desc.dims[2] * kernel.conv.w_desc.dims[3] * kernel.spec.input_desc.dims[1]  # R*S*C
    return [kernel.k, depth], [depth, 1], [cfg.block_n, cfg.block_k]


def window_host_descriptors(
    kernel: TritonConvKernel, cfg: tuning.ConvConfig, window: tuple[int, int, int], x: Tensor, packed: Tensor,
    one_view: bool,
):  # fmt: skip
    """Host descriptors of the input's one view (a stand-in over the weights, unused, where the
    kernel builds a view per stride class) and of the packed weights. Built in the kernel (in
    global memory, behind a proxy fence) they cost about 2 us per launch (lab/NOTES.md, 15)."""
    view, strides, box = one_view_geometry(kernel, cfg, window)
    if one_view:
        x_desc = host_descriptor(x, view, strides, box)
    else:
        x_desc = host_descriptor(packed, [1, 1, 1, 1, cfg.block_k], [cfg.block_k] * 4 + [1], box)
    return x_desc, host_descriptor(packed, *weight_geometry(kernel, cfg))


def window_shape_args(kernel: TritonConvKernel, out: Tensor, p: Tensor, strides: tuple[int, ...] | None) -> list:
    """N, C, K, H, W, OH, OW, the output's and the prior's strides (``strides[4:]`` where given,
    else the tensors' own), pads and dilations: the window kernels' shape arguments, in order."""
    n, c, h, w = kernel.spec.input_desc.dims
    out_strides = strides[4:] if strides else (*out.stride(), *p.stride())
    pads, dilations = kernel.conv_args[:2], kernel.conv_args[4:]
    return [n, c, kernel.k, h, w, *kernel.out_hw, *out_strides, *pads, *dilations]


#: The output window's pixels and channels: masks, image, row, column, offsets (``{lang}``: tl or
#: gl; ``{k0}``: the first channel; ``{layout_m}``, ``{layout_n}``: Gluon's layouts of the ranges).
WINDOW_COORDINATES = """offs_m = {lang}.arange(0, TILE_N * TILE_H * TILE_W{layout_m})
offs_n = {k0} + {lang}.arange(0, BLOCK_N{layout_n})
n_img = n0 + offs_m // (TILE_H * TILE_W)
oh = oh0 + (offs_m // TILE_W) % TILE_H
ow = ow0 + offs_m % TILE_W
m_mask = (n_img < N) & (oh < OH) & (ow < OW)
n_mask = offs_n < K
if IDX64:  # offsets of outputs past 2^31 elements, an image's among them
    n_img = n_img.to({lang}.int64)
    oh = oh.to({lang}.int64)
    ow = ow.to({lang}.int64)
    offs_n = offs_n.to({lang}.int64)
pix = oh * OW + ow
ch = offs_n"""


def window_why_not(spec: PlanSpec) -> str | None:
    """Why the plan's convolution cannot run over windows, or None when it can."""
    _, conv, _ = split_at_conv(spec.ops)
    assert conv is not None
    c = conv.conv
    if c.strides != (1, 1) and c.dilations != (1, 1):
        return "strided convolutions are read as windows with dilation 1 only"
    if c.groups != 1:
        return "grouped convolutions are not read as windows"
    why = descriptor_input_why_not(spec, "read in boxes")
    if why:
        return why
    images, rows, cols = window_area(spec)
    if tuning.largest_window(images, rows, cols) < 64:
        return (
            f"windows that fit {images} image(s) of {rows}x{cols} pixels hold fewer than 64, too few for the "
            "tensor-core products; triton-conv's implicit GEMM takes any size"
        )
    return None


def window_config(spec: PlanSpec, interpret: bool) -> tuning.ConvConfig:
    """The FAST configuration of the plan's window kernel (on a GPU unless ``interpret``)."""
    _, conv, _ = split_at_conv(spec.ops)
    assert conv is not None
    n, c = spec.input_desc.dims[:2]
    k, oh, ow = conv.output_desc.dims[1:]
    return tuning.window_heuristic(n * oh * ow, k, c, (oh, ow), window_area(spec), spec.dtype.torch_dtype, interpret)


def window_programs(spec: PlanSpec) -> int:
    """The programs of the window kernel's unsplit grid on a GPU (the FAST configuration), or 0
    where no window fits the output."""
    if tuning.largest_window(*window_area(spec)) < 64:
        return 0
    cfg = window_config(spec, interpret=False)
    tiles = window_tiles(spec, cfg.block_m)
    return 0 if tiles is None else tiles[1] * triton_cdiv(spec.output_desc.dims[1], cfg.block_n)


def filter_is_1x1(spec: PlanSpec) -> bool:
    """Whether the plan's convolution has a 1x1 filter."""
    _, conv, _ = split_at_conv(spec.ops)
    assert conv is not None
    return conv.w_desc.dims[2:] == (1, 1)


def window_grid_defer_why(spec: PlanSpec) -> str | None:
    """Where windows lose to triton-conv whatever the kernel (H100, fp16): few input channels
    (one channel block per tap) and small grids (batch 1)."""
    ch = spec.input_desc.dims[1]
    if ch < tuning.WINDOW_MIN_CHANNELS:
        return f"C={ch} < {tuning.WINDOW_MIN_CHANNELS}: one channel block per filter tap, slower than triton-conv"
    programs = window_programs(spec)
    if programs < tuning.WINDOW_MIN_PROGRAMS:
        return (
            f"{programs} programs < {tuning.WINDOW_MIN_PROGRAMS}: triton-conv measured faster on such grids "
            "(batch 1, fp16: r50_12 12.9 against 19.1 us, r50_04 4.2 against 5.3)"
        )
    return None


def strided_taps_defer_why(spec: PlanSpec) -> str | None:
    """Strided filters of several taps on 16-bit data with many output pixels, where triton-conv
    tests a bit per tap (tuning.WINDOW_STRIDED_TAPS_MAX_PIXELS): it measured faster than either
    window kernel (in TF32 neither was ahead in both suites: r50_06 46.1 against 47.0 us, 48.1
    against 47.6)."""
    _, conv, _ = split_at_conv(spec.ops)
    assert conv is not None
    r, s = conv.w_desc.dims[2:]
    k, oh, ow = conv.output_desc.dims[1:]
    pixels, size = spec.output_desc.numel // k, spec.dtype.torch_dtype.itemsize
    if conv.conv.strides == (1, 1) or r * s == 1 or size != 2 or pixels < tuning.WINDOW_STRIDED_TAPS_MAX_PIXELS:
        return None
    if not tuning.conv_tap_bits_pay(r * s, size, True, oh * ow):
        return None
    return (
        f"strided {r}x{s} filter, {pixels} >= {tuning.WINDOW_STRIDED_TAPS_MAX_PIXELS} output pixels: "
        "triton-conv with a bit per tap measured faster (fp16: r50_06 21.9 against 22.9 us)"
    )


def strided_1x1_defer_why(spec: PlanSpec) -> str | None:
    """Strided 1x1 filters of 16-bit data with many output pixels: triton-conv's 3-stage tiles
    measured faster than triton-window (H100) and as fast as gluon-window (H200, lab/NOTES.md,
    section 15)."""
    _, conv, _ = split_at_conv(spec.ops)
    assert conv is not None
    pixels = spec.output_desc.numel // spec.output_desc.dims[1]
    if spec.dtype == DataType.FLOAT or conv.conv.strides == (1, 1) or not filter_is_1x1(spec):
        return None
    if pixels < tuning.WINDOW_STRIDED_1X1_MAX_PIXELS:
        return None
    return (
        f"strided 1x1 filter, {pixels} >= {tuning.WINDOW_STRIDED_1X1_MAX_PIXELS} output pixels: "
        "triton-conv measured faster (fp16: r50_08 29.7 against 38.9 us, r50_14 22.3 against 26.5)"
    )
