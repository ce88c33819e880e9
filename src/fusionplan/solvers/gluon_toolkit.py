"""What the Gluon solvers share: the names a template renders with (Triton 3.6 and newer), the
checks for Hopper and its dtypes, tensor descriptors and layouts, the epilogue in Gluon's terms,
and the register budgets of warp-specialized kernels."""

from __future__ import annotations

import re

import torch

from fusionplan.core.descriptors import Layout, layout_strides
from fusionplan.core.enums import DataType
from fusionplan.runtime import tuning
from fusionplan.runtime.codegen import indent, triton_available
from fusionplan.runtime.epilogue import Epilogue, emit_stages
from fusionplan.runtime.folding import Stage, split_at_conv
from fusionplan.solvers.base import PlanSpec
from fusionplan.solvers.conv_kernel import GRID_DEPENDENCY, epilogue_tail, header_fields
from fusionplan.solvers.conv_toolkit import triton_cdiv

Tensor = torch.Tensor


#: Registers of each computing warpgroup where two take tiles in turn (ConvConfig.consumers = 2):
#: with the loading warp's LOAD_REGS, two warpgroups of this many fill the multiprocessor's 64K.
CONSUMER_REGS = 232


def channel_planes(spec: PlanSpec) -> bool:
    """Whether the plan's input is packed NCHW (and not also packed channels-last, as with one
    channel or 1x1 images): gluon-gemm would read it as channel planes."""
    x = spec.input_desc
    nchw = x.same_strides(layout_strides(x.dims, Layout.NCHW))
    return nchw and not x.same_strides(layout_strides(x.dims, Layout.NHWC))


def multiprocessors(handle) -> int:
    """The handle's device's multiprocessors (the H100's where it has none: CPU compiles and tests)."""
    if handle.device.type == "cuda" and torch.cuda.is_available():
        return torch.cuda.get_device_properties(handle.device).multi_processor_count
    return tuning.SPLIT_K_TARGET


#: Registers of the loading warp: it computes coordinates only; the computing warpgroups get the rest.
LOAD_REGS = 40


def gluon_names() -> dict[str, str]:
    """Names that differ between Triton versions, for the generated source: the TMA load and store
    (3.6: ``async_copy_global_to_shared``, ``async_copy_shared_to_global``; later: ``async_load``,
    ``async_store``), the pointer-based asynchronous copy (3.6: ``async_copy_global_to_shared``;
    later: ``async_load``), the shared-memory view change (3.6: ``_reinterpret``; later:
    ``reinterpret``) and the barrier of a partition's warps (3.6: ``gl.thread_barrier``; later:
    ``gl.barrier``); and conv_kernel's GRID_DEPENDENCY in Gluon's names, which every Gluon
    template holds (after its barriers are set up)."""
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language import _core
    from triton.experimental.gluon.language.nvidia.ampere import async_copy
    from triton.experimental.gluon.language.nvidia.hopper import tma

    return {
        "tma_load": "tma.async_load" if hasattr(tma, "async_load") else "tma.async_copy_global_to_shared",
        "tma_store": "tma.async_store" if hasattr(tma, "async_store") else "tma.async_copy_shared_to_global",
        "async_copy": (
            "async_copy.async_load" if hasattr(async_copy, "async_load") else "async_copy.async_copy_global_to_shared"
        ),
        "reinterpret": "reinterpret" if hasattr(_core.shared_memory_descriptor, "reinterpret") else "_reinterpret",
        "thread_barrier": "gl.barrier" if hasattr(gl, "barrier") else "gl.thread_barrier",
        "grid_dependency": GRID_DEPENDENCY.format(lang="gl"),
    }


def gl_layout(swizzle: int, bits: int, rank: int):
    """The shared-memory layout of a tensor-descriptor box of ``bits``-bit elements, rows of ``swizzle`` bytes."""
    from triton.experimental.gluon import language as gl

    return gl.NVMMASharedLayout(swizzle_byte_width=swizzle, element_bitwidth=bits, rank=rank)


def gluon_descriptor(tensor: Tensor, shape: list[int], strides: list[int], box: list[int], swizzle: int, bits: int):
    """Gluon's host descriptor of ``tensor`` seen with ``shape`` and ``strides`` (elements), read in
    ``box`` boxes laid out in shared memory as gl_layout gives."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    return TensorDescriptor(tensor, shape, strides, box, gl_layout(swizzle, bits, len(shape)))


def gluon_why_not() -> str | None:
    """None when this Triton has Gluon's Hopper dialect, else why not."""
    why = triton_available()
    if why:
        return why
    try:
        from triton.experimental.gluon.language.nvidia.hopper import tma, warpgroup_mma  # noqa: F401

        gluon_names()
    except Exception as exc:  # an older Triton, or a dialect that moved
        return f"this Triton has no Gluon Hopper dialect ({type(exc).__name__}: {exc})"
    return None


def hopper_why_not(handle) -> str | None:
    """Why the handle's device cannot run a Gluon wgmma kernel, or None (compute capability 9.x)."""
    if handle.device.type != "cuda":
        return f"needs a Hopper GPU (Gluon has no interpreter); the handle is on {handle.device}"
    capability = handle.compute_capability()
    if capability is None:
        return "needs a Hopper GPU; this torch sees no CUDA device"
    major, minor = capability
    if major != 9:
        return f"needs a Hopper GPU (compute capability 9.x, for wgmma); the device is {major}.{minor}"
    return None


def gluon_dtype_why_not(spec: PlanSpec, tf32: bool, exact: str) -> str | None:
    """Why the Gluon kernels cannot compute the plan's data type, or None (``tf32``: whether the
    handle allows TF32 products of fp32 data; ``exact``: the Triton solver with full-precision fp32)."""
    if spec.dtype == DataType.FLOAT and not tf32:
        return f"fp32 data without TF32: wgmma has no full-precision fp32 product ({exact} has)"
    if spec.dtype not in (DataType.HALF, DataType.BFLOAT16, DataType.FLOAT):
        return f"{spec.dtype.name} data: the kernel's products are fp16, bf16 or TF32"
    return None


def tma_store_strides_fit(strides: tuple[int, ...], ow: int, pixels: int, itemsize: int) -> bool:
    """Whether output strides (syn, syc, syh, syw) let TMA store tiles of the output seen as [N, OH,
    OW / pixels, pixels, K] (windows: ``pixels`` 1): contiguous channels, strides of whole 16-byte
    units, whole runs of ``pixels``."""
    syn, syc, syh, syw = strides
    return syc == 1 and ow % pixels == 0 and all(stride * itemsize % 16 == 0 for stride in (syn, syh, syw))


def plane_vector(strides: tuple[int, ...], out: Tensor) -> int:
    """Output pixels a thread can store together along channel planes (stores by pointer, lanes
    along a plane's pixels): 0 where the output's pixels are not contiguous or its channels are
    (channels-last: stored along the channels); 8 (16 bytes) where its image, channel and row
    strides are multiples of 8 and its 16-bit data 16-byte aligned; else 1."""
    syn, syc, syh, syw = strides
    if syw != 1 or syc == 1:
        return 0
    aligned = all(s % 8 == 0 for s in (syn, syc, syh)) and out.data_ptr() % 16 == 0
    return 8 if aligned and out.element_size() == 2 else 1


def sixteen_bit_output(spec: PlanSpec) -> bool:
    """Whether the plan's output is 16-bit data of the plan's dtype (what the TMA stores' tiles hold)."""
    return spec.dtype.torch_dtype.itemsize == 2 and spec.output_desc.dtype == spec.dtype


def gluon_epilogue(
    spec: PlanSpec, stages: list[Stage], coordinates: str, store: str, depth: int, epi: Epilogue | None = None
) -> dict:
    """A Gluon template's epilogue fields: the tile's ``coordinates`` in the accumulator's layout
    and in the stores' (each indented ``depth`` spaces), the tail (the chain of ``stages``, then
    ``store``, whose ``{coordinates_in_out}`` takes the stores' coordinates) and the header's
    fields; the generated epilogue's ``tl.`` calls all have ``gl.`` counterparts of the same meaning.
    ``epi``: the chain as emit_stages gave it (default: its per-channel parameters loaded in the tail)."""
    epi = epi or emit_stages(stages, spec.ops)
    coords = {
        f"coordinates_{where}": indent(coordinates.format(layout=layout).split("\n"), depth)
        for where, layout in COORDINATE_LAYOUTS
    }
    tail = gluon_epilogue_tail(epi, store.format(coordinates_in_out=coords["coordinates_in_out"], **gluon_names()))
    return {"tail": tail, **coords, **gluon_header_fields(spec, stages, epi)}


def in_gluon_names(text: str) -> str:
    """Triton source of the shared emitters (``tl.`` calls) in Gluon's names (``gl.``)."""
    return re.sub(r"\btl\.", "gl.", text)


def gluon_epilogue_tail(epi, store: str) -> str:
    """conv_kernel's epilogue_tail of ``epi`` and ``store`` in Gluon's names."""
    return in_gluon_names(epilogue_tail(epi, store))


def gluon_channel_loads(epi) -> str:
    """The chain's per-channel loads before the tiles (emit_stages' hoist_channels) in Gluon's
    names, at a partition's depth; ``pass`` where there are none."""
    return in_gluon_names(indent(epi.channel_loads, 4)) if epi.channel_loads else "    pass"


def gluon_header_fields(spec: PlanSpec, stages: list[Stage], epi) -> dict:
    """header_fields in Gluon's names, and the stages' parameters and flags as arguments to pass on
    to a warp-specialized kernel's partitions (``stage_args``, ``flag_args``)."""
    fields = header_fields(spec, stages, epi)
    fields["stage_flags"] = fields["stage_flags"].replace("tl.constexpr", "gl.constexpr")
    fields["stage_args"] = "".join(p + ", " for p in epi.params)
    fields["flag_args"] = "".join(f + ", " for f in epi.constexprs)
    return fields


#: Where the epilogue's pixels and channels are laid out: the accumulator's layout, the stores'.
COORDINATE_LAYOUTS = (("in_acc", "acc.type.layout"), ("in_out", "out_layout"))


def epilogue_mode(size: int) -> int:
    """A Gluon kernel's MMA_EPILOGUE for data of ``size`` bytes, the chain always in the
    accumulator's layout: 1, the output's layout changed for the stores (16-bit data); 2, fp32
    output stored from the accumulator's layout (measured faster: docs/decisions/tuning.md,
    GLUON_GEMM_MMA_EPILOGUE and GLUON_GEMM_FP32_ACC_STORES)."""
    return 2 if size == 4 else 1


#: Before the epilogue (both gluon-nchw kernels): the stores' layout and the output plane's size.
OUT_LAYOUT = """    # the stores' layout, [pixels, channels]: NCHW output, lanes along a plane's pixels; else 8
    # contiguous channels per thread (16-byte stores)
    if OUT_PIXEL_MAJOR:
        out_layout: gl.constexpr = gl.BlockedLayout([1, 1], [32, 1], [1, gl.num_warps()], [0, 1])
    else:
        out_layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [gl.num_warps(), 1], [1, 0])
    ohw = OH * OW
"""


#: The store: the output, in its own dtype, changes layout first (lanes along the pixels for
#: NCHW output, 16-byte pieces of a pixel's channels otherwise).
GATHER_STORE = """    h = gl.convert_layout(h.to(y_ptr.dtype.element_ty), out_layout)
{coordinates_in_out}
    mask = m_mask[:, None] & n_mask[None, :]
    gl.store(y_ptr + (n_img * syn + oh * syh + ow * syw)[:, None] + ch[None, :] * syc, h, mask=mask)
"""


def gather_why_not(spec: PlanSpec) -> str | None:
    """Why the kernel cannot read the plan's convolution, or None: ungrouped, with each output
    channel's packed weights (R*S*C elements) whole 16-byte units (a tensor descriptor's rows),
    and, with more than one tap, each tap's C channels too: a tap's box starts at column t*C, and a
    tensor copy's innermost coordinate must fall on a 16-byte unit (else an illegal instruction)."""
    _, conv, _ = split_at_conv(spec.ops)
    assert conv is not None
    if conv.groups != 1:
        return f"grouped convolutions (groups={conv.groups}) are not gathered"
    k, c, r, s = conv.w_desc.dims
    size = spec.dtype.torch_dtype.itemsize
    if r * s * c * size % 16:
        return f"the packed weights' rows (R*S*C = {r * s * c} elements of {size} bytes) must be whole 16-byte units"
    if r * s > 1 and c * size % 16:
        return f"a tap's {c} channels of {size} bytes are not whole 16-byte units (where its weights' box starts)"
    return None


#: Output channels of a program: one warpgroup's wgmma rows.
BLOCK_N = 64


#: The program's run of output rows (row_run_grid's programs), in a Gluon template's kernel body
#: after its barriers: its share of the N * OH rows, image by image.
ROW_RUN = """    # the program's run of output rows: its share of the N * OH rows, in order
    # (in 64 bits: the product of a program's index and the rows may pass 2^31)
    units = N * OH
    start = ((gl.program_id(0).to(gl.int64) * units) // gl.num_programs(0)).to(gl.int32)
    end = (((gl.program_id(0) + 1).to(gl.int64) * units) // gl.num_programs(0)).to(gl.int32)"""


#: An output row's channels, their masks and its pixels' index in their image, in ``{layout}``
#: (after ``ow``, the pixels' columns; n_img and oh: the row's image and row).
ROW_CHANNELS = """offs_n = k0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, {layout}))
m_mask = ow < OW
n_mask = offs_n < K
ch = offs_n
if IDX64:
    ch = ch.to(gl.int64)
pix = oh * OW + ow"""


#: An output row's end, its products done: the chain in the accumulator's own layout, then the
#: store (only the output changes layout).
ROW_END = """n_img = u // OH
oh = u % OH
if IDX64:  # offsets of outputs past 2^31 elements
    n_img = n_img.to(gl.int64)
ohw = OH * OW"""


#: The store, after the output's layout change (the chain ran in the accumulator's layout).
ROW_STORE = """    h = gl.convert_layout(h.to(y_ptr.dtype.element_ty), out_layout)
{coordinates_in_out}
    mask = m_mask[:, None] & n_mask[None, :]
    gl.store(y_ptr + (n_img * syn + oh * syh + ow * syw)[:, None] + ch[None, :] * syc, h, mask=mask)
"""


def row_run_grid(handle, rows: int, k: int) -> tuple[int, int, int]:
    """The grid of a kernel whose programs take runs of ``rows`` output rows: the multiprocessors
    shared among the blocks of BLOCK_N output channels, at most one program per output row."""
    blocks = triton_cdiv(k, BLOCK_N)
    return min(rows, max(1, multiprocessors(handle) // blocks)), blocks, 1


def box_swizzle_and_bits(spec: PlanSpec, cfg: tuning.ConvConfig) -> tuple[int, int]:
    """The swizzle of a reduction step's box rows (128 bytes, or the row if shorter) and the
    plan's element bits."""
    bits = spec.dtype.torch_dtype.itemsize * 8
    return min(128, cfg.block_k * bits // 8), bits
