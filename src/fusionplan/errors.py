"""Typed errors. Each carries the MIOpen status that ``fusionplan.miopen`` returns for it."""

from __future__ import annotations

from fusionplan.enums import Status


class FusionPlanError(Exception):
    """Base class of every error fusionplan raises on purpose."""

    status: Status = Status.UNKNOWN_ERROR


class BadParmError(FusionPlanError, ValueError):
    """An argument is inconsistent or invalid (miopenStatusBadParm)."""

    status = Status.BAD_PARM


class UnsupportedOpError(FusionPlanError):
    """The plan, or the operator being added, is not supported (miopenStatusUnsupportedOp)."""

    status = Status.UNSUPPORTED_OP


class NotCompiledError(BadParmError):
    """Execute was called on a plan that is not compiled for this handle."""


class TensorMismatchError(BadParmError):
    """A tensor does not match its descriptor, or a descriptor the compiled plan."""


class MissingArgumentError(BadParmError):
    """An operator of the plan has no runtime arguments in the arguments object."""


class InternalError(FusionPlanError):
    """fusionplan itself failed (a bug): reported, never hidden as success."""

    status = Status.INTERNAL_ERROR
