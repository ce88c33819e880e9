"""Algebra shared by the fused solvers: runs of affine operators collapse into one.

Bias and batch-norm inference are affine per channel (per element for per-activation
batch-norm): a run of them, with each operator's alpha/beta blend, is one
``scale * h + shift + prior_coef * prior``. A plan is cut into stages at activations (and
at the convolution); each stage's coefficients are computed once per argument set.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from fusionplan.core.enums import BatchNormMode
from fusionplan.core.ops import (
    AFFINE_OPS,
    ActivationForwardOp,
    BatchNormInferenceArgs,
    BatchNormInferenceOp,
    BiasArgs,
    ConvForwardOp,
    FusionOp,
    OpArgs,
)

Tensor = torch.Tensor
Coef = float | Tensor  # a scalar, or a tensor broadcastable to (1, C, H, W)


def is_zero(c: Coef) -> bool:
    return isinstance(c, float) and c == 0.0


def is_one(c: Coef) -> bool:
    return isinstance(c, float) and c == 1.0


@dataclass
class Affine:
    """r = scale * h + shift + prior_coef * prior."""

    scale: Coef = 1.0
    shift: Coef = 0.0
    prior_coef: Coef = 0.0

    def then(self, scale: Coef, shift: Coef, alpha: float, beta: float) -> Affine:
        """Compose with the next operator: alpha * (scale * r + shift) + beta * prior."""
        carried = 0.0 if is_zero(self.prior_coef) else alpha * scale * self.prior_coef
        return Affine(
            scale=alpha * scale * self.scale,
            shift=alpha * (scale * self.shift + shift),
            prior_coef=carried + beta if not (is_zero(carried) and beta == 0) else 0.0,
        )


def op_affine(rec: OpArgs, dtype: torch.dtype) -> tuple[Coef, Coef]:
    """(scale, shift) of a bias or batch-norm inference operator's record, in ``dtype``."""
    if isinstance(rec, BiasArgs):
        return 1.0, rec.bias.to(dtype)
    assert isinstance(rec, BatchNormInferenceArgs)
    inv = torch.rsqrt(rec.variance.to(dtype) + rec.epsilon)
    scale = rec.scale.to(dtype) * inv
    return scale, rec.bias.to(dtype) - rec.mean.to(dtype) * scale


def compose(start: Affine, indices: Sequence[int], records: Sequence[OpArgs], dtype: torch.dtype) -> Affine:
    """``start`` followed by the affine operators at ``indices``."""
    a = start
    for i in indices:
        scale, shift = op_affine(records[i], dtype)
        a = a.then(scale, shift, records[i].alpha, records[i].beta)
    return a


# ---- stages: the plan cut at activations and at the convolution ------------------------------------
@dataclass(frozen=True)
class AffineStage:
    ops: tuple[int, ...]  # consecutive bias / batch-norm operators (after a convolution: it comes first)
    per_element: bool = False  # a per-activation batch-norm is among them
    conv: int | None = None  # the convolution whose alpha/beta start this stage


@dataclass(frozen=True)
class ActStage:
    op: int


Stage = AffineStage | ActStage


def _per_element(op: FusionOp) -> bool:
    return isinstance(op, BatchNormInferenceOp) and op.mode == BatchNormMode.PER_ACTIVATION


def pointwise_stages(ops: Sequence[FusionOp], conv: int | None = None) -> list[Stage]:
    """Stages of a run of pointwise operators; after a convolution, pass its index as ``conv``:
    the first stage then starts with the convolution's own alpha/beta."""
    stages: list[Stage] = [AffineStage((), False, conv)] if conv is not None else []
    for op in ops:
        last = stages[-1] if stages else None
        if isinstance(op, ActivationForwardOp):
            stages.append(ActStage(op.index))
        elif isinstance(op, AFFINE_OPS) and isinstance(last, AffineStage):
            stages[-1] = AffineStage(last.ops + (op.index,), last.per_element or _per_element(op), last.conv)
        elif isinstance(op, AFFINE_OPS):
            stages.append(AffineStage((op.index,), _per_element(op)))
        else:
            raise TypeError(f"{op.title} is not a pointwise operator")
    return stages


def stage_affine(stage: AffineStage, records: Sequence[OpArgs], dtype: torch.dtype) -> Affine:
    """The stage's coefficients for one argument set."""
    start = Affine()
    if stage.conv is not None:
        rec = records[stage.conv]
        start = Affine(float(rec.alpha), 0.0, float(rec.beta) if rec.beta != 0 else 0.0)
    return compose(start, stage.ops, records, dtype)


def split_at_conv(ops: Sequence[FusionOp]) -> tuple[list[FusionOp], ConvForwardOp | None, list[FusionOp]]:
    """(operators before the convolution, the convolution or None, operators after it)."""
    for i, op in enumerate(ops):
        if isinstance(op, ConvForwardOp):
            return list(ops[:i]), op, list(ops[i + 1 :])
    return list(ops), None, []


def args_fingerprint(records: Sequence[OpArgs]) -> tuple | object:
    """Version counters of every argument tensor: equal fingerprints of the same records mean the
    derived data (folded coefficients, repacked weights) is still valid. Records holding a tensor
    whose edits no version counter sees (ops.is_volatile: DLPack imports, inference tensors) get a
    fresh object, equal to nothing: what is derived from them is derived again at every execute."""
    if any(r.volatile for r in records):
        return object()
    return tuple(t._version for r in records for t in r._tensors)


class PerArgsCache:
    """Data derived from argument sets, recomputed when a record or one of its tensors changes.

    Several argument sets are kept (least recently used first out): one kernel serves every layer of
    the same shape, each with its own weights, and must not re-derive on every alternation.
    """

    def __init__(self, size: int = 32) -> None:
        self.size = size
        self._entries: OrderedDict[tuple, tuple] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, records: Sequence[OpArgs], derive) -> object:
        key = tuple(id(r) for r in records)
        versions = args_fingerprint(records)
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None and entry[1] == versions and all(a is b for a, b in zip(entry[0], records)):
                self._entries.move_to_end(key)
                return entry[2]
        value = derive(records)
        with self._lock:
            self._entries[key] = (tuple(records), versions, value)  # holding the records keeps their ids unique
            self._entries.move_to_end(key)
            while len(self._entries) > self.size:
                self._entries.popitem(last=False)
        return value
