"""The vendor floor: a plan that cuDNN runs as one fused call, through torch's cuDNN bindings.

conv + bias and batch-norm inference (folded into the weights and bias) + ReLU, with an
optional residual (a scalar times y's prior contents, added before the ReLU), is one call of
``torch.cudnn_convolution_relu`` or ``torch.cudnn_convolution_add_relu``; its result is copied
into the caller's output. The solver is a candidate of find only: compile never picks it by
priority (``defer_why``), only where find measured it faster than fusionplan's own kernels
(``fusionplan.solvers.find``). An argument set that the one call cannot express (a blend on the
activation, a per-channel coefficient on the prior) runs through the folded stages in float32
(folded_toolkit), so every plan it accepts is computed right. So does a plan whose convolution
cuDNN finds no fused engine for, from then on.

Non-finite data would come out as cuDNN computes it, not as the chain does: its fused ReLU maps NaN
to 0, and its transform algorithms (Winograd, FFT) spread an infinite input over outputs that do not
read it. So each call also scans its input (and prior) on the device, setting a flag where it meets
a NaN or an infinity, and the kernel that copies cuDNN's result into y reads the flag: where it is
set, that kernel computes every output directly instead (a loop over the taps in float32, NaN kept
through the ReLU). No host wait: finite data costs one extra read of the input. The folded stages,
rarer, check on the host and run without cuDNN.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch

from fusionplan.core.enums import ActivationMode, DataType
from fusionplan.core.ops import AFFINE_OPS, ActivationForwardOp, ConvForwardOp, OpArgs, Phase
from fusionplan.oracle.torch_conv import is_channels_last
from fusionplan.runtime.codegen import triton_available
from fusionplan.runtime.folding import PerArgsCache, is_one, is_zero
from fusionplan.runtime.launch import BoundLaunches, current_raw_stream, needs_int64
from fusionplan.solvers.base import Kernel, PlanSpec, Solver
from fusionplan.solvers.conv_toolkit import shares_memory, triton_cdiv
from fusionplan.solvers.folded_toolkit import ActStage, ConvStage, FoldedConv, FoldedKernel

Tensor = torch.Tensor

#: the data types of cuDNN's fused convolution calls
_DTYPES = (DataType.HALF, DataType.BFLOAT16, DataType.FLOAT)


def cudnn_available() -> bool:
    return bool(torch.backends.cudnn.is_available())


@dataclass(frozen=True)
class OneCall:
    """An argument set as cuDNN's call takes it: relu(conv(x, weight) + bias + prior_coef * prior)."""

    weight: Tensor
    bias: Tensor | None
    prior_coef: float  # 0.0: no residual
    exact_weight: Tensor  # float32, for outputs computed directly (non-finite data)
    exact_bias: Tensor | None


@dataclass(frozen=True)
class Prepared:
    call: OneCall | None  # None: the folded stages
    finite: bool  # the folded parameters are finite (else the exact path: no cuDNN)


#: Words of the errors with which cuDNN turns down a fused call it has no engine for.
NO_ENGINE_WORDS = ("unable to find an engine", "CUDNN_STATUS_NOT_SUPPORTED")


def is_no_engine(exc: RuntimeError) -> bool:
    return any(words in str(exc) for words in NO_ENGINE_WORDS)


def all_finite(*tensors: Tensor | None) -> bool:
    """Whether every element is finite: a sum is, unless some element is NaN or infinite (or the
    sum overflows float32, which only sends finite data down the exact path)."""
    total = sum(t.sum(dtype=torch.float32) for t in tensors if t is not None)
    return math.isfinite(float(total))


def plan_shape_why_not(spec: PlanSpec) -> str | None:
    """None when the plan is conv, affine operators, ReLU: the chain cuDNN runs as one call."""
    ops = spec.ops
    if not isinstance(ops[0], ConvForwardOp):
        return "cuDNN's fused call starts with the convolution"
    last = ops[-1]
    if not isinstance(last, ActivationForwardOp) or last.mode != ActivationMode.RELU:
        return "cuDNN's fused call through torch ends with ReLU (conv + bias alone is two launches there)"
    if not all(isinstance(op, AFFINE_OPS) for op in ops[1:-1]):
        return "between the convolution and the ReLU, only bias and batch-norm inference fold into one call"
    return None


class CudnnKernel(FoldedKernel):
    solver_name = "cudnn"

    def __init__(self, spec: PlanSpec, tf32: bool) -> None:
        super().__init__(spec)
        # TF32 concerns float32 data only: the switch is not touched for half data (each toggle costs)
        self.tf32 = tf32 if spec.dtype == DataType.FLOAT else None
        self._prepared = PerArgsCache()
        self.conv = spec.ops[0].conv
        # the call is conv (+ folded affine operators) then the ReLU; other stage cuts run the stages
        self._one_stage_pair = [type(stage) for stage in self.stages] == [ConvStage, ActStage]
        self.no_engine = False  # cuDNN turned the one call down: the folded stages from then on
        self._bound = BoundLaunches()
        from fusionplan.solvers import cudnn_store  # Triton, imported where a kernel is built

        self._store_module = cudnn_store
        self._flags: dict[tuple, tuple[Tensor, int]] = {}  # per device and stream: (flag, last tag)

    def prepared(self, records: Sequence[OpArgs]) -> Prepared:
        """What the argument set needs each call: its one call, and whether its parameters are finite."""
        return self._prepared.get(records, self._prepare)

    def _prepare(self, records: Sequence[OpArgs]) -> Prepared:
        folded = [p for p in self.folded(records) if isinstance(p, FoldedConv)]
        finite = all_finite(*(t for p in folded for t in (p.weight, p.bias)))
        return Prepared(self._one_call(records) if finite else None, finite)

    def _one_call(self, records: Sequence[OpArgs]) -> OneCall | None:
        if not self._one_stage_pair:
            return None
        folded, act = self.folded(records)
        rest = folded.rest
        if not (is_one(rest.scale) and is_zero(rest.shift) and isinstance(rest.prior_coef, float)):
            return None
        if act.alpha != 1 or act.beta != 0:
            return None
        dtype = self.spec.dtype.torch_dtype
        weight = folded.weight.to(dtype)
        bias = None if folded.bias is None else folded.bias.to(dtype)
        if not all_finite(weight, bias):  # batch-norm's scale folded into 16-bit weights can overflow
            return None
        return OneCall(weight, bias, float(rest.prior_coef), folded.weight.float(), folded.bias)

    def run(self, x: Tensor, y: Tensor, records: Sequence[OpArgs], prior: Tensor | None) -> None:
        prepared = self.prepared(records)
        if prepared.finite:
            with self._handle_tf32():
                out = self._one_call_result(x, prepared.call, prior)
            if out is not None:
                self._store(out, y, x, prepared.call, prior)
                return
        if prepared.finite and all_finite(x, prior):
            with self._handle_tf32():
                super().run(x, y, records, prior)
            return
        with torch.backends.cudnn.flags(enabled=False):  # torch's convolution keeps NaN and Inf exact
            super().run(x, y, records, prior)

    def _store(self, out: Tensor, y: Tensor, x: Tensor, call: OneCall, prior: Tensor | None) -> None:
        """cuDNN's result into y, or, where the input or prior holds a NaN or an infinity, the
        outputs computed directly (one launch either way, after the scans)."""
        if _reads_what_it_writes(y, x, prior if call.prior_coef != 0 else None):
            staged = torch.empty_like(y)  # outputs computed directly read x around them: not in place
            self._store(out, staged, x, call, prior)
            y.copy_(staged)
            return
        store = self._store_module
        has_prior = call.prior_coef != 0
        p = prior if has_prior else y
        flag, tag = self._next_tag(y.device)
        self._scan(x, flag, tag)
        if has_prior:
            self._scan(p, flag, tag)
        bias = call.exact_bias if call.exact_bias is not None else call.exact_weight  # a stand-in, unread
        tensors = (out, y, x, call.exact_weight, bias, p, flag)
        # what the launch's other arguments and its compiled kernel depend on (the shapes are the plan's)
        key = (*(t.stride() for t in tensors[:6]), call.prior_coef, call.exact_bias is not None, has_prior)
        grid = (triton_cdiv(y.numel(), store.STORE_BLOCK), 1, 1)
        self._bound.launch(
            store.STORE, grid, key, tensors, tag, lambda: self._store_args(tensors, tag, call, has_prior)
        )

    def _store_args(self, tensors: tuple[Tensor, ...], tag: int, call: OneCall, has_prior: bool) -> list:
        out, y, x, weight, _, p, _ = tensors
        c = self.conv
        n, k, oh, ow = y.shape
        h, w = x.shape[2:]
        flat = out.stride() == y.stride() and _dense(y)
        return [
            *tensors, tag, call.prior_coef, y.numel(), k, oh, ow, h, w, weight.shape[1], k // c.groups,
            *out.stride(), *y.stride(), *x.stride(), *weight.stride(), *p.stride(),
            *c.strides, *c.pads, *c.dilations, *weight.shape[2:],
            self._store_module.STORE_BLOCK, flat, is_channels_last(y), call.exact_bias is not None, has_prior,
            needs_int64(out, y, x, p),
        ]  # fmt: skip

    def _scan(self, t: Tensor, flag: Tensor, tag: int) -> None:
        """flag = tag where ``t`` holds a NaN or an infinity (one read of t, no host wait)."""
        store = self._store_module
        grid = (triton_cdiv(t.numel(), store.SCAN_BLOCK), 1, 1)

        def args() -> list:
            flat = _dense(t)
            return [
                t,
                flag,
                tag,
                t.numel(),
                *t.shape[1:],
                *t.stride(),
                store.SCAN_BLOCK,
                flat,
                is_channels_last(t),
                needs_int64(t),
            ]

        self._bound.launch(store.SCAN, grid, ("scan", t.dtype, t.stride()), (t, flag), tag, args)

    def _next_tag(self, device: torch.device) -> tuple[Tensor, int]:
        """This stream's flag and the call's tag: calls on a stream run in order, so a flag equal
        to the call's tag was set by the call's own scans (no zeroing between calls)."""
        max_tag = self._store_module.MAX_TAG
        key = (device, current_raw_stream(device) if device.type == "cuda" else None)
        flag, tag = self._flags.get(key) or (torch.zeros(1, dtype=torch.int32, device=device), 0)
        tag = 1 if tag >= max_tag else tag + 1
        if tag == 1:
            flag.zero_()
        self._flags[key] = (flag, tag)
        return flag, tag

    def _one_call_result(self, x: Tensor, call: OneCall | None, prior: Tensor | None) -> Tensor | None:
        if call is None or self.no_engine or (call.prior_coef != 0 and prior is None):
            return None
        try:
            return self._call(x, call, prior)
        except RuntimeError as exc:
            if not is_no_engine(exc):
                raise
            self.no_engine = True
            return None

    def _handle_tf32(self) -> contextlib.AbstractContextManager:
        """cuDNN's TF32 switch as the handle has it (float32 data only: each toggle costs)."""
        if self.tf32 is None or self.tf32 == torch.backends.cudnn.allow_tf32:
            return contextlib.nullcontext()
        return _tf32(self.tf32)

    def _call(self, x: Tensor, call: OneCall, prior: Tensor | None) -> Tensor:
        c = self.conv
        if call.prior_coef == 0:
            return torch.cudnn_convolution_relu(x, call.weight, call.bias, c.strides, c.pads, c.dilations, c.groups)
        return torch.cudnn_convolution_add_relu(
            x, call.weight, prior.to(x.dtype), call.prior_coef, call.bias, c.strides, c.pads, c.dilations, c.groups
        )


def _reads_what_it_writes(y: Tensor, x: Tensor, prior: Tensor | None) -> bool:
    """Whether y shares memory with x, or with a prior that is not y itself (element for element)."""
    if shares_memory(x, y):
        return True
    return (
        prior is not None
        and shares_memory(prior, y)
        and (prior.data_ptr(), prior.stride()) != (y.data_ptr(), y.stride())
    )


def _dense(t: Tensor) -> bool:
    return t.is_contiguous() or t.is_contiguous(memory_format=torch.channels_last)


@contextlib.contextmanager
def _tf32(allowed: bool) -> Iterator[None]:
    """cuDNN's TF32 switch as the handle has it, for this call only."""
    saved = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = allowed
    try:
        yield
    finally:
        torch.backends.cudnn.allow_tf32 = saved


class CudnnSolver(Solver):
    name = "cudnn"
    family = "vendor"

    def why_not(self, spec: PlanSpec, handle) -> str | None:
        if handle.device.type != "cuda":
            return f"runs on CUDA devices only; the handle's device is {handle.device}"
        if not cudnn_available():
            return "this torch build has no cuDNN"
        why = triton_available()
        if why:
            return f"its store kernel needs Triton: {why}"
        if spec.phase != Phase.INFERENCE:
            return f"{spec.phase.value} plans have no fused cuDNN call"
        if spec.dtype not in _DTYPES:
            return f"cuDNN's fused call takes {', '.join(d.name for d in _DTYPES)}, not {spec.dtype.name}"
        return plan_shape_why_not(spec)

    def defer_why(self, spec: PlanSpec, handle) -> str | None:
        return "the vendor solver runs only where find measured it faster (find mode NORMAL, fusionplan-tune)"

    def build(self, spec: PlanSpec, handle) -> Kernel:
        return CudnnKernel(spec, handle.tf32_allowed())
