"""The fusion plan: add operators in data order, compile for a handle, execute many times.

Lifecycle (as MIOpen's): create with the input descriptor -> add operators (each derives its
geometry from the one before and is validated at once) -> compile (picks the first applicable
solver) -> set arguments in an ``OperatorArgs`` -> execute with new tensors and arguments as
often as needed. Adding an operator invalidates every compilation of the plan.
"""

from __future__ import annotations

import itertools
import logging
import threading
import weakref
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from fusionplan import solvers
from fusionplan.core.descriptors import ConvolutionDescriptor, TensorDescriptor, _strides_overlap, element_extent
from fusionplan.core.enums import PLAN_DTYPES, ActivationMode, BatchNormMode, ConvFwdAlgo, Direction
from fusionplan.core.errors import (
    BadParmError,
    FusionPlanError,
    InternalError,
    MissingArgumentError,
    NotCompiledError,
    TensorMismatchError,
    UnsupportedOpError,
    coerce_enum,
)
from fusionplan.core.handle import Handle
from fusionplan.core.ops import (
    ActivationBackwardOp,
    ActivationForwardOp,
    BatchNormBackwardOp,
    BatchNormForwardOp,
    BatchNormInferenceOp,
    BatchNormStatisticsOp,
    BiasForwardOp,
    ConvForwardOp,
    FusionOp,
    OpArgs,
    Phase,
    as_tensor,
    field_names,
)
from fusionplan.solvers import find
from fusionplan.solvers.base import Kernel, PlanSpec, Verdict, build_kernel

logger = logging.getLogger("fusionplan")

_plan_uids = itertools.count(1)


class OperatorArgs:
    """Runtime arguments of operators (of one plan or several), one record per operator."""

    def __init__(self) -> None:
        self._records: dict[FusionOp, OpArgs] = {}
        self.generation = 0  # changes with every set: executes that saw an older one check again

    def set(self, op: FusionOp, record: OpArgs) -> None:
        """Validate ``record`` against ``op`` and store it (replacing any earlier one)."""
        if not isinstance(op, FusionOp):
            raise BadParmError(f"expected a fusion operator, got {type(op).__name__}")
        self._records[op] = op.check_args(record)
        self.generation += 1

    def get(self, op: FusionOp) -> OpArgs | None:
        return self._records.get(op)

    def __contains__(self, op: object) -> bool:
        return op in self._records

    def __len__(self) -> int:
        return len(self._records)


_CHECKED_KEYS = 64  # call keys a plan remembers as checked, per argument set


@dataclass(frozen=True, eq=False)
class _Compiled:
    version: int
    solver: str
    kernel: Kernel
    spec: PlanSpec


def _order_error(plan_ops: list[FusionOp], new: type[FusionOp]) -> str | None:
    """Why operator class ``new`` cannot follow ``plan_ops`` (None when it can)."""
    if not plan_ops:
        if new is ActivationBackwardOp:
            return (
                "activation backward is only supported right after batch-norm backward "
                "(the backward of [batch-norm forward training, activation forward])"
            )
        return None
    if plan_ops[-1].phase == Phase.STATISTICS:
        return f"{plan_ops[-1].title} ends a plan; cannot add {new.title} after it"
    first = plan_ops[0]
    if new.phase == Phase.STATISTICS:
        if first.phase != Phase.INFERENCE:
            return f"{new.title} follows inference operators only (or starts a plan); the plan is {first.phase.value}"
        return None
    if first.phase == Phase.INFERENCE:
        if new.phase != Phase.INFERENCE:
            return f"cannot add {new.title} ({new.phase.value}) to an inference plan; plans do not mix phases"
        if new is ConvForwardOp and any(isinstance(op, ConvForwardOp) for op in plan_ops):
            return "a plan holds at most one convolution"
        return None
    if first.phase == Phase.TRAINING_FORWARD:
        if len(plan_ops) == 1 and new is ActivationForwardOp:
            return None
        return (
            "a training plan is [batch-norm forward training] or "
            f"[batch-norm forward training, activation forward]; cannot add {new.title}"
        )
    if len(plan_ops) == 1 and new is ActivationBackwardOp:
        return None
    return (
        "a backward plan is [batch-norm backward] or [batch-norm backward, activation backward]; "
        f"cannot add {new.title}"
    )


class FusionPlan:
    """A chain of operators over one input geometry, compiled into one kernel per handle."""

    def __init__(self, input_desc: TensorDescriptor, direction: Direction | int = Direction.VERTICAL) -> None:
        if not isinstance(input_desc, TensorDescriptor):
            raise BadParmError(f"input descriptor: expected a TensorDescriptor, got {type(input_desc).__name__}")
        self.direction = coerce_enum(Direction, direction, "fusion direction")
        if input_desc.ndim != 4:
            raise UnsupportedOpError(
                f"fusion plans take 4-d (N, C, H, W) input; got {input_desc.ndim}-d {input_desc.dims}"
            )
        if input_desc.dtype not in PLAN_DTYPES:
            names = ", ".join(t.name for t in PLAN_DTYPES)
            raise UnsupportedOpError(f"fusion plans compute in {names}; the input is {input_desc.dtype.name}")
        self.input_desc = input_desc
        self.uid = next(_plan_uids)
        self.conv_algo: ConvFwdAlgo | None = None
        self._ops: list[FusionOp] = []
        self._version = 0
        self._compiled: dict[int, _Compiled] = {}
        # per argument set, call key -> (validated records, needs a prior) of recent executes (see
        # execute); held weakly by the arguments: a call's records (its tensors, a training step's
        # activations) live no longer than the OperatorArgs the caller keeps
        self._checked: weakref.WeakKeyDictionary[OperatorArgs, dict[tuple, tuple[list[OpArgs], bool]]] = (
            weakref.WeakKeyDictionary()
        )
        self._lock = threading.Lock()

    # -- inspection ---------------------------------------------------------------------------
    @property
    def ops(self) -> tuple[FusionOp, ...]:
        return tuple(self._ops)

    @property
    def output_desc(self) -> TensorDescriptor:
        """Dims and dtype of the plan's output, packed in the input's layout (any layout may be passed)."""
        return self._ops[-1].output_desc if self._ops else self.input_desc

    @property
    def phase(self) -> Phase | None:
        return self.spec().phase if self._ops else None

    @property
    def combination(self) -> str:
        return "".join(op.letter for op in self._ops)

    def get_op(self, index: int) -> FusionOp:
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < len(self._ops):
            raise BadParmError(f"operator index {index!r} out of range: the plan has {len(self._ops)} operators")
        return self._ops[index]

    def spec(self) -> PlanSpec:
        if not self._ops:
            raise BadParmError("the plan has no operators")
        return PlanSpec(self.input_desc, tuple(self._ops))

    def describe(self) -> str:
        lines = [f"fusion plan {self.combination or '(empty)'}: input {self.input_desc} -> output {self.output_desc}"]
        lines += [f"  {op.index}: {op.describe()}: {op.input_desc.dims} -> {op.output_desc.dims}" for op in self._ops]
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"<FusionPlan {self.combination or '(empty)'} {self.input_desc} -> {self.output_desc}>"

    # -- adding operators ---------------------------------------------------------------------
    def _add(self, cls: type[FusionOp], *params: Any) -> FusionOp:
        with self._lock:
            if self.direction == Direction.HORIZONTAL:
                raise UnsupportedOpError(
                    "horizontal fusion is not implemented; create the plan with vertical direction"
                )
            why = _order_error(self._ops, cls)
            if why:
                raise UnsupportedOpError(why)
            op = cls(len(self._ops), self.output_desc, *params)
            self._ops.append(op)
            self._version += 1  # invalidates every compilation
            return op

    def add_conv_forward(self, conv: ConvolutionDescriptor, w_desc: TensorDescriptor) -> ConvForwardOp:
        return self._add(ConvForwardOp, conv, w_desc)

    def add_bias_forward(self, b_desc: TensorDescriptor) -> BiasForwardOp:
        return self._add(BiasForwardOp, b_desc)

    def add_batchnorm_inference(self, mode: BatchNormMode | int, param_desc: TensorDescriptor) -> BatchNormInferenceOp:
        return self._add(BatchNormInferenceOp, mode, param_desc)

    def add_activation_forward(self, mode: ActivationMode | int) -> ActivationForwardOp:
        if (
            self._ops
            and self._ops[0].phase == Phase.TRAINING_FORWARD
            and coerce_enum(ActivationMode, mode, "activation mode").has_slope
        ):
            raise UnsupportedOpError(
                "activation forward PRELU in a training plan: its backward plan has no output for the slope's gradient"
            )
        return self._add(ActivationForwardOp, mode)

    def add_batchnorm_forward(
        self, mode: BatchNormMode | int, running_mean_variance: bool = True
    ) -> BatchNormForwardOp:
        return self._add(BatchNormForwardOp, mode, running_mean_variance)

    def add_batchnorm_statistics(
        self, mode: BatchNormMode | int, running_mean_variance: bool = True
    ) -> BatchNormStatisticsOp:
        """The statistics of the chain's output that a training batch-norm after the plan would
        compute (saved mean and inverse variance, running statistics), the output unnormalized;
        the last operator of a plan (fusionplan's extension: [C, S], a convolution that emits its
        batch-norm's statistics)."""
        return self._add(BatchNormStatisticsOp, mode, running_mean_variance)

    def add_batchnorm_backward(self, mode: BatchNormMode | int) -> BatchNormBackwardOp:
        return self._add(BatchNormBackwardOp, mode)

    def add_activation_backward(self, mode: ActivationMode | int) -> ActivationBackwardOp:
        return self._add(ActivationBackwardOp, mode)

    # -- compile ------------------------------------------------------------------------------
    def explain(self, handle: Handle | None = None, backend: str | None = None) -> list[Verdict]:
        """Every solver's verdict on this plan for ``handle`` (default: a handle on the default device),
        with the time find measured for it, where it did."""
        handle = handle or Handle()
        spec = self.spec()
        return find.with_times(solvers.verdicts(spec, handle, backend), find.stored_times(spec, handle))

    def compile(self, handle: Handle, backend: str | None = None, solver: str | None = None) -> str:
        """Compile for ``handle`` with the first applicable solver (of the ``backend`` family, or the
        solver named ``solver``, when given); returns the solver's name. The solvers are tried
        fastest first where find measured them (find mode NORMAL measures those not yet measured:
        fusionplan.solvers.find), else in the registry's order. A solver whose kernel fails
        to build (a tile this device cannot hold) passes the plan to the next applicable one; when
        none builds, InternalError names each failure."""
        if not isinstance(handle, Handle):
            raise BadParmError(f"expected a Handle, got {type(handle).__name__}")
        with self._lock:
            spec = self.spec()
            version = self._version
        failures: list[tuple[str, Exception]] = []
        ordered = solvers.candidates(spec, handle, backend, solver)
        if solver is None:  # find's measured times order the solvers, where it measured them
            ordered = find.rank(spec, handle, ordered, lambda s: self._kernel(s, spec, handle))
        for chosen in ordered:
            try:
                kernel = self._kernel(chosen, spec, handle)
            except Exception as exc:  # e.g. a tile this device cannot hold: the next solver may run it
                failures.append((chosen.name, exc))
                logger.info(
                    "compile: %s could not build %s (%s: %s)", chosen.name, spec.combination, type(exc).__name__, exc
                )
                continue
            with self._lock:
                if version == self._version:
                    self._compiled[handle.uid] = _Compiled(version, chosen.name, kernel, spec)
            return chosen.name
        reasons = "; ".join(f"{name}: {type(exc).__name__}: {exc}" for name, exc in failures)
        raise InternalError(f"no applicable solver could build the plan {spec.combination}: {reasons}") from (
            failures[0][1]
        )

    @staticmethod
    def _kernel(chosen: solvers.Solver, spec: PlanSpec, handle: Handle) -> Kernel:
        """The handle's kernel of ``chosen`` for ``spec``, built (and kept by the handle) on first use."""
        # Everything that changes the generated kernel: the plan, TF32 and the find mode.
        key = (chosen.name, spec.signature(), handle.tf32_allowed(), handle.find_mode)
        with handle.lock:
            kernel = handle.kernels.get(key)
        if kernel is None:
            with handle.activate():
                kernel = build_kernel(chosen, spec, handle)
            with handle.lock:
                kernel = handle.kernels.setdefault(key, kernel)
        return kernel

    def is_compiled(self, handle: Handle) -> bool:
        entry = self._compiled.get(handle.uid)
        return entry is not None and entry.version == self._version

    def compiled_solver(self, handle: Handle) -> str:
        return self._entry(handle).solver

    def kernel_source(self, handle: Handle) -> str | None:
        """The generated source of the compiled kernel, where its solver generates any."""
        return self._entry(handle).kernel.source()

    def _entry(self, handle: Handle) -> _Compiled:
        entry = self._compiled.get(getattr(handle, "uid", None))
        if entry is None:
            raise NotCompiledError("the plan is not compiled for this handle: compile it first")
        if entry.version != self._version:
            raise NotCompiledError("the plan changed (an operator was added) since it was compiled: compile it again")
        return entry

    # -- execute ------------------------------------------------------------------------------
    def execute(
        self,
        handle: Handle,
        x: Any,
        y: Any,
        args: OperatorArgs,
        x_desc: TensorDescriptor | None = None,
        y_desc: TensorDescriptor | None = None,
        prior: Any = None,
    ) -> None:
        """Run the compiled plan on ``x`` into ``y``. Everything is checked first: on any error a
        typed exception is raised and nothing is written. ``prior`` replaces y's prior contents as
        the tensor that beta blends in (default: y itself)."""
        entry = self._entry(handle)
        # Repeated calls with tensors like an earlier call's and unchanged arguments reuse its checks:
        # the checks depend only on what the key holds (records are immutable once set). Several
        # keys are kept: a framework runs one plan for every layer of its shape, with their arguments.
        key = None
        if (
            isinstance(args, OperatorArgs)
            and isinstance(x, torch.Tensor)
            and isinstance(y, torch.Tensor)
            and (prior is None or isinstance(prior, torch.Tensor))
        ):
            prior_key = None if prior is None else _tensor_key(prior)
            key = (entry, handle.uid, args.generation, _tensor_key(x), _tensor_key(y), prior_key, x_desc, y_desc)
            checked = self._checked_call(args, key)
            if checked is not None:
                with _TypedErrors(entry.solver):
                    _rerun_checked(handle, entry.kernel, checked, x, y, prior)
                return
        spec = entry.spec
        x = as_tensor(x, "input")
        y = as_tensor(y, "output", writable=True)
        _check_input(spec, x, x_desc)
        _check_output(spec, y, y_desc)
        records = _records(spec, args)
        p = _prior(spec, records, y, prior)
        _check_devices(handle, x, y, p, records)
        _check_side_outputs(spec, records, x, y, p)
        if key is not None:
            calls = self._checked.setdefault(args, {})
            if len(calls) >= _CHECKED_KEYS:
                calls.clear()
            calls[key] = (records, p is not None)
        with torch.no_grad(), handle.activate(), _TypedErrors(entry.solver):
            entry.kernel.run(x, y, records, p)

    def execute_vouched(self, handle: Handle, x: torch.Tensor, y: torch.Tensor, records: Sequence[OpArgs]) -> None:
        """Run the compiled plan on records its caller vouches for, execute's checks skipped: an
        ``execute`` passed them on records of the same types, values and tensor layouts (fields
        equal but the tensors, which have the shapes, strides, dtypes and devices of that call's),
        x and y have that call's layouts, no operator blends a prior (beta 0), and every tensor
        that the checks found sharing no memory with another still shares none (the caller's own
        new allocations, and the same tensors as then). For fusionplan.torch's training chains,
        which allocate each call's outputs and statistics themselves."""
        entry = self._entry(handle)
        _vouched_call(handle, entry.solver, entry.kernel.run, x, y, records, None)

    def vouched_repeat(
        self, handle: Handle, x: torch.Tensor, y: torch.Tensor, records: Sequence[OpArgs]
    ) -> VouchedRepeat | None:
        """After a call of x into y on ``records`` (``execute`` or ``execute_vouched``): a
        ``VouchedRepeat`` that runs it again on other tensors, given in the kernel's slot order
        (``[y, x, *each record's tensors()]``), no records built, on the terms of
        ``execute_vouched`` (the caller vouches for the tensors' layouts, values and overlaps as
        there). None where the kernel keeps no repeat of the call."""
        entry = self._entry(handle)
        repeat = entry.kernel.repeat_with_tensors(x, y, records)
        return None if repeat is None else VouchedRepeat(self, entry.version, handle, entry.solver, repeat)

    def _checked_call(self, args: OperatorArgs, key: tuple) -> tuple[list[OpArgs], bool] | None:
        calls = self._checked.get(args)
        return None if calls is None else calls.get(key)

    def repeater(self, handle: Handle, x: torch.Tensor, y: torch.Tensor, args: OperatorArgs, prior=None):
        """After an ``execute`` with these tensors and arguments passed its checks: a ``Repeater``,
        called as ``run(x, y, prior)``, that repeats it for other tensors with the same shapes,
        strides, dtypes and devices (the caller vouches for those, as fusionplan.torch does for the
        outputs it allocates itself), skipping the checks. None when no such execute was checked.
        It checks that the arguments were not set again since."""
        entry = self._entry(handle)
        prior_key = None if prior is None else _tensor_key(prior)
        generation = args.generation
        key = (entry, handle.uid, generation, _tensor_key(x), _tensor_key(y), prior_key, None, None)
        checked = self._checked_call(args, key)
        if checked is None:
            return None
        return Repeater(handle, entry.kernel, checked, args, generation)


@dataclass(frozen=True)
class Repeater:
    """A checked call of a plan, repeatable on tensors like its own (see ``FusionPlan.repeater``)."""

    handle: Handle
    kernel: object
    checked: tuple  # (the records the call read, whether it read a prior)
    args: OperatorArgs
    generation: int

    def __call__(self, x: torch.Tensor, y: torch.Tensor, prior: torch.Tensor | None) -> bool:
        """False (nothing run) when the arguments changed: execute again instead."""
        if self.args.generation != self.generation:
            return False
        _rerun_checked(self.handle, self.kernel, self.checked, x, y, prior)
        return True

    def direct_launch(self):
        """The solver's ``launch.Repeat`` of this call, for a caller that vouches for more than the
        tensors' layout: the arguments' generation and their tensors' versions unchanged (it checks
        them itself), the handle's device current, and an output allocated afresh. None when the
        solver keeps no repeat of the call, or the handle has a stream of its own."""
        repeats = getattr(self.kernel, "_repeats", None)
        if repeats is None or self.handle.stream is not None:
            return None
        repeat = repeats.get(self.checked[0])
        return repeat if repeat is not None and repeat.records is self.checked[0] else None

    @property
    def reads_prior(self) -> bool:
        return self.checked[1]


class VouchedRepeat:
    """A call of a plan repeated on new tensors in the kernel's slot order (``FusionPlan.vouched_repeat``):
    ``repeat(tensors)`` says whether it ran (False: the plan changed, or the kernel could not
    repeat it for these tensors; the caller then runs the plan as usual)."""

    __slots__ = ("plan", "version", "handle", "solver", "repeat")

    def __init__(self, plan: FusionPlan, version: int, handle: Handle, solver: str, repeat) -> None:
        self.plan, self.version, self.handle, self.solver, self.repeat = plan, version, handle, solver, repeat

    def __call__(self, tensors: Sequence[torch.Tensor]) -> bool:
        if self.plan._version != self.version:
            return False
        return _vouched_call(self.handle, self.solver, self.repeat, tensors)


def _vouched_call(handle: Handle, solver: str, fn, *args):
    """``fn(*args)``, a kernel's work, with its errors typed and without autograd on the handle's
    device and stream; the contexts entered only where they would change something (the training
    chains' autograd function runs with grad mode off and the handle's device current)."""
    with _TypedErrors(solver):
        if torch.is_grad_enabled() or not handle.is_active():
            with torch.no_grad(), handle.activate():
                return fn(*args)
        return fn(*args)


class _TypedErrors:
    """A kernel's own failure (Triton's, torch's) raised as InternalError naming the solver: callers
    of either API see fusionplan's error types only. A class, not a generator: it wraps every
    kernel call, the training chains' per layer per step among them."""

    __slots__ = ("solver",)

    def __init__(self, solver: str) -> None:
        self.solver = solver

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind, exc, traceback) -> bool:
        if isinstance(exc, Exception) and not isinstance(exc, FusionPlanError):
            raise InternalError(f"solver {self.solver} failed: {type(exc).__name__}: {exc}") from exc
        return False


def _rerun_checked(handle: Handle, kernel, checked: tuple, x: torch.Tensor, y: torch.Tensor, prior) -> None:
    """Run a call whose checks passed before: ``checked`` is what they found (the records, and
    whether the plan reads a prior: y's contents unless ``prior`` is given)."""
    records, needs_prior = checked
    p = (y if prior is None else prior) if needs_prior else None
    if handle.is_active():
        kernel.rerun(x, y, records, p)
    else:
        with handle.activate():
            kernel.rerun(x, y, records, p)


def _tensor_key(t: torch.Tensor) -> tuple:
    return (t.shape, t.stride(), t.dtype, t.device)


def _check_input(spec: PlanSpec, x: torch.Tensor, x_desc: TensorDescriptor | None) -> None:
    plan_in = spec.input_desc
    if x_desc is not None:
        if not isinstance(x_desc, TensorDescriptor):
            raise BadParmError(f"input descriptor: expected a TensorDescriptor, got {type(x_desc).__name__}")
        if x_desc.dims != plan_in.dims or x_desc.dtype != plan_in.dtype or x_desc.stride_key() != plan_in.stride_key():
            raise TensorMismatchError(f"input descriptor {x_desc} does not match the compiled plan's input {plan_in}")
    why = (x_desc or plan_in).mismatch(x, "input tensor")
    if why:
        raise TensorMismatchError(why + (" (the compiled plan's input)" if x_desc is None else ""))


def _check_output(spec: PlanSpec, y: torch.Tensor, y_desc: TensorDescriptor | None) -> None:
    out = spec.output_desc
    if y_desc is not None:
        if not isinstance(y_desc, TensorDescriptor):
            raise BadParmError(f"output descriptor: expected a TensorDescriptor, got {type(y_desc).__name__}")
        if y_desc.dims != out.dims or y_desc.dtype != out.dtype:
            raise TensorMismatchError(
                f"output descriptor {y_desc} does not match the plan's output {out.dtype.name}{list(out.dims)}"
            )
        why = y_desc.mismatch(y, "output tensor")
    elif tuple(y.shape) != out.dims or y.dtype != out.dtype.torch_dtype:
        why = f"output tensor is {y.dtype}{list(y.shape)}; the plan's output is {out.dtype.torch_dtype}{list(out.dims)}"
    else:
        why = None
    if why:
        raise TensorMismatchError(why)
    if _strides_overlap(y.shape, y.stride()):
        raise TensorMismatchError(f"output tensor strides {tuple(y.stride())} make its elements overlap")


def _records(spec: PlanSpec, args: OperatorArgs) -> list[OpArgs]:
    if not isinstance(args, OperatorArgs):
        raise BadParmError(f"expected OperatorArgs, got {type(args).__name__}")
    records = []
    out_dims = spec.output_desc.dims
    for op in spec.ops:
        rec = args.get(op)
        if rec is None:
            raise MissingArgumentError(f"operator {op.index} ({op.title}) has no arguments set")
        if rec.beta != 0 and op.output_desc.dims != out_dims:
            raise BadParmError(
                f"operator {op.index} ({op.title}): beta={rec.beta} needs its result shaped like the output "
                f"{out_dims}, but it is {op.output_desc.dims}"
            )
        records.append(rec)
    return records


def _prior(spec: PlanSpec, records: Iterable[OpArgs], y: torch.Tensor, prior: Any) -> torch.Tensor | None:
    if not any(rec.beta != 0 for rec in records):
        return None
    if prior is None:
        return y
    p = as_tensor(prior, "prior")
    if tuple(p.shape) != spec.output_desc.dims or not p.dtype.is_floating_point:
        raise TensorMismatchError(
            f"prior is {p.dtype}{list(p.shape)}; expected a float tensor of {spec.output_desc.dims}"
        )
    return p


def _check_devices(
    handle: Handle, x: torch.Tensor, y: torch.Tensor, prior: torch.Tensor | None, records: list[OpArgs]
) -> None:
    dev = handle.device
    for name, t in (("input", x), ("output", y), ("prior", prior)):
        if t is not None and t.device != dev:
            raise TensorMismatchError(f"{name} is on {t.device}; the handle's device is {dev}")
    for i, rec in enumerate(records):
        if not rec.on_device(dev):
            devices = sorted({str(t.device) for t in rec.tensors()})
            raise TensorMismatchError(
                f"an argument of operator {i} is on {', '.join(devices)}; the handle's device is {dev}"
            )


def _byte_range(t: torch.Tensor) -> tuple[int, int]:
    """(first byte, one past the last byte) of the memory ``t`` spans. Addresses alone, not storages:
    two storages over one memory (from_blob, DLPack) overlap as surely as one."""
    start = t.data_ptr()
    if t.is_contiguous():
        return (start, start + t.nbytes) if t.nbytes else (0, 0)
    extent = element_extent(tuple(t.shape), t.stride())
    return (start, start + extent * t.element_size()) if extent else (0, 0)


def _check_side_outputs(
    spec: PlanSpec, records: list[OpArgs], x: torch.Tensor, y: torch.Tensor, prior: torch.Tensor | None
) -> None:
    """A side output (saved or running statistics, a parameter gradient) shares no memory with any
    other tensor of the call: the kernels read their arguments and write their side outputs in an
    order of their own, so an overlap would give results that depend on it."""
    side: list[tuple[object, tuple[int, int]]] = []  # (where the tensor is: an (op, field) pair, its bytes)
    others: list[tuple[object, torch.Tensor]] = [("the input", x), ("the output", y)]
    if prior is not None:
        others.append(("the prior", prior))
    for op, rec in zip(spec.ops, records):
        outputs = getattr(op, "side_outputs", ())
        for name in field_names(type(rec)):
            t = getattr(rec, name)
            if isinstance(t, torch.Tensor):
                if name in outputs:
                    side.append(((op, name), _byte_range(t)))
                else:
                    others.append(((op, name), t))
    if not side:
        return
    ranges = [(where, _byte_range(t)) for where, t in others]
    for i, (where, (start, end)) in enumerate(side):
        for other, (b0, b1) in [*ranges, *side[i + 1 :]]:
            if start < b1 and b0 < end:
                raise BadParmError(
                    f"{_where(where)} shares memory with {_where(other)}; side outputs must be tensors of their own"
                )


def _where(where: object) -> str:
    if isinstance(where, tuple):
        op, name = where
        return f"operator {op.index} ({op.title}) {name}"
    return str(where)
