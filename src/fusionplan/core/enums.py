"""Enumerations of the fusion API, with MIOpen's numeric values.

The names are Pythonic; the values are MIOpen's, so ``fusionplan.miopen`` converts
between its ``miopen*`` enumerations and these by value.
"""

from __future__ import annotations

import enum

import torch


class Status(enum.IntEnum):
    SUCCESS = 0
    NOT_INITIALIZED = 1
    INVALID_VALUE = 2
    BAD_PARM = 3
    ALLOC_FAILED = 4
    INTERNAL_ERROR = 5
    NOT_IMPLEMENTED = 6
    UNKNOWN_ERROR = 7
    UNSUPPORTED_OP = 8
    GPU_OPERATIONS_SKIPPED = 9
    VERSION_MISMATCH = 10


class DataType(enum.IntEnum):
    HALF = 0
    FLOAT = 1
    INT32 = 2
    INT8 = 3
    BFLOAT16 = 5
    DOUBLE = 6

    @property
    def torch_dtype(self) -> torch.dtype:
        return _TORCH_DTYPES[self]

    @property
    def is_floating(self) -> bool:
        return self in (DataType.HALF, DataType.FLOAT, DataType.BFLOAT16, DataType.DOUBLE)

    @classmethod
    def from_torch(cls, dtype: torch.dtype) -> DataType:
        for member, torch_dtype in _TORCH_DTYPES.items():
            if torch_dtype == dtype:
                return member
        raise KeyError(dtype)


_TORCH_DTYPES = {
    DataType.HALF: torch.float16,
    DataType.FLOAT: torch.float32,
    DataType.INT32: torch.int32,
    DataType.INT8: torch.int8,
    DataType.BFLOAT16: torch.bfloat16,
    DataType.DOUBLE: torch.float64,
}

#: Data types a fusion plan computes on (the others exist only as descriptors).
PLAN_DTYPES = (DataType.FLOAT, DataType.HALF, DataType.BFLOAT16, DataType.DOUBLE)


class Layout(enum.IntEnum):
    NCHW = 0
    NHWC = 1


class Direction(enum.IntEnum):
    VERTICAL = 0
    HORIZONTAL = 1


class ConvMode(enum.IntEnum):
    CONVOLUTION = 0
    TRANSPOSE = 1
    GROUP_CONV = 2
    DEPTHWISE = 3


class ConvFwdAlgo(enum.IntEnum):
    GEMM = 0
    DIRECT = 1
    FFT = 2
    WINOGRAD = 3
    IMPLICIT_GEMM = 5


class ActivationMode(enum.IntEnum):
    PASTHRU = 0
    LOGISTIC = 1
    TANH = 2
    RELU = 3
    SOFTRELU = 4
    ABS = 5
    POWER = 6
    CLIPPEDRELU = 7
    LEAKYRELU = 8
    ELU = 9
    # fusionplan's extensions, beyond MIOpen's ten: the Python API and fuse(model) take them, the
    # MIOpen layer does not (its enumeration is MIOpen's)
    SILU = 100  # x * sigmoid(x) (Swish)
    HARDSWISH = 101  # x * clamp(x + 3, 0, 6) / 6
    HARDSIGMOID = 102  # clamp(x / 6 + 1 / 2, 0, 1)
    GELU = 103  # x * Phi(x), the erf form
    GELU_TANH = 104  # GELU's tanh approximation
    MISH = 105  # x * tanh(softplus(x))
    PRELU = 106  # x if x > 0 else slope[c] * x: a per-channel slope tensor (ActivationArgs.slope)

    @property
    def is_extension(self) -> bool:
        """Not one of MIOpen's ten modes."""
        return self.value >= 100

    @property
    def has_slope(self) -> bool:
        """Reads a per-channel slope tensor (PReLU's) in place of the scalar activAlpha."""
        return self is ActivationMode.PRELU


#: MIOpen's activation modes (the MIOpen layer's enumeration, the driver's -m)
MIOPEN_ACTIVATIONS = tuple(m for m in ActivationMode if not m.is_extension)


class BatchNormMode(enum.IntEnum):
    PER_ACTIVATION = 0
    SPATIAL = 1
