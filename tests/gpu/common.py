"""What the GPU tests share: precisions, chains, layers, and the checks against the float64
reference."""

from __future__ import annotations

import torch

import fusionplan as fp
from fusionplan.core.enums import ActivationMode, BatchNormMode
from fusionplan.oracle.reference import run_reference
from fusionplan.solvers import REGISTRY
from fusionplan.tools.shapes import load_shapes
from fusionplan.tools.verify import EPS, TF32_EPS, add_chain, compare, random_args, random_record, reference_output

from ..util import (
    plan_for,
    poisoned,
    seeded_alpha_beta_args,
)

PRECISIONS = {  # name: (dtype, TF32 allowed, relative-norm tolerance, epsilon of the rms rule)
    "fp32": (torch.float32, False, 1e-5, EPS[torch.float32]),
    "tf32": (torch.float32, True, 1e-3, TF32_EPS),
    "fp16": (torch.float16, False, 1e-2, EPS[torch.float16]),
    "bf16": (torch.bfloat16, False, 1e-2, EPS[torch.bfloat16]),
}


LAYERS = load_shapes()


TRITON_SOLVERS = {s.name for s in REGISTRY if s.family == "triton"}


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
