"""gluon-gemm on the GPU: its tiles, epilogues, channel planes and carve-outs.

python -m pytest -m gpu tests/gpu -n 12
"""

from __future__ import annotations

import random

import pytest
import torch

import fusionplan as fp
from fusionplan.core.enums import ActivationMode
from fusionplan.tools.verify import add_chain, random_record

from ..util import (
    plan_for,
)
from .common import PRECISIONS, check_random_records, input_tensor, run_and_check

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


#: (n, c, h, w, k, stride) of 1x1 convolutions: rows that no tile divides, C not a multiple of the
#: reduction step, K below a warpgroup's 64 rows and not a multiple of the channel block, 7x7
#: images; strided: output rows of 14 and 7 pixels (16 and 8 slots), stride 3, an odd width.
GLUON_GEMM_CASES = {
    "odd-rows": (3, 200, 9, 30, 72, 1),
    "7x7": (9, 512, 7, 7, 136, 1),
    "C40-K24": (5, 40, 13, 11, 24, 1),
    "14x14": (4, 256, 14, 14, 320, 1),
    "strided-28x28": (4, 128, 28, 28, 136, 2),
    "strided-odd-width": (3, 64, 14, 13, 72, 2),
    "stride-3": (2, 64, 12, 20, 40, 3),
}


#: Cases of NCHW input read as channel planes (gluon_gemm.planes_why_not): planes of 784, 120 and
#: 64 pixels (no tile divides the first two; the last is smaller than most tiles), K below 64 and
#: not a multiple of the channel block; planes that start inside 16-byte units, read by
#: asynchronous copies (tuning.GLUON_GEMM_PLANE_COPIES 1): 196 and 60 pixels; planes of whole
#: 16-byte units copied too (2): 784 and 120 pixels; the 196- and 60-pixel planes as pairs, the even
#: channels by boxes and the odd ones by copies (gluon_gemm.plane_pairs).
GLUON_GEMM_PLANE_CASES = {
    "planes-28x28": (3, 128, 28, 28, 136, 1),
    "planes-10x12": (5, 192, 10, 12, 24, 1),
    "planes-8x8": (4, 64, 8, 8, 320, 1),
    "planes-copies-14x14": (3, 128, 14, 14, 136, 1),
    "planes-copies-6x10": (4, 64, 6, 10, 72, 1),
    "planes-copies-all-28x28": (3, 128, 28, 28, 136, 1),
    "planes-copies-all-10x12": (5, 192, 10, 12, 24, 1),
    "planes-pairs-14x14": (3, 128, 14, 14, 136, 1),
    "planes-pairs-6x10": (4, 64, 6, 10, 72, 1),
}


#: (case, precision, chain, the chain in the accumulator's layout): every case in four precision
#: and chain pairs; the accumulator-layout epilogue on three cases (flat, 7x7, strided) in two.
GLUON_GEMM_RUNS = (
    [
        (case, precision, chain)
        for case in GLUON_GEMM_CASES
        for precision, chain in (("fp16", "CBNA"), ("fp16", "CNAAB"), ("bf16", "CBNA"), ("tf32", "CNAAB"))
    ]
    + [(case, "tf32", "CBNA") for case in ("odd-rows", "7x7", "strided-28x28", "C40-K24")]
    + [
        (case, precision, chain)
        for case in GLUON_GEMM_PLANE_CASES
        for precision, chain in (("fp16", "CBNA"), ("bf16", "CNAAB"), ("fp16", "CBA"))
    ]
)


@pytest.mark.slow
@pytest.mark.parametrize("case, precision, chain", GLUON_GEMM_RUNS)
def test_gluon_gemm_tiles(case, precision, chain, monkeypatch):
    """gluon-gemm over every kind of tile: pixels of one, two and three parts (16, 48, 96, 112,
    208, 256; strided, those of parts that hold whole output rows), 64, 128 and 256 output
    channels, one computing warpgroup or two taking tiles in turn; each with and without a prior
    output, and with programs walking several tiles (grids of 3 and 2 persistent programs: uneven
    shares of the tiles); 16-bit tiles of 128 pixels and more stored by TMA (persistent ones from a
    buffer per warpgroup), and by pointer to an NCHW output. Plane cases: NCHW input read as channel
    planes, stored along the planes (NCHW output) or the channels; planes that start inside 16-byte
    units by asynchronous copies."""
    from fusionplan.runtime import tuning
    from fusionplan.solvers import gluon_gemm

    monkeypatch.setattr(tuning, "GLUON_GEMM_PLANE_COPIES", 2 if "copies-all" in case else 1)
    # the pair cases' wider outputs too; no pairs elsewhere
    monkeypatch.setattr(tuning, "GLUON_GEMM_PAIRS_MAX_WIDENING", 4 if "pairs" in case else 0)
    n, c, h, w, k, stride = {**GLUON_GEMM_CASES, **GLUON_GEMM_PLANE_CASES}[case]
    dtype, tf32 = PRECISIONS[precision][:2]
    x = input_tensor((n, c, h, w), dtype, "NCHW" if case in GLUON_GEMM_PLANE_CASES else "NHWC")
    conv = fp.ConvolutionDescriptor((0, 0), (stride, stride))
    plan = add_chain(plan_for(x), chain, conv=conv, k=k, r=1, s=1, activation=ActivationMode.ELU, param_dtype="float")
    handle = fp.Handle("cuda", allow_tf32=tf32)
    assert plan.compile(handle, solver="gluon-gemm") == "gluon-gemm"
    kernel = plan._entry(handle).kernel
    assert kernel.plane == (h * w if case in GLUON_GEMM_PLANE_CASES else 0)
    assert kernel.copies == ("copies" in case)
    assert kernel.pairs == ("pairs" in case)
    block_k = 128 // x.element_size()
    rng = random.Random(case + precision + chain)
    every_sm = gluon_gemm.multiprocessors
    tiles = [(16, 64, 1), (48, 128, 1), (96, 128, 1), (112, 64, 1), (208, 128, 1), (256, 64, 1), (96, 256, 1)]
    tiles += [(128, 128, 2), (48, 128, 2)]  # two warpgroups taking tiles in turn
    slots = gluon_gemm.row_slots(plan.spec())
    for pixels, block_n, consumers in tiles:
        if gluon_gemm.pixel_parts(pixels)[-1] < slots:
            continue  # strided: every part holds whole output rows
        warps = 4 if block_n == 64 or consumers == 2 else 8
        stages = rng.choice((2, 3, 4))
        kernel.config = tuning.ConvConfig(pixels, block_n, block_k, 8, warps, stages, 1, consumers=consumers)
        variants = ((False, None), (True, None), (True, 3)) + (((False, 2),) if consumers == 2 else ())
        for with_prior, programs in variants:
            kernel._repeats._by_records.clear()
            monkeypatch.setattr(gluon_gemm, "multiprocessors", (lambda h, n=programs: n) if programs else every_sm)
            check_random_records(plan, handle, x, precision, rng, with_prior, "NHWC", (kernel.config, programs))
            if not with_prior and precision != "tf32":
                # 16-bit tiles of 128 pixels and more go out by TMA (gluon_gemm.gemm_tma_store), by
                # pointer to an NCHW output given at launch
                check_random_records(plan, handle, x, precision, rng, False, "NCHW", (kernel.config, "NCHW"))


@pytest.mark.parametrize(
    "layer_name, solver",
    [
        ("r50_15", "gluon-gemm"),
        ("r50_11", "gluon-gemm"),
        ("r50_16", "gluon-nchw"),
        ("r50_17", "triton-gemm-nchw"),
    ],
)
def test_kernels_prefer_the_carveout_they_fit(layer_name, solver):
    """Compiled and loaded (ahead of the first execute), every convolution kernel prefers the
    smallest shared-memory carve-out that holds the programs a multiprocessor holds (the driver's
    attribute read back). The output checked too."""
    import ctypes

    from fusionplan.runtime.carveout import carveout_percent, programs_per_multiprocessor
    from fusionplan.tools.shapes import resnet50_layer
    from fusionplan.tools.verify import layer_plan

    s = resnet50_layer(layer_name)
    x = input_tensor((3, s.c, s.h, s.w), torch.float16, "NCHW")
    plan = layer_plan(s, x, "CBNA")
    handle = fp.Handle("cuda")
    assert plan.compile(handle, solver=solver) == solver
    check_random_records(plan, handle, x, "fp16", random.Random(layer_name), False, "NCHW", layer_name)
    kernels = list(plan._entry(handle).kernel.launcher._compiled.values())
    props = torch.cuda.get_device_properties(0)
    driver = ctypes.CDLL("libcuda.so.1")
    assert kernels
    for kernel in kernels:
        preferred = ctypes.c_int()
        assert driver.cuFuncGetAttribute(ctypes.byref(preferred), 9, ctypes.c_void_p(kernel.function)) == 0
        shared = kernel.metadata.shared
        programs = programs_per_multiprocessor(kernel.metadata.num_warps * 32, kernel.n_regs, shared, props)
        expected = carveout_percent(shared, props.shared_memory_per_multiprocessor, programs)
        assert preferred.value == expected


def test_gemm_wide_tiles_reading_a_prior_run_narrower():
    """ResNet-50's 1x1 64 -> 256 layer at batch 32 takes triton-gemm's 128x256 tiles on 16-bit data;
    reading a prior output (a residual blend) they need more shared memory than a Hopper program
    has: the call runs with 128x128 tiles, and computes every element."""
    x = input_tensor((32, 64, 56, 56), torch.float16, "NHWC")
    plan = add_chain(plan_for(x), "CNA", conv=fp.ConvolutionDescriptor((0, 0)), k=256, param_dtype="float")
    handle = fp.Handle("cuda")
    assert plan.compile(handle, solver="triton-gemm") == "triton-gemm"
    rng = random.Random(11)
    args = fp.OperatorArgs()
    for op in plan.ops:
        args.set(op, random_record(op, "cuda", param_dtype=torch.float32, alpha=1.0, beta=rng.uniform(0.5, 1)))
    prior = torch.randn(plan.output_desc.dims, device="cuda").half().to(memory_format=torch.channels_last)
    run_and_check(plan, "fp16", x, "NHWC", args=args, prior=prior, solver="triton-gemm")
