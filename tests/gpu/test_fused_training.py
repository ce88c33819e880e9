"""fuse(model) in training mode on the GPU: fp16 and bf16 autocast, channels_last, against the
eager model (gradients, running statistics), the Triton training kernels running, and the
activations kept (peak memory) at most eager's.

    python -m pytest -m gpu tests/gpu/test_fused_training.py
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

import fusionplan.torch as fpt

from ..test_torch_train import ACTIVATIONS, Chains, _randomized

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30)).item()


def _distance(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.double() - b.double()).norm().item()


def _step(module, x, label, dtype):
    with torch.autocast("cuda", dtype=dtype, enabled=dtype is not None):
        loss = F.cross_entropy(module(x), label)
    loss.backward()
    return loss.item()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("act", ["relu", "silu", "elu"])
def test_training_steps_track_eager(dtype, act):
    """Each gradient of the fused step is at most 3x as far from an fp32 step's as the eager
    autocast step's is, plus 0.1 % of the model's largest gradient norm. Compared with eager alone,
    a bias before a training batch-norm (its true gradient zero: the batch-norm takes the mean
    out) would compare one rounding noise with another; the floor keeps such noise from failing it."""
    model = _randomized(Chains(ACTIVATIONS[act])).cuda().to(memory_format=torch.channels_last).train()
    twin, reference = copy.deepcopy(model), copy.deepcopy(model)
    fused = fpt.fuse(model)
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.02, momentum=0.9) for m in (model, twin, reference)]
    torch.manual_seed(3)
    for _ in range(5):
        x = torch.randn(16, 3, 32, 32, device="cuda").to(memory_format=torch.channels_last)
        label = torch.randint(0, 5, (16,), device="cuda")
        for opt in optimizers:
            opt.zero_grad()
        losses = _step(fused, x, label, dtype), _step(twin, x, label, dtype), _step(reference, x, label, None)
        assert losses[0] == pytest.approx(losses[1], rel=2e-2), losses
        grads, eager = dict(fused.named_parameters()), dict(twin.named_parameters())
        floor = 1e-3 * max(p.grad.double().norm().item() for p in reference.parameters())
        for name, p in reference.named_parameters():
            fused_off, eager_off = _distance(grads[name].grad, p.grad), _distance(eager[name].grad, p.grad)
            assert fused_off <= 3 * eager_off + floor, (name, fused_off, eager_off, floor)
        for opt in optimizers:
            opt.step()
    buffers = dict(fused.named_buffers())
    for name, b in twin.named_buffers():
        assert _rel(buffers[name].float(), b.float()) < 1e-2, name
    ran = {s for solvers in fused.fusion_report.solvers().values() for s in solvers}
    assert "training: triton-batchnorm" in ran, ran


def test_the_fused_step_keeps_no_more_activations_than_eager():
    def peak(module) -> int:
        x = torch.randn(32, 3, 128, 128, device="cuda").to(memory_format=torch.channels_last)
        label = torch.randint(0, 5, (32,), device="cuda")
        _step(module, x, label, torch.float16)  # warm: plans compiled, workspaces made
        module.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        _step(module, x, label, torch.float16)
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - before

    model = _randomized(Chains(ACTIVATIONS["relu"])).cuda().to(memory_format=torch.channels_last).train()
    twin = copy.deepcopy(model)
    fused = fpt.fuse(model)
    assert peak(fused) <= peak(twin)


def _model_and_data(momentum: float | None = 0.1):
    model = _randomized(Chains(ACTIVATIONS["relu"])).cuda().to(memory_format=torch.channels_last).train()
    model.bn3.momentum = momentum
    torch.manual_seed(5)
    data = [
        (
            torch.randn(16, 3, 32, 32, device="cuda").to(memory_format=torch.channels_last),
            torch.randint(0, 5, (16,), device="cuda"),
        )
        for _ in range(6)
    ]
    return model, data


def test_after_the_first_step_the_chains_launch_their_bound_templates(monkeypatch):
    """From the second step on, every chain's plans run their launch templates straight from the
    autograd function (no records, no launch built): the kernels' full launch path runs for bn3's
    forward alone (momentum None: its factor, a launch argument, changes every step)."""
    from fusionplan.solvers import triton_batchnorm as tb

    model, data = _model_and_data(momentum=None)
    fused = fpt.fuse(model)
    full = []
    launch_all = {k: k._launch_all for k in (tb.TritonBatchNormForwardKernel, tb.TritonBatchNormBackwardKernel)}
    for kernel_class, original in launch_all.items():
        counted = lambda self, *a, _o=original: full.append(self) or _o(self, *a)  # noqa: E731
        monkeypatch.setattr(kernel_class, "_launch_all", counted)
    for step, (x, label) in enumerate(data[:4]):
        del full[:]
        _step(fused, x, label, torch.bfloat16)
        if step >= 1:
            assert len(full) == 1 and isinstance(full[0], tb.TritonBatchNormForwardKernel), (step, full)


def test_a_whole_fused_training_step_replays_from_a_cuda_graph():
    """Forward, backward and an SGD step of the fused model captured in one CUDA graph, replayed on
    new data: the parameters and running statistics follow the eager model's steps."""
    model, data = _model_and_data()
    twin = copy.deepcopy(model)
    fused = fpt.fuse(model)
    opts = [torch.optim.SGD(m.parameters(), lr=0.02, momentum=0.9) for m in (model, twin)]
    static_x, static_label = data[0][0].clone(), data[0][1].clone()

    def fused_step() -> None:
        opts[0].zero_grad(set_to_none=False)
        F.cross_entropy(fused(static_x), static_label).backward()
        opts[0].step()

    def eager_step(x, label) -> None:
        opts[1].zero_grad(set_to_none=False)
        F.cross_entropy(twin(x), label).backward()
        opts[1].step()

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for x, label in data[:3]:  # warm-up steps, eager's twin alongside
            static_x.copy_(x), static_label.copy_(label)
            fused_step()
            eager_step(x, label)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fused_step()
    for x, label in data[3:]:
        static_x.copy_(x), static_label.copy_(label)
        graph.replay()
        eager_step(x, label)
    torch.cuda.synchronize()
    params = dict(fused.named_parameters())
    for name, p in twin.named_parameters():
        assert _rel(params[name].detach(), p.detach()) < 1e-3, name
    buffers = dict(fused.named_buffers())
    for name, b in twin.named_buffers():
        assert _rel(buffers[name].float(), b.float()) < 1e-3, name
