"""Tensors past 32-bit offsets, and repeats while other processes share the GPU.

python -m pytest -m gpu tests/gpu -n 12
"""

from __future__ import annotations

import pytest
import torch

import fusionplan as fp
from fusionplan.tools.verify import random_args

from ..util import (
    poisoned,
)
from .common import TRITON_SOLVERS, check_in_slices, input_tensor, same_size_cbna

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


@pytest.mark.parametrize("layout", ["NHWC", "NCHW"])
@pytest.mark.parametrize("r", [1, 3])
def test_convolutions_past_int32_offsets(layout, r, gigabytes):
    """CBNA on fp16 input and output of 33 x 64 x 1024 x 1024 (2.2e9 elements, 4.4 GB each): each
    layout's 1x1 and 3x3 solvers with 64-bit offsets; compared image by image with the fp32
    reference, every element written."""
    shape = (33, 64, 1024, 1024)
    x = input_tensor(shape, torch.float16, layout)
    plan = same_size_cbna(x, r)
    handle = fp.Handle("cuda")
    solver = plan.compile(handle)
    assert solver in TRITON_SOLVERS and x.numel() > 2**31
    args = random_args(plan, "cuda", param_dtype=torch.float32)
    y = poisoned(plan.output_desc, layout, "cuda")
    plan.execute(handle, x, y, args)
    check_in_slices(plan, x, y, args, [slice(n, n + 3) for n in range(0, shape[0], 3)], solver)


def test_repeats_agree_bit_for_bit_while_other_processes_share_the_gpu(gigabytes):
    """gluon-gemm's persistent tiles on 2.2e9-element NCHW planes (about 5 ms a launch, so the GPU
    switches to the other processes' contexts inside it), repeated with the same arguments beside
    4 processes running matrix products: each output bit for bit the first's, taken alone. An
    epilogue buffer over initialized barriers came back corrupted there (channel 0, NaN and
    garbage) in every repeat (lab/NOTES.md section 45)."""
    from fusionplan.tools.bench.contention import other_processes_on_the_gpu

    x = input_tensor((33, 64, 1024, 1024), torch.float16, "NCHW")
    plan = same_size_cbna(x, 1)
    handle = fp.Handle("cuda")
    assert plan.compile(handle) == "gluon-gemm"
    args = random_args(plan, "cuda", param_dtype=torch.float32)
    first = poisoned(plan.output_desc, "NCHW", "cuda")
    plan.execute(handle, x, first, args)
    assert torch.isfinite(first).all()
    y = torch.empty_like(first)
    with other_processes_on_the_gpu(4, seconds=60):
        for repeat in range(10):
            y.fill_(float("nan"))
            plan.execute(handle, x, y, args)
            differ = int((y != first).sum())
            assert differ == 0, f"repeat {repeat}: {differ} elements differ from the first output"
