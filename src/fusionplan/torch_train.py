"""Fused chains in training mode: batch-norm (batch statistics) + activation as fusion plans,
forward and backward, under autograd (fusionplan.torch's ``FusedChain`` in ``train()`` mode).

The convolution runs as the model's own module (cuDNN through torch, its gradients by autograd);
what follows it, the batch-norm with its running statistics and the activation, is one training
plan forward ([BatchNormForward, ActivationForward]) and one backward
([BatchNormBackward, ActivationBackward]): the backward recomputes the activation's input from
the batch-norm's input and the saved statistics, so the forward keeps only the batch-norm's input
and two per-channel vectors for it (eager keeps the batch-norm's output too). A residual add
before the activation is left to torch after the plan's batch-norm.

Running statistics are updated as ``nn.BatchNorm2d`` does: ``num_batches_tracked`` counted,
``momentum`` as the plan's exp_avg_factor, or the cumulative average (1 / batches) where it is
None; the running variance is the unbiased one.
"""

from __future__ import annotations

import torch
from torch import nn

from fusionplan.api import default_handle
from fusionplan.core.caches import LruCache
from fusionplan.core.descriptors import TensorDescriptor
from fusionplan.core.enums import ActivationMode, BatchNormMode
from fusionplan.core.errors import FusionPlanError
from fusionplan.core.handle import Handle
from fusionplan.core.ops import ActivationArgs, ActivationBackwardArgs, BatchNormBackwardArgs, BatchNormForwardArgs
from fusionplan.plan import FusionPlan, OperatorArgs
from fusionplan.torch_op import _layout

#: (direction, the batch-norm input's layout, activation mode, handle) -> (plan, operators,
#: handle), compiled on first use; or the reason the plans cannot run it.
_TRAINING_PLANS: LruCache[tuple, tuple | str] = LruCache("training-chain plans", 512)


def _refusal(bn: nn.BatchNorm2d, tensors: tuple, h: torch.Tensor) -> str | None:
    """Why a chain's batch-norm runs eagerly in training mode (None: it can run as plans);
    ``tensors``: the module's, as ``_bn_tensors`` reads them."""
    weight, _, running_mean, _, _ = tensors
    if not bn.track_running_stats or running_mean is None:
        return "batch-norm without running statistics"
    if not bn.affine:
        return "batch-norm without affine parameters"
    if weight.dtype != torch.float32 or running_mean.dtype != torch.float32:
        return f"{weight.dtype} batch-norm parameters (the training plans take fp32 parameters)"
    if h.dim() != 4 or h.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        return f"a {h.dim()}-d {h.dtype} batch-norm input"
    if type(h) is not torch.Tensor or h.device != weight.device:
        return "an input that is not a plain tensor on the parameters' device"
    if h.numel() <= h.shape[1]:  # nn.BatchNorm2d refuses it (its ValueError comes from the eager call)
        return "one value per channel"
    return None


def _bn_tensors(bn: nn.BatchNorm2d) -> tuple:
    """(weight, bias, running_mean, running_var, num_batches_tracked), read from the module's own
    dictionaries as attribute access does without nn.Module.__getattr__'s cost; by attribute where
    one is not there (a parametrization computes it)."""
    params, buffers = bn._parameters, bn._buffers
    try:
        return (
            params["weight"],
            params["bias"],
            buffers["running_mean"],
            buffers["running_var"],
            buffers.get("num_batches_tracked"),
        )
    except KeyError:
        return bn.weight, bn.bias, bn.running_mean, bn.running_var, getattr(bn, "num_batches_tracked", None)


def batchnorm_activation_training(
    bn: nn.BatchNorm2d, h: torch.Tensor, activation: tuple | None
) -> tuple[torch.Tensor | None, str]:
    """``activation(bn(h))`` in training mode as fusion plans, with autograd, the running
    statistics updated: (the result, the solver that ran it); or (None, why the plans cannot run
    it: the batch-norm's or its input's kind, or the plans' reason), nothing updated (the caller runs it eagerly)."""
    tensors = _bn_tensors(bn)
    why = _refusal(bn, tensors, h)
    if why is not None:
        return None, why
    mode, alpha, beta, gamma = activation if activation is not None else (-1, 1.0, 0.0, 1.0)
    handle = default_handle(h.device)
    pair = _plan_pair(h, int(mode), handle)
    if isinstance(pair, str):
        return None, pair
    forward, backward, solver = pair
    weight, bias, running_mean, running_var, batches = tensors
    factor, act = _exp_avg_factor(bn, batches), (alpha, beta, gamma)
    state = (running_mean, running_var, factor, float(bn.eps), act, forward, backward)
    return _BatchNormActivation.apply(h, weight, bias, state), solver


def _exp_avg_factor(bn: nn.BatchNorm2d, batches: torch.Tensor | None) -> float:
    """The running statistics' update factor of this call, ``num_batches_tracked`` counted first."""
    if batches is not None:
        batches.add_(1)
    if bn.momentum is None:
        return 1.0 / float(batches)
    return float(bn.momentum)


def _plans(direction: str, h: torch.Tensor, mode: int, handle: Handle) -> tuple | str:
    key = (direction, h.shape, h.stride(), h.dtype, mode, handle.uid)
    found = _TRAINING_PLANS.get(key)
    if found is None:
        found = _TRAINING_PLANS.put(key, _compiled(direction, h, mode, handle))
    return found


def _plan_pair(h: torch.Tensor, mode: int, handle: Handle) -> tuple | str:
    """(the forward plans, the backward plans, the forward's solver) for inputs like ``h``; or why
    either cannot run it. One lookup a call, where each direction's would be two."""
    key = ("pair", h.shape, h.stride(), h.dtype, mode, handle.uid)
    found = _TRAINING_PLANS.get(key)
    if found is None:
        forward, backward = _plans("forward", h, mode, handle), _plans("backward", h, mode, handle)
        why = next((f for f in (forward, backward) if isinstance(f, str)), None)
        found = _TRAINING_PLANS.put(key, why or (forward, backward, forward[0].compiled_solver(handle)))
    return found


def _compiled(direction: str, h: torch.Tensor, mode: int, handle: Handle) -> tuple | str:
    """A training plan for inputs like ``h`` and its handle, compiled; or why not."""
    try:
        plan = FusionPlan(TensorDescriptor.from_tensor(h))
        if direction == "forward":
            ops = [plan.add_batchnorm_forward(BatchNormMode.SPATIAL, True)]
            if mode >= 0:
                ops.append(plan.add_activation_forward(ActivationMode(mode)))
        else:
            ops = [plan.add_batchnorm_backward(BatchNormMode.SPATIAL)]
            if mode >= 0:
                ops.append(plan.add_activation_backward(ActivationMode(mode)))
        plan.compile(handle)
    except FusionPlanError as exc:
        return f"{type(exc).__name__}: {exc}"
    return plan, tuple(ops), handle, set(), {}


def _channels(t: torch.Tensor) -> torch.Tensor:
    """A per-channel vector as the plans' (1, C, 1, 1) parameter shape (a view: writes reach it)."""
    return t.view(1, -1, 1, 1)


class _BatchNormActivation(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h, weight, bias, state):
        # the other arguments in one tuple: autograd's apply looks at each argument it is given
        running_mean, running_var, factor, eps, act, forward, backward = state
        channels = h.shape[1]
        stats = torch.empty(2, 1, channels, 1, 1, dtype=torch.float32, device=h.device)
        y = torch.empty_like(h)  # h's layout: the plan's output descriptor
        mean, inv = stats.unbind(0)
        module = (weight, bias, running_mean, running_var)

        def slots(views: tuple) -> list:  # the order of the records' tensors (Kernel.repeat_with_tensors)
            return [y, h, views[0], views[1], mean, inv, views[2], views[3]]

        def records(views: tuple) -> list:
            found = [
                BatchNormForwardArgs(
                    scale=views[0], bias=views[1], saved_mean=mean, saved_inv_variance=inv,
                    running_mean=views[2], running_variance=views[3], exp_avg_factor=factor, epsilon=eps,
                )
            ]  # fmt: skip
            if len(forward[1]) > 1:
                found.append(ActivationArgs(activ_alpha=act[0], activ_beta=act[1], activ_gamma=act[2]))
            return found

        _run(forward, (_layout(h), _identities(module), factor, eps, act), h, y, module, slots, records)
        ctx.save_for_backward(h, weight, bias, mean, inv)  # the two views: no unbind in the backward
        ctx.act, ctx.backward = act, backward
        return y

    @staticmethod
    def backward(ctx, dy):
        h, weight, bias, mean, inv = ctx.saved_tensors
        plans, dy = _backward_plans(ctx.backward, dy, h)
        dx = torch.empty_like(h)
        grads = torch.empty(2, 1, h.shape[1], 1, 1, dtype=torch.float32, device=h.device)
        dscale, dshift = grads.unbind(0)
        act = ctx.act

        def slots(views: tuple) -> list:
            return [dx, dy, h, views[0], views[1], dscale, dshift, mean, inv]

        def records(views: tuple) -> list:
            found = [
                BatchNormBackwardArgs(
                    x=h, scale=views[0], bias=views[1], result_scale_diff=dscale, result_bias_diff=dshift,
                    saved_mean=mean, saved_inv_variance=inv,
                )
            ]  # fmt: skip
            if len(plans[1]) > 1:
                found.append(ActivationBackwardArgs(activ_alpha=act[0], activ_beta=act[1], activ_gamma=act[2]))
            return found

        module = (weight, bias)
        _run(plans, (_layout(dy), _layout(h), _identities(module), act), dy, dx, module, slots, records)
        dweight = dscale.view(-1).to(weight.dtype) if ctx.needs_input_grad[1] else None
        dbias = dshift.view(-1).to(bias.dtype) if ctx.needs_input_grad[2] else None
        return dx, dweight, dbias, None


#: Calls the checks passed on, per plan, a set of ``_call_key``s; and the repeats bound, per plan,
#: by ``_run``'s key (both bounded: cleared when full).
_CHECKED_LIMIT = 256


def _run(compiled: tuple, key: tuple, x: torch.Tensor, y: torch.Tensor, module: tuple, slots, records) -> None:
    """One call of a training plan: the plan's repeat bound for ``key`` where there is one, on
    ``slots(views)`` (the call's tensors, no records built); else ``records(views)`` through
    ``_execute``, and a repeat bound for the next calls with this key. ``views``: the module
    tensors as the plans' parameter shape, kept with the repeat.

    ``key`` holds everything the call's checks depend on but the tensors the caller allocates
    afresh: x's layout (y, the statistics and the gradients are laid out by it and by the channel
    count), the module tensors by identity, address and layout, and the records' scalars."""
    plan, _, handle, _, repeats = compiled
    found = repeats.get(key)
    if found is not None and found[0](slots(found[1])):
        return
    views = tuple(_channels(t.detach()) for t in module)
    built = records(views)
    _execute(compiled, x, y, built, module)
    if found is None:
        repeat = plan.vouched_repeat(handle, x, y, built)
        if repeat is not None and _same_tensors(slots(views), [y, x, *(t for r in built for t in r.tensors())]):
            if len(repeats) >= _CHECKED_LIMIT:
                repeats.clear()
            repeats[key] = (repeat, views)


def _same_tensors(a: list, b: list) -> bool:
    """Whether two lists hold the same tensor objects in the same order (the slots as the kernel
    orders them)."""
    return len(a) == len(b) and all(s is t for s, t in zip(a, b))


def _identities(tensors: tuple) -> tuple:
    """Module tensors as a call's key holds them: identity, address and layout (a parameter's
    ``.data`` set anew, or resized in place, changes one of them)."""
    return tuple([(id(t), t.data_ptr(), t.shape, t.stride(), t.dtype) for t in tensors])


def _execute(compiled: tuple, x: torch.Tensor, y: torch.Tensor, records: list, module_tensors: tuple) -> None:
    """One call of a training plan on the records the autograd function built: checked by
    ``execute`` the first time a call of its kind comes (the records' values and layouts, x's and
    y's, and which module tensors it reads), after that run with the checks skipped. What the
    checks found depends on nothing else: every other tensor of the call (y, the statistics, the
    gradients) is allocated afresh by the caller, and the plans blend no prior."""
    plan, ops, handle, checked, _ = compiled
    key = _call_key(x, y, records, module_tensors)
    if key in checked:
        plan.execute_vouched(handle, x, y, records)
        return
    args = OperatorArgs()
    for op, record in zip(ops, records):
        args.set(op, record)
    plan.execute(handle, x, y, args)
    if len(checked) >= _CHECKED_LIMIT:
        checked.clear()
    checked.add(key)


def _call_key(x: torch.Tensor, y: torch.Tensor, records: list, module_tensors: tuple) -> tuple:
    """What a training plan's checks of a call depend on. The module's tensors by identity and
    address (they may share memory with one another, as a test's aliasing might; the same tensors
    at the same addresses share what they shared when checked)."""
    layouts = tuple(r.layout_key() for r in records)
    modules = tuple((id(t), t.data_ptr()) for t in module_tensors)
    return (_layout(x), _layout(y), layouts, modules)


def _backward_plans(compiled: tuple, dy: torch.Tensor, h: torch.Tensor) -> tuple[tuple, torch.Tensor]:
    """(the backward plans, the gradient as they read it): ``compiled`` where the gradient has
    the forward input's layout; else the plans for the gradient's own layout (the plan reads the
    forward input in its layout), with no copy of the gradient (an activation's worth of memory
    more at the step's peak); else ``compiled`` and the gradient copied to h's layout and dtype."""
    if dy.dtype == h.dtype:
        if compiled[0].input_desc.same_strides(dy.stride()):
            return compiled, dy
        found = _plans("backward", dy, _ops_mode(compiled[1]), compiled[2])
        if not isinstance(found, str):
            return found, dy
    return compiled, _like(dy, h)


def _ops_mode(ops: tuple) -> int:
    """The activation mode of a backward plan's operators (-1: none)."""
    return int(ops[1].mode) if len(ops) > 1 else -1


def _like(t: torch.Tensor, model: torch.Tensor) -> torch.Tensor:
    """``t`` with ``model``'s strides and dtype (the backward plan's input descriptor is the
    forward's): itself where it has them, else a copy."""
    if t.stride() == model.stride() and t.dtype == model.dtype:
        return t
    out = torch.empty_like(model)
    return out.copy_(t)
