"""Every CPU-capable solver against the float64 reference: odd shapes, layouts, dtypes, chains."""

import random

import pytest
import torch

import fusionplan as fp
from fusionplan.core.enums import ActivationMode, BatchNormMode
from fusionplan.tools.verify import add_chain

from .util import (
    CONV_SHAPES,
    DTYPES,
    check_against_reference,
    make_input,
    plan_for,
    poisoned,
    random_args,
    random_conv_plan,
    shape_plan,
)

SOLVERS = ["cpu", "reference"]

# Driver fusion modes (-F) plus unusual orders and repeats.
CHAINS = {
    "CBNA": "CBNA",
    "CNA": "CNA",
    "CN": "CN",
    "CBA": "CBA",
    "CA": "CA",
    "CB": "CB",
    "ACB": "ACB",
    "NCAN": "NCAN",
    "CAAB": "CAAB",
    "CBBNN": "CBBNN",
    "C": "C",
}


def run_case(
    solver,
    shape_key,
    chain,
    dtype,
    layout,
    bn_mode=BatchNormMode.SPATIAL,
    act=ActivationMode.RELU,
    out_layout=None,
    w_layout="NCHW",
):
    plan, x = shape_plan(shape_key, chain, dtype, layout, bn_mode, act, w_layout)
    handle = fp.Handle("cpu")
    assert plan.compile(handle, backend=solver) == {"cpu": "cpu-folded", "reference": "reference"}[solver]
    args = random_args(plan)
    y = poisoned(plan.output_desc, out_layout or layout)
    return check_against_reference(plan, handle, x, args, y)


@pytest.mark.parametrize("solver", SOLVERS)
@pytest.mark.parametrize("shape_key", list(CONV_SHAPES))
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_conv_shapes_cbna(solver, shape_key, layout):
    run_case(solver, shape_key, "CBNA", torch.float32, layout)


@pytest.mark.parametrize("solver", SOLVERS)
@pytest.mark.parametrize("chain", list(CHAINS))
@pytest.mark.parametrize("dtype", list(DTYPES.values()), ids=list(DTYPES))
def test_chains_and_dtypes(solver, chain, dtype):
    run_case(solver, "stride2", CHAINS[chain], dtype, "NHWC")


@pytest.mark.parametrize("solver", SOLVERS)
@pytest.mark.parametrize("bn_mode", list(BatchNormMode))
@pytest.mark.parametrize("act", list(ActivationMode))
def test_every_activation_and_bn_mode(solver, bn_mode, act):
    run_case(solver, "stem-C3", "CBNA", torch.float32, "NCHW", bn_mode, act)


@pytest.mark.parametrize("solver", SOLVERS)
def test_layout_changes_and_weight_layouts(solver):
    run_case(solver, "grouped", "CBNA", torch.float32, "NCHW", out_layout="NHWC")
    run_case(solver, "grouped", "CNA", torch.float32, "NHWC", out_layout="NCHW", w_layout="NHWC")


@pytest.mark.parametrize("solver", SOLVERS)
@pytest.mark.parametrize("chain", ["NA", "BA", "NAN", "AA", "B", "N", "A", "BNBN"])
@pytest.mark.parametrize("bn_mode", list(BatchNormMode))
def test_pointwise_chains(solver, chain, bn_mode):
    x = make_input((2, 5, 7, 3), torch.float32, "NHWC")
    plan = add_chain(plan_for(x), chain, bn_mode=bn_mode, activation=ActivationMode.ELU, param_dtype="float")
    handle = fp.Handle("cpu")
    plan.compile(handle, backend=solver)
    check_against_reference(plan, handle, x, random_args(plan), poisoned(plan.output_desc, "NHWC"))


def test_double_data_computes_in_double():
    err = run_case("cpu", "depthwise", "CBNA", torch.float64, "NCHW")
    assert err < 1e-12


@pytest.mark.parametrize("solver", SOLVERS)
@pytest.mark.parametrize("chain", ["CBNA", "NA", "CAB"])
def test_alpha_beta_blend_prior_output(solver, chain):
    """result = alpha * op(x) + beta * y_prior, for every operator."""
    x = make_input((2, 4, 6, 5), torch.float32, "NCHW")
    plan = add_chain(
        plan_for(x),
        chain,
        conv=fp.ConvolutionDescriptor((1, 1), (1, 1), (1, 1), 1),
        k=4,
        r=3,
        s=3,
        bn_mode=BatchNormMode.PER_ACTIVATION,
        activation=ActivationMode.TANH,
        param_dtype="float",
    )
    handle = fp.Handle("cpu")
    plan.compile(handle, backend=solver)
    rng = random.Random(7)
    args = fp.OperatorArgs()
    from .util import random_record

    for op in plan.ops:
        args.set(op, random_record(op, alpha=rng.uniform(0.5, 2), beta=rng.uniform(-1, 1)))
    y = torch.randn(plan.output_desc.dims)
    check_against_reference(plan, handle, x, args, y)
    # an explicit prior tensor instead of y's contents
    z = torch.randn(plan.output_desc.dims)
    check_against_reference(plan, handle, x, args, torch.full(plan.output_desc.dims, float("nan")), prior=z)


@pytest.mark.parametrize("seed", range(12))
def test_random_plans(seed):
    """Randomly drawn chains (operators before the convolution too), shapes, layouts, dtypes: the CPU
    solver agrees with the oracle."""
    torch.manual_seed(seed)
    drawn = random_conv_plan(random.Random(seed), [torch.float32, torch.float16, torch.bfloat16], pre_ops=2)
    if drawn is None:
        return
    plan, x, out_layout = drawn
    handle = fp.Handle("cpu")
    assert plan.compile(handle) == "cpu-folded"
    check_against_reference(plan, handle, x, random_args(plan), poisoned(plan.output_desc, out_layout))


def test_no_applicability_check_raises_on_common_plans():
    """A solver's check that raises is reported as a refusal (compile never fails on it), which can
    hide a bug: no check may raise on the support table's plans or on the ResNet-50 layers."""
    import types

    from fusionplan import solvers
    from fusionplan.tools.shapes import load_shapes
    from fusionplan.tools.support import ROWS
    from fusionplan.tools.verify import layer_plan

    plans = []
    for _, builders, *channels in ROWS:
        for dtype in ("float", "half", "bfloat16"):
            for layout in ("NCHW", "NHWC"):
                dims = (2, channels[0] if channels else 8, 9, 9)
                plan = fp.FusionPlan(fp.TensorDescriptor.packed(dtype, dims, layout))
                for build in builders:
                    build(plan)
                plans.append(plan)
    for shape in load_shapes():
        for dtype in (torch.float16, torch.float32):
            x = torch.empty(32, shape.c, shape.h, shape.w, dtype=dtype).to(memory_format=torch.channels_last)
            plans.append(layer_plan(shape, x, "CBNA"))
    for device, capability in (("cpu", None), ("cuda", (8, 0)), ("cuda", (9, 0))):
        handle = types.SimpleNamespace(
            device=torch.device(device),
            tf32_allowed=lambda: True,
            compute_capability=lambda c=capability: c,
            settings=fp.Settings(),
        )
        for plan in plans:
            for verdict in solvers.verdicts(plan.spec(), handle):
                assert "applicability check failed" not in (verdict.reason or ""), (plan.describe(), str(verdict))


@pytest.mark.parametrize(
    "interleaved, filter_w, stride, pad, dil, itemsize, expected",
    [
        # the stem, channels-last fp16: runs of 2 pixels, 30 of 32 elements used, 8-byte vectors
        (3, 7, 2, 3, 1, 2, dict(pixels=2, step=12, lead=12, block_e=32, used=30)),
        # the stem on channel planes: runs of 4 pixels, 14 of 16 (a 4-element vector lead)
        (1, 7, 2, 3, 1, 2, dict(pixels=4, step=8, lead=4, block_e=16, used=14)),
        # 3x3 stride 1 on 3 channels: a shorter vector keeps the stretch at 16
        (3, 3, 1, 1, 1, 2, dict(pixels=2, step=6, lead=4, block_e=16, used=13)),
    ],
)
def test_stem_stretches_choose_the_shortest_step(interleaved, filter_w, stride, pad, dil, itemsize, expected):
    """The stretch per filter row first (tensor-core work), then longer runs, then wider vectors."""
    from fusionplan.solvers.stem_toolkit import stretches

    runs = stretches(interleaved, filter_w, stride, pad, dil, 112, itemsize)
    assert {k: getattr(runs, k) for k in expected} == expected
    # every tap of every pixel of the run lies inside the stretch, the last one at used - 1
    last = runs.position(runs.pixels - 1, filter_w - 1, stride, pad, dil) + interleaved - 1
    assert runs.position(0, 0, stride, pad, dil) >= 0 and last == runs.used - 1 < runs.block_e


def test_the_stems_fast_tile_fits_shared_memory(monkeypatch):
    """fp32, 3 channels, 5x5 dilated 3 along the rows, 53 filters (fuzzer: --mode gpu --seed 101
    --focus cudnn --layers 0.4 --index 519): 4-pixel runs of 64-element stretches. The heuristic's
    64 x 64 tile of 4 stages asks for 320 KB (Triton 3.6 failed its compile); the kernel takes
    fewer stages instead, and every tile it would benchmark fits too."""
    from fusionplan.solvers import triton_stem

    monkeypatch.setattr(triton_stem, "interpreter_active", lambda: False)
    x = torch.empty(3, 3, 1, 13).to(memory_format=torch.channels_last)
    conv = fp.ConvolutionDescriptor((2, 2), dilations=(1, 3))
    plan = add_chain(fp.FusionPlan(fp.TensorDescriptor.from_tensor(x)), "CBNA", k=53, r=5, s=5, conv=conv)
    kernel = triton_stem.TritonStemKernel(plan.spec(), fp.Handle())
    limit = triton_stem.shared_bytes_per_program(None)
    for cfg in [kernel.config, *kernel.candidates]:
        assert triton_stem.stem_shared_bytes(cfg, kernel.runs, 4) <= limit, cfg
    assert kernel.config.num_stages < 4


def test_stem_plans_whose_tiles_overflow_shared_memory_are_refused():
    """fp32, 8 channels, 5x5 dilated along the rows (fuzzer: --mode gpu --seed 4 --index 549): 8-pixel
    runs of 128-element stretches need about 300 KB a reduction step in every stem tile. The
    solver says so instead of claiming the plan and failing at its compile; the ResNet stem fits."""
    from fusionplan.solvers.triton_stem import stem_why_not

    x = torch.empty(2, 8, 1, 13).to(memory_format=torch.channels_last)
    conv = fp.ConvolutionDescriptor((3, 0), dilations=(1, 2))
    plan = add_chain(fp.FusionPlan(fp.TensorDescriptor.from_tensor(x)), "C", k=44, r=5, s=5, conv=conv)
    assert "KB of shared memory" in stem_why_not(plan.spec())
    stem = torch.empty(2, 3, 32, 32, dtype=torch.float16).to(memory_format=torch.channels_last)
    conv = fp.ConvolutionDescriptor((3, 3), strides=(2, 2))
    plan = add_chain(fp.FusionPlan(fp.TensorDescriptor.from_tensor(stem)), "CBA", k=64, r=7, s=7, conv=conv)
    assert stem_why_not(plan.spec()) is None


@pytest.mark.parametrize("solver", ["triton-window", "triton-gemm"])
def test_descriptor_kernels_find_among_steps_a_tensor_box_can_read(solver, monkeypatch):
    """NORMAL find's candidates of the kernels that read tensor boxes: fp32 steps of at most 32
    channels (128-byte rows, the widest swizzle); 16-bit ones keep their 64."""
    pytest.importorskip("triton")
    from fusionplan.solvers import solver_named

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    for dtype, most in ((torch.float32, 32), (torch.float16, 64)):
        x = torch.randn(2, 128, 8, 8, dtype=dtype).to(memory_format=torch.channels_last)
        r = 3 if solver == "triton-window" else 1
        conv = fp.ConvolutionDescriptor((r // 2, r // 2))
        plan = add_chain(fp.FusionPlan(fp.TensorDescriptor.from_tensor(x)), "CBA", k=64, r=r, s=r, conv=conv)
        kernel = solver_named(solver).build(plan.spec(), fp.Handle("cpu"))
        found = kernel.find_candidates()
        assert found and max(c.block_k for c in found) == most


@pytest.mark.parametrize("alpha, unit", [(1.0, True), (1, True), (0.5, False), (-1.0, False)])
def test_unit_activation_alpha_is_a_specialization(alpha, unit):
    """An activation whose output scale alpha is 1 compiles without the multiply (UNIT_AL, a
    constexpr flag beside HAS_Q that never counts as reading the prior); other alphas multiply.
    The result either way: test_alpha_beta_blend_prior_output."""
    from fusionplan.runtime.epilogue import reads_prior, stage_arguments
    from fusionplan.solvers import solver_named
    from fusionplan.tools.verify import random_record

    x = make_input((2, 4, 6, 5), torch.float32, "NCHW")
    plan = add_chain(plan_for(x), "CBNA", conv=fp.ConvolutionDescriptor((1, 1), (1, 1), (1, 1), 1), k=4, r=3, s=3)
    kernel = solver_named("triton-conv").build(plan.spec(), fp.Handle("cpu"))
    assert "if not UNIT_AL1:" in kernel.source() and "UNIT_AL1: tl.constexpr" in kernel.source()
    records = [random_record(op) for op in plan.ops]
    records[-1] = random_record(plan.ops[-1], alpha=alpha)
    _, flags = stage_arguments(kernel.stages, records, 4, (6, 5), torch.device("cpu"))
    assert list(flags) == ["HAS_Q0", "HAS_Q1", "UNIT_AL1"] and flags["UNIT_AL1"] is unit
    assert not reads_prior(flags)
    records[-1] = random_record(plan.ops[-1], alpha=alpha, beta=0.5)
    assert reads_prior(stage_arguments(kernel.stages, records, 4, (6, 5), torch.device("cpu"))[1])
