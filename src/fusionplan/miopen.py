"""MIOpen-compatible layer: MIOpen's fusion API, function for function, in Python.

Calling convention (cuda-python's): every function keeps its C name and argument order minus
the output pointers; it returns a ``miopenStatus_t``, or ``(status, out1, ...)`` when C has
output parameters (outputs are None on failure). It never raises for a bad argument: the
reason goes to the ``fusionplan`` logger at WARNING and to ``miopenGetLastErrorString()``.
Tensors are torch tensors (CPU or CUDA) or anything DLPack-capable; ``NULL`` is None.
"""

from __future__ import annotations

import enum
import functools
import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

from fusionplan import api
from fusionplan.core.descriptors import ActivationDescriptor, ConvolutionDescriptor, TensorDescriptor
from fusionplan.core.enums import (
    MIOPEN_ACTIVATIONS,
    ActivationMode,
    BatchNormMode,
    ConvFwdAlgo,
    ConvMode,
    DataType,
    Direction,
    Layout,
    Status,
)
from fusionplan.core.errors import BadParmError, FusionPlanError
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
    ConvForwardOp,
    FusionOp,
    OpArgs,
)
from fusionplan.miopen_objects import (
    _args,
    _conv_desc,
    _count,
    _handle,
    _live,
    _op,
    _plan,
    _scalar,
    _tensor_desc,
    miopenActivationDescriptor,
    miopenConvolutionDescriptor,
    miopenFusionPlanDescriptor,
    miopenHandle,
    miopenOperatorArgs,
    miopenTensorDescriptor,
)
from fusionplan.miopen_objects import (
    miopenFusionOpDescriptor as miopenFusionOpDescriptor,  # public: an alias of the core's operators
)
from fusionplan.plan import FusionPlan

logger = logging.getLogger("fusionplan")


# ---- enumerations: MIOpen's names and values; every member is also a module constant ----------
#: MIOpen's member names that are not the core's in CamelCase (BAD_PARM: BadParm).
_SPELLINGS = {
    "BFLOAT16": "BFloat16", "VERTICAL": "VerticalFusion", "HORIZONTAL": "HorizontalFusion", "GEMM": "GEMM",
    "FFT": "FFT", "WINOGRAD": "WinogradFwd", "IMPLICIT_GEMM": "ImplicitGEMM",
}  # fmt: skip


def _mirror(
    name: str, core: type[enum.IntEnum], prefix: str, camel: bool = True, members: Sequence | None = None
) -> type[enum.IntEnum]:
    """MIOpen's enumeration ``name``: the core's members (or ``members`` of it), each named ``prefix``
    and the core's name (in CamelCase, or as it is where ``camel`` is False: NCHW, RELU)."""

    def spelled(member: str) -> str:
        return _SPELLINGS.get(member) or "".join(part.capitalize() for part in member.split("_"))

    named = {prefix + (spelled(m.name) if camel else m.name): m.value for m in (core if members is None else members)}
    cls = enum.IntEnum(name, named)
    cls.__module__ = __name__
    globals().update(cls.__members__)
    return cls


miopenStatus_t = _mirror("miopenStatus_t", Status, "miopenStatus")
miopenDataType_t = _mirror("miopenDataType_t", DataType, "miopen")
miopenTensorLayout_t = _mirror("miopenTensorLayout_t", Layout, "miopenTensor", camel=False)
miopenFusionDirection_t = _mirror("miopenFusionDirection_t", Direction, "miopen")
miopenConvolutionMode_t = _mirror("miopenConvolutionMode_t", ConvMode, "miopen")
miopenConvFwdAlgorithm_t = _mirror("miopenConvFwdAlgorithm_t", ConvFwdAlgo, "miopenConvolutionFwdAlgo")
miopenActivationMode_t = _mirror(
    "miopenActivationMode_t", ActivationMode, "miopenActivation", camel=False, members=MIOPEN_ACTIVATIONS
)
miopenBatchNormMode_t = _mirror("miopenBatchNormMode_t", BatchNormMode, "miopenBN")


# ---- error reporting ---------------------------------------------------------------------------
_last_error = threading.local()


def miopenGetLastErrorString() -> str:
    """The reason of this thread's most recent failed call ("" if none failed)."""
    return getattr(_last_error, "message", "")


def _fail(fn_name: str, status: Status, message: str) -> miopenStatus_t:
    _last_error.message = f"{fn_name}: {message}"
    logger.warning("%s failed (%s): %s", fn_name, miopenStatus_t(status).name, message)
    return miopenStatus_t(status)


def _api(outputs: int = 0) -> Callable:
    """Turn a function that returns its outputs (or raises) into one that returns statuses."""

    def wrap(fn: Callable) -> Callable:
        @functools.wraps(fn)
        def call(*args: Any) -> Any:
            try:
                result = fn(*args)
                status = miopenStatus_t.miopenStatusSuccess
            except FusionPlanError as exc:
                status, result = _fail(fn.__name__, exc.status, str(exc)), None
            except (TypeError, ValueError, IndexError, KeyError, AttributeError) as exc:
                status, result = _fail(fn.__name__, Status.BAD_PARM, f"{type(exc).__name__}: {exc}"), None
            except Exception as exc:  # a fault of ours: report it, never pass it off as success
                logger.exception("%s: internal error", fn.__name__)
                status, result = _fail(fn.__name__, Status.INTERNAL_ERROR, f"{type(exc).__name__}: {exc}"), None
            if outputs == 0:
                return status
            if result is None:
                return (status,) + (None,) * outputs
            return (status,) + (tuple(result) if outputs > 1 else (result,))

        return call

    return wrap


# ---- opaque objects (fusionplan.miopen_objects): the handles the functions create and take ------


# ---- handle ------------------------------------------------------------------------------------
@_api(outputs=1)
def miopenCreate() -> miopenHandle:
    return miopenHandle(Handle())


@_api(outputs=1)
def miopenCreateWithStream(stream: Any) -> miopenHandle:
    return miopenHandle(Handle(stream=stream) if stream is not None else Handle())


@_api(outputs=1)
def miopenCreateOnDevice(device: Any) -> miopenHandle:
    return miopenHandle(Handle(device))


@_api()
def miopenSetStream(handle: Any, stream: Any) -> None:
    _handle(handle).set_stream(stream)


@_api(outputs=1)
def miopenGetStream(handle: Any) -> Any:
    return _handle(handle).current_stream()


@_api()
def miopenDestroy(handle: Any) -> None:
    _live(handle, miopenHandle, "handle").destroy()


# ---- tensor descriptors ------------------------------------------------------------------------
@_api(outputs=1)
def miopenCreateTensorDescriptor() -> miopenTensorDescriptor:
    return miopenTensorDescriptor()


@_api()
def miopenSet4dTensorDescriptor(desc: Any, dataType: Any, n: int, c: int, h: int, w: int) -> None:
    target = _live(desc, miopenTensorDescriptor, "tensor descriptor")
    target.desc = TensorDescriptor.packed(DataType(_dtype(dataType)), (n, c, h, w), Layout.NCHW)


@_api()
def miopenSetTensorDescriptor(
    desc: Any, dataType: Any, nbDims: int, dims: Sequence[int], strides: Sequence[int] | None
) -> None:
    target = _live(desc, miopenTensorDescriptor, "tensor descriptor")
    dims = _lens(dims, nbDims, "dims")
    dtype = _dtype(dataType)
    if strides is None:
        target.desc = TensorDescriptor.packed(dtype, dims)
    else:
        target.desc = TensorDescriptor(dtype, dims, _lens(strides, nbDims, "strides"))


@_api()
def miopenSetNdTensorDescriptorWithLayout(
    desc: Any, dataType: Any, layout: Any, lens: Sequence[int], num_lens: int
) -> None:
    target = _live(desc, miopenTensorDescriptor, "tensor descriptor")
    layout = _enum(Layout, layout, "tensor layout")
    target.desc = TensorDescriptor.packed(_dtype(dataType), _lens(lens, num_lens, "lens"), layout)


@_api(outputs=3)
def miopenGetTensorDescriptor(desc: Any) -> tuple:
    d = _tensor_desc(desc, "tensor descriptor")
    return miopenDataType_t(d.dtype), list(d.dims), list(d.strides)


@_api(outputs=1)
def miopenGetTensorDescriptorSize(desc: Any) -> int:
    return _tensor_desc(desc, "tensor descriptor").ndim


@_api()
def miopenDestroyTensorDescriptor(desc: Any) -> None:
    _live(desc, miopenTensorDescriptor, "tensor descriptor").destroy()


def _dtype(value: Any) -> DataType:
    return _enum(DataType, value, "data type")


def _enum(core: type[enum.IntEnum], value: Any, what: str) -> Any:
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadParmError(f"{what}: expected an enumeration value, got {value!r}")
    try:
        return core(int(value))
    except ValueError:
        raise BadParmError(f"{what}: {int(value)} is not a valid value") from None


def _activation_mode(value: Any) -> ActivationMode:
    """One of MIOpen's ten activation modes (fusionplan's extension modes are the Python API's)."""
    mode = _enum(ActivationMode, value, "activation mode")
    if mode.is_extension:
        raise BadParmError(
            f"activation mode: {int(value)} is not a valid value (MIOpen's modes are 0-9; fusionplan's extension "
            f"{mode.name} is in its Python API)"
        )
    return mode


def _lens(values: Sequence[int], count: int, what: str) -> tuple[int, ...]:
    count = _count(count, f"number of {what}")
    if values is None:
        raise BadParmError(f"{what}: NULL")
    values = tuple(values)
    if len(values) != count:
        raise BadParmError(f"{what}: {len(values)} values given, count says {count}")
    return values


# ---- convolution descriptors -------------------------------------------------------------------
@_api(outputs=1)
def miopenCreateConvolutionDescriptor() -> miopenConvolutionDescriptor:
    return miopenConvolutionDescriptor()


@_api()
def miopenInitConvolutionDescriptor(
    conv: Any, mode: Any, pad_h: int, pad_w: int, stride_h: int, stride_w: int, dilation_h: int, dilation_w: int
) -> None:
    target = _live(conv, miopenConvolutionDescriptor, "convolution descriptor")
    target.desc = ConvolutionDescriptor(
        (pad_h, pad_w),
        (stride_h, stride_w),
        (dilation_h, dilation_w),
        target.groups,
        _enum(ConvMode, mode, "convolution mode"),
    )


@_api()
def miopenInitConvolutionNdDescriptor(
    conv: Any, spatialDim: int, pads: Sequence[int], strides: Sequence[int], dilations: Sequence[int], mode: Any
) -> None:
    target = _live(conv, miopenConvolutionDescriptor, "convolution descriptor")
    target.desc = ConvolutionDescriptor(
        _lens(pads, spatialDim, "pads"),
        _lens(strides, spatialDim, "strides"),
        _lens(dilations, spatialDim, "dilations"),
        target.groups,
        _enum(ConvMode, mode, "convolution mode"),
    )


@_api()
def miopenSetConvolutionGroupCount(conv: Any, groups: int) -> None:
    target = _live(conv, miopenConvolutionDescriptor, "convolution descriptor")
    groups = _count(groups, "group count")
    if groups < 1:
        raise BadParmError(f"group count must be >= 1, got {groups}")
    target.groups = groups
    if target.desc is not None:
        d = target.desc
        target.desc = ConvolutionDescriptor(d.pads, d.strides, d.dilations, groups, d.mode)


@_api(outputs=4)
def miopenGetConvolutionForwardOutputDim(conv: Any, inputDesc: Any, filterDesc: Any) -> tuple:
    dims = _conv_desc(conv).output_dims(
        _tensor_desc(inputDesc, "input descriptor"), _tensor_desc(filterDesc, "filter descriptor")
    )
    if len(dims) != 4:
        raise BadParmError(f"miopenGetConvolutionForwardOutputDim is for 2-d convolutions; output dims are {dims}")
    return dims


@_api(outputs=2)
def miopenGetConvolutionNdForwardOutputDim(conv: Any, inputDesc: Any, filterDesc: Any) -> tuple:
    dims = _conv_desc(conv).output_dims(
        _tensor_desc(inputDesc, "input descriptor"), _tensor_desc(filterDesc, "filter descriptor")
    )
    return len(dims), list(dims)


@_api()
def miopenDestroyConvolutionDescriptor(conv: Any) -> None:
    _live(conv, miopenConvolutionDescriptor, "convolution descriptor").destroy()


# ---- activation descriptors --------------------------------------------------------------------
@_api(outputs=1)
def miopenCreateActivationDescriptor() -> miopenActivationDescriptor:
    return miopenActivationDescriptor()


@_api()
def miopenSetActivationDescriptor(
    activDesc: Any, mode: Any, activAlpha: float, activBeta: float, activGamma: float
) -> None:
    target = _live(activDesc, miopenActivationDescriptor, "activation descriptor")
    target.desc = ActivationDescriptor(_activation_mode(mode), activAlpha, activBeta, activGamma)


@_api()
def miopenDestroyActivationDescriptor(activDesc: Any) -> None:
    _live(activDesc, miopenActivationDescriptor, "activation descriptor").destroy()


# ---- fusion plans and operators ----------------------------------------------------------------
@_api(outputs=1)
def miopenCreateFusionPlan(fuseDirection: Any, inputDesc: Any) -> miopenFusionPlanDescriptor:
    direction = _enum(Direction, fuseDirection, "fusion direction")
    return miopenFusionPlanDescriptor(FusionPlan(_tensor_desc(inputDesc, "input descriptor"), direction))


@_api()
def miopenDestroyFusionPlan(plan: Any) -> None:
    _live(plan, miopenFusionPlanDescriptor, "fusion plan").destroy()


@_api(outputs=1)
def miopenCreateOpConvForward(plan: Any, convDesc: Any, wDesc: Any) -> FusionOp:
    return _plan(plan).add_conv_forward(_conv_desc(convDesc), _tensor_desc(wDesc, "filter descriptor"))


@_api(outputs=1)
def miopenCreateOpBiasForward(plan: Any, bDesc: Any) -> FusionOp:
    return _plan(plan).add_bias_forward(_tensor_desc(bDesc, "bias descriptor"))


@_api(outputs=1)
def miopenCreateOpBatchNormInference(plan: Any, bn_mode: Any, bnScaleBiasMeanVarDesc: Any) -> FusionOp:
    mode = _enum(BatchNormMode, bn_mode, "batch-norm mode")
    return _plan(plan).add_batchnorm_inference(
        mode, _tensor_desc(bnScaleBiasMeanVarDesc, "batch-norm parameter descriptor")
    )


@_api(outputs=1)
def miopenCreateOpActivationForward(plan: Any, mode: Any) -> FusionOp:
    return _plan(plan).add_activation_forward(_activation_mode(mode))


@_api(outputs=1)
def miopenCreateOpBatchNormForward(plan: Any, bn_mode: Any, runningMeanVariance: bool) -> FusionOp:
    return _plan(plan).add_batchnorm_forward(
        _enum(BatchNormMode, bn_mode, "batch-norm mode"), bool(runningMeanVariance)
    )


@_api(outputs=1)
def miopenCreateOpBatchNormStatistics(plan: Any, bn_mode: Any, runningMeanVariance: bool) -> FusionOp:
    """fusionplan addition: the batch-norm statistics of the chain's output, its last operator (the
    output unnormalized): [Conv, BatchNormStatistics] is a convolution that emits them."""
    return _plan(plan).add_batchnorm_statistics(
        _enum(BatchNormMode, bn_mode, "batch-norm mode"), bool(runningMeanVariance)
    )


@_api(outputs=1)
def miopenCreateOpBatchNormBackward(plan: Any, bn_mode: Any) -> FusionOp:
    return _plan(plan).add_batchnorm_backward(_enum(BatchNormMode, bn_mode, "batch-norm mode"))


@_api(outputs=1)
def miopenCreateOpActivationBackward(plan: Any, mode: Any) -> FusionOp:
    return _plan(plan).add_activation_backward(_activation_mode(mode))


@_api()
def miopenCompileFusionPlan(handle: Any, plan: Any) -> None:
    _plan(plan).compile(_handle(handle))


@_api(outputs=1)
def miopenFusionPlanGetOp(plan: Any, op_idx: int) -> FusionOp:
    return _plan(plan).get_op(op_idx)


@_api(outputs=1)
def miopenFusionPlanGetWorkSpaceSize(handle: Any, plan: Any, algo: Any) -> int:
    _handle(handle)
    _plan(plan)
    _enum(ConvFwdAlgo, algo, "convolution algorithm")
    return 0  # fused kernels need no workspace


def _conv_plan(plan: Any) -> FusionPlan:
    core = _plan(plan)
    if not any(isinstance(op, ConvForwardOp) for op in core.ops):
        raise BadParmError("the plan has no convolution operator")
    return core


@_api(outputs=2)
def miopenFusionPlanConvolutionGetAlgo(plan: Any, requestAlgoCount: int) -> tuple:
    _conv_plan(plan)
    count = _count(requestAlgoCount, "requestAlgoCount")
    if count < 1:
        raise BadParmError(f"requestAlgoCount must be >= 1, got {count}")
    algos = [miopenConvFwdAlgorithm_t.miopenConvolutionFwdAlgoImplicitGEMM][:count]
    return len(algos), algos


@_api()
def miopenFusionPlanConvolutionSetAlgo(plan: Any, algo: Any) -> None:
    # Every fused kernel of fusionplan is an implicit GEMM; the choice is recorded, not required.
    _conv_plan(plan).conv_algo = _enum(ConvFwdAlgo, algo, "convolution algorithm")


# ---- operator arguments ------------------------------------------------------------------------
@_api(outputs=1)
def miopenCreateOperatorArgs() -> miopenOperatorArgs:
    return miopenOperatorArgs()


@_api()
def miopenDestroyOperatorArgs(args: Any) -> None:
    _live(args, miopenOperatorArgs, "operator arguments").destroy()


def _set(args: Any, op: Any, what: str, record_type: type[OpArgs], alpha: Any, beta: Any, **fields: Any) -> None:
    record = record_type(alpha=_scalar(alpha, "alpha"), beta=_scalar(beta, "beta"), **fields)
    _args(args).set(_op(op, what), record)


@_api()
def miopenSetOpArgsConvForward(args: Any, convOp: Any, alpha: Any, beta: Any, w: Any) -> None:
    _set(args, convOp, "convOp", ConvArgs, alpha, beta, weight=_required(w, "w"))


@_api()
def miopenSetOpArgsBiasForward(args: Any, biasOp: Any, alpha: Any, beta: Any, bias: Any) -> None:
    _set(args, biasOp, "biasOp", BiasArgs, alpha, beta, bias=_required(bias, "bias"))


@_api()
def miopenSetOpArgsBatchNormInference(
    args: Any,
    bnOp: Any,
    alpha: Any,
    beta: Any,
    bnScale: Any,
    bnBias: Any,
    estimatedMean: Any,
    estimatedVariance: Any,
    epsilon: float,
) -> None:
    _set(
        args,
        bnOp,
        "bnOp",
        BatchNormInferenceArgs,
        alpha,
        beta,
        scale=bnScale,
        bias=bnBias,
        mean=estimatedMean,
        variance=estimatedVariance,
        epsilon=epsilon,
    )


@_api()
def miopenSetOpArgsActivForward(
    args: Any, activOp: Any, alpha: Any, beta: Any, activAlpha: float, activBeta: float, activGamma: float
) -> None:
    _set(
        args,
        activOp,
        "activOp",
        ActivationArgs,
        alpha,
        beta,
        activ_alpha=activAlpha,
        activ_beta=activBeta,
        activ_gamma=activGamma,
    )


@_api()
def miopenSetOpArgsBatchNormForward(
    args: Any,
    bnOp: Any,
    alpha: Any,
    beta: Any,
    bnScale: Any,
    bnBias: Any,
    savedMean: Any,
    savedInvVariance: Any,
    runningMean: Any,
    runningVariance: Any,
    expAvgFactor: float,
    epsilon: float,
) -> None:
    _set(
        args,
        bnOp,
        "bnOp",
        BatchNormForwardArgs,
        alpha,
        beta,
        scale=bnScale,
        bias=bnBias,
        saved_mean=savedMean,
        saved_inv_variance=savedInvVariance,
        running_mean=runningMean,
        running_variance=runningVariance,
        exp_avg_factor=expAvgFactor,
        epsilon=epsilon,
    )


@_api()
def miopenSetOpArgsBatchNormStatistics(
    args: Any,
    bnOp: Any,
    alpha: Any,
    beta: Any,
    savedMean: Any,
    savedInvVariance: Any,
    runningMean: Any,
    runningVariance: Any,
    expAvgFactor: float,
    epsilon: float,
) -> None:
    """fusionplan addition: miopenSetOpArgsBatchNormForward's arguments without bnScale and bnBias
    (alpha 1 and beta 0: the operator passes its input through)."""
    _set(
        args,
        bnOp,
        "bnOp",
        BatchNormStatisticsArgs,
        alpha,
        beta,
        saved_mean=savedMean,
        saved_inv_variance=savedInvVariance,
        running_mean=runningMean,
        running_variance=runningVariance,
        exp_avg_factor=expAvgFactor,
        epsilon=epsilon,
    )


@_api()
def miopenSetOpArgsBatchNormBackward(
    args: Any,
    bnOp: Any,
    alpha: Any,
    beta: Any,
    x: Any,
    bnScale: Any,
    bnBias: Any,
    resultBnScaleDiff: Any,
    resultBnBiasDiff: Any,
    savedMean: Any,
    savedInvVariance: Any,
) -> None:
    _set(
        args,
        bnOp,
        "bnOp",
        BatchNormBackwardArgs,
        alpha,
        beta,
        x=x,
        scale=bnScale,
        bias=bnBias,
        result_scale_diff=resultBnScaleDiff,
        result_bias_diff=resultBnBiasDiff,
        saved_mean=savedMean,
        saved_inv_variance=savedInvVariance,
    )


@_api()
def miopenSetOpArgsActivBackward(
    args: Any,
    activOp: Any,
    alpha: Any,
    beta: Any,
    y: Any,
    reserved: Any,
    activAlpha: float,
    activBeta: float,
    activGamma: float,
) -> None:
    # `reserved` is unused, as in MIOpen: the activation's input is recomputed from the BN arguments.
    _set(
        args,
        activOp,
        "activOp",
        ActivationBackwardArgs,
        alpha,
        beta,
        y=y,
        activ_alpha=activAlpha,
        activ_beta=activBeta,
        activ_gamma=activGamma,
    )


def _required(value: Any, what: str) -> Any:
    if value is None:
        raise BadParmError(f"{what}: a tensor is required (NULL given)")
    return value


# ---- execution ---------------------------------------------------------------------------------
@_api()
def miopenExecuteFusionPlan(
    handle: Any, plan: Any, inputDesc: Any, input: Any, outputDesc: Any, output: Any, args: Any
) -> None:
    _plan(plan).execute(
        _handle(handle),
        _required(input, "input"),
        _required(output, "output"),
        _args(args),
        x_desc=_tensor_desc(inputDesc, "input descriptor"),
        y_desc=_tensor_desc(outputDesc, "output descriptor"),
    )


@_api()
def miopenConvolutionBiasActivationForward(
    handle: Any,
    alpha1: Any,
    xDesc: Any,
    x: Any,
    wDesc: Any,
    w: Any,
    convDesc: Any,
    algo: Any,
    workspace: Any,
    workSpaceSize: int,
    alpha2: Any,
    zDesc: Any,
    z: Any,
    biasDesc: Any,
    bias: Any,
    activationDesc: Any,
    yDesc: Any,
    y: Any,
) -> None:
    """y = act(alpha1 * conv(x) + alpha2 * z + bias), through a cached compiled plan."""
    _enum(ConvFwdAlgo, algo, "convolution algorithm")
    if _count(workSpaceSize, "workSpaceSize") < 0:
        raise BadParmError(f"workSpaceSize must be >= 0, got {workSpaceSize}")
    activ = _live(activationDesc, miopenActivationDescriptor, "activation descriptor").desc
    if activ is None:
        raise BadParmError("activation descriptor: created but never set")
    alpha2 = _scalar(alpha2, "alpha2")
    api.conv_bias_activation(
        _required(x, "x"),
        _required(w, "w"),
        bias,
        conv=_conv_desc(convDesc),
        activation=activ,
        alpha1=_scalar(alpha1, "alpha1"),
        alpha2=alpha2,
        z=z,
        out=_required(y, "y"),
        handle=_handle(handle),
        x_desc=_tensor_desc(xDesc, "xDesc"),
        w_desc=_tensor_desc(wDesc, "wDesc"),
        z_desc=None if zDesc is None else _tensor_desc(zDesc, "zDesc"),
        bias_desc=None if biasDesc is None else _tensor_desc(biasDesc, "biasDesc"),
        y_desc=_tensor_desc(yDesc, "yDesc"),
    )
