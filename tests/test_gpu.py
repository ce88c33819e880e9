"""GPU suite (marker ``gpu``; skipped without CUDA): the real Triton kernels on the device.

All 23 ResNet-50 layers at batch 8 x {fp32, TF32, fp16, bf16} x {NCHW, NHWC} x eight chains, the
odd shapes, pointwise chains and random plans, each against the float64 reference, outputs
NaN-poisoned first, with FUSIONPLAN_BACKEND=triton so nothing falls back silently.

    python -m pytest -m gpu tests/test_gpu.py -n 12      # pytest-xdist: many kernels compile
"""

import os
import random
from dataclasses import replace

import pytest
import torch

import fusionplan as fp
from fusionplan.enums import ActivationMode, BatchNormMode
from fusionplan.reference import run_reference
from fusionplan.shapes import load_shapes
from fusionplan.solvers import REGISTRY
from fusionplan.testing import EPS, TF32_EPS, add_chain, compare, random_args, random_record, reference_output

from .util import (
    CONV_SHAPES,
    DT_NAME,
    TAP_SHAPES,
    plan_for,
    poisoned,
    random_conv_plan,
    seeded_alpha_beta_args,
    shape_plan,
)

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

PRECISIONS = {  # name: (dtype, TF32 allowed, relative-norm tolerance, epsilon of the rms rule)
    "fp32": (torch.float32, False, 1e-5, EPS[torch.float32]),
    "tf32": (torch.float32, True, 1e-3, TF32_EPS),
    "fp16": (torch.float16, False, 1e-2, EPS[torch.float16]),
    "bf16": (torch.bfloat16, False, 1e-2, EPS[torch.bfloat16]),
}
CHAINS = ["CBNA", "CBA", "CA", "CB", "CN", "CNA", "CANB", "CNAAB"]  # MIOpen's six and two unusual orders
LAYERS = load_shapes()
TRITON_SOLVERS = {s.name for s in REGISTRY if s.family == "triton"}


@pytest.fixture(autouse=True)
def triton_only(monkeypatch):
    monkeypatch.setenv("FUSIONPLAN_BACKEND", "triton")


@pytest.fixture
def gigabytes():
    """For tests of several GB each: a lock of the host's, so that parallel workers (pytest -n)
    run them one at a time (four at once exhaust an 80 GB GPU), each worker's cached memory handed
    back before the next one starts."""
    import fcntl
    import tempfile

    with open(os.path.join(tempfile.gettempdir(), "fusionplan-gpu-tests-gigabytes.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            fcntl.flock(lock, fcntl.LOCK_UN)


def check_forced_solver(solver, case, dims, conv, k, r, s, precision, chain, out_layout, in_layout="NHWC"):
    """``solver`` forced on a convolution of ``dims`` input (``in_layout``) and ``chain`` (ELU
    activation) against the float64 reference, the output NaN-filled in ``out_layout``; then with
    random alpha and beta (seeded by ``case``) over a prior output."""
    dtype = PRECISIONS[precision][0]
    x = input_tensor(dims, dtype, in_layout)
    plan = add_chain(plan_for(x), chain, conv=conv, k=k, r=r, s=s, activation=ActivationMode.ELU, param_dtype="float")
    verdict = next(v for v in plan.explain(fp.Handle("cuda")) if v.solver == solver)
    assert verdict.applicable, str(verdict)
    run_and_check(plan, precision, x, out_layout, solver=solver)
    args = seeded_alpha_beta_args(plan, case, "cuda", torch.float32)
    prior = torch.randn(plan.output_desc.dims, device="cuda").to(dtype)
    run_and_check(plan, precision, x, out_layout, args=args, prior=prior, solver=solver)


def run_and_check(plan, precision, x, out_layout, args=None, prior=None, y=None, solver=None):
    _, tf32, tol, eps = PRECISIONS[precision]
    handle = fp.Handle("cuda", allow_tf32=tf32)
    assert plan.compile(handle, solver=solver) in TRITON_SOLVERS
    args = args or random_args(plan, "cuda", param_dtype=torch.float32)
    if y is None:
        y = poisoned(plan.output_desc, out_layout, "cuda")
    records = [args.get(op) for op in plan.ops]
    needs_prior = any(r.beta != 0 for r in records)
    ref = reference_output(plan, x, args, (prior if prior is not None else y.clone()) if needs_prior else None)
    plan.execute(handle, x, y, args, prior=prior)
    torch.cuda.synchronize()
    result = compare(y, ref, eps)
    assert result.nonfinite == 0, f"unwritten or non-finite outputs: {result}"
    assert result.rel_norm < tol, str(result)
    assert result.rms_ok, str(result)


def check_random_records(plan, handle, x, precision, rng, with_prior, out_layout, context):
    """Execute ``plan`` on ``x`` with random records (alpha in [0.5, 2]; with a prior, beta in [-1, 1]
    and a random prior output), the output NaN-filled in ``out_layout``, and compare it with the
    reference; ``context`` goes into the failure's message."""
    dtype, _, tol, eps = PRECISIONS[precision]  # dtype: the prior's
    args = fp.OperatorArgs()
    for op in plan.ops:
        beta = rng.uniform(-1, 1) if with_prior else 0.0
        args.set(op, random_record(op, "cuda", param_dtype=torch.float32, alpha=rng.uniform(0.5, 2), beta=beta))
    prior = torch.randn(plan.output_desc.dims, device="cuda").to(dtype) if with_prior else None
    y = poisoned(plan.output_desc, out_layout, "cuda")
    plan.execute(handle, x, y, args, prior=prior)
    result = compare(y, reference_output(plan, x, args, prior), eps)
    assert result.nonfinite == 0 and result.rel_norm < tol and result.rms_ok, (context, with_prior, result)


#: The output layouts and priors a kernel's tile tests run each configuration with.
LAYOUTS_AND_PRIORS = (("NCHW", False), ("NHWC", False), ("NCHW", True))


def check_kernel_config(plan, handle, kernel, x, precision, rng):
    """check_random_records on fresh input for each (output layout, prior) of LAYOUTS_AND_PRIORS,
    with the compiled ``kernel``'s current configuration (a repeat recorded with another one
    dropped first)."""
    for out_layout, with_prior in LAYOUTS_AND_PRIORS:
        kernel._repeats._by_records.clear()
        x.normal_()
        check_random_records(plan, handle, x, precision, rng, with_prior, out_layout, kernel.config)


def input_tensor(shape, dtype, layout):
    x = torch.randn(shape, device="cuda").to(dtype)
    return x.to(memory_format=torch.channels_last) if layout == "NHWC" else x


@pytest.mark.parametrize("chain", CHAINS)
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("precision", list(PRECISIONS))
@pytest.mark.parametrize("layer", LAYERS, ids=[s.name for s in LAYERS])
def test_resnet50_layer(layer, precision, layout, chain):
    dtype = PRECISIONS[precision][0]
    x = input_tensor((8, layer.c, layer.h, layer.w), dtype, layout)
    plan = add_chain(
        plan_for(x),
        chain,
        conv=fp.ConvolutionDescriptor((layer.pad, layer.pad), (layer.stride, layer.stride), (1, 1), 1),
        k=layer.k,
        r=layer.r,
        s=layer.s,
        bn_mode=BatchNormMode.SPATIAL,
        activation=ActivationMode.RELU,
        param_dtype=DT_NAME[dtype],
    )
    run_and_check(plan, precision, x, layout)


@pytest.mark.parametrize("shape_key", list(CONV_SHAPES))
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("precision", list(PRECISIONS))
@pytest.mark.parametrize("bn_mode", list(BatchNormMode))
def test_odd_shapes(shape_key, layout, precision, bn_mode):
    plan, x = shape_plan(
        shape_key, "CBNA", PRECISIONS[precision][0], layout, bn_mode, ActivationMode.ELU, device="cuda"
    )
    run_and_check(plan, precision, x, "NHWC" if layout == "NCHW" else "NCHW")


@pytest.mark.parametrize("batch", [1, 8])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("precision", ["fp16", "tf32"])
@pytest.mark.parametrize("name", ["r50_01", "r50_02", "r50_06", "r50_16", "r50_22"])
def test_conv_tap_bits_on_resnet50_layers(name, precision, layout, batch, monkeypatch):
    """triton-conv with tuning.CONV_TAP_BITS on ResNet-50's layers (1x1, 3x3, strided 3x3, 14x14 and
    7x7 outputs; batch 1 splits the reduction), whole channel blocks as the layers have them."""
    from fusionplan import tuning

    monkeypatch.setattr(tuning, "CONV_TAP_BITS", True)
    layer = next(s for s in LAYERS if s.name == name)
    dtype = PRECISIONS[precision][0]
    x = input_tensor((batch, layer.c, layer.h, layer.w), dtype, layout)
    conv = fp.ConvolutionDescriptor((layer.pad, layer.pad), (layer.stride, layer.stride), (1, 1), 1)
    plan = add_chain(plan_for(x), "CBNA", conv=conv, k=layer.k, r=layer.r, s=layer.s, param_dtype=DT_NAME[dtype])
    run_and_check(plan, precision, x, layout, solver="triton-conv")


@pytest.mark.parametrize("shape_key", list(TAP_SHAPES))
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("precision", ["fp16", "tf32"])
def test_conv_tap_bits_on_odd_shapes(shape_key, layout, precision, monkeypatch):
    """triton-conv with tuning.CONV_TAP_BITS (a bit per filter tap, set once per pixel): padding,
    stride, dilation, groups, channels no block divides; 7x7 keeps the old reduction."""
    from fusionplan import tuning

    monkeypatch.setattr(tuning, "CONV_TAP_BITS", True)
    plan, x = shape_plan(
        shape_key,
        "CBNA",
        PRECISIONS[precision][0],
        layout,
        BatchNormMode.SPATIAL,
        ActivationMode.ELU,
        device="cuda",
        shapes=TAP_SHAPES,
    )
    run_and_check(plan, precision, x, layout, solver="triton-conv")


@pytest.mark.parametrize("act", list(ActivationMode))
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_activations(act, precision):
    dtype = PRECISIONS[precision][0]
    x = input_tensor((4, 16, 15, 13), dtype, "NHWC")
    plan = add_chain(
        plan_for(x),
        "CBA",
        conv=fp.ConvolutionDescriptor((1, 1), (1, 1), (1, 1), 1),
        k=24,
        r=3,
        s=3,
        bn_mode=BatchNormMode.SPATIAL,
        activation=act,
        param_dtype=DT_NAME[dtype],
    )
    run_and_check(plan, precision, x, "NHWC")


@pytest.mark.parametrize("chain", ["NA", "BA", "NAN", "AA", "ABNA"])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("precision", ["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("bn_mode", list(BatchNormMode))
@pytest.mark.parametrize("shape", [(8, 64, 28, 28), (4, 64, 14, 14), (8, 96, 7, 7)], ids=["28x28", "14x14", "7x7"])
def test_pointwise_chains(chain, layout, precision, bn_mode, shape):
    """Dense tensors: flat runs (NHWC, and NCHW planes below 28x28 or of whole vectors) or tiles."""
    dtype = PRECISIONS[precision][0]
    x = input_tensor(shape, dtype, layout)
    plan = add_chain(
        plan_for(x), chain, bn_mode=bn_mode, activation=ActivationMode.LEAKYRELU, param_dtype=DT_NAME[dtype]
    )
    run_and_check(plan, precision, x, layout)


@pytest.mark.parametrize("in_layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("plane", [7, 28])
def test_pointwise_tiles_into_other_strides(in_layout, plane):
    """Outputs in the other layout, or a strided view: the [pixels, channels] tiles."""
    x = input_tensor((4, 48, plane, plane), torch.float16, in_layout)
    plan = add_chain(
        plan_for(x), "NA", bn_mode=BatchNormMode.SPATIAL, activation=ActivationMode.RELU, param_dtype="half"
    )
    run_and_check(plan, "fp16", x, "NHWC" if in_layout == "NCHW" else "NCHW")
    view = torch.full((4, 48, plane + 3, plane + 1), float("nan"), dtype=torch.float16, device="cuda")
    run_and_check(plan, "fp16", x, "NCHW", y=view[:, :, 2 : plane + 2, 1:])


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("shape", [(4, 64, 28, 28), (4, 96, 7, 7)], ids=["28x28", "7x7"])
@pytest.mark.parametrize("prior_layout", ["same", "other"])
def test_pointwise_chains_blend_a_prior(layout, shape, prior_layout):
    """alpha and beta on every operator; the prior in the output's layout (flat runs) or in the
    other one (the tiles)."""
    x = input_tensor(shape, torch.float16, layout)
    plan = add_chain(
        plan_for(x), "NAB", bn_mode=BatchNormMode.SPATIAL, activation=ActivationMode.ELU, param_dtype="float"
    )
    args = seeded_alpha_beta_args(plan, shape[3] + len(layout) + len(prior_layout), "cuda", torch.float32)
    other = "NHWC" if layout == "NCHW" else "NCHW"
    prior = input_tensor(plan.output_desc.dims, torch.float16, layout if prior_layout == "same" else other)
    run_and_check(plan, "fp16", x, layout, args=args, prior=prior)


def test_pointwise_large_tensor(gigabytes):
    """A 1 GiB fp16 tensor (2^29 elements) through an NA chain."""
    x = input_tensor((64, 256, 128, 256), torch.float16, "NHWC")
    plan = add_chain(
        plan_for(x), "NA", bn_mode=BatchNormMode.SPATIAL, activation=ActivationMode.RELU, param_dtype="half"
    )
    run_and_check(plan, "fp16", x, "NHWC")


def check_in_slices(plan, x, y, args, slices, context: str = "") -> None:
    """Compare fp16 ``y`` with the fp32 reference on the GPU, slice by slice of ``slices`` (indices
    into x and y, or (x's, y's, the reference's) where a slice of x's rows carries a halo), for
    tensors too large for run_and_check's float64 copies on the CPU: every element written, the
    relative norm below 1e-2."""
    records = [args.get(op) for op in plan.ops]
    for index in slices:
        x_index, y_index, ref_index = index if isinstance(index, list) else (index, index, ...)
        ref = run_reference(plan.ops, x[x_index], records, None, torch.float32).output[ref_index]
        out = y[y_index]
        assert torch.isfinite(out).all(), f"{context} {index}: elements not written"
        rel_norm = ((out.float() - ref).norm() / ref.norm()).item()
        assert rel_norm < 1e-2, f"{context} {index}: relative norm {rel_norm}"


@pytest.mark.parametrize("in_layout, out_layout", [("NCHW", "NCHW"), ("NHWC", "NHWC"), ("NCHW", "NHWC")])
def test_pointwise_past_int32_offsets(in_layout, out_layout, gigabytes):
    """2^31 + 2^21 fp16 elements (4.3 GB a tensor): 64-bit offsets in the flat runs (NCHW planes in
    vectors, channels-last) and in the tiles (orders that differ); compared in slices of rows
    against the reference in fp32, every element written."""
    shape = (2, 64, 4096, 4100)
    x = input_tensor(shape, torch.float16, in_layout)
    plan = add_chain(
        plan_for(x), "NA", bn_mode=BatchNormMode.SPATIAL, activation=ActivationMode.RELU, param_dtype="float"
    )
    handle = fp.Handle("cuda")
    plan.compile(handle)
    args = random_args(plan, "cuda", param_dtype=torch.float32)
    y = poisoned(plan.output_desc, out_layout, "cuda")
    assert x.numel() > 2**31
    plan.execute(handle, x, y, args)
    check_in_slices(plan, x, y, args, [(slice(None), slice(None), slice(h, h + 1024)) for h in range(0, 4096, 1024)])


def same_size_cbna(x: torch.Tensor, r: int) -> fp.FusionPlan:
    """CBNA-ReLU (spatial batch norm, fp32 parameters) on ``x`` with an r x r filter padded to keep
    the size, as many channels out as in."""
    pad = (r - 1) // 2
    conv = fp.ConvolutionDescriptor((pad, pad), (1, 1), (1, 1), 1)
    return add_chain(
        plan_for(x),
        "CBNA",
        conv=conv,
        k=x.shape[1],
        r=r,
        s=r,
        bn_mode=BatchNormMode.SPATIAL,
        activation=ActivationMode.RELU,
        param_dtype="float",
    )


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
    from fusionplan import tuning

    monkeypatch.setattr(tuning, "GLUON_WINDOW_TMA_STORE", tma_store)
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


def test_repeats_agree_bit_for_bit_while_other_processes_share_the_gpu(gigabytes):
    """gluon-gemm's persistent tiles on 2.2e9-element NCHW planes (about 5 ms a launch, so the GPU
    switches to the other processes' contexts inside it), repeated with the same arguments beside
    4 processes running matrix products: each output bit for bit the first's, taken alone. An
    epilogue buffer over initialized barriers came back corrupted there (channel 0, NaN and
    garbage) in every repeat (bench/NOTES.md section 45)."""
    from fusionplan.benchmark.contention import other_processes_on_the_gpu

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


@pytest.mark.parametrize("precision", list(PRECISIONS))
def test_alpha_beta_prior(precision):
    dtype = PRECISIONS[precision][0]
    x = input_tensor((4, 32, 14, 14), dtype, "NHWC")
    plan = add_chain(
        plan_for(x),
        "CBNAB",
        conv=fp.ConvolutionDescriptor((1, 1), (1, 1), (1, 1), 1),
        k=48,
        r=3,
        s=3,
        bn_mode=BatchNormMode.PER_ACTIVATION,
        activation=ActivationMode.TANH,
        param_dtype=DT_NAME[dtype],
    )
    args = seeded_alpha_beta_args(plan, 5, "cuda", torch.float32)
    y = torch.randn(plan.output_desc.dims, device="cuda").to(dtype)
    run_and_check(plan, precision, x, "NHWC", args=args, y=y)
    # priors of other dtypes and layouts, one after the other: each needs its own compiled kernel
    for prior_dtype, fmt in ((torch.float32, torch.contiguous_format), (torch.float16, torch.channels_last)):
        prior = torch.randn(plan.output_desc.dims, device="cuda").to(prior_dtype).to(memory_format=fmt)
        run_and_check(plan, precision, x, "NHWC", args=args, prior=prior)


#: Shapes beside CONV_SHAPES that select the other convolution solvers: (n, c, h, w, k, r, s, pad, stride, groups)
SOLVER_SHAPES = {
    "window-C128": (2, 128, 9, 10, 24, 3, 3, (1, 1), (1, 1), 1),
    "window-5x5": (1, 128, 12, 7, 16, 5, 5, (2, 2), (1, 1), 1),
    "gemm-1x1": (3, 64, 7, 9, 40, 1, 1, (0, 0), (1, 1), 1),
    "depthwise-x2": (2, 16, 13, 11, 32, 3, 3, (1, 1), (1, 1), 16),
    "depthwise-stride2": (2, 32, 14, 15, 32, 3, 3, (1, 1), (2, 2), 32),
    "depthwise-5x5": (1, 24, 9, 9, 24, 5, 5, (2, 2), (1, 1), 24),
}


def solver_plan(key, dtype, layout):
    n, c, h, w, k, r, s, pad, stride, groups = SOLVER_SHAPES[key]
    x = input_tensor((n, c, h, w), dtype, layout)
    plan = add_chain(
        plan_for(x),
        "CBNA",
        conv=fp.ConvolutionDescriptor(pad, stride, (1, 1), groups),
        k=k,
        r=r,
        s=s,
        bn_mode=BatchNormMode.SPATIAL,
        activation=ActivationMode.ELU,
        param_dtype=DT_NAME[dtype],
    )
    return plan, x


@pytest.mark.parametrize("key", list(CONV_SHAPES) + list(SOLVER_SHAPES))
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("precision", ["fp32", "tf32", "fp16", "bf16"])
def test_every_applicable_solver(key, layout, precision):
    """Each Triton solver that accepts a plan computes it, not only the one the registry picks first."""
    dtype = PRECISIONS[precision][0]
    if key in CONV_SHAPES:
        plan, x = shape_plan(key, "CBNA", dtype, layout, act=ActivationMode.ELU, device="cuda")
    else:
        plan, x = solver_plan(key, dtype, layout)
    handle = fp.Handle("cuda", allow_tf32=PRECISIONS[precision][1])  # the handle run_and_check compiles for
    applicable = [v.solver for v in plan.explain(handle) if v.applicable and v.family == "triton"]
    assert applicable, f"no Triton solver for {key}: {plan.explain(handle)}"
    for name in applicable:
        run_and_check(plan, precision, x, "NHWC" if layout == "NCHW" else "NCHW", solver=name)


ROW_SLOT_LAYERS = [
    s for s in LAYERS if s.name in ("r50_02", "r50_10", "r50_15", "r50_21", "r50_22", "r50_06", "r50_18", "r50_20")
]


@pytest.mark.parametrize("out_layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("precision", ["fp16", "tf32"])
@pytest.mark.parametrize("layer", ROW_SLOT_LAYERS, ids=[s.name for s in ROW_SLOT_LAYERS])
def test_conv_row_slots_on_nchw_layers(layer, precision, out_layout, monkeypatch):
    """triton-conv with tuning.CONV_NCHW_ROW_SLOTS and CONV_NCHW_ROW_PAIRS on NCHW input (rows of
    56, 28, 14 and 7 pixels in 64, 32, 16 and 8 slots; stride 2 as pairs of columns: r50_06,
    r50_18, r50_20; split reductions on the 7x7 layers at batch 3)."""
    from fusionplan import tuning

    monkeypatch.setattr(tuning, "CONV_NCHW_ROW_SLOTS", True)
    monkeypatch.setattr(tuning, "CONV_NCHW_ROW_PAIRS", True)
    dtype = PRECISIONS[precision][0]
    x = input_tensor((3, layer.c, layer.h, layer.w), dtype, "NCHW")
    conv = fp.ConvolutionDescriptor((layer.pad, layer.pad), (layer.stride, layer.stride))
    plan = add_chain(plan_for(x), "CBNA", conv=conv, k=layer.k, r=layer.r, s=layer.s, param_dtype="float")
    handle = fp.Handle("cuda", allow_tf32=PRECISIONS[precision][1])
    assert plan.compile(handle, solver="triton-conv") == "triton-conv"
    assert plan._entry(handle).kernel.pixel_slots > 0
    run_and_check(plan, precision, x, out_layout, solver="triton-conv")


# planes of 3136, 784, 196, 49 pixels; stride 2 from 3136, 784, 196
NCHW_GEMM_LAYERS = [s for s in LAYERS if s.r == 1]


@pytest.mark.parametrize("out_layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("prior", [False, True])
@pytest.mark.parametrize("precision", ["fp16", "bf16", "tf32"])
@pytest.mark.parametrize("layer", NCHW_GEMM_LAYERS, ids=[s.name for s in NCHW_GEMM_LAYERS])
def test_nchw_gemm_layers(layer, precision, prior, out_layout):
    """triton-gemm-nchw on every 1x1 ResNet-50 layer with NCHW input (stride 1 and 2): output in
    planes (the contiguous store) or channels-last, with and without a prior output blended in."""
    dtype = PRECISIONS[precision][0]
    x = input_tensor((3, layer.c, layer.h, layer.w), dtype, "NCHW")
    conv = fp.ConvolutionDescriptor((0, 0), (layer.stride, layer.stride))
    plan = add_chain(
        plan_for(x), "CBNA", conv=conv, k=layer.k, r=1, s=1, activation=ActivationMode.ELU, param_dtype="float"
    )
    args = fp.OperatorArgs()
    for op in plan.ops:
        args.set(op, random_record(op, "cuda", param_dtype=torch.float32, beta=0.5 if prior else 0.0))
    prior_tensor = torch.randn(plan.output_desc.dims, device="cuda").to(dtype) if prior else None
    if prior_tensor is not None and out_layout == "NHWC":
        prior_tensor = prior_tensor.to(memory_format=torch.channels_last)
    run_and_check(plan, precision, x, out_layout, args=args, prior=prior_tensor, solver="triton-gemm-nchw")


@pytest.mark.parametrize("solver", ["triton-window", "gluon-window"])
@pytest.mark.parametrize("pixels", [64, 128, 256])
@pytest.mark.parametrize("hw", [(28, 28), (14, 14), (8, 8), (13, 11), (9, 30), (56, 56), (7, 7), (4, 5)])
def test_window_shapes(pixels, hw, solver):
    """Every window the tile chooser picks computes every output pixel right, whatever the image
    (windows of several images on small ones; 5 images, so the last group is partial)."""
    from fusionplan import tuning

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


#: (case, precision, chain, the epilogue in the accumulator's layout, TMA stores): every case in
#: every precision and chain with the accumulator's layout changed first, and in two chains with
#: the chain run in it (tuning.GLUON_WINDOW_MMA_EPILOGUE: 16-bit output changing layout for its
#: stores, fp32 output stored from the accumulator's layout), 16-bit windows stored by TMA where
#: they have tuning.TMA_STORE_MIN_PIXELS or more (tuning.GLUON_WINDOW_TMA_STORE; an NCHW output at
#: launch by pointer; test_window_shapes forces 128- and 256-pixel windows) and, in one chain, by
#: pointer.
GLUON_WINDOW_RUNS = [
    (case, precision, chain, mma_epilogue, tma_store)
    for mma_epilogue, tma_store, chains, precisions in (
        (False, True, ("CBNA", "CA", "CNAAB"), ("fp16", "bf16", "tf32")),
        (True, True, ("CBNA", "CNAAB"), ("fp16", "bf16", "tf32")),
        (True, False, ("CBNA",), ("fp16", "bf16")),
    )
    for case in GLUON_CASES
    for precision in precisions
    for chain in chains
]


@pytest.mark.parametrize("case, precision, chain, mma_epilogue, tma_store", GLUON_WINDOW_RUNS)
def test_gluon_window_cases(case, precision, chain, mma_epilogue, tma_store, monkeypatch):
    from fusionplan import tuning

    monkeypatch.setattr(tuning, "GLUON_WINDOW_MMA_EPILOGUE", mma_epilogue)
    monkeypatch.setattr(tuning, "GLUON_WINDOW_TMA_STORE", tma_store)
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


#: (n, c, h, w, k, r, s, pads, dilation) for gluon-rows: ResNet-50's 64-channel 3x3 layer on few
#: images; K not a multiple of 8 nor of the 64-channel block (17, 136: three blocks), C below the
#: box's power of two (48, 8), a 5x5 filter of 16 channels, dilation 2, no padding, uneven padding,
#: a 1x3 filter, rows narrower than 32 pixels (13: 16-pixel products), fewer rows than programs
#: (one image of 5 rows), runs that cross images (more rows than programs) and runs of about ten
#: output rows and more that wrap around the ring and cross images (long-runs: 150 images of 9 rows).
GLUON_ROWS_CASES = {
    "r50_02-like": (3, 64, 56, 56, 64, 3, 3, (1, 1), 1),
    "C16-K17": (5, 16, 13, 40, 17, 3, 3, (1, 1), 1),
    "C48-K96": (2, 48, 21, 37, 96, 3, 3, (1, 1), 1),
    "C8-K32": (2, 8, 12, 40, 32, 3, 3, (1, 1), 1),
    "5x5-C16": (2, 16, 20, 45, 24, 5, 5, (2, 2), 1),
    "dilated": (3, 32, 30, 33, 40, 3, 3, (2, 2), 2),
    "valid": (4, 64, 18, 34, 64, 3, 3, (0, 0), 1),
    "pads-2-0": (3, 64, 11, 40, 64, 3, 3, (2, 0), 1),
    "K136": (2, 64, 24, 64, 136, 3, 3, (1, 1), 1),
    "1x3": (3, 64, 10, 50, 64, 1, 3, (0, 1), 1),
    "narrow": (6, 64, 9, 13, 64, 3, 3, (1, 1), 1),
    "one-image": (1, 64, 5, 40, 64, 3, 3, (1, 1), 1),
    "long-runs": (150, 64, 9, 40, 64, 3, 3, (1, 1), 1),
    "long-runs-5x5": (60, 16, 30, 50, 32, 5, 5, (2, 2), 1),
    # two channel halves (C > 64), one per computing warpgroup: ResNet's r50_10, C = 72 and 96
    # (the second half's box partly past C), K = 17 and 136, dilation 2 (16-pixel rows), 1x3 (64-pixel rows: R = 1
    # needs 2 slots), rows of 13 and 32 pixels, long runs around the ring and across images
    "halves-r50_10-like": (3, 128, 28, 28, 128, 3, 3, (1, 1), 1),
    "halves-C72-K17": (3, 72, 14, 30, 17, 3, 3, (1, 1), 1),
    "halves-C96-K136": (2, 96, 20, 30, 136, 3, 3, (1, 1), 1),
    "halves-dilated": (2, 128, 24, 14, 64, 3, 3, (2, 2), 2),
    "halves-1x3": (3, 128, 10, 50, 64, 1, 3, (0, 1), 1),
    "halves-narrow": (6, 128, 9, 13, 64, 3, 3, (1, 1), 1),
    "halves-32": (2, 128, 12, 32, 64, 3, 3, (1, 1), 1),
    "halves-long-runs": (150, 128, 9, 28, 64, 3, 3, (1, 1), 1),
}


@pytest.mark.parametrize("out_layout", ["NHWC", "NCHW"])
@pytest.mark.parametrize("precision, chain", [("fp16", "CBNA"), ("bf16", "CNAAB"), ("fp16", "CA")])
@pytest.mark.parametrize("case", list(GLUON_ROWS_CASES))
def test_gluon_rows_cases(case, precision, chain, out_layout):
    """gluon-rows forced on each case against the float64 reference, the output NaN-filled in
    either layout; then with random alpha and beta over a prior output."""
    n, c, h, w, k, r, s, pads, dil = GLUON_ROWS_CASES[case]
    conv = fp.ConvolutionDescriptor(pads, (1, 1), (dil, dil))
    check_forced_solver("gluon-rows", case, (n, c, h, w), conv, k, r, s, precision, chain, out_layout)


#: GLUON_ROWS_CASES that gluon-rows takes on channel planes (NCHW input: rows of whole 16-byte
#: units that an output row's box holds, at most 64 channels), a dilated one of 40 columns, rows
#: of 24 pixels (32 in the product) and of 96 (128: past what a shifter's thread holds, shifted
#: products).
GLUON_ROWS_PLANE_CASES = {
    **{name: case for name, case in GLUON_ROWS_CASES.items() if case[3] % 8 == 0 and case[1] <= 64},
    "dilated-40": (3, 32, 30, 40, 40, 3, 3, (2, 2), 2),
    "rows-24": (3, 32, 11, 24, 40, 3, 3, (1, 1), 1),
    "rows-96": (2, 32, 9, 96, 40, 3, 3, (1, 1), 1),
}


@pytest.mark.parametrize("shifts", [True, False], ids=["shifted-rows", "shifted-products"])
@pytest.mark.parametrize("out_layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("precision, chain", [("fp16", "CBNA"), ("bf16", "CNAAB")])
@pytest.mark.parametrize("case", list(GLUON_ROWS_PLANE_CASES))
def test_gluon_rows_plane_cases(case, precision, chain, out_layout, shifts, monkeypatch):
    """gluon-rows on channel-plane input (tuning.GLUON_ROWS_PLANES: each input row's box from
    column 0; the filter's columns as the shifter's moved copies of the box, or as shifts of the
    products) against the float64 reference."""
    monkeypatch.setattr(fp.tuning, "GLUON_ROWS_PLANES", True)
    monkeypatch.setattr(fp.tuning, "GLUON_ROWS_PLANE_SHIFTS", shifts)
    n, c, h, w, k, r, s, pads, dil = GLUON_ROWS_PLANE_CASES[case]
    conv = fp.ConvolutionDescriptor(pads, (1, 1), (dil, dil))
    check_forced_solver("gluon-rows", case, (n, c, h, w), conv, k, r, s, precision, chain, out_layout, "NCHW")


#: (n, c, h, w, k, r, s, pads, strides, dilation) for gluon-stem: ResNet-50's stem on few images;
#: K not a multiple of 8 nor of the 64-channel block (17, 136: three blocks), C = 4 and 8, a 3x3
#: stride-1 filter (on channel planes: runs of two pixels, 4-byte copies), dilation 2 (on channel
#: planes: 8 planes side by side in a 64-element row), uneven padding, a 1x7 filter, stride 3, rows
#: of a single run, fewer output rows than programs (one image of 5 rows) and runs of output rows
#: that cross images and wrap around the ring (long-runs: 90 images of 4 rows; 12 images of 56),
#: runs of one pixel (C = 2) and of four (rows of 199 and 160 pixels: C = 1, 16-byte copies; C = 2
#: with TMA stores of the channels-last output, like every case whose rows are whole runs of
#: 16-byte aligned pixels).
GLUON_STEM_CASES = {
    "r50_00-like": (3, 3, 224, 224, 64, 7, 7, (3, 3), (2, 2), 1),
    "C3-K17": (2, 3, 40, 52, 17, 7, 7, (3, 3), (2, 2), 1),
    "C4-K136": (2, 4, 21, 36, 136, 3, 3, (1, 1), (1, 1), 1),
    "C8-dilated": (3, 8, 30, 40, 32, 3, 3, (2, 2), (1, 1), 2),
    "pads-3-1": (2, 3, 25, 64, 64, 7, 7, (3, 1), (2, 2), 1),
    "1x7": (2, 3, 12, 64, 40, 1, 7, (0, 3), (1, 2), 1),
    "stride-3": (2, 4, 30, 48, 64, 5, 5, (2, 2), (3, 3), 1),
    "one-run": (4, 3, 16, 4, 64, 3, 3, (1, 1), (2, 2), 1),
    "one-image": (1, 3, 9, 64, 64, 7, 7, (3, 3), (2, 2), 1),
    "long-runs": (90, 3, 8, 64, 64, 7, 7, (3, 3), (2, 2), 1),
    "long-runs-112": (12, 3, 112, 112, 64, 7, 7, (3, 3), (2, 2), 1),
    "C2-one-pixel-runs": (2, 2, 20, 40, 24, 7, 7, (0, 0), (2, 2), 1),
    "C1-four-pixel-runs": (2, 1, 20, 400, 32, 3, 3, (0, 0), (2, 2), 1),
    "C2-four-pixel-runs": (2, 2, 20, 160, 64, 3, 3, (1, 1), (1, 1), 1),
}


@pytest.mark.parametrize(
    "in_layout, out_layout", [("NHWC", "NHWC"), ("NHWC", "NCHW"), ("NCHW", "NCHW"), ("NCHW", "NHWC")]
)
@pytest.mark.parametrize("precision, chain", [("fp16", "CBNA"), ("bf16", "CNAAB"), ("fp16", "CA")])
@pytest.mark.parametrize("case", list(GLUON_STEM_CASES))
def test_gluon_stem_cases(case, precision, chain, in_layout, out_layout):
    """gluon-stem forced on each case, channels-last or channel-plane input (a stretch per channel
    plane), against the float64 reference, the output NaN-filled in either layout; then with random
    alpha and beta over a prior output."""
    n, c, h, w, k, r, s, pads, strides, dil = GLUON_STEM_CASES[case]
    conv = fp.ConvolutionDescriptor(pads, strides, (dil, dil))
    check_forced_solver("gluon-stem", case, (n, c, h, w), conv, k, r, s, precision, chain, out_layout, in_layout)


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
#: channels by boxes and the odd ones by copies (tuning.GLUON_GEMM_PLANE_PAIRS).
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
        (case, precision, chain, False)
        for case in GLUON_GEMM_CASES
        for precision, chain in (("fp16", "CBNA"), ("fp16", "CNAAB"), ("bf16", "CBNA"), ("tf32", "CNAAB"))
    ]
    + [
        (case, precision, chain, True)
        for case in ("odd-rows", "7x7", "strided-28x28")
        for precision, chain in (("fp16", "CNAAB"), ("tf32", "CBNA"))
    ]
    + [
        (case, precision, chain, mma_epilogue)
        for case in GLUON_GEMM_PLANE_CASES
        for precision, chain, mma_epilogue in (("fp16", "CBNA", True), ("bf16", "CNAAB", True), ("fp16", "CBA", False))
    ]
    + [  # fp32 output stored from the accumulator's layout (tuning.GLUON_GEMM_FP32_ACC_STORES)
        (case, "tf32", chain, "fp32-acc-stores")
        for case in ("odd-rows", "7x7", "strided-28x28", "C40-K24")
        for chain in ("CBNA", "CNAAB")
    ]
)


@pytest.mark.slow
@pytest.mark.parametrize("case, precision, chain, mma_epilogue", GLUON_GEMM_RUNS)
def test_gluon_gemm_tiles(case, precision, chain, mma_epilogue, monkeypatch):
    """gluon-gemm over every kind of tile: pixels of one, two and three parts (16, 48, 96, 112,
    208, 256; strided, those of parts that hold whole output rows), 64, 128 and 256 output
    channels, one computing warpgroup or two taking tiles in turn; each with and without a prior
    output, and with programs walking several tiles (grids of 3 and 2 persistent programs: uneven
    shares of the tiles); 16-bit tiles of 128 pixels and more stored by TMA (persistent ones from a
    buffer per warpgroup), and by pointer to an NCHW output. Plane cases: NCHW input read as channel
    planes, stored along the planes (NCHW output) or the channels; planes that start inside 16-byte
    units by asynchronous copies."""
    from fusionplan import tuning
    from fusionplan.solvers import gluon_gemm

    monkeypatch.setattr(tuning, "GLUON_GEMM_MMA_EPILOGUE", bool(mma_epilogue))  # the chain in the accumulator's layout
    monkeypatch.setattr(tuning, "GLUON_GEMM_FP32_ACC_STORES", mma_epilogue == "fp32-acc-stores")
    monkeypatch.setattr(tuning, "GLUON_GEMM_PLANE_COPIES", 2 if "copies-all" in case else 1)
    monkeypatch.setattr(tuning, "GLUON_GEMM_PLANE_PAIRS", "pairs" in case)
    monkeypatch.setattr(tuning, "GLUON_GEMM_PAIRS_MAX_WIDENING", 4)  # the pair cases' wider outputs too
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
                # 16-bit tiles of 128 pixels and more go out by TMA (tuning.GLUON_GEMM_TMA_STORE), by
                # pointer to an NCHW output given at launch
                check_random_records(plan, handle, x, precision, rng, False, "NCHW", (kernel.config, "NCHW"))


@pytest.mark.parametrize(
    "layer_name, solver, fit_all, fits",
    [
        ("r50_15", "gluon-gemm", False, True),
        ("r50_11", "gluon-gemm", False, False),
        ("r50_11", "gluon-gemm", True, True),
        ("r50_16", "gluon-nchw", True, True),
        ("r50_17", "triton-gemm-nchw", True, True),
    ],
)
def test_kernels_prefer_the_carveout_they_fit(layer_name, solver, fit_all, fits, monkeypatch):
    """Compiled and loaded (ahead of the first execute), a kernel prefers the smallest shared-memory
    carve-out that holds the programs a multiprocessor holds (the driver's attribute read back):
    every convolution kernel under tuning.FIT_CARVEOUT, and without it gluon-gemm's kernels of
    8-byte copied planes, while 16-byte copies keep Triton's (no preference set: -1). The output
    checked too."""
    import ctypes

    from fusionplan.launch import carveout_percent, programs_per_multiprocessor
    from fusionplan.shapes import resnet50_layer
    from fusionplan.testing import layer_plan

    monkeypatch.setattr(fp.tuning, "FIT_CARVEOUT", fit_all)
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
        assert preferred.value == (expected if fits else -1)


#: (n, c, h, w, k, r, s, pad, stride, dilation): NCHW planes of 49, 196 and odd sizes, 1x1 and
#: 3x3 (strided, dilated, "valid" 5x5, a 1x5 row), C not a multiple of the reduction step (40,
#: 136), K below a warpgroup's 64 rows and not a multiple of 128, tiles across images.
GLUON_NCHW_CASES = {
    "7x7-1x1": (9, 512, 7, 7, 136, 1, 1, 0, 1, 1),
    "7x7-3x3": (5, 128, 7, 7, 72, 3, 3, 1, 1, 1),
    "14x14-3x3": (3, 256, 14, 14, 192, 3, 3, 1, 1, 1),
    "strided-3x3": (3, 64, 13, 11, 24, 3, 3, 1, 2, 1),
    "strided-1x1": (2, 128, 28, 28, 136, 1, 1, 0, 2, 1),
    "C40-dilated": (2, 40, 12, 10, 17, 3, 3, 2, 1, 2),
    "C136-5x5-valid": (3, 136, 11, 9, 64, 5, 5, 0, 1, 1),
    "1x5-row": (2, 64, 10, 13, 40, (1, 5), 0, (0, 2), (1, 2), 1),
}


def gluon_nchw_case(case: str, dtype):
    """A GLUON_NCHW_CASES case: its NCHW input and a CBNA-ELU plan of it."""
    n, c, h, w, k, r, s, pad, stride, dil = GLUON_NCHW_CASES[case]
    if isinstance(r, tuple):  # a filter row: (R, S), pads and strides per dimension
        (r, s), pads, strides = r, pad, stride
    else:
        pads, strides = (pad, pad), (stride, stride)
    x = input_tensor((n, c, h, w), dtype, "NCHW")
    conv = fp.ConvolutionDescriptor(pads, strides, (dil, dil))
    plan = add_chain(plan_for(x), "CBNA", conv=conv, k=k, r=r, s=s, activation=ActivationMode.ELU, param_dtype="float")
    return plan, x


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["fp16", "bf16", "tf32"])
@pytest.mark.parametrize("case", list(GLUON_NCHW_CASES))
def test_gluon_nchw_tiles(case, precision, monkeypatch):
    """gluon-nchw on NCHW input over each of its tiles (64 x 256, 128 and 64 pixels by 128 and 64
    output channels, steps of 64 or 128 bytes a pixel, random ring depths, reductions whole or split
    in 2 or 3 parts, one to three gathering partitions of 4 or 8 warps, loads 1 to 3 steps ahead,
    either reduction order, the product either way round, the weights requested before or after the
    gathers' stores), output in planes and channels-last, with and without a prior (three launches
    of a split tile: its arrival counters reset by each)."""
    from fusionplan import tuning
    from fusionplan.solvers import gather_toolkit

    dtype, tf32 = PRECISIONS[precision][:2]
    plan, x = gluon_nchw_case(case, dtype)
    handle = fp.Handle("cuda", allow_tf32=tf32)
    assert plan.compile(handle, solver="gluon-nchw") == "gluon-nchw"
    kernel = plan._entry(handle).kernel
    rng = random.Random(case + precision)
    for pixels, block_n in gather_toolkit.GATHER_TILES:
        row = rng.choice((64, 128))  # a pixel's bytes in a reduction step (64: strided plans' steps)
        # rings of 6 stages let three partitions run (shared_ring: two stages or more each); 64 x 256
        # tiles of 128-byte steps hold four in tuning.GLUON_NCHW_RING_BYTES
        fitting = [s for s in (2, 3, 4, 6) if s * (pixels + block_n) * row <= tuning.GLUON_NCHW_RING_BYTES]
        cfg = tuning.ConvConfig(pixels, block_n, row // x.element_size(), 8, 4, rng.choice(fitting), 1)
        steps = kernel.programs_and_steps(cfg)[1]  # a split reduction: parts of 1 step or more
        kernel.config = replace(cfg, split_k=rng.choice([k for k in (1, 2, 3) if k <= steps]))
        warps, parts = rng.choice(((4, 1), (4, 2), (4, 3), (8, 1)))  # at most 12 gathering warps
        monkeypatch.setattr(tuning, "GLUON_NCHW_GATHER_WARPS", warps)
        monkeypatch.setattr(tuning, "GLUON_NCHW_GATHERERS", parts)
        monkeypatch.setattr(tuning, "GLUON_NCHW_PREFETCH", rng.choice((1, 2, 3)))
        monkeypatch.setattr(tuning, "GLUON_NCHW_TAPS_INNER", rng.choice((False, True)))
        monkeypatch.setattr(tuning, "GLUON_NCHW_PIXEL_ROWS", rng.choice((False, True)))
        monkeypatch.setattr(tuning, "GLUON_NCHW_EARLY_WEIGHTS", rng.choice((False, True)))
        check_kernel_config(plan, handle, kernel, x, precision, rng)


@pytest.mark.parametrize("precision", ["fp16", "tf32"])
@pytest.mark.parametrize("layer", [s for s in LAYERS if s.c > 3], ids=[s.name for s in LAYERS if s.c > 3])
def test_gluon_nchw_layers(layer, precision):
    """gluon-nchw on every ResNet-50 layer but the stem, NCHW input and output, batch 3 (tiles
    across images, a partial last one)."""
    dtype = PRECISIONS[precision][0]
    x = input_tensor((3, layer.c, layer.h, layer.w), dtype, "NCHW")
    conv = fp.ConvolutionDescriptor((layer.pad, layer.pad), (layer.stride, layer.stride))
    plan = add_chain(plan_for(x), "CBNA", conv=conv, k=layer.k, r=layer.r, s=layer.s, param_dtype="float")
    run_and_check(plan, precision, x, "NCHW", solver="gluon-nchw")


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
@pytest.mark.parametrize("case", list(GLUON_NCHW_CASES))
def test_gluon_nchw_regs_tiles(case, precision, monkeypatch):
    """gluon-nchw-regs on gluon-nchw's cases over each of its tiles, random weight rings (2 to 6
    stages), loads 1 to 3 steps ahead, either reduction order, output in planes and channels-last, with
    and without a prior."""
    from fusionplan import tuning
    from fusionplan.solvers import gluon_nchw_regs

    plan, x = gluon_nchw_case(case, PRECISIONS[precision][0])
    handle = fp.Handle("cuda")
    assert plan.compile(handle, solver="gluon-nchw-regs") == "gluon-nchw-regs"
    kernel = plan._entry(handle).kernel
    rng = random.Random(case + precision + "regs")
    for pixels, block_n, warps in (gluon_nchw_regs.WIDE_1X1_TILE, *gluon_nchw_regs.REGS_TILES):
        monkeypatch.setattr(tuning, "GLUON_NCHW_REGS_STAGES", rng.choice((2, 3, 4, 6)))
        monkeypatch.setattr(tuning, "GLUON_NCHW_REGS_STRIDED_STAGES", rng.choice((2, 3, 4, 6, 8)))
        monkeypatch.setattr(tuning, "GLUON_NCHW_REGS_AHEAD", rng.choice((1, 2, 3)))
        monkeypatch.setattr(tuning, "GLUON_NCHW_REGS_UNROLLED", rng.choice((0, 1)))
        monkeypatch.setattr(tuning, "GLUON_NCHW_TAPS_INNER", rng.choice((False, True)))
        row = rng.choice((64, 128))  # a pixel's bytes in a reduction step (64: strided filters' steps)
        kernel.config = gluon_nchw_regs.regs_tile(pixels, block_n, warps, x.element_size(), row)
        check_kernel_config(plan, handle, kernel, x, precision, rng)


@pytest.mark.parametrize("layer", [s for s in LAYERS if s.c > 3], ids=[s.name for s in LAYERS if s.c > 3])
def test_gluon_nchw_regs_layers(layer):
    """gluon-nchw-regs on every ResNet-50 layer but the stem, fp16 NCHW input and output, batch 3."""
    x = input_tensor((3, layer.c, layer.h, layer.w), torch.float16, "NCHW")
    conv = fp.ConvolutionDescriptor((layer.pad, layer.pad), (layer.stride, layer.stride))
    plan = add_chain(plan_for(x), "CBNA", conv=conv, k=layer.k, r=layer.r, s=layer.s, param_dtype="float")
    run_and_check(plan, "fp16", x, "NCHW", solver="gluon-nchw-regs")


#: (n, c, h, w, k): gluon-row-pairs' strided 1x1 plans: ResNet-50's three (planes of whole 16-byte
#: units, 56x56 and 28x28; 14x14, 8-byte loads), rows of 15 slots in 16 (8-byte loads), C not a
#: multiple of the reduction step, K of 17 and 136 (tiles past the output's channels), tiles across
#: images and past the batch's last row.
GLUON_ROW_PAIRS_CASES = {
    "r50_08-like": (2, 64, 56, 56, 136),
    "r50_14-like": (3, 96, 28, 28, 72),
    "r50_20-like": (3, 128, 14, 14, 256),
    "30x30-C40": (2, 40, 30, 30, 17),
    "12x20-C48": (3, 48, 12, 20, 64),
}


def compiled_1x1(dims, precision, stride, solver):
    """(plan, handle, kernel, x): a CBNA plan (ELU) of a 1x1 filter at ``stride`` without padding
    on fresh NCHW input of ``dims`` (n, c, h, w, k output channels), compiled with ``solver``."""
    n, c, h, w, k = dims
    x = input_tensor((n, c, h, w), PRECISIONS[precision][0], "NCHW")
    conv = fp.ConvolutionDescriptor((0, 0), (stride, stride))
    plan = add_chain(plan_for(x), "CBNA", conv=conv, k=k, r=1, s=1, activation=ActivationMode.ELU, param_dtype="float")
    handle = fp.Handle("cuda")
    assert plan.compile(handle, solver=solver) == solver
    return plan, handle, plan._entry(handle).kernel, x


def set_random_switches(monkeypatch, rng, switches: dict) -> None:
    """Each tuning constant of ``switches`` set to one of its values, by ``rng``."""
    from fusionplan import tuning

    for name, values in switches.items():
        monkeypatch.setattr(tuning, name, rng.choice(values))


def check_tile_with_switches(plan, handle, kernel, x, precision, rng, monkeypatch, switches, cfg, tile) -> None:
    """The staged kernels' tile ``cfg`` checked with ``switches`` drawn by ``rng`` and a ring of 2, 3 or
    5 stages, of those that fit (``tile(cfg, stages)``: the tile with that ring; 0: the most that fit)."""
    set_random_switches(monkeypatch, rng, switches)
    most = tile(cfg, 0).num_stages
    kernel.config = tile(cfg, rng.choice([s for s in (2, 3, 5) if s <= most]))
    check_kernel_config(plan, handle, kernel, x, precision, rng)


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
@pytest.mark.parametrize("case", list(GLUON_ROW_PAIRS_CASES))
def test_gluon_row_pairs_tiles(case, precision, monkeypatch):
    """gluon-row-pairs over each of its tiles (128 slots by 256, 128 and 64 output channels), random
    ring depths, loads 1 to 3 steps ahead into registers or staged in shared memory, either side's
    proxy fence, weights resident or a box a stage (requested by either partition), the output
    stored by the computing warps or a storing partition of 2 or 4 warps, the chain's parameters
    loaded once or each tile, output in planes and channels-last, with and without a prior;
    persistent programs over several tiles each."""
    from fusionplan.solvers import gluon_row_pairs

    c = GLUON_ROW_PAIRS_CASES[case][1]
    plan, handle, kernel, x = compiled_1x1(GLUON_ROW_PAIRS_CASES[case], precision, 2, "gluon-row-pairs")
    rng = random.Random(case + precision + "pairs")

    def tile(cfg, stages):
        return gluon_row_pairs.pairs_tile(cfg.block_m, cfg.block_n, cfg.num_warps, c, stages)

    for cfg in kernel.candidates:
        switches = {
            "GLUON_ROW_PAIRS_PREFETCH": (1, 2, 3),
            "GLUON_ROW_PAIRS_STAGED": (0, 1),
            "GLUON_ROW_PAIRS_WEIGHTS_BY_MMA": (0, 1),
            "GLUON_ROW_PAIRS_CONSUMER_FENCE": (0, 1),
            # the channel block's weights resident (C <= 256 at 256 channels) or a box a stage
            "GLUON_ROW_PAIRS_RESIDENT_BYTES": (0, 128 * 1024),
            # the output stored by the computing warps or by a storing partition of 2 or 4 warps
            "GLUON_ROW_PAIRS_STORE_WARPS": (0, 2, 4),
            "GLUON_ROW_PAIRS_HOIST_CHANNELS": (0, 1),
        }
        check_tile_with_switches(plan, handle, kernel, x, precision, rng, monkeypatch, switches, cfg, tile)


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_gluon_row_pairs_unaligned_input(precision):
    """Input starting 2 bytes past a 16-byte boundary: loads into registers (no copy of fewer than 4
    bytes exists), the same results."""
    n, c, h, w, k = GLUON_ROW_PAIRS_CASES["r50_14-like"]
    dtype = PRECISIONS[precision][0]
    x = torch.randn(n * c * h * w + 1, device="cuda").to(dtype)[1:].view(n, c, h, w)
    assert x.data_ptr() % 16 == 2
    conv = fp.ConvolutionDescriptor((0, 0), (2, 2))
    plan = add_chain(plan_for(x), "CBNA", conv=conv, k=k, r=1, s=1, param_dtype="float")
    run_and_check(plan, precision, x, "NCHW", solver="gluon-row-pairs")


@pytest.mark.parametrize("layer", [s for s in LAYERS if s.r == 1 and s.stride == 2], ids=lambda s: s.name)
def test_gluon_row_pairs_layers(layer):
    """gluon-row-pairs on ResNet-50's strided 1x1 layers, bf16 NCHW input and output, batch 3."""
    x = input_tensor((3, layer.c, layer.h, layer.w), torch.bfloat16, "NCHW")
    conv = fp.ConvolutionDescriptor((0, 0), (2, 2))
    plan = add_chain(plan_for(x), "CBNA", conv=conv, k=layer.k, r=1, s=1, param_dtype="float")
    run_and_check(plan, "bf16", x, "NCHW", solver="gluon-row-pairs")


#: (n, c, h, w, k, stride): gluon-halo's plans: ResNet-50's 3x3 layers on 7x7, 14x14 and 28x28 planes
#: (stride 1 and 2) at small batches, odd planes (13x11; 13x13 and 15x9 at stride 2), one channel
#: block (C=64), K past the tile (72, 136, 200) and below it (17), bands of 128-slot tiles.
GLUON_HALO_CASES = {
    "7x7": (3, 128, 7, 7, 136, 1),
    "14x14": (2, 192, 14, 14, 72, 1),
    "13x11": (2, 64, 13, 11, 17, 1),
    "28x28": (2, 64, 28, 28, 128, 1),
    "14x14-s2": (3, 128, 14, 14, 128, 2),
    "13x13-s2": (2, 64, 13, 13, 200, 2),
    "15x9-s2": (2, 64, 15, 9, 64, 2),
    "28x28-s2": (2, 64, 28, 28, 64, 2),
}


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
@pytest.mark.parametrize("case", list(GLUON_HALO_CASES))
def test_gluon_halo_tiles(case, precision, monkeypatch):
    """gluon-halo (each channel block's halo gathered once, the nine taps as views of it shifted by
    whole rows; stride 2 as four phases) over 64- and 128-slot tiles where they fit, 64, 128 and 256
    output channels, weights rings of 2 to 6 stages, two or three halo buffers (of 256- or 128-row
    pieces, loaded one or two at a time), output in planes and channels-last, with and without a
    prior."""
    from fusionplan.solvers import gluon_halo

    n, c, h, w, k, stride = GLUON_HALO_CASES[case]
    x = input_tensor((n, c, h, w), PRECISIONS[precision][0], "NCHW")
    conv = fp.ConvolutionDescriptor((1, 1), (stride, stride))
    plan = add_chain(plan_for(x), "CBNA", conv=conv, k=k, r=3, s=3, activation=ActivationMode.ELU, param_dtype="float")
    handle = fp.Handle("cuda")
    assert plan.compile(handle, solver="gluon-halo") == "gluon-halo"
    kernel = plan._entry(handle).kernel
    rng = random.Random(case + precision + "halo")
    oh, ow = plan.output_desc.dims[2:]
    for pixels in (64, 128):
        for block_n in (64, 128, 256):
            stages = rng.choice((2, 3, 4, 6))
            monkeypatch.setattr(fp.tuning, "GLUON_HALO_BUFFERS", rng.choice((2, 3)))
            geo = gluon_halo.halo_geometry(oh, ow, stride, pixels, block_n, stages)
            if geo.tile_h == 0 or gluon_halo.shared_bytes(geo, stages) > gluon_halo.SHARED_BYTES:
                continue
            kernel.config = fp.tuning.ConvConfig(pixels, block_n, 64, 8, geo.computing_warps, stages, 1)
            check_kernel_config(plan, handle, kernel, x, precision, rng)


@pytest.mark.parametrize("layer", ["r50_22", "r50_18", "r50_16", "r50_10"])
def test_gluon_halo_layers(layer):
    """gluon-halo on the ResNet-50 3x3 layers it takes by default (7x7, 14x14 and 28x28 output planes
    at stride 1, 7x7 at stride 2), fp16 NCHW input and output, batch 3."""
    from fusionplan.shapes import resnet50_layer
    from fusionplan.testing import layer_plan

    s = resnet50_layer(layer)
    x = input_tensor((3, s.c, s.h, s.w), torch.float16, "NCHW")
    plan = layer_plan(s, x, "CBNA")
    handle = fp.Handle("cuda")
    assert plan.compile(handle) == "gluon-halo"
    run_and_check(plan, "fp16", x, "NCHW")


#: (n, c, h, w, k): gluon-plane-chunks' plans: ResNet-50's two 7x7 layers (64 slots an image, two
#: images a tile) with K of 136 (tiles past the output's channels) and an odd batch (a tile past
#: the batch's last image), planes of 25 (4 images a tile), 64 (no slot empty) and 15 pixels (8
#: images a tile, 3x5: rows of the plane not square).
GLUON_PLANE_CHUNKS_CASES = {
    "r50_21-like": (3, 256, 7, 7, 136),
    "r50_19-like": (4, 64, 7, 7, 512),
    "5x5-C32": (5, 32, 5, 5, 17),
    "8x8-C96": (3, 96, 8, 8, 64),
    "3x5-C64": (9, 64, 3, 5, 40),
}


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
@pytest.mark.parametrize("case", list(GLUON_PLANE_CHUNKS_CASES))
def test_gluon_plane_chunks_tiles(case, precision, monkeypatch):
    """gluon-plane-chunks over each of its tiles (128 slots by 256, 128 and 64 output channels, and
    one 64-slot image by 128 and 64; steps of 64 channels where C is a multiple of 64, else 32),
    random ring depths, copies 1 to 3 steps ahead or loads into registers, the operand by shifts or
    by the gather, 4 or 8 gathering warps, either side's proxy fence, output in planes and
    channels-last, with and without a prior; persistent programs over several tiles each."""
    from fusionplan.solvers import gluon_plane_chunks

    monkeypatch.setattr(fp.tuning, "GLUON_PLANE_CHUNKS_IMAGE_TILES", 1)  # the 64-slot tiles among the candidates
    c = GLUON_PLANE_CHUNKS_CASES[case][1]
    plan, handle, kernel, x = compiled_1x1(GLUON_PLANE_CHUNKS_CASES[case], precision, 1, "gluon-plane-chunks")
    rng = random.Random(case + precision + "chunks")

    def tile(cfg, stages):
        return gluon_plane_chunks.chunks_tile(cfg.block_n, c, stages, cfg.block_m)

    for cfg in kernel.candidates:
        switches = {
            "GLUON_ROW_PAIRS_PREFETCH": (1, 2, 3),
            "GLUON_PLANE_CHUNKS_STAGED": (0, 1),
            "GLUON_PLANE_CHUNKS_SHIFTED": (0, 1),
            "GLUON_PLANE_CHUNKS_GATHER_WARPS": (4, 8),
            "GLUON_ROW_PAIRS_CONSUMER_FENCE": (0, 1),
        }
        check_tile_with_switches(plan, handle, kernel, x, precision, rng, monkeypatch, switches, cfg, tile)


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_gluon_plane_chunks_unaligned_input(precision):
    """Input starting 2 bytes past a 16-byte boundary: loads into registers, the same results."""
    n, c, h, w, k = GLUON_PLANE_CHUNKS_CASES["r50_21-like"]
    dtype = PRECISIONS[precision][0]
    x = torch.randn(n * c * h * w + 1, device="cuda").to(dtype)[1:].view(n, c, h, w)
    assert x.data_ptr() % 16 == 2
    plan = add_chain(plan_for(x), "CBNA", k=k, r=1, s=1, param_dtype="float")
    run_and_check(plan, precision, x, "NCHW", solver="gluon-plane-chunks")


@pytest.mark.parametrize("layer", [s for s in LAYERS if s.r == 1 and s.stride == 1 and s.h == 7], ids=lambda s: s.name)
def test_gluon_plane_chunks_layers(layer):
    """gluon-plane-chunks on ResNet-50's 1x1 layers on 7x7 planes, fp16 NCHW input and output, batch 3."""
    x = input_tensor((3, layer.c, layer.h, layer.w), torch.float16, "NCHW")
    plan = add_chain(plan_for(x), "CBNA", k=layer.k, r=1, s=1, param_dtype="float")
    run_and_check(plan, "fp16", x, "NCHW", solver="gluon-plane-chunks")


@pytest.mark.parametrize("layout", ["NHWC", "NCHW"])
def test_conv_bias_activation_repeats_with_its_records(layout):
    """The one-call convolution on the GPU, called again with the same tensors (its records reused:
    the kernel's derived data and bound launch found again), then after an in-place change of the
    weight and of the bias (seen through their version counters), each result the reference's."""
    x = input_tensor((2, 64, 14, 14), torch.float16, layout)
    w = (torch.randn(64, 64, 3, 3, device="cuda") / 24).half()
    b = torch.randn(64, device="cuda").half()
    if layout == "NHWC":
        w = w.to(memory_format=torch.channels_last)

    def check(y) -> None:
        ref = torch.relu(torch.nn.functional.conv2d(x.double(), w.double(), b.double(), padding=1))
        assert torch.isfinite(y).all() and ((y.double() - ref).norm() / ref.norm()).item() < 1e-2

    for _ in range(3):
        check(fp.conv_bias_activation(x, w, b, padding=1))
    w.mul_(-0.5)
    check(fp.conv_bias_activation(x, w, b, padding=1))
    b.add_(1.0)
    check(fp.conv_bias_activation(x, w, b, padding=1))


@pytest.mark.parametrize("seed", range(24))
def test_random_plans(seed):
    torch.manual_seed(seed)
    rng = random.Random(7000 + seed)
    precision = rng.choice(list(PRECISIONS))
    drawn = random_conv_plan(
        rng,
        [PRECISIONS[precision][0]],
        "cuda",
        batch=(1, 4),
        channels=(1, 3, 4, 8, 16, 17),
        hw=(5, 40),
        filters=(1, 3, 5, 7),
        strides=(1, 3),
        max_pad=3,
        post_ops=5,
    )
    if drawn is None:
        return
    plan, x, out_layout = drawn
    run_and_check(plan, precision, x, out_layout)


@pytest.mark.slow
@pytest.mark.parametrize("chain", ["CBNA", "NA"])
def test_repeated_executes_take_the_direct_launch_path(chain):
    """After the first launch, kernels are called directly; the specialization key must follow
    every change that matters: new inputs, another output layout, a misaligned output view."""
    x0 = input_tensor((4, 32, 14, 14), torch.float16, "NHWC")
    plan = add_chain(
        fp.FusionPlan(fp.TensorDescriptor.from_tensor(x0)),
        chain,
        conv=fp.ConvolutionDescriptor((1, 1), (1, 1), (1, 1), 1),
        k=48,
        r=3,
        s=3,
        bn_mode=BatchNormMode.SPATIAL,
        activation=ActivationMode.RELU,
        param_dtype="half",
    )
    handle = fp.Handle("cuda")
    plan.compile(handle)
    dims = plan.output_desc.dims
    numel = int(torch.Size(dims).numel())
    args = random_args(plan, "cuda", param_dtype=torch.float32)
    for i in range(8):
        x = input_tensor((4, 32, 14, 14), torch.float16, "NHWC")
        if i % 3 == 2:  # new arguments now and then
            args = random_args(plan, "cuda", param_dtype=torch.float32)
        if i % 4 == 3:  # a view starting 2 bytes into its storage: not 16-byte aligned
            y = torch.full((numel + 1,), float("nan"), device="cuda", dtype=torch.float16)[1:].view(dims)
        elif i % 2:
            y = torch.full(dims, float("nan"), device="cuda", dtype=torch.float16)
        else:
            y = torch.full(dims, float("nan"), device="cuda", dtype=torch.float16).to(memory_format=torch.channels_last)
        plan.execute(handle, x, y, args)
        result = compare(y, reference_output(plan, x, args), EPS[torch.float16])
        assert result.nonfinite == 0 and result.rel_norm < 1e-2, (i, str(result))


@pytest.mark.parametrize("solver", ["gluon-window", "gluon-gemm"])
def test_gluon_repeats_rebind_the_input_descriptor(monkeypatch, solver):
    """The Gluon kernels pass their input as host tensor descriptors (gluon-gemm: three): repeated
    executes on new inputs and outputs launch the bound kernel with descriptors over each new
    input, and compute it."""
    from fusionplan import launch

    repeats = []
    original = launch.BoundLaunch.launch
    monkeypatch.setattr(launch.BoundLaunch, "launch", lambda self, ptrs: repeats.append(ptrs) or original(self, ptrs))
    x0 = input_tensor((8, 128, 14, 14), torch.float16, "NHWC")
    r = 3 if solver == "gluon-window" else 1
    conv = fp.ConvolutionDescriptor((r // 2, r // 2))
    plan = add_chain(plan_for(x0), "CBNA", conv=conv, k=128, r=r, s=r, param_dtype="float")
    handle = fp.Handle("cuda")
    assert plan.compile(handle, solver=solver) == solver
    args = random_args(plan, "cuda", param_dtype=torch.float32)
    inputs = [input_tensor((8, 128, 14, 14), torch.float16, "NHWC") for _ in range(5)]  # 5 addresses
    for i, x in enumerate(inputs):
        y = torch.full(plan.output_desc.dims, float("nan"), device="cuda", dtype=torch.float16)
        y = y.to(memory_format=torch.channels_last)
        plan.execute(handle, x, y, args)
        result = compare(y, reference_output(plan, x, args), EPS[torch.float16])
        assert result.nonfinite == 0 and result.rel_norm < 1e-2, (i, str(result))
    assert len(repeats) == 4 and len({p[0] for p in repeats}) == 4  # every execute after the first


def test_launch_records_keep_kernels_of_one_source_apart(monkeypatch, tmp_path):
    """gluon-gemm's source is one per chain and dtype; a stride-1 plan and a strided one of the
    same tile differ in constexpr arguments (ROW_SLOTS) and descriptor blocks. Each compile in a
    new process finds the other's launch record on disk: it must load its own kernel (a key
    without those values once loaded the stride-1 kernel for the strided plan: "Rank mismatch")."""
    from fusionplan import tuning
    from fusionplan.solvers import gluon_gemm

    monkeypatch.setenv("FUSIONPLAN_CACHE_DIR", str(tmp_path))  # records of this test only
    tile = tuning.ConvConfig(256, 128, 64, 8, 8, 3, 1)
    monkeypatch.setattr(gluon_gemm, "gluon_gemm_config", lambda *a, **k: tile)
    for stride, hw in ((1, 28), (2, 56), (1, 28), (2, 56)):  # each after the other's record
        x = input_tensor((4, 128, hw, hw), torch.float16, "NHWC")
        conv = fp.ConvolutionDescriptor((0, 0), (stride, stride))
        plan = add_chain(plan_for(x), "CBNA", conv=conv, k=128, r=1, s=1, param_dtype="float")
        run_and_check(plan, "fp16", x, "NHWC", solver="gluon-gemm")  # a fresh plan, kernel and launcher


@pytest.mark.parametrize("chain", ["CBNA", "NA"])
def test_repeats_follow_what_changes(chain):
    """Repeated calls launch a bound kernel directly; each call below changes one thing that must
    send it back through the full path: alternating argument sets, two plans sharing one kernel,
    a parameter changed in place, a misaligned input, the output aliasing the input, a handle
    with its own stream."""
    shape = (4, 32, 14, 14)

    def new_plan():
        x = input_tensor(shape, torch.float16, "NHWC")
        conv = fp.ConvolutionDescriptor((1, 1), (1, 1), (1, 1), 1)
        return add_chain(plan_for(x), chain, conv=conv, k=32, r=3, s=3, param_dtype="float")

    plans = [new_plan(), new_plan()]
    handle = fp.Handle("cuda")
    for plan in plans:
        plan.compile(handle)
    assert plans[0]._entry(handle).kernel is plans[1]._entry(handle).kernel
    arg_sets = [[random_args(p, "cuda", param_dtype=torch.float32) for _ in range(2)] for p in plans]
    stream_handle = fp.Handle("cuda", stream=torch.cuda.Stream())
    plans[0].compile(stream_handle)
    scale = next(r.scale for r in (arg_sets[0][0].get(op) for op in plans[0].ops) if hasattr(r, "scale"))
    n, c, hh, ww = shape
    for i in range(24):
        which, h = i % 2, handle
        x = input_tensor(shape, torch.float16, "NHWC")
        y = torch.full(shape, float("nan"), device="cuda", dtype=torch.float16).to(memory_format=torch.channels_last)
        if i == 8:
            scale.mul_(-1.5)  # in place: the folded coefficients must follow
        elif i == 12:  # an input view 2 bytes into its storage
            x = torch.randn(x.numel() + 1, device="cuda").half()[1:].view(n, hh, ww, c).permute(0, 3, 1, 2)
        elif i in (14, 16):
            y = x  # in place (the convolution goes through a temporary)
        elif i == 18:
            h = stream_handle
        plan, args = plans[which], arg_sets[which][(i // 2) % 2]
        if h is stream_handle:
            plan, args = plans[0], arg_sets[0][0]
        ref = reference_output(plan, x, args)
        torch.cuda.synchronize()  # the stream handle's stream does not wait for the default one
        plan.execute(h, x, y, args)
        torch.cuda.synchronize()
        result = compare(y, ref, EPS[torch.float16])
        assert result.nonfinite == 0 and result.rel_norm < 1e-2, (i, str(result))


def test_kernels_load_from_their_launch_records(tmp_path, monkeypatch):
    """A new launcher (as in a new process) finds the compiled kernel through its launch record,
    without Triton's compile path, and it computes the same results."""
    from fusionplan.launch import Launcher

    monkeypatch.setenv("FUSIONPLAN_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("TRITON_CACHE_DIR", raising=False)
    x = input_tensor((2, 24, 9, 11), torch.float16, "NHWC")
    plan = add_chain(plan_for(x), "CBNA", conv=fp.ConvolutionDescriptor((1, 1)), k=40, r=3, s=3, param_dtype="float")
    handle = fp.Handle("cuda")
    plan.compile(handle)
    kernel = plan._entry(handle).kernel
    (key,) = kernel.launcher._compiled
    assert list((tmp_path / "launch").glob("*.json"))
    fresh = Launcher(kernel.launcher.fn, kernel.launcher.grid_dependency)  # launched as the plan's kernel is
    cfg = kernel.config
    loaded = fresh._load_recorded(key, fresh._record_path(key, cfg.num_warps, cfg.num_stages))
    assert loaded is not None and loaded is not kernel.launcher._compiled[key]
    kernel.launcher = fresh
    args = random_args(plan, "cuda", param_dtype=torch.float32)
    y = torch.full(plan.output_desc.dims, float("nan"), device="cuda", dtype=torch.float16)
    y = y.to(memory_format=torch.channels_last)
    plan.execute(handle, x, y, args)
    assert list(fresh._compiled.values()) == [loaded]  # the launch used the loaded kernel
    result = compare(y, reference_output(plan, x, args), EPS[torch.float16])
    assert result.nonfinite == 0 and result.rel_norm < 1e-2, str(result)


def test_execute_under_cuda_graph_capture():
    x = input_tensor((8, 64, 28, 28), torch.float16, "NHWC")
    plan = add_chain(
        plan_for(x),
        "CBNA",
        conv=fp.ConvolutionDescriptor((1, 1), (1, 1), (1, 1), 1),
        k=64,
        r=3,
        s=3,
        bn_mode=BatchNormMode.SPATIAL,
        activation=ActivationMode.RELU,
        param_dtype="half",
    )
    handle = fp.Handle("cuda")
    plan.compile(handle)
    args = random_args(plan, "cuda", param_dtype=torch.float32)
    y = torch.empty(plan.output_desc.dims, device="cuda", dtype=torch.float16).to(memory_format=torch.channels_last)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):  # warm up: compile, fold, first launch
            plan.execute(handle, x, y, args)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(100):
            plan.execute(handle, x, y, args)
    x.copy_(torch.randn_like(x))
    y.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    result = compare(y, reference_output(plan, x, args), EPS[torch.float16])
    assert result.nonfinite == 0 and result.rel_norm < 1e-2, str(result)


def test_descriptor_scratch_is_reused_per_stream_and_private_to_graphs():
    """Kernels that build tensor descriptors on the device (windows reading a view per stride
    class: 15x15 images, stride 2) share one scratch buffer per stream (no allocation per launch);
    a captured launch gets its own, as a graph may replay anywhere."""
    from fusionplan import launch

    x = input_tensor((4, 128, 15, 15), torch.float16, "NHWC")
    conv = fp.ConvolutionDescriptor((1, 1), (2, 2))
    plan = add_chain(plan_for(x), "CBNA", conv=conv, k=128, r=3, s=3, param_dtype="half")
    handle = fp.Handle("cuda")
    assert plan.compile(handle, solver="triton-window") == "triton-window"
    args = random_args(plan, "cuda", param_dtype=torch.float32)
    y = torch.empty(plan.output_desc.dims, device="cuda", dtype=torch.float16).to(memory_format=torch.channels_last)

    def run_and_compare() -> None:
        x.normal_()
        y.fill_(float("nan"))
        plan.execute(handle, x, y, args)
        torch.cuda.synchronize()
        result = compare(y, reference_output(plan, x, args), EPS[torch.float16])
        assert result.nonfinite == 0 and result.rel_norm < 1e-2, str(result)

    launch._SCRATCH.clear()
    for _ in range(3):
        run_and_compare()
    assert len(launch._SCRATCH) == 1
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        run_and_compare()
        assert len(launch._SCRATCH) == 2  # a buffer of the side stream's own
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            plan.execute(handle, x, y, args)
        assert len(launch._SCRATCH) == 2
    torch.cuda.current_stream().wait_stream(side)
    run_and_compare()  # an eager launch between captures and replays
    x.normal_()
    y.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    result = compare(y, reference_output(plan, x, args), EPS[torch.float16])
    assert result.nonfinite == 0 and result.rel_norm < 1e-2, str(result)


@pytest.mark.slow
@pytest.mark.parametrize("solver", ["triton-conv", "triton-window"])
def test_split_reductions_across_streams_and_graphs(solver):
    """A 14x14 layer at batch 1 leaves most multiprocessors idle: its reduction is split. Repeated
    launches, a second stream and a captured graph each use a workspace of their own."""
    x = input_tensor((1, 256, 14, 14), torch.float16, "NHWC")
    plan = add_chain(plan_for(x), "CBNA", conv=fp.ConvolutionDescriptor((1, 1)), k=256, r=3, s=3, param_dtype="half")
    handle = fp.Handle("cuda")
    assert plan.compile(handle, solver=solver) == solver
    assert plan._entry(handle).kernel.config.split_k > 1
    args = random_args(plan, "cuda", param_dtype=torch.float32)
    y = torch.empty(plan.output_desc.dims, device="cuda", dtype=torch.float16).to(memory_format=torch.channels_last)

    def check() -> None:
        torch.cuda.synchronize()
        result = compare(y, reference_output(plan, x, args), EPS[torch.float16])
        assert result.nonfinite == 0 and result.rel_norm < 1e-2, str(result)

    def run_and_check() -> None:
        x.normal_()
        y.fill_(float("nan"))
        plan.execute(handle, x, y, args)
        check()

    for _ in range(3):  # the first launch, then the repeat path
        run_and_check()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        run_and_check()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            plan.execute(handle, x, y, args)
        run_and_check()  # on the capture's stream again: not with the graph's workspace
    torch.cuda.current_stream().wait_stream(side)
    run_and_check()
    for _ in range(2):
        x.normal_()
        y.fill_(float("nan"))
        graph.replay()
        check()


def _check_rows(plan, x, y, args, rows):
    """Compare output rows ``rows`` (an H slice) with the reference computed on the matching input rows."""
    ref = reference_output(plan, x[:, :, rows], args)
    result = compare(y[:, :, rows], ref, EPS[y.dtype])
    assert result.nonfinite == 0 and result.rel_norm < 1e-2, str(result)


@pytest.mark.parametrize("chain, tap_bits", [("NA", False), ("C", False), ("C", True)])
def test_tensors_past_2_to_the_31_elements(chain, tap_bits, monkeypatch):
    """64-bit offsets: 2.3e9-element fp16 tensors (4.6 GB each); first and last rows verified; the
    convolution also on triton-conv with tuning.CONV_TAP_BITS (its per-pixel pointers past 2^31)."""
    from fusionplan import tuning

    monkeypatch.setattr(tuning, "CONV_TAP_BITS", tap_bits)
    if torch.cuda.get_device_properties(0).total_memory < 24 * 2**30:
        pytest.skip("needs 24 GiB of GPU memory")
    x = torch.empty((1, 4, 24000, 24000), device="cuda", dtype=torch.float16).normal_()
    plan = fp.FusionPlan(fp.TensorDescriptor.from_tensor(x))
    if chain == "C":
        plan.add_conv_forward(fp.ConvolutionDescriptor((0, 0)), fp.TensorDescriptor.packed("half", (4, 4, 1, 1)))
    else:
        plan.add_batchnorm_inference(BatchNormMode.SPATIAL, fp.TensorDescriptor.packed("float", (1, 4, 1, 1)))
        plan.add_activation_forward(ActivationMode.LEAKYRELU)
    handle = fp.Handle("cuda")
    plan.compile(handle, solver="triton-conv" if tap_bits else None)
    args = random_args(plan, "cuda", param_dtype=torch.float32)
    y = torch.full(plan.output_desc.dims, float("nan"), device="cuda", dtype=torch.float16)
    plan.execute(handle, x, y, args)
    torch.cuda.synchronize()
    _check_rows(plan, x, y, args, slice(0, 8))
    _check_rows(plan, x, y, args, slice(23992, 24000))
    assert not torch.isnan(y[:, :, ::997]).any()
    del x, y
    torch.cuda.empty_cache()


def test_dlpack_arrays_from_cupy_and_jax():
    """Any DLPack-capable array on the same device: CuPy arrays in and out (the output written in
    place), a JAX array in, for a plan and for a fused torch module."""
    import os

    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    cupy = pytest.importorskip("cupy")
    x_t = input_tensor((2, 16, 9, 7), torch.float16, "NCHW")
    plan = add_chain(plan_for(x_t), "CBNA", conv=fp.ConvolutionDescriptor((1, 1)), k=24, r=3, s=3)
    handle = fp.Handle("cuda")
    plan.compile(handle)
    args = random_args(plan, "cuda", param_dtype=torch.float32)
    x_cp = cupy.from_dlpack(x_t)
    y_cp = cupy.full(plan.output_desc.dims, cupy.nan, dtype=cupy.float16)
    plan.execute(handle, x_cp, y_cp, args)
    torch.cuda.synchronize()
    result = compare(torch.from_dlpack(y_cp), reference_output(plan, x_t, args), EPS[torch.float16])
    assert result.nonfinite == 0 and result.rel_norm < 1e-2, str(result)

    import fusionplan.torch as fpt

    model = torch.nn.Sequential(torch.nn.Conv2d(16, 8, 3, padding=1), torch.nn.ReLU()).eval().cuda().half()
    fused = fpt.fuse(model)
    chain = next(m for m in fused.modules() if isinstance(m, fpt.FusedChain))
    with torch.no_grad():
        ref = model(x_t)
        torch.testing.assert_close(chain(x_cp), ref, rtol=1e-2, atol=1e-2)
        jax = pytest.importorskip("jax")
        x_jax = jax.dlpack.from_dlpack(x_cp)  # a JAX array on the same GPU
        torch.testing.assert_close(chain(x_jax), ref, rtol=1e-2, atol=1e-2)


def test_fused_model_direct_launches_follow_what_changes(monkeypatch):
    """A fused model's repeated eager calls launch the kernel directly (``Repeat.launch_fresh``)
    and still see every change: parameters replaced, changed in place or given new storage, a
    scalar argument, an input of another layout or alignment, another stream."""
    import fusionplan.torch as fpt
    from fusionplan.launch import Repeat

    from .test_torch_fuse import ResidualAdd, randomize_bn

    direct = []
    original = Repeat.launch_fresh
    monkeypatch.setattr(Repeat, "launch_fresh", lambda self, *a: direct.append(1) or original(self, *a))
    model = randomize_bn(ResidualAdd("plus").eval()).cuda().half().to(memory_format=torch.channels_last)
    fused = fpt.fuse(model)

    def check(x):
        out = torch.full_like(x, float("nan"))
        out.copy_(fused(x))
        conv, bn = fused.conv, fused.bn
        h = torch.nn.functional.conv2d(x.double(), conv.weight.double(), padding=1)
        bn_args = (bn.running_mean, bn.running_var, bn.weight, bn.bias)
        h = torch.nn.functional.batch_norm(h, *(t.double() for t in bn_args), False, 0.0, bn.eps)
        expected = torch.relu(x.double() + h)
        result = compare(out, expected, EPS[torch.float16])
        assert result.nonfinite == 0 and result.rel_norm < 1e-2, str(result)

    def fresh():
        return torch.randn(4, 8, 13, 11, device="cuda").half().to(memory_format=torch.channels_last)

    with torch.no_grad():
        for _ in range(3):
            check(fresh())
        assert len(direct) >= 2  # the calls after the first launched directly
        fused.conv.weight.mul_(1.5)  # in place: a new version
        check(fresh())
        fused.bn.running_var = torch.rand_like(fused.bn.running_var) + 0.5  # a new tensor object
        check(fresh())
        fused.bn.weight.data = torch.randn_like(fused.bn.weight)  # new storage, the same parameter
        check(fresh())
        fused.bn.eps = 0.25
        check(fresh())
        check(fresh().contiguous())  # NCHW
        check(torch.randn(4 * 8 * 13 * 11 + 1, device="cuda").half()[1:].view(4, 13, 11, 8).permute(0, 3, 1, 2))
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                check(fresh())
        torch.cuda.current_stream().wait_stream(side)
        calls = len(direct)
        check(fresh())
        assert len(direct) == calls + 1


def test_repeats_do_not_keep_inputs_and_outputs_alive():
    """Repeated calls keep their launches, not the tensors of the call that made them: once the
    caller drops its input and output, their memory is free again."""
    import gc

    import fusionplan.torch as fpt

    model = torch.nn.Sequential(torch.nn.Conv2d(64, 64, 3, padding=1), torch.nn.ReLU()).eval().cuda().half()
    fused = fpt.fuse(model.to(memory_format=torch.channels_last))
    big = (8, 64, 128, 128)  # 16 MiB per activation in fp16

    def run_and_drop():
        with torch.no_grad():
            for _ in range(3):  # the first call makes the repeat, the others take it
                x = torch.randn(big, device="cuda").half().to(memory_format=torch.channels_last)
                y = fused(x)
                del x, y

    torch.cuda.synchronize()
    gc.collect()
    before = torch.cuda.memory_allocated()
    run_and_drop()
    torch.cuda.synchronize()
    gc.collect()
    # what stays is the model's own (folded weights, descriptor scratch: well under a megabyte);
    # the first call's input and output would be 32 MiB
    assert torch.cuda.memory_allocated() - before < 8 * 2**20


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


@pytest.mark.slow
def test_resnet50_fused_at_batch_32_matches_eager():
    """The whole network through fusionplan.torch (residual chains read a prior output: kernels
    compiled at their first call), fp16 channels-last, against eager."""
    import importlib.util
    from pathlib import Path

    import fusionplan.torch as fpt

    path = Path(__file__).resolve().parents[1] / "examples" / "resnet50.py"
    spec = importlib.util.spec_from_file_location("resnet50_example", path)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    torch.manual_seed(0)
    model = example.resnet50().eval()
    example.randomize_batchnorm(model)
    model = model.cuda().half().to(memory_format=torch.channels_last)
    x = torch.randn(32, 3, 224, 224, device="cuda").half().to(memory_format=torch.channels_last)
    with torch.no_grad():
        ref = model(x).double()
        out = fpt.fuse(model)(x).double()
    assert torch.isfinite(out).all()
    assert ((out - ref).norm() / ref.norm()).item() < 1e-2  # examples/resnet50.py: 9.4e-4 on the H100
    assert (out.argmax(1) == ref.argmax(1)).float().mean().item() > 0.9


@pytest.mark.slow
@pytest.mark.parametrize(
    "first, second, layout",
    [
        ("gluon-window", "gluon-gemm", "NHWC"),
        ("triton-conv", "triton-gemm", "NHWC"),
        ("gluon-nchw", "triton-gemm-nchw", "NCHW"),
        ("gluon-nchw-regs", "gluon-nchw", "NCHW"),
        ("gluon-halo", "gluon-halo", "NCHW"),
    ],
)
def test_grid_dependency_keeps_dependent_launches_in_order(first, second, layout, monkeypatch):
    """tuning.GRID_DEPENDENCY: a kernel may begin while the one before it on the stream ends. The
    second plan reads the first's output, which a NaN fill precedes (a read too early would see
    it), launch after launch on one stream and in a replayed graph; each result is the reference's."""
    from fusionplan import tuning

    monkeypatch.setattr(tuning, "GRID_DEPENDENCY", True)
    handle = fp.Handle("cuda")
    x = input_tensor((8, 128, 14, 14), torch.float16, layout)
    conv3 = fp.ConvolutionDescriptor((1, 1))
    plan1 = add_chain(plan_for(x), "CBNA", conv=conv3, k=128, r=3, s=3, param_dtype="float")
    mid = input_tensor(plan1.output_desc.dims, torch.float16, layout)
    r = 3 if second.startswith(("gluon-nchw", "gluon-halo")) else 1
    conv2 = fp.ConvolutionDescriptor((r // 2, r // 2))
    plan2 = add_chain(plan_for(mid), "CBNA", conv=conv2, k=256, r=r, s=r, param_dtype="float")
    assert plan1.compile(handle, solver=first) == first and plan2.compile(handle, solver=second) == second
    assert plan1._entry(handle).kernel.launcher.grid_dependency
    assert plan2._entry(handle).kernel.launcher.grid_dependency
    args1, args2 = (
        random_args(plan1, "cuda", param_dtype=torch.float32),
        random_args(plan2, "cuda", param_dtype=torch.float32),
    )
    y = input_tensor(plan2.output_desc.dims, torch.float16, layout)

    def chain() -> None:
        mid.fill_(float("nan"))
        y.fill_(float("nan"))
        plan1.execute(handle, x, mid, args1)
        plan2.execute(handle, mid, y, args2)

    def check() -> None:
        torch.cuda.synchronize()
        for plan, inp, out, args in ((plan1, x, mid, args1), (plan2, mid, y, args2)):
            result = compare(out, reference_output(plan, inp, args), EPS[torch.float16])
            assert result.nonfinite == 0 and result.rel_norm < 1e-2, str(result)

    for _ in range(3):  # the first launches, then the repeat path, on new input each time
        x.normal_()
        for _ in range(10):
            chain()
        check()
    graph = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        chain()  # first launches on the capture's stream, outside the capture
        with torch.cuda.graph(graph, stream=side):
            for _ in range(5):
                chain()
    torch.cuda.current_stream().wait_stream(side)
    for _ in range(3):
        x.normal_()
        graph.replay()
        check()
