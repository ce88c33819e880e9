"""Operators of a fusion plan and their runtime arguments, side by side.

An operator is created by the plan (``FusionPlan.add_*``), which hands it the geometry of its
input (the plan's input, or the output of the operator before). It validates its own
descriptors at creation and its runtime arguments when they are set. Operators are
immutable once made; everything a kernel specializes on is in ``signature()``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, fields
from typing import Any, ClassVar

import torch

from fusionplan.core.activations import ACTIVATIONS
from fusionplan.core.descriptors import (
    ConvolutionDescriptor,
    TensorDescriptor,
    batchnorm_param_dims,
    finite_float,
)
from fusionplan.core.enums import ActivationMode, BatchNormMode, ConvMode, DataType
from fusionplan.core.errors import BadParmError, UnsupportedOpError, coerce_enum

HALF_TYPES = (DataType.HALF, DataType.BFLOAT16)


class Phase(enum.Enum):
    """Which kind of plan an operator belongs to; a plan holds operators of one phase."""

    INFERENCE = "inference"
    TRAINING_FORWARD = "training forward"
    BACKWARD = "backward"
    #: an inference chain (or nothing) ending in batch-norm statistics: the chain's output, and the
    #: statistics of it that a training batch-norm after the plan would compute
    STATISTICS = "statistics"


def as_tensor(value: Any, name: str, writable: bool = False) -> torch.Tensor:
    """A torch view of ``value`` (a torch tensor or any DLPack-capable array). ``writable``: the
    caller writes into it, so a read-only array (numpy's ``writeable=False``, a read-only memmap,
    a DLPack export flagged read-only) is a BadParmError rather than memory written behind its
    owner's back (or a crash, for a read-only mapping)."""
    if isinstance(value, torch.Tensor):
        return value
    if hasattr(value, "__dlpack__"):
        if writable and is_read_only(value):
            raise BadParmError(f"{name}: the array is read-only; fusionplan writes its result into it")
        try:
            tensor = torch.from_dlpack(value)
        except Exception as exc:  # the producer's own error type varies
            raise BadParmError(f"{name}: cannot import through DLPack: {exc}") from exc
        return mark_external(tensor)
    raise BadParmError(f"{name}: expected a tensor (torch or DLPack-capable), got {type(value).__name__}")


_DLPACK_FLAG_READ_ONLY = 1  # DLPack 1.0's DLPACK_FLAG_BITMASK_READ_ONLY
_EXTERNAL = "_fusionplan_external"


def is_read_only(value: Any) -> bool:
    """Whether a DLPack-capable array says it must not be written: numpy's flags, else the flags of
    a DLPack 1.0 export (inspected, not consumed)."""
    flags = getattr(value, "flags", None)
    if flags is not None and getattr(flags, "writeable", True) is False:
        return True
    try:
        capsule = value.__dlpack__(max_version=(1, 0))
    except Exception:  # a producer of DLPack before 1.0 has no read-only flag to show
        return False
    return bool(_versioned_capsule_flags(capsule) & _DLPACK_FLAG_READ_ONLY)


def _versioned_capsule_flags(capsule: Any) -> int:
    """The flags of a "dltensor_versioned" capsule (0 for a capsule of an older DLPack)."""
    import ctypes

    get_name = ctypes.pythonapi.PyCapsule_GetName
    get_name.restype, get_name.argtypes = ctypes.c_char_p, [ctypes.py_object]
    name = get_name(capsule)
    if name != b"dltensor_versioned":
        return 0
    get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
    get_pointer.restype, get_pointer.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    managed = get_pointer(capsule, name)
    # DLManagedTensorVersioned: {uint32 major, uint32 minor}, void* manager_ctx, void (*deleter)(...), uint64 flags
    offset = 8 + 2 * ctypes.sizeof(ctypes.c_void_p)
    return ctypes.c_uint64.from_address(managed + offset).value


def mark_external(tensor: torch.Tensor) -> torch.Tensor:
    """Mark a tensor imported through DLPack: its owner edits its memory without moving torch's
    version counter, so data derived from it is never cached (see ``is_volatile``)."""
    setattr(tensor, _EXTERNAL, True)
    return tensor


def is_volatile(tensor: torch.Tensor) -> bool:
    """True for tensors whose edits torch's version counter does not see: DLPack imports, and
    inference tensors (which have no version counter)."""
    return tensor.is_inference() or getattr(tensor, _EXTERNAL, False)


def _squeezed(dims: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(d for d in dims if d != 1)


def check_param_descriptor(desc: TensorDescriptor, expected: tuple[int, ...], data: DataType, what: str) -> None:
    """A per-channel (or per-activation) parameter descriptor: shape ``expected`` up to unit dims."""
    if not isinstance(desc, TensorDescriptor):
        raise BadParmError(f"{what} descriptor: expected a TensorDescriptor, got {type(desc).__name__}")
    if _squeezed(desc.dims) != _squeezed(expected):
        raise BadParmError(f"{what} descriptor has dims {desc.dims}; this operator needs {expected}")
    allowed = {data, DataType.FLOAT} if data in HALF_TYPES else {data}
    if desc.dtype not in allowed:
        names = "/".join(sorted(t.name for t in allowed))
        raise BadParmError(f"{what} descriptor has dtype {desc.dtype.name}; data is {data.name}, so {names}")


def param_tensor(
    value: Any,
    name: str,
    expected: tuple[int, ...],
    data: DataType,
    desc: TensorDescriptor | None = None,
    writable: bool = False,
) -> torch.Tensor:
    """Validate a bias / batch-norm parameter or statistics tensor; return it viewed as ``expected``.

    Accepted: the exact shape (strides free), or any contiguous tensor with as many elements.
    dtype: the data's, the descriptor's, or float32 for fp16/bf16 data. ``writable``: a side output.
    """
    t = as_tensor(value, name, writable)
    if tuple(t.shape) != expected:
        if t.numel() != _numel(expected) or not t.is_contiguous():
            raise BadParmError(
                f"{name} has shape {tuple(t.shape)}; expected {expected} or a contiguous tensor of "
                f"{_numel(expected)} elements"
            )
        t = t.view(expected)
    allowed = {data.torch_dtype}
    if desc is not None:
        allowed.add(desc.dtype.torch_dtype)
    if data in HALF_TYPES:
        allowed.add(torch.float32)
    if t.dtype not in allowed:
        raise BadParmError(f"{name} has dtype {t.dtype}; expected one of {sorted(map(str, allowed))}")
    return t


def data_tensor(value: Any, name: str, dims: tuple[int, ...], data: DataType) -> torch.Tensor:
    """A data-shaped argument (BN-backward's x, activation-backward's y): dims and dtype, any strides."""
    t = as_tensor(value, name)
    if tuple(t.shape) != dims or t.dtype != data.torch_dtype:
        raise BadParmError(f"{name} is {t.dtype}{list(t.shape)}; expected {data.torch_dtype}{list(dims)}")
    return t


def _numel(dims: tuple[int, ...]) -> int:
    n = 1
    for d in dims:
        n *= d
    return n


_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


def field_names(cls: type) -> tuple[str, ...]:
    """A record type's field names, found once (dataclasses.fields builds them anew each call)."""
    names = _FIELD_NAMES.get(cls)
    if names is None:
        names = _FIELD_NAMES[cls] = tuple(f.name for f in fields(cls))
    return names


# --------------------------------------------------------------------------------------
# Argument records: one frozen dataclass per operator kind. alpha/beta blend the operator's
# main result with the output's prior contents: result = alpha * op(x) + beta * y_prior.
# --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class OpArgs:
    alpha: float = 1.0
    beta: float = 0.0

    def __post_init__(self) -> None:
        # Records are immutable: their tensors, and the one device they share, are found once here
        # rather than on every execute.
        # (the instance's dict holds the fields alone here, in field order: read, and written, directly
        # rather than through the frozen dataclass's attribute protocol, on every record of a call)
        d = self.__dict__
        tensors = [v for v in d.values() if isinstance(v, torch.Tensor)]
        device, volatile = (tensors[0].device if tensors else None), False
        for t in tensors:
            volatile = volatile or is_volatile(t)
            if device is not None and t.device != device:
                device = None  # the tensors are on several devices: the checks name them
        d["_tensors"] = tuple(tensors)
        d["_device"] = device
        d["volatile"] = volatile

    def layout_key(self) -> tuple:
        """What a kernel specialized to this record depends on: every field but the tensors verbatim,
        each tensor as its shape, strides and dtype (None where absent). Found once: records are
        immutable."""
        d = self.__dict__
        key = d.get("_layout_key")
        if key is None:
            key = d["_layout_key"] = tuple(
                [
                    (v.shape, v.stride(), v.dtype) if isinstance(v := d[name], torch.Tensor) else v
                    for name in field_names(type(self))
                ]
            )
        return key

    def field_values(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def tensors(self) -> tuple[torch.Tensor, ...]:
        """Every tensor the record holds (for device checks and change detection)."""
        return self._tensors  # type: ignore[attr-defined]

    def on_device(self, device: torch.device) -> bool:
        """True when every tensor of the record is on ``device``."""
        return not self._tensors or self._device == device  # type: ignore[attr-defined]


@dataclass(frozen=True)
class ConvArgs(OpArgs):
    weight: torch.Tensor | None = None


@dataclass(frozen=True)
class BiasArgs(OpArgs):
    bias: torch.Tensor | None = None


@dataclass(frozen=True)
class BatchNormInferenceArgs(OpArgs):
    scale: torch.Tensor | None = None
    bias: torch.Tensor | None = None
    mean: torch.Tensor | None = None
    variance: torch.Tensor | None = None
    epsilon: float = 1e-5


@dataclass(frozen=True)
class ActivationArgs(OpArgs):
    activ_alpha: float = 1.0
    activ_beta: float = 0.0
    activ_gamma: float = 1.0
    #: PReLU's per-channel slope (C values, or one for every channel); the other modes take none
    slope: torch.Tensor | None = None

    def alpha_argument(self) -> float | torch.Tensor:
        """What the activation's formula takes as its alpha: PReLU's slope, else activAlpha."""
        return self.activ_alpha if self.slope is None else self.slope


@dataclass(frozen=True)
class BatchNormForwardArgs(OpArgs):
    scale: torch.Tensor | None = None
    bias: torch.Tensor | None = None
    saved_mean: torch.Tensor | None = None
    saved_inv_variance: torch.Tensor | None = None
    running_mean: torch.Tensor | None = None
    running_variance: torch.Tensor | None = None
    exp_avg_factor: float = 0.1
    epsilon: float = 1e-5


@dataclass(frozen=True)
class BatchNormStatisticsArgs(OpArgs):
    """The side outputs of batch-norm statistics, as BatchNormForwardArgs' (no scale or bias: the
    data passes through unnormalized)."""

    saved_mean: torch.Tensor | None = None
    saved_inv_variance: torch.Tensor | None = None
    running_mean: torch.Tensor | None = None
    running_variance: torch.Tensor | None = None
    exp_avg_factor: float = 0.1
    epsilon: float = 1e-5


@dataclass(frozen=True)
class BatchNormBackwardArgs(OpArgs):
    x: torch.Tensor | None = None
    scale: torch.Tensor | None = None
    bias: torch.Tensor | None = None
    result_scale_diff: torch.Tensor | None = None
    result_bias_diff: torch.Tensor | None = None
    saved_mean: torch.Tensor | None = None
    saved_inv_variance: torch.Tensor | None = None


@dataclass(frozen=True)
class ActivationBackwardArgs(OpArgs):
    y: torch.Tensor | None = None
    activ_alpha: float = 1.0
    activ_beta: float = 0.0
    activ_gamma: float = 1.0


def _blend(args: OpArgs) -> dict[str, float]:
    return {"alpha": finite_float(args.alpha, "alpha"), "beta": finite_float(args.beta, "beta")}


# --------------------------------------------------------------------------------------
# Operators
# --------------------------------------------------------------------------------------
class FusionOp:
    """One operator of a plan: its place, the geometry flowing in and out, its parameters."""

    phase: ClassVar[Phase] = Phase.INFERENCE
    letter: ClassVar[str] = "?"  # C, B, N, A as in MIOpen's names for combinations (CBNA)
    title: ClassVar[str] = "operator"
    args_type: ClassVar[type[OpArgs]] = OpArgs

    def __init__(self, index: int, input_desc: TensorDescriptor) -> None:
        self.index = index
        self.input_desc = input_desc

    @property
    def output_desc(self) -> TensorDescriptor:
        return self.input_desc

    @property
    def channels(self) -> int:
        return self.input_desc.dims[1]

    def signature(self) -> tuple:
        """Everything about the operator that a compiled kernel depends on."""
        return (type(self).__name__,)

    def check_args(self, args: OpArgs) -> OpArgs:
        """Validate a record for this operator; return it with tensors normalized."""
        if not isinstance(args, self.args_type):
            raise BadParmError(
                f"operator {self.index} ({self.title}) takes {self.args_type.__name__}, got {type(args).__name__}"
            )
        return self._check(args)

    def _check(self, args: OpArgs) -> OpArgs:
        return type(args)(**{**args.field_values(), **_blend(args)})

    def describe(self) -> str:
        return self.title

    def __repr__(self) -> str:
        return f"<op {self.index}: {self.describe()}: {self.input_desc} -> {self.output_desc}>"


class ConvForwardOp(FusionOp):
    letter = "C"
    title = "convolution forward"
    args_type = ConvArgs

    def __init__(self, index: int, input_desc: TensorDescriptor, conv: ConvolutionDescriptor, w_desc: TensorDescriptor):
        super().__init__(index, input_desc)
        if not isinstance(conv, ConvolutionDescriptor):
            raise BadParmError(f"convolution descriptor: expected ConvolutionDescriptor, got {type(conv).__name__}")
        if not isinstance(w_desc, TensorDescriptor):
            raise BadParmError(f"filter descriptor: expected TensorDescriptor, got {type(w_desc).__name__}")
        if conv.mode == ConvMode.TRANSPOSE:
            raise UnsupportedOpError("transposed convolution cannot be part of a fusion plan")
        if w_desc.dtype != input_desc.dtype:
            raise BadParmError(f"filter dtype {w_desc.dtype.name} != data dtype {input_desc.dtype.name}")
        self.conv = conv
        self.w_desc = w_desc
        self._out = input_desc.with_dims(conv.output_dims(input_desc, w_desc))

    @property
    def output_desc(self) -> TensorDescriptor:
        return self._out

    @property
    def groups(self) -> int:
        return self.conv.groups

    def signature(self) -> tuple:
        c = self.conv
        return ("conv", self.w_desc.dims, self.w_desc.stride_key(), c.pads, c.strides, c.dilations, c.groups)

    def _check(self, args: ConvArgs) -> ConvArgs:
        w = as_tensor(args.weight, "convolution weights")
        why = self.w_desc.mismatch(w, "convolution weights")
        if why:
            raise BadParmError(why)
        return ConvArgs(weight=w, **_blend(args))

    def describe(self) -> str:
        k, _, *ks = self.w_desc.dims
        return f"{self.title} K={k} filter={'x'.join(map(str, ks))} {self.conv}"


class BiasForwardOp(FusionOp):
    letter = "B"
    title = "bias forward"
    args_type = BiasArgs

    def __init__(self, index: int, input_desc: TensorDescriptor, b_desc: TensorDescriptor):
        super().__init__(index, input_desc)
        self.param_dims = (1, input_desc.dims[1]) + (1,) * (input_desc.ndim - 2)
        check_param_descriptor(b_desc, self.param_dims, input_desc.dtype, f"bias (length must be C={self.channels})")
        self.b_desc = b_desc

    def _check(self, args: BiasArgs) -> BiasArgs:
        b = param_tensor(args.bias, "bias", self.param_dims, self.input_desc.dtype, self.b_desc)
        return BiasArgs(bias=b, **_blend(args))

    def describe(self) -> str:
        return f"{self.title} C={self.channels}"


class _BatchNormOp(FusionOp):
    letter = "N"

    def __init__(self, index: int, input_desc: TensorDescriptor, mode: BatchNormMode | int):
        super().__init__(index, input_desc)
        self.mode = coerce_enum(BatchNormMode, mode, "batch-norm mode")
        self.param_dims = batchnorm_param_dims(self.mode, input_desc.dims)

    def signature(self) -> tuple:
        return (type(self).__name__, self.mode)

    #: Arguments the operator writes into (side outputs).
    side_outputs: ClassVar[tuple[str, ...]] = ()

    def _param(self, args: OpArgs, name: str, desc: TensorDescriptor | None = None) -> torch.Tensor:
        value = getattr(args, name)
        if value is None:
            raise BadParmError(f"operator {self.index} ({self.title}): argument {name} is required")
        writable = name in self.side_outputs
        return param_tensor(value, f"{self.title} {name}", self.param_dims, self.input_desc.dtype, desc, writable)

    def _optional_param(self, args: OpArgs, name: str) -> torch.Tensor | None:
        return None if getattr(args, name) is None else self._param(args, name)

    def describe(self) -> str:
        return f"{self.title} {self.mode.name.lower()}"


class BatchNormInferenceOp(_BatchNormOp):
    title = "batch-norm inference"
    args_type = BatchNormInferenceArgs

    def __init__(
        self, index: int, input_desc: TensorDescriptor, mode: BatchNormMode | int, param_desc: TensorDescriptor
    ):
        super().__init__(index, input_desc, mode)
        check_param_descriptor(
            param_desc, self.param_dims, input_desc.dtype, f"batch-norm {self.mode.name.lower()} parameter"
        )
        self.param_desc = param_desc

    def _check(self, args: BatchNormInferenceArgs) -> BatchNormInferenceArgs:
        eps = finite_float(args.epsilon, "batch-norm epsilon")
        if eps < 0:
            raise BadParmError(f"batch-norm epsilon must be >= 0, got {eps}")
        params = {n: self._param(args, n, self.param_desc) for n in ("scale", "bias", "mean", "variance")}
        return BatchNormInferenceArgs(epsilon=eps, **params, **_blend(args))


class _ActivationOp(FusionOp):
    """What the activation's forward and backward operators share: the mode."""

    letter = "A"

    def __init__(self, index: int, input_desc: TensorDescriptor, mode: ActivationMode | int):
        super().__init__(index, input_desc)
        self.mode = coerce_enum(ActivationMode, mode, "activation mode")

    def signature(self) -> tuple:
        return (type(self).__name__, self.mode)


class ActivationForwardOp(_ActivationOp):
    title = "activation forward"
    args_type = ActivationArgs

    def _check(self, args: ActivationArgs) -> ActivationArgs:
        fields = {**args.field_values(), **_activ_params(args), **_blend(args), "slope": self._slope(args)}
        return type(args)(**fields)

    def _slope(self, args: ActivationArgs) -> torch.Tensor | None:
        """PReLU's slope as (1, C, 1, 1): C values, or one broadcast to every channel (nn.PReLU's
        num_parameters 1); None for the other modes, which take none."""
        if not self.mode.has_slope:
            if args.slope is not None:
                raise BadParmError(
                    f"operator {self.index} ({self.title} {self.mode.name}): a slope is PReLU's argument; "
                    "this mode takes activAlpha"
                )
            return None
        if args.slope is None:
            raise BadParmError(f"operator {self.index} ({self.title} PRELU): argument slope is required")
        t = as_tensor(args.slope, f"{self.title} slope")
        c = self.channels
        if t.numel() == 1 and c != 1:
            t = t.reshape(1, 1, 1, 1).expand(1, c, 1, 1)
        return param_tensor(t, f"{self.title} slope", (1, c, 1, 1), self.input_desc.dtype)

    def describe(self) -> str:
        return f"{self.title} {self.mode.name} ({ACTIVATIONS[self.mode].formula})"


def _activ_params(args: ActivationArgs | ActivationBackwardArgs) -> dict[str, float]:
    return {n: finite_float(getattr(args, n), n) for n in ("activ_alpha", "activ_beta", "activ_gamma")}


class _StatisticsOp(_BatchNormOp):
    """What batch-norm forward training and batch-norm statistics share: the batch statistics, the
    saved and running ones written as side outputs."""

    side_outputs = ("saved_mean", "saved_inv_variance", "running_mean", "running_variance")

    def __init__(
        self, index: int, input_desc: TensorDescriptor, mode: BatchNormMode | int, running_mean_variance: bool
    ):
        super().__init__(index, input_desc, mode)
        self.running = bool(running_mean_variance)
        count = input_desc.numel // _numel(self.param_dims)
        if count < 2 and self.running:
            raise BadParmError(f"{self.title} with running statistics needs at least 2 values per channel")

    def signature(self) -> tuple:
        return (*super().signature(), self.running)

    def _statistics(self, args: BatchNormForwardArgs | BatchNormStatisticsArgs) -> dict[str, Any]:
        """The statistics' arguments checked: epsilon, the factor, the saved and running tensors."""
        eps = finite_float(args.epsilon, "batch-norm epsilon")
        factor = finite_float(args.exp_avg_factor, "expAvgFactor")
        if eps < 0:
            raise BadParmError(f"batch-norm epsilon must be >= 0, got {eps}")
        if not 0.0 <= factor <= 1.0:
            raise BadParmError(f"expAvgFactor must be in [0, 1], got {factor}")
        running = {
            n: self._param(args, n) if self.running else self._optional_param(args, n)
            for n in ("running_mean", "running_variance")
        }
        saved = {n: self._optional_param(args, n) for n in ("saved_mean", "saved_inv_variance")}
        return {**saved, **running, "exp_avg_factor": factor, "epsilon": eps}

    def describe(self) -> str:
        return super().describe() + (" with running statistics" if self.running else "")


class BatchNormForwardOp(_StatisticsOp):
    phase = Phase.TRAINING_FORWARD
    title = "batch-norm forward training"
    args_type = BatchNormForwardArgs

    def _check(self, args: BatchNormForwardArgs) -> BatchNormForwardArgs:
        return BatchNormForwardArgs(
            scale=self._param(args, "scale"), bias=self._param(args, "bias"), **self._statistics(args), **_blend(args)
        )


class BatchNormStatisticsOp(_StatisticsOp):
    """The statistics a training batch-norm would compute of this operator's input (the mean and
    inverse deviation saved, the running statistics updated), the input passed through as the
    operator's result: a convolution that also emits its batch-norm's statistics ([C, S]), the
    normalization left to the next plan. It ends a plan."""

    phase = Phase.STATISTICS
    letter = "S"
    title = "batch-norm statistics"
    args_type = BatchNormStatisticsArgs

    def _check(self, args: BatchNormStatisticsArgs) -> BatchNormStatisticsArgs:
        blend = _blend(args)
        if blend != {"alpha": 1.0, "beta": 0.0}:
            raise BadParmError(
                f"operator {self.index} ({self.title}) passes its input through: alpha must be 1 and beta 0, "
                f"got alpha {blend['alpha']} and beta {blend['beta']}"
            )
        return BatchNormStatisticsArgs(**self._statistics(args), **blend)


class BatchNormBackwardOp(_BatchNormOp):
    phase = Phase.BACKWARD
    title = "batch-norm backward"
    args_type = BatchNormBackwardArgs
    side_outputs = ("result_scale_diff", "result_bias_diff")

    def _check(self, args: BatchNormBackwardArgs) -> BatchNormBackwardArgs:
        if args.x is None:
            raise BadParmError(f"operator {self.index} ({self.title}): argument x (the forward input) is required")
        x = data_tensor(args.x, "batch-norm backward x", self.input_desc.dims, self.input_desc.dtype)
        params = {
            n: self._param(args, n)
            for n in ("scale", "bias", "result_scale_diff", "result_bias_diff", "saved_mean", "saved_inv_variance")
        }
        return BatchNormBackwardArgs(x=x, **params, **_blend(args))


class ActivationBackwardOp(_ActivationOp):
    phase = Phase.BACKWARD
    title = "activation backward"
    args_type = ActivationBackwardArgs

    def __init__(self, index: int, input_desc: TensorDescriptor, mode: ActivationMode | int):
        super().__init__(index, input_desc, mode)
        if self.mode.has_slope:
            raise UnsupportedOpError(
                f"{self.title} {self.mode.name}: the backward plans have no output for the slope's gradient"
            )

    def _check(self, args: ActivationBackwardArgs) -> ActivationBackwardArgs:
        y = None
        if args.y is not None:
            y = data_tensor(args.y, "activation backward y", self.input_desc.dims, self.input_desc.dtype)
        return ActivationBackwardArgs(y=y, **_activ_params(args), **_blend(args))

    def describe(self) -> str:
        return f"{self.title} {self.mode.name}"


#: Operators whose main result is an affine function of their input, per channel (or element).
AFFINE_OPS = (BiasForwardOp, BatchNormInferenceOp)
