"""The MIOpen layer's opaque objects (handles, descriptors, plans, argument sets) and the checks
that turn them into the core's objects; fusionplan.miopen exports the classes under MIOpen's names."""

from __future__ import annotations

from typing import Any

from fusionplan.core.descriptors import ActivationDescriptor, ConvolutionDescriptor, TensorDescriptor, finite_float
from fusionplan.core.errors import BadParmError
from fusionplan.core.handle import Handle
from fusionplan.core.ops import FusionOp
from fusionplan.plan import FusionPlan, OperatorArgs


class _Object:
    """Base of the opaque handles; using one after its destroy call is BadParm."""

    kind = "object"
    destroyed = False

    def destroy(self) -> None:
        self.destroyed = True


def _live(obj: Any, cls: type, what: str) -> Any:
    if not isinstance(obj, cls):
        raise BadParmError(f"{what}: expected a {cls.kind}, got {type(obj).__name__}")
    if obj.destroyed:
        raise BadParmError(f"{what}: the {cls.kind} was destroyed")
    return obj


class miopenHandle(_Object):
    kind = "handle (miopenCreate)"

    def __init__(self, core: Handle) -> None:
        self.core = core


class miopenTensorDescriptor(_Object):
    kind = "tensor descriptor (miopenCreateTensorDescriptor)"

    def __init__(self) -> None:
        self.desc: TensorDescriptor | None = None


class miopenConvolutionDescriptor(_Object):
    kind = "convolution descriptor (miopenCreateConvolutionDescriptor)"

    def __init__(self) -> None:
        self.desc: ConvolutionDescriptor | None = None
        self.groups = 1


class miopenActivationDescriptor(_Object):
    kind = "activation descriptor (miopenCreateActivationDescriptor)"

    def __init__(self) -> None:
        self.desc: ActivationDescriptor | None = None


class miopenFusionPlanDescriptor(_Object):
    kind = "fusion plan (miopenCreateFusionPlan)"

    def __init__(self, core: FusionPlan) -> None:
        self.core = core


class miopenOperatorArgs(_Object):
    kind = "operator arguments object (miopenCreateOperatorArgs)"

    def __init__(self) -> None:
        self.core = OperatorArgs()


miopenFusionOpDescriptor = FusionOp  # operators are the core's own objects


def _handle(h: Any) -> Handle:
    return _live(h, miopenHandle, "handle").core


def _tensor_desc(d: Any, what: str) -> TensorDescriptor:
    if isinstance(d, TensorDescriptor):
        return d
    desc = _live(d, miopenTensorDescriptor, what).desc
    if desc is None:
        raise BadParmError(f"{what}: the tensor descriptor was created but never set")
    return desc


def _conv_desc(d: Any) -> ConvolutionDescriptor:
    if isinstance(d, ConvolutionDescriptor):
        return d
    conv = _live(d, miopenConvolutionDescriptor, "convolution descriptor")
    if conv.desc is None:
        raise BadParmError("convolution descriptor: created but never initialized")
    return conv.desc


def _plan(p: Any) -> FusionPlan:
    return _live(p, miopenFusionPlanDescriptor, "fusion plan").core


def _args(a: Any) -> OperatorArgs:
    return _live(a, miopenOperatorArgs, "operator arguments").core


def _op(op: Any, what: str) -> FusionOp:
    if not isinstance(op, FusionOp):
        raise BadParmError(f"{what}: expected a fusion operator (miopenCreateOp*), got {type(op).__name__}")
    return op


def _scalar(value: Any, what: str) -> float:
    if value is None:
        raise BadParmError(f"{what}: a number is required (NULL is not accepted)")
    return finite_float(value, what)


def _count(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadParmError(f"{what}: expected an integer, got {value!r}")
    return value
