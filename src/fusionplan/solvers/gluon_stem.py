"""Gluon stem solver: triton-stem's convolution over stretches of input rows (few input channels
on 16-bit input, channels-last or channel planes: ResNet's stem, C = 3, 7x7, stride 2), as a
warp-specialized persistent kernel over output rows (Hopper only).

Why: triton-stem issues about 45 warp instructions per output pixel (each tile gathers its own
stretches, eight 8-byte copies and their addresses and masks a step, then two per-pixel
epilogues); it is bound by instruction issue and latency, not by memory or the tensor pipe
(lab/NOTES.md section 32: the ResNet stem at 48-49 us against a floor of 20.6). Here each
program takes a run of output rows (its share of N x OH, image by image) and

- a loading warpgroup gathers each input row the run reads ONCE, as a [RUNS, BLOCK_E] tile of
  stretches (row q: the stretch of output run q, triton_stem.Stretches) with 8-byte asynchronous
  copies (zeros past the row's ends and above and below the image), into a ring of slots; a
  stride-2 7-row filter reads each input row from up to four output rows;
- the filter's Toeplitz blocks (triton_stem's packing: R x PX blocks of [BLOCK_N, BLOCK_E]) come
  once by TMA and stay in shared memory;
- two computing warpgroups take the run's output rows in turn: output row oh is, for each pixel
  p of a run, the sum over the filter rows r of the tile of input row oh * stride + r * dil_h -
  pad_h times Toeplitz block (r, p): a [RUNS, BLOCK_N] accumulator per p, pixel q * PX + p of the
  row in its row q. Then the chain and the stores, while the other warpgroup's products run:
  each pixel's [runs, channels] tile written to shared memory and stored by TMA where the output
  is channels-last with 16-byte aligned strides and rows of whole runs (the ResNet stem, fp16:
  33.3 us against 34.1 by pointer after a layout change, which other outputs take). NCHW output
  rows are stored with their runs' pixels joined in order, 16 bytes a thread where the planes
  are aligned (the NCHW stem: 45.7 us against 130 pixel by pixel).

Channel-plane (NCHW) input: the planes' stretches lie side by side in a tile's row (each at a
multiple of the copies' width, so that no copy straddles two planes), and the Toeplitz blocks hold
each plane's taps at its place: as many products as channels-last input (the NCHW stem: three
10-element stretches in a 32-element row, 38.5 us against 45.7 with a 16-element tile per plane
and triton-stem's 68.6). Runs are as short as 64 runs a row allow (stem_arrangement: the fewest
products per output row).

A ring slot goes back to the loader once each computing warpgroup has passed the last of its
output rows that read it (a warpgroup hands back, after each of its rows, every slot before the
first that its next row reads). The copies land by mbarrier (each loading thread's arrival when
its copies are done); the generic-proxy writes are fenced before wgmma reads them.

Gluon has no interpreter: the kernel runs on Hopper GPUs only (CPU tests compile it for sm_90).
"""

from __future__ import annotations

from dataclasses import replace

import torch

from fusionplan.core.enums import DataType
from fusionplan.runtime import tuning
from fusionplan.runtime.folding import Stage, split_at_conv
from fusionplan.runtime.launch import needs_int64
from fusionplan.solvers.base import Kernel, PlanSpec, Solver
from fusionplan.solvers.conv_kernel import TritonConvKernel
from fusionplan.solvers.conv_toolkit import conv_plan_why_not, triton_cdiv
from fusionplan.solvers.gluon_toolkit import (
    BLOCK_N,
    CONSUMER_REGS,
    LOAD_REGS,
    gluon_descriptor,
    gluon_why_not,
    hopper_why_not,
    plane_vector,
    row_run_grid,
    sixteen_bit_output,
    tma_store_strides_fit,
)
from fusionplan.solvers.stem_toolkit import (
    STEM_MAX_CHANNELS,
    Stretches,
    channels_interleaved,
    stretch_candidates,
    stretch_geometry,
    stretches,
    toeplitz_pack,
)
from fusionplan.solvers.templates.gluon_stem import (
    CONSUMERS,
    Arrangement,
    render_gluon_stem_source,
)

Tensor = torch.Tensor

#: Runs of an output row in a product: one warpgroup's wgmma rows (a row of at most 64 runs).
RUNS = 64
#: Pixels of a run at most: each its [RUNS, BLOCK_N] fp32 accumulator, 32 registers a thread.
MAX_PIXELS = 4
#: Warps of the loading partition: four 8-byte copies a thread for a [64, 32] tile of 16-bit data
#: (one warp, sixteen a thread: 37.4 us against 37.1 on the ResNet stem).
LOAD_WARPS = 4


def side_by_side(runs: Stretches, vector: int, planes: int) -> Arrangement:
    """``planes`` channel planes' stretches of ``runs`` side by side in a tile's row, each at a
    multiple of ``vector`` (no copy straddles two planes)."""
    pitch = -(-runs.used // vector) * vector
    block_e = max(16, 1 << (planes * pitch - 1).bit_length())
    return Arrangement(replace(runs, block_e=block_e, used=(planes - 1) * pitch + runs.used), planes, pitch)


def stem_arrangement(spec: PlanSpec) -> Arrangement:
    """The runs with the fewest products per output row among those of at most MAX_PIXELS pixels
    and RUNS runs a row whose stretches are copied at least 4 bytes at a time (channel planes: all
    planes' stretches side by side); among equals the shorter tiles (fewer gathered elements), then
    the widest copies. Where none fits, triton-stem's runs (gluon_stem_why_not says why)."""
    geometry = stretch_geometry(spec)
    interleaved, *_, out_w, itemsize = geometry
    planes = spec.input_desc.dims[1] // interleaved
    fits = [
        (side_by_side(runs, vector, planes) if planes > 1 else Arrangement(runs), vector)
        for runs, vector in stretch_candidates(*geometry)
        if runs.pixels <= MAX_PIXELS and triton_cdiv(out_w, runs.pixels) <= RUNS and vector * itemsize >= 4
    ]
    if not fits:
        runs = stretches(*geometry)
        return side_by_side(runs, 1, planes) if planes > 1 else Arrangement(runs)
    return min(fits, key=lambda item: (item[0].products, item[0].runs.block_e, -item[1]))[0]


def copy_vector(arrangement: Arrangement, itemsize: int, row: int, *strides: int) -> int:
    """Elements of one asynchronous copy: the widest power of two (at most 16 bytes) that divides
    the runs' step, their lead, the planes' pitch, the input row (no copy straddles a row's end)
    and the input's image, row and plane ``strides`` (which the kernel takes in copies, so that the
    compiler sees every copy aligned)."""
    vector = 16 // itemsize
    runs = arrangement.runs
    for n in (runs.step, runs.lead, arrangement.pitch, row, *strides):
        if n:
            vector = min(vector, n & -n)
    return vector


def stem_smem_bytes(r: int, runs: Stretches, slots: int, itemsize: int, tma_store: bool = False) -> int:
    """Shared memory of the filter's Toeplitz blocks and of ``slots`` input-row tiles (and, with
    ``tma_store``, of the output tiles: one per computing warpgroup and pixel of a run)."""
    tiles = CONSUMERS * runs.pixels * RUNS * BLOCK_N if tma_store else 0
    return (r * runs.pixels * BLOCK_N + slots * RUNS) * runs.block_e * itemsize + tiles * itemsize


def joined_plane_vector(strides: tuple[int, ...], out: Tensor) -> int:
    """Output pixels a thread stores together where rows are stored joined (0: not joined, as on
    channels-last output): plane_vector's."""
    return plane_vector(strides, out)


def plan_tma_store(spec: PlanSpec, runs: Stretches) -> bool:
    """Whether the plan's output takes TMA stores (16-bit output, its strides, the output tiles
    beside the shallowest ring within tuning.GLUON_STEM_SMEM_BYTES)."""
    _, conv, _ = split_at_conv(spec.ops)
    assert conv is not None
    out = spec.output_desc
    itemsize = spec.dtype.torch_dtype.itemsize
    if not sixteen_bit_output(spec):
        return False
    if not tma_store_strides_fit(out.strides, out.dims[3], runs.pixels, itemsize):
        return False
    r = conv.w_desc.dims[2]
    least = least_slots(r, conv.conv.dilations[0])
    return stem_smem_bytes(r, runs, least, itemsize, True) <= tuning.GLUON_STEM_SMEM_BYTES


def copied_row(spec: PlanSpec, strides: tuple[int, ...]) -> tuple[int, ...]:
    """What a copy must divide besides the runs' step and lead (copy_vector's ``row`` and
    ``strides``): an input row's elements, the image and row strides and, for channel planes, the
    plane stride (``strides``: the input's, N C H W order)."""
    interleaved = channels_interleaved(spec)
    assert interleaved is not None
    sxn, sxc, sxh, _ = strides[:4]
    planes = (sxc,) if spec.input_desc.dims[1] > interleaved else ()
    return (spec.input_desc.dims[3] * interleaved, sxn, sxh, *planes)


def least_slots(r: int, dil_h: int) -> int:
    """The shallowest ring that cannot stall: a warpgroup's row reads (R - 1) * dil_h + 1 input
    rows, and the other's may hold as many where a run enters the next image."""
    return 2 * ((r - 1) * dil_h + 1)


def gluon_stem_why_not(spec: PlanSpec) -> str | None:
    """Why the plan does not fit this kernel, or None: an ungrouped convolution of at most
    STEM_MAX_CHANNELS input channels on fp16 or bf16 input of channels-last rows or channel planes,
    stretches of at most 64 elements copied at least 4 bytes at a time, output rows of at most 64
    runs, the filter's blocks and the shallowest ring within tuning.GLUON_STEM_SMEM_BYTES."""
    _, conv, _ = split_at_conv(spec.ops)
    assert conv is not None
    if spec.dtype not in (DataType.HALF, DataType.BFLOAT16):
        return f"{spec.dtype.name} data: the products are 16-bit wgmma (fp16, bf16)"
    if conv.groups != 1:
        return "grouped convolutions are not read as row stretches"
    x = spec.input_desc
    c = x.dims[1]
    if c > STEM_MAX_CHANNELS:
        return f"C={c} > {STEM_MAX_CHANNELS}: channel blocks fill reduction steps (the window kernels)"
    if channels_interleaved(spec) is None:
        return (
            "the input must be channels-last (NHWC) or channel planes (NCHW) to be read in stretches of rows; "
            f"its strides are {x.strides}"
        )
    arrangement = stem_arrangement(spec)
    runs = arrangement.runs
    if arrangement.side > 1 and x.strides[1] * c >= 2**31:
        # the loader adds a plane's offset to its row's in 32 bits (64-bit offsets are the images')
        return f"channel planes of {x.strides[1]} elements: their offsets in an image pass 2^31"
    if runs.block_e > 64:
        planes = f" ({arrangement.side} channel planes side by side)" if arrangement.side > 1 else ""
        return f"a stretch of {runs.used} input elements per filter row{planes} is longer than a tile's 64"
    itemsize = spec.dtype.torch_dtype.itemsize
    row, *strides = copied_row(spec, x.strides)
    if copy_vector(arrangement, itemsize, row, *strides) * itemsize < 4:
        return (
            f"stretches {runs.step} elements apart in rows of {row} (strides {tuple(strides)}): "
            "asynchronous copies need 4-byte units"
        )
    if runs.pixels > MAX_PIXELS:
        return (
            f"runs of {runs.pixels} pixels: an accumulator of {RUNS} x {BLOCK_N} each, more than {MAX_PIXELS} "
            "do not fit a computing warpgroup's registers"
        )
    ow = spec.output_desc.dims[3]
    if triton_cdiv(ow, runs.pixels) > RUNS:
        return f"output rows of {ow} pixels: more than {RUNS} runs of {runs.pixels}"
    r = conv.w_desc.dims[2]
    least = least_slots(r, conv.conv.dilations[0])
    need = stem_smem_bytes(r, runs, least, itemsize)
    if need > tuning.GLUON_STEM_SMEM_BYTES:
        return (
            f"the filter's {r * runs.pixels} Toeplitz blocks and {least} input-row tiles take {need} bytes "
            f"of shared memory (> {tuning.GLUON_STEM_SMEM_BYTES})"
        )
    return None


def stem_registers(planes: bool) -> tuple[int, int]:
    """(LOAD_REGS, CONSUMER_REGS) of a launch: channel planes side by side (twice the copies, of 4
    bytes: their addresses held in more registers) take tuning.GLUON_STEM_PLANE_LOAD_REGS for the
    loading warps and the second computing warpgroup as many fewer (the ResNet stem on NCHW input,
    H100, fp16: 40.2 us at 40, 38.5 at 64, 39.0 at 88; channels-last input unchanged at 33.2-33.6:
    lab/NOTES.md section 58); channels-last input LOAD_REGS and CONSUMER_REGS."""
    load = tuning.GLUON_STEM_PLANE_LOAD_REGS if planes else LOAD_REGS
    return load, CONSUMER_REGS - (load - LOAD_REGS)


class GluonStemKernel(TritonConvKernel):
    reads_descriptors = True
    solver_name = "gluon-stem"
    stem = "gluon_stem"
    splits_reduction = False

    def __init__(self, spec: PlanSpec, handle) -> None:
        self.runs = self.plan_runs(spec)  # before the kernel is rendered
        super().__init__(spec, handle)

    def tuning_key(self) -> tuple:
        return (self._source, self.spec.signature(), self.dot_precision, self.runs)

    def plan_runs(self, spec: PlanSpec) -> Stretches:
        self.arrangement = stem_arrangement(spec)
        return self.arrangement.runs

    @property
    def candidates(self) -> list[tuning.ConvConfig]:  # type: ignore[override]
        """NORMAL find's configurations: the heuristic's ring and the shallowest that cannot stall."""
        cfg = self.heuristic(0, 0, 0, self.spec.dtype.torch_dtype)
        return [cfg, replace(cfg, num_stages=self._least_slots())]

    def render(self, spec: PlanSpec, stages: list[Stage]) -> str:
        return render_gluon_stem_source(spec, stages, self.arrangement)

    def heuristic(self, m: int, k_per_group: int, c_per_group: int, dtype: torch.dtype) -> tuning.ConvConfig:
        """Runs of an output row, 64 output channels, the stretch, the ring that
        tuning.GLUON_STEM_SLOTS asks for (at least the shallowest that cannot stall, at most what
        the shared memory holds beside the filter and, where stores are by TMA, the output tiles)."""
        r = self.conv.w_desc.dims[2]
        itemsize = self.spec.dtype.torch_dtype.itemsize
        slots = max(tuning.GLUON_STEM_SLOTS, self._least_slots())
        least = self._least_slots()
        tma_store = plan_tma_store(self.spec, self.runs)
        limit = tuning.GLUON_STEM_SMEM_BYTES
        while slots > least and stem_smem_bytes(r, self.runs, slots, itemsize, tma_store) > limit:
            slots -= 1
        return tuning.ConvConfig(RUNS, BLOCK_N, self.runs.block_e, 1, 4, slots, 1, 2)

    def pack(self, weight: Tensor) -> Tensor:
        """The Toeplitz blocks [R, 1, PX, K, BLOCK_E] (triton-stem's for channels-last rows,
        side_by_side_blocks for channel planes) as [R * PX * KP, BLOCK_E], the output channels
        padded with zeros to KP, a multiple of BLOCK_N (a tensor box of a block's channels never
        reaches into the next block)."""
        blocks = (
            self.side_by_side_blocks(weight)
            if self.arrangement.side > 1
            else toeplitz_pack(weight, self.runs, self.conv_args)
        )
        r, _, px, k, e = blocks.shape
        kp = triton_cdiv(k, BLOCK_N) * BLOCK_N
        padded = blocks.new_zeros((r, px, kp, e))
        padded[:, :, :k] = blocks[:, 0]
        return padded.reshape(r * px * kp, e)

    def side_by_side_blocks(self, weight: Tensor) -> Tensor:
        """[K, C, R, S] -> [R, 1, PX, K, BLOCK_E]: block p of filter row r holds tap s of channel c at
        pixel p's position in plane c's stretch (c * pitch on in the tile's row), zeros elsewhere."""
        k, c, r, s = weight.shape
        runs, pitch = self.runs, self.arrangement.pitch
        pad_w, stride_w, dil_w = self.conv_args[1], self.conv_args[3], self.conv_args[5]
        blocks = weight.new_zeros((r, 1, runs.pixels, k, runs.block_e))
        for p in range(runs.pixels):
            for tap in range(s):
                at = runs.position(p, tap, stride_w, pad_w, dil_w)
                blocks[:, 0, p, :, at : at + c * pitch : pitch] = weight[:, :, :, tap].permute(2, 0, 1)
        return blocks

    def programs_and_steps(self, cfg: tuning.ConvConfig) -> tuple[int, int]:
        """Programs of the grid and the products per output row (one per filter row and pixel of a run)."""
        programs, blocks, _ = self._grid()
        return programs * blocks, self.conv.w_desc.dims[2] * self.runs.pixels

    def _grid(self) -> tuple[int, int, int]:
        return row_run_grid(self._handle, self.spec.input_desc.dims[0] * self.out_hw[0], self.k)

    def narrower_config(self) -> tuning.ConvConfig | None:
        """The shallowest ring that cannot stall (a specialization reading a prior output needs more
        shared memory)."""
        least = self._least_slots()
        return None if self.config.num_stages <= least else replace(self.config, num_stages=least)

    def _least_slots(self) -> int:
        return least_slots(self.conv.w_desc.dims[2], self.conv_args[4])

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
        oh, ow = self.out_hw
        runs = self.runs
        r = self.conv.w_desc.dims[2]
        pad_h, str_h, dil_h = self.conv_args[0], self.conv_args[2], self.conv_args[4]
        itemsize = self.spec.dtype.torch_dtype.itemsize
        bits = itemsize * 8
        swizzle = min(128, runs.block_e * itemsize)
        kp = triton_cdiv(self.k, BLOCK_N) * BLOCK_N
        arrangement = self.arrangement
        depth = r * runs.pixels * kp
        box = [BLOCK_N, runs.block_e]
        w_desc = gluon_descriptor(packed, [depth, runs.block_e], [runs.block_e, 1], box, swizzle, bits)
        strides = strides or (*x.stride(), *out.stride(), *p.stride())
        sxn, sxc, sxh, _ = strides[:4]
        tma_store = (
            plan_tma_store(self.spec, runs)
            and tma_store_strides_fit(strides[4:8], ow, runs.pixels, itemsize)
            and out.data_ptr() % 16 == 0
        )
        y_desc = self._output_descriptor(out, strides[4:8], bits) if tma_store else w_desc  # a token where unused
        plane_vec = 0 if tma_store else joined_plane_vector(strides[4:8], out)
        plane_lanes = min(32, RUNS * runs.pixels // max(plane_vec, 1))
        row = copied_row(self.spec, strides)
        vector = copy_vector(arrangement, itemsize, *row)
        consts = (
            r,
            arrangement.side,
            arrangement.pitch,
            runs.pixels,
            runs.step,
            runs.lead,
            vector,
            RUNS,
            BLOCK_N,
            runs.block_e,
            cfg.num_stages,
            str_h,
            (r - 1) * dil_h + 1,
            swizzle,
            bits,
            LOAD_WARPS,
            *stem_registers(arrangement.side > 1),
            CONSUMERS,
            needs_int64(x, out, p) if idx64 is None else idx64,
            has_prior,
            tma_store,
            plane_vec,
            plane_lanes,
            *flags.values(),
        )
        # the input's row and strides in whole copies (a plane's stride unused for channels-last rows)
        geometry = (n, self.k, h, oh, ow, kp, row[0] // vector, sxn // vector, sxh // vector, sxc // vector)
        args = [x, w_desc, out, p, y_desc, *values, *geometry, *strides[4:], pad_h, dil_h, *consts]
        return self._grid(), cfg, args

    def _output_descriptor(self, out: Tensor, strides: tuple[int, ...], bits: int):
        """The output seen as [N, OH, OW / PX, PX, K] (pixel p of run q at [n, oh, q, p]), boxes of
        one pixel of every run of a row and BLOCK_N channels."""
        syn, _, syh, syw = strides
        oh, ow = self.out_hw
        px = self.runs.pixels
        shape = [self.spec.input_desc.dims[0], oh, ow // px, px, self.k]
        return gluon_descriptor(out, shape, [syn, syh, px * syw, syw, 1], [1, 1, RUNS, 1, BLOCK_N], 128, bits)

    def pointer_slots(self, args: list) -> tuple[int | tuple[int, ...], ...]:
        """The input, the output's pointer and, where tiles are stored by TMA, its descriptor, the prior."""
        return (0, (2, 4) if args[4].base is args[2] else 2, 3)


class GluonStemSolver(Solver):
    name = "gluon-stem"
    family = "triton"

    def why_not(self, spec: PlanSpec, handle) -> str | None:
        return conv_plan_why_not(spec) or gluon_stem_why_not(spec) or gluon_why_not() or hopper_why_not(handle)

    def build(self, spec: PlanSpec, handle) -> Kernel:
        return GluonStemKernel(spec, handle)
