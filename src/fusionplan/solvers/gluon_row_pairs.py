"""Gluon row-pairs solver: a strided 1x1 convolution (stride 2, no padding, ungrouped) on packed
NCHW input of 16-bit data, followed by any chain of bias, batch-norm inference and activations, as
ONE warp-specialized kernel (Hopper only).

At stride 2 a 1x1 filter reads every other column of every other input row. On NCHW planes the even
columns share their 32-byte sectors with the odd ones, so half of every sector read is dropped
whatever the kernel does; what differs is how the rest gets to the tensor cores. No tensor box
holds the even columns alone, and a box of whole rows puts a third party in the ring (the box, its
split in shared memory, the product: lab/NOTES.md section 39, 1.4-1.8x slower than
triton-gemm-nchw). Here a gathering partition (4 warps) reads each output row's even input row from
its start, VEC elements (16 or 8 bytes) a thread along the row, keeps the even half in registers (a
reshape to pairs and a split: VEC / 2 output pixels of one channel) and stores it into the stage's
[channels, pixels] operand, the pixels contiguous as wgmma's B operand reads channel planes
(gluon-gemm's); the stage's weights come by TMA, requested by the computing warps as they free the
stage (weights_by_mma: no expect in the gathering loop). The reads are asynchronous copies into a
ring of PREFETCH + 1 raw buffers, a commit group a step, each thread reading back what it copied
(tuning.GLUON_ROW_PAIRS_STAGED): loads into registers share one scoreboard in the compiled code, so
waiting for one step's values waited for every step loaded after it (lab/NOTES.md section 50);
the register loads remain as the switch's other side (an unrolled loop, gluon-nchw's). The
computing warps (two warpgroups for 256 output channels) wait for each stage, issue wgmma with one
product in flight and free the stage before it; then the chain and the stores, runs of 4 or 2
output pixels a thread into packed NCHW planes whose rows are whole runs (out_vec), or, into NCHW
output, a storing partition's (store_warps).

The tile's pixels are slots of whole output rows (each row ROW_SLOTS >= OW slots, a power of two;
the slots past OW hold the odd input row's first columns and are masked at the store), so that a
copy never crosses a row; the product is [output channels, slots], 256 x 128 where the output has
256 channels or more. Persistent: a program per multiprocessor walks tiles the grid's size apart
(one channel block each), its gathers running on into the next tile under the last products and
the epilogue of the one before.

The template's gathers are three functions (PAIRS_GATHER here: _step_geometry, _step_addresses,
_step_operand) and its epilogue's placement of slots a text (PAIRS_PLACES after COORDINATES_HEAD),
so that another input mode shares the kernel (gluon-plane-chunks: an image's channel planes as one
run; render_staged_source).

Gluon has no interpreter: the kernel runs on Hopper GPUs only (CPU tests compile it for sm_90).
"""

from __future__ import annotations

import torch

from fusionplan.runtime import tuning
from fusionplan.runtime.folding import Stage
from fusionplan.solvers.base import Kernel, PlanSpec, Solver
from fusionplan.solvers.conv_kernel import TritonConvKernel
from fusionplan.solvers.conv_toolkit import conv_plan_why_not, pack_rows_rsc
from fusionplan.solvers.gather_toolkit import gather_launch_args
from fusionplan.solvers.gluon_toolkit import (
    gather_why_not,
    gluon_why_not,
    hopper_why_not,
)
from fusionplan.solvers.staged_toolkit import (
    COORDINATES_HEAD,
    PAIRS_BLOCK_K,
    PAIRS_GATHER_WARPS,
    PAIRS_PIXELS,
    PAIRS_SHARED_BYTES,
    planes_1x1_why_not,
    raw_ring_bytes,
    render_staged_source,
    ring_stages,
    staged_input,
    staged_launch_constants,
    staged_launch_grid,
    staged_programs_and_steps,
)

Tensor = torch.Tensor


#: The row pairs' gathers (the template's gather_functions): a step reads [BLOCK_K, 2 * PIXELS]
#: columns, each output row's even input row from its start, and keeps the even ones.
PAIRS_GATHER = """@gluon.jit
def _step_geometry(GEOMETRY_PARAMS):
    # each raw column's output row in the tile and place in it (2 * ROW_SLOTS columns a row)
    cols = gl.arange(0, RAW_COLS, layout=gl.SliceLayout(0, layout))
    return cols // (2 * ROW_SLOTS), cols % (2 * ROW_SLOTS)


@gluon.jit
def _step_addresses(ADDRESS_PARAMS):
    # The program's step g (of n, STEPS a tile): its tile's raw [BLOCK_K, 2 * PIXELS] columns
    # of its channel block, two a slot (the even input column and the odd one beside it), each
    # output row's even input row read from its start (``col_row``, ``col_in``: a column's row in
    # the tile and place in it), VEC contiguous elements a thread of one channel, aligned (the
    # plan's rule: planes and row pairs of whole VEC-element units): their addresses and mask (steps
    # past n and rows past the batch touch no memory; channels past C read zeros, so the weight
    # columns they meet add nothing).
    col_row, col_in = geo
    _, m0 = _tile_origin(g // STEPS, N_K, BLOCK_N, PIXELS)
    out_row = m0 // ROW_SLOTS + col_row  # image * OH + output row
    live = (out_row < NOH) & (g < n)
    chans = (g % STEPS) * BLOCK_K + gl.arange(0, BLOCK_K, layout=gl.SliceLayout(1, layout))
    if IDX64:  # offsets of inputs past 2^31 elements
        out_row = out_row.to(gl.int64)
        chans = chans.to(gl.int64)
    image = out_row // OH
    row_start = gl.multiple_of(image * sxn + (out_row - image * OH) * (2 * W), VEC)
    planes = gl.multiple_of(chans * HW, VEC)
    if WHOLE_CB:
        mask = live[None, :]
    else:
        mask = live[None, :] & (chans < C)[:, None]
    return x_ptr + planes[:, None] + (row_start + col_in)[None, :], mask


@gluon.jit
def _step_operand(OPERAND_PARAMS):
    # the even columns: a reshape to pairs and a split in registers
    even, odd = gl.split(gl.reshape(raw, [BLOCK_K, PIXELS, 2]))
    return even
"""


#: The row pairs' slots: an output row of an image each row of slots.
PAIRS_PLACES = """n_img = out_row // OH
oh = out_row % OH
ow = col
pix = oh * OUT_W + ow"""


def pairs_vec(spec: PlanSpec) -> int:
    """Elements a load of the input reads (16 or 8 bytes of 16-bit data): 8 where the planes and the
    row pairs are whole 8-element units, else 4 where they are whole 4-element units, else 0 (no
    aligned load: the plan is not taken)."""
    _, _, h, w = spec.input_desc.dims
    for vec in (8, 4):
        if h * w % vec == 0 and 2 * w % vec == 0:
            return vec
    return 0


def pairs_row_slots(spec: PlanSpec) -> int:
    """Slots of an output row: OW rounded up to a power of two, at least half a load's elements."""
    ow = spec.output_desc.dims[3]
    return max(pairs_vec(spec) // 2, 1 << (ow - 1).bit_length())


def pairs_why_not(spec: PlanSpec) -> str | None:
    """Why the kernel cannot read the plan's convolution, or None: a 1x1 filter at stride 2 without
    padding, ungrouped, on packed NCHW input of 16-bit data (wgmma reads the operand along its
    pixels only for 16-bit data), an even height (each output row's input row has an odd row
    after it: a load of a row's last slots reads its first columns), output rows no wider than a
    tile and planes and row pairs of whole aligned loads (pairs_vec)."""
    why = planes_1x1_why_not(spec, 2, "row pairs", "its rows are not contiguous planes' rows")
    if why:
        return why
    n, _, h, w = spec.input_desc.dims
    if h % 2:
        return f"H={h} is odd: the last output row's loads would read past its input plane"
    if not pairs_vec(spec):
        return f"{h}x{w} planes and rows of {2 * w} elements are not whole 4-element units (aligned loads)"
    slots = pairs_row_slots(spec)
    if slots > PAIRS_PIXELS or slots > w:
        return f"output rows of {spec.output_desc.dims[3]} pixels: {slots} slots exceed a tile or the input row"
    return None


def pairs_defer_why(spec: PlanSpec) -> str | None:
    """Where other kernels measured faster : output planes below
    tuning.GLUON_ROW_PAIRS_MIN_PLANE pixels (H100, fp16, batch 32, CBNA, lab/NOTES.md section 50:
    r50_08's 28x28 planes 33.4 us against 38.6 for triton-gemm-nchw; r50_14's 14x14 33.2 against
    31.7, r50_20's 7x7 29.6 against 28.8 for gluon-nchw-regs)."""
    oh, ow = spec.output_desc.dims[2:]
    if oh * ow < tuning.GLUON_ROW_PAIRS_MIN_PLANE:
        return (
            f"output planes of {oh * ow} pixels (< {tuning.GLUON_ROW_PAIRS_MIN_PLANE}): triton-gemm-nchw and "
            "gluon-nchw-regs measured faster (r50_14 33.2 us against 31.7, r50_20 29.6 / 28.8)"
        )
    return None


def pairs_config(k: int, c: int) -> tuning.ConvConfig:
    """PAIRS_PIXELS slots by 256 output channels (two computing warpgroups) where the output has
    256 channels or more, else 128 or 64 (one), steps of PAIRS_BLOCK_K of the ``c`` input channels,
    as many stages as shared memory holds (pairs_tile)."""
    block_n = 256 if k >= 256 else 128 if k > 64 else 64
    warps = 8 if block_n == 256 else 4
    return pairs_tile(PAIRS_PIXELS, block_n, warps, c)


def resident_bytes(block_n: int, c: int) -> int:
    """Shared memory of a channel block's weights, all ``c`` input channels (whole steps)."""
    return block_n * -(-c // PAIRS_BLOCK_K) * PAIRS_BLOCK_K * 2


def pairs_resident(block_n: int, c: int, pixels: int = PAIRS_PIXELS) -> bool:
    """Whether a program keeps its channel block's weights in shared memory, loaded once
    (tuning.GLUON_ROW_PAIRS_RESIDENT_BYTES: at most that many bytes of them, and room beside them
    for the staged gathers and two stages of ``pixels``), rather than a box a stage: it halves what
    the products read from L2 where the weights are as many bytes a step as the gathered input
    (256 output channels by 128 slots)."""
    weights = resident_bytes(block_n, c)
    room = PAIRS_SHARED_BYTES - staged_bytes(pixels) - 2 * pixels * PAIRS_BLOCK_K * 2
    return weights <= min(tuning.GLUON_ROW_PAIRS_RESIDENT_BYTES, room)


def staged_bytes(pixels: int) -> int:
    """Shared memory of the gathers' raw buffers (tuning.GLUON_ROW_PAIRS_STAGED): PREFETCH + 1 steps
    of [PAIRS_BLOCK_K, 2 x pixels] 16-bit columns; 0 for loads into registers."""
    if not tuning.GLUON_ROW_PAIRS_STAGED:
        return 0
    return raw_ring_bytes(PAIRS_BLOCK_K, 2 * pixels)


def pairs_tile(pixels: int, block_n: int, warps: int, c: int, stages: int = 0) -> tuning.ConvConfig:
    """A tile of ``pixels`` slots x ``block_n`` channels on ``warps`` computing warps for ``c``
    input channels, with ``stages`` in its ring (0: as many as PAIRS_SHARED_BYTES holds beside
    the resident weights, pairs_resident, or with a weights' box each)."""
    room = PAIRS_SHARED_BYTES - staged_bytes(pixels)
    if pairs_resident(block_n, c, pixels):
        room, per_stage = room - resident_bytes(block_n, c), pixels * PAIRS_BLOCK_K * 2
    else:
        per_stage = (pixels + block_n) * PAIRS_BLOCK_K * 2
    stages = stages or ring_stages(room, per_stage)
    return tuning.ConvConfig(pixels, block_n, PAIRS_BLOCK_K, 8, warps, stages, 1)


#: Triton versions whose compiler keeps gluon-row-pairs' hoisted per-channel parameters in registers
#: beside the storing partition (3.9 spills 168 bytes in each epilogue).
HOIST_CHANNELS_VERSIONS = ("3.6.",)


def pairs_hoist_channels() -> bool:
    """Whether gluon-row-pairs loads the chain's per-channel parameters once a program
    (tuning.GLUON_ROW_PAIRS_HOIST_CHANNELS, under HOIST_CHANNELS_VERSIONS): with the storing
    partition the computing warps keep them beside the accumulator without spills. H100, Triton 3.6
    (lab/NOTES.md section 53): r50_08 32.05 us against 33.15 (fp16), 32.46 against 33.27 (bf16)."""
    import triton

    return bool(tuning.GLUON_ROW_PAIRS_HOIST_CHANNELS) and triton.__version__.startswith(HOIST_CHANNELS_VERSIONS)


def render_gluon_row_pairs_source(spec: PlanSpec, stages: list[Stage]) -> str:
    """The kernel's source: _TEMPLATE with the row pairs' gathers (PAIRS_GATHER)."""
    title = "strided 1x1 convolution on NCHW row pairs"
    return render_staged_source(spec, stages, title, "gluon_row_pairs", PAIRS_GATHER, COORDINATES_HEAD + PAIRS_PLACES)


class GluonRowPairsKernel(TritonConvKernel):
    solver_name = "gluon-row-pairs"
    stem = "gluon_row_pairs"
    splits_reduction = False

    programs_and_steps = staged_programs_and_steps
    _launch_args = gather_launch_args  # with this kernel's launch_constants and launch_grid
    launch_constants = staged_launch_constants
    launch_grid = staged_launch_grid

    def pack(self, weight: Tensor) -> Tensor:
        return pack_rows_rsc(weight)

    @staticmethod
    def render(spec: PlanSpec, stages: list[Stage]) -> str:
        return render_gluon_row_pairs_source(spec, stages)

    def _pixel_slots(self, spec: PlanSpec) -> int:
        return pairs_row_slots(spec)

    def operand_k_major(self, x: Tensor | None = None) -> bool:
        """Whether the input operand is [slots, channels] (else [channels, slots], as the split leaves
        it), reading ``x``."""
        return False

    #: warps of the gathering partition (8 measured no faster on r50_08, 33.9 us against 33.3 without a
    #: storing partition, and spill beside one: lab/NOTES.md section 53)
    gather_warps = PAIRS_GATHER_WARPS

    def raw_step(self, cfg: tuning.ConvConfig, x: Tensor | None = None) -> tuple[int, int]:
        """A step's raw elements as [rows, columns] (reading ``x``): its channels' two input columns a
        slot."""
        return cfg.block_k, 2 * cfg.block_m

    def load_vec(self, x: Tensor | None = None) -> int:
        """Elements a load of the input (``x``) reads (pairs_vec)."""
        return pairs_vec(self.spec)

    def staged(self, x: Tensor) -> bool:
        """Whether the gathers of ``x`` go through asynchronous copies (staged_input)."""
        return staged_input(x)

    def resident(self, cfg: tuning.ConvConfig) -> bool:
        """Whether a program keeps its channel block's weights in shared memory (pairs_resident)."""
        return pairs_resident(cfg.block_n, self.geometry[1], cfg.block_m)

    def heuristic(self, m: int, k_per_group: int, c_per_group: int, dtype: torch.dtype) -> tuning.ConvConfig:
        return pairs_config(k_per_group, c_per_group)

    @property
    def candidates(self) -> list[tuning.ConvConfig]:  # type: ignore[override]
        """NORMAL find's configurations: 256, 128 and 64 output channels by PAIRS_PIXELS slots."""
        c = self.geometry[1]
        return [pairs_tile(PAIRS_PIXELS, n, 8 if n == 256 else 4, c) for n in (256, 128, 64)]

    def store_switch(self) -> int:
        """tuning.GLUON_ROW_PAIRS_STORE_WARPS."""
        return tuning.GLUON_ROW_PAIRS_STORE_WARPS

    def hoist_channels(self, store_warps: int) -> bool:
        """Whether the computing partition loads the chain's per-channel parameters once, before its
        tiles (pairs_hoist_channels): only beside a storing partition (``store_warps``), without which
        the computing warps spill them (r50_08 37.5 us against 34.1, lab/NOTES.md section 53)."""
        return bool(store_warps) and pairs_hoist_channels()

    def weights_by_mma(self, cfg: tuning.ConvConfig) -> bool:
        """Whether the computing partition requests each stage's weights as it frees the stage
        (tuning.GLUON_ROW_PAIRS_WEIGHTS_BY_MMA; streamed weights only), rather than the gathering
        partition as it fills it: the gathering loop's sm_90 barriers 4 -> 3 a step. H100 (lab/NOTES.md
        section 54): r50_08 31.05 us against 31.33 (fp16), 31.66 against 32.05 (bf16)."""
        return bool(tuning.GLUON_ROW_PAIRS_WEIGHTS_BY_MMA) and not self.resident(cfg)


class GluonRowPairsSolver(Solver):
    name = "gluon-row-pairs"
    family = "triton"

    def why_not(self, spec: PlanSpec, handle) -> str | None:
        return (
            conv_plan_why_not(spec)
            or pairs_why_not(spec)  # the gathers cannot read the plan's input
            or gather_why_not(spec)
            or gluon_why_not()
            or hopper_why_not(handle)
        )

    def defer_why(self, spec: PlanSpec, handle) -> str | None:
        return pairs_defer_why(spec)

    def build(self, spec: PlanSpec, handle) -> Kernel:
        return GluonRowPairsKernel(spec, handle)
