"""compile_all (many plans on several threads) and FusedModel.prepare (a model's plans compiled
before its first call)."""

import copy
import threading

import pytest
import torch

import fusionplan as fp
import fusionplan.torch as fpt
from fusionplan import compiling
from fusionplan.plan import FusionPlan
from fusionplan.tools.verify import add_chain, compare, random_args, reference_output

from .test_torch_fuse import model
from .util import make_input


def chain_plan(c: int, k: int, h: int = 9, w: int = 7, chain: str = "CBNA", layout: str = "NCHW") -> fp.FusionPlan:
    x = make_input((2, c, h, w), torch.float32, layout)
    plan = fp.FusionPlan(fp.TensorDescriptor.from_tensor(x))
    return add_chain(plan, chain, conv=fp.ConvolutionDescriptor((1, 1)), k=k, r=3, s=3)


def execute_matches_reference(plan: fp.FusionPlan, handle: fp.Handle) -> None:
    x = make_input(plan.input_desc.dims, torch.float32)
    if plan.input_desc.strides[1] == 1:
        x = x.to(memory_format=torch.channels_last)
    args = random_args(plan)
    y = torch.full(plan.output_desc.dims, float("nan"))
    plan.execute(handle, x, y, args)
    assert compare(y, reference_output(plan, x, args)).rel_norm < 1e-5


def test_compile_all_compiles_each_plan_as_compile_would():
    handle = fp.Handle("cpu")
    plans = [chain_plan(3, 5), chain_plan(4, 17, 13, 11, "CNA", "NHWC"), chain_plan(6, 6, chain="CB")]
    solvers = fp.compile_all(plans, handle, workers=3)
    assert solvers == [p.compiled_solver(handle) for p in plans]
    assert solvers[0] == chain_plan(3, 5).compile(fp.Handle("cpu"))
    for plan in plans:
        execute_matches_reference(plan, handle)


def test_compile_all_in_the_interpreter_with_a_forced_backend():
    handle = fp.Handle("cpu")
    plans = [chain_plan(3, 5, 6, 5), chain_plan(4, 8, 5, 6, "CA")]
    assert set(fp.compile_all(plans, handle, backend="triton", workers=2)) <= {
        v.solver for p in plans for v in p.explain(handle) if v.applicable
    }
    for plan in plans:
        assert plan.compiled_solver(handle).startswith("triton")
        execute_matches_reference(plan, handle)


def test_plans_compile_at_the_same_time(monkeypatch):
    """Two plans meet at a barrier inside their kernel builds: compiled one after the other, the
    first would wait alone and the barrier would break."""
    barrier = threading.Barrier(2, timeout=20)
    build = FusionPlan._kernel

    def meeting_build(chosen, spec, handle):
        barrier.wait()
        return build(chosen, spec, handle)

    monkeypatch.setattr(FusionPlan, "_kernel", staticmethod(meeting_build))
    plans = [chain_plan(3, 5), chain_plan(3, 7)]
    assert len(fp.compile_all(plans, fp.Handle("cpu"), workers=2)) == 2
    assert not barrier.broken


def test_plans_of_one_kernel_build_it_once(monkeypatch):
    builds: list[str] = []
    build = FusionPlan._kernel

    def counted(chosen, spec, handle):
        builds.append(spec.signature())
        return build(chosen, spec, handle)

    monkeypatch.setattr(FusionPlan, "_kernel", staticmethod(counted))
    plans = [chain_plan(3, 5), chain_plan(3, 5), chain_plan(3, 6), chain_plan(3, 5)]
    leaders, followers = compiling._by_kernel(plans)
    assert (leaders, followers) == ([0, 2], [1, 3])
    handle = fp.Handle("cpu")
    fp.compile_all(plans, handle, workers=4)
    assert all(p.is_compiled(handle) for p in plans)
    assert len(builds) == 4 and len(set(builds)) == 2  # the followers' builds are the handle's cache hits
    assert len(handle.kernels) == 2


def fail_the_build_of(monkeypatch, bad: fp.FusionPlan) -> None:
    """Kernel builds fail for plans of ``bad``'s signature (and only those)."""
    build = FusionPlan._kernel

    def failing(chosen, spec, handle):
        if spec.signature() == bad.spec().signature():
            raise RuntimeError("this tile does not fit")
        return build(chosen, spec, handle)

    monkeypatch.setattr(FusionPlan, "_kernel", staticmethod(failing))


def test_a_failing_plan_is_named_and_the_others_stay_compiled(monkeypatch):
    bad = chain_plan(5, 9)
    fail_the_build_of(monkeypatch, bad)
    plans = [chain_plan(3, 5), bad, chain_plan(4, 4)]
    handle = fp.Handle("cpu")
    with pytest.raises(fp.InternalError, match=r"1 of 3 plans did not compile: plans\[1\] \(.*\): InternalError"):
        fp.compile_all(plans, handle, workers=2)
    assert [p.is_compiled(handle) for p in plans] == [True, False, True]


def test_then_runs_for_each_compiled_plan_on_the_compiling_threads(monkeypatch):
    bad = chain_plan(5, 9)
    fail_the_build_of(monkeypatch, bad)
    plans = [chain_plan(3, 5), bad, chain_plan(3, 5), chain_plan(4, 4)]  # plans[2] follows plans[0]
    handle = fp.Handle("cpu")
    seen: list[tuple[int, bool, str]] = []

    def then(i):
        seen.append((i, plans[i].is_compiled(handle), threading.current_thread().name))

    with pytest.raises(fp.InternalError, match=r"1 of 4 plans did not compile"):
        fp.compile_all(plans, handle, workers=2, then=then)
    assert sorted(i for i, _, _ in seen) == [0, 2, 3]  # not the failed plan
    assert all(compiled for _, compiled, _ in seen)
    assert all(name.startswith("fusionplan-compile") for i, _, name in seen if i != 2)


def test_an_error_of_then_is_raised_after_every_plan_compiled():
    plans = [chain_plan(3, 5), chain_plan(4, 4), chain_plan(3, 7)]
    handle = fp.Handle("cpu")

    def then(i):
        if i == 0:
            raise ValueError("its first call failed")

    with pytest.raises(ValueError, match="its first call failed"):
        fp.compile_all(plans, handle, workers=2, then=then)
    assert all(p.is_compiled(handle) for p in plans)


@pytest.mark.parametrize(
    "plans, handle, workers, match",
    [
        ("CBNA", "handle", 2, "expected a sequence of FusionPlan"),
        ([None], "handle", 2, r"plans\[0\] is a NoneType"),
        ([], None, 2, "expected a Handle"),
        ([], "handle", 0, "workers must be a whole number of at least 1"),
        ([], "handle", True, "workers must be"),
        ([], "handle", "2", "workers must be"),
    ],
)
def test_bad_arguments_are_bad_parm(plans, handle, workers, match):
    with pytest.raises(fp.BadParmError, match=match):
        fp.compile_all(plans, fp.Handle("cpu") if handle == "handle" else handle, workers=workers)


def test_workers_from_the_settings(monkeypatch):
    monkeypatch.setenv("FUSIONPLAN_COMPILE_WORKERS", "3")
    assert compiling.resolve_workers(None, fp.Handle("cpu").settings) == 3
    assert compiling.resolve_workers(2, fp.Handle("cpu").settings) == 2
    monkeypatch.setenv("FUSIONPLAN_COMPILE_WORKERS", "many")
    with pytest.raises(fp.BadParmError, match="FUSIONPLAN_COMPILE_WORKERS"):
        fp.Handle("cpu")
    monkeypatch.delenv("FUSIONPLAN_COMPILE_WORKERS")
    assert compiling.resolve_workers(None, fp.Settings()) >= 1
    assert fp.compile_all([], fp.Handle("cpu")) == []


@pytest.mark.parametrize("progress", [True, False])
def test_progress_line(monkeypatch, capsys, progress):
    monkeypatch.setattr(compiling, "PROGRESS_AFTER_S", 0.0)
    fp.compile_all([chain_plan(3, 5), chain_plan(3, 6)], fp.Handle("cpu"), workers=2, progress=progress)
    err = capsys.readouterr().err
    assert ("fusionplan: compiled 2/2 plans" in err and err.endswith("\n")) == progress
    assert progress or err == ""


# ---- FusedModel.prepare --------------------------------------------------------------------------
@pytest.fixture
def counted_compiles(monkeypatch):
    """The plans compiled, outside compile_all and inside it."""
    seen = {"alone": 0, "together": 0}
    compile_one, compile_all = FusionPlan.compile, fpt.compile_all

    def alone(self, *a, **kw):
        seen["alone"] += not getattr(threading.current_thread(), "compiling_all", False)
        return compile_one(self, *a, **kw)

    def together(plans, handle, **kw):
        seen["together"] += len(plans)
        thread = threading.current_thread()
        thread.compiling_all = True
        try:
            return compile_all(plans, handle, **{**kw, "workers": 1})  # one thread: the flag holds
        finally:
            thread.compiling_all = False

    monkeypatch.setattr(FusionPlan, "compile", alone)
    monkeypatch.setattr(fpt, "compile_all", together)
    fpt.PLANS.clear()
    return seen


def test_prepare_compiles_every_plan_before_the_first_call(counted_compiles):
    m = model()
    x = torch.randn(2, 3, 20, 18)
    fused = fpt.fuse(m)
    assert isinstance(fused, fpt.FusedModel)
    chains = len(fused.fusion_report.chains)  # each of a plan of its own
    assert fused.prepare(x, workers=2) is fused
    assert counted_compiles == {"alone": 0, "together": chains}
    # every chain's call ran once on stand-ins (what a first execute compiles is compiled)
    assert all(chain.solvers for chain in fused.fusion_report.chains.values())
    torch.testing.assert_close(fused(x), m(x), rtol=1e-4, atol=1e-5)
    assert counted_compiles == {"alone": 0, "together": chains}  # the call found them all compiled


def test_a_plans_first_calls_run_while_other_plans_compile(monkeypatch):
    """The last chain's plan builds its kernel only once another chain's first call on stand-ins
    has run: were the first calls left until every plan compiled, it would wait in vain."""
    m = model()
    x = torch.randn(2, 3, 20, 18)
    fused = fpt.fuse(m)
    first_call = threading.Event()
    run_new, build = fpt._run_new, FusionPlan._kernel
    recording: list = []
    record = fused._record
    monkeypatch.setattr(fused, "_record", lambda *a: recording.append(record(*a)) or recording[-1], raising=False)

    def noted_run(*a, **kw):
        first_call.set()
        return run_new(*a, **kw)

    def waiting_build(chosen, spec, handle):
        last = list(recording[0].plans.values())[-1][0]
        if spec.signature() == last.spec().signature():
            assert first_call.wait(timeout=20), "no chain's first call ran before the last plan's build"
        return build(chosen, spec, handle)

    monkeypatch.setattr(fpt, "_run_new", noted_run)
    monkeypatch.setattr(FusionPlan, "_kernel", staticmethod(waiting_build))
    fpt.PLANS.clear()
    fused.prepare(x, workers=2)
    assert len(recording[0].plans) >= 2
    torch.testing.assert_close(fused(x), m(x), rtol=1e-4, atol=1e-5)


def test_a_first_call_compiles_its_plans_together_and_a_new_layout_again(counted_compiles):
    m = model()
    fused = fpt.fuse(m)
    chains = len(fused.fusion_report.chains)
    x = torch.randn(2, 3, 20, 18)
    torch.testing.assert_close(fused(x), m(x), rtol=1e-4, atol=1e-5)
    assert counted_compiles == {"alone": 0, "together": chains}
    fused(x)
    assert counted_compiles["together"] == chains
    x2 = torch.randn(1, 3, 16, 16).to(memory_format=torch.channels_last)
    torch.testing.assert_close(fused(x2), m(x2), rtol=1e-4, atol=1e-5)
    assert counted_compiles == {"alone": 0, "together": 2 * chains}


def test_fuse_with_example_inputs_prepares(counted_compiles):
    m = model()
    x = torch.randn(2, 3, 12, 12)
    fused = fpt.fuse(m, (x,), workers=2)
    assert counted_compiles == {"alone": 0, "together": len(fused.fusion_report.chains)}
    torch.testing.assert_close(fused(x), m(x), rtol=1e-4, atol=1e-5)


def test_prepare_refuses_training_mode_and_a_wrong_input_fails_in_its_call():
    fused = fpt.fuse(model())
    assert fused.train()(torch.randn(2, 3, 8, 8)).shape[0] == 2  # training calls run (test_torch_train.py)
    with pytest.raises(fp.BadParmError, match="for inference"):
        fused.prepare(torch.randn(1, 3, 8, 8))
    fused.eval()
    with pytest.raises(RuntimeError, match="to have 3 channels, but got 4"):  # the model's own error, as eager's
        fused(torch.randn(1, 4, 8, 8))


def test_a_fused_model_copies_after_a_call():
    m = model()
    x = torch.randn(2, 3, 10, 10)
    fused = fpt.fuse(m)
    y = fused(x)
    twin = copy.deepcopy(fused)
    assert isinstance(twin, fpt.FusedModel)
    torch.testing.assert_close(twin(x), y)
