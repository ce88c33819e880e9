"""The cudnn solver on the GPU against the float64 reference (odd shapes x precisions x layouts,
with and without a residual), and find across solvers: NORMAL mode times the Triton solvers and
cuDNN, stores the times, and FAST mode follows them.

    python -m pytest -m gpu tests/gpu/test_vendor.py
"""

from __future__ import annotations

import pytest
import torch

import fusionplan as fp
from fusionplan.solvers import find
from fusionplan.tools.verify import add_chain, compare, random_record, reference_output

from ..util import CONV_SHAPES, plan_for, poisoned, shape_plan
from .common import PRECISIONS

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def _check(plan, x, precision, layout, betas):
    dtype, tf32, tol, eps = PRECISIONS[precision]
    handle = fp.Handle("cuda", allow_tf32=tf32)
    assert plan.compile(handle, solver="cudnn") == "cudnn"
    args = fp.OperatorArgs()
    for op in plan.ops:
        args.set(op, random_record(op, "cuda", param_dtype=torch.float32, beta=betas.get(op.index, 0.0)))
    prior = torch.randn(plan.output_desc.dims, device="cuda").to(dtype) if betas else None
    y = poisoned(plan.output_desc, layout, "cuda")
    plan.execute(handle, x, y, args, prior=prior)
    torch.cuda.synchronize()
    result = compare(y, reference_output(plan, x, args, prior), eps)
    assert result.nonfinite == 0, f"unwritten or non-finite outputs: {result}"
    assert result.rel_norm < tol and result.rms_ok, str(result)


@pytest.mark.parametrize("residual", ["none", "conv-beta", "bn-beta"])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("precision", list(PRECISIONS))
@pytest.mark.parametrize("shape", list(CONV_SHAPES))
def test_cudnn_solver(shape, precision, layout, residual, monkeypatch):
    monkeypatch.delenv("FUSIONPLAN_BACKEND")  # the GPU tests' restriction to Triton's family
    chain = {"none": "CBNA", "conv-beta": "CBA", "bn-beta": "CNA"}[residual]
    betas = {"none": {}, "conv-beta": {0: 0.75}, "bn-beta": {1: 1.0}}[residual]
    plan, x = shape_plan(shape, chain, PRECISIONS[precision][0], layout, device="cuda", w_layout=layout)
    _check(plan, x, precision, layout, betas)


def test_normal_find_times_cudnn_and_triton_and_fast_mode_follows(tmp_path, monkeypatch):
    monkeypatch.setenv("FUSIONPLAN_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("FUSIONPLAN_BACKEND")
    x = torch.randn(8, 64, 28, 28, device="cuda", dtype=torch.float16).to(memory_format=torch.channels_last)
    plan = add_chain(plan_for(x), "CBNA", k=64, w_layout="NHWC")
    handle = fp.Handle("cuda", find_mode="NORMAL")
    chosen = plan.compile(handle)
    times = find.stored_times(plan.spec(), handle)
    assert "cudnn" in times and any(name.startswith(("triton", "gluon")) for name in times), times
    assert chosen == min(times, key=times.get)
    verdicts = {v.solver: v for v in plan.explain(handle)}
    assert verdicts["cudnn"].measured_ms == times["cudnn"]

    fresh = add_chain(plan_for(x), "CBNA", k=64, w_layout="NHWC")
    fast = fp.Handle("cuda", find_mode="FAST")
    assert fresh.compile(fast) == chosen
    args = fp.OperatorArgs()
    for op in fresh.ops:
        args.set(op, random_record(op, "cuda", param_dtype=torch.float32))
    y = poisoned(fresh.output_desc, "NHWC", "cuda")
    fresh.execute(fast, x, y, args)
    result = compare(y, reference_output(fresh, x, args, None), PRECISIONS["fp16"][3])
    assert result.nonfinite == 0 and result.rel_norm < 1e-2 and result.rms_ok, str(result)
