"""fusionplan.torch.fuse on a ResNet-like model: same outputs, report, state_dict, torch.compile."""

import copy

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import fusionplan as fp
import fusionplan.torch as fpt
from fusionplan.runtime.codegen import interpreter_active


class ConvBNAct(nn.Module):
    def __init__(self, c, k, stride=1, groups=1, act=None):
        super().__init__()
        self.conv = nn.Conv2d(c, k, 3, stride, 1, groups=groups, bias=False)
        self.bn = nn.BatchNorm2d(k)
        self.act = act if act is not None else nn.ReLU(inplace=True)

    def forward(self, x):
        return self.act(self.bn(self.conv(x)))


class Residual(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.a = ConvBNAct(c, c)
        self.b = nn.Conv2d(c, c, 1)
        self.bn = nn.BatchNorm2d(c)

    def forward(self, x):
        return F.relu(x + self.bn(self.b(self.a(x))))


class TinyResNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = ConvBNAct(3, 8, stride=2)
        self.res = Residual(8)
        self.dw = ConvBNAct(8, 8, groups=8, act=nn.ReLU6())
        self.pw = ConvBNAct(8, 12, act=nn.LeakyReLU(0.2))
        self.e = ConvBNAct(12, 12, act=nn.ELU(0.7))
        self.s = ConvBNAct(12, 12, act=nn.Sigmoid())
        self.t = nn.Conv2d(12, 16, 3, padding=1)
        self.bn_t = nn.BatchNorm2d(16)
        self.reflect = nn.Conv2d(16, 16, 3, padding=1, padding_mode="reflect")
        self.bn_alone = nn.BatchNorm2d(16)
        self.head = nn.Linear(16, 5)

    def forward(self, x):
        x = self.stem(x)
        x = self.res(x)
        x = self.s(self.e(self.pw(self.dw(x))))
        x = torch.tanh(self.bn_t(self.t(x)))
        x = self.bn_alone(self.reflect(x))
        return self.head(x.mean((2, 3)))


def model():
    torch.manual_seed(0)
    return randomize_bn(TinyResNet().eval())


def randomize_bn(m: nn.Module) -> nn.Module:
    """Batch-norm statistics and affine parameters away from the identity."""
    for mod in m.modules():
        if isinstance(mod, nn.BatchNorm2d):
            mod.running_mean.normal_()
            mod.running_var.uniform_(0.5, 2.0)
            mod.weight.data.normal_()
            mod.bias.data.normal_()
    return m


def test_fuse_matches_eager_and_reports():
    m = model()
    x = torch.randn(2, 3, 20, 18)
    fused = fpt.fuse(m, (x,))
    torch.testing.assert_close(fused(x), m(x), rtol=1e-4, atol=1e-5)
    report = fused.fusion_report
    assert len(report.fused) == 8, str(report)
    text = str(report)
    for chain in (
        "stem.conv (Conv2d) -> stem.bn (BatchNorm2d) -> stem.act (ReLU)",
        "dw.act (ReLU6)",
        "pw.act (LeakyReLU)",
        "e.act (ELU)",
        "s.act (Sigmoid)",
        "t (Conv2d) -> bn_t (BatchNorm2d) -> tanh",
        "res.b (Conv2d) -> res.bn (BatchNorm2d) -> add -> relu",  # the residual connection joins the chain
    ):
        assert chain in text, chain
    assert "reflect: padding_mode='reflect'" in text
    assert "bn_alone: a batch-norm alone is left to PyTorch" in text
    assert isinstance(fused.get_submodule("reflect"), nn.Conv2d)  # untouched


def test_the_report_names_the_solvers_that_ran(monkeypatch):
    monkeypatch.delenv("FUSIONPLAN_BACKEND", raising=False)
    fused = fpt.fuse(model())
    report = fused.fusion_report
    assert set(report.solvers()) == {entry.split(":")[0] for entry in report.fused}
    assert all(ran == [] for ran in report.solvers().values()) and "[" not in str(report).split("skipped")[0]
    fused(torch.randn(2, 3, 20, 18))
    assert all(ran == ["cpu-folded"] for ran in report.solvers().values()), report.solvers()
    assert str(report).count("[cpu-folded]") == len(report.fused)


def test_state_dict_round_trips():
    m = model()
    fused = fpt.fuse(m)
    assert set(fused.state_dict()) == set(m.state_dict())
    fresh = TinyResNet().eval()
    fresh.load_state_dict(fused.state_dict())
    x = torch.randn(1, 3, 16, 16)
    torch.testing.assert_close(fresh(x), m(x))
    other = model()
    with torch.no_grad():
        for p in other.parameters():
            p.mul_(0.5)
    fused.load_state_dict(other.state_dict())  # the fused model reads the loaded parameters
    torch.testing.assert_close(fused(x), other(x), rtol=1e-4, atol=1e-5)


def test_torch_compile_and_layouts():
    m = model()
    fused = fpt.fuse(m)
    x = torch.randn(2, 3, 16, 16)
    torch.testing.assert_close(torch.compile(fused)(x), m(x), rtol=1e-4, atol=1e-5)
    cl = fused.to(memory_format=torch.channels_last)
    torch.testing.assert_close(cl(x.to(memory_format=torch.channels_last)), m(x), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(fused.double()(x.double()), m.double()(x.double()), rtol=1e-10, atol=1e-10)


def test_torch_export_keeps_the_fused_chains_and_the_models_parameters():
    m = model()
    fused = fpt.fuse(m)
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        fused(x)  # an eager call first: export must not trace the repeat path
        exported = torch.export.export(fused, (x,))
        chains = [n for n in exported.graph.nodes if n.op == "call_function" and "fused_chain" in str(n.target)]
        assert len(chains) == len(fused.fusion_report.fused)
        assert set(exported.state_dict) <= set(m.state_dict())  # the model's names, no copies
        fresh = torch.randn(2, 3, 16, 16)
        torch.testing.assert_close(exported.module()(fresh), m(fresh), rtol=1e-4, atol=1e-5)


def test_torch_compile_traces_many_chains_in_one_graph_after_eager_calls():
    """Twelve chains of different strides and paddings, called eagerly first (the repeat path set):
    torch.compile traces the model as one graph, without breaks (which recompiled per chain)."""
    layers = []
    for i in range(12):
        size = 3 if i % 2 else 1
        layers += [nn.Conv2d(8, 8, size, 1 + (i % 3 == 2), size // 2), nn.BatchNorm2d(8), nn.ReLU()]
    m = randomize_bn(nn.Sequential(*layers).eval())
    fused = fpt.fuse(m)
    x = torch.randn(2, 8, 32, 32)
    with torch.no_grad():
        fused(x), fused(x)
        torch._dynamo.reset()
        explained = torch._dynamo.explain(fused)(x)
        assert (explained.graph_count, explained.graph_break_count) == (1, 0), explained.break_reasons
        torch._dynamo.reset()
        torch.testing.assert_close(torch.compile(fused)(x), m(x), rtol=1e-4, atol=1e-5)


def test_a_model_fuses_in_training_mode_and_shares_its_parameters():
    """(tests/test_torch_train.py checks training itself.)"""
    m = model().train()
    with pytest.raises(fp.BadParmError, match="eval mode"):
        fpt.fuse(m, (torch.randn(1, 3, 16, 16),))
    fused = fpt.fuse(m)
    assert fused.training and all(chain.training for chain in fused.fusion_report.chains.values())
    assert {id(t) for t in fused.state_dict(keep_vars=True).values()} == {
        id(t) for t in m.state_dict(keep_vars=True).values()
    }
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        torch.testing.assert_close(fused(x), copy.deepcopy(m)(x), rtol=1e-4, atol=1e-4)


def test_example_inputs_check_outputs():
    m = model()
    fused = fpt.fuse(m, (torch.randn(1, 3, 16, 16),), verbose=True)
    assert fused.fusion_report.fused


def test_an_untraceable_forward_is_a_typed_error_naming_the_model():
    class HostRead(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv, self.bn = nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4)

        def forward(self, x):
            y = self.bn(self.conv(x))
            return y * float(y.mean())

    with pytest.raises(fp.UnsupportedOpError, match=r"cannot trace HostRead\.forward \(TypeError: float"):
        fpt.fuse(HostRead().eval())


def test_dlpack_input_to_a_fused_chain():
    m = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU()).eval()
    fused = fpt.fuse(m)
    x = np.random.default_rng(0).standard_normal((1, 3, 8, 8), dtype=np.float32)
    chain = fused.get_submodule("fused_chain_0")
    torch.testing.assert_close(chain(x), m(torch.from_numpy(x)))


@pytest.mark.skipif(not interpreter_active(), reason="needs Triton's interpreter")
def test_fused_model_through_the_triton_kernels(monkeypatch):
    monkeypatch.setenv("FUSIONPLAN_BACKEND", "triton")
    fpt.PLANS.clear()
    m = nn.Sequential(
        ConvBNAct(3, 8, stride=2), ConvBNAct(8, 8, groups=8), nn.Conv2d(8, 8, 1), nn.BatchNorm2d(8), nn.ReLU()
    ).eval()
    for mod in m.modules():
        if isinstance(mod, nn.BatchNorm2d):
            mod.running_var.uniform_(0.5, 2.0)
    x = torch.randn(1, 3, 12, 10)
    fused = fpt.fuse(m)
    torch.testing.assert_close(fused(x), m(x), rtol=1e-4, atol=1e-5)
    # this model's chains only (the process-wide PLANS may gain plans that other tests compile on threads)
    solvers = {s for chain in fused.fusion_report.solvers().values() for s in chain}
    assert solvers == {"triton-stem", "triton-depthwise"}  # C=3 and C=8 read as row stretches; depthwise its own
    fpt.PLANS.clear()


def test_inference_mode():
    m = model()
    fused = fpt.fuse(m)
    x = torch.randn(1, 3, 16, 16)
    with torch.inference_mode():
        torch.testing.assert_close(fused(x), m(x), rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(fused(x), m(x), rtol=1e-4, atol=1e-5)


def test_eager_calls_skip_the_dispatcher_and_watched_calls_go_through_the_op():
    from torch.utils._python_dispatch import TorchDispatchMode

    seen: list[str] = []

    class Recorder(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append(str(func))
            return func(*args, **(kwargs or {}))

    m = model()
    fused = fpt.fuse(m)
    x = torch.randn(2, 3, 16, 16)
    assert fpt._eager_call(x)
    direct = fused(x)
    with Recorder():
        watched = fused(x)
    assert any("fusionplan.fused_chain" in s for s in seen)
    torch.testing.assert_close(direct, watched)
    torch.testing.assert_close(direct, m(x), rtol=1e-4, atol=1e-5)


class ResidualAdd(nn.Module):
    """conv -> bn -> (+ other) -> relu, with the add written in several ways."""

    def __init__(self, how: str) -> None:
        super().__init__()
        self.how = how
        self.conv, self.bn = nn.Conv2d(8, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8)
        self.shift = nn.Parameter(torch.randn(1, 8, 1, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.bn(self.conv(x))
        if self.how == "plus":
            out = x + out
        elif self.how == "iadd-out":
            out += x
        elif self.how == "alpha":  # a scaled add is not a residual connection
            out = torch.add(out, x, alpha=2.0)
        elif self.how == "method":
            out = out.add(x)
        elif self.how == "broadcast":
            out = out + self.shift
        return torch.relu(out)


@pytest.mark.parametrize("how", ["plus", "iadd-out", "method", "broadcast", "alpha"])
def test_residual_adds_join_the_chain(how):
    m = ResidualAdd(how).eval()
    m.bn.running_var.uniform_(0.5, 2.0)
    fused = fpt.fuse(m)
    (chain,) = fused.fusion_report.fused
    joined = how != "alpha"
    assert ("add" in chain) == joined, chain
    x = torch.randn(2, 8, 9, 7)
    with torch.no_grad():
        torch.testing.assert_close(fused(x.clone()), m(x.clone()), rtol=1e-4, atol=1e-5)
        if joined:
            compiled = torch.compile(fused)
            torch.testing.assert_close(compiled(x.clone()), m(x.clone()), rtol=1e-4, atol=1e-5)


@pytest.mark.skipif(not interpreter_active(), reason="needs Triton's interpreter")
def test_residual_chain_through_the_triton_kernels(monkeypatch):
    monkeypatch.setenv("FUSIONPLAN_BACKEND", "triton")
    fpt.PLANS.clear()
    m = ResidualAdd("plus").eval()
    m.bn.running_var.uniform_(0.5, 2.0)
    fused = fpt.fuse(m)
    x = torch.randn(1, 8, 10, 6)
    with torch.no_grad():
        torch.testing.assert_close(fused(x), m(x), rtol=1e-4, atol=1e-5)
    assert {plan.compiled_solver(handle) for plan, _, handle, _ in fpt.PLANS.values()} == {"triton-stem"}  # C=8
    fpt.PLANS.clear()


def test_fused_module_follows_replaced_and_changed_parameters():
    m = ResidualAdd("plus").eval()
    fused = fpt.fuse(m)  # a copy: its conv and bn are fused.conv and fused.bn
    x = torch.randn(1, 8, 6, 5)

    def expected():
        return torch.relu(x + fused.bn(fused.conv(x)))

    with torch.no_grad():
        fused(x)
        fused.conv.weight = nn.Parameter(torch.randn_like(fused.conv.weight))  # a new parameter object
        torch.testing.assert_close(fused(x), expected(), rtol=1e-4, atol=1e-5)
        fused.bn.running_mean.add_(0.5)  # in place: same object and storage, new version
        torch.testing.assert_close(fused(x), expected(), rtol=1e-4, atol=1e-5)
        fused.bn.weight.data = torch.randn(8)  # new storage under the same parameter object
        torch.testing.assert_close(fused(x), expected(), rtol=1e-4, atol=1e-5)

    with torch.no_grad():  # the same, after calls that took the repeat path
        for _ in range(2):
            fused(x)
        fused.bn.eps = 0.1  # a scalar argument
        torch.testing.assert_close(fused(x), expected(), rtol=1e-4, atol=1e-5)
        fused.conv.weight.mul_(2.0)
        torch.testing.assert_close(fused(x), expected(), rtol=1e-4, atol=1e-5)


def test_repeated_eager_calls_rerun_without_preparing_again(monkeypatch):
    m = ResidualAdd("plus").eval()
    fused = fpt.fuse(m)
    (chain,) = [mod for mod in fused.modules() if isinstance(mod, fpt.FusedChain)]
    prepared = []
    original = chain._run_prepared
    monkeypatch.setattr(chain, "_run_prepared", lambda *a: prepared.append(1) or original(*a))
    x = torch.randn(2, 8, 6, 5)
    with torch.no_grad():
        for _ in range(3):
            torch.testing.assert_close(fused(x.clone()), m(x.clone()), rtol=1e-4, atol=1e-5)
        assert len(prepared) == 1  # the first call prepared; the others repeated
        other = torch.randn(1, 8, 7, 5)  # another input shape: prepared again, then repeated
        for _ in range(2):
            torch.testing.assert_close(fused(other.clone()), m(other.clone()), rtol=1e-4, atol=1e-5)
        assert len(prepared) == 2
        strided = torch.randn(2, 8, 6, 5).to(memory_format=torch.channels_last)
        torch.testing.assert_close(fused(strided.clone()), m(strided.clone()), rtol=1e-4, atol=1e-5)
        assert len(prepared) == 3
    m.train()
    fused.train()  # batch statistics: the same outputs as the model's in training mode
    with torch.no_grad():
        torch.testing.assert_close(fused(x.clone()), copy.deepcopy(m)(x.clone()), rtol=1e-4, atol=1e-5)


def test_custom_op_repeats_calls_and_follows_parameter_changes():
    """The op reruns a call like an earlier one directly; parameters changed in place (a new
    version) or replaced are seen."""
    m = ResidualAdd("plus").eval()
    conv, bn = m.conv, m.bn
    x, r = torch.randn(1, 8, 6, 5), torch.randn(1, 8, 6, 5)

    def op(weight):
        params = (weight, None, bn.weight.detach(), bn.bias.detach(), bn.running_mean, bn.running_var)
        return fpt.fused_chain(x, *params, bn.eps, [1, 1], [1, 1], [1, 1], 1, 3, 1.0, 0.0, 1.0, r)

    def expected():
        return torch.relu(bn(conv(x)) + r)

    with torch.no_grad():
        for _ in range(3):
            torch.testing.assert_close(op(conv.weight.detach()), expected(), rtol=1e-4, atol=1e-5)
        bn.running_mean.add_(0.5)
        torch.testing.assert_close(op(conv.weight.detach()), expected(), rtol=1e-4, atol=1e-5)
        conv.weight.mul_(-1.0)
        torch.testing.assert_close(op(conv.weight.detach()), expected(), rtol=1e-4, atol=1e-5)
        new = torch.randn_like(conv.weight)
        conv.weight.copy_(new)
        torch.testing.assert_close(op(new), expected(), rtol=1e-4, atol=1e-5)


class Unfusable(nn.Module):
    """Chains that stop early: before SELU, CELU and Softsign (not fusionplan activations), and
    where a batch-norm's result has a second user."""

    def __init__(self):
        super().__init__()
        self.a, self.bn_a, self.selu = nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.SELU()
        self.b, self.bn_b = nn.Conv2d(8, 8, 1, bias=False), nn.BatchNorm2d(8)
        self.c, self.softsign = nn.Conv2d(8, 8, 3, padding=1), nn.Softsign()
        self.d, self.bn_d = nn.Conv2d(8, 8, 1, bias=False), nn.BatchNorm2d(8)

    def forward(self, x):
        x = self.selu(self.bn_a(self.a(x)))
        x = nn.functional.celu(self.bn_b(self.b(x)))
        x = self.softsign(self.c(x))
        y = self.bn_d(self.d(x))
        return torch.relu(y) + y


def test_chains_that_stop_early_are_reported_with_the_reason():
    m = randomize_bn(Unfusable().eval())
    x = torch.randn(2, 3, 9, 7)
    fused = fpt.fuse(m, (x,))
    torch.testing.assert_close(fused(x), m(x), rtol=1e-4, atol=1e-5)
    text = str(fused.fusion_report)
    assert len(fused.fusion_report.fused) == 4, text
    assert "selu: SELU is not one of fusionplan's activations: the chain ends before it" in text
    assert "celu: celu is not one of fusionplan's activations" in text
    assert "softsign: Softsign is not one of fusionplan's activations" in text
    assert "bn_d: its result has 2 users: the chain ends before it" in text
    assert len(fused.fusion_report.skipped) == 4, text


class Extensions(nn.Module):
    """conv -> batch-norm -> each of fusionplan's extension activations, as modules and functions."""

    def __init__(self):
        super().__init__()
        acts = [nn.SiLU(), nn.Hardswish(), nn.Hardsigmoid(), nn.GELU(), nn.GELU(approximate="tanh"), nn.Mish()]
        self.convs = nn.ModuleList(nn.Conv2d(6 if i else 3, 6, 3, padding=1, bias=False) for i in range(8))
        self.bns = nn.ModuleList(nn.BatchNorm2d(6) for _ in range(8))
        self.acts = nn.ModuleList(acts)

    def forward(self, x):
        for conv, bn, act in zip(self.convs, self.bns, self.acts):
            x = act(bn(conv(x)))
        x = nn.functional.silu(self.bns[6](self.convs[6](x)))
        return nn.functional.gelu(self.bns[7](self.convs[7](x)), approximate="tanh")


@pytest.mark.parametrize("backend", ["cpu", "triton"])
def test_extension_activations_fuse(backend, monkeypatch):
    """SiLU, Hardswish, Hardsigmoid, GELU (both forms) and Mish join the chain, on the CPU solvers
    and the Triton kernels (the interpreter), and match eager."""
    if backend == "triton":
        pytest.importorskip("triton")
        monkeypatch.setenv("FUSIONPLAN_BACKEND", "triton")
    m = randomize_bn(Extensions().eval())
    x = torch.randn(2, 3, 6, 5)
    fused = fpt.fuse(m, (x,))
    report = fused.fusion_report
    assert len(report.fused) == 8 and not report.skipped, str(report)
    for name in ("SiLU", "Hardswish", "Hardsigmoid", "GELU", "Mish", "silu", "gelu"):
        assert name in str(report), name
    torch.testing.assert_close(fused(x), m(x), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("grad", [False, True])
def test_an_input_the_plan_refuses_gets_the_modules_own_answer(grad):
    """An eval-mode call whose geometry the plan refuses (the input smaller than the filter) runs
    the chain in torch's operations: eager's own error, here torch's RuntimeError, not the plan's
    BadParmError; and the fusion report says the chain ran eagerly and why. A fitting input after
    it still runs the plan."""
    model = nn.Sequential(nn.Conv2d(2, 4, 3), nn.BatchNorm2d(4), nn.ReLU()).eval()
    fused = fpt.fuse(copy.deepcopy(model))
    x = torch.randn(1, 2, 2, 5, requires_grad=grad)
    with pytest.raises(RuntimeError) as eager_error:
        model(x)
    with pytest.raises(RuntimeError) as fused_error:
        fused(x)
    assert type(fused_error.value) is type(eager_error.value) and not isinstance(fused_error.value, fp.FusionPlanError)
    (solvers,) = fused.fusion_report.solvers().values()
    assert any(s.startswith("eagerly: the plan refuses the call (convolution output would be empty") for s in solvers)
    fitting = torch.randn(1, 2, 6, 6)
    torch.testing.assert_close(fused(fitting), model(fitting), rtol=1e-5, atol=1e-5)
    (solvers,) = fused.fusion_report.solvers().values()
    assert any(not s.startswith("eagerly") for s in solvers), solvers


@pytest.mark.parametrize("grad", [False, True])
def test_refresh_after_edits_behind_torchs_back(grad):
    """Edits through ``.data`` move no version counter, so the fused chains' derived weights (the
    batch-norm folded into the convolution) stay as they were; ``refresh()`` derives them again
    from the current values, for this model, and leaves the other fused models right."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU()).eval()
    with torch.no_grad():
        model[1].running_mean.normal_(), model[1].weight.normal_()
    other_model = copy.deepcopy(model)
    fused, other = fpt.fuse(model), fpt.fuse(other_model)
    x = torch.randn(2, 3, 8, 8, requires_grad=grad)
    with torch.set_grad_enabled(grad):
        for _ in range(2):  # the second call: the repeat path
            fused(x), other(x)
        model[1].weight.data.mul_(2.0)
        model[0].weight.data.add_(0.5)
        assert fused.refresh() is fused
        for _ in range(2):
            torch.testing.assert_close(fused(x), model(x), rtol=1e-4, atol=1e-4)
            torch.testing.assert_close(other(x), other_model(x), rtol=1e-4, atol=1e-4)


def test_the_custom_op_answers_a_refused_call_as_torch_does():
    """fusionplan::fused_chain (what torch.compile and export see) on an input its plan refuses
    (smaller than the filter): torch's own RuntimeError, as the unfused modules raise it; on one
    that fits, the fused chain's answer, which matches the modules'."""
    from fusionplan.torch_op import fused_chain

    conv, bn = nn.Conv2d(2, 4, 3), nn.BatchNorm2d(4).eval()
    with torch.no_grad():
        bn.running_mean.normal_(), bn.running_var.uniform_(0.5, 2.0)

    def op(x):
        with torch.no_grad():
            return fused_chain(
                x, conv.weight, conv.bias, bn.weight, bn.bias, bn.running_mean, bn.running_var, bn.eps,
                [1, 1], [0, 0], [1, 1], 1, int(fp.ActivationMode.RELU), 1.0, 0.0, 1.0, None, None,
            )  # fmt: skip

    with pytest.raises(RuntimeError) as refused:
        op(torch.randn(1, 2, 2, 5))
    assert not isinstance(refused.value, fp.FusionPlanError), refused.value
    fitting = torch.randn(1, 2, 6, 6)
    with torch.no_grad():
        torch.testing.assert_close(op(fitting), F.relu(bn(conv(fitting))), rtol=1e-5, atol=1e-5)
