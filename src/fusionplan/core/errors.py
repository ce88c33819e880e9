"""Typed errors. Each carries the MIOpen status that ``fusionplan.miopen`` returns for it."""

from __future__ import annotations

import enum

from fusionplan.core.enums import Status


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


def coerce_enum(enum_cls: type[enum.IntEnum], value: object, what: str) -> enum.IntEnum:
    """Turn an int, a member or a (case-insensitive) member name into ``enum_cls``.

    Raises BadParmError naming ``what`` and the accepted values when it is none of them.
    """
    if isinstance(value, enum_cls):
        return value
    if isinstance(value, str):
        key = value.strip().upper().replace("-", "_")
        if key in enum_cls.__members__:
            return enum_cls[key]
    elif isinstance(value, int) and not isinstance(value, bool):
        try:
            return enum_cls(value)
        except ValueError:
            pass
    accepted = ", ".join(f"{m.name}={m.value}" for m in enum_cls)
    raise BadParmError(f"{what}: {value!r} is not a valid {enum_cls.__name__} ({accepted})")
