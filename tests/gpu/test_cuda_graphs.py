"""fuse(model, cuda_graph=True) on the GPU: replays right against the float64 reference, after
every kind of parameter change, after the process's caches are cleared, for several signatures,
and a forward that cannot be captured runs eagerly.

    python -m pytest -m gpu tests/gpu/test_cuda_graphs.py
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import fusionplan as fp
import fusionplan.torch as fpt
from fusionplan.tools.verify import EPS, compare

from ..test_torch_fuse import ResidualAdd, TinyResNet, randomize_bn

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def scaled_by_host_read(y: torch.Tensor) -> torch.Tensor:
    """A host read (not capturable), kept whole by fuse's tracer (fx.wrap: a leaf call)."""
    return y * float(y.mean())


torch.fx.wrap("scaled_by_host_read")


def _half_cuda(m: nn.Module) -> nn.Module:
    return randomize_bn(m.eval()).cuda().half().to(memory_format=torch.channels_last)


def _check(fused: nn.Module, model: nn.Module, x: torch.Tensor) -> None:
    """The fused (graphed) call against the original model in float64 (a NaN left unwritten would
    show as non-finite)."""
    out = fused(x)
    with torch.no_grad():
        expected = copy.deepcopy(model).double()(x.double())
    result = compare(out, expected, EPS[torch.float16])
    assert result.nonfinite == 0 and result.rel_norm < 2e-2, str(result)


def _fresh(n: int = 4, h: int = 13, w: int = 11) -> torch.Tensor:
    return torch.randn(n, 3, h, w, device="cuda").half().to(memory_format=torch.channels_last)


def test_replays_follow_every_change():
    model = _half_cuda(TinyResNet())
    fused = fpt.fuse(model, cuda_graph=True)
    with torch.no_grad():
        for _ in range(3):
            _check(fused, model, _fresh())
        assert fused.graph_report()["captures"] == 1 and fused.graph_report()["replays"] == 2
        first = fused(_fresh())
        kept = first.clone()
        fused(_fresh())
        torch.testing.assert_close(first, kept)  # a replay writes new outputs, not the last ones
        for change in (
            lambda m: m.get_submodule("stem.conv").weight.mul_(1.5),  # in place
            lambda m: setattr(m.get_submodule("pw.bn"), "running_var", torch.rand_like(m.pw.bn.running_var) + 0.5),
            lambda m: setattr(m.get_submodule("e.bn").weight, "data", torch.randn_like(m.e.bn.weight)),
            lambda m: m.get_submodule("head").bias.add_(1.0),  # an unfused module's parameter
        ):
            change(fused)
            assert not model.load_state_dict(fused.state_dict(), strict=False).missing_keys
            _check(fused, model, _fresh())
            _check(fused, model, _fresh())
        fp.clear_caches()  # the graphs hold what their chains read
        _check(fused, model, _fresh())
        _check(fused, model, _fresh(1, 16, 16))  # another signature: a graph of its own
        _check(fused, model, _fresh())
    with torch.inference_mode():
        _check(fused, model, _fresh())
        _check(fused, model, _fresh())
    report = fused.graph_report()
    assert report["uncapturable"] == [] and report["replays"] >= 10, report


def test_a_residual_model_and_an_uncapturable_forward():
    model = _half_cuda(ResidualAdd("plus"))
    fused = fpt.fuse(model, cuda_graph=True)

    def fresh():
        return torch.randn(4, 8, 13, 11, device="cuda").half().to(memory_format=torch.channels_last)

    with torch.no_grad():
        for _ in range(3):
            _check(fused, model, fresh())

    class Syncs(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv, self.bn = nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8)

        def forward(self, x):
            return scaled_by_host_read(torch.relu(self.bn(self.conv(x))))

    model = _half_cuda(Syncs())
    fused = fpt.fuse(model, cuda_graph=True)
    with torch.no_grad():
        for _ in range(3):
            _check(fused, model, _fresh())
    report = fused.graph_report()
    assert report["captures"] == 0 and len(report["uncapturable"]) == 1, report


def test_refresh_after_an_edit_behind_torchs_back_drops_the_graphs():
    """A parameter edited through ``.data`` (no version counter moves): after ``refresh()`` the
    graphed calls follow the new values (a new capture), and replay again after it."""
    model = _half_cuda(TinyResNet())
    fused = fpt.fuse(model, cuda_graph=True)
    x = _fresh()
    with torch.no_grad():
        for _ in range(3):
            _check(fused, model, x)
        next(m for m in model.modules() if isinstance(m, nn.BatchNorm2d)).weight.data.mul_(1.5)
        fused.refresh()
        captures = fused.graph_report()["captures"]
        for _ in range(3):
            _check(fused, model, x)
    assert fused.graph_report()["captures"] == captures + 1
