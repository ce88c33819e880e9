"""PyTorch integration: fuse a model's conv -> batch-norm -> activation chains in one call.

    fused = fusionplan.torch.fuse(model.eval())
    y = fused(x)                          # same outputs; each chain runs as one fusion plan
    print(fused.fusion_report)            # what was fused, what was skipped and why

The model is traced with torch.fx. Conv2d -> [BatchNorm2d] -> [+ residual] -> [activation] chains
and BatchNorm2d -> [+ residual] -> activation chains (module or functional forms; the residual
add of a ResNet block becomes the plan's prior with beta = 1) are replaced by modules that call
the ``fusionplan::fused_chain`` custom operator, which compiles a plan per input signature
(shape, dtype, layout, device) and caches it. The original submodules stay where they were: the
parameters are the model's own, ``state_dict`` keys are unchanged, ``.to(device, dtype,
memory_format)`` moves them. The custom operator has a fake (meta) implementation, so the fused
model traces under torch.compile and torch.export. In training mode (``fused.train()``, or a
model fused in training mode) the chains use batch statistics and train through autograd
(fusionplan.torch_train).
"""

from __future__ import annotations

import copy
import operator
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx
from torch import nn

from fusionplan.compiling import compile_all, on_gpu, resolve_workers, run_on_threads
from fusionplan.core.activations import activation_forward
from fusionplan.core.enums import ActivationMode
from fusionplan.core.errors import BadParmError, UnsupportedOpError
from fusionplan.core.settings import Settings
from fusionplan.torch_activations import activation_node, unfused_activation
from fusionplan.torch_graph import GraphedCalls, graphable, hold
from fusionplan.torch_op import (
    PLANS,
    _conv_out_shape,
    _direct,
    _eager_call,
    _layout,
    _memory_format,
    _new_plan,
    _plan_key,
    _pointer_and_version,
    _repeat_new,
    _run_new,
    forget_derived_arguments,
    fused_chain,
)
from fusionplan.torch_train import batchnorm_activation_training


# ---- compiling a model's plans ahead of its calls (FusedModel.prepare) ------------------------------------
@dataclass
class _Recording:
    """What a call of a preparing model needs: the plans not yet compiled (by plan key), and each
    chain's call (chain, input layout, residual layout), repeated on stand-in tensors once the
    plans are compiled, so that what a plan compiles at its first execute (a specialization that
    reads a prior, the kernels that fold and pack parameters) is compiled then too. A call is
    (chain, input layout, residual layout, plan key)."""

    plans: dict[tuple, tuple] = field(default_factory=dict)
    calls: list[tuple] = field(default_factory=list)


#: While a model is prepared, what its calls need (FusedModel._record).
_RECORDING: ContextVar[_Recording | None] = ContextVar("fusionplan_recording", default=None)


def _record_call(chain: FusedChain, x: torch.Tensor, residual: torch.Tensor | None) -> None:
    recording = _RECORDING.get()
    plan_args = (x, *chain._params()[:3], *chain._hyperparameters()[1:6])
    key = _plan_key(*plan_args)
    if key not in PLANS and key not in recording.plans:
        recording.plans[key] = _new_plan(*plan_args)
    residual_layout = None if residual is None else _stand_in_layout(residual)
    recording.calls.append((chain, _stand_in_layout(x), residual_layout, key))


def _stand_in_layout(t: torch.Tensor) -> tuple:
    return (t.shape, t.stride(), t.dtype, t.device)


def _stand_in(layout: tuple) -> torch.Tensor:
    """A tensor of ``layout`` (shape, strides, dtype, device), zeros."""
    shape, strides, dtype, device = layout
    return torch.empty_strided(shape, strides, dtype=dtype, device=device).zero_()


def _compile_recorded(recording: _Recording, workers: int | None, progress: bool | None) -> None:
    """Compile the recorded plans, every handle's on ``workers`` threads (the compiled ones are
    cached for the chains' calls even where others failed, whose error is raised), each plan's
    recorded calls repeated on stand-in tensors on the thread that compiled it as soon as it has
    compiled (what those first executes compile overlaps the other plans' compiles); the calls
    of plans compiled before, on as many threads."""
    calls_of: dict[tuple, list[int]] = {}
    for index, call in enumerate(recording.calls):
        calls_of.setdefault(call[3], []).append(index)

    def first_execute(index: int) -> None:
        chain, x_layout, residual_layout, _ = recording.calls[index]
        residual = None if residual_layout is None else _stand_in(residual_layout)
        with torch.no_grad():
            _, _, solver = _run_new(_stand_in(x_layout), chain._params(), chain._hyperparameters(), residual)
        chain.solvers.add(solver)

    by_handle: dict[int, list[tuple]] = {}
    for key, entry in recording.plans.items():
        by_handle.setdefault(entry[2].uid, []).append((key, entry))
    for items in by_handle.values():

        def compiled(i: int, items: list[tuple] = items) -> None:
            key, entry = items[i]
            PLANS.setdefault(key, entry)
            for index in calls_of.get(key, ()):
                first_execute(index)

        handle = items[0][1][2]
        try:
            compile_all([entry[0] for _, entry in items], handle, workers=workers, progress=progress, then=compiled)
        finally:
            for key, entry in items:
                if entry[0].is_compiled(handle):
                    PLANS.setdefault(key, entry)
    earlier = [i for key, indices in calls_of.items() if key not in recording.plans for i in indices]
    settings = Settings.from_environment()
    gpu = any(on_gpu(recording.calls[i][1][3].type) for i in earlier) and settings.compile_processes
    run_on_threads(first_execute, earlier, resolve_workers(workers, settings), processes=gpu)


# ---- the replacement module ------------------------------------------------------------------------------
class FusedChain(nn.Module):
    """Runs [conv] -> [batch-norm] -> [+ residual] -> [activation] as one plan. The conv and
    batch-norm modules are referenced, not owned: they stay registered where the model had them."""

    def __init__(
        self,
        conv: nn.Conv2d | None,
        bn: nn.BatchNorm2d | None,
        activation: tuple | None,
        name: str,
        residual: bool = False,
        prelu: nn.PReLU | None = None,
    ) -> None:
        super().__init__()
        self._refs = (conv, bn)  # a tuple, so nn.Module does not register them a second time
        self._prelu = (prelu,)  # PReLU's module, whose slopes the activation reads; likewise referenced
        self.activation = activation
        self.chain_name = name
        self.residual = residual
        self._repeat: tuple | None = None  # see _repeat_call
        self.solvers: set[str] = set()  # the solvers that ran its eager calls' plans

    def __getstate__(self) -> dict:
        """Copies and pickles leave the repeat path's record behind: it holds the last call's
        derived tensors (folded weights, autograd non-leaves that cannot be deep-copied)."""
        return {**self.__dict__, "_repeat": None}

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        bn = self._refs[1]
        if self.training if bn is None else bn.training:  # a frozen (eval) batch-norm in training: inference
            return self._training_call(x, residual)
        if torch.compiler.is_compiling():
            # traced: straight to the custom op. The repeat path compares data pointers, which
            # breaks the graph; each break's resume frame then recompiles per chain (their
            # strides and paddings differ) until torch.compile's recompile limit falls back to eager.
            return self._op_call(x, residual)
        if _RECORDING.get() is not None:  # after the tracing test: torch.compile cannot trace a ContextVar
            return self._recording_call(x, residual)
        if torch.is_grad_enabled() and self._needs_grad(x, residual):
            x = x if isinstance(x, torch.Tensor) else torch.from_dlpack(x)
            return _InferenceWithGradients.apply(self, x, residual, *self._grad_params())
        return self._inference_call(x, residual)

    def _needs_grad(self, x: Any, residual: torch.Tensor | None) -> bool:
        if isinstance(x, torch.Tensor) and x.requires_grad:
            return True
        return (residual is not None and residual.requires_grad) or any(p.requires_grad for p in self._grad_params())

    def _grad_params(self) -> tuple[torch.Tensor, ...]:
        """The chain's parameters that autograd may differentiate (running statistics are not),
        read from the modules' own dictionaries (as attribute access does, without its cost)."""
        conv, bn = self._refs
        found = [] if conv is None else [conv._parameters.get("weight"), conv._parameters.get("bias")]
        if bn is not None:
            found += [bn._parameters.get("weight"), bn._parameters.get("bias")]
        found.append(self._slope())
        return tuple(p for p in found if p is not None)

    def _slope(self) -> torch.Tensor | None:
        """PReLU's slopes (None for the other activations)."""
        prelu = self._prelu[0]
        return None if prelu is None else prelu._parameters.get("weight")

    def _inference_call(self, x: Any, residual: torch.Tensor | None) -> torch.Tensor:
        """An eval-mode call as a fusion plan: the repeat path, else the plan (a residual the plan
        cannot take: plain torch operations), else, traced or watched, the custom op."""
        if self._repeat is not None:
            out = self._repeat_call(x, residual)
            if out is not None:
                return out
        x = x if isinstance(x, torch.Tensor) else torch.from_dlpack(x)
        if _eager_call(x):  # plans do no autograd: parameters are read as they are
            if residual is not None and not self._fits(x, residual):
                return self._unfused(x, residual)  # e.g. a broadcast residual: not the plan's prior
            try:
                return self._run_prepared(x, self._params(), self._hyperparameters(), residual)
            except BadParmError as exc:  # an input the plan refuses (a filter larger than the padded input):
                self.solvers.add(f"eagerly: the plan refuses the call ({exc})")  # the module's own answer, or error
                return self._unfused(x, residual)
        return self._op_call(x, residual)

    def _recording_call(self, x: torch.Tensor, residual: torch.Tensor | None) -> torch.Tensor:
        """While the model is prepared: note the plan this call needs, and return zeros laid out as
        the plan's output would be (the next chains' plans depend on its shape and strides; the
        values are not computed: a convolution's first call in torch costs more than the plan)."""
        x = x if isinstance(x, torch.Tensor) else torch.from_dlpack(x)
        if (residual is not None and not self._fits(x, residual)) or not _eager_call(x):
            return self._unfused(x, residual)
        _record_call(self, x, residual)
        conv = self._refs[0]
        shape = x.shape if conv is None else _conv_out_shape(x, conv.weight, conv.stride, conv.padding, conv.dilation)
        out = torch.empty(shape, dtype=x.dtype, device=x.device, memory_format=_memory_format(x))
        return out.zero_()

    def _op_call(self, x: torch.Tensor, residual: torch.Tensor | None) -> torch.Tensor:
        """The chain through the custom op, as torch.compile, export and dispatch modes see it."""
        if residual is not None and not self._fits(x, residual):
            return self._unfused(x, residual)
        detached = [None if t is None else t.detach() for t in self._params()]  # the op has no autograd formula
        return fused_chain(x, *detached[:6], *self._hyperparameters(), residual, detached[6])

    def _params(self) -> tuple:
        conv, bn = self._refs
        return (
            None if conv is None else conv.weight,
            None if conv is None else conv.bias,
            None if bn is None else bn.weight,
            None if bn is None else bn.bias,
            None if bn is None else bn.running_mean,
            None if bn is None else bn.running_var,
            self._slope(),
        )

    def _run_prepared(
        self, x: torch.Tensor, params: tuple, hyper: tuple, residual: torch.Tensor | None
    ) -> torch.Tensor:
        """The custom op's work for an eager call; what a call like it needs to repeat it is kept,
        and the solver that ran it (the fusion report names it)."""
        out, repeat, solver = _run_new(x, params, hyper, residual)
        self.solvers.add(solver)
        if repeat is not None:
            sources = tuple((where, name, where[name]) for where, name in self._parameter_slots())
            sources = tuple((where, name, t, *_pointer_and_version(t)) for where, name, t in sources)
            self._repeat = (_layout(x), _layout(residual), sources, self._scalars(), repeat, _direct(repeat, x))
        return out

    # The repeat path: a later eager call with an input (and residual) like the previous call's, the
    # same parameter tensors (objects, storage and versions) and scalar arguments allocates its
    # output and reruns the kernel, without rebuilding the parameter and argument tuples or the
    # plan's checks; where the solver keeps a direct launch of the call, it is launched straight
    # away (the versions checked here are those of the plan's argument tensors). 22.7 -> 8.8 us of
    # host time per chain on a 2-core CPU, the kernel excluded, with the plan's repeater alone.
    # The previous call's tensors are held by its arguments, so comparing identities is sound.
    def _repeat_call(self, x: torch.Tensor, residual: torch.Tensor | None) -> torch.Tensor | None:
        x_layout, r_layout, sources, scalars, repeat, direct = self._repeat
        if type(x) is not torch.Tensor or _layout(x) != x_layout or _layout(residual) != r_layout:
            return None
        if self._scalars() != scalars:
            return None
        for where, name, tensor, ptr, version in sources:
            if where[name] is not tensor:
                return None
            if tensor is not None and (tensor.data_ptr() != ptr or version is None or tensor._version != version):
                return None  # moved, edited, or an inference tensor (no version: no repeat)
        if not _eager_call(x):
            return None
        if direct is not None:
            out = direct(x, residual)
            if out is not None:
                hold(repeat)  # while a graph is captured: what its launch reads
                return out
        return _repeat_new(repeat, x, residual)

    def _parameter_slots(self) -> list[tuple[dict, str]]:
        """Where each parameter tensor a call reads is registered (the module's own dictionaries:
        reading them is what attribute access does, without nn.Module.__getattr__)."""
        conv, bn = self._refs
        slots = [] if conv is None else [(conv._parameters, "weight"), (conv._parameters, "bias")]
        if bn is not None:
            slots += [(bn._parameters, "weight"), (bn._parameters, "bias")]
            slots += [(bn._buffers, "running_mean"), (bn._buffers, "running_var")]
        if self._prelu[0] is not None:
            slots.append((self._prelu[0]._parameters, "weight"))
        return slots

    def _scalars(self) -> tuple:
        conv, bn = self._refs
        conv_scalars = None if conv is None else (conv.stride, conv.padding, conv.dilation, conv.groups)
        return (self.activation, conv_scalars, None if bn is None else bn.eps)

    def _fits(self, x: torch.Tensor, residual: torch.Tensor) -> bool:
        """Whether the residual can be the plan's prior: the output's shape, dtype and device."""
        c = self._refs[0]
        shape = list(x.shape) if c is None else _conv_out_shape(x, c.weight, c.stride, c.padding, c.dilation)
        return (
            isinstance(residual, torch.Tensor)
            and list(residual.shape) == shape
            and residual.dtype == x.dtype
            and residual.device == x.device
        )

    def _unfused(self, x: torch.Tensor, residual: torch.Tensor | None) -> torch.Tensor:
        """The chain in plain torch operations (for residuals a plan cannot take, and while the
        model is prepared)."""
        conv, bn = self._refs
        h = x if conv is None else conv(x)
        return self._residual_activation(h if bn is None else bn(h), residual)

    def _residual_activation(self, h: torch.Tensor, residual: torch.Tensor | None) -> torch.Tensor:
        h = h if residual is None else h + residual
        if self.activation is None:
            return h
        mode, a, b, g = self.activation
        if mode == ActivationMode.RELU:  # autograd keeps its output (shared with the next layer), as eager's
            return torch.relu(h)
        if self._prelu[0] is not None:
            return self._prelu[0](h)
        return activation_forward(ActivationMode(mode), h, a, b, g)

    def _training_call(self, x: torch.Tensor, residual: torch.Tensor | None) -> torch.Tensor:
        """In training mode: the convolution as the model's module, then batch-norm (batch
        statistics) and the activation as training plans under autograd (a residual add and its
        activation after the plans' batch-norm, in torch); eagerly where the plans cannot, the
        reason among the chain's solvers (the fusion report's)."""
        conv, bn = self._refs
        h = x if conv is None else conv(x)
        if bn is None:
            self.solvers.add("training, eagerly: no batch-norm (the convolution and activation are torch's)")
            return self._residual_activation(h, residual)
        if torch.compiler.is_compiling():
            return self._residual_activation(bn(h), residual)
        # PReLU's slopes train in torch, after the plans' batch-norm
        fused_activation = self.activation if residual is None and self._prelu[0] is None else None
        y, why = batchnorm_activation_training(bn, h, fused_activation)
        if y is None:
            self.solvers.add(f"training, eagerly: {why}")
            return self._residual_activation(bn(h), residual)
        self.solvers.add(f"training: {why}")
        if residual is None and self._prelu[0] is None:
            return y
        return self._residual_activation(y, residual)

    def _hyperparameters(self) -> tuple:
        """The chain's scalar arguments, in the op's order after the parameters."""
        conv, bn = self._refs
        mode, a, b, g = self.activation if self.activation is not None else (-1, 1.0, 0.0, 1.0)
        return (
            1e-5 if bn is None else float(bn.eps),
            [1, 1] if conv is None else list(conv.stride),
            [0, 0] if conv is None else list(conv.padding),
            [1, 1] if conv is None else list(conv.dilation),
            1 if conv is None else conv.groups,
            int(mode),
            a,
            b,
            g,
        )


# ---- finding chains in the graph -------------------------------------------------------------------------
class _InferenceWithGradients(torch.autograd.Function):
    """An eval-mode chain called with gradients wanted (an input that requires them, or
    parameters, outside no_grad): the forward is the fused plan; the backward recomputes the chain
    in torch operations (the model's own modules, batch-norm on its running statistics) and
    differentiates that, so the input's and the parameters' gradients are eager's."""

    @staticmethod
    def forward(ctx, chain, x, residual, *params):
        ctx.chain = chain
        ctx.save_for_backward(x, residual, *params)
        return chain._inference_call(x, residual)

    @staticmethod
    def backward(ctx, dy):
        x, residual, *params = ctx.saved_tensors
        with torch.enable_grad():
            xs = x.detach().requires_grad_(ctx.needs_input_grad[1])
            rs = None if residual is None else residual.detach().requires_grad_(ctx.needs_input_grad[2])
            out = ctx.chain._unfused(xs, rs)
            wanted = [t for t in (xs, rs, *params) if t is not None and t.requires_grad]
            grads = iter(torch.autograd.grad(out, wanted, dy, allow_unused=True)) if wanted else iter(())
        pick = {id(t): next(grads) for t in wanted}
        return (
            None,
            pick.get(id(xs)),
            None if rs is None else pick.get(id(rs)),
            *(pick.get(id(p)) for p in params),
        )


@dataclass
class FusionReport:
    fused: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    chains: dict[str, FusedChain] = field(default_factory=dict, repr=False)  # fused's modules, by name

    def solvers(self) -> dict[str, list[str]]:
        """Each fused chain's solvers, once an eager call has run it (cudnn where find measured
        cuDNN's fused call faster)."""
        return {name: sorted(chain.solvers) for name, chain in self.chains.items()}

    def __str__(self) -> str:
        ran = self.solvers()
        lines = [f"fused {len(self.fused)} chains:"]
        for entry in self.fused:
            solvers = ran.get(entry.split(":", 1)[0])
            lines.append(f"  {entry}" + (f" [{', '.join(solvers)}]" if solvers else ""))
        lines += [f"skipped {len(self.skipped)}:"] + [f"  {s}" for s in self.skipped]
        return "\n".join(lines)


def _module(gm: torch.fx.GraphModule, node: torch.fx.Node) -> nn.Module | None:
    return gm.get_submodule(node.target) if node.op == "call_module" else None


def _conv_refusal(conv: nn.Conv2d) -> str | None:
    if conv.padding_mode != "zeros":
        return f"padding_mode={conv.padding_mode!r} (only zero padding is fused)"
    if isinstance(conv.padding, str):
        return f"padding={conv.padding!r} (explicit padding is fused)"
    if type(conv) is not nn.Conv2d:
        return f"{type(conv).__name__} is not a plain Conv2d"
    return None


def _bn_refusal(bn: nn.BatchNorm2d) -> str | None:
    if not bn.track_running_stats or bn.running_mean is None:
        return "batch-norm without running statistics"
    if not bn.affine:
        return "batch-norm without affine parameters"
    return None


def _single_user(node: torch.fx.Node) -> torch.fx.Node | None:
    users = list(node.users)
    return users[0] if len(users) == 1 else None


_ADDS = (operator.add, operator.iadd, torch.add)


def _chain_end(gm, chain: list[torch.fx.Node], nxt: torch.fx.Node | None) -> str | None:
    """Why a chain stops before an operator it could have taken, for the fusion report: an
    activation fusionplan does not run, or a result with other users."""
    last = chain[-1]
    unfused = unfused_activation(gm, nxt)
    if unfused == "prelu":  # F.prelu(x, weight): its slopes are a value of the graph, not a module's
        return f"{_node_name(nxt)}: functional prelu (fused as the module nn.PReLU, whose slopes the chain reads)"
    if unfused is not None:
        return f"{_node_name(nxt)}: {unfused} is not one of fusionplan's activations"
    users = list(last.users)
    if nxt is None and len(users) > 1 and any(_continues(gm, u) for u in users):
        return f"{_node_name(last)}: its result has {len(users)} users"
    return None


def _node_name(node: torch.fx.Node) -> str:
    return str(node.target) if node.op == "call_module" else node.name


def _continues(gm, node: torch.fx.Node) -> bool:
    """Whether ``node`` could have extended a chain (a batch-norm, an add, an activation)."""
    return (
        isinstance(_module(gm, node), nn.BatchNorm2d)
        or _residual_operand(node, node.args[0] if node.args else None) is not None
        or activation_node(gm, node) is not None
        or unfused_activation(gm, node) is not None
    )


def _residual_operand(node: torch.fx.Node | None, produced: torch.fx.Node) -> torch.fx.Node | None:
    """For ``node`` = produced + other (a residual connection), the other tensor's node, else None.
    An in-place add must update ``produced`` (which fusion removes), never the other tensor."""
    if node is None or node.kwargs or len(node.args) != 2:
        return None
    a, b = node.args
    if node.op == "call_function" and node.target in _ADDS:
        in_place = node.target is operator.iadd
    elif node.op == "call_method" and node.target in ("add", "add_"):
        in_place = node.target == "add_"
    else:
        return None
    other = b if a is produced else a if b is produced and not in_place else None
    return other if isinstance(other, torch.fx.Node) and other is not produced else None


class FusedModel(torch.fx.GraphModule):
    """What ``fuse`` returns: the traced model with its chains fused. Before its first call with
    inputs of a new shape, dtype, layout or device it compiles every chain's plan at once, on all
    cores (``prepare`` does the same ahead of time)."""

    fusion_report: FusionReport

    def prepare(self, *example_inputs, workers: int | None = None, progress: bool | None = None, **example_kwargs):
        """Compile the plans every chain needs for calls like ``self(*example_inputs,
        **example_kwargs)``, on ``workers`` threads (fusionplan.compile_all); returns self. The
        model runs once in plain torch operations to find the chains' input shapes."""
        if self.training:
            raise BadParmError("prepare(): fused models are for inference; call .eval() on the model")
        _compile_recorded(self._record(example_inputs, example_kwargs), workers, progress)
        self._prepared().add(_input_layouts(example_inputs, example_kwargs))
        return self

    def __call__(self, *args, **kwargs):
        graphs = self.__dict__.get("_graphs")
        if graphs is not None and graphable(self, args, kwargs):
            return graphs(self, args, kwargs)
        return self.eager(*args, **kwargs)

    def eager(self, *args, **kwargs):
        """A call without the CUDA graphs of ``fuse(model, cuda_graph=True)``: each chain's kernel
        and each unfused operation launched in turn."""
        if not self.training and not torch.compiler.is_compiling():
            layouts = _input_layouts(args, kwargs)
            if layouts is not None and layouts not in self._prepared():
                self._prepare_first_call(args, kwargs, layouts)
        return super().__call__(*args, **kwargs)

    def use_cuda_graphs(self, enabled: bool = True, size: int = 8) -> FusedModel:
        """Replay calls on CUDA tensors, under ``torch.no_grad()`` or ``torch.inference_mode()``,
        from a CUDA graph of the whole forward, one per call signature (at most ``size``): one
        launch per call. Each call's outputs are new tensors. Returns self."""
        if size < 1:
            raise BadParmError(f"use_cuda_graphs(): size must be at least 1, got {size}")
        if enabled:
            self.__dict__["_graphs"] = GraphedCalls("eager", size)
        else:
            self.__dict__.pop("_graphs", None)
        return self

    def refresh(self) -> FusedModel:
        """Forget what the chains derived from the parameters (folded batch-norm, repacked
        weights, the calls kept for repeating, the CUDA graphs): for edits that move no torch
        version counter (``w.data.mul_(...)``, writes through a numpy view of a parameter). The
        next call derives them again from the current values. Returns self."""
        for chain in self.fusion_report.chains.values():
            chain._repeat = None
        forget_derived_arguments()  # every fused model's: the others derive again too, once
        graphs = self.__dict__.get("_graphs")
        if graphs is not None:
            graphs.clear()
        return self

    def __deepcopy__(self, memo: dict) -> FusedModel:
        """torch.fx's copy, with the fusion report (its chains those of the copy) and the CUDA-graph
        option (no graph yet), which it leaves behind."""
        twin = super().__deepcopy__(memo)
        for name in ("fusion_report", "_graphs"):
            if name in self.__dict__:
                twin.__dict__[name] = copy.deepcopy(self.__dict__[name], memo)
        return twin

    def __reduce__(self) -> tuple:
        """torch.fx's pickle, unpickled as a FusedModel (torch.fx's gives a GraphModule)."""
        return (_unpickled_fused_model, (super().__reduce__(),))

    def graph_report(self) -> dict | None:
        """The CUDA graphs' captures and replays so far, and the reasons of signatures that could
        not be captured (they run eagerly); None without ``use_cuda_graphs``."""
        graphs = self.__dict__.get("_graphs")
        return None if graphs is None else graphs.report()

    def _prepare_first_call(self, args: tuple, kwargs: dict, layouts: tuple) -> None:
        """A call with inputs of a new layout: its plans compiled together first. A model that
        fails in plain torch operations is left to its call, which reports what is wrong."""
        self._prepared().add(layouts)
        try:
            recording = self._record(args, kwargs)
        except Exception:
            return
        _compile_recorded(recording, None, None)

    def _record(self, args: tuple, kwargs: dict) -> _Recording:
        """What a call with these inputs needs, found by running it with the chains' outputs
        stood in for (zeros of their layouts)."""
        recording = _Recording()
        token = _RECORDING.set(recording)
        try:
            with torch.no_grad():
                nn.Module.__call__(self, *args, **kwargs)  # not self(...): that would prepare again
        finally:
            _RECORDING.reset(token)
        return recording

    def _prepared(self) -> set:
        """The input layouts the model's plans were compiled for."""
        return self.__dict__.setdefault("_prepared_layouts", set())


def _unpickled_fused_model(reduced: tuple) -> FusedModel:
    rebuild, args = reduced
    plain = rebuild(*args)
    fused = FusedModel(plain, plain.graph, type(plain).__name__)
    for name in ("fusion_report", "_graphs"):
        if name in plain.__dict__:
            fused.__dict__[name] = plain.__dict__[name]
    return fused


def _input_layouts(args: tuple, kwargs: dict) -> tuple | None:
    """The layouts of a call's tensor arguments; None where one is not a plain eager tensor
    (traced, under a dispatch mode), or there is none."""
    tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
    if not tensors or not all(_eager_call(t) for t in tensors):
        return None
    return tuple(_layout(t) for t in tensors)


def fuse(
    model: nn.Module,
    example_inputs: tuple | None = None,
    *,
    verbose: bool = False,
    workers: int | None = None,
    cuda_graph: bool = False,
) -> FusedModel:
    """A copy of ``model``'s modules, in its mode, with its conv/batch-norm/activation chains fused;
    the parameters and buffers are the model's own objects (an optimizer made before ``fuse``
    trains the fused model, and the running statistics it updates are the model's).

    ``example_inputs`` is optional (eval mode only): when given, the fused model's plans are
    compiled for them on ``workers`` threads (FusedModel.prepare), and the fused model is run on
    them once and compared with the original (a mismatch raises). ``cuda_graph``: replay
    grad-free CUDA calls from a graph of the whole forward (FusedModel.use_cuda_graphs). The
    returned module has a ``fusion_report``.
    """
    if example_inputs is not None and model.training:
        raise BadParmError(
            "fuse(): example_inputs are for eval mode (a training call would update the running statistics); "
            "call model.eval() first, or fuse without them"
        )
    shared = {id(t): t for t in (*model.parameters(), *model.buffers())}
    gm = _traced(copy.deepcopy(model, memo=shared))
    report = FusionReport()
    counter = 0
    erased: set[torch.fx.Node] = set()
    for node in list(gm.graph.nodes):
        if node.op != "call_module" or node in erased:
            continue
        module = _module(gm, node)
        conv = module if isinstance(module, nn.Conv2d) else None
        bn = module if isinstance(module, nn.BatchNorm2d) else None
        if conv is None and bn is None:
            continue
        if conv is not None:
            why = _conv_refusal(conv)
            if why:
                report.skipped.append(f"{node.target}: {why}")
                continue
        chain = [node]
        nxt = _single_user(node)
        if conv is not None and nxt is not None and isinstance(_module(gm, nxt), nn.BatchNorm2d):
            why = _bn_refusal(_module(gm, nxt))
            if why is None:
                bn = _module(gm, nxt)
                chain.append(nxt)
                nxt = _single_user(nxt)
            else:
                report.skipped.append(f"{nxt.target}: {why}")
        elif bn is not None and _bn_refusal(bn):
            report.skipped.append(f"{node.target}: {_bn_refusal(bn)}")
            continue
        residual = _residual_operand(nxt, chain[-1])
        if residual is not None:
            chain.append(nxt)
            nxt = _single_user(nxt)
        activation = activation_node(gm, nxt)
        if activation is not None:
            chain.append(nxt)
        else:
            stop = _chain_end(gm, chain, nxt)
            if stop is not None:
                report.skipped.append(f"{stop}: the chain ends before it")
        if conv is None and activation is None and residual is None:
            report.skipped.append(f"{node.target}: a batch-norm alone is left to PyTorch (no activation follows)")
            continue
        name = f"fused_chain_{counter}"
        counter += 1
        title = " -> ".join(str(n.target) if n.op == "call_module" else n.name for n in chain)
        prelu = _module(gm, chain[-1]) if activation is not None and activation[0] == ActivationMode.PRELU else None
        report.chains[name] = FusedChain(conv, bn, activation, title, residual is not None, prelu).eval()
        gm.add_submodule(name, report.chains[name])
        with gm.graph.inserting_after(chain[-1]):
            call_args = (node.args[0],) if residual is None else (node.args[0], residual)
            new = gm.graph.call_module(name, call_args)
        chain[-1].replace_all_uses_with(new)
        for old in reversed(chain):
            gm.graph.erase_node(old)
            erased.add(old)
        described = " -> ".join(_describe(gm, n) for n in chain)
        report.fused.append(f"{name}: {described}")
    gm.graph.lint()
    gm.recompile()
    gm.train(model.training)
    gm.fusion_report = report
    if verbose:
        print(report)
    if example_inputs is not None:
        gm.prepare(*example_inputs, workers=workers)
        _check_same_outputs(model, gm, example_inputs)
    if cuda_graph:
        gm.use_cuda_graphs()
    return gm


def _traced(model: nn.Module) -> FusedModel:
    """torch.fx.symbolic_trace, into a FusedModel; UnsupportedOpError where the forward cannot be
    traced (data-dependent control flow, host reads of traced values)."""
    tracer = torch.fx.Tracer()
    try:
        graph = tracer.trace(model)
    except Exception as exc:  # whatever the forward raised on proxies: reported, typed
        raise UnsupportedOpError(
            f"fuse(): torch.fx cannot trace {type(model).__name__}.forward ({type(exc).__name__}: {exc}); "
            "mark the untraceable code with torch.fx.wrap, or fuse the submodules that trace"
        ) from exc
    return FusedModel(tracer.root, graph, type(model).__name__)


def _describe(gm: torch.fx.GraphModule, node: torch.fx.Node) -> str:
    if node.op == "call_module":
        return f"{node.target} ({type(gm.get_submodule(node.target)).__name__})"
    return getattr(node.target, "__name__", str(node.target))


def _check_same_outputs(model: nn.Module, fused: nn.Module, example_inputs: tuple) -> None:
    with torch.no_grad():
        expected, got = model(*example_inputs), fused(*example_inputs)
    tol = 1e-2 if expected.dtype in (torch.float16, torch.bfloat16) else 1e-4
    err = ((got.double() - expected.double()).norm() / expected.double().norm().clamp_min(1e-30)).item()
    if err > tol:
        raise BadParmError(f"the fused model's output differs from the original's: relative error {err:.2e}")
