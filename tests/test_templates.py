"""Every kernel template, rendered for sample plans, is checked as Python source: ruff finds no
undefined or shadowed names and no syntax error, in any branch, dead constexpr ones included
(which Triton never compiles, so no run would find them). The sample plans are the sm90 fuzz
mode's draws; each solver that takes one (or, for a Gluon solver, would but for the device)
renders its kernel. The sm90 fuzz mode and the solvers' tests compile them for sm_90."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from collections import Counter

import pytest

import fusionplan as fp
from fusionplan.runtime.codegen import interpreter_active
from fusionplan.solvers import solver_named

from .fuzz.cases import draw_case
from .fuzz.execute import CorePlan, make_tensors, only_the_device_missing

pytest.importorskip("triton")
#: Checks a rendered template must pass: undefined names (F821), redefinitions and names used before
#: assignment (F811, F823), syntax errors (E9).
RULES = "F821,F811,F823,E9"


def rendered_sources(cases: int) -> dict[str, str]:
    """file name -> source of every distinct kernel the sample plans render, named by solver."""
    handle = fp.Handle("cpu", allow_tf32=True)
    sources: dict[str, str] = {}
    for index in range(cases):
        case = draw_case(5, index, "sm90", 0.0, 0.0, 0.5)
        plan = CorePlan(case, make_tensors(case, "cpu", values=False), handle)
        for verdict in plan.plan.explain(handle):
            if not (verdict.applicable or only_the_device_missing(verdict)):
                continue
            kernel = solver_named(verdict.solver).build(plan.plan.spec(), handle)
            source = kernel.source() if hasattr(kernel, "source") else None
            if source:
                digest = hashlib.sha1(source.encode()).hexdigest()[:12]
                sources[f"{verdict.solver.replace('-', '_')}_{digest}.py"] = source
    return sources


@pytest.mark.skipif(not interpreter_active(), reason="the Triton solvers take CPU plans through the interpreter")
def test_every_template_renders_to_clean_python(tmp_path):
    sources = rendered_sources(300)
    for name, source in sources.items():
        (tmp_path / name).write_text(source)
    solvers = Counter(name.rsplit("_", 1)[0] for name in sources)
    expected = {"triton_conv", "triton_stem", "triton_pointwise", "triton_depthwise", "triton_window", "gluon_gemm"}
    assert expected <= set(solvers) and solvers["gluon_nchw"] > 10, solvers
    lint = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--no-cache", "--isolated", "--select", RULES, "--output-format",
         "concise", str(tmp_path)],
        capture_output=True, text=True,
    )  # fmt: skip
    assert lint.returncode == 0, lint.stdout[-3000:]
