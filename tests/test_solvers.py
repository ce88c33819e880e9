"""Every CPU-capable solver against the float64 reference: odd shapes, layouts, dtypes, chains."""

import random

import pytest
import torch

import fusionplan as fp
from fusionplan.enums import ActivationMode, BatchNormMode
from fusionplan.testing import add_chain

from .util import DTYPES, check_against_reference, make_input, poisoned, random_args, random_conv_plan

SOLVERS = ["cpu", "reference"]

# (N, C, H, W, K, R, S, pad, stride, dilation, groups)
CONV_SHAPES = {
    "stem-C3": (2, 3, 13, 11, 17, 3, 3, (1, 1), (1, 1), (1, 1), 1),
    "stride2": (2, 8, 13, 11, 16, 3, 3, (1, 1), (2, 2), (1, 1), 1),
    "dilation2": (1, 5, 12, 10, 7, 3, 3, (2, 2), (1, 1), (2, 2), 1),
    "grouped": (2, 6, 9, 9, 9, 3, 3, (1, 1), (1, 1), (1, 1), 3),
    "depthwise": (2, 8, 11, 7, 8, 3, 3, (1, 1), (1, 1), (1, 1), 8),
    "1x1": (3, 16, 7, 7, 17, 1, 1, (0, 0), (1, 1), (1, 1), 1),
    "asymmetric": (1, 4, 10, 13, 5, 1, 5, (0, 2), (1, 2), (1, 1), 1),
    "7x7-stride2-pad3": (1, 3, 16, 16, 8, 7, 7, (3, 3), (2, 2), (1, 1), 1),
}

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


def build(plan, chain, k, r, s, pad, stride, dil, groups, bn_mode, act_mode, dtype_name, w_layout="NCHW"):
    """The chain's operators, batch-norm parameters in ``dtype_name``."""
    conv = fp.ConvolutionDescriptor(pad, stride, dil, groups) if "C" in chain else None
    return add_chain(
        plan,
        chain,
        conv=conv,
        k=k,
        r=r,
        s=s,
        w_layout=w_layout,
        bn_mode=bn_mode,
        activation=act_mode,
        param_dtype=dtype_name,
    )


DT_NAME = {torch.float32: "float", torch.float16: "half", torch.bfloat16: "bfloat16", torch.float64: "double"}


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
    n, c, h, w, k, r, s, pad, stride, dil, groups = CONV_SHAPES[shape_key]
    x = make_input((n, c, h, w), dtype, layout)
    plan = build(
        fp.FusionPlan(fp.TensorDescriptor.from_tensor(x)),
        chain,
        k,
        r,
        s,
        pad,
        stride,
        dil,
        groups,
        bn_mode,
        act,
        DT_NAME[dtype],
        w_layout,
    )
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
    plan = build(
        fp.FusionPlan(fp.TensorDescriptor.from_tensor(x)),
        chain,
        0,
        0,
        0,
        0,
        0,
        0,
        1,
        bn_mode,
        ActivationMode.ELU,
        "float",
    )
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
    plan = build(
        fp.FusionPlan(fp.TensorDescriptor.from_tensor(x)),
        chain,
        4,
        3,
        3,
        (1, 1),
        (1, 1),
        (1, 1),
        1,
        BatchNormMode.PER_ACTIVATION,
        ActivationMode.TANH,
        "float",
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
