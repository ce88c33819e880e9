"""Gluon odd-planes solver: a 1x1 convolution of stride 1 on packed NCHW input whose planes hold an
odd number of pixels (7x7: 49), followed by any chain of bias, batch-norm inference and
activations, as ONE warp-specialized kernel (Hopper only).

A 98-byte plane starts on no 16-byte unit (no tensor box) and, for odd channels, on no 4-byte one
(no copy of 4 bytes or more): gluon-gemm takes neither, and the gather kernels load each element
alone (r50_19 and r50_21 at 1.8-2.0x their NHWC time; bench/NOTES.md sections 41-42). But with C
even, plane c of image n starts (n * C + c) * HW elements in: on a 4-byte boundary when c is even,
one element past one when c is odd. So the pixel pairs (p, p + 1), p even, of even channels and
(p - 1, p) of odd channels are 4-byte units, copied whole by ``cp.async``. A stage's operand
[BLOCK_K channels, SLOTS slots] (wgmma's B operand, the slots contiguous) holds the step's even
channels in its first half of rows and its odd channels in the second; image i of the program's
IMAGES sits at slots SLOT_STRIDE * i .. (SLOT_STRIDE = HW + 1): an even channel's pixel p at slot
SLOT_STRIDE * i + p, an odd channel's at SLOT_STRIDE * i + p + 1 (read, never stored: an odd
row's first slot holds its previous plane's last pixel, an even row's last slot the next plane's
first). The two parities' pixels are a slot apart, so each step is two products into two
accumulators, over the weights packed to match (each BLOCK_K-channel block's even channels, then
its odd ones: two TMA boxes a step). The epilogue adds the odd accumulator read a slot later
(``gl.gather`` along the slots), then runs the chain and stores by pointer.

The computing warps (one warpgroup per 64 output channels) issue the products; a partition of
COPY_WARPS warps requests the weights and copies the input, every copying thread arriving on the
stage's ``copied`` barrier once its copies have landed. A program computes IMAGES images' planes
(IMAGES * (HW + 1) of its SLOTS slots) for BLOCK_N output channels; programs of the same images
run side by side (channel tiles first) and find the input in L2.

Off until measured (tuning.GLUON_ODD_PLANES): `fusionplan-bench --tuning GLUON_ODD_PLANES=0,1` first.
Gluon has no interpreter: the kernel runs on Hopper GPUs only (CPU tests compile it for sm_90).
"""

from __future__ import annotations

import torch

from fusionplan import tuning
from fusionplan.enums import DataType
from fusionplan.folding import Stage, split_at_conv
from fusionplan.launch import needs_int64
from fusionplan.solvers.base import Kernel, PlanSpec, Solver
from fusionplan.solvers.gluon_gemm import multiprocessors
from fusionplan.solvers.gluon_nchw import _STORE, OUT_LAYOUT
from fusionplan.solvers.gluon_window import gluon_descriptor, gluon_epilogue, gluon_names, gluon_why_not, hopper_why_not
from fusionplan.solvers.triton_conv import TritonConvKernel, conv_plan_why_not, triton_cdiv

Tensor = torch.Tensor

#: A program's slots (wgmma's N; two 7x7 images of 50 slots), input channels a reduction step
#: (half of them even, half odd) and the copying partition's warps and registers (gluon-column-pairs'
#: too).
SLOTS = 128
BLOCK_K = 64
COPY_WARPS = 4
COPY_REGS = 56

#: The ring's barriers in the templates of the copying kernels (this one's, gluon-column-pairs'):
#: ``ready`` (the weights' TMA), ``copied`` (the copies landed: COPIED_ARRIVALS arrivals, each
#: template's own), ``empty`` (the products done); and their invalidation after the partitions.
COPY_RING = """\
    ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    copied = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(NUM_STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(copied.index(i), count=COPIED_ARRIVALS)
        mbarrier.init(empty.index(i), count=1)
    fence_async_shared()
"""
COPY_RING_INVALIDATION = """\
    # the ring's barriers invalidated after their last use, before the epilogue's buffers may take
    # their memory (PTX lets an mbarrier's memory serve nothing else until it is invalidated)
    for i in gl.static_range(NUM_STAGES):
        mbarrier.invalidate(ready.index(i))
        mbarrier.invalidate(copied.index(i))
        mbarrier.invalidate(empty.index(i))
"""

#: The copies of one step's operand by channel-parity pairs (this kernel's, gluon-odd-windows'), in
#: Gluon's names at render time (the asynchronous copy's name differs between Triton versions).
PARITY_COPY_STEP = """@gluon.jit
def _copy_step(
    x_ptr, buf, n0, c0, N, C, sxn, HW: gl.constexpr, SLOT_STRIDE: gl.constexpr, IMAGES: gl.constexpr,
    SLOTS: gl.constexpr, BLOCK_K: gl.constexpr,
):
    # [BLOCK_K channels, SLOTS slots]: the first half of the rows the even channels c0, c0 + 2, ..,
    # the second the odd ones; slot SLOT_STRIDE * i + j of image n0 + i holds pixel j (even rows)
    # or j - 1 (odd rows); two slots a copy (4 bytes), lanes along the slots
    HALF: gl.constexpr = BLOCK_K // 2
    layout: gl.constexpr = gl.BlockedLayout([1, 2], [1, 32], [gl.num_warps(), 1], [1, 0])
    r = gl.arange(0, BLOCK_K, layout=gl.SliceLayout(1, layout))
    odd = r // HALF
    channel = c0 + 2 * (r % HALF) + odd
    rows = gl.multiple_of(channel.to(gl.int64) * HW - odd, 2)  # every row's first copy on 4 bytes
    slot = gl.arange(0, SLOTS, layout=gl.SliceLayout(0, layout))
    image = n0 + slot // SLOT_STRIDE
    pixels = image.to(gl.int64) * sxn + slot % SLOT_STRIDE  # sxn even: an even slot is an even element
    pixels = gl.max_contiguous(gl.multiple_of(pixels, 2), 2)
    live = (slot < IMAGES * SLOT_STRIDE) & (image < N)
    {async_copy}(buf, x_ptr + rows[:, None] + pixels[None, :], mask=live[None, :])


"""

_TEMPLATE = '''"""Generated by fusionplan: 1x1 convolution, odd NCHW planes by parity pairs, + {chain} ({n_stages})."""
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)


{parity_copy_step}@gluon.jit
def _load_partition(
    x_ptr, w_desc, x_bufs, w_bufs, ready, copied, empty, n0, k0, N, C, sxn,
    HW: gl.constexpr, SLOT_STRIDE: gl.constexpr, IMAGES: gl.constexpr, SLOTS: gl.constexpr,
    BLOCK_K: gl.constexpr, NUM_STAGES: gl.constexpr,
):
    # a step's weights (its even channels' box, then its odd channels') by TMA on ``ready``, its
    # input by copies, each copying thread's arrival on ``copied`` once they have landed
    for i in range(C // BLOCK_K):
        stage = i % NUM_STAGES
        # the first round finds every buffer free (the phase before a new barrier's first counts as done)
        mbarrier.wait(empty.index(stage), ((i // NUM_STAGES) & 1) ^ 1)
        mbarrier.expect(ready.index(stage), 2 * w_desc.block_type.nbytes)
        {tma_load}(w_desc, [k0, i * BLOCK_K], ready.index(stage), w_bufs.index(2 * stage))
        {tma_load}(w_desc, [k0, i * BLOCK_K + BLOCK_K // 2], ready.index(stage), w_bufs.index(2 * stage + 1))
        _copy_step(x_ptr, x_bufs.index(stage), n0, i * BLOCK_K, N, C, sxn, HW, SLOT_STRIDE, IMAGES, SLOTS, BLOCK_K)
        async_copy.mbarrier_arrive(copied.index(stage), increment_count=False)


@gluon.jit
def _mma_partition(
    x_bufs, w_bufs, ready, copied, empty, steps,
    BLOCK_N: gl.constexpr, SLOTS: gl.constexpr, BLOCK_K: gl.constexpr, NUM_STAGES: gl.constexpr,
):
    # [channels, slots] = weights @ input, the even rows' and the odd rows' products apart
    HALF: gl.constexpr = BLOCK_K // 2
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[gl.num_warps(), 1], instr_shape=[16, SLOTS, 16]
    )
    acc_even = gl.zeros((BLOCK_N, SLOTS), gl.float32, acc_layout)
    acc_odd = gl.zeros((BLOCK_N, SLOTS), gl.float32, acc_layout)
    for i in range(steps):
        stage = i % NUM_STAGES
        mbarrier.wait(ready.index(stage), (i // NUM_STAGES) & 1)
        mbarrier.wait(copied.index(stage), (i // NUM_STAGES) & 1)
        fence_async_shared()  # the copies' writes (generic proxy) before wgmma's reads
        x = x_bufs.index(stage)
        acc_even = warpgroup_mma(w_bufs.index(2 * stage), x.slice(0, HALF), acc_even, is_async=True)
        acc_odd = warpgroup_mma(w_bufs.index(2 * stage + 1), x.slice(HALF, HALF), acc_odd, is_async=True)
        # this step's products in flight, the step before's done: free its stage
        acc_even, acc_odd = warpgroup_mma_wait(num_outstanding=2, deps=[acc_even, acc_odd])
        mbarrier.arrive(empty.index((i + NUM_STAGES - 1) % NUM_STAGES), pred=i > 0)
    acc_even, acc_odd = warpgroup_mma_wait(num_outstanding=0, deps=[acc_even, acc_odd])
    mbarrier.arrive(empty.index((steps - 1) % NUM_STAGES))  # the last stage
    return acc_even, acc_odd


@gluon.jit
def gluon_odd_planes_kernel(
    x_ptr, w_desc, y_ptr, prior_ptr,
    {stage_params}
    N, C, K, OH, OW,
    sxn, syn, syc, syh, syw, spn, spc, sph, spw,
    HW: gl.constexpr, SLOT_STRIDE: gl.constexpr, IMAGES: gl.constexpr, SLOTS: gl.constexpr,
    BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr, NUM_STAGES: gl.constexpr, COPY_WARPS: gl.constexpr,
    COPY_REGS: gl.constexpr, IDX64: gl.constexpr, HAS_PRIOR: gl.constexpr, OUT_PIXEL_MAJOR: gl.constexpr,
    {stage_flags}
):
    # w_desc: the packed weights [K, C], boxes of [BLOCK_N, BLOCK_K / 2]. Channel tiles first, so
    # that programs running side by side copy the same images.
    pid = gl.program_id(0)
    n_tiles = gl.cdiv(K, BLOCK_N)
    k0 = (pid % n_tiles) * BLOCK_N
    n0 = (pid // n_tiles) * IMAGES
    COPIED_ARRIVALS: gl.constexpr = COPY_WARPS * 32  # every copying thread's, as its copies land

    planes: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
    x_bufs = gl.allocate_shared_memory(x_ptr.dtype.element_ty, [NUM_STAGES, BLOCK_K, SLOTS], planes)
    w_bufs = gl.allocate_shared_memory(w_desc.dtype, [2 * NUM_STAGES, BLOCK_N, BLOCK_K // 2], w_desc.layout)
{copy_ring}{grid_dependency}
    acc_even, acc_odd = gl.warp_specialize(
        [
            (_mma_partition, (x_bufs, w_bufs, ready, copied, empty, C // BLOCK_K, BLOCK_N, SLOTS, BLOCK_K, NUM_STAGES)),
            (_load_partition, (x_ptr, w_desc, x_bufs, w_bufs, ready, copied, empty, n0, k0, N, C, sxn, HW,
                               SLOT_STRIDE, IMAGES, SLOTS, BLOCK_K, NUM_STAGES)),
        ],
        [COPY_WARPS],
        [COPY_REGS],
    )
{copy_ring_invalidation}
{out_layout}    # pixel j of image i: the even rows' slot SLOT_STRIDE * i + j plus the odd rows' next slot
    sums: gl.constexpr = gl.BlockedLayout([1, 4], [4, 8], [gl.num_warps(), 1], [1, 0])
    after = gl.minimum(gl.arange(0, SLOTS, layout=gl.SliceLayout(0, sums)) + 1, SLOTS - 1)
    index = gl.zeros((BLOCK_N, SLOTS), gl.int32, sums) + after[None, :]
    odd_after = gl.gather(gl.convert_layout(acc_odd, sums), index, 1)
    acc = gl.permute(gl.convert_layout(acc_even, sums) + odd_after, (1, 0))  # [slots, channels] for the chain
{coordinates_in_acc}
{tail}'''

#: The tile's slots and channels in ``{layout}``: each slot's image and pixel (masked past the
#: image's pixels, the program's images and the batch), row and column.
_COORDINATES = """offs_m = gl.arange(0, SLOTS, layout=gl.SliceLayout(1, {layout}))
offs_n = k0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, {layout}))
n_img = n0 + offs_m // SLOT_STRIDE
pix = offs_m % SLOT_STRIDE
m_mask = (pix < ohw) & (offs_m < IMAGES * SLOT_STRIDE) & (n_img < N)
n_mask = offs_n < K
if IDX64:  # offsets of outputs past 2^31 elements
    n_img = n_img.to(gl.int64)
    offs_n = offs_n.to(gl.int64)
oh = pix // OW
ow = pix % OW
ch = offs_n"""


def render_gluon_odd_planes_source(spec: PlanSpec, stages: list[Stage]) -> str:
    """The kernel's source: _TEMPLATE with the epilogue of ``stages`` in Gluon's names."""
    epilogue = gluon_epilogue(spec, stages, _COORDINATES, _STORE, 4)
    names = gluon_names()
    return _TEMPLATE.format(
        out_layout=OUT_LAYOUT,
        copy_ring=COPY_RING,
        copy_ring_invalidation=COPY_RING_INVALIDATION,
        parity_copy_step=PARITY_COPY_STEP.format(**names),
        **epilogue,
        **names,
    )


def slot_stride(hw: int) -> int:
    """Slots an image takes: its pixels and one (an odd row's copies start a pixel early)."""
    return hw + 1


def images_per_program(hw: int) -> int:
    """Images whose slots fit a program's SLOTS (two 7x7 images: 100 of 128)."""
    return SLOTS // slot_stride(hw)


def pack_parity(weight: Tensor) -> Tensor:
    """The 1x1 filter [K, C, 1, 1] as [K, C], each BLOCK_K-channel block's even channels, then its
    odd ones (the operand's rows), in the filter's dtype."""
    k, c = weight.shape[:2]
    blocks = weight.reshape(k, c // BLOCK_K, BLOCK_K // 2, 2)  # [K, block, pair, parity]
    return blocks.permute(0, 1, 3, 2).reshape(k, c).contiguous()


def odd_planes_why_not(spec: PlanSpec) -> str | None:
    """Why the kernel cannot run the plan's convolution, or None: 16-bit data, an ungrouped 1x1
    filter of stride 1 without padding, packed NCHW input whose planes hold an odd number of
    pixels (at most SLOTS // 2 - 1: two images a program), input channels a multiple of BLOCK_K,
    output channels a multiple of 64."""
    _, conv, _ = split_at_conv(spec.ops)
    assert conv is not None
    k, c, r, s = conv.w_desc.dims
    why = paired_copies_why_not(spec, conv.groups, "pixels")
    if why:
        return why
    if (r, s) != (1, 1):
        return f"a {r}x{s} filter: 1x1 filters only"
    if conv.conv.strides != (1, 1) or conv.conv.pads != (0, 0):
        return f"stride {conv.conv.strides} and padding {conv.conv.pads}: stride 1 without padding only"
    h, w = spec.input_desc.dims[2:]
    why = packed_nchw_why_not(spec)
    if why:
        return why
    if h * w % 2 == 0 or h * w == 1:
        return f"planes of {h * w} pixels: gluon-gemm reads them (4-byte copies, or channels-last pixels)"
    if images_per_program(h * w) < 1 or h * w > SLOTS // 2 - 1:
        return f"planes of {h * w} pixels: at most {SLOTS // 2 - 1} (two images in {SLOTS} slots)"
    if c % BLOCK_K or k % 64:
        return f"{c} input and {k} output channels: multiples of {BLOCK_K} and 64"
    return None


def paired_copies_why_not(spec: PlanSpec, groups: int, units: str) -> str | None:
    """Why the copying kernels cannot pair the plan's data, or None: 16-bit data (two ``units`` a
    4-byte copy), an ungrouped convolution."""
    if spec.dtype not in (DataType.HALF, DataType.BFLOAT16):
        return f"{spec.dtype.name} data: the copies pair 16-bit {units} (fp16, bf16)"
    if groups != 1:
        return f"grouped convolutions (groups={groups}) are not paired"
    return None


def packed_nchw_why_not(spec: PlanSpec) -> str | None:
    """None for packed NCHW input (the copying kernels compute its offsets from its shape), else why
    not."""
    x = spec.input_desc
    _, c, h, w = x.dims
    if tuple(x.strides) != (c * h * w, h * w, w, 1):
        return f"input strides {tuple(x.strides)}: packed NCHW planes only"
    return None


def off_until_measured(switch: str) -> str | None:
    """None where ``tuning.<switch>`` is on, else why the copying kernel defers: it is off until
    measured faster than the gather kernels on a GPU."""
    if not getattr(tuning, switch):
        return f"off (tuning.{switch}) until measured faster than the gather kernels"
    return None


def odd_planes_config(images: int, hw: int, k: int, multiprocessors: int) -> tuning.ConvConfig:
    """128 output channels (two computing warpgroups) where that grid fills half the
    multiprocessors, else 64 (one): r50_21's 512 channels over 16 image pairs, 64 programs of 128
    or 128 of 64 (tuning.GLUON_ODD_PLANES_BLOCK_N sets it); a ring of tuning.GLUON_ODD_PLANES_STAGES
    stages. ``images`` of ``hw``-pixel planes."""
    block_n = tuning.GLUON_ODD_PLANES_BLOCK_N
    if not block_n:
        programs = triton_cdiv(images, images_per_program(hw)) * (k // 128)
        wide = k % 128 == 0 and programs >= multiprocessors // 2
        block_n = 128 if wide else 64
    return tuning.ConvConfig(SLOTS, block_n, BLOCK_K, 8, block_n // 16, tuning.GLUON_ODD_PLANES_STAGES, 1)


class GluonOddPlanesKernel(TritonConvKernel):
    solver_name = "gluon-odd-planes"
    stem = "gluon_odd_planes"
    splits_reduction = False

    def __init__(self, spec: PlanSpec, handle) -> None:
        self._handle = handle
        super().__init__(spec, handle)

    @staticmethod
    def render(spec: PlanSpec, stages: list[Stage]) -> str:
        return render_gluon_odd_planes_source(spec, stages)

    @property
    def plane(self) -> int:
        """The input plane's pixels (H*W, odd)."""
        return self.geometry[3] * self.geometry[4]

    def heuristic(self, m: int, k_per_group: int, c_per_group: int, dtype: torch.dtype) -> tuning.ConvConfig:
        images = self.spec.input_desc.dims[0]
        return odd_planes_config(images, self.plane, k_per_group, multiprocessors(self._handle))

    @property
    def candidates(self) -> list[tuning.ConvConfig]:  # type: ignore[override]
        """NORMAL find's configurations: both tile widths."""
        stages = tuning.GLUON_ODD_PLANES_STAGES
        return [tuning.ConvConfig(SLOTS, n, BLOCK_K, 8, n // 16, stages, 1) for n in (64, 128) if self.k % n == 0]

    #: Registers of the copying warps (COPY_REGS; a subclass's own)
    copy_regs = COPY_REGS

    def pack(self, weight: Tensor) -> Tensor:
        return pack_parity(weight)

    def weight_columns(self) -> int:
        """Columns of the packed weights (the input channels; a subclass's taps' too)."""
        return self.geometry[1]

    def ring_constants(self) -> tuple[int, ...]:
        """The template's constants after NUM_STAGES (a subclass's own; none here)."""
        return ()

    def programs_and_steps(self, cfg: tuning.ConvConfig) -> tuple[int, int]:
        images = self.spec.input_desc.dims[0]
        per_program = images_per_program(self.plane)
        return triton_cdiv(images, per_program) * triton_cdiv(self.k, cfg.block_n), self.geometry[1] // BLOCK_K

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
        c, k = self.geometry[1:3]
        columns = self.weight_columns()
        w_desc = gluon_descriptor(packed, [k, columns], [columns, 1], [cfg.block_n, BLOCK_K // 2], BLOCK_K, 16)
        strides = strides or (*x.stride(), *out.stride(), *p.stride())
        consts = (
            self.plane,
            slot_stride(self.plane),
            images_per_program(self.plane),
            SLOTS,
            cfg.block_n,
            BLOCK_K,
            cfg.num_stages,
            *self.ring_constants(),
            COPY_WARPS,
            self.copy_regs,
            needs_int64(x, out, p) if idx64 is None else idx64,
            has_prior,
            strides[5] != 1,  # output channels apart: lanes along the pixels
            *flags.values(),
        )
        grid = (self.programs_and_steps(cfg)[0], 1, 1)
        n = self.spec.input_desc.dims[0]
        args = [x, w_desc, out, p, *values, n, c, k, *self.out_hw, strides[0], *strides[4:], *consts]
        return grid, cfg, args


class GluonOddPlanesSolver(Solver):
    name = "gluon-odd-planes"
    family = "triton"

    def why_not(self, spec: PlanSpec, handle) -> str | None:
        return conv_plan_why_not(spec) or odd_planes_why_not(spec) or gluon_why_not() or hopper_why_not(handle)

    def defer_why(self, spec: PlanSpec, handle) -> str | None:
        return off_until_measured("GLUON_ODD_PLANES")

    def build(self, spec: PlanSpec, handle) -> Kernel:
        return GluonOddPlanesKernel(spec, handle)
