"""The convolution solvers' toolkit: the checks every Triton convolution kernel shares (the plan,
the device and dtype, tensor-descriptor input), and the small helpers of their launches. No solver
module imports another for these."""

from __future__ import annotations

import torch

from fusionplan.core.descriptors import Layout, layout_strides
from fusionplan.core.enums import BatchNormMode, DataType
from fusionplan.core.ops import Phase
from fusionplan.runtime.codegen import interpreter_active, triton_available
from fusionplan.runtime.folding import AffineStage, pointwise_stages, split_at_conv
from fusionplan.solvers.base import PlanSpec

Tensor = torch.Tensor

#: The data types the Triton kernels compute.
TRITON_DTYPES = (DataType.FLOAT, DataType.HALF, DataType.BFLOAT16)


def device_why_not(handle, dtype: DataType) -> str | None:
    """Shared by the Triton solvers: can Triton run here, for this dtype?"""
    why = triton_available()
    if why:
        return why
    if handle.device.type != "cuda" and not interpreter_active():
        return f"needs a CUDA device (or TRITON_INTERPRET=1 for Triton's interpreter); the handle is on {handle.device}"
    if dtype not in TRITON_DTYPES:
        return f"{dtype.name} data is not supported by the Triton kernels (fp32, fp16, bf16 are)"
    if dtype == DataType.BFLOAT16 and handle.device.type != "cuda":
        return "bf16 dot products are not exact in Triton's interpreter; bf16 runs on CUDA devices only"
    return None


def shares_memory(a: Tensor, b: Tensor) -> bool:
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


def grid_dependency_capable(handle) -> bool:
    """Whether the handle's device runs programmatic dependent launch (Hopper or later, compiled
    kernels: not Triton's interpreter)."""
    capability = handle.compute_capability()
    return capability is not None and capability >= (9, 0) and not interpreter_active()


def triton_cdiv(a: int, b: int) -> int:
    return -(-a // b)


def persistent_programs(handle) -> int:
    """The programs of a persistent kernel's grid: one per multiprocessor of the handle's GPU (two
    in the interpreter, so that the loop over tiles runs there too)."""
    if handle.device.type == "cuda":
        return torch.cuda.get_device_properties(handle.device).multi_processor_count
    return 2


def descriptor_input_why_not(spec: PlanSpec, reading: str) -> str | None:
    """Why tensor descriptors cannot read the plan's input and repacked weights, or None: the input
    must be packed channels-last, and rows of C input and K output channels whole 16-byte units.
    ``reading`` says how the input would be read, for the message."""
    x = spec.input_desc
    if not x.same_strides(layout_strides(x.dims, Layout.NHWC)):
        return f"the input must be packed channels-last (NHWC) to be {reading}; it is {x.layout_name}"
    ch, k = x.dims[1], spec.output_desc.dims[1]
    size = x.dtype.torch_dtype.itemsize
    if ch * size % 16 or k * size % 16:
        return f"tensor descriptors need 16-byte rows: C={ch} and K={k} elements of {size} bytes"
    return None


#: The Triton solvers of the plans that are not inference plans.
_WHO_RUNS = {
    Phase.TRAINING_FORWARD: "triton-batchnorm runs the training plans",
    Phase.BACKWARD: "triton-batchnorm runs the training plans",
    Phase.STATISTICS: "triton-conv runs statistics plans",
}


def conv_plan_why_not(spec: PlanSpec, prologue: bool = False, statistics: bool = False) -> str | None:
    """What in the plan keeps every Triton convolution kernel from it, or None. ``prologue``: the
    kernel applies operators before the convolution to its input tiles (triton-conv), those of
    per-channel parameters; ``statistics``: it takes a spatial batch-norm's statistics of its
    output in its epilogue (triton-conv)."""
    if spec.phase == Phase.STATISTICS and statistics:
        if spec.ops[-1].mode != BatchNormMode.SPATIAL:
            return "per-activation batch-norm statistics (the epilogue takes spatial ones; the reference runs these)"
    elif spec.phase != Phase.INFERENCE:
        return f"{spec.phase.value} plans: this solver runs inference plans ({_WHO_RUNS[spec.phase]})"
    pre, conv, _ = split_at_conv(spec.ops)
    if conv is None:
        return "the plan has no convolution (the triton-pointwise solver runs pointwise chains)"
    if pre and not prologue:
        return "operators before the convolution: triton-conv applies them as it loads the input"
    if any(isinstance(s, AffineStage) and s.per_element for s in pointwise_stages(pre)):
        return "a per-activation batch-norm before the convolution (its parameters per element, not per channel)"
    return None


#: A program's shared memory where the handle has no CUDA device (interpreter and CPU tests): sm_90's.
HOPPER_SHARED_BYTES = 227 * 1024


def shared_bytes_per_program(handle) -> int:
    """The most shared memory one program of a kernel may take on the handle's device."""
    if handle is not None and handle.device.type == "cuda" and torch.cuda.is_available():
        props = torch.cuda.get_device_properties(handle.device)
        return getattr(props, "shared_memory_per_block_optin", HOPPER_SHARED_BYTES)
    return HOPPER_SHARED_BYTES


#: A persistent GEMM's loop over its tiles (num_pid_m given): each program walks tiles NUM_PROGRAMS
#: apart, in GROUP_M order; ``{loop}``: how the loop is written and why.
PERSISTENT_TILES = """    num_pid_n = tl.cdiv(K, BLOCK_N)
    num_tiles = num_pid_m * num_pid_n
    k_steps = tl.cdiv(C, BLOCK_K)
    num_pid_in_group = GROUP_M * num_pid_n
{loop}
        # GROUP_M swizzle: neighbouring tiles share weight columns in L2
        group_id = tile // num_pid_in_group
        first_pid_m = group_id * GROUP_M
        group_size_m = tl.minimum(num_pid_m - first_pid_m, GROUP_M)
        pid_m = first_pid_m + ((tile % num_pid_in_group) % group_size_m)
        pid_n = (tile % num_pid_in_group) // group_size_m"""


def gemm_input_why_not(spec: PlanSpec, reading: str) -> str | None:
    """Why the GEMM kernels cannot read the input of the plan's 1x1 convolution through tensor
    descriptors (``reading``: how, for the message), or None: ungrouped, packed channels-last with
    16-byte rows, fewer than 2^31 pixels."""
    _, conv, _ = split_at_conv(spec.ops)
    assert conv is not None
    if conv.conv.groups != 1:
        return "grouped convolutions are not one GEMM"
    why = descriptor_input_why_not(spec, reading)
    if why:
        return why
    n, _, h, w = spec.input_desc.dims
    if n * h * w >= 2**31:
        return "more than 2^31 - 1 pixels do not fit a tensor descriptor's dimension"
    return None


def pack_rows_rsc(weight: Tensor) -> Tensor:
    """[K, C, R, S] -> [K, R*S*C]: each output channel's row in the input box's (r, s, c) order,
    the reduction contiguous (the A operand, K-major as wgmma needs it for every dtype)."""
    return weight.permute(0, 2, 3, 1).reshape(weight.shape[0], -1).contiguous()
