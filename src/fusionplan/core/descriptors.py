"""Descriptors: immutable, validated-on-construction descriptions of tensors and operators.

A tensor descriptor lists dims in NCHW order (N, C, spatial...) whatever the memory layout;
the layout lives in the strides, as in MIOpen and cuDNN. Every constructor raises
BadParmError naming the offending field; a descriptor that exists is valid.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from fusionplan.core.enums import ActivationMode, BatchNormMode, ConvMode, DataType, Layout
from fusionplan.core.errors import BadParmError, coerce_enum

MAX_DIMS = 5


def _int_tuple(values: object, what: str) -> tuple[int, ...]:
    if isinstance(values, int):
        values = (values,)
    try:
        items = tuple(values)  # type: ignore[arg-type]
    except TypeError:
        raise BadParmError(f"{what}: expected a sequence of integers, got {values!r}") from None
    for v in items:
        if isinstance(v, bool) or not isinstance(v, int):
            try:
                is_int = int(v) == v  # numpy / torch integers
            except (TypeError, ValueError):
                is_int = False
            if not is_int:
                raise BadParmError(f"{what}: {v!r} is not an integer")
    return tuple(int(v) for v in items)


def _finite_float(value: object, what: str) -> float:
    try:
        f = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise BadParmError(f"{what}: expected a number, got {value!r}") from None
    if not math.isfinite(f):
        raise BadParmError(f"{what}: must be finite, got {f}")
    return f


@functools.lru_cache(maxsize=1024)  # a pure function of the layout, asked at every first execute
def element_extent(dims: tuple[int, ...], strides: tuple[int, ...]) -> int:
    """How many elements a tensor of ``dims`` and (non-negative) ``strides`` spans, from its first
    element to one past its last (0 when it has none)."""
    if any(d == 0 for d in dims):
        return 0
    return 1 + sum((d - 1) * s for d, s in zip(dims, strides))


def layout_strides(dims: Sequence[int], layout: Layout) -> tuple[int, ...]:
    """Packed strides of ``dims`` (NCHW order) stored in ``layout`` (NHWC = channels last)."""
    if layout == Layout.NCHW or len(dims) < 3:
        order = list(range(len(dims)))
    else:
        order = [0, *range(2, len(dims)), 1]  # N, spatial..., C from outermost to innermost
    strides = [0] * len(dims)
    step = 1
    for axis in reversed(order):
        strides[axis] = step
        step *= dims[axis]
    return tuple(strides)


def _strides_overlap(dims: Sequence[int], strides: Sequence[int]) -> bool:
    """True when two different indices could address the same element."""
    return _overlapping(tuple(dims), tuple(strides))


@functools.lru_cache(maxsize=1024)  # a pure function of the layout, asked at every first execute
def _overlapping(dims: tuple[int, ...], strides: tuple[int, ...]) -> bool:
    axes = sorted((s, d) for d, s in zip(dims, strides) if d > 1)
    reach = 1  # every index so far lies in [0, reach)
    for stride, dim in axes:
        if stride < reach:
            return True
        reach = stride * (dim - 1) + reach
    return False


@dataclass(frozen=True)
class TensorDescriptor:
    """dtype, dims (NCHW order) and strides (in elements, same order as dims)."""

    dtype: DataType
    dims: tuple[int, ...]
    strides: tuple[int, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "dtype", coerce_enum(DataType, self.dtype, "tensor dtype"))
        dims = _int_tuple(self.dims, "tensor dims")
        strides = _int_tuple(self.strides, "tensor strides")
        if not 1 <= len(dims) <= MAX_DIMS:
            raise BadParmError(f"tensor dims: {len(dims)} dimensions; 1 to {MAX_DIMS} are supported")
        if len(strides) != len(dims):
            raise BadParmError(f"tensor strides: {len(strides)} strides for {len(dims)} dims")
        if any(d < 1 for d in dims):
            raise BadParmError(f"tensor dims: every dim must be >= 1, got {dims}")
        if any(s < 1 for s in strides):
            raise BadParmError(f"tensor strides: every stride must be >= 1, got {strides}")
        if _strides_overlap(dims, strides):
            raise BadParmError(f"tensor strides {strides} make elements of dims {dims} overlap")
        object.__setattr__(self, "dims", dims)
        object.__setattr__(self, "strides", strides)

    # -- constructors -------------------------------------------------------------------
    @classmethod
    def packed(
        cls, dtype: DataType | int | str, dims: Sequence[int], layout: Layout | int | str = Layout.NCHW
    ) -> TensorDescriptor:
        """A packed tensor of ``dims`` (NCHW order) in ``layout``."""
        dims = _int_tuple(dims, "tensor dims")
        if any(d < 1 for d in dims):
            raise BadParmError(f"tensor dims: every dim must be >= 1, got {dims}")
        layout = coerce_enum(Layout, layout, "tensor layout")
        return cls(coerce_enum(DataType, dtype, "tensor dtype"), dims, layout_strides(dims, layout))

    @classmethod
    def from_tensor(cls, tensor: torch.Tensor) -> TensorDescriptor:
        """The descriptor of ``tensor`` (its dtype, shape and strides)."""
        try:
            dtype = DataType.from_torch(tensor.dtype)
        except KeyError:
            raise BadParmError(f"tensor dtype {tensor.dtype} has no fusionplan data type") from None
        return cls(dtype, tuple(tensor.shape), tuple(tensor.stride()))

    # -- views --------------------------------------------------------------------------
    @property
    def ndim(self) -> int:
        return len(self.dims)

    @property
    def numel(self) -> int:
        return math.prod(self.dims)

    @property
    def channels(self) -> int:
        return self.dims[1] if self.ndim >= 2 else 1

    @property
    def layout(self) -> Layout | None:
        """NCHW or NHWC when the strides are packed in one of them, else None."""
        for layout in (Layout.NCHW, Layout.NHWC):
            if self.same_strides(layout_strides(self.dims, layout)):
                return layout
        return None

    @property
    def layout_name(self) -> str:
        layout = self.layout
        return layout.name if layout is not None else f"strided{self.strides}"

    def stride_key(self) -> tuple[int, ...]:
        """Strides with those of size-1 dims zeroed: equal keys mean interchangeable strides."""
        return tuple(0 if d == 1 else s for d, s in zip(self.dims, self.strides))

    def max_offset(self) -> int:
        """The element offset of the last element from the first (strides are never negative)."""
        return sum((d - 1) * s for d, s in zip(self.dims, self.strides))

    def same_strides(self, strides: Sequence[int]) -> bool:
        """Whether ``strides`` are this descriptor's, those of size-1 dims aside."""
        if tuple(strides) == self.strides:  # the common case, without a generator
            return True
        return all(d == 1 or a == b for d, a, b in zip(self.dims, self.strides, strides))

    def with_dims(self, dims: Sequence[int], layout: Layout | None = None) -> TensorDescriptor:
        """A packed descriptor of new dims, same dtype, in ``layout`` (default: this one's, or NCHW)."""
        return TensorDescriptor.packed(self.dtype, dims, layout or self.layout or Layout.NCHW)

    def with_dtype(self, dtype: DataType) -> TensorDescriptor:
        return TensorDescriptor(dtype, self.dims, self.strides)

    def mismatch(self, tensor: torch.Tensor, name: str) -> str | None:
        """Why ``tensor`` does not match this descriptor, or None when it does."""
        if tuple(tensor.shape) != self.dims:
            return f"{name} has shape {tuple(tensor.shape)}, its descriptor says {self.dims}"
        if tensor.dtype != self.dtype.torch_dtype:
            return f"{name} has dtype {tensor.dtype}, its descriptor says {self.dtype.name}"
        if not self.same_strides(tensor.stride()):
            return f"{name} has strides {tuple(tensor.stride())}, its descriptor says {self.strides}"
        return None

    def __str__(self) -> str:
        return f"{self.dtype.name}{list(self.dims)} {self.layout_name}"


@dataclass(frozen=True)
class ConvolutionDescriptor:
    """Padding, stride, dilation (one per spatial axis), groups and mode of a convolution."""

    pads: tuple[int, ...] = (0, 0)
    strides: tuple[int, ...] = (1, 1)
    dilations: tuple[int, ...] = (1, 1)
    groups: int = 1
    mode: ConvMode = ConvMode.CONVOLUTION

    def __post_init__(self) -> None:
        object.__setattr__(self, "mode", coerce_enum(ConvMode, self.mode, "convolution mode"))
        pads = _int_tuple(self.pads, "convolution pads")
        strides = _int_tuple(self.strides, "convolution strides")
        dilations = _int_tuple(self.dilations, "convolution dilations")
        if not 1 <= len(pads) <= 3 or not len(pads) == len(strides) == len(dilations):
            raise BadParmError(
                f"convolution: pads {pads}, strides {strides} and dilations {dilations} "
                "must have one entry per spatial axis (1 to 3 axes)"
            )
        if any(p < 0 for p in pads):
            raise BadParmError(f"convolution pads must be >= 0, got {pads}")
        if any(s < 1 for s in strides):
            raise BadParmError(f"convolution strides must be >= 1, got {strides}")
        if any(d < 1 for d in dilations):
            raise BadParmError(f"convolution dilations must be >= 1, got {dilations}")
        groups = _int_tuple((self.groups,), "convolution group count")[0]
        if groups < 1:
            raise BadParmError(f"convolution group count must be >= 1, got {groups}")
        object.__setattr__(self, "pads", pads)
        object.__setattr__(self, "strides", strides)
        object.__setattr__(self, "dilations", dilations)
        object.__setattr__(self, "groups", groups)

    @property
    def spatial_dims(self) -> int:
        return len(self.pads)

    def output_dims(self, x: TensorDescriptor, w: TensorDescriptor) -> tuple[int, ...]:
        """Dims of the output of this convolution of ``x`` by filter ``w``; BadParmError if inconsistent."""
        nspatial = self.spatial_dims
        if x.ndim != nspatial + 2 or w.ndim != nspatial + 2:
            raise BadParmError(
                f"convolution with {nspatial} spatial axes needs {nspatial + 2}-d input and filter, "
                f"got input {x.dims} and filter {w.dims}"
            )
        n, c = x.dims[:2]
        g = self.groups
        if self.mode == ConvMode.TRANSPOSE:
            if w.dims[0] != c:
                raise BadParmError(f"transposed convolution: filter dim 0 is {w.dims[0]}, input has C={c}")
            if c % g:
                raise BadParmError(f"input channels C={c} not divisible by groups={g}")
            out_c = w.dims[1] * g
            spatial = [
                s * (i - 1) + d * (k - 1) + 1 - 2 * p
                for i, k, p, s, d in zip(x.dims[2:], w.dims[2:], self.pads, self.strides, self.dilations)
            ]
        else:
            k = w.dims[0]
            if c % g:
                raise BadParmError(f"input channels C={c} not divisible by groups={g}")
            if k % g:
                raise BadParmError(f"filter count K={k} not divisible by groups={g}")
            if w.dims[1] != c // g:
                raise BadParmError(
                    f"filter channels {w.dims[1]} != C/groups = {c}/{g} = {c // g} (filter dims {w.dims})"
                )
            out_c = k
            spatial = [
                (i + 2 * p - d * (kk - 1) - 1) // s + 1
                for i, kk, p, s, d in zip(x.dims[2:], w.dims[2:], self.pads, self.strides, self.dilations)
            ]
        if any(o < 1 for o in spatial):
            raise BadParmError(
                f"convolution output would be empty: input {x.dims}, filter {w.dims}, pads {self.pads}, "
                f"strides {self.strides}, dilations {self.dilations} give spatial size {tuple(spatial)}"
            )
        return (n, out_c, *spatial)

    def __str__(self) -> str:
        extra = f" groups={self.groups}" if self.groups != 1 else ""
        return f"pad={self.pads} stride={self.strides} dilation={self.dilations}{extra}"


@dataclass(frozen=True)
class ActivationDescriptor:
    """An activation mode with its alpha, beta, gamma (see fusionplan.core.activations for the formulas)."""

    mode: ActivationMode = ActivationMode.RELU
    alpha: float = 1.0
    beta: float = 0.0
    gamma: float = 1.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "mode", coerce_enum(ActivationMode, self.mode, "activation mode"))
        for name in ("alpha", "beta", "gamma"):
            object.__setattr__(self, name, _finite_float(getattr(self, name), f"activation {name}"))


def batchnorm_param_dims(mode: BatchNormMode, data_dims: Sequence[int]) -> tuple[int, ...]:
    """Shape of scale/bias/mean/variance for batch-norm ``mode`` on data of ``data_dims``."""
    if mode == BatchNormMode.SPATIAL:
        return (1, data_dims[1]) + (1,) * (len(data_dims) - 2)
    return (1, *data_dims[1:])


def finite_float(value: object, what: str) -> float:
    """``value`` as a finite float, or BadParmError naming ``what``."""
    return _finite_float(value, what)
