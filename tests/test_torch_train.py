"""fuse(model) in training mode: the fused chains' outputs, gradients (input and every parameter),
running statistics and SGD steps track the eager model's; train/eval switching; the parameters
stay the model's own objects."""

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import fusionplan.torch as fpt
from fusionplan import torch_train

ACTIVATIONS = {
    "relu": nn.ReLU(),
    "relu6": nn.ReLU6(),
    "leaky": nn.LeakyReLU(0.2),
    "elu": nn.ELU(0.7),
    "sigmoid": nn.Sigmoid(),
    "tanh": nn.Tanh(),
    "silu": nn.SiLU(),
    "hardswish": nn.Hardswish(),
    "gelu": nn.GELU(),
    "mish": nn.Mish(),
}


class Chains(nn.Module):
    """A strided conv chain, a grouped conv chain with a residual add, a batch-norm + activation
    chain without a convolution (momentum None), and a head."""

    def __init__(self, act: nn.Module) -> None:
        super().__init__()
        self.conv1, self.bn1, self.act1 = nn.Conv2d(3, 8, 3, 2, 1, bias=False), nn.BatchNorm2d(8), copy.deepcopy(act)
        self.conv2, self.bn2 = nn.Conv2d(8, 8, 3, padding=1, groups=4), nn.BatchNorm2d(8)
        self.bn3, self.act3 = nn.BatchNorm2d(8, momentum=None), copy.deepcopy(act)
        self.head = nn.Linear(8, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.act1(self.bn1(self.conv1(x)))
        y = F.relu(y + self.bn2(self.conv2(y)))
        y = self.act3(self.bn3(y))
        return self.head(y.mean((2, 3)))


def _randomized(m: nn.Module) -> nn.Module:
    torch.manual_seed(1)
    with torch.no_grad():
        for mod in m.modules():
            if isinstance(mod, nn.BatchNorm2d):
                mod.running_mean.normal_()
                mod.running_var.uniform_(0.5, 2.0)
                mod.weight.normal_()
                mod.bias.normal_()
    return m


def _pair(act: str = "relu") -> tuple[nn.Module, nn.Module, nn.Module]:
    """(an eager twin, the model, the fused model sharing its parameters and buffers)."""
    model = _randomized(Chains(ACTIVATIONS[act])).train()
    twin = copy.deepcopy(model)
    return twin, model, fpt.fuse(model)


def _step(module: nn.Module, x: torch.Tensor, weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    x = x.detach().clone().requires_grad_(True)
    out = module(x)
    (out * weights).sum().backward()
    return out, x.grad


def _assert_tracks(twin: nn.Module, fused: nn.Module, rtol: float = 1e-4) -> None:
    grads = dict(fused.named_parameters())
    for name, p in twin.named_parameters():
        torch.testing.assert_close(grads[name].grad, p.grad, rtol=rtol, atol=rtol, msg=lambda m, n=name: f"{n}: {m}")
    buffers = dict(fused.named_buffers())
    for name, b in twin.named_buffers():
        torch.testing.assert_close(buffers[name], b, rtol=rtol, atol=rtol, msg=lambda m, n=name: f"{n}: {m}")


def _assert_step_matches(fused: nn.Module, twin: nn.Module, x: torch.Tensor, weights: torch.Tensor) -> None:
    """One training step of each: the outputs, input gradients, parameter gradients and buffers agree."""
    out, dx = _step(fused, x, weights)
    ref_out, ref_dx = _step(twin, x, weights)
    torch.testing.assert_close(out, ref_out, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(dx, ref_dx, rtol=1e-4, atol=1e-4)
    _assert_tracks(twin, fused.module if isinstance(fused, nn.parallel.DistributedDataParallel) else fused)


@pytest.mark.parametrize("act", list(ACTIVATIONS))
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_a_training_step_matches_eager(act, layout):
    twin, model, fused = _pair(act)
    assert len(fused.fusion_report.fused) == 3, fused.fusion_report
    x = torch.randn(4, 3, 13, 11)
    if layout == "NHWC":
        x = x.to(memory_format=torch.channels_last)
    weights = torch.randn(4, 5)
    _assert_step_matches(fused, twin, x, weights)
    ran = fused.fusion_report.solvers()
    assert all(any(s.startswith("training: ") for s in solvers) for solvers in ran.values()), ran


def test_sgd_steps_track_eager_with_an_optimizer_made_before_fuse():
    model = _randomized(Chains(nn.ReLU())).train()
    twin = copy.deepcopy(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)  # before fuse
    twin_optimizer = torch.optim.SGD(twin.parameters(), lr=0.05, momentum=0.9)
    fused = fpt.fuse(model)
    assert {id(p) for p in fused.parameters()} == {id(p) for p in model.parameters()}
    torch.manual_seed(2)
    data = [(torch.randn(6, 3, 12, 12), torch.randint(0, 5, (6,))) for _ in range(4)]
    for step in range(20):
        x, label = data[step % len(data)]
        losses = []
        for module, opt in ((fused, optimizer), (twin, twin_optimizer)):
            opt.zero_grad()
            loss = F.cross_entropy(module(x), label)
            loss.backward()
            opt.step()
            losses.append(loss.item())
        assert losses[0] == pytest.approx(losses[1], rel=1e-4), (step, losses)
    _assert_tracks(twin, fused, rtol=1e-3)
    assert model.bn3.num_batches_tracked.item() == 20


def test_train_eval_switching_and_the_state_dict():
    twin, model, fused = _pair()
    x = torch.randn(4, 3, 13, 11)
    with torch.no_grad():
        torch.testing.assert_close(fused(x), twin(x), rtol=1e-4, atol=1e-4)  # training: batch statistics
        fused.eval(), twin.eval()
        torch.testing.assert_close(fused(x), twin(x), rtol=1e-4, atol=1e-4)  # eval: the running ones
        fused.train(), twin.train()
        torch.testing.assert_close(fused(x), twin(x), rtol=1e-4, atol=1e-4)
    assert fused.state_dict().keys() == twin.state_dict().keys()
    fresh = Chains(nn.ReLU())
    fresh.load_state_dict(fused.state_dict())
    fresh.eval(), fused.eval()
    with torch.no_grad():
        torch.testing.assert_close(fresh(x), fused(x), rtol=1e-4, atol=1e-4)


def test_chains_the_plans_cannot_train_run_eagerly_and_say_why():
    model = _randomized(Chains(nn.ReLU())).train().double()
    twin = copy.deepcopy(model)
    fused = fpt.fuse(model)
    x, weights = torch.randn(2, 3, 9, 9, dtype=torch.float64), torch.randn(2, 5, dtype=torch.float64)
    out, dx = _step(fused, x, weights)
    ref_out, ref_dx = _step(twin, x, weights)
    torch.testing.assert_close(out, ref_out)
    torch.testing.assert_close(dx, ref_dx)
    _assert_tracks(twin, fused, rtol=1e-7)
    reasons = {s for solvers in fused.fusion_report.solvers().values() for s in solvers}
    assert "training, eagerly: torch.float64 batch-norm parameters (the training plans take fp32 parameters)" in reasons


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_the_triton_training_kernels_through_the_interpreter(layout, monkeypatch):
    monkeypatch.setenv("FUSIONPLAN_BACKEND", "triton")
    twin, model, fused = _pair("elu")
    x = torch.randn(2, 3, 6, 5)
    if layout == "NHWC":
        x = x.to(memory_format=torch.channels_last)
    weights = torch.randn(2, 5)
    _assert_step_matches(fused, twin, x, weights)
    assert "training: triton-batchnorm" in {s for v in fused.fusion_report.solvers().values() for s in v}


@pytest.mark.parametrize("backend", ["cpu", "triton"])
def test_a_gradient_in_another_layout_is_read_in_place_not_copied(backend, monkeypatch):
    """The last chain's gradient comes from the head's mean in NCHW, its input is channels-last:
    the backward plan reads the gradient in its own layout (a copy would cost an activation's
    worth of memory at the step's peak)."""
    if backend == "triton":
        monkeypatch.setenv("FUSIONPLAN_BACKEND", "triton")
    twin, model, fused = _pair("relu")
    x = torch.randn(2, 3, 6, 5).to(memory_format=torch.channels_last)
    weights = torch.randn(2, 5)
    copies, like = [], torch_train._like
    monkeypatch.setattr(torch_train, "_like", lambda t, model: copies.append(t.stride()) or like(t, model))
    _assert_step_matches(fused, twin, x, weights)
    assert copies == []


def _saved_bytes(module: nn.Module, x: torch.Tensor) -> int:
    """The bytes of the distinct storages autograd keeps for the backward of one forward."""
    storages: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        module(x).sum().backward()
    return sum(storages.values())


@pytest.mark.parametrize("act", ["relu", "silu"])
def test_the_fused_step_keeps_fewer_activations_than_eager(act):
    """The chains keep the batch-norm's input alone (its output is recomputed in the backward), a
    ReLU after a residual add its output, shared with the next layer's input, as eager's does."""
    twin, _, fused = _pair(act)
    x = torch.randn(4, 3, 32, 32).to(memory_format=torch.channels_last)
    eager, ours = _saved_bytes(twin, x), _saved_bytes(fused, x)
    assert ours < eager, (ours, eager)


def test_a_fused_model_trains_under_distributed_data_parallel(tmp_path):
    """One process of the gloo backend: DDP's gradient hooks see the fused chains' gradients."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        twin, model, fused = _pair()
        wrapped = DistributedDataParallel(fused)
        x, weights = torch.randn(4, 3, 13, 11), torch.randn(4, 5)
        _assert_step_matches(wrapped, twin, x, weights)
    finally:
        dist.destroy_process_group()


def test_eval_mode_with_gradients_wanted_gives_eager_gradients():
    """Eval mode outside no_grad (a saliency map, fine-tuning through a frozen model): the forward
    is fused, and the input's and the parameters' gradients are eager's."""
    twin, model, fused = _pair("silu")
    twin.eval(), fused.eval()
    _assert_step_matches(fused, twin, torch.randn(4, 3, 13, 11), torch.randn(4, 5))
    assert any(not s.startswith("training") for v in fused.fusion_report.solvers().values() for s in v)


def test_a_frozen_batch_norm_in_a_training_model_uses_its_running_statistics():
    twin, model, fused = _pair()
    for m in (twin, fused):
        m.get_submodule("bn1").eval()  # frozen, as in fine-tuning
    x, weights = torch.randn(4, 3, 13, 11), torch.randn(4, 5)
    _assert_step_matches(fused, twin, x, weights)
    assert fused.get_submodule("bn1").num_batches_tracked.item() == 0


def test_one_value_per_channel_is_refused_as_eager_refuses_it():
    twin, model, fused = _pair()
    x = torch.randn(1, 8, 1, 1)
    chain = next(c for c in fused.fusion_report.chains.values() if c._refs[0] is None)  # bn3 -> act3
    with pytest.raises(ValueError, match="more than 1 value per channel"):
        chain(x)
    with pytest.raises(ValueError, match="more than 1 value per channel"):
        twin.act3(twin.bn3(x))


class _RandomNet(nn.Module):
    """A random stack of the chain kinds fuse takes: conv (grouped, strided, with or without a
    bias) -> batch-norm (momentum or None) -> [+ the block's input] -> activation."""

    def __init__(self, seed: int) -> None:
        super().__init__()
        import random

        r = random.Random(seed)
        self.blocks = nn.ModuleList()
        self.residual = []
        c = 3
        for _ in range(r.randint(2, 4)):
            k = r.choice([4, 6, 8])
            groups = r.choice([g for g in (1, 2) if c % g == 0 and k % g == 0])
            stride = r.choice([1, 1, 2])
            conv = nn.Conv2d(c, k, r.choice([1, 3]), stride, padding="same" if stride == 1 else 1, groups=groups,
                             bias=r.random() < 0.5)  # fmt: skip
            bn = nn.BatchNorm2d(k, momentum=r.choice([0.1, 0.3, None]))
            act = copy.deepcopy(ACTIVATIONS[r.choice(list(ACTIVATIONS))])
            self.blocks.append(nn.ModuleList([conv, bn, act]))
            self.residual.append(stride == 1 and c == k and r.random() < 0.6)
            c = k
        self.head = nn.Linear(c, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for (conv, bn, act), residual in zip(self.blocks, self.residual):
            y = bn(conv(x))
            x = act(y + x) if residual else act(y)
        return self.head(x.mean((2, 3)))


@pytest.mark.parametrize(("seed", "backend"), [*((s, "any") for s in range(8)), (8, "triton"), (9, "triton")])
def test_random_models_train_as_eager_does(seed, backend, monkeypatch):
    if backend == "triton":  # the Triton training kernels, through the interpreter
        monkeypatch.setenv("FUSIONPLAN_BACKEND", "triton")
    model = _randomized(_RandomNet(seed)).train()
    twin = copy.deepcopy(model)
    fused = fpt.fuse(model)
    assert len(fused.fusion_report.fused) == len(model.blocks), fused.fusion_report
    torch.manual_seed(seed)
    for _ in range(2):
        x = torch.randn(3, 3, 9, 10)
        if seed % 2:
            x = x.to(memory_format=torch.channels_last)
        for m in (fused, twin):
            m.zero_grad()
        _assert_step_matches(fused, twin, x, torch.randn(3, 5))


@pytest.mark.parametrize("seed", range(10, 14))
def test_random_models_in_eval_mode_give_eager_gradients(seed):
    model = _randomized(_RandomNet(seed)).eval()
    twin = copy.deepcopy(model)
    fused = fpt.fuse(model)
    x = torch.randn(2, 3, 9, 10)
    _assert_step_matches(fused, twin, x, torch.randn(2, 5))
    with torch.no_grad():
        torch.testing.assert_close(fused(x), twin(x), rtol=1e-4, atol=1e-4)


def test_a_training_step_keeps_none_of_its_activations_after_it():
    """The plans remember the calls they checked, to skip the checks of calls like them; that
    memory lasts only as long as the call's arguments. A training step's records hold its
    activations (the backward's record holds the batch-norm's input): once the step is over they
    are freed, not kept by the plans for later steps."""
    import gc
    import weakref

    from fusionplan.core.enums import ActivationMode

    bn = nn.BatchNorm2d(8).train()
    freed = []
    for _ in range(3):
        h = torch.randn(2, 8, 5, 5, requires_grad=True)
        y, solver = torch_train.batchnorm_activation_training(bn, h, (ActivationMode.RELU, 1.0, 0.0, 1.0))
        assert y is not None, solver
        y.backward(torch.randn_like(y))
        freed.append(weakref.ref(h))
        del h, y
    gc.collect()
    assert [ref() is None for ref in freed] == [True, True, True]


def _count_checked_executes(monkeypatch) -> list:
    """Each training plan call that went through execute's checks, appended as it comes."""
    from fusionplan.plan import FusionPlan

    checked, execute = [], FusionPlan.execute

    def counting(self, *args, **kwargs):
        checked.append(self)
        return execute(self, *args, **kwargs)

    monkeypatch.setattr(FusionPlan, "execute", counting)
    return checked


def test_a_training_call_like_a_checked_one_skips_the_checks_and_stays_right(monkeypatch):
    """The second step's plan calls read tensors laid out as the first step's and the same module
    tensors: none is checked again but the forward of bn3 (momentum None: its update factor, an
    argument the checks read, changes every step), and the step still matches eager."""
    twin, model, fused = _pair()
    x, weights = torch.randn(4, 3, 13, 11), torch.randn(4, 5)
    checked = _count_checked_executes(monkeypatch)
    _assert_step_matches(fused, twin, x, weights)
    first = len(checked)
    assert first >= 4  # three chains' forwards and backwards, some plans shared
    fused.zero_grad(), twin.zero_grad()
    _assert_step_matches(fused, twin, torch.randn(4, 3, 13, 11), weights)
    assert len(checked) == first + 1


def test_a_new_module_tensor_or_layout_is_checked_again(monkeypatch):
    """What the skipped checks depended on changes: the call is checked again, and a parameter
    that does not fit its batch-norm gets the typed error, nothing run."""
    from fusionplan.core.enums import ActivationMode
    from fusionplan.core.errors import FusionPlanError

    relu = (ActivationMode.RELU, 1.0, 0.0, 1.0)
    bn = nn.BatchNorm2d(8).train()
    checked = _count_checked_executes(monkeypatch)
    for _ in range(2):
        y, _ = torch_train.batchnorm_activation_training(bn, torch.randn(2, 8, 5, 5), relu)
    assert len(checked) == 1
    torch_train.batchnorm_activation_training(bn, torch.randn(2, 8, 5, 5).to(memory_format=torch.channels_last), relu)
    assert len(checked) == 2  # another layout: another plan, checked
    bn.weight = nn.Parameter(torch.randn(8))
    torch_train.batchnorm_activation_training(bn, torch.randn(2, 8, 5, 5), relu)
    assert len(checked) == 3  # another weight tensor: checked again
    running = bn.running_mean.clone()
    bn.weight = nn.Parameter(torch.randn(9))
    with pytest.raises(FusionPlanError, match="scale"):
        torch_train.batchnorm_activation_training(bn, torch.randn(2, 8, 5, 5), relu)
    torch.testing.assert_close(bn.running_mean, running)  # nothing written


def _count_plan_calls(monkeypatch) -> list:
    """Each training plan call that built argument records (checked or vouched), as it comes."""
    from fusionplan.plan import FusionPlan

    calls = []
    for name in ("execute", "execute_vouched"):
        original = getattr(FusionPlan, name)

        def counting(self, *args, _original=original, _name=name, **kwargs):
            calls.append(_name)
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(FusionPlan, name, counting)
    return calls


def test_a_call_like_an_earlier_one_runs_its_repeat_without_records(monkeypatch):
    """From the second step on, each chain's plans run the repeat the first step bound (the
    call's tensors straight to the kernel, no argument records): no plan call but bn3's forward
    (momentum None: its factor changes every step, so its key does), and every step matches eager."""
    twin, model, fused = _pair()
    weights = torch.randn(4, 5)
    calls = _count_plan_calls(monkeypatch)
    _assert_step_matches(fused, twin, torch.randn(4, 3, 13, 11), weights)
    assert len(calls) >= 4
    for _ in range(3):
        del calls[:]
        fused.zero_grad(), twin.zero_grad()
        _assert_step_matches(fused, twin, torch.randn(4, 3, 13, 11), weights)
        assert calls == ["execute"], calls  # bn3's forward: a new factor, checked


@pytest.mark.parametrize("change", ["new tensor", "strided view", "edited in place"])
def test_a_changed_module_tensor_is_not_run_by_the_old_repeat(change, monkeypatch):
    """A batch-norm weight set anew (another object, or a strided view of other memory): the call
    builds its records and is checked again. Edited in place (an optimizer's step): the repeat
    runs and reads the new values. Each result is eager's."""
    from fusionplan.core.enums import ActivationMode

    relu = (ActivationMode.RELU, 1.0, 0.0, 1.0)
    bn = _randomized(nn.BatchNorm2d(8)).train()
    twin = copy.deepcopy(bn)
    calls = _count_plan_calls(monkeypatch)

    def step() -> None:
        h, dy = torch.randn(2, 8, 5, 5), torch.randn(2, 8, 5, 5)
        h1, h2 = h.clone().requires_grad_(True), h.clone().requires_grad_(True)
        y, solver = torch_train.batchnorm_activation_training(bn, h1, relu)
        assert y is not None, solver
        want = F.relu(twin(h2))
        torch.testing.assert_close(y, want, rtol=1e-5, atol=1e-5)
        y.backward(dy), want.backward(dy)
        torch.testing.assert_close(h1.grad, h2.grad, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(bn.weight.grad, twin.weight.grad, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(bn.running_mean, twin.running_mean, rtol=1e-5, atol=1e-5)
        bn.weight.grad = twin.weight.grad = None

    step(), step()
    assert calls == ["execute", "execute"], calls  # the second step: repeats alone
    new = torch.randn(8)
    with torch.no_grad():
        if change == "new tensor":
            bn.weight = nn.Parameter(new.clone())
        elif change == "strided view":
            bn.weight.data = torch.stack([new, torch.randn(8)], 1)[:, 0]
        else:
            bn.weight.copy_(new)
        twin.weight.copy_(new)
    del calls[:]
    step()
    assert calls == ([] if change == "edited in place" else ["execute", "execute"]), calls


def test_the_default_repeat_builds_the_records_around_the_new_tensors():
    """Kernel.repeat_with_tensors' default (the CPU training kernel's): the call repeated on other
    tensors in slot order writes what execute_vouched writes on records of those tensors."""
    import fusionplan as fp
    from fusionplan.core.enums import BatchNormMode
    from fusionplan.core.ops import BatchNormForwardArgs

    def call_tensors() -> list:
        """[y, x, scale, bias, saved mean, saved inverse deviation, running mean, running variance]"""
        return [
            torch.full((2, 8, 5, 5), float("nan")), torch.randn(2, 8, 5, 5), torch.randn(1, 8, 1, 1),
            torch.randn(1, 8, 1, 1),
            torch.full((1, 8, 1, 1), float("nan")), torch.full((1, 8, 1, 1), float("nan")),
            torch.randn(1, 8, 1, 1), torch.rand(1, 8, 1, 1) + 0.5,
        ]  # fmt: skip

    def record(t: list) -> BatchNormForwardArgs:
        return BatchNormForwardArgs(
            scale=t[2], bias=t[3], saved_mean=t[4], saved_inv_variance=t[5], running_mean=t[6],
            running_variance=t[7], exp_avg_factor=0.3, epsilon=1e-4,
        )  # fmt: skip

    plan = fp.FusionPlan(fp.TensorDescriptor.packed("float", (2, 8, 5, 5)))
    plan.add_batchnorm_forward(BatchNormMode.SPATIAL, True)
    handle = fp.Handle("cpu")
    plan.compile(handle)
    first = call_tensors()
    plan.execute_vouched(handle, first[1], first[0], [record(first)])
    repeat = plan.vouched_repeat(handle, first[1], first[0], [record(first)])
    assert repeat is not None
    again = call_tensors()
    want = [t.clone() for t in again]
    assert repeat(again)
    plan.execute_vouched(handle, want[1], want[0], [record(want)])
    for got, expected in zip(again, want):
        assert not got.isnan().any()
        torch.testing.assert_close(got, expected, rtol=0, atol=0)
