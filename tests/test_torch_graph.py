"""fuse(model, cuda_graph=True): which calls take a graph, when a graph is captured again, what it
keeps alive, and what a call returns. CUDA graphs need a GPU (tests/gpu/test_cuda_graphs.py runs
them); here torch's graph API is replaced by a stand-in whose replay runs the captured forward
again into the captured outputs, so the bookkeeping around it runs on the CPU."""

import copy
import pickle
from types import SimpleNamespace

import pytest
import torch
from torch import nn

import fusionplan as fp
import fusionplan.torch as fpt
import fusionplan.torch_graph as tg


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 17, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(17)
        self.head = nn.Linear(17, 5)

    def forward(self, x, scale: float = 1.0):
        y = torch.relu(self.bn(self.conv(x)))
        return {"logits": self.head(y.mean((2, 3))) * scale, "features": y}


def _block() -> nn.Module:
    torch.manual_seed(0)
    m = Block().eval()
    with torch.no_grad():
        m.bn.running_mean.uniform_(-0.5, 0.5)
        m.bn.running_var.uniform_(0.5, 1.5)
    return m


def _reference(m: nn.Module, x: torch.Tensor, scale: float = 1.0) -> dict:
    with torch.no_grad():
        return copy.deepcopy(m).double()(x.double(), scale)


def _close(got: dict, expected: dict) -> None:
    for name in expected:
        torch.testing.assert_close(got[name].double(), expected[name], rtol=1e-5, atol=1e-5)


class _StandInGraph:
    """torch.cuda.CUDAGraph's part the graphs use: what runs under capture is noted, and a replay
    runs it again, writing into the tensors the capture returned."""

    current = None

    def __init__(self):
        self.forward = None
        self.outputs = None

    def replay(self):
        fresh = self.forward()
        for kept, new in zip(torch.utils._pytree.tree_leaves(self.outputs), torch.utils._pytree.tree_leaves(fresh)):
            kept.copy_(new)


class _Capture:
    def __init__(self, graph, fail: Exception | None):
        self.graph, self.fail = graph, fail

    def __enter__(self):
        _StandInGraph.current = self.graph
        if self.fail is not None:
            raise self.fail

    def __exit__(self, *exc):
        _StandInGraph.current = None
        return False


@pytest.fixture
def stand_in(monkeypatch):
    """torch's graph API replaced; GraphedCalls records the forward and its outputs."""
    failures = SimpleNamespace(next=None)
    monkeypatch.setattr(fpt, "graphable", lambda module, args, kwargs: not torch.is_grad_enabled())
    monkeypatch.setattr(torch.cuda, "CUDAGraph", _StandInGraph)
    monkeypatch.setattr(torch.cuda, "graph", lambda graph: _Capture(graph, failures.next))
    monkeypatch.setattr(torch.cuda, "Stream", lambda device=None: SimpleNamespace(wait_stream=lambda s: None))
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: SimpleNamespace(wait_stream=lambda s: None))
    monkeypatch.setattr(torch.cuda, "stream", lambda s: _Nothing())
    failures.generator = _StandInGenerator()
    monkeypatch.setattr(torch.cuda, "default_generators", (failures.generator,))

    real_forward = tg.GraphedCalls._capture

    def capture(self, module, forward, leaves, spec):
        found = real_forward(self, module, forward, leaves, spec)
        if not isinstance(found, tg._Uncapturable):
            static = [leaf for leaf in found.inputs]
            args_leaves = iter(static)
            call = [next(args_leaves) if isinstance(leaf, torch.Tensor) else leaf for leaf in leaves]
            args, kwargs = torch.utils._pytree.tree_unflatten(call, spec)
            found.graph.forward = lambda: forward(*args, **kwargs)
            found.graph.outputs = found.outputs
        return found

    monkeypatch.setattr(tg.GraphedCalls, "_capture", capture)
    return failures


class _StandInGenerator:
    """A CUDA generator's graph-safe state API: the state that a failed capture puts back."""

    def __init__(self):
        self.state, self.clones = "live", 0

    def clone_state(self):
        self.clones += 1
        return f"copy {self.clones}"

    def graphsafe_set_state(self, state):
        self.state = state


class _Nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_calls_replay_their_signatures_graph_and_return_new_tensors(stand_in):
    m = _block()
    fused = fpt.fuse(m, cuda_graph=True)
    x = torch.randn(2, 3, 13, 11)
    with torch.no_grad():
        first = fused(x)  # eager, then captured
        assert fused.graph_report() == {"captures": 1, "replays": 0, "uncapturable": []}
        x2 = torch.randn(2, 3, 13, 11)
        second = fused(x2)
        assert fused.graph_report()["replays"] == 1
        _close(second, _reference(m, x2))
        _close(first, _reference(m, x))  # not overwritten by the replay
        third = fused(x2, 0.5)  # another scalar: another signature
        _close(third, _reference(m, x2, 0.5))
        assert fused.graph_report()["captures"] == 2
        fused(torch.randn(1, 3, 13, 11))
        assert fused.graph_report()["captures"] == 3
    assert second["features"] is not fused(x2)["features"]


def test_a_changed_parameter_is_captured_again(stand_in):
    m = _block()
    fused = fpt.fuse(m, cuda_graph=True)
    x = torch.randn(2, 3, 9, 7)
    with torch.no_grad():
        fused(x)
        fused(x)
        conv = fused.get_submodule("conv")
        conv.weight.mul_(-1.0)  # in place: its version moves
        m.conv.weight.mul_(-1.0)
        _close(fused(x), _reference(m, x))
        assert fused.graph_report()["captures"] == 2
        fused.get_submodule("bn").running_var.copy_(torch.rand(17) + 0.5)
        m.bn.running_var.copy_(fused.get_submodule("bn").running_var)
        _close(fused(x), _reference(m, x))
        assert fused.graph_report()["captures"] == 3
        fused.get_submodule("head").weight = nn.Parameter(torch.randn(5, 17))  # replaced
        m.head.weight = nn.Parameter(fused.get_submodule("head").weight.detach().clone())
        _close(fused(x), _reference(m, x))
        assert fused.graph_report()["captures"] == 4
        before = fused.graph_report()["replays"]
        _close(fused(x), _reference(m, x))
        assert fused.graph_report()["replays"] == before + 1


def test_the_capture_holds_what_the_chains_kernels_read(stand_in, monkeypatch):
    held = []
    real = tg._Graph

    def noting(*args, **kwargs):
        graph = real(*args, **kwargs)
        held.append(graph.held)
        return graph

    monkeypatch.setattr(tg, "_Graph", noting)
    fused = fpt.fuse(_block(), cuda_graph=True)
    with torch.no_grad():
        fused(torch.randn(2, 3, 8, 8))
    assert held and held[0], "the chain's plan arguments are held by the graph"
    fp.clear_caches()  # the process's caches dropped: the graph still holds them
    assert any(isinstance(h, tuple) or hasattr(h, "args") for h in held[0])


def test_a_forward_that_cannot_be_captured_runs_eagerly_and_says_why(stand_in):
    m = _block()
    fused = fpt.fuse(m, cuda_graph=True)
    stand_in.next = RuntimeError("operation not permitted when stream is capturing")
    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        _close(fused(x), _reference(m, x))
        stand_in.next = None
        _close(fused(x), _reference(m, x))
    report = fused.graph_report()
    assert report["captures"] == 0 and report["replays"] == 0
    assert report["uncapturable"] == ["RuntimeError: operation not permitted when stream is capturing"]
    # the random generator's state copied before the capture replaced the one it left capturing
    assert stand_in.generator.state == "copy 1"


def test_grad_mode_and_unhashable_arguments_run_eagerly(stand_in):
    m = _block()
    fused = fpt.fuse(m, cuda_graph=True)
    x = torch.randn(2, 3, 8, 8)
    _close(fused(x), _reference(m, x))  # grad mode on
    with torch.no_grad():
        fused(x, scale=torch.tensor(1.0).item())
        assert tg._signature([x, [1.0]], None) is None
    assert fused.graph_report()["captures"] == 1


def test_without_a_gpu_calls_run_eagerly():
    m = _block()
    fused = fpt.fuse(m, cuda_graph=True)
    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        _close(fused(x), _reference(m, x))
        _close(fused(x), _reference(m, x))
    assert fused.graph_report() == {"captures": 0, "replays": 0, "uncapturable": []}
    assert not tg.graphable(fused, (x,), {})
    assert fpt.fuse(m).graph_report() is None
    with pytest.raises(fp.BadParmError, match="size"):
        fused.use_cuda_graphs(size=0)
    assert fused.use_cuda_graphs(False).graph_report() is None


def test_copies_and_pickles_start_without_graphs(stand_in):
    fused = fpt.fuse(_block(), cuda_graph=True)
    with torch.no_grad():
        fused(torch.randn(2, 3, 8, 8))
    for twin in (copy.deepcopy(fused), pickle.loads(pickle.dumps(fused))):
        assert twin.graph_report() == {"captures": 0, "replays": 0, "uncapturable": []}
        with torch.no_grad():
            twin(torch.randn(2, 3, 8, 8))
        assert twin.graph_report()["captures"] == 1
        assert set(twin.fusion_report.chains.values()) <= set(twin.modules())  # the copy's own chains


def test_a_snapshot_sees_each_kind_of_change():
    m = _block()
    snap = tg.Snapshot.of(m)
    assert snap.unchanged()
    with torch.no_grad():
        m.bn.running_mean.add_(1.0)
    assert not snap.unchanged()
    snap = tg.Snapshot.of(m)
    m.head.weight.data = torch.randn(5, 17)  # new storage, same Parameter
    assert not snap.unchanged()
    snap = tg.Snapshot.of(m)
    del m.head.bias
    assert not snap.unchanged()
    with torch.inference_mode():
        frozen = nn.Linear(2, 2)
    snap = tg.Snapshot.of(frozen)
    assert snap.unchanged() and snap.versioned == ()
