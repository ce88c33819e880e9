"""PReLU (ActivationMode.PRELU, an extension mode): a slope per channel, a tensor argument of the
activation's record. Its checks, the training plans' refusal, and every solver that claims a plan
with it (the Triton ones through Triton's interpreter) against the float64 oracle."""

import pytest
import torch

import fusionplan as fp
from fusionplan.core.enums import ActivationMode, BatchNormMode
from fusionplan.core.ops import ActivationForwardOp
from fusionplan.tools.verify import add_chain

from .util import CONV_SHAPES, DT_NAME, check_against_reference, make_input, plan_for, poisoned, random_args

PRELU = ActivationMode.PRELU


def _prelu_plan(x: torch.Tensor, chain: str = "A", **conv) -> fp.FusionPlan:
    return add_chain(plan_for(x), chain, activation=PRELU, param_dtype="float", **conv)


def _slope_args(plan: fp.FusionPlan, slope) -> fp.OperatorArgs:
    """Random arguments for the plan, the activation's slope replaced by ``slope``."""
    args = random_args(plan)
    act = plan.ops[-1]
    args.set(act, fp.ActivationArgs(slope=slope))
    return args


def test_the_slope_is_required_and_checked():
    x = torch.randn(2, 5, 4, 3)
    plan = _prelu_plan(x)
    act = plan.ops[0]
    args = fp.OperatorArgs()
    with pytest.raises(fp.BadParmError, match="slope is required"):
        args.set(act, fp.ActivationArgs())
    with pytest.raises(fp.BadParmError, match="slope has shape"):
        args.set(act, fp.ActivationArgs(slope=torch.rand(6)))
    with pytest.raises(fp.BadParmError, match="slope has dtype"):
        args.set(act, fp.ActivationArgs(slope=torch.rand(5, dtype=torch.float16)))
    relu = ActivationForwardOp(0, plan.input_desc, ActivationMode.LEAKYRELU)
    with pytest.raises(fp.BadParmError, match="a slope is PReLU's argument"):
        args.set(relu, fp.ActivationArgs(slope=torch.rand(5)))
    assert len(args) == 0  # nothing set by a refused record


def test_a_plan_without_its_slope_writes_nothing():
    x = torch.randn(2, 5, 4, 3)
    plan = _prelu_plan(x)
    handle = fp.Handle("cpu")
    plan.compile(handle)
    y = poisoned(plan.output_desc)
    args = fp.OperatorArgs()
    with pytest.raises(fp.MissingArgumentError):
        plan.execute(handle, x, y, args)
    assert torch.isnan(y).all()


def test_one_slope_serves_every_channel():
    x = torch.randn(2, 5, 4, 3, dtype=torch.float64)
    plan = _prelu_plan(x)
    handle = fp.Handle("cpu")
    plan.compile(handle)
    y = torch.empty_like(x)
    plan.execute(handle, x, y, _slope_args(plan, torch.tensor([0.3], dtype=torch.float64)))
    torch.testing.assert_close(y, torch.nn.functional.prelu(x, torch.tensor([0.3], dtype=torch.float64)))


def test_the_backward_and_the_training_plans_refuse_prelu():
    x = torch.randn(2, 5, 4, 3)
    backward = plan_for(x)
    backward.add_batchnorm_backward(BatchNormMode.SPATIAL)
    with pytest.raises(fp.UnsupportedOpError, match="slope's gradient"):
        backward.add_activation_backward(PRELU)
    forward = plan_for(x)
    forward.add_batchnorm_forward(BatchNormMode.SPATIAL)
    with pytest.raises(fp.UnsupportedOpError, match="training plan"):
        forward.add_activation_forward(PRELU)
    assert len(backward.ops) == 1 and len(forward.ops) == 1


def test_the_miopen_layer_keeps_miopens_ten_modes():
    from fusionplan import miopen

    assert PRELU.value not in {m.value for m in miopen.miopenActivationMode_t}


def _solvers_claiming(plan: fp.FusionPlan) -> list[str]:
    return [v.solver for v in plan.explain(fp.Handle("cpu")) if v.applicable]


#: Plans that reach each kind of solver: a convolution (3x3 of 3 channels to 17, which no block
#: divides, strided, grouped, 1x1, depthwise, a 7x7 stem) or none (pointwise).
CASES = {
    "3x3-K17": ("CBNA", "stem-C3"),
    "stride2": ("CBA", "stride2"),
    "grouped": ("CNA", "grouped"),
    "1x1": ("CBNA", "1x1"),
    "depthwise": ("CBA", "depthwise"),
    "stem-7x7": ("CBA", "7x7-stride2-pad3"),
    "1x1-K24": ("CBNA", "1x1-K24"),
    "3x3-C16K24": ("CBA", "3x3-C16K24"),
    "prologue": ("NACB", "3x3-C16K24"),  # PReLU applied as the convolution loads its input
    "pointwise": ("NA", None),
    "pointwise-BA": ("BAB", None),
}


#: Shapes whose rows are 16-byte multiples in every dtype (the tensor-descriptor solvers').
SHAPES = {
    **CONV_SHAPES,
    "1x1-K24": (2, 16, 7, 5, 24, 1, 1, (0, 0), (1, 1), (1, 1), 1),
    "3x3-C16K24": (2, 16, 9, 7, 24, 3, 3, (1, 1), (1, 1), (1, 1), 1),
}


def _case_plan(case: str, dtype: torch.dtype, layout: str) -> tuple[fp.FusionPlan, torch.Tensor]:
    chain, shape = CASES[case]
    if shape is None:
        x = make_input((2, 17, 7, 5), dtype, layout)
        return add_chain(plan_for(x), chain, activation=PRELU, param_dtype=DT_NAME[dtype]), x
    n, c, h, w, k, r, s, pad, stride, dil, groups = SHAPES[shape]
    x = make_input((n, c, h, w), dtype, layout)
    conv = fp.ConvolutionDescriptor(pad, stride, dil, groups)
    plan = add_chain(plan_for(x), chain, conv=conv, k=k, r=r, s=s, activation=PRELU, param_dtype=DT_NAME[dtype])
    return plan, x


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
def test_every_solver_that_claims_a_prelu_plan_runs_it_right(case, layout, dtype):
    plan, x = _case_plan(case, dtype, layout)
    claimed = _solvers_claiming(plan)
    assert claimed, plan.explain(fp.Handle("cpu"))
    for solver in claimed:
        if solver.startswith("triton-"):
            pytest.importorskip("triton")
        handle = fp.Handle("cpu")
        assert plan.compile(handle, solver=solver) == solver
        check_against_reference(plan, handle, x, random_args(plan), poisoned(plan.output_desc, layout))


@pytest.mark.parametrize("case", ["3x3-K17", "pointwise"])
def test_a_slope_edited_in_place_reaches_the_kernel(case):
    """Kernels keep coefficients derived from the arguments; the slope's version tells them apart."""
    plan, x = _case_plan(case, torch.float32, "NHWC")
    for solver in _solvers_claiming(plan):
        handle = fp.Handle("cpu")
        plan.compile(handle, solver=solver)
        args = random_args(plan)
        check_against_reference(plan, handle, x, args, poisoned(plan.output_desc, "NHWC"))
        args.get(plan.ops[-1]).slope.mul_(-3.0).add_(0.5)
        check_against_reference(plan, handle, x, args, poisoned(plan.output_desc, "NHWC"))


# ---- fuse(model) -----------------------------------------------------------------------------------
class _PReLUNet(torch.nn.Module):
    """conv -> bn -> PReLU(C), conv -> PReLU(1) (no batch-norm), bn -> PReLU(C) with a residual."""

    def __init__(self) -> None:
        super().__init__()
        nn = torch.nn
        self.conv1, self.bn1, self.act1 = nn.Conv2d(3, 6, 3, padding=1), nn.BatchNorm2d(6), nn.PReLU(6, 0.2)
        self.conv2, self.act2 = nn.Conv2d(6, 6, 3, stride=2, padding=1), nn.PReLU()
        self.bn3, self.act3 = nn.BatchNorm2d(6), nn.PReLU(6)
        with torch.no_grad():
            for act in (self.act1, self.act2, self.act3):
                act.weight.uniform_(-0.5, 1.0)
            for bn in (self.bn1, self.bn3):
                bn.running_mean.normal_(), bn.running_var.uniform_(0.5, 2.0), bn.weight.normal_()

    def forward(self, x):
        y = self.act1(self.bn1(self.conv1(x)))
        y = self.act2(self.conv2(y))
        return self.act3(self.bn3(y) + y)


def _fused_prelu_net(training: bool):
    import copy

    import fusionplan.torch as fpt

    torch.manual_seed(3)
    model = _PReLUNet().train(training)
    return copy.deepcopy(model), fpt.fuse(model)


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_fuse_runs_prelu_chains_in_their_plans(layout):
    twin, fused = _fused_prelu_net(training=False)
    assert len(fused.fusion_report.fused) == 3, fused.fusion_report
    x = make_input((2, 3, 9, 7), torch.float32, layout)
    with torch.no_grad():
        torch.testing.assert_close(fused(x), twin(x), rtol=1e-5, atol=1e-5)
        for model in (fused, twin):  # an optimizer's step edits the slopes in place: the plans see it
            model.act1.weight.mul_(-2.0)
        torch.testing.assert_close(fused(x), twin(x), rtol=1e-5, atol=1e-5)
    ran = fused.fusion_report.solvers()
    assert all(solvers and not any("eagerly" in s for s in solvers) for solvers in ran.values()), ran


def test_fused_prelu_chains_train_as_eager_does():
    """In training mode the batch-norm runs as the training plans and PReLU in torch: the slopes'
    gradients are eager's."""
    twin, fused = _fused_prelu_net(training=True)
    x, w = torch.randn(2, 3, 9, 7), torch.randn(2, 6, 5, 4)
    for model in (fused, twin):
        (model(x) * w).sum().backward()
    grads = dict(fused.named_parameters())
    for name, p in twin.named_parameters():
        torch.testing.assert_close(grads[name].grad, p.grad, rtol=1e-4, atol=1e-4, msg=lambda m, n=name: f"{n}: {m}")
    torch.testing.assert_close(fused.bn1.running_mean, twin.bn1.running_mean)


def test_eval_prelu_chains_with_gradients_wanted_give_eager_gradients():
    twin, fused = _fused_prelu_net(training=False)
    x = torch.randn(2, 3, 9, 7)
    for model in (fused, twin):
        model(x).square().sum().backward()
    torch.testing.assert_close(fused.act2.weight.grad, twin.act2.weight.grad, rtol=1e-4, atol=1e-5)


def test_prelu_chains_trace_under_torch_export_and_compile():
    """The slopes are an argument of the custom op: exported and compiled models read the module's."""
    twin, fused = _fused_prelu_net(training=False)
    x = torch.randn(2, 3, 9, 7)
    with torch.no_grad():
        fused(x)
        exported = torch.export.export(fused, (x,))
        chains = [n for n in exported.graph.nodes if n.op == "call_function" and "fused_chain" in str(n.target)]
        assert len(chains) == 3
        torch.testing.assert_close(exported.module()(x), twin(x), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(torch.compile(fused)(x), twin(x), rtol=1e-5, atol=1e-5)


def test_a_functional_prelu_ends_its_chain_with_the_reason():
    import fusionplan.torch as fpt

    class Functional(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv, self.slope = torch.nn.Conv2d(3, 4, 3), torch.nn.Parameter(torch.rand(4))

        def forward(self, x):
            return torch.nn.functional.prelu(self.conv(x), self.slope)

    model = Functional().eval()
    fused = fpt.fuse(model)
    assert "prelu: functional prelu (fused as the module nn.PReLU" in str(fused.fusion_report)
    x = torch.randn(1, 3, 6, 5)
    with torch.no_grad():
        torch.testing.assert_close(fused(x), model(x))


@pytest.mark.parametrize(
    "solver, layer, layout",
    [
        ("gluon-gemm", "r50_05", "NHWC"),
        ("gluon-rows", "r50_02", "NHWC"),
        ("gluon-stem", "r50_00", "NHWC"),
        ("gluon-nchw", "r50_22", "NCHW"),
    ],
)
def test_the_gluon_kernels_load_the_slopes_per_channel(solver, layer, layout):
    """The Gluon kernels (sm_90, compiled without a GPU) take PReLU's slopes as a pointer and load
    them per channel in the epilogue (hoisted where the kernel hoists its channel parameters)."""
    from .util import compile_sm90, layer_build

    build = layer_build(layer, "float16", "CBN", layout) + "\nplan.add_activation_forward(ActivationMode.PRELU)"
    info = compile_sm90(build, solver)
    source = info["source"]
    assert "tl." not in source
    loads = ("gl.load(a1_ptr + ch, mask=ch_mask", "a1_ptr_v = gl.load(a1_ptr + ch_v, mask=ch_v_mask")
    assert any(load in source for load in loads), source[-3000:]
    assert "h = gl.where(h > 0.0, h, a1_ptr_v[None, :] * h)" in source or "[None, :] * h)" in source


def test_the_python_api_binds_the_slope_and_updates_it_without_a_recompile():
    x = torch.randn(2, 4, 7, 5, dtype=torch.float64)
    w = torch.randn(6, 4, 3, 3, dtype=torch.float64) * 0.2
    slope = torch.rand(6, dtype=torch.float64)
    plan = fp.Plan(x).conv(w, padding=1).prelu(slope)
    conv = torch.nn.functional.conv2d(x, w, padding=1)
    torch.testing.assert_close(plan(x), torch.nn.functional.prelu(conv, slope))
    solver = plan.solver
    other = -torch.rand(6, dtype=torch.float64)
    plan.update(1, slope=other)
    torch.testing.assert_close(plan(x), torch.nn.functional.prelu(conv, other))
    assert plan.solver == solver
    with pytest.raises(fp.BadParmError, match="still lacks slope"):  # bound later, or never: named
        fp.Plan(x).conv(w, padding=1).activation("prelu").update(1, activ_alpha=1.0)
