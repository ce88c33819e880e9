"""Whole-model CUDA graphs for fused models (``fuse(model, cuda_graph=True)``).

A call of a fused model launches one kernel per chain and per unfused operation, and at small
batches the host's launches, not the GPU, set its time. Here each call signature (the tensors'
shapes, strides, dtypes and devices, the other arguments' values, the grad and inference modes)
gets a CUDA graph of the whole forward, captured after an eager call of that signature, and later
calls copy their inputs into the graph's and replay it: one launch per forward.

What keeps a replay right:
- the parameters and buffers: each graph notes every one's storage and version counter, and a
  call finds them changed (an optimizer step, ``load_state_dict``, ``.to()``) runs eagerly and
  captures again;
- the chains' derived data (folded batch-norm, repacked weights), made outside the capture, are
  held by the graph (``held``) so that no cache dropping them frees memory the graph reads;
- each replay's outputs are copies: the graph's own outputs are overwritten by the next replay.
Calls that cannot be graphed (CPU tensors, grad mode on, a training model, tracing, an argument
that is not hashable) run eagerly; a forward that cannot be captured (it synchronizes, say) runs
eagerly from then on for that signature, and says why in ``FusedModel.graph_report()``.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.utils import _pytree as pytree

from fusionplan.core.caches import LruCache

logger = logging.getLogger("fusionplan")

#: While a forward is captured: where the chains put what their kernels read (torch_op._run_new).
HOLD: ContextVar[list | None] = ContextVar("fusionplan_graph_hold", default=None)


def hold(value: Any) -> None:
    """Keep ``value`` (a plan's arguments, a repeater) alive as long as the graph being captured."""
    held = HOLD.get()
    if held is not None:
        held.append(value)


@dataclass
class _Graph:
    graph: Any  # torch.cuda.CUDAGraph
    inputs: list[torch.Tensor]  # the graph's input tensors, in the call's leaf order
    outputs: Any  # the forward's outputs as captured (a pytree)
    state: Snapshot  # the parameters and buffers at capture
    held: list = field(default_factory=list)


@dataclass(frozen=True)
class _Uncapturable:
    reason: str


class GraphedCalls:
    """CUDA graphs of the calls of a module's method ``method`` (its eager call), by call
    signature (at most ``size`` signatures, the least recently used dropped). The module is
    passed at each call (so that a copy or a pickle of the module, which starts with no graph,
    holds no reference back to the original)."""

    def __init__(self, method: str = "eager", size: int = 8) -> None:
        self._method = method
        self._graphs: LruCache[tuple, _Graph | _Uncapturable] = LruCache("cuda graphs", size, process=False)
        self.replays = 0
        self.captures = 0

    def __reduce__(self) -> tuple:
        return (GraphedCalls, (self._method, self._graphs.size))

    def __call__(self, module: nn.Module, args: tuple, kwargs: dict) -> Any:
        forward = getattr(module, self._method)
        leaves, spec = pytree.tree_flatten((args, kwargs))
        key = _signature(leaves, spec)
        if key is None:
            return forward(*args, **kwargs)
        found = self._graphs.get(key)
        if isinstance(found, _Uncapturable):
            return forward(*args, **kwargs)
        if found is not None and found.state.unchanged():
            return self._replay(found, leaves)
        out = forward(*args, **kwargs)  # compiles the plans, warms up, and is this call's answer
        self._graphs.put(key, self._capture(module, forward, leaves, spec))
        return out

    def clear(self) -> None:
        """Drop every graph (the next call of each signature captures again)."""
        self._graphs.clear()

    def report(self) -> dict[str, Any]:
        """Graphs captured and replayed so far, and why a signature could not be captured."""
        uncapturable = [g.reason for g in self._graphs.values() if isinstance(g, _Uncapturable)]
        return {"captures": self.captures, "replays": self.replays, "uncapturable": uncapturable}

    def _replay(self, found: _Graph, leaves: list) -> Any:
        for static, given in zip(found.inputs, (leaf for leaf in leaves if isinstance(leaf, torch.Tensor))):
            static.copy_(given)
        found.graph.replay()
        self.replays += 1
        return pytree.tree_map(lambda t: t.clone() if isinstance(t, torch.Tensor) else t, found.outputs)

    def _capture(
        self, module: nn.Module, forward: Callable[..., Any], leaves: list, spec: Any
    ) -> _Graph | _Uncapturable:
        inputs = [_like(leaf) for leaf in leaves if isinstance(leaf, torch.Tensor)]
        static_leaves = iter(inputs)
        call_leaves = [next(static_leaves) if isinstance(leaf, torch.Tensor) else leaf for leaf in leaves]
        args, kwargs = pytree.tree_unflatten(call_leaves, spec)
        device = inputs[0].device
        held: list = []
        random_state = _random_state(device)
        try:
            side = torch.cuda.Stream(device)
            side.wait_stream(torch.cuda.current_stream(device))
            with torch.cuda.stream(side):  # a warm-up off the capture, as torch's graphs ask
                forward(*args, **kwargs)
            torch.cuda.current_stream(device).wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with _holding(held), torch.cuda.graph(graph):
                outputs = forward(*args, **kwargs)
        except Exception as exc:  # e.g. a forward that synchronizes or reads a tensor on the host
            _restore_random_state(random_state)
            reason = f"{type(exc).__name__}: {exc}"
            logger.info("fuse(cuda_graph=True): this call signature runs eagerly: %s", reason)
            return _Uncapturable(reason)
        self.captures += 1
        return _Graph(graph, inputs, outputs, Snapshot.of(module), held)


def _random_state(device: torch.device) -> tuple | None:
    """The device's default random generator and a copy of its state, taken before a capture: a
    capture that fails leaves the generator's state marked as capturing (every later random op on
    the device then raises), so the copy replaces it (None: torch has no graph-safe states)."""
    generators = torch.cuda.default_generators
    index = device.index if device.index is not None else 0
    if index >= len(generators):
        return None
    generator = generators[index]
    clone = getattr(generator, "clone_state", None)
    return None if clone is None or not hasattr(generator, "graphsafe_set_state") else (generator, clone())


def _restore_random_state(saved: tuple | None) -> None:
    if saved is not None:
        generator, state = saved
        generator.graphsafe_set_state(state)


@contextlib.contextmanager
def _holding(held: list) -> Iterator[None]:
    token = HOLD.set(held)
    try:
        yield
    finally:
        HOLD.reset(token)


def graphable(module: nn.Module, args: tuple, kwargs: dict) -> bool:
    """Whether a call may take a graph: an eval-mode module, grad mode off, CUDA tensors only, not
    traced by torch.compile or export."""
    if module.training or torch.is_grad_enabled() or torch.compiler.is_compiling():
        return False
    tensors = [leaf for leaf in pytree.tree_leaves((args, kwargs)) if isinstance(leaf, torch.Tensor)]
    return bool(tensors) and all(type(t) is torch.Tensor and t.is_cuda for t in tensors)


def _signature(leaves: list, spec: Any) -> tuple | None:
    """What a graph is captured for: each tensor's shape, strides, dtype and device, the other
    arguments' values, the argument structure, and the inference mode. None where an argument is
    not hashable (such calls run eagerly)."""
    parts = []
    for leaf in leaves:
        if isinstance(leaf, torch.Tensor):
            parts.append((leaf.shape, leaf.stride(), leaf.dtype, leaf.device))
        else:
            parts.append(("value", type(leaf), leaf))
    key = (str(spec), torch.is_inference_mode_enabled(), tuple(parts))
    try:
        hash(key)
    except TypeError:
        return None
    return key


@dataclass(frozen=True)
class Snapshot:
    """Where each parameter and buffer of a module is registered, and the storage and version of
    the tensor there. Inference tensors keep no version: their in-place changes under
    inference_mode are not seen, as in eager calls."""

    slots: tuple[tuple[dict, str], ...]
    pointers: list[int]
    versioned: tuple[int, ...]  # the slots whose tensors keep a version
    versions: list[int]

    @classmethod
    def of(cls, module: nn.Module) -> Snapshot:
        slots = tuple(
            (where, name)
            for sub in module.modules()
            for where in (sub._parameters, sub._buffers)
            for name, t in where.items()
            if t is not None
        )
        tensors = [where[name] for where, name in slots]
        versioned = tuple(i for i, t in enumerate(tensors) if not t.is_inference())
        return cls(slots, [t.data_ptr() for t in tensors], versioned, [tensors[i]._version for i in versioned])

    def unchanged(self) -> bool:
        """Whether every slot still holds a tensor at the same storage and version (an optimizer
        step, ``load_state_dict`` and ``.to()`` each change one of those)."""
        try:
            tensors = [where[name] for where, name in self.slots]
        except KeyError:  # a parameter or buffer deleted
            return False
        if [t.data_ptr() if t is not None else None for t in tensors] != self.pointers:
            return False
        try:
            return [tensors[i]._version for i in self.versioned] == self.versions
        except RuntimeError:  # replaced by an inference tensor at the same storage
            return False


def _like(t: torch.Tensor) -> torch.Tensor:
    """A copy of ``t``, the graph's input: of ``t``'s strides where ``t`` is dense, else contiguous
    (a call's input is copied into it, so only its values matter)."""
    return t.clone()
