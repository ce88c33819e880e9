"""Gluon window-nchw solver: gluon-window's kernel on packed NCHW input of 16-bit data with small
planes (at most COPY_MAX_PLANE pixels: ResNet-50's 14x14 and 7x7 layers), followed by any chain of
bias, batch-norm inference and activations, as ONE kernel (Hopper only).

The NCHW kernels that read such planes directly (gluon-nchw, gluon-plane-chunks) take the
convolution's operand out of the planes step by step: 2-byte gathers, a plane starting inside a
16-byte unit, each element again for every filter tap (bench/NOTES.md section 55: those layers run
1.5-1.9x their NHWC time, latency-bound on the gathers). Here each program first turns the images
its output window reads into channels-last, in a buffer of the current stream, and then runs
gluon-window's pipeline on that buffer unchanged: TMA boxes of every tap (the padding zero-filled by
the boxes), wgmma, the chain, the output stored along its planes by pointer. The turn reads an
image's channel planes as contiguous runs, 16 bytes a thread (CB planes of HW pixels: one run,
16-byte aligned where C is a multiple of 8), takes each [pixels, CB channels] block from its places
in the run by a gather (a pass through shared memory) and stores it 16 bytes a thread along the
channels; a proxy fence and a barrier then order those stores before the loading warp's boxes.

Every program turns its window's whole images, so programs of the same images (one per block of
output channels) write the same values to the same places: each reads only what it wrote itself
before its fence, and a later write of another program is the same bytes.

Gluon has no interpreter: the kernel runs on Hopper GPUs only (CPU tests compile it for sm_90).
"""

from __future__ import annotations

import torch

from fusionplan.descriptors import Layout, TensorDescriptor, layout_strides
from fusionplan.enums import DataType
from fusionplan.folding import Stage
from fusionplan.launch import per_stream_buffer
from fusionplan.solvers.base import Kernel, PlanSpec, Solver
from fusionplan.solvers.gluon_plane_chunks import SHIFT_ASM
from fusionplan.solvers.gluon_window import (
    CHANNELS_LAST_INPUT,
    GluonWindowKernel,
    gluon_config,
    gluon_names,
    gluon_why_not,
    gluon_window_why_not,
    hopper_why_not,
    render_gluon_source,
)
from fusionplan.solvers.triton_conv import conv_plan_why_not, triton_cdiv
from fusionplan.solvers.triton_window import window_tiles, window_why_not

Tensor = torch.Tensor

#: Pixels of an input plane at most (a power of two at least the plane holds a block's rows).
COPY_MAX_PLANE = 256
#: Elements of a block of pixels and channels turned at a time (32 a thread of four warps).
COPY_BLOCK_ELEMENTS = 4096
#: Channels of a block at most.
COPY_MAX_CHANNELS = 128
#: Shared memory of a program's share of the turn at most (beside gluon-window's ring).
COPY_MAX_STAGING = 64 * 1024

_COPY_FUNCTIONS = """
from triton.experimental.gluon.language.nvidia.ampere import async_copy


@gluon.jit
def _block_words(x_ptr, j, runs, n0, N, C, HW, rows, cols, CB: gl.constexpr):
    # Block j (of runs) of the group's images, as 32-bit words: image n0 + j // (C // CB), its CB
    # channel planes from (j % (C // CB)) * CB, one contiguous run of CB * HW elements (16-byte
    # aligned); row c of the [CB, PIX // 2] words from the unit of 8 elements where plane c starts,
    # (c * HW) // 8, 4 words a thread. Units past the run, and blocks past the group's and the
    # batch's images, read nothing. Returns the words' addresses and mask.
    n = n0 + j // (C // CB)
    run = gl.multiple_of((n.to(gl.int64) * C + (j % (C // CB)) * CB) * HW // 2, 4)
    words = x_ptr.to(gl.pointer_type(gl.int32), bitcast=True) + run
    places = gl.multiple_of(rows * HW // 8 * 4, 4)[:, None] + cols[None, :]
    return words + places, (places < CB * HW // 2) & ((n < N) & (j < runs))


@gluon.jit
def _block_planes(raw, rows, cols, HW, CB: gl.constexpr, PIX: gl.constexpr, DTYPE: gl.constexpr):
    # The block's [CB, PIX] elements, pixel p of plane c at slot p: plane c starts s = (c * HW) % 8
    # elements into its first unit, so slots 8g .. 8g + 7 are elements s .. s + 7 of the window of
    # units g and g + 1 (the second from the next lane: a shuffle a word), shifted out in registers
    shift = gl.expand_dims((rows * HW) % 8, 1)
    units = gl.reshape(raw, [CB, PIX // 8, 4])
    groups = gl.reshape(shift * 0 + cols[None, :], [CB, PIX // 8, 4])
    following = gl.minimum(groups // 4 + 1, PIX // 8 - 1)
    nxt = gl.convert_layout(gl.reshape(gl.gather(units, following, 1), [CB, PIX // 2]), raw.type.layout)
    words = gl.inline_asm_elementwise(
        _SHIFT_ASM, "=r,=r,=r,=r,r,r,r,r,r,r,r,r,r,r,r,r", [raw, nxt, shift], dtype=gl.int32, is_pure=True,
        pack=4,
    )
    halves = gl.join((words & 65535).to(gl.int16), (words >> 16).to(gl.int16))
    return gl.reshape(halves, [CB, PIX]).to(DTYPE, bitcast=True)


@gluon.jit
def _channels_last_share(
    x_ptr, s_ptr, n0, N, C, HW, member, GROUP,
    TILE_IMAGES: gl.constexpr, CB: gl.constexpr, PIX: gl.constexpr, BLOCKS: gl.constexpr,
):
    # Member `member` of a group's GROUP programs turns blocks member, member + GROUP, ... (BLOCKS at
    # most) of the group's images (TILE_IMAGES from n0) channels-last into s_ptr ([N, H*W, C]): the
    # share's words all copied into shared memory first (16 bytes a copy, every byte of the share in
    # flight at once), then each block's planes shifted out of its words, its [CB, PIX] elements
    # changed to 8 channels of a pixel a thread and stored as 16 bytes
    units: gl.constexpr = min(32, PIX // 8)  # a row's units on the lanes of one warp
    words_layout: gl.constexpr = gl.BlockedLayout([1, 4], [32 // units, units], [gl.num_warps(), 1], [1, 0])
    store_layout: gl.constexpr = gl.BlockedLayout([8, 1], [1, 32], [1, gl.num_warps()], [0, 1])
    rows = gl.arange(0, CB, layout=gl.SliceLayout(1, words_layout))
    cols = gl.arange(0, PIX // 2, layout=gl.SliceLayout(0, words_layout))
    chans = gl.arange(0, CB, layout=gl.SliceLayout(1, store_layout))[:, None]
    pix = gl.arange(0, PIX, layout=gl.SliceLayout(0, store_layout))[None, :]
    places = pix * C + chans
    live = (pix < HW) & (chans < CB)
    runs = (C // CB) * TILE_IMAGES
    plain: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
    staging = gl.allocate_shared_memory(gl.int32, [BLOCKS * CB, PIX // 2], plain)
    for b in gl.static_range(BLOCKS):
        words, mask = _block_words(x_ptr, member + b * GROUP, runs, n0, N, C, HW, rows, cols, CB)
        {async_copy}(staging.slice(b * CB, CB), words, mask=mask)
    async_copy.commit_group()
    async_copy.wait_group(0)
    for b in gl.static_range(BLOCKS):
        j = member + b * GROUP
        n = n0 + j // (C // CB)
        raw = staging.slice(b * CB, CB).load(words_layout)
        planes = _block_planes(raw, rows, cols, HW, CB, PIX, s_ptr.dtype.element_ty)
        first = s_ptr + (n.to(gl.int64) * HW * C + (j % (C // CB)) * CB)
        gl.store(first + places, gl.convert_layout(planes, store_layout), mask=live & ((n < N) & (j < runs)))


"""

#: In place of the window's origin by the program's ids (gluon_window.TILE_ORIGIN), after the wait
#: for the kernel before (which may write the input, or be a launch of this kernel still drawing
#: tickets): the window by a ticket, the group's images turned channels-last, the wait for the
#: group's other members.
_INPUT_PROLOGUE = """
    # the window by a ticket, in the order the programs start: a group's programs (every window
    # and channel block over the same TILE_N images) take consecutive tickets, and each does its
    # share before it waits, so a waiting program waits only for programs that have started
    ticket = gl.atomic_add(sync_ptr, 1, sem="relaxed", scope="gpu")
    if ticket == gl.num_programs(0) - 1:  # every ticket taken: the next launch starts again at 0
        gl.atomic_xchg(sync_ptr, 0, sem="relaxed", scope="gpu")
    group = ticket // GROUP
    member = ticket % GROUP
    tiles_w = gl.cdiv(OW, TILE_W)
    tiles_h = gl.cdiv(OH, TILE_H)
    pid = group * (tiles_w * tiles_h) + member // N_BLOCKS
    pid_n = member % N_BLOCKS
    ow0 = (pid % tiles_w) * TILE_W
    oh0 = ((pid // tiles_w) % tiles_h) * TILE_H
    n0 = (pid // (tiles_w * tiles_h)) * TILE_N
    k0 = pid_n * BLOCK_N
    _channels_last_share(x_ptr, s_ptr, n0, N, C, H * W, member, GROUP, TILE_N, CB, PIX, BLOCKS)
    # the share's stores before the arrival (a proxy fence: the boxes read them in the async proxy)
    gl.inline_asm_elementwise("fence.proxy.async.global; // $0", "=r", [], dtype=gl.int32, is_pure=False, pack=1)
    {thread_barrier}()
    done = sync_ptr + 1 + group
    arrived = gl.atomic_add(done, 1, sem="acq_rel", scope="gpu") + 1
    while arrived < GROUP:
        arrived = gl.atomic_add(done, 0, sem="acquire", scope="gpu")
    left = done + gl.num_programs(0) // GROUP
    if gl.atomic_add(left, 1, sem="relaxed", scope="gpu") == GROUP - 1:
        # every member is past the wait: the group's counters start again at 0
        gl.atomic_xchg(done, 0, sem="relaxed", scope="gpu")
        gl.atomic_xchg(left, 0, sem="relaxed", scope="gpu")"""

#: The loading warp's proxy fence before its first box: the boxes read what the group stored.
_LOADER_PROLOGUE = """
    gl.inline_asm_elementwise("fence.proxy.async.global; // $0", "=r", [], dtype=gl.int32, is_pure=False, pack=1)"""

#: The stores' layout (gluon-window's out_layout) for output along its planes.
PLANE_STORES = """    # the stores' layout, [pixels, channels]: lanes along the pixels, neighbours in an NCHW plane
    out_layout: gl.constexpr = gl.BlockedLayout([1, 1], [32, 1], [1, gl.num_warps()], [0, 1])"""

_PARAMS = " x_ptr, s_ptr, sync_ptr, GROUP, N_BLOCKS, CB: gl.constexpr, PIX: gl.constexpr, BLOCKS: gl.constexpr,"


def copy_geometry(c: int, hw: int, images: int, group: int) -> tuple[int, int, int]:
    """(CB, PIX, BLOCKS) of the turn: a plane's pixels rounded up to a power of two; the channels of
    a block (a power of two of at least 8 that divides C, at most COPY_BLOCK_ELEMENTS elements with
    the pixels, narrower while a group of ``group`` programs over ``images`` images would leave
    members without a block); the blocks of a member's share at most."""
    pix = _pow2(hw)
    cb = COPY_MAX_CHANNELS
    while cb > 8 and (c % cb or cb * pix > COPY_BLOCK_ELEMENTS or images * (c // cb) < group):
        cb //= 2
    return cb, pix, -(-images * (c // cb) // group)


def share_geometry(spec: PlanSpec) -> tuple[int, int, int, int]:
    """(CB, PIX, BLOCKS, GROUP) of the plan's launch (gluon-window's configuration on the GPU): the
    turn's copy_geometry, and a group's programs (its windows by the channel blocks)."""
    nhwc = channels_last_spec(spec)
    cfg = gluon_config(nhwc)
    (images, _, _), windows = window_tiles(nhwc, cfg.block_m)
    n, c, h, w = spec.input_desc.dims
    group = windows // triton_cdiv(n, images) * triton_cdiv(spec.output_desc.dims[1], cfg.block_n)
    return (*copy_geometry(c, h * w, images, group), group)


def staging_why_not(spec: PlanSpec) -> str | None:
    """Why a member's share does not fit COPY_MAX_STAGING bytes of shared memory, or None."""
    cb, pix, blocks, group = share_geometry(spec)
    size = blocks * cb * pix * spec.dtype.torch_dtype.itemsize
    if size > COPY_MAX_STAGING:
        return f"a program's share of the turn to channels-last takes {size} bytes (> {COPY_MAX_STAGING})"
    return None


def _pow2(n: int) -> int:
    return 1 << (n - 1).bit_length()


def channels_last_spec(spec: PlanSpec) -> PlanSpec:
    """``spec`` with its input packed channels-last: what the window pipeline reads."""
    x = spec.input_desc
    return PlanSpec(TensorDescriptor.packed(x.dtype, x.dims, Layout.NHWC), spec.ops)


def window_nchw_why_not(spec: PlanSpec) -> str | None:
    """Why the input cannot be turned channels-last inside the kernel, or None: packed NCHW
    16-bit input, planes of at most COPY_MAX_PLANE pixels, C a multiple of 8 (runs of whole
    16-byte units)."""
    x = spec.input_desc
    if not x.same_strides(layout_strides(x.dims, Layout.NCHW)):
        return f"the input must be packed NCHW (gluon-window reads channels-last input itself); it is {x.layout_name}"
    if spec.dtype not in (DataType.HALF, DataType.BFLOAT16):
        return f"{spec.dtype.name} data: the turn to channels-last is written for 16-bit data"
    n, c, h, w = x.dims
    if h * w > COPY_MAX_PLANE:
        return f"planes of {h}x{w} pixels: turned channels-last up to {COPY_MAX_PLANE} pixels"
    if c % 8:
        return f"C={c}: the planes' runs need whole 16-byte units (C a multiple of 8)"
    return None


def render_window_nchw_source(spec: PlanSpec, stages: list[Stage]) -> str:
    """gluon-window's source with the turn to channels-last before the pipeline and the output
    stored along its planes."""
    fields = dict(
        CHANNELS_LAST_INPUT,
        prologue_functions=_COPY_FUNCTIONS.format(**gluon_names()) + SHIFT_ASM,
        prologue_params=_PARAMS,
        tile_origin="",
        input_prologue=_INPUT_PROLOGUE.format(**gluon_names()),
        loader_prologue=_LOADER_PROLOGUE,
        out_layout=PLANE_STORES,
    )
    return render_gluon_source(spec, stages, fields)


def channels_last_buffer(spec: PlanSpec, device: torch.device) -> Tensor:
    """The current stream's channels-last buffer for the plan's input (a graph capture's own)."""
    dims, dtype = spec.input_desc.dims, spec.dtype.torch_dtype
    return per_stream_buffer(
        device,
        ("channels-last", dims, dtype),
        lambda: torch.empty(dims, dtype=dtype, device=device, memory_format=torch.channels_last),
    )


def sync_counters(groups: int, device: torch.device, sets: int = 1) -> Tensor:
    """The tickets' counter and each group's arrivals and departures (zero between launches: the
    last ticket and each group's last departure reset them); ``sets`` of them, each 16-byte aligned."""
    size = (1 + 2 * groups + 3) // 4 * 4
    return torch.zeros(sets, size, dtype=torch.int32, device=device)


class GluonWindowNchwKernel(GluonWindowKernel):
    solver_name = "gluon-window-nchw"
    stem = "gluon_window"  # the template's kernel
    stream_workspace = True  # the channels-last buffer is the current stream's

    #: Where the NCHW input's pointer sits in a launch's arguments (after gluon-window's five).
    X_SLOT = 5

    def __init__(self, spec: PlanSpec, handle) -> None:
        self._capture_pool: dict[int, list[Tensor]] = {}  # by groups; filled by compile_ahead
        super().__init__(spec, handle)

    @staticmethod
    def render(spec: PlanSpec, stages: list[Stage]) -> str:
        return render_window_nchw_source(spec, stages)

    def _launch_args(
        self,
        cfg,
        x: Tensor,
        packed: Tensor,
        out: Tensor,
        p: Tensor,
        values: list,
        flags: dict[str, bool],
        has_prior: bool,
        strides: tuple[int, ...] | None = None,
        idx64: bool | None = None,
    ):
        buffer = channels_last_buffer(self.spec, x.device)
        grid, key, args = super()._launch_args(cfg, buffer, packed, out, p, values, flags, has_prior, strides, idx64)
        windows, blocks, _ = grid
        groups = self._groups(cfg)
        group = windows * blocks // groups  # a group's programs: its windows by the channel blocks
        _, c, h, w = self.spec.input_desc.dims
        geometry = copy_geometry(c, h * w, self._windows(cfg)[0][0], group)
        args[self.X_SLOT : self.X_SLOT] = [x, buffer, self._sync_counters(groups, x.device), group, blocks, *geometry]
        return (windows * blocks, 1, 1), key, args

    #: Zeroed counters made at build for launches captured into CUDA graphs: each captured launch
    #: takes a set of its own (a graph may replay on any stream), made ahead so that the graph holds
    #: no memset: one before each launch cost 20-25 us a replay (r50_18, r50_22; H100).
    CAPTURE_POOL = 64

    def compile_ahead(self, device: torch.device, with_prior: bool = False) -> None:
        super().compile_ahead(device, with_prior)
        if device.type == "cuda" and not torch.cuda.is_current_stream_capturing():
            groups = self._groups(self.config)
            pool = self._capture_pool.setdefault(groups, [])
            if not pool:
                pool.extend(sync_counters(groups, device, self.CAPTURE_POOL).unbind(0))

    def _groups(self, cfg) -> int:
        """Groups of the launch of ``cfg``: the batch's runs of a window's images."""
        window = self._windows(cfg)[0]
        return triton_cdiv(self.spec.input_desc.dims[0], window[0])

    def _sync_counters(self, groups: int, device: torch.device) -> Tensor:
        """The launch's counters: the current stream's, or, captured into a graph, one of its own."""
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            pool = self._capture_pool.get(groups)
            return pool.pop() if pool else sync_counters(groups, device)[0]
        return per_stream_buffer(device, ("window-nchw-sync", groups), lambda: sync_counters(groups, device)[0])

    def weights_first(self, cfg) -> int:
        return 0  # the window is known only after the wait for the kernel before (its ticket)

    def pointer_slots(self, args: list) -> tuple[int | tuple[int, ...], ...]:
        """The NCHW input's pointer (the buffer and its descriptor stay the stream's), the output
        (by pointer: no TMA stores along planes), the prior."""
        return (self.X_SLOT, 2, 3)


class GluonWindowNchwSolver(Solver):
    name = "gluon-window-nchw"
    family = "triton"

    def why_not(self, spec: PlanSpec, handle) -> str | None:
        why = conv_plan_why_not(spec) or window_nchw_why_not(spec)
        if why:
            return why
        nhwc = channels_last_spec(spec)
        return (
            window_why_not(nhwc)
            or gluon_window_why_not(nhwc, handle.tf32_allowed())
            or staging_why_not(spec)
            or gluon_why_not()
            or hopper_why_not(handle)
        )

    def defer_why(self, spec: PlanSpec, handle) -> str | None:
        return "measured slower than gluon-nchw on ResNet-50's 14x14 layers (bench/NOTES.md section 56)"

    def build(self, spec: PlanSpec, handle) -> Kernel:
        return GluonWindowNchwKernel(spec, handle)
