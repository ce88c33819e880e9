"""The fuzzer in CI: a short run on the CPU solvers and through Triton's interpreter, and checks
that its checks fail where they must (a wrong result, a write outside the output, a crash)."""

from __future__ import annotations

import math
import os

import numpy as np
import pytest
import torch

import fusionplan as fp
from fusionplan.runtime.codegen import interpreter_active

from .fuzz import cases
from .fuzz.cases import draw_case
from .fuzz.execute import Tensors, _activation_slack, compare, expected, guarded_output
from .fuzz.pool import run_pool

OPTIONS = {"training": 0.1, "misuse": 0.05}
WORKERS = min(2, os.cpu_count() or 1)


def _summary_line(summary) -> str:
    first = (summary.mismatches + summary.crashes)[:3]
    return f"{summary.as_dict()['runs_by_solver']}; first failures: {first}"


def test_fuzz_cpu_solvers():
    summary = run_pool("cpu", 20261201, range(2000), WORKERS, OPTIONS, case_timeout=300, log=lambda line: None)
    assert summary.cases == 2000
    assert not summary.mismatches and not summary.crashes, _summary_line(summary)
    assert summary.by_solver["cpu-folded"] > 1000 and summary.by_solver["misuse"] > 50


@pytest.mark.skipif(not interpreter_active(), reason="Triton's interpreter is off (a GPU is present)")
def test_fuzz_triton_solvers_interpreted():
    summary = run_pool("interp", 20261201, range(400), WORKERS, OPTIONS, case_timeout=600, log=lambda line: None)
    assert summary.cases == 400
    assert not summary.mismatches and not summary.crashes, _summary_line(summary)
    assert summary.by_solver["triton-conv"] > 50 and summary.by_solver["triton-pointwise"] > 30


def test_layer_like_cases_on_the_cpu_solvers():
    """The draws for the kernels tuned for networks' layers (``--layers``): run on the CPU solvers
    here, on every GPU solver by the GPU run."""
    summary = run_pool(
        "cpu", 20261202, range(40), WORKERS, {**OPTIONS, "layers": 1.0}, case_timeout=300, log=lambda line: None
    )
    assert not summary.mismatches and not summary.crashes, _summary_line(summary)
    assert summary.by_solver["cpu-folded"] > 20


def test_layer_like_cases_leave_the_other_draws_alone():
    layer_like = [draw_case(3, i, "gpu", layers=0.4) for i in range(200)]
    plain = [draw_case(3, i, "gpu") for i in range(200)]
    replaced = [a != b for a, b in zip(layer_like, plain, strict=True)]
    assert 40 < sum(replaced) < 120
    assert all(case["dims"][1] in cases.LAYER_CHANNELS for case, new in zip(layer_like, replaced, strict=True) if new)


def test_cases_depend_on_seed_and_index_only():
    assert draw_case(5, 17) == draw_case(5, 17)
    assert draw_case(5, 17) != draw_case(5, 18)


def test_compare_flags_wrong_values_and_misplaced_nan():
    ref = np.array([1.0, -2.0, math.inf, math.nan])
    good = torch.tensor([1.0, -2.0, math.inf, math.nan])
    assert not compare("t", good, ref, 1e-5, 2.0**-23)
    assert compare("t", torch.tensor([1.0, -2.1, math.inf, math.nan]), ref, 1e-5, 2.0**-23)
    assert compare("t", torch.tensor([1.0, -2.0, math.inf, 0.0]), ref, 1e-5, 2.0**-23)  # a NaN lost
    assert compare("t", torch.tensor([math.nan, -2.0, math.inf, math.nan]), ref, 1e-5, 2.0**-23)  # invented


def test_steep_activations_widen_the_bound_only_where_they_are_steep():
    """A square root (POWER, gamma 0.5) just past its threshold: an error at its input within the
    tolerance (a TF32 convolution's) moves the output far more than the tolerance; the oracle
    allows that there, and nowhere else (ReLU adds nothing; a wrong value far from the threshold
    still fails)."""
    power = {"mode": 6, "a": 0.0, "b": 1.0, "g": 0.5}
    h = np.array([1e-9, 4.0, -1.0])  # at the threshold, far above it, below it (output 0)
    allowed = np.full(3, 1e-3)
    slack = _activation_slack(power, h, allowed, 0.0)
    assert slack[0] > 0.03 and slack[1] < 1e-6 and slack[2] == 0.0
    ref = np.sqrt(np.maximum(h, 0.0)) * (h > 1e-6)
    moved = torch.tensor([math.sqrt(9e-4), 2.0, 0.0], dtype=torch.float64)  # the input off by 9e-4 at 0
    assert compare("t", moved, ref, 1e-3, 2.0**-10, 4.0)  # without the slack: a mismatch
    assert not compare("t", moved, ref, 1e-3, 2.0**-10, 4.0, slack)
    wrong = torch.tensor([math.sqrt(9e-4), 2.1, 0.0], dtype=torch.float64)
    assert compare("t", wrong, ref, 1e-3, 2.0**-10, 4.0, slack)
    relu = {"mode": 3, "a": 0.0, "b": 0.0, "g": 1.0}
    assert not _activation_slack(relu, np.array([-1e-9, 0.0, 3.0]), allowed, 0.0).any()


def test_the_oracle_carries_slack_through_later_operators():
    sqrt = {"kind": "act", "mode": 6, "a": 0.0, "b": 1.0, "g": 0.5, "alpha": 2.0, "beta": 0.0}
    case = {"phase": "inference", "ops": [sqrt]}
    x = torch.tensor([[[[1e-9, 4.0]]]], dtype=torch.float64)
    want = expected(case, Tensors(x, [{}], (1, 1, 1, 2), False, [(1, 1, 1, 1)]), None, 1e-3)
    assert want.output[0, 0, 0, 1] == 4.0 and want.slack[0, 0, 0, 0] > 0.06  # doubled by alpha 2


def test_gluon_kernels_built_for_sm90_on_the_cpu():
    """Every Gluon solver that takes a plan but for the device builds its kernel and makes its
    launch (descriptors, layouts, constants): the check that found gluon-rows' 16-byte plane rows,
    which no swizzle takes, without a GPU."""
    pytest.importorskip("triton.experimental.gluon")
    summary = run_pool("sm90", 20261202, range(600), WORKERS, {**OPTIONS, "misuse": 0.0, "layers": 0.5},
                       case_timeout=300, log=lambda line: None)  # fmt: skip
    assert not summary.mismatches and not summary.crashes, _summary_line(summary)
    assert summary.by_solver["gluon-nchw"] > 50 and summary.by_solver["gluon-window"] > 20


def test_guard_band_sees_writes_outside_a_stepped_output():
    out = guarded_output((1, 2, 3, 2), torch.float32, "NCHW", True, "cpu", None, np.random.default_rng(0))
    out.y.fill_(1.0)
    assert out.changed_outside() == 0
    out.buffer[0] = 3.0
    assert out.changed_outside() == 1
    gap = out.y.stride()[2] * 1 + out.y.storage_offset() + 2  # the first gap after row 0
    out.buffer[gap] = 4.0
    assert out.changed_outside() == 2


def test_a_crash_is_recorded_with_its_repro(monkeypatch):
    monkeypatch.setenv("FUSIONPLAN_FUZZ_CRASH_INDEX", "3")  # the workers' test hook: die on case 3
    summary = run_pool("cpu", 1, range(6), 1, OPTIONS, case_timeout=300, log=lambda line: None)
    assert [c["index"] for c in summary.crashes] == [3]
    assert "SIGSEGV" in summary.crashes[0]["how"] and "--index 3" in summary.crashes[0]["repro"]
    assert summary.cases == 6


def test_extension_activations_are_drawn_for_the_python_apis_only():
    drawn = [draw_case(9, i, "cpu", training=0.3) for i in range(400)]
    acts = [(c["api"], op["mode"]) for c in drawn for op in c["ops"] if op["kind"] in ("act", "act_back")]
    extensions = {mode for api, mode in acts if mode in cases.EXTENSION_MODES}
    assert extensions == set(cases.EXTENSION_MODES)
    assert all(mode < 100 for api, mode in acts if api == "miopen")
    prelu = [(c, op) for c in drawn for op in c["ops"] if op.get("mode") == cases.PRELU_MODE]
    assert prelu and all(c["phase"] in ("inference", "statistics") and c["api"] != "miopen" for c, _ in prelu)
    assert {op["kind"] for _, op in prelu} == {"act"} and {op["one_slope"] for _, op in prelu} == {True, False}


@pytest.mark.parametrize(
    ("seed", "index"),
    [(7, 2559), (8, 875), (8, 7931)],
    ids=["hardsigmoid-backward-float64", "hardswish-backward-nan-dy", "one-value-per-feature"],
)
def test_cpu_training_cases_the_fuzzer_found(seed, index):
    """Float64 Hardsigmoid backward (torch's own takes float32's 1/6); a NaN gradient through
    Hardswish where its slope is 0 (torch's own backward drops it); batch-norm training over one
    value per feature (torch's output x * s' + b' cancels to 4e-5 where the answer is the bias)."""
    summary = run_pool("cpu", seed, [index], 1, OPTIONS, case_timeout=300, log=lambda line: None)
    assert summary.cases == 1 and summary.by_solver["cpu-training"] == 1
    assert not summary.mismatches and not summary.crashes, _summary_line(summary)


@pytest.mark.skipif(not interpreter_active(), reason="Triton's interpreter is off (a GPU is present)")
def test_batchnorm_statistics_keep_an_infinite_mean():
    """A feature with -inf among finite values has mean -inf; Welford's update made it NaN
    (inf - inf) in triton-batchnorm's saved and running means."""
    summary = run_pool("interp", 11, [150, 521], 1, OPTIONS, case_timeout=600, log=lambda line: None)
    assert summary.cases == 2 and summary.by_solver["triton-batchnorm"] == 2
    assert not summary.mismatches and not summary.crashes, _summary_line(summary)


def test_a_refused_call_that_writes_a_side_output_is_a_failure(monkeypatch):
    """The misuse runs check every side output too (saved and running statistics): a plan that
    wrote one before refusing the call would be caught."""
    from tests.fuzz import execute

    case = next(
        c
        for i in range(5000)
        if "misuse" in (c := draw_case(7, i, "cpu", training=0.5, misuse=0.5))
        and c["phase"] == "training forward"
        and c["misuse"] == "input_shape"
        and c["ops"][0].get("running")
    )
    real = fp.FusionPlan.execute

    def writes_then_refuses(self, handle, x, y, args, *rest, **kw):
        for op in self.ops:
            record = args.get(op)
            if getattr(record, "running_mean", None) is not None:
                record.running_mean.add_(1.0)  # the argument's own memory (a view of it)
        return real(self, handle, x, y, args, *rest, **kw)

    monkeypatch.setattr(fp.FusionPlan, "execute", writes_then_refuses)
    (run,) = execute.run_case(case, fp.Handle("cpu"))
    assert any("running_mean was written" in f for f in run.failures), run.failures


def test_a_repro_names_the_draw_options_the_run_changed(monkeypatch):
    """An index draws another case under other shares (training, misuse, layers), so a repro
    line carries those the run changed from the command line's defaults."""
    import argparse

    from .fuzz import __main__ as cli
    from .fuzz.pool import DRAW_DEFAULTS, _repro

    seen = {}
    parse = argparse.ArgumentParser.parse_args

    def capture(self, argv=None, namespace=None):
        seen.update(vars(parse(self, argv, namespace)))
        raise SystemExit(0)

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", capture)
    with pytest.raises(SystemExit):
        cli.main([])
    assert {name: seen[name] for name in DRAW_DEFAULTS} == DRAW_DEFAULTS
    line = _repro("interp", 61, 1227, {**DRAW_DEFAULTS, "training": 0.3, "misuse": 0.1})
    assert line == "python -m tests.fuzz --mode interp --seed 61 --index 1227 --training 0.3 --misuse 0.1"
    assert _repro("cpu", 1, 3, dict(DRAW_DEFAULTS)) == "python -m tests.fuzz --mode cpu --seed 1 --index 3"


def test_random_fused_models_train_as_eager_does_on_the_cpu():
    """``--models``: random fused models, trained a few steps beside eager fp32 and float64 copies."""
    summary = run_pool(
        "cpu", 20261208, range(120), WORKERS, {**OPTIONS, "models": 1.0}, case_timeout=300, log=lambda line: None
    )
    assert not summary.mismatches and not summary.crashes, _summary_line(summary)
    assert summary.by_solver["fused-model"] == 120


@pytest.mark.skipif(not interpreter_active(), reason="Triton's interpreter is off (a GPU is present)")
def test_random_fused_models_through_the_triton_kernels_interpreted():
    summary = run_pool(
        "interp", 20261208, range(12), WORKERS, {**OPTIONS, "models": 1.0}, case_timeout=600, log=lambda line: None
    )
    assert not summary.mismatches and not summary.crashes, _summary_line(summary)
    assert summary.by_solver["fused-model"] == 12


def test_a_fused_model_that_trains_wrongly_is_a_failure(monkeypatch):
    """A fault in the training plans' gradients (the batch-norm weight's scaled by 1.1) is found."""
    from fusionplan.solvers import cpu_training

    from .fuzz.models import run_model_case

    backward = cpu_training.CpuTrainingKernel._backward

    def wrong(self, dy, dx, records, prior):
        backward(self, dy, dx, records, prior)
        records[0].result_scale_diff.mul_(1.1)

    monkeypatch.setattr(cpu_training.CpuTrainingKernel, "_backward", wrong)
    found = [run_model_case(draw_case(20261208, i, "cpu", models=1.0), torch.device("cpu")) for i in range(40)]
    assert sum(bool(f) for f in found) >= 12, found  # the others: ill-conditioned steps, eager chains
    assert any("gradient of blocks" in line and ".bn.weight" in line for f in found for line in f), found


def test_model_cases_leave_the_other_draws_alone():
    mixed = [draw_case(3, i, "cpu", models=0.3) for i in range(200)]
    plain = [draw_case(3, i, "cpu") for i in range(200)]
    replaced = [a != b for a, b in zip(mixed, plain, strict=True)]
    assert 30 < sum(replaced) < 100
    assert all(case["kind"] == "model" for case, new in zip(mixed, replaced, strict=True) if new)
