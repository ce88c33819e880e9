"""fusionplan: fusion plans (convolution, bias, batch-norm, activation) compiled into one kernel."""

import logging

from fusionplan.api import Plan, conv_bias_activation, default_handle
from fusionplan.compiling import compile_all
from fusionplan.core.caches import cache_sizes, clear_caches
from fusionplan.core.descriptors import ActivationDescriptor, ConvolutionDescriptor, TensorDescriptor
from fusionplan.core.enums import (
    ActivationMode,
    BatchNormMode,
    ConvFwdAlgo,
    ConvMode,
    DataType,
    Direction,
    Layout,
    Status,
)
from fusionplan.core.errors import (
    BadParmError,
    FusionPlanError,
    InternalError,
    MissingArgumentError,
    NotCompiledError,
    TensorMismatchError,
    UnsupportedOpError,
)
from fusionplan.core.handle import Handle
from fusionplan.core.ops import (
    ActivationArgs,
    ActivationBackwardArgs,
    BatchNormBackwardArgs,
    BatchNormForwardArgs,
    BatchNormInferenceArgs,
    BatchNormStatisticsArgs,
    BiasArgs,
    ConvArgs,
)
from fusionplan.core.settings import Settings
from fusionplan.core.version import __version__ as __version__
from fusionplan.plan import FusionPlan, OperatorArgs

# A library's logger: its records reach the application's handlers, and with none configured
# nothing is printed (Python's last-resort handler would write warnings to stderr).
logging.getLogger("fusionplan").addHandler(logging.NullHandler())

__all__ = [
    "ActivationArgs",
    "ActivationBackwardArgs",
    "ActivationDescriptor",
    "ActivationMode",
    "BadParmError",
    "BatchNormBackwardArgs",
    "BatchNormForwardArgs",
    "BatchNormInferenceArgs",
    "BatchNormStatisticsArgs",
    "BatchNormMode",
    "BiasArgs",
    "ConvArgs",
    "ConvFwdAlgo",
    "ConvMode",
    "ConvolutionDescriptor",
    "DataType",
    "Direction",
    "FusionPlan",
    "FusionPlanError",
    "Handle",
    "InternalError",
    "Layout",
    "MissingArgumentError",
    "NotCompiledError",
    "OperatorArgs",
    "Plan",
    "Settings",
    "Status",
    "cache_sizes",
    "clear_caches",
    "compile_all",
    "conv_bias_activation",
    "default_handle",
    "TensorDescriptor",
    "TensorMismatchError",
    "UnsupportedOpError",
]
