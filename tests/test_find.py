"""Find across solvers (fusionplan.solvers.find): in NORMAL mode compile times every applicable
solver and follows the times, stores them, and FAST mode follows the stored ones. The kernels run
through Triton's interpreter; the timer is replaced by fixed times per solver, since the
interpreter's speed says nothing about a GPU's (and a test must not depend on a race)."""

import pytest
import torch

import fusionplan as fp
from fusionplan import solvers
from fusionplan.runtime.perfdb import default_db
from fusionplan.solvers import find
from fusionplan.tools.verify import add_chain

from .util import check_against_reference, make_input, plan_for, poisoned, random_args, shape_plan

#: on a 1x1 NCHW fp32 convolution two Triton solvers apply: triton-conv first by priority,
#: triton-gemm-nchw after it (it defers until measured)
FIRST, LATER = "triton-conv", "triton-gemm-nchw"


@pytest.fixture
def own_db(tmp_path, monkeypatch):
    """A perf database of this test's own (the cache directory is read at each call)."""
    monkeypatch.setenv("FUSIONPLAN_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("FUSIONPLAN_BACKEND", "triton")
    monkeypatch.delenv("FUSIONPLAN_FIND_MODE", raising=False)
    return tmp_path


@pytest.fixture
def fake_times(monkeypatch):
    """find's timer replaced: each solver's time from the dict, recording who was timed. Triton's
    interpreter stands in for a GPU here (find times no Triton solver on a CPU device otherwise)."""
    monkeypatch.setattr(find, "runs_natively", lambda family, device: True)
    times: dict[str, float] = {}
    timed: list[str] = []

    def time_kernel(kernel, data, device):
        timed.append(kernel.solver_name)
        x, y, records = data
        kernel.run(x, y, records, None)  # the kernel really runs: a broken one is left out
        return times[kernel.solver_name]

    monkeypatch.setattr(find, "time_kernel", time_kernel)
    return times, timed


def conv_1x1_plan():
    return shape_plan("1x1", "CBA", torch.float32, "NCHW")


def test_the_heuristic_order_has_two_triton_solvers(own_db):
    plan, _ = conv_1x1_plan()
    applicable = [v.solver for v in plan.explain(fp.Handle()) if v.applicable]
    assert applicable[:2] == [FIRST, LATER] or applicable[:2] == [LATER, FIRST]
    order = [v.solver for v in solvers.compile_order(plan.explain(fp.Handle()))]
    assert order[0] == FIRST, "the test needs the heuristic to prefer triton-conv"


def test_normal_mode_picks_the_measured_fastest_and_stores_the_times(own_db, fake_times):
    times, timed = fake_times
    times.update({FIRST: 2.0, LATER: 0.5})
    plan, x = conv_1x1_plan()
    handle = fp.Handle(find_mode="NORMAL")
    assert plan.compile(handle) == LATER
    assert sorted(timed) == sorted([FIRST, LATER]), "every applicable non-reference solver is timed once"
    assert "reference" not in timed
    args = random_args(plan)
    check_against_reference(plan, handle, x, args, poisoned(plan.output_desc))

    stored = find.stored_times(plan.spec(), handle)
    assert stored == {FIRST: 2.0, LATER: 0.5}
    verdicts = {v.solver: v for v in plan.explain(handle)}
    assert verdicts[LATER].measured_ms == 0.5 and "measured 0.5 ms" in str(verdicts[LATER])
    assert verdicts["reference"].measured_ms is None


def test_fast_mode_follows_the_stored_times_without_timing(own_db, fake_times):
    times, timed = fake_times
    times.update({FIRST: 3.0, LATER: 1.0})
    plan, _ = conv_1x1_plan()
    assert plan.compile(fp.Handle(find_mode="NORMAL")) == LATER
    timed.clear()
    fresh, _ = conv_1x1_plan()  # another plan object of the same signature, on a fresh handle
    assert fresh.compile(fp.Handle(find_mode="FAST")) == LATER
    assert timed == [], "FAST mode never times"
    again = fp.Handle(find_mode="NORMAL")
    assert fresh.compile(again) == LATER and timed == [], "measured once per signature and device"


def test_fast_mode_without_times_keeps_the_heuristic_and_creates_no_database(own_db, fake_times):
    _, timed = fake_times
    plan, _ = conv_1x1_plan()
    assert plan.compile(fp.Handle()) == FIRST
    assert timed == []
    assert not (own_db / "perfdb.sqlite").exists()


def test_a_solver_whose_kernel_fails_is_left_out_of_the_times(own_db, fake_times, monkeypatch):
    times, _ = fake_times
    times.update({FIRST: 2.0, LATER: 0.5})
    later = solvers.solver_named(LATER)

    def broken_build(spec, handle):
        raise RuntimeError("this tile does not fit")

    monkeypatch.setattr(later, "build", broken_build)
    plan, x = conv_1x1_plan()
    handle = fp.Handle(find_mode="NORMAL")
    assert plan.compile(handle) == FIRST
    assert find.stored_times(plan.spec(), handle) == {FIRST: 2.0}
    check_against_reference(plan, handle, x, random_args(plan), poisoned(plan.output_desc))


def test_a_single_candidate_is_not_timed(own_db, fake_times):
    _, timed = fake_times
    x = make_input((2, 5, 7, 3), torch.float32)
    plan = add_chain(plan_for(x), "BA")  # triton-pointwise alone
    handle = fp.Handle(find_mode="NORMAL")
    assert [v.solver for v in plan.explain(handle) if v.applicable] == ["triton-pointwise"]
    assert plan.compile(handle) == "triton-pointwise"
    assert timed == []
    assert not (own_db / "perfdb.sqlite").exists()


@pytest.mark.parametrize(
    "entry",
    [
        {"solver": LATER, "times": {LATER: "fast", FIRST: 1.0}},
        {"solver": LATER, "times": {LATER: float("nan"), FIRST: 1.0}},
        {"solver": LATER, "times": [LATER, FIRST]},
        {"solver": LATER},
    ],
    ids=["not-a-number", "nan", "not-a-dict", "no-times"],
)
def test_bad_stored_entries_are_ignored(own_db, fake_times, entry):
    _, timed = fake_times
    plan, _ = conv_1x1_plan()
    handle = fp.Handle()
    spec = plan.spec()
    default_db().put(find.FIND_ENTRY, find._key(spec, handle), find.device_name(handle.device), entry)
    stored = find.stored_times(spec, handle)
    assert all(isinstance(v, float) and v == v for v in stored.values())
    assert LATER not in stored
    assert plan.compile(handle) == FIRST
    assert timed == []


def test_clearing_the_database_forgets_the_times(own_db, fake_times):
    times, _ = fake_times
    times.update({FIRST: 3.0, LATER: 1.0})
    plan, _ = conv_1x1_plan()
    handle = fp.Handle(find_mode="NORMAL")
    plan.compile(handle)
    assert find.stored_times(plan.spec(), handle)
    default_db().clear()
    assert find.stored_times(plan.spec(), handle) == {}


def test_order_by_times_puts_the_unmeasured_after_in_their_order():
    named = [solvers.solver_named(n) for n in (FIRST, LATER, "triton-pointwise", "reference")]
    ordered = find.order_by_times(named, {"triton-pointwise": 1.0, LATER: 2.0})
    assert [s.name for s in ordered] == ["triton-pointwise", LATER, FIRST, "reference"]


def test_triton_solvers_on_the_cpu_are_not_timed(own_db, monkeypatch):
    """On a CPU device the Triton solvers run only through the interpreter: find times none of them."""
    timed = []
    monkeypatch.setattr(find, "time_kernel", lambda kernel, data, device: timed.append(kernel.solver_name) or 1.0)
    plan, _ = conv_1x1_plan()
    assert plan.compile(fp.Handle(find_mode="NORMAL")) == FIRST
    assert timed == [] and find.stored_times(plan.spec(), fp.Handle()) == {}
