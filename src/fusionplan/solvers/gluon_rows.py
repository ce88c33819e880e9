"""Gluon rows solver: a convolution of few input channels (C x R x S small: ResNet's 64-channel
3x3 layers) on packed channels-last 16-bit input, computed one output row at a time by
persistent programs that hold the whole filter of their 64 output channels in registers
(Hopper only).

Why: on such layers the window kernels read every input pixel once per tap (nine times for a 3x3
filter) and the filter once per window, all from L2; that traffic, not the products, bounds them
(r50_02, C = K = 64 on 56x56, fp16, batch 32: about 2.7x its floor on triton-conv, lab/NOTES.md
section 30). Here each program takes a run of output rows (the grid's share of N x OH, image by
image) and

- a loading warp brings each input row of the run to shared memory once per filter column s,
  as a TMA box of the row shifted by s * dil_w - pad_w columns (zero-filled past the image's edges
  and above and below it), into a ring of row slots, each slot ``S`` boxes of [PIX, C];
- two computing warpgroups take the run's output rows in turn: output row oh is the sum over
  the taps (r, s) of W[r, s] (64 x C, in registers: wgmma's A operand) times the box of input row
  oh + r * dil_h - pad_h shifted by s (wgmma's B operand, read from the slot as TMA left it), a
  [64 channels, PIX pixels] accumulator; then the chain after the convolution and the store, while
  the other warpgroup's products run.

The filter comes first, by TMA into the ring's first slots, and each computing warpgroup copies it
into registers by ldmatrix before those slots take input rows (loaded by every warpgroup with
4-byte global loads, it took about half the kernel's time: lab/NOTES.md section 30).

Channel planes (NCHW input): a row's shifted boxes would start inside
a 16-byte unit, which TMA cannot read, so each input row comes once, as a box of its channel
planes from column 0, into the box of the filter column at offset 0, and a shifter partition
(a thread per plane's row) copies it into the slot's boxes of the other columns, moved by their
offsets s * dil_w - pad_w within its registers (the row split into even and odd halves and
interleaved back: byte permutes, no shuffles); the products then run as on channels-last rows,
the filter in registers (plane_mode 2; r50_02: 42.6 us on triton-conv -> 20.2, 18.5 on NHWC
input). Where the shifter cannot (rows over 64 pixels, no column at offset 0, the filter past
the registers), the filter stays in shared memory and
each filter column's products over the filter rows are summed, then moved by the column's offset
(gl.gather along the accumulator's rows: warp shuffles) and added into the row (plane_mode 1).
NCHW output of either is stored along the planes, 16 bytes a thread where strides allow.

With 65 to 128 input channels the filter of 64 output channels does not fit one warpgroup's
registers: each computing warpgroup holds one half of the channels (the boxes come in two halves
of 64), both compute every output row over their half, and the row's owner (they alternate) adds
the other's partial sum from shared memory before the chain. Measured slower than the window
kernels on ResNet's r50_10, such plans defer to them (find times them).

An input row is read by up to R consecutive output rows; a slot is refilled once the last output
row of each computing warpgroup that reads it has finished its products (a warpgroup that reads
it in no row: the other releases it for both). Rows of one image follow each other; where a run
crosses into the next image, the ring restarts there with that image's first rows. Output rows
are PIX = OW rounded up to a power of two pixels wide; the columns past OW are computed on zeros
and not stored.

Gluon has no interpreter: the kernel runs on Hopper GPUs only (CPU tests compile it for sm_90).
"""

from __future__ import annotations

from dataclasses import replace

import torch

from fusionplan.core.descriptors import Layout, layout_strides
from fusionplan.core.enums import DataType
from fusionplan.runtime import tuning
from fusionplan.runtime.folding import Stage, split_at_conv
from fusionplan.runtime.launch import needs_int64
from fusionplan.solvers.base import Kernel, PlanSpec, Solver
from fusionplan.solvers.conv_kernel import TritonConvKernel
from fusionplan.solvers.conv_toolkit import conv_plan_why_not, pack_rows_rsc, triton_cdiv
from fusionplan.solvers.gluon_toolkit import (
    BLOCK_N,
    CONSUMER_REGS,
    LOAD_REGS,
    gluon_descriptor,
    gluon_why_not,
    hopper_why_not,
    plane_vector,
    row_run_grid,
)
from fusionplan.solvers.templates.gluon_rows import (
    channel_block,
    channel_splits,
    column_offsets,
    render_gluon_rows_source,
    row_pixels,
)
from fusionplan.solvers.window_toolkit import window_shape_args

Tensor = torch.Tensor


def plane_mode(spec: PlanSpec) -> int:
    """How the kernel reads the plan's input: 0 channels-last rows; channel planes from column 0
    with the filter's columns as shifts of the product (1) or of the input rows' boxes, moved by
    the shifter (2, where shifted_planes_why_not has no objection)."""
    if not plane_rows(spec):
        return 0
    return 2 if shifted_planes_why_not(spec) is None else 1


def shifted_planes_why_not(spec: PlanSpec) -> str | None:
    """Why the shifter does not take the plan's channel planes, or None: rows of at most 64 pixels
    (a plane's row in a thread's registers), a filter column at offset 0 (the box TMA reads), the
    filter in registers (tuning.GLUON_ROWS_FILTER_REGS) and the shallowest ring of slots of S boxes
    within tuning.GLUON_ROWS_RING_BYTES."""
    _, conv, _ = split_at_conv(spec.ops)
    assert conv is not None
    pixels = row_pixels(spec.output_desc.dims[3])
    if pixels > 64:
        return f"output rows of {pixels} pixels: a shifter's thread holds a plane's row of at most 64"
    if 0 not in column_offsets(spec):
        return f"no filter column at offset 0 (offsets {column_offsets(spec)}): TMA reads boxes from column 0"
    c = spec.input_desc.dims[1]
    r, s = conv.w_desc.dims[2:]
    regs = filter_registers(c, r, s)
    if regs > tuning.GLUON_ROWS_FILTER_REGS:
        return f"the filter takes {regs} registers a thread (> {tuning.GLUON_ROWS_FILTER_REGS})"
    slots = channel_ring_slots(pixels, c, s)
    fewest = fewest_slots(r, conv.conv.dilations[0], pixels)
    if slots < fewest:
        return f"{slots} slots of {s} boxes fit, {fewest} needed"
    return None


def plane_rows(spec: PlanSpec) -> bool:
    """Whether the kernel reads the plan's input as rows of packed channel planes (NCHW; boxes
    from column 0, plane_mode 1 or 2) rather than channels-last rows."""
    x = spec.input_desc
    return x.dims[1] > 1 and x.same_strides(layout_strides(x.dims, Layout.NCHW))


def filter_holder(c: int) -> str:
    """Whose filter filter_registers counts, for messages: the plan's, or where the channels are
    split a computing warpgroup's half."""
    return "the" if channel_splits(c) == 1 else "a computing warpgroup's half of the"


def filter_registers(c: int, r: int, s: int) -> int:
    """Registers a computing thread spends holding its filter of BLOCK_N output channels in
    16-bit data: BLOCK_N x channel_block(C) x R x S elements over 128 threads, two a register."""
    return BLOCK_N * channel_block(c) * r * s // (128 * 2)


def gluon_rows_why_not(spec: PlanSpec) -> str | None:
    """Why the plan does not fit this kernel, or None: an ungrouped stride-1 convolution on
    packed channels-last fp16 or bf16 input with 16-byte pixels (any K: the output is stored by
    pointer), at most 128 input channels (a box's 128-byte rows hold 64, two computing warpgroups
    a box each), a filter that fits tuning.GLUON_ROWS_FILTER_REGS registers a thread,
    output rows of at most 256 pixels; or packed channel planes as plane_rows_why_not says."""
    _, conv, _ = split_at_conv(spec.ops)
    assert conv is not None
    c = conv.conv
    if spec.dtype not in (DataType.HALF, DataType.BFLOAT16):
        return f"{spec.dtype.name} data: the filter is held in registers as 16-bit wgmma operands (fp16, bf16)"
    if c.groups != 1:
        return "grouped convolutions: the filter is one product per tap"
    if c.strides != (1, 1):
        return f"stride {c.strides}: output rows read consecutive input rows (stride 1 only)"
    x = spec.input_desc
    if plane_rows(spec):
        return plane_rows_why_not(spec)
    if not x.same_strides(layout_strides(x.dims, Layout.NHWC)):
        return (
            "the input must be packed channels-last (NHWC) or channel planes (NCHW) to be read in boxes of rows; "
            f"it is {x.layout_name}"
        )
    channels = x.dims[1]
    if channels * 2 % 16:
        return f"C={channels}: a tensor box's pixels must be whole 16-byte units (C a multiple of 8)"
    if channels > 128:
        return (
            f"C={channels} input channels: a row's box holds at most 64 (128-byte rows), each of the two computing "
            "warpgroups one box (at most 128)"
        )
    r, s = conv.w_desc.dims[2:]
    regs = filter_registers(channels, r, s)
    if regs > tuning.GLUON_ROWS_FILTER_REGS:
        return (
            f"{filter_holder(channels)} filter of {BLOCK_N} output channels ({channel_block(channels)} channels x "
            f"{r}x{s}) takes {regs} "
            f"registers a thread (> {tuning.GLUON_ROWS_FILTER_REGS})"
        )
    ow = spec.output_desc.dims[3]
    if ow > 256:
        return f"output rows of {ow} pixels exceed a tensor box's 256"
    pixels = row_pixels(ow)
    slots = channel_ring_slots(pixels, channels, s)
    fewest = fewest_slots(r, c.dilations[0], pixels)
    if slots < fewest:
        return (
            f"a {r}x{s} filter of dilation {c.dilations[0]} on output rows of {ow} pixels needs "
            f"{fewest} slots of input rows in shared memory, {slots} fit"
        )
    return None


def plane_rows_why_not(spec: PlanSpec) -> str | None:
    """Why gluon-rows does not take the plan's channel planes, or None (at most 64 channels and a
    multiple of 8, rows of whole 16-byte units that an output row's box of at least 16 pixels (a
    swizzled box row) holds from column 0, the filter and the shallowest ring within
    tuning.GLUON_ROWS_RING_BYTES)."""
    _, conv, _ = split_at_conv(spec.ops)
    assert conv is not None
    n, c, h, w = spec.input_desc.dims
    if c > 64:
        return f"C={c} channel planes: a box holds at most 64"
    if c * 2 % 16:
        return f"C={c} channel planes: a tap's weights' box starts at column t*C, a tensor copy's on 16-byte units"
    if w * 2 % 16:
        return f"rows of {w} pixels: a tensor box's rows must be whole 16-byte units (W a multiple of 8)"
    pixels = row_pixels(spec.output_desc.dims[3])
    if w > pixels or pixels > 256:
        return f"input rows of {w} pixels do not fit an output row's box of {pixels}"
    if pixels * 2 < 32:
        return (
            f"output rows of {pixels} pixels: a box's {pixels * 2}-byte rows take no wgmma swizzle (32 bytes or more)"
        )
    if shifted_planes_why_not(spec) is None:
        return None
    r, s = conv.w_desc.dims[2:]
    slots = plane_ring_slots(pixels, c, r, s)
    fewest = least_slots(r, conv.conv.dilations[0])
    if slots < fewest:
        return f"a {r}x{s} filter in shared memory leaves {slots} slots of input rows, {fewest} needed"
    return None


def plane_ring_slots(pixels: int, c: int, r: int, s: int) -> int:
    """Slots of channel-plane rows (a box of channel_block(C) x ``pixels``) that
    tuning.GLUON_ROWS_RING_BYTES holds beside the filter (R x S tiles of BLOCK_N x
    channel_block(C)), at most 32."""
    block_c = channel_block(c)
    return max(0, min(32, (tuning.GLUON_ROWS_RING_BYTES - r * s * BLOCK_N * block_c * 2) // (pixels * block_c * 2)))


def gluon_rows_defer_why(spec: PlanSpec) -> str | None:
    """Output rows narrower than tuning.GLUON_ROWS_MIN_WIDTH: products of so few pixels were not
    measured faster than the window kernels'; input channels in two halves (measured slower on
    r50_10). Both run where find measures them faster, or when named."""
    ow = spec.output_desc.dims[3]
    if ow < tuning.GLUON_ROWS_MIN_WIDTH:
        return f"output rows of {ow} pixels (< {tuning.GLUON_ROWS_MIN_WIDTH}): not measured faster than the windows"
    channels = spec.input_desc.dims[1]
    if channel_splits(channels) == 2:
        return f"C={channels} input channels in two halves: measured slower than the windows"
    return None


def ring_slots(pixels: int, block_c: int, s: int, splits: int = 1) -> int:
    """Slots of input rows that tuning.GLUON_ROWS_RING_BYTES holds beside the exchange buffers of
    channel halves (a slot: ``s`` x ``splits`` boxes of ``pixels`` x ``block_c`` 16-bit
    elements), at most 32."""
    return min(
        32, (tuning.GLUON_ROWS_RING_BYTES - exchange_bytes(pixels, splits)) // (s * splits * pixels * block_c * 2)
    )


def channel_ring_slots(pixels: int, c: int, s: int) -> int:
    """ring_slots for ``c`` input channels: their channel block and splits."""
    return ring_slots(pixels, channel_block(c), s, channel_splits(c))


def exchange_bytes(pixels: int, splits: int) -> int:
    """Shared memory of the partial sums handed between the computing warpgroups of channel
    halves: one fp32 tile of BLOCK_N x ``pixels`` each."""
    return 0 if splits == 1 else 2 * BLOCK_N * pixels * 4


def filter_slots(r: int, pixels: int) -> int:
    """Ring slots the filter takes at the program's start: R x S tiles of BLOCK_N x C against
    slots of S boxes of ``pixels`` x C."""
    return triton_cdiv(r * BLOCK_N, pixels)


def least_slots(r: int, dil_h: int) -> int:
    """The shallowest ring that cannot stall: an output row reads (R - 1) * dil_h + 1 input rows,
    and where a run enters the next image, the two computing warpgroups' rows (the last of one
    image, the first of the next) hold 2 * (R - 1) * dil_h + 2 of them between them."""
    return 2 * (r - 1) * dil_h + 2


def fewest_slots(r: int, dil_h: int, pixels: int) -> int:
    """The shallowest ring a plan may take: one that cannot stall and that holds the filter."""
    return max(least_slots(r, dil_h), filter_slots(r, pixels))


class GluonRowsKernel(TritonConvKernel):
    reads_descriptors = True
    solver_name = "gluon-rows"
    stem = "gluon_rows"
    splits_reduction = False

    def __init__(self, spec: PlanSpec, handle) -> None:
        # the input's reading (plane_mode), fixed when built: the source rendered now and every
        # launch take it from here, whatever the tuning switches it reads say later
        self.mode = plane_mode(spec)
        super().__init__(spec, handle)

    def pack(self, weight: Tensor) -> Tensor:
        return pack_rows_rsc(weight)

    @property
    def candidates(self) -> list[tuning.ConvConfig]:  # type: ignore[override]
        """NORMAL find's configurations: the heuristic's ring, the shallowest that cannot stall
        (least_slots) and one between."""
        cfg = self.heuristic(0, 0, self.geometry[1], self.spec.dtype.torch_dtype)
        least = self._fewest_slots(cfg.block_m)
        depths = dict.fromkeys((cfg.num_stages, (cfg.num_stages + least) // 2, least))
        return [replace(cfg, num_stages=n) for n in depths]

    def render(self, spec: PlanSpec, stages: list[Stage]) -> str:
        return render_gluon_rows_source(spec, stages, self.mode)

    def heuristic(self, m: int, k_per_group: int, c_per_group: int, dtype: torch.dtype) -> tuning.ConvConfig:
        """An output row's pixels, 64 output channels, the whole input channels, the deepest ring."""
        r, s = self.conv.w_desc.dims[2:]
        pixels = row_pixels(self.out_hw[1])
        if self.mode == 1:
            slots = plane_ring_slots(pixels, c_per_group, r, s)
        else:
            slots = channel_ring_slots(pixels, c_per_group, s)
        return tuning.ConvConfig(pixels, BLOCK_N, channel_block(c_per_group), 1, 4, slots, 1, 2)

    def programs_and_steps(self, cfg: tuning.ConvConfig) -> tuple[int, int]:
        """Programs of the grid and the products per output row (one per tap)."""
        r, s = self.conv.w_desc.dims[2:]
        programs, blocks, _ = self._grid()
        return programs * blocks, r * s

    def _grid(self) -> tuple[int, int, int]:
        return row_run_grid(self._handle, self.spec.input_desc.dims[0] * self.out_hw[0], self.k)

    def narrower_config(self) -> tuning.ConvConfig | None:
        """Two slots fewer, down to least_slots and the filter's slots (a specialization reading a
        prior output needs more shared memory)."""
        least = self._fewest_slots(self.config.block_m)
        if self.config.num_stages <= least:
            return None
        return replace(self.config, num_stages=max(least, self.config.num_stages - 2))

    def _plane_vector(self, out: Tensor, strides: list[int], pixels: int) -> int:
        """PLANE_VEC of channel-plane input: plane_vector's (0: channels-last output), 1 instead of
        8 where OW is not a multiple of 8 (the row's mask would split a thread's pixels) or rows are
        under 16 pixels (one lane along them)."""
        vector = plane_vector(tuple(strides), out)
        whole = self.out_hw[1] % 8 == 0 and pixels >= 16
        return 1 if vector == 8 and not whole else vector

    def _fewest_slots(self, pixels: int) -> int:
        """fewest_slots for the plan's filter rows and their dilation (channel planes whose filter
        has buffers of its own: least_slots)."""
        r, dil_h = self.conv.w_desc.dims[2], self.conv_args[4]
        return least_slots(r, dil_h) if self.mode == 1 else fewest_slots(r, dil_h, pixels)

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
        n, c, h, w = self.spec.input_desc.dims
        bits = x.element_size() * 8
        mode = self.mode
        w_swizzle = min(128, cfg.block_k * bits // 8)
        if mode:  # boxes [BLOCK_C planes, 1 row, PIX pixels] from column 0, swizzled along the pixels
            swizzle = min(128, cfg.block_m * bits // 8)
            box = [1, cfg.block_k, 1, cfg.block_m]
            x_desc = gluon_descriptor(x, [n, c, h, w], [c * h * w, h * w, w, 1], box, swizzle, bits)
        else:
            swizzle = w_swizzle
            box = [1, 1, cfg.block_m, cfg.block_k]
            x_desc = gluon_descriptor(x, [n, h, w, c], [h * w * c, w * c, c, 1], box, swizzle, bits)
        r, s = self.conv.w_desc.dims[2:]
        depth = r * s * c
        w_desc = gluon_descriptor(packed, [self.k, depth], [depth, 1], [BLOCK_N, cfg.block_k], w_swizzle, bits)
        shape_args = window_shape_args(self, out, p, strides)
        consts = (
            r,
            s,
            cfg.block_m,
            BLOCK_N,
            cfg.block_k,
            cfg.num_stages,
            0 if mode == 1 else filter_slots(r, cfg.block_m),
            channel_splits(c),
            swizzle,
            bits,
            LOAD_REGS,
            CONSUMER_REGS,
            needs_int64(out, p) if idx64 is None else idx64,
            has_prior,
            mode,
            self._plane_vector(out, shape_args[7:11], cfg.block_m) if mode else 0,
            column_offsets(self.spec).index(0) if mode == 2 else 0,
            *flags.values(),
        )
        args = [x_desc, w_desc, out, p, *values, *shape_args, *consts]
        return self._grid(), cfg, args

    def pointer_slots(self, args: list) -> tuple[int | tuple[int, ...], ...]:
        """The input's descriptor, the output, the prior."""
        return (0, 2, 3)


class GluonRowsSolver(Solver):
    name = "gluon-rows"
    family = "triton"

    def why_not(self, spec: PlanSpec, handle) -> str | None:
        return conv_plan_why_not(spec) or gluon_rows_why_not(spec) or gluon_why_not() or hopper_why_not(handle)

    def defer_why(self, spec: PlanSpec, handle) -> str | None:
        return gluon_rows_defer_why(spec)

    def build(self, spec: PlanSpec, handle) -> Kernel:
        return GluonRowsKernel(spec, handle)
