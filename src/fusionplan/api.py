"""The idiomatic Python API: plans built from tensors, exceptions instead of statuses.

    plan = fusionplan.Plan(x).conv(w, padding=1).bias(b).batchnorm(scale, shift, mean, var).relu()
    y = plan(x)                    # compiles on first use; later calls reuse the kernel
    plan.update(0, weight=w2)      # new arguments, no recompile

``conv_bias_activation`` is the one-call form, with a cache of compiled plans keyed by the
descriptors, for code that would otherwise rebuild the same plan on every call.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence
from typing import Any

import torch

from fusionplan.core.caches import LruCache
from fusionplan.core.descriptors import (
    ActivationDescriptor,
    ConvolutionDescriptor,
    TensorDescriptor,
    batchnorm_param_dims,
)
from fusionplan.core.enums import ActivationMode, BatchNormMode, Layout
from fusionplan.core.errors import BadParmError, coerce_enum
from fusionplan.core.handle import Handle, resolve_device
from fusionplan.core.ops import (
    ActivationArgs,
    BatchNormInferenceArgs,
    BatchNormStatisticsArgs,
    BiasArgs,
    ConvArgs,
    FusionOp,
    as_tensor,
)
from fusionplan.core.settings import Settings, _raw_environment
from fusionplan.plan import FusionPlan, OperatorArgs
from fusionplan.solvers.base import Verdict

_default_handles: dict[tuple[torch.device, Settings], Handle] = {}
_handles_lock = threading.Lock()


#: (a concrete device, the environment's raw settings) -> its default handle: the lookup of a call
#: with a tensor's device (a training chain's, every call) without resolving the device again.
_HANDLES_BY_DEVICE: LruCache[tuple, Handle] = LruCache("default handles by device", 64)


def default_handle(device: Any = None) -> Handle:
    """One shared handle per device (torch's current stream at each execute)."""
    concrete = type(device) is torch.device and (device.type != "cuda" or device.index is not None)
    if concrete:
        key = (device, _raw_environment())
        found = _HANDLES_BY_DEVICE.get(key)
        if found is not None:
            return found
    dev = resolve_device(device)
    settings = Settings.from_environment()  # a change of the environment's settings: another handle
    with _handles_lock:
        if (dev, settings) not in _default_handles:
            _default_handles[dev, settings] = Handle(dev, settings=settings)
        handle = _default_handles[dev, settings]
    if concrete:
        _HANDLES_BY_DEVICE.put(key, handle)
    return handle


def _pair(v: int | Sequence[int], what: str) -> tuple[int, int]:
    if isinstance(v, int):
        return (v, v)
    v = tuple(v)
    if len(v) != 2:
        raise BadParmError(f"{what}: expected an int or a pair, got {v!r}")
    return v  # type: ignore[return-value]


def _desc_of(value: Any, what: str) -> tuple[TensorDescriptor, torch.Tensor | None]:
    """A tensor gives its descriptor and becomes the bound argument; a descriptor binds nothing."""
    if isinstance(value, TensorDescriptor):
        return value, None
    t = as_tensor(value, what)
    return TensorDescriptor.from_tensor(t), t


def empty_like_layout(desc: TensorDescriptor, device: torch.device, layout: Layout | None) -> torch.Tensor:
    """A new tensor of ``desc``'s dims and dtype in ``layout`` (channels-last for NHWC)."""
    fmt = torch.channels_last if layout == Layout.NHWC else torch.contiguous_format
    return torch.empty(desc.dims, dtype=desc.dtype.torch_dtype, device=device, memory_format=fmt)


class Plan:
    """A fusion plan with its arguments and handle, built from tensors and called like a function.

    Every builder method returns the plan, so a chain reads in data order. Tensors passed to
    the builders become the operators' arguments; pass a TensorDescriptor instead to bind the
    argument later with ``update``. Use it as a context manager to compile on exit.
    """

    def __init__(
        self,
        x: Any,
        *,
        handle: Handle | None = None,
        device: Any = None,
        backend: str | None = None,
        out_layout: Layout | str | None = None,
    ) -> None:
        desc, tensor = _desc_of(x, "input")
        if handle is None:
            handle = default_handle(device if device is not None else (tensor.device if tensor is not None else None))
        self.handle = handle
        self.backend = backend
        self.core = FusionPlan(desc)
        self.args = OperatorArgs()
        self._fields: dict[FusionOp, dict[str, Any]] = {}
        self.out_layout = None if out_layout is None else coerce_enum(Layout, out_layout, "output layout")

    # -- building -----------------------------------------------------------------------------
    def _bind(self, op: FusionOp, record_type: type, **fields: Any) -> Plan:
        self._fields[op] = fields
        if all(v is not None for v in fields.values()):
            self.args.set(op, record_type(**fields))
        return self

    def conv(
        self,
        weight: Any,
        *,
        stride: int | Sequence[int] = 1,
        padding: int | Sequence[int] = 0,
        dilation: int | Sequence[int] = 1,
        groups: int = 1,
        alpha: float = 1.0,
        beta: float = 0.0,
    ) -> Plan:
        w_desc, w = _desc_of(weight, "weight")
        conv = ConvolutionDescriptor(
            _pair(padding, "padding"), _pair(stride, "stride"), _pair(dilation, "dilation"), groups
        )
        return self._bind(self.core.add_conv_forward(conv, w_desc), ConvArgs, weight=w, alpha=alpha, beta=beta)

    def bias(self, bias: Any, *, alpha: float = 1.0, beta: float = 0.0) -> Plan:
        b_desc, b = _desc_of(bias, "bias")
        return self._bind(self.core.add_bias_forward(b_desc), BiasArgs, bias=b, alpha=alpha, beta=beta)

    def batchnorm(
        self,
        scale: Any,
        bias: Any = None,
        mean: Any = None,
        variance: Any = None,
        *,
        eps: float = 1e-5,
        mode: BatchNormMode | str = "spatial",
        alpha: float = 1.0,
        beta: float = 0.0,
    ) -> Plan:
        mode = coerce_enum(BatchNormMode, mode, "batch-norm mode")
        desc, s = _desc_of(scale, "scale")
        dims = batchnorm_param_dims(mode, self.core.output_desc.dims)
        if s is not None and s.dim() != len(dims) and s.numel() == math.prod(dims):
            desc = TensorDescriptor.packed(desc.dtype, dims)  # flat parameters, as the MIOpen layer takes them
        op = self.core.add_batchnorm_inference(mode, desc)
        return self._bind(
            op,
            BatchNormInferenceArgs,
            scale=s,
            bias=bias,
            mean=mean,
            variance=variance,
            epsilon=eps,
            alpha=alpha,
            beta=beta,
        )

    def activation(
        self,
        mode: ActivationMode | str | int = "relu",
        *,
        activ_alpha: float = 1.0,
        activ_beta: float = 0.0,
        activ_gamma: float = 1.0,
        alpha: float = 1.0,
        beta: float = 0.0,
        slope: Any = None,
    ) -> Plan:
        """The activation ``mode``; PReLU takes ``slope`` (C values, or one for every channel; a
        tensor, bound now, or None, bound later by ``update``), the other modes none."""
        mode = coerce_enum(ActivationMode, mode, "activation mode")
        op = self.core.add_activation_forward(mode)
        fields = {"activ_alpha": activ_alpha, "activ_beta": activ_beta, "activ_gamma": activ_gamma}
        if mode.has_slope or slope is not None:  # a slope given to another mode: the record's check names it
            fields["slope"] = slope
        return self._bind(op, ActivationArgs, **fields, alpha=alpha, beta=beta)

    def relu(self) -> Plan:
        return self.activation(ActivationMode.RELU)

    def prelu(self, slope: Any = None) -> Plan:
        """PReLU: x where x > 0, else ``slope[c] * x`` (``slope``: C values, or one for every channel)."""
        return self.activation(ActivationMode.PRELU, slope=slope)

    def statistics(
        self,
        saved_mean: Any = None,
        saved_inv_variance: Any = None,
        running_mean: Any = None,
        running_variance: Any = None,
        *,
        exp_avg_factor: float = 0.1,
        eps: float = 1e-5,
        mode: BatchNormMode | str = "spatial",
    ) -> Plan:
        """The batch-norm statistics of the chain's output, written into the tensors given (the
        saved mean and inverse deviation, the running statistics updated with ``exp_avg_factor``
        and the unbiased variance); the output stays unnormalized. The plan's last operator."""
        mode = coerce_enum(BatchNormMode, mode, "batch-norm mode")
        running = {"running_mean": running_mean, "running_variance": running_variance}
        op = self.core.add_batchnorm_statistics(mode, any(v is not None for v in running.values()))
        given = {"saved_mean": saved_mean, "saved_inv_variance": saved_inv_variance, **running}
        tensors = {k: v for k, v in given.items() if v is not None}
        return self._bind(op, BatchNormStatisticsArgs, **tensors, exp_avg_factor=exp_avg_factor, epsilon=eps)

    def update(self, op: int | FusionOp, **fields: Any) -> Plan:
        """Replace some arguments of operator ``op`` (index or operator); no recompile."""
        op = self.core.get_op(op) if isinstance(op, int) else op
        merged = {**self._fields.get(op, {}), **fields}
        missing = [k for k, v in merged.items() if v is None]
        if missing:
            raise BadParmError(f"operator {op.index} ({op.title}) still lacks {', '.join(missing)}")
        self._fields[op] = merged
        self.args.set(op, op.args_type(**merged))
        return self

    # -- compiling and running ----------------------------------------------------------------
    def compile(self, solver: str | None = None) -> str:
        """Compile for the plan's handle; returns the chosen solver's name. ``solver`` names the
        solver to use (UnsupportedOpError, with its reason, when it cannot run the plan)."""
        return self.core.compile(self.handle, self.backend, solver)

    def explain(self) -> list[Verdict]:
        return self.core.explain(self.handle, self.backend)

    def kernel_source(self) -> str | None:
        self._ensure_compiled()
        return self.core.kernel_source(self.handle)

    @property
    def solver(self) -> str:
        self._ensure_compiled()
        return self.core.compiled_solver(self.handle)

    def _ensure_compiled(self) -> None:
        if not self.core.is_compiled(self.handle):
            self.compile()

    def __call__(self, x: Any, out: Any = None) -> torch.Tensor:
        self._ensure_compiled()
        if out is None:
            layout = self.out_layout or self.core.input_desc.layout
            out = empty_like_layout(self.core.output_desc, self.handle.device, layout)
        self.core.execute(self.handle, x, out, self.args)
        return as_tensor(out, "out")

    def __enter__(self) -> Plan:
        return self

    def __exit__(self, exc_type: Any, *rest: Any) -> None:
        if exc_type is None:
            self.compile()

    def __repr__(self) -> str:
        core = self.core
        return f"<fusionplan.Plan {core.combination} {core.input_desc} -> {core.output_desc} on {self.handle.device}>"


# ---- one call: y = act(alpha1 * conv(x) + alpha2 * z + bias) ---------------------------------------
PLAN_CACHE_SIZE = 256


def _cached_cba_plan(
    handle: Handle,
    x_desc: TensorDescriptor,
    w_desc: TensorDescriptor,
    conv: ConvolutionDescriptor,
    bias_desc: TensorDescriptor | None,
    mode: ActivationMode,
) -> tuple[FusionPlan, tuple[FusionOp, ...]]:
    cache = handle.cache("one-call plans", PLAN_CACHE_SIZE)
    key = (x_desc, w_desc, conv, bias_desc, mode)
    hit = cache.get(key)
    if hit is not None:
        return hit
    plan = FusionPlan(x_desc)
    ops = [plan.add_conv_forward(conv, w_desc)]
    if bias_desc is not None:
        ops.append(plan.add_bias_forward(bias_desc))
    ops.append(plan.add_activation_forward(mode))
    plan.compile(handle)
    return cache.put(key, (plan, tuple(ops)))


#: Descriptors made by recent one-call convolutions, by what makes them (a tensor's dtype, shape and
#: strides; a convolution's geometry; an activation's mode): descriptors are immutable, and making
#: and checking them was about 40 % of a call's host time.
_descriptors: LruCache[tuple, Any] = LruCache("one-call descriptors", 512)


def _cached_descriptor(key: tuple, make) -> Any:
    try:
        return _descriptors.get_or_make(key, make)
    except TypeError:  # an unhashable argument (a list of pads, say): made each time
        return make()


def _descriptor_of(t: torch.Tensor) -> TensorDescriptor:
    return _cached_descriptor(("tensor", t.dtype, t.shape, t.stride()), lambda: TensorDescriptor.from_tensor(t))


def _conv_descriptor(padding: Any, stride: Any, dilation: Any, groups: int) -> ConvolutionDescriptor:
    return _cached_descriptor(
        ("conv", padding, stride, dilation, groups),
        lambda: ConvolutionDescriptor(
            _pair(padding, "padding"), _pair(stride, "stride"), _pair(dilation, "dilation"), groups
        ),
    )


def _activation_descriptor(activation: ActivationMode | str) -> ActivationDescriptor:
    return _cached_descriptor(("activation", activation), lambda: ActivationDescriptor(activation))


#: The argument records of recent one-call convolutions, by plan, tensors and scalars: a call with
#: the weight and bias of an earlier one reuses its records, so the kernel finds its derived data
#: (repacked weights, folded parameters) and its bound launch again instead of rebuilding them (the
#: records hold the tensors, whose version counters tell the kernel of in-place changes).
ARGS_CACHE_SIZE = 64


def _cached_cba_args(
    handle: Handle,
    plan: FusionPlan,
    ops: tuple[FusionOp, ...],
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    alpha1: float,
    alpha2: float,
    act: ActivationDescriptor,
) -> OperatorArgs:
    key = (id(plan), id(weight), id(bias), alpha1, alpha2, act.alpha, act.beta, act.gamma)
    cache = handle.cache("one-call arguments", ARGS_CACHE_SIZE)
    hit = cache.get(key)
    if hit is not None and hit[0] is plan:  # the entry holds its plan and tensors: their ids name them
        return hit[1]
    args = OperatorArgs()
    args.set(ops[0], ConvArgs(weight=weight, alpha=alpha1, beta=alpha2))
    if bias is not None:
        args.set(ops[1], BiasArgs(bias=bias))
    args.set(ops[-1], ActivationArgs(activ_alpha=act.alpha, activ_beta=act.beta, activ_gamma=act.gamma))
    return cache.put(key, (plan, args))[1]


def conv_bias_activation(
    x: Any,
    weight: Any,
    bias: Any = None,
    *,
    stride: int | Sequence[int] = 1,
    padding: int | Sequence[int] = 0,
    dilation: int | Sequence[int] = 1,
    groups: int = 1,
    activation: ActivationMode | str | ActivationDescriptor = "relu",
    conv: ConvolutionDescriptor | None = None,
    alpha1: float = 1.0,
    alpha2: float = 0.0,
    z: Any = None,
    out: Any = None,
    handle: Handle | None = None,
    x_desc: TensorDescriptor | None = None,
    w_desc: TensorDescriptor | None = None,
    bias_desc: TensorDescriptor | None = None,
    z_desc: TensorDescriptor | None = None,
    y_desc: TensorDescriptor | None = None,
) -> torch.Tensor:
    """``act(alpha1 * conv(x, weight) + alpha2 * z + bias)`` as one fused kernel (plans are cached)."""
    x = as_tensor(x, "x")
    weight = as_tensor(weight, "weight")
    handle = handle or default_handle(x.device)
    conv = conv or _conv_descriptor(padding, stride, dilation, groups)
    act = activation if isinstance(activation, ActivationDescriptor) else _activation_descriptor(activation)
    x_desc = x_desc or _descriptor_of(x)
    w_desc = w_desc or _descriptor_of(weight)
    if bias is not None:
        bias = as_tensor(bias, "bias")
        bias_desc = bias_desc or _descriptor_of(bias)
    elif bias_desc is not None:
        raise BadParmError("a bias descriptor was given without a bias tensor")
    plan, ops = _cached_cba_plan(handle, x_desc, w_desc, conv, bias_desc, act.mode)
    prior = None
    if alpha2 != 0:
        if z is None:
            raise BadParmError("alpha2 != 0 needs the tensor z")
        prior = as_tensor(z, "z")
        why = z_desc.mismatch(prior, "z") if z_desc is not None else None
        if why:
            raise BadParmError(why)
    args = _cached_cba_args(handle, plan, ops, weight, bias, alpha1, alpha2, act)
    if out is None:
        out = empty_like_layout(plan.output_desc, handle.device, x_desc.layout)
    plan.execute(handle, x, out, args, x_desc=x_desc, y_desc=y_desc, prior=prior)
    return as_tensor(out, "out")
