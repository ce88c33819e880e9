"""compile_all on the GPU: the odd shapes' plans, each of every precision and layout, compiled
together on several threads, then each run against the float64 reference (a kernel built on a
worker thread is the same kernel a plain compile builds).

    python -m pytest -m gpu tests/gpu/test_compile_all.py
"""

from __future__ import annotations

import pytest
import torch

import fusionplan as fp
from fusionplan.tools.verify import compare, random_record, reference_output

from ..util import CONV_SHAPES, poisoned, shape_plan
from .common import PRECISIONS

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


@pytest.mark.parametrize("precision", ["fp16", "fp32", "bf16"])
def test_plans_compiled_together_run_right(precision):
    dtype, tf32, tol, eps = PRECISIONS[precision]
    handle = fp.Handle("cuda", allow_tf32=tf32)
    cases = [
        (shape_plan(key, "CBNA", dtype, layout, device="cuda"), layout)
        for key in CONV_SHAPES
        for layout in ("NCHW", "NHWC")
    ]
    plans = [plan for (plan, _), _ in cases]
    solvers = fp.compile_all(plans, handle, workers=8)
    assert solvers == [p.compiled_solver(handle) for p in plans]
    for (plan, x), layout in cases:
        args = fp.OperatorArgs()
        for op in plan.ops:
            args.set(op, random_record(op, "cuda", param_dtype=torch.float32))
        y = poisoned(plan.output_desc, layout, "cuda")
        plan.execute(handle, x, y, args)
        torch.cuda.synchronize()
        result = compare(y, reference_output(plan, x, args), eps)
        assert result.nonfinite == 0 and result.rel_norm < tol and result.rms_ok, (plan.describe(), str(result))
