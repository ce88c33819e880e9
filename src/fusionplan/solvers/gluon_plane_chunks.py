"""Gluon plane-chunks solver: a 1x1 convolution at stride 1 (no padding, ungrouped) on packed NCHW
input of 16-bit data with small planes (at most CHUNK_MAX_PLANE pixels: ResNet-50's 7x7 layers),
followed by any chain of bias, batch-norm inference and activations, as ONE warp-specialized
kernel (Hopper only).

A 7x7 plane is 98 bytes: no tensor box (16-byte strides) and no 16-byte copy reads a plane alone,
and channel c's plane starts c elements into a 16-byte unit, so the gather kernels load every
input element on its own (2 bytes a lane), and a load's value holds a register until its store:
their bytes in flight are bound by the registers, and the loads of one partition share one
scoreboard, so each step waits for every load issued (lab/NOTES.md sections 48 and 50). But
BLOCK_K consecutive channel planes of one image are one contiguous chunk (32 x 49 elements: 3136
bytes, 16-byte aligned wherever C and the step are multiples of 8 channels). Here the gathering
partition loads each step's chunks in aligned 16-byte units, into registers PREFETCH steps ahead,
and builds the operand from them in one of two ways, chosen at launch:

- the shifts (CHUNKS_SHIFTED_GATHER, where chunks_shifted allows and the input is 16-byte aligned):
  the operand as [channels, slots]; channel c's plane starts (HW * c) % 8 elements into a unit, so
  each 8-slot group of row c is 8 elements of a window of two units: a thread loads the first as 4
  words, takes the second from the next lane (a shuffle a word) and shifts the 8 elements out in
  registers. No pass through shared memory.
- the gather (CHUNKS_GATHER): the chunks loaded whole (or, tuning.GLUON_PLANE_CHUNKS_STAGED, by
  asynchronous copies into a ring of raw buffers, a commit group a step, as gluon-row-pairs stages
  its rows: measured 2-6 % slower here), each operand element taken from its place, channel c's
  pixel p at c * HW + p, by ``gl.gather`` (which the compiler lowers to a pass through shared
  memory, one 2-byte read an element; a warp's read is 32 neighbouring pixels of one plane), stored
  as [slots, channels], 8 channels a thread (wgmma reads it transposed).

Steps of 64 channels where C allows (CHUNK_BLOCK_K).

The tile's slots are whole images: ROW_SLOTS (HW rounded up to a power of two) slots an image,
PIXELS / ROW_SLOTS images a tile (two 7x7 images in 128 slots; the slots past HW hold other
pixels, masked at the store). The rest is gluon-row-pairs' kernel (its template): the
weights by TMA, 256 output channels on two computing warpgroups, one product in flight,
persistent programs that keep one channel block and walk the steps of all their tiles as one
sequence, the chain in the accumulator's layout. An image is one output row of HW pixels to that
kernel (OH = 1, OW = HW); the epilogue places slot p of an image at row p // OW, column p % OW.

Gluon has no interpreter: the kernel runs on Hopper GPUs only (CPU tests compile it for sm_90).
"""

from __future__ import annotations

import torch

from fusionplan.runtime import tuning
from fusionplan.runtime.folding import Stage
from fusionplan.solvers.base import Kernel, PlanSpec, Solver
from fusionplan.solvers.conv_kernel import TritonConvKernel
from fusionplan.solvers.conv_toolkit import conv_plan_why_not, pack_rows_rsc, triton_cdiv
from fusionplan.solvers.gather_toolkit import gather_launch_args
from fusionplan.solvers.gluon_toolkit import gather_why_not, gluon_why_not, hopper_why_not, multiprocessors
from fusionplan.solvers.staged_toolkit import (
    COORDINATES_HEAD,
    GATHER_PARAMS,
    PAIRS_BLOCK_K,
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

#: Pixels of an input plane at most: an image's slots (its plane rounded up to a power of two)
#: must fit a tile's PAIRS_PIXELS with another image beside them (a tile of one image would read
#: its weights' box for half the products), or fill the smaller tile (CHUNK_IMAGE_PIXELS).
CHUNK_MAX_PLANE = 64
#: Slots of the smaller tile (chunks_config, tuning.GLUON_PLANE_CHUNKS_IMAGE_TILES): one image of up
#: to 64 pixels, where tiles of two would leave most multiprocessors idle (r50_21).
CHUNK_IMAGE_PIXELS = 64
#: Elements a copy moves (16 bytes of 16-bit data).
CHUNK_VEC = 8
#: Input channels of a reduction step where C is a multiple of it (else PAIRS_BLOCK_K): 128-byte
#: rows of the weights' boxes, half the steps. H100, fp16, batch 32, CBNA (lab/NOTES.md section
#: 51): r50_19 13.0 us against 14.2 with 32-channel steps.
CHUNK_BLOCK_K = 64

#: The chunks' gathers (gluon_row_pairs' template's gather_functions): a step reads [images,
#: RAW_COLS] elements, each image's BLOCK_K channel planes as one run from the step's first
#: channel, and takes the operand from them by a gather.
CHUNKS_GATHER = """@gluon.jit
def _gathered_geometry(GEOMETRY_PARAMS):
    # The copies' rows (the tile's images) and columns (a chunk's elements), and where each element of
    # the [PIXELS, BLOCK_K] operand lies in a step's raw elements seen flat: channel c's pixel p of
    # the tile's image i at i * RAW_COLS + c * OUT_W + p (slots past the plane repeat its last pixel).
    rows = gl.arange(0, RAW_ROWS, layout=gl.SliceLayout(1, layout))
    cols = gl.arange(0, RAW_COLS, layout=gl.SliceLayout(0, layout))
    # [slots, channels], 8 channels a thread (a 16-byte store), lanes along the slots: each 2-byte
    # read of a warp is 32 neighbouring pixels of one channel plane, 64 contiguous bytes
    warp_cols: gl.constexpr = min(gl.num_warps(), BLOCK_K // 8)
    operand: gl.constexpr = gl.BlockedLayout(
        [1, 8], [32, 1], [gl.num_warps() // warp_cols, warp_cols], [1, 0]
    )
    slots = gl.arange(0, PIXELS, layout=gl.SliceLayout(1, operand))
    chans = gl.arange(0, BLOCK_K, layout=gl.SliceLayout(0, operand))
    pixel = (slots // ROW_SLOTS) * RAW_COLS + gl.minimum(slots % ROW_SLOTS, OUT_W - 1)
    places = gl.reshape(pixel[:, None] + chans[None, :] * OUT_W, [PIXELS * BLOCK_K])
    return rows, cols, places


@gluon.jit
def _gathered_addresses(ADDRESS_PARAMS):
    # The program's step g (of n, STEPS a tile): for each of its tile's images (NOH of the batch)
    # the BLOCK_K planes of its channel block from the step's first, one contiguous run of
    # BLOCK_K * OUT_W elements, VEC a thread, aligned (the plan's rule: C and BLOCK_K whole
    # VEC-element units of planes); steps past n and images past the batch touch no memory.
    rows, cols, _ = geo
    _, m0 = _tile_origin(g // STEPS, N_K, BLOCK_N, PIXELS)
    image = m0 // ROW_SLOTS + rows
    live = (image < NOH) & (g < n)
    if IDX64:  # offsets of inputs past 2^31 elements
        image = image.to(gl.int64)
    start = gl.multiple_of(image * sxn + (g % STEPS) * (BLOCK_K * OUT_W), VEC)
    mask = live[:, None] & (cols < BLOCK_K * OUT_W)[None, :]
    return x_ptr + start[:, None] + cols[None, :], mask


@gluon.jit
def _gathered_operand(OPERAND_PARAMS):
    # each operand element from its place in the step's raw elements
    _, _, places = geo
    flat = gl.gather(gl.reshape(raw, [RAW_ROWS * RAW_COLS]), places, 0)
    return gl.reshape(flat, [PIXELS, BLOCK_K])
"""

#: The chunks' gathers without a pass through shared memory (chunks_shifted; the operand as [channels,
#: slots]). Channel c's plane starts s = (HW * c) % 8 elements into an aligned 8-element unit of its
#: image's run, so each 8-slot group of an operand row is 8 elements of a 16-element window from an
#: aligned unit: the window's first unit loaded by the thread itself (16 bytes, as 4 words), its
#: second taken from the next unit's thread (a gather of the lanes: a shuffle a word), the 8
#: elements then shifted out of the window in registers (words selected by s's bits 2 and 1, a byte
#: permute of each word and the next by bit 0).
CHUNKS_SHIFTED_GATHER = """@gluon.jit
def _shifted_geometry(GEOMETRY_PARAMS):
    # the raw words as [channels, slot pairs] and each row's s
    rows = gl.arange(0, RAW_ROWS, layout=gl.SliceLayout(1, layout))
    cols = gl.arange(0, RAW_COLS, layout=gl.SliceLayout(0, layout))
    return rows, cols, gl.expand_dims((rows * OUT_W) % 8, 1)


@gluon.jit
def _shifted_addresses(ADDRESS_PARAMS):
    # The program's step g (of n, STEPS a tile), read as words (VEC a thread: one unit): for each
    # channel c of its block and each 8-slot group of each of its tile's images (NOH of the batch),
    # the unit of the image's run (the block's BLOCK_K planes from the step's first channel) where
    # that group's pixels start: unit (OUT_W * c) // 8 + group. Units past the run (the last
    # channel's slots past its plane), steps past n and images past the batch touch no memory.
    rows, cols, _ = geo
    _, m0 = _tile_origin(g // STEPS, N_K, BLOCK_N, PIXELS)
    image = m0 // ROW_SLOTS + cols // (ROW_SLOTS // 2)
    live = (image < NOH) & (g < n)
    # a group's unit and its words in the run: the row's first unit, then the slots' place in the
    # image (units whole: the comparison with the run's end holds for all of a unit's words)
    first = gl.multiple_of(rows * OUT_W // 8 * 4, VEC)
    places = first[:, None] + (cols % (ROW_SLOTS // 2))[None, :]
    mask = live[None, :] & (places < BLOCK_K * OUT_W // 2)
    if IDX64:  # offsets of inputs past 2^31 elements
        image = image.to(gl.int64)
    start = gl.multiple_of((image * sxn + (g % STEPS) * (BLOCK_K * OUT_W)) // 2, VEC)
    words = x_ptr.to(gl.pointer_type(gl.int32), bitcast=True)
    return words + first[:, None] + (start + cols % (ROW_SLOTS // 2))[None, :], mask


@gluon.jit
def _shifted_operand(OPERAND_PARAMS):
    # each group's window (its unit and the next unit's thread's), shifted by its row's s, as
    # elements of DTYPE
    _, cols, shift = geo
    units = gl.reshape(raw, [RAW_ROWS, RAW_COLS // 4, 4])
    groups = gl.reshape(shift * 0 + cols[None, :], [RAW_ROWS, RAW_COLS // 4, 4])
    following = gl.minimum(groups // 4 + 1, RAW_COLS // 4 - 1)
    nxt = gl.convert_layout(gl.reshape(gl.gather(units, following, 1), [RAW_ROWS, RAW_COLS]), raw.type.layout)
    words = gl.inline_asm_elementwise(
        _SHIFT_ASM, "=r,=r,=r,=r,r,r,r,r,r,r,r,r,r,r,r,r", [raw, nxt, shift], dtype=gl.int32, is_pure=True,
        pack=4,
    )
    halves = gl.join((words & 65535).to(gl.int16), (words >> 16).to(gl.int16))
    return gl.reshape(halves, [RAW_ROWS, 2 * RAW_COLS]).to(DTYPE, bitcast=True)


# 8 16-bit elements (4 words out) from a 16-element window (words $4-$7 and $8-$11) starting $12
# elements in: words shifted by 2 where bit 2 is set, by 1 where bit 1 is, then a half word where bit 0
# is (a byte permute of each word and the next)
_SHIFT_ASM = gl.constexpr(
    "{ .reg .pred p4, p2; .reg .b32 a0, a1, a2, a3, a4, a5, b0, b1, b2, b3, b4, t, sel;"
    "and.b32 t, $12, 4; setp.ne.b32 p4, t, 0; and.b32 t, $12, 2; setp.ne.b32 p2, t, 0;"
    "and.b32 t, $12, 1; mad.lo.u32 sel, t, 8738, 12816;"
    "selp.b32 a0, $6, $4, p4; selp.b32 a1, $7, $5, p4; selp.b32 a2, $8, $6, p4;"
    "selp.b32 a3, $9, $7, p4; selp.b32 a4, $10, $8, p4; selp.b32 a5, $11, $9, p4;"
    "selp.b32 b0, a1, a0, p2; selp.b32 b1, a2, a1, p2; selp.b32 b2, a3, a2, p2;"
    "selp.b32 b3, a4, a3, p2; selp.b32 b4, a5, a4, p2;"
    "prmt.b32 $0, b0, b1, sel; prmt.b32 $1, b1, b2, sel; prmt.b32 $2, b2, b3, sel; prmt.b32 $3, b3, b4, sel; }"
)
"""

#: The chunks' slots (gluon_row_pairs.COORDINATES_HEAD's rows are images): slot p of an image its
#: pixel p, row p // IMAGE_W and column p % IMAGE_W of the output plane.
CHUNKS_PLACES = """n_img = out_row
pix = col
oh = pix // IMAGE_W
ow = pix % IMAGE_W"""


def chunks_dispatch() -> str:
    """The template's three gather functions (GATHER_PARAMS): each calls the shifts' or the gather's by
    the launch's raw step, whose shape tells them apart (the shifts' raw words are half a step's
    operand elements, the gather's runs as many)."""
    texts = []
    for step, params in (
        ("geometry", "GEOMETRY_PARAMS"),
        ("addresses", "ADDRESS_PARAMS"),
        ("operand", "OPERAND_PARAMS"),
    ):
        args = " ".join(GATHER_PARAMS[params].replace(": gl.constexpr", "").split()).rstrip(",")
        texts.append(
            f"@gluon.jit\ndef _step_{step}({params}):\n"
            "    if 2 * RAW_ROWS * RAW_COLS == PIXELS * BLOCK_K:\n"
            f"        return _shifted_{step}({args})\n"
            "    else:\n"
            f"        return _gathered_{step}({args})\n"
        )
    return "\n\n".join(texts)


def chunk_slots(spec: PlanSpec) -> int:
    """Slots of an image: its plane (H*W pixels) rounded up to a power of two."""
    _, _, h, w = spec.input_desc.dims
    return 1 << (h * w - 1).bit_length()


def chunks_why_not(spec: PlanSpec) -> str | None:
    """Why the kernel cannot read the plan's convolution, or None: a 1x1 filter at stride 1 without
    padding, ungrouped, on packed NCHW input of 16-bit data (wgmma reads the operand along its
    pixels only for 16-bit data), planes of at most CHUNK_MAX_PLANE pixels, and C a multiple of the
    reduction step (each step's chunk whole, and 16-byte aligned)."""
    not_packed = "an image's channel planes are not one contiguous run"
    why = planes_1x1_why_not(spec, 1, "whole plane chunks", not_packed)
    if why:
        return why
    _, channels, h, w = spec.input_desc.dims
    if h * w > CHUNK_MAX_PLANE:
        return f"{h}x{w} planes of {h * w} pixels (> {CHUNK_MAX_PLANE}): two images' slots exceed a tile"
    if channels % PAIRS_BLOCK_K:
        return f"C={channels}: a step's chunk of {PAIRS_BLOCK_K} channel planes would cross into the next image"
    return None


def chunks_tiles(spec: PlanSpec, sms: int) -> int:
    """Tiles of the plan's tile on ``sms`` multiprocessors (chunks_config): groups of whole images x
    channel blocks."""
    n, c = spec.input_desc.dims[:2]
    k = spec.output_desc.dims[1]
    slots = n * chunk_slots(spec)
    return tiles_of(chunks_config(k, c, slots, sms), slots, k)


def tiles_of(cfg: tuning.ConvConfig, slots: int, k: int) -> int:
    """Tiles of ``cfg`` over ``slots`` (the batch's images' slots) and ``k`` output channels."""
    return triton_cdiv(slots, cfg.block_m) * triton_cdiv(k, cfg.block_n)


def chunks_defer_why(spec: PlanSpec, sms: int) -> str | None:
    """Where other kernels measured faster : grids of fewer
    tiles than tuning.GLUON_PLANE_CHUNKS_MIN_FILL of the multiprocessors (the kernel does not split
    its reduction). H100, fp16, batch 32, CBNA (lab/NOTES.md section 51): r50_19's 128 tiles 13.0 us
    against 16.8 for gluon-nchw-regs; r50_21's 32 (64 of 128 channels) 34.2 (25.9) against 18.0 for
    gluon-nchw."""
    tiles = chunks_tiles(spec, sms)
    if tiles < tuning.GLUON_PLANE_CHUNKS_MIN_FILL * sms:
        return (
            f"{tiles} tiles on {sms} multiprocessors (< {tuning.GLUON_PLANE_CHUNKS_MIN_FILL:g} of them) and no split "
            "reduction: gluon-nchw measured faster (r50_21: 34.2 us against 18.0)"
        )
    return None


def chunks_block_k(c: int) -> int:
    """Input channels of a reduction step: CHUNK_BLOCK_K where ``c`` is a multiple of it, else
    PAIRS_BLOCK_K (chunks_why_not: C a multiple of that)."""
    return CHUNK_BLOCK_K if c % CHUNK_BLOCK_K == 0 else PAIRS_BLOCK_K


def chunks_tile(block_n: int, c: int, stages: int = 0, pixels: int = PAIRS_PIXELS) -> tuning.ConvConfig:
    """``pixels`` slots (PAIRS_PIXELS or CHUNK_IMAGE_PIXELS) by ``block_n`` output channels (two
    computing warpgroups for 256, else one) in steps of chunks_block_k(``c``) channels, with
    ``stages`` in the ring (0: as many as PAIRS_SHARED_BYTES holds beside the staged chunks, at
    least 2)."""
    block_k = chunks_block_k(c)
    staged = 0
    if tuning.GLUON_PLANE_CHUNKS_STAGED:
        staged = raw_ring_bytes(block_k, pixels)
    per_stage = (pixels + block_n) * block_k * 2
    stages = stages or ring_stages(PAIRS_SHARED_BYTES - staged, per_stage)
    return tuning.ConvConfig(pixels, block_n, block_k, 8, 8 if block_n == 256 else 4, stages, 1)


def chunks_config(k: int, c: int, slots: int = 0, sms: int = 0) -> tuning.ConvConfig:
    """For ``k`` output and ``c`` input channels: PAIRS_PIXELS slots by 256 output channels (128 or 64
    where the output has fewer); with tuning.GLUON_PLANE_CHUNKS_IMAGE_TILES, for ``slots`` (the
    batch's images' slots) on ``sms`` multiprocessors, CHUNK_IMAGE_PIXELS slots by at most 128
    channels where the larger tiles fill less than tuning.GLUON_PLANE_CHUNKS_MIN_FILL of them and
    the smaller give more (chunks_tile)."""
    wide = chunks_tile(256 if k >= 256 else 128 if k > 64 else 64, c)
    if not (tuning.GLUON_PLANE_CHUNKS_IMAGE_TILES and slots and sms):
        return wide
    if tiles_of(wide, slots, k) >= tuning.GLUON_PLANE_CHUNKS_MIN_FILL * sms:
        return wide
    narrow = chunks_tile(min(wide.block_n, 128), c, pixels=CHUNK_IMAGE_PIXELS)
    return narrow if tiles_of(narrow, slots, k) > tiles_of(wide, slots, k) else wide


def chunks_shifted(spec: PlanSpec) -> bool:
    """Whether the operand's rows are taken from the runs by shifts in registers (CHUNKS_SHIFTED_GATHER,
    tuning.GLUON_PLANE_CHUNKS_SHIFTED) rather than a gather through shared memory: where every pixel
    of a plane lies in its 8-slot group's window of two units, a plane of whole units or one at least
    a unit short of its slots (the last group's second unit is the next image's)."""
    _, _, h, w = spec.input_desc.dims
    plane = h * w
    return bool(tuning.GLUON_PLANE_CHUNKS_SHIFTED) and (plane % 8 == 0 or plane <= chunk_slots(spec) - 8)


def render_gluon_plane_chunks_source(spec: PlanSpec, stages: list[Stage]) -> str:
    """The kernel's source: gluon-row-pairs' template with the chunks' coordinates and both ways to
    the operand (the shifts and the gather: the launch's raw step chooses, GluonPlaneChunksKernel.shifted)."""
    title = "1x1 convolution on NCHW plane chunks"
    places = COORDINATES_HEAD + CHUNKS_PLACES
    gathers = "\n\n".join((CHUNKS_GATHER, CHUNKS_SHIFTED_GATHER, chunks_dispatch()))
    return render_staged_source(spec, stages, title, "gluon_plane_chunks", gathers, places)


class GluonPlaneChunksKernel(TritonConvKernel):
    splits_reduction = False
    programs_and_steps = staged_programs_and_steps
    _launch_args = gather_launch_args  # with this kernel's launch_constants and launch_grid
    launch_constants = staged_launch_constants
    launch_grid = staged_launch_grid

    def pack(self, weight: Tensor) -> Tensor:
        return pack_rows_rsc(weight)

    solver_name = "gluon-plane-chunks"
    stem = "gluon_plane_chunks"

    def shifted(self, x: Tensor | None) -> bool:
        """Whether the operand's rows come from the runs by shifts (chunks_shifted) reading ``x``: its
        words' loads take input whose start is 16-byte aligned (None: no input at hand, taken as
        aligned)."""
        return chunks_shifted(self.spec) and (x is None or x.data_ptr() % 16 == 0)

    def operand_k_major(self, x: Tensor | None = None) -> bool:
        """[slots, channels] from the gather through shared memory (8 channels a thread), [channels,
        slots] from the shifts (8 slots a thread)."""
        return not self.shifted(x)

    @property
    def gather_warps(self) -> int:  # type: ignore[override]
        """tuning.GLUON_PLANE_CHUNKS_GATHER_WARPS."""
        return tuning.GLUON_PLANE_CHUNKS_GATHER_WARPS

    @staticmethod
    def render(spec: PlanSpec, stages: list[Stage]) -> str:
        return render_gluon_plane_chunks_source(spec, stages)

    def _geometry(self, geometry: tuple[int, ...], out_hw: tuple[int, int]) -> tuple[tuple[int, ...], tuple[int, int]]:
        """Each image as one output row of its plane's pixels (H = W = OW = the plane, OH = 1)."""
        m, c, k = geometry[:3]
        plane = out_hw[0] * out_hw[1]
        return (m, c, k, 1, plane, 1, plane), (1, plane)

    def _pixel_slots(self, spec: PlanSpec) -> int:
        """An image's slots (chunk_slots)."""
        return chunk_slots(spec)

    def raw_step(self, cfg: tuning.ConvConfig, x: Tensor | None = None) -> tuple[int, int]:
        """A step's raw elements as [images, columns]: each image's chunk of BLOCK_K planes, rounded
        up to a power of two (BLOCK_K times an image's slots); for the shifts [channels, slot pairs],
        each 8-slot group's first unit as words (half as many raw values as operand elements: the
        kernel tells the two gathers apart by that)."""
        if self.shifted(x):
            return cfg.block_k, cfg.block_m // 2
        return cfg.block_m // self.pixel_slots, cfg.block_k * self.pixel_slots

    def heuristic(self, m: int, k_per_group: int, c_per_group: int, dtype) -> tuning.ConvConfig:
        """chunks_config for ``m`` slots (the kernel's rows: an image's slots each)."""
        return chunks_config(k_per_group, c_per_group, m, multiprocessors(self._handle))

    @property
    def candidates(self) -> list[tuning.ConvConfig]:  # type: ignore[override]
        """NORMAL find's configurations: 256, 128 and 64 output channels by PAIRS_PIXELS slots; with
        tuning.GLUON_PLANE_CHUNKS_IMAGE_TILES 128 and 64 by CHUNK_IMAGE_PIXELS (one image a tile) where
        an image fills them."""
        c = self.geometry[1]
        tiles = [chunks_tile(n, c) for n in (256, 128, 64)]
        if tuning.GLUON_PLANE_CHUNKS_IMAGE_TILES and self.pixel_slots == CHUNK_IMAGE_PIXELS:
            tiles += [chunks_tile(n, c, pixels=CHUNK_IMAGE_PIXELS) for n in (128, 64)]
        return tiles

    def resident(self, cfg: tuning.ConvConfig) -> bool:
        """Never: r50_19's weights resident (128-channel tiles) measured no faster (18.7 us against
        18.3 a box a stage; lab/NOTES.md section 51)."""
        return False

    def staged(self, x) -> bool:
        """Whether the chunks come by asynchronous copies (tuning.GLUON_PLANE_CHUNKS_STAGED, input
        16-byte aligned) rather than loads into registers; the shifts take loads (chunks_shifted)."""
        return staged_input(x, tuning.GLUON_PLANE_CHUNKS_STAGED) and not self.shifted(x)

    def store_switch(self) -> int:
        """0, no storing partition: a program has one tile (r50_19), so no product runs under its
        stores, and r50_19 measured slower with one (16.8 us with 2 or 4 storing warps against 14.8;
        lab/NOTES.md section 53)."""
        return 0

    def hoist_channels(self, store_warps: int) -> bool:
        """Never: r50_19 (one tile a program) measured no faster with them loaded before its tiles
        (14.50 us against 14.43, lab/NOTES.md section 53)."""
        return False

    def weights_by_mma(self, cfg: tuning.ConvConfig) -> bool:
        """Never: the gathering partition requests the weights (r50_19 15.07 us with the computing one
        requesting them against 14.18; lab/NOTES.md section 54)."""
        return False

    def load_vec(self, x: Tensor | None = None) -> int:
        """Elements a copy moves: CHUNK_VEC (the plan's rule keeps each step's chunks whole units); the
        shifts' loads read words, CHUNK_VEC // 2."""
        return CHUNK_VEC // 2 if self.shifted(x) else CHUNK_VEC


class GluonPlaneChunksSolver(Solver):
    """gluon-row-pairs' staged kernel and rules on the chunks' input (chunks_why_not)."""

    name = "gluon-plane-chunks"
    family = "triton"

    def why_not(self, spec: PlanSpec, handle) -> str | None:
        return (
            conv_plan_why_not(spec)
            or chunks_why_not(spec)
            or gather_why_not(spec)
            or gluon_why_not()
            or hopper_why_not(handle)
        )

    def defer_why(self, spec: PlanSpec, handle) -> str | None:
        return chunks_defer_why(spec, multiprocessors(handle))

    def build(self, spec: PlanSpec, handle) -> Kernel:
        return GluonPlaneChunksKernel(spec, handle)
