"""triton-window and gluon-window on the GPU: window shapes and cases.

python -m pytest -m gpu tests/gpu -n 12
"""

from __future__ import annotations

import pytest
import torch

import fusionplan as fp
from fusionplan.core.enums import ActivationMode
from fusionplan.tools.verify import EPS, add_chain, compare, random_args, reference_output

from ..util import (
    plan_for,
    poisoned,
    seeded_alpha_beta_args,
)
from .common import PRECISIONS, check_in_slices, input_tensor, run_and_check, same_size_cbna

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def row_blocks_with_halo(rows: int, block: int, halo: int) -> list[list]:
    """check_in_slices' slices of a stride-1 convolution padded by ``halo`` rows (a filter of 2 *
    halo + 1 rows): each block of output rows from the input rows it reads, the halo's rows of the
    reference dropped."""
    slices = []
    for h0 in range(0, rows, block):
        h1, lo = min(h0 + block, rows), max(h0 - halo, 0)
        hi = min(h1 + halo, rows)
        rows_of = (slice(None), slice(None))
        slices.append([(*rows_of, slice(lo, hi)), (*rows_of, slice(h0, h1)), (*rows_of, slice(h0 - lo, h1 - lo))])
    return slices


@pytest.mark.parametrize(
    "shape, tma_store",
    [((17, 128, 1024, 1024), True), ((1, 128, 4096, 4160), True), ((1, 128, 4096, 4160), False)],
    ids=["images", "one-image", "one-image-pointer-stores"],
)
def test_windows_past_int32_offsets(shape, tma_store, monkeypatch, gigabytes):
    """CBNA 3x3 on fp16 channels-last tensors past 2^31 elements (4.4 GB each) on gluon-window
    (host descriptors for the input, 64-bit offsets for the output): many images, and one image
    whose own offsets pass 2^31, its output stored by TMA and by pointer; compared block by block
    of rows with the fp32 reference, every element written."""
    from fusionplan.runtime import tuning

    monkeypatch.setattr(tuning, "TMA_STORE_MIN_PIXELS", 128 if tma_store else 1 << 20)
    x = input_tensor(shape, torch.float16, "NHWC")
    plan = same_size_cbna(x, 3)
    handle = fp.Handle("cuda")
    assert plan.compile(handle) == "gluon-window" and x.numel() > 2**31
    args = random_args(plan, "cuda", param_dtype=torch.float32)
    y = poisoned(plan.output_desc, "NHWC", "cuda")
    plan.execute(handle, x, y, args)
    if shape[0] > 1:
        slices = [slice(n, n + 3) for n in range(0, shape[0], 3)]
    else:
        slices = row_blocks_with_halo(shape[2], 512, 1)
    check_in_slices(plan, x, y, args, slices, "gluon-window")


@pytest.mark.parametrize("solver", ["triton-window", "gluon-window"])
@pytest.mark.parametrize("pixels", [64, 128, 256])
@pytest.mark.parametrize("hw", [(28, 28), (14, 14), (8, 8), (13, 11), (9, 30), (56, 56), (7, 7), (4, 5)])
def test_window_shapes(pixels, hw, solver):
    """Every window the tile chooser picks computes every output pixel right, whatever the image
    (windows of several images on small ones; 5 images, so the last group is partial)."""
    from fusionplan.runtime import tuning

    if tuning.window_shape(5, *hw, pixels) is None:
        pytest.skip(f"no {pixels}-pixel window fits 5 images of {hw}")
    for stages, block_n in ((3, 64), (4, 128)):
        x = input_tensor((5, 128, *hw), torch.float16, "NHWC")
        conv = fp.ConvolutionDescriptor((1, 1))
        plan = add_chain(plan_for(x), "CBA", conv=conv, k=128, r=3, s=3, param_dtype="half")
        handle = fp.Handle("cuda")
        assert plan.compile(handle, solver=solver) == solver
        plan._entry(handle).kernel.config = tuning.ConvConfig(pixels, block_n, 64, 8, 8 if pixels == 256 else 4, stages)
        args = random_args(plan, "cuda", param_dtype=torch.float32)
        y = torch.full(plan.output_desc.dims, float("nan"), dtype=torch.float16, device="cuda")
        y = y.to(memory_format=torch.channels_last)
        plan.execute(handle, x, y, args)
        result = compare(y, reference_output(plan, x, args), EPS[torch.float16])
        assert result.nonfinite == 0 and result.rel_norm < 1e-2 and result.rms_ok, f"{stages=} {block_n=}: {result}"


#: (n, c, h, w, k, r, s, pad, stride, dilation): stride 1 and 2 (every stride class in one view), dilation,
#: C not a multiple of the 64-channel step, K below a warpgroup's 64 rows and not a multiple of 128,
#: windows of several images, odd images, 1x1 and 5x5 filters, "valid" padding.
GLUON_CASES = {
    "r50_16-like": (6, 256, 14, 14, 256, 3, 3, 1, 1, 1),
    "strided-3x3": (6, 256, 14, 14, 192, 3, 3, 1, 2, 1),
    "strided-1x1": (4, 128, 28, 28, 136, 1, 1, 0, 2, 1),
    "strided-odd-k": (3, 192, 16, 12, 40, 3, 3, 1, 2, 1),
    "C136-K24": (5, 136, 13, 11, 24, 3, 3, 1, 1, 1),
    "dilated": (2, 128, 20, 18, 96, 3, 3, 2, 1, 2),
    "7x7-images": (9, 128, 7, 7, 320, 3, 3, 1, 1, 1),
    "1x1": (4, 200, 9, 30, 72, 1, 1, 0, 1, 1),
    "5x5-valid": (3, 128, 17, 19, 64, 5, 5, 0, 1, 1),
}


#: (case, precision, chain, TMA stores): every case in every precision and chain, the chain run
#: in the accumulator's layout (16-bit output changing layout for its stores, fp32 output stored
#: from the accumulator's layout), 16-bit windows stored by TMA where they have
#: tuning.TMA_STORE_MIN_PIXELS or more (an NCHW output at launch by pointer; test_window_shapes
#: forces 128- and 256-pixel windows) and, in one chain, by pointer.
GLUON_WINDOW_RUNS = [
    (case, precision, chain, tma_store)
    for tma_store, chains, precisions in (
        (True, ("CBNA", "CA", "CNAAB"), ("fp16", "bf16", "tf32")),
        (False, ("CBNA",), ("fp16", "bf16")),
    )
    for case in GLUON_CASES
    for precision in precisions
    for chain in chains
]


@pytest.mark.parametrize("case, precision, chain, tma_store", GLUON_WINDOW_RUNS)
def test_gluon_window_cases(case, precision, chain, tma_store, monkeypatch):
    from fusionplan.runtime import tuning

    monkeypatch.setattr(tuning, "TMA_STORE_MIN_PIXELS", 128 if tma_store else 1 << 20)
    n, c, h, w, k, r, s, pad, stride, dil = GLUON_CASES[case]
    dtype = PRECISIONS[precision][0]
    x = input_tensor((n, c, h, w), dtype, "NHWC")
    conv = fp.ConvolutionDescriptor((pad, pad), (stride, stride), (dil, dil))
    plan = add_chain(plan_for(x), chain, conv=conv, k=k, r=r, s=s, activation=ActivationMode.ELU, param_dtype="float")
    verdict = next(v for v in plan.explain(fp.Handle("cuda", allow_tf32=True)) if v.solver == "gluon-window")
    assert verdict.applicable, str(verdict)
    run_and_check(plan, precision, x, "NHWC", solver="gluon-window")
    args = seeded_alpha_beta_args(plan, case, "cuda", torch.float32)
    prior = torch.randn(plan.output_desc.dims, device="cuda").to(dtype).to(memory_format=torch.channels_last)
    run_and_check(plan, precision, x, "NHWC", args=args, prior=prior, solver="gluon-window")
    if tma_store:  # an NCHW output at launch: stored by pointer
        run_and_check(plan, precision, x, "NCHW", solver="gluon-window")
