"""The ``fusionplan::fused_chain`` custom operator that fused modules call (fusionplan.torch).

One call runs a conv -> [batch-norm] -> [+ residual] -> [activation] chain (or a batch-norm chain
without the convolution) as a fusion plan: a plan per input signature (shape, dtype, layout,
device), compiled once and cached in ``PLANS``; repeated calls with the same tensors take the
plan's direct launch. The fake (meta) implementation lets fused models trace under torch.compile
and torch.export.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.fx
import torch.nn.functional as F
from torch import library as torch_library

from fusionplan.api import default_handle
from fusionplan.core.activations import activation_forward
from fusionplan.core.caches import LruCache
from fusionplan.core.descriptors import ConvolutionDescriptor, TensorDescriptor
from fusionplan.core.enums import ActivationMode, BatchNormMode, DataType
from fusionplan.core.errors import BadParmError
from fusionplan.core.handle import Handle
from fusionplan.core.ops import ActivationArgs, BatchNormInferenceArgs, BiasArgs, ConvArgs
from fusionplan.plan import FusionPlan, OperatorArgs, Repeater
from fusionplan.torch_graph import hold

#: A chain's (plan, operators, handle, output memory format), by what selects it (_plan_key).
PLANS: LruCache[tuple, tuple[FusionPlan, tuple, Handle, torch.memory_format]] = LruCache("fused-chain plans", 1024)


def _conv_out_shape(x: torch.Tensor, w: torch.Tensor, stride, padding, dilation) -> list[int]:
    n, _, h, wd = x.shape
    k, _, r, s = w.shape
    oh = (h + 2 * padding[0] - dilation[0] * (r - 1) - 1) // stride[0] + 1
    ow = (wd + 2 * padding[1] - dilation[1] * (s - 1) - 1) // stride[1] + 1
    return [n, k, oh, ow]


def _memory_format(x: torch.Tensor) -> torch.memory_format:
    if x.dim() == 4 and x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous():
        return torch.channels_last
    return torch.contiguous_format


#: The op's schema: functional (a new output, nothing mutated or aliased), no autograd formula.
#: Defined and implemented directly in the "fusionplan" op namespace rather than through the
#: custom_op decorator: the same schema, fake kernel and tracing, without the decorator's per-call
#: wrappers (a small chain on a 2-core CPU: 56 -> 48.5 us per call, of which 29.5 us run the chain),
#: which torch.compile pays per chain.
_SCHEMA = (
    "fused_chain(Tensor x, Tensor? weight, Tensor? conv_bias, Tensor? bn_weight, Tensor? bn_bias, "
    "Tensor? bn_mean, Tensor? bn_var, float bn_eps, int[] stride, int[] padding, int[] dilation, "
    "int groups, int act_mode, float act_alpha, float act_beta, float act_gamma, Tensor? residual=None, "
    "Tensor? act_slope=None) -> Tensor"
)
_LIBRARY = torch_library.Library("fusionplan", "DEF")  # kept alive: the op lives as long as it
_LIBRARY.define(_SCHEMA)


def _fused_chain_impl(
    x: torch.Tensor,
    weight: torch.Tensor | None,
    conv_bias: torch.Tensor | None,
    bn_weight: torch.Tensor | None,
    bn_bias: torch.Tensor | None,
    bn_mean: torch.Tensor | None,
    bn_var: torch.Tensor | None,
    bn_eps: float,
    stride: list[int],
    padding: list[int],
    dilation: list[int],
    groups: int,
    act_mode: int,
    act_alpha: float,
    act_beta: float,
    act_gamma: float,
    residual: torch.Tensor | None = None,
    act_slope: torch.Tensor | None = None,
) -> torch.Tensor:
    """[conv2d (+bias)] -> [batch-norm inference] -> [+ residual] -> [activation, mode -1 = none], as
    one fusion plan; the residual, shaped like the output, is the plan's prior (beta = 1);
    ``act_slope``: PReLU's slopes. Eager calls of fused modules skip the dispatcher
    (FusedChain._run_prepared)."""
    params = (weight, conv_bias, bn_weight, bn_bias, bn_mean, bn_var, act_slope)
    hyper = (bn_eps, stride, padding, dilation, groups, act_mode, act_alpha, act_beta, act_gamma)
    key = _op_call_key(x, params, hyper, residual)
    seen = _OP_CALLS.get(key)
    out = None if seen is None else _repeat_new(seen, x, residual)  # a call like an earlier one
    if out is not None:
        return out
    try:
        out, repeat, _ = _run_new(x, params, hyper, residual)
    except BadParmError:  # a call the plan refuses (a filter larger than the padded input): eager's answer or error
        return _chain_in_torch(x, params, hyper, residual)
    if repeat is not None:
        _OP_CALLS.put(key, repeat)
    return out


def _chain_in_torch(x: torch.Tensor, params: tuple, hyper: tuple, residual: torch.Tensor | None) -> torch.Tensor:
    """The op's chain in torch's own operations (batch-norm on its running statistics)."""
    weight, conv_bias, bn_weight, bn_bias, bn_mean, bn_var, slope = params
    eps, stride, padding, dilation, groups, mode, alpha, beta, gamma = hyper
    h = x if weight is None else F.conv2d(x, weight, conv_bias, stride, padding, dilation, groups)
    if bn_weight is not None:
        h = F.batch_norm(h, bn_mean, bn_var, bn_weight, bn_bias, False, 0.0, eps)
    if residual is not None:
        h = h + residual
    if mode < 0:
        return h
    if mode == ActivationMode.PRELU:
        return F.prelu(h, slope)
    return activation_forward(ActivationMode(mode), h, alpha, beta, gamma)


_LIBRARY.impl("fused_chain", _fused_chain_impl, "CompositeExplicitAutograd")
fused_chain = torch.ops.fusionplan.fused_chain.default


#: The custom op's calls that can be repeated: (input and residual layout, parameter identities
#: and versions, scalar arguments) -> (output shape, strides, the plan's repeater). The
#: repeater holds the parameters through its arguments, so their addresses are not reused meanwhile.
_OP_CALLS: LruCache[tuple, tuple] = LruCache("fused-chain calls", 256)


def forget_derived_arguments() -> None:
    """Drop every fused chain's argument sets and repeatable calls, so that the next call derives
    them (folded batch-norm, repacked weights) again from the parameters' current values."""
    _ARGS.clear()
    _OP_CALLS.clear()


def _op_call_key(x: torch.Tensor, params: tuple, hyper: tuple, residual: torch.Tensor | None) -> tuple:
    scalars = tuple(tuple(h) if isinstance(h, list) else h for h in hyper)
    return (_layout(x), _layout(residual), tuple(_tensor_identity(t) for t in params), scalars)


def _layout(t: torch.Tensor | None) -> tuple | None:
    """What a plan's checks depend on in a tensor: shape, strides, dtype, device."""
    return None if t is None else (t.shape, t.stride(), t.dtype, t.device)


def _prepare(x: torch.Tensor, params: tuple, hyper: tuple, residual: torch.Tensor | None) -> tuple:
    """(plan, arguments, handle, output memory format) of a chain: ``params`` are the seven
    parameter tensors in the op's order (the activation's slope last), ``hyper`` its scalar
    arguments (FusedChain._hyperparameters)."""
    plan, ops, handle, fmt = _plan_for(x, *params[:3], *hyper[1:6])
    args = _args_for(plan, ops, *params[:6], hyper[0], *hyper[5:], residual is not None, params[6])
    return plan, args, handle, fmt


def _run_new(x: torch.Tensor, params: tuple, hyper: tuple, residual: torch.Tensor | None) -> tuple:
    """Run a chain into a new output tensor in the input's memory format: (the output, for calls
    like this one (output shape, strides, the plan's repeater) or None, the solver that ran it)."""
    plan, args, handle, fmt = _prepare(x, params, hyper, residual)
    hold((plan, args))
    out = torch.empty(plan.output_desc.dims, dtype=x.dtype, device=x.device, memory_format=fmt)
    plan.execute(handle, x, out, args, prior=residual)
    run = plan.repeater(handle, x, out, args, residual)
    return out, None if run is None else (out.shape, out.stride(), run), plan.compiled_solver(handle)


def _repeat_new(repeat: tuple, x: torch.Tensor, residual: torch.Tensor | None) -> torch.Tensor | None:
    """A call like the one ``repeat`` came from, into a new output; None when its arguments were
    set again since (the caller runs the call anew)."""
    shape, strides, run = repeat
    hold(run)
    out = torch.empty_strided(shape, strides, dtype=x.dtype, device=x.device)  # faster than by memory format
    return out if run(x, out, residual) else None


def _pointer_and_version(t: torch.Tensor | None) -> tuple:
    """(data pointer, version counter) of a parameter tensor; None for what it lacks."""
    if t is None:
        return (None, None)
    return (t.data_ptr(), None if t.is_inference() else t._version)


_current_device = getattr(torch._C, "_cuda_getDevice", None) or torch.cuda.current_device


def _direct(repeat: tuple, x: torch.Tensor):
    """For a call whose plan's solver keeps a direct launch (fusionplan.runtime.launch.Repeat), ``repeat``
    being (output shape, strides, the plan's repeater): a function ``(x, residual) -> output or
    None`` that allocates the output and launches the kernel, for calls the repeat path has checked
    (layouts, parameter objects and versions, eager). It checks what is left: the plan's arguments
    not set again, the input's device current, alignment and stream. None without such a launch."""
    shape, strides, run = repeat
    launch = run.direct_launch() if isinstance(run, Repeater) else None
    if launch is None or x.device.type != "cuda":
        return None
    args, generation, reads_prior, device_index = run.args, run.generation, run.reads_prior, x.device.index

    def direct(x: torch.Tensor, residual: torch.Tensor | None) -> torch.Tensor | None:
        if args.generation != generation or _current_device() != device_index:
            return None
        out = torch.empty_strided(shape, strides, dtype=x.dtype, device=x.device)
        return out if launch.launch_fresh(x, out, residual if reads_prior else None) else None

    return direct


def _eager_call(x: torch.Tensor) -> bool:
    """True for a plain call on a plain tensor: not traced by torch.compile or export, no dispatch
    mode watching. Such calls skip the dispatcher (tens of microseconds per call); all others go
    through the custom op, so that tracing sees it."""
    if type(x) is not torch.Tensor or torch.compiler.is_compiling():
        return False
    stack_depth = getattr(torch._C, "_len_torch_dispatch_stack", None)
    return stack_depth is not None and stack_depth() == 0


#: A chain's arguments, by plan, parameter identities and scalars (_args_for).
_ARGS: LruCache[tuple, OperatorArgs] = LruCache("fused-chain arguments", 1024)


def _tensor_identity(t: torch.Tensor | None) -> tuple | None:
    """Where a parameter lives and which version of it this is (inference tensors carry no version:
    a change of their contents in place under inference_mode is not seen)."""
    if t is None:
        return None
    return (t.data_ptr(), t.shape, t.dtype, None if t.is_inference() else t._version)


def _args_for(
    plan,
    ops,
    weight,
    conv_bias,
    bn_weight,
    bn_bias,
    bn_mean,
    bn_var,
    bn_eps,
    act_mode,
    act_alpha,
    act_beta,
    act_gamma,
    residual: bool = False,
    act_slope: torch.Tensor | None = None,
) -> OperatorArgs:
    """The arguments of one chain, made once per parameter set (so folded batch-norm and repacked
    weights are reused by every later call). With a residual, the operator before the activation
    blends in the prior: its output is op(h) + 1 * residual."""
    key = (
        id(plan),
        *(_tensor_identity(t) for t in (weight, conv_bias, bn_weight, bn_bias, bn_mean, bn_var, act_slope)),
        bn_eps,
        act_alpha,
        act_beta,
        act_gamma,
        residual,
    )
    args = _ARGS.get(key)
    if args is not None:
        return args
    records = []
    if weight is not None:
        records.append(ConvArgs(weight=weight))
        if conv_bias is not None:
            records.append(BiasArgs(bias=conv_bias))
    if bn_weight is not None:
        records.append(
            BatchNormInferenceArgs(scale=bn_weight, bias=bn_bias, mean=bn_mean, variance=bn_var, epsilon=bn_eps)
        )
    if residual:
        records[-1] = dataclasses.replace(records[-1], beta=1.0)
    if act_mode >= 0:
        records.append(
            ActivationArgs(activ_alpha=act_alpha, activ_beta=act_beta, activ_gamma=act_gamma, slope=act_slope)
        )
    args = OperatorArgs()
    for op, record in zip(ops, records):
        args.set(op, record)
    return _ARGS.put(key, args)


@torch_library.register_fake("fusionplan::fused_chain")
def _(
    x,
    weight,
    conv_bias,
    bn_weight,
    bn_bias,
    bn_mean,
    bn_var,
    bn_eps,
    stride,
    padding,
    dilation,
    groups,
    act_mode,
    act_alpha,
    act_beta,
    act_gamma,
    residual=None,
    act_slope=None,
):
    shape = list(x.shape) if weight is None else _conv_out_shape(x, weight, stride, padding, dilation)
    return x.new_empty(shape).to(memory_format=_memory_format(x))


def _plan_key(x, weight, conv_bias, bn_weight, stride, padding, dilation, groups, act_mode) -> tuple:
    """What selects a chain's plan. Raw shapes and strides: descriptors (validated, so not free)
    are built on a miss only."""
    return (
        x.shape,
        x.stride(),
        x.dtype,
        x.device,
        None if weight is None else (weight.shape, weight.stride(), weight.dtype),
        conv_bias is not None and conv_bias.dtype,
        bn_weight is not None and (bn_weight.dtype, bn_weight.dim()),
        tuple(stride),
        tuple(padding),
        tuple(dilation),
        groups,
        act_mode,
    )


def _plan_for(x, weight, conv_bias, bn_weight, stride, padding, dilation, groups, act_mode):
    """(plan, operators, handle, output memory format) of a chain, compiled on first use."""
    key = _plan_key(x, weight, conv_bias, bn_weight, stride, padding, dilation, groups, act_mode)
    hit = PLANS.get(key)
    if hit is not None:
        return hit
    entry = _new_plan(x, weight, conv_bias, bn_weight, stride, padding, dilation, groups, act_mode)
    entry[0].compile(entry[2])
    return PLANS.put(key, entry)


def _new_plan(x, weight, conv_bias, bn_weight, stride, padding, dilation, groups, act_mode) -> tuple:
    """A chain's (plan, operators, handle, output memory format), the plan not yet compiled."""
    x_desc = TensorDescriptor.from_tensor(x)
    w_desc = None if weight is None else TensorDescriptor.from_tensor(weight)  # any layout: no copy
    plan = FusionPlan(x_desc)
    ops = []
    if weight is not None:
        ops.append(
            plan.add_conv_forward(ConvolutionDescriptor(tuple(padding), tuple(stride), tuple(dilation), groups), w_desc)
        )
        if conv_bias is not None:
            ops.append(
                plan.add_bias_forward(
                    TensorDescriptor.packed(DataType.from_torch(conv_bias.dtype), (1, conv_bias.numel(), 1, 1))
                )
            )
    if bn_weight is not None:
        channels = plan.output_desc.dims[1]
        ops.append(
            plan.add_batchnorm_inference(
                BatchNormMode.SPATIAL,
                TensorDescriptor.packed(DataType.from_torch(bn_weight.dtype), (1, channels, 1, 1)),
            )
        )
    if act_mode >= 0:
        ops.append(plan.add_activation_forward(ActivationMode(act_mode)))
    return (plan, tuple(ops), default_handle(x.device), _memory_format(x))
