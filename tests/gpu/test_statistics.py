"""Plans ending in batch-norm statistics on the GPU (triton-conv's epilogue and finalize kernel):
ResNet-50's layers and odd shapes, every precision, both layouts, against float64 torch; repeated
executes with new data; a CUDA graph of the two launches.

    python -m pytest -m gpu tests/gpu/test_statistics.py
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import fusionplan as fp
from fusionplan.tools.verify import add_chain, random_args

from ..test_batchnorm_statistics import _expected
from ..util import plan_for, poisoned
from .common import LAYERS, PRECISIONS, input_tensor

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

#: the statistics' tolerance by precision (they are taken of the fp32 accumulators)
STATS_TOL = {"fp32": 1e-5, "tf32": 1e-3, "fp16": 1e-3, "bf16": 1e-3}


def _conv_plan(x, chain, k, r, stride, pad, groups=1):
    conv = fp.ConvolutionDescriptor((pad, pad), (stride, stride), (1, 1), groups)
    return add_chain(plan_for(x), chain, conv=conv, k=k, r=r, s=r, w_layout="NHWC", param_dtype="float")


def _run_and_check(plan, precision, x, layout):
    _, tf32, tol, _ = PRECISIONS[precision]
    handle = fp.Handle("cuda", allow_tf32=tf32)
    assert plan.compile(handle) == "triton-conv"
    args = random_args(plan, "cuda", param_dtype=torch.float32)
    expected, stats = _expected(plan, x, args)
    y = poisoned(plan.output_desc, layout, "cuda")
    plan.execute(handle, x, y, args)
    torch.cuda.synchronize()
    assert not torch.isnan(y).any()
    assert ((y.double() - expected).norm() / expected.norm()).item() < tol
    rec = args.get(plan.ops[-1])
    for name, value in stats.items():
        got = getattr(rec, name).double()
        assert ((got - value).norm() / value.norm()).item() < STATS_TOL[precision], name
    return plan, handle, args


@pytest.mark.parametrize("layout", ["NHWC", "NCHW"])
@pytest.mark.parametrize("precision", ["fp16", "bf16", "tf32"])
@pytest.mark.parametrize("name", ["r50_00", "r50_01", "r50_02", "r50_06", "r50_16", "r50_22"])
def test_resnet50_layers_emit_their_statistics(name, precision, layout):
    layer = next(s for s in LAYERS if s.name == name)
    x = input_tensor((8, layer.c, layer.h, layer.w), PRECISIONS[precision][0], layout)
    plan = _conv_plan(x, "CS", layer.k, layer.r, layer.stride, layer.pad)
    _run_and_check(plan, precision, x, layout)


@pytest.mark.parametrize("layout", ["NHWC", "NCHW"])
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize(
    "dims, chain, k, r, stride, pad, groups",
    [
        ((1, 3, 13, 11), "CBAS", 17, 3, 2, 1, 1),  # odd channels, strided
        ((2, 32, 9, 9), "CS", 32, 3, 1, 1, 32),  # depthwise
        ((1, 64, 7, 7), "CS", 128, 1, 1, 0, 1),  # batch 1: a split reduction
        ((4, 24, 20, 20), "CBS", 40, 5, 1, 2, 4),  # grouped 5x5
    ],
)
def test_odd_shapes_emit_their_statistics(dims, chain, k, r, stride, pad, groups, precision, layout):
    x = input_tensor(dims, PRECISIONS[precision][0], layout)
    _run_and_check(_conv_plan(x, chain, k, r, stride, pad, groups), precision, x, layout)


def test_repeated_executes_and_a_cuda_graph_take_each_calls_statistics():
    x = input_tensor((8, 64, 28, 28), torch.float16, "NHWC")
    plan, handle, args = _run_and_check(_conv_plan(x, "CS", 64, 3, 1, 1), "fp16", x, "NHWC")
    rec = args.get(plan.ops[-1])
    y = poisoned(plan.output_desc, "NHWC", "cuda")
    static = x.clone()
    plan.execute(handle, static, y, args)  # warm, outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        plan.execute(handle, static, y, args)
    for _ in range(2):
        static.copy_(input_tensor(tuple(x.shape), torch.float16, "NHWC"))
        before = rec.running_mean.clone().double()
        graph.replay()
        torch.cuda.synchronize()
        h = F.conv2d(static.double(), args.get(plan.ops[0]).weight.double(), padding=1)
        mean = h.mean((0, 2, 3), keepdim=True)
        assert ((rec.saved_mean.double() - mean).norm() / mean.norm()).item() < 1e-3
        expected = (1 - rec.exp_avg_factor) * before + rec.exp_avg_factor * mean
        assert ((rec.running_mean.double() - expected).norm() / expected.norm()).item() < 1e-3
