"""Plan lifecycle: geometry, typed errors at creation, compile, execute checks, reuse, invalidation."""

import pytest
import torch

import fusionplan as fp
from fusionplan import solvers
from fusionplan.core.ops import ConvArgs

from .util import make_input, random_args


def desc(shape, dtype="float", layout="NCHW"):
    return fp.TensorDescriptor.packed(dtype, shape, layout)


def cbna_plan(shape=(2, 4, 9, 7), k=6, dtype="float", layout="NCHW"):
    plan = fp.FusionPlan(desc(shape, dtype, layout))
    plan.add_conv_forward(fp.ConvolutionDescriptor((1, 1), (1, 1), (1, 1)), desc((k, shape[1], 3, 3), dtype))
    plan.add_bias_forward(desc((1, k, 1, 1), dtype))
    plan.add_batchnorm_inference(fp.BatchNormMode.SPATIAL, desc((1, k, 1, 1), dtype))
    plan.add_activation_forward(fp.ActivationMode.RELU)
    return plan


@pytest.fixture
def handle():
    return fp.Handle("cpu")


def test_geometry_flows_through_operators():
    plan = fp.FusionPlan(desc((2, 3, 13, 11), layout="NHWC"))
    b = plan.add_bias_forward(desc((3,)))
    c = plan.add_conv_forward(fp.ConvolutionDescriptor((1, 0), (2, 2), (1, 1)), desc((17, 3, 3, 3)))
    n = plan.add_batchnorm_inference(fp.BatchNormMode.PER_ACTIVATION, desc((1, 17, 7, 5)))
    assert b.output_desc.dims == (2, 3, 13, 11)
    assert c.output_desc.dims == (2, 17, 7, 5) and n.input_desc.dims == (2, 17, 7, 5)
    assert plan.output_desc.dims == (2, 17, 7, 5) and plan.output_desc.layout == fp.Layout.NHWC
    assert plan.combination == "BCN" and plan.get_op(1) is c
    assert "convolution forward" in plan.describe()


@pytest.mark.parametrize(
    "add, match",
    [
        (
            lambda p: p.add_conv_forward(fp.ConvolutionDescriptor((1, 1)), desc((8, 3, 3, 3))),
            "filter channels 3 != C/groups",
        ),
        (
            lambda p: p.add_conv_forward(fp.ConvolutionDescriptor(groups=3), desc((8, 2, 3, 3))),
            "not divisible by groups",
        ),
        (lambda p: p.add_conv_forward(fp.ConvolutionDescriptor(), desc((8, 4, 3, 3), "half")), "filter dtype"),
        (lambda p: p.add_conv_forward(fp.ConvolutionDescriptor(), desc((8, 4, 11, 3))), "empty"),
        (lambda p: p.add_bias_forward(desc((1, 5, 1, 1))), "bias"),
        (lambda p: p.add_batchnorm_inference(fp.BatchNormMode.SPATIAL, desc((1, 4, 9, 7))), "batch-norm"),
        (lambda p: p.add_batchnorm_inference(fp.BatchNormMode.PER_ACTIVATION, desc((1, 4, 1, 1))), "batch-norm"),
        (lambda p: p.add_batchnorm_inference(fp.BatchNormMode.SPATIAL, desc((1, 4, 1, 1), "half")), "dtype"),
        (lambda p: p.add_activation_forward(11), "activation mode"),
        (lambda p: p.add_batchnorm_inference(7, desc((1, 4, 1, 1))), "batch-norm mode"),
    ],
)
def test_inconsistent_operator_is_badparm(add, match):
    plan = fp.FusionPlan(desc((2, 4, 9, 7)))
    with pytest.raises(fp.BadParmError, match=match):
        add(plan)
    assert plan.ops == ()  # nothing half-added


def test_bn_params_may_be_float32_for_half_data():
    plan = fp.FusionPlan(desc((2, 4, 9, 7), "half"))
    plan.add_batchnorm_inference(fp.BatchNormMode.SPATIAL, desc((1, 4, 1, 1), "float"))
    plan.add_bias_forward(desc((4,), "float"))


def _unsupported_cases():
    conv = (fp.ConvolutionDescriptor((1, 1)), desc((4, 4, 3, 3)))
    return [
        (
            "two convolutions",
            lambda p: (p.add_conv_forward(*conv), p.add_conv_forward(*conv)),
            "at most one convolution",
        ),
        ("fwd after bwd", lambda p: (p.add_batchnorm_backward(1), p.add_activation_forward(3)), "backward plan"),
        ("bwd after fwd", lambda p: (p.add_activation_forward(3), p.add_batchnorm_backward(1)), "mix phases"),
        (
            "training then conv",
            lambda p: (p.add_batchnorm_forward(1, True), p.add_conv_forward(*conv)),
            "training plan",
        ),
        ("conv then training", lambda p: (p.add_conv_forward(*conv), p.add_batchnorm_forward(1, True)), "mix phases"),
        ("act bwd alone", lambda p: p.add_activation_backward(3), "only supported right after"),
        (
            "three training ops",
            lambda p: (p.add_batchnorm_forward(1), p.add_activation_forward(3), p.add_activation_forward(3)),
            "training plan",
        ),
        (
            "transpose",
            lambda p: p.add_conv_forward(fp.ConvolutionDescriptor(mode=fp.ConvMode.TRANSPOSE), desc((4, 4, 1, 1))),
            "transposed",
        ),
    ]


@pytest.mark.parametrize("name, add, match", _unsupported_cases(), ids=[c[0] for c in _unsupported_cases()])
def test_unsupported_addition_fails_at_once(name, add, match):
    plan = fp.FusionPlan(desc((2, 4, 9, 7)))
    with pytest.raises(fp.UnsupportedOpError, match=match):
        add(plan)


def test_horizontal_direction_is_unsupported_at_first_operator():
    plan = fp.FusionPlan(desc((2, 4, 9, 7)), fp.Direction.HORIZONTAL)
    with pytest.raises(fp.UnsupportedOpError, match="horizontal"):
        plan.add_activation_forward(fp.ActivationMode.RELU)


def test_plan_input_limits():
    with pytest.raises(fp.UnsupportedOpError, match="4-d"):
        fp.FusionPlan(desc((2, 4, 9, 7, 3)))
    with pytest.raises(fp.UnsupportedOpError, match="INT8"):
        fp.FusionPlan(desc((2, 4, 9, 7), "int8"))
    with pytest.raises(fp.BadParmError, match="direction"):
        fp.FusionPlan(desc((2, 4, 9, 7)), 5)


def test_compile_empty_plan_is_badparm(handle):
    with pytest.raises(fp.BadParmError, match="no operators"):
        fp.FusionPlan(desc((2, 4, 9, 7))).compile(handle)


def test_explain_lists_every_solver(handle):
    verdicts = {v.solver: v for v in cbna_plan().explain(handle)}
    assert list(verdicts) == [s.name for s in solvers.REGISTRY]
    assert verdicts["cpu-folded"].applicable and verdicts["reference"].applicable
    assert "has a convolution" in verdicts["triton-pointwise"].reason
    train = fp.FusionPlan(desc((2, 4, 9, 7)))
    train.add_batchnorm_forward(fp.BatchNormMode.SPATIAL)
    cpu = next(v for v in train.explain(handle) if v.family == "cpu")
    assert not cpu.applicable and "training" in cpu.reason and "cpu-folded [cpu]: no:" in str(cpu)


def test_backend_restriction(handle, monkeypatch):
    plan = cbna_plan()
    assert plan.compile(handle, backend="reference") == "reference"
    assert plan.compile(handle, solver="reference") == "reference"
    with pytest.raises(fp.BadParmError, match="no solver named"):
        plan.compile(handle, solver="tensorrt")
    monkeypatch.setenv("FUSIONPLAN_BACKEND", "cpu")  # read by handles made from now on
    assert plan.compile(fp.Handle("cpu")) == "cpu-folded"
    monkeypatch.setenv("FUSIONPLAN_BACKEND", "triton")
    triton_only = fp.Handle("cpu")
    training = fp.FusionPlan(fp.TensorDescriptor.packed("double", (2, 4, 9, 7)))  # the Triton kernels take no fp64
    training.add_batchnorm_forward(fp.BatchNormMode.SPATIAL)
    with pytest.raises(fp.UnsupportedOpError, match="compile restricted to the triton family") as refused:
        training.compile(triton_only)
    # a tried solver's reason a line, and the solvers left out by the restriction named once
    lines = str(refused.value).splitlines()
    assert lines[0].startswith("no solver can run the plan") and all(len(line) < 200 for line in lines)
    assert lines[-1].endswith(": cpu-folded, cpu-training, cudnn, reference")
    assert any(line.strip().startswith("triton-pointwise [triton]: no: ") for line in lines)
    monkeypatch.setenv("FUSIONPLAN_BACKEND", "cuda")
    with pytest.raises(fp.BadParmError, match="FUSIONPLAN_BACKEND: backend 'cuda'"):
        fp.Handle("cpu")
    with pytest.raises(fp.BadParmError, match="backend 'cuda'"):
        plan.compile(triton_only, backend="cuda")


def test_a_handle_keeps_the_settings_it_was_made_with(monkeypatch):
    """The environment is read when a handle is made; settings given to a handle are its own; the
    default handle of a device follows the environment (another handle once it changes)."""
    monkeypatch.delenv("FUSIONPLAN_BACKEND", raising=False)
    plan = cbna_plan()
    default, made, own = fp.default_handle("cpu"), fp.Handle("cpu"), fp.Handle("cpu", settings=fp.Settings("reference"))
    monkeypatch.setenv("FUSIONPLAN_BACKEND", "reference")
    assert made.settings.backend is None and plan.compile(made) == "cpu-folded"
    assert own.settings.backend == "reference" and plan.compile(own) == "reference"
    assert fp.default_handle("cpu") is not default and fp.default_handle("cpu").settings.backend == "reference"
    assert fp.Handle("cpu", find_mode="normal").settings == fp.Settings(backend="reference", find_mode="NORMAL")
    with pytest.raises(fp.BadParmError, match="settings: expected fusionplan.Settings"):
        fp.Handle("cpu", settings={"backend": "cpu"})


# ---- execute: every failure path leaves the output untouched -------------------------------------
@pytest.fixture
def compiled(handle):
    plan = cbna_plan()
    plan.compile(handle)
    x = make_input((2, 4, 9, 7), torch.float32)
    y = torch.randn(2, 6, 9, 7)
    return plan, handle, x, y, random_args(plan)


def _assert_untouched(y, before):
    assert torch.equal(y, before), "the output was written although execute failed"


def test_a_kernel_that_fails_to_build_passes_the_plan_to_the_next_solver(handle, monkeypatch):
    """A solver whose kernel cannot be built here (say, a tile needing more shared memory than the
    device has) does not take compile down: the next applicable solver runs the plan; when none
    builds, a typed InternalError names each failure and the plan stays uncompiled."""

    def out_of_resources(self, spec, handle):
        raise RuntimeError("out of resource: shared memory, Required: 278576, Hardware limit: 232448")

    plan = cbna_plan()
    first, second, *rest = solvers.candidates(plan.spec(), handle)
    monkeypatch.setattr(type(first), "build", out_of_resources)
    assert plan.compile(handle) == second.name
    y = torch.full((2, 6, 9, 7), float("nan"))
    plan.execute(handle, make_input((2, 4, 9, 7), torch.float32, "NCHW"), y, random_args(plan))
    assert torch.isfinite(y).all()
    with pytest.raises(fp.InternalError, match=f"{first.name}: RuntimeError: out of resource") as raised:
        plan.compile(handle, solver=first.name)
    assert raised.value.status == fp.Status.INTERNAL_ERROR and isinstance(raised.value.__cause__, RuntimeError)
    for solver in (second, *rest):
        monkeypatch.setattr(type(solver), "build", out_of_resources)
    other, fresh = cbna_plan(), fp.Handle("cpu")  # the first handle keeps the kernel it built
    with pytest.raises(fp.InternalError, match=f"{first.name}: RuntimeError.*; {second.name}: RuntimeError"):
        other.compile(fresh)
    assert not other.is_compiled(fresh)


def test_a_build_failed_by_cpythons_ast_race_is_tried_again(handle, monkeypatch, caplog):
    """CPython 3.11's AST constructor counts its recursion per interpreter: another thread building an
    AST at the same time fails a build with a SystemError about nothing in the plan. Such a build is
    tried once more (the plan keeps its first solver); any other failure passes the plan on, logged."""
    plan = cbna_plan()
    first, second, *_ = solvers.candidates(plan.spec(), handle)
    build, calls = type(first).build, []

    def raced_once(self, spec, h):
        calls.append(spec.combination)
        if len(calls) == 1:
            raise SystemError("AST constructor recursion depth mismatch (before=51, after=44)")
        return build(self, spec, h)

    monkeypatch.setattr(type(first), "build", raced_once)
    assert plan.compile(handle) == first.name and len(calls) == 2

    def other_system_error(self, spec, h):
        raise SystemError("error return without exception set")

    monkeypatch.setattr(type(first), "build", other_system_error)
    with caplog.at_level("INFO", logger="fusionplan"):
        assert cbna_plan().compile(fp.Handle("cpu")) == second.name
    assert f"{first.name} could not build CBNA (SystemError: error return" in caplog.text


@pytest.mark.parametrize(
    "breaks, error, match",
    [
        (lambda p, h, x, y, a: (p, h, x[:, :, :8], y, a), fp.TensorMismatchError, "shape"),
        (lambda p, h, x, y, a: (p, h, x.double(), y, a), fp.TensorMismatchError, "dtype"),
        (
            lambda p, h, x, y, a: (p, h, x.to(memory_format=torch.channels_last), y, a),
            fp.TensorMismatchError,
            "strides",
        ),
        (lambda p, h, x, y, a: (p, h, x.to("meta"), y, a), fp.TensorMismatchError, "device"),
        (lambda p, h, x, y, a: (p, h, x, y[:, :5], a), fp.TensorMismatchError, "output"),
        (lambda p, h, x, y, a: (p, h, x, y.half(), a), fp.TensorMismatchError, "output"),
        (lambda p, h, x, y, a: (p, h, x, y[:, :, :1].expand(2, 6, 9, 7), a), fp.TensorMismatchError, "overlap"),
        (lambda p, h, x, y, a: (p, h, x, y, fp.OperatorArgs()), fp.MissingArgumentError, "no arguments"),
        (lambda p, h, x, y, a: (p, fp.Handle("cpu"), x, y, a), fp.NotCompiledError, "not compiled"),
        (lambda p, h, x, y, a: (p, h, "x", y, a), fp.BadParmError, "tensor"),
        (lambda p, h, x, y, a: (p, h, x, y, {}), fp.BadParmError, "OperatorArgs"),
    ],
)
def test_execute_failures_write_nothing(compiled, breaks, error, match):
    plan, handle, x, y, args = breaks(*compiled)
    before = compiled[3].clone()
    with pytest.raises(error, match=match):
        plan.execute(handle, x, y, args)
    _assert_untouched(compiled[3], before)


def test_missing_one_operator_argument(compiled):
    plan, handle, x, y, full = compiled
    args = fp.OperatorArgs()
    for op in plan.ops[:-1]:
        args.set(op, full.get(op))
    before = y.clone()
    with pytest.raises(fp.MissingArgumentError, match="operator 3 \\(activation forward\\)"):
        plan.execute(handle, x, y, args)
    _assert_untouched(y, before)


def test_argument_on_wrong_device(compiled):
    plan, handle, x, y, args = compiled
    op = plan.ops[0]
    args.set(op, ConvArgs(weight=args.get(op).weight.to("meta")))
    before = y.clone()
    with pytest.raises(fp.TensorMismatchError, match="operator 0"):
        plan.execute(handle, x, y, args)
    _assert_untouched(y, before)


def test_descriptor_mismatch_with_compiled_plan(compiled):
    plan, handle, x, y, args = compiled
    before = y.clone()
    with pytest.raises(fp.TensorMismatchError, match="input descriptor"):
        plan.execute(handle, x, y, args, x_desc=desc((2, 4, 9, 7), layout="NHWC"))
    with pytest.raises(fp.TensorMismatchError, match="output descriptor"):
        plan.execute(handle, x, y, args, y_desc=desc((2, 6, 9, 8)))
    with pytest.raises(fp.TensorMismatchError, match="output tensor"):
        plan.execute(handle, x, y, args, y_desc=desc((2, 6, 9, 7), layout="NHWC"))
    _assert_untouched(y, before)


def test_beta_needs_output_shaped_result(handle):
    plan = fp.FusionPlan(desc((1, 3, 8, 8)))
    plan.add_bias_forward(desc((1, 3, 1, 1)))
    plan.add_conv_forward(fp.ConvolutionDescriptor(), desc((5, 3, 3, 3)))
    plan.compile(handle)
    args = random_args(plan)
    args.set(plan.ops[0], fp.BiasArgs(bias=torch.randn(3), beta=0.5))
    y = torch.randn(1, 5, 6, 6)
    before = y.clone()
    with pytest.raises(fp.BadParmError, match="beta"):
        plan.execute(handle, torch.randn(1, 3, 8, 8), y, args)
    _assert_untouched(y, before)


def test_argument_validation_at_set_time():
    plan = cbna_plan()
    args = fp.OperatorArgs()
    conv, bias, bn, act = plan.ops
    with pytest.raises(fp.BadParmError, match="weights"):
        args.set(conv, ConvArgs(weight=torch.randn(6, 4, 3, 2)))
    with pytest.raises(fp.BadParmError, match="ConvArgs"):
        args.set(conv, fp.BiasArgs(bias=torch.randn(6)))
    with pytest.raises(fp.BadParmError, match="bias"):
        args.set(bias, fp.BiasArgs(bias=torch.randn(7)))
    with pytest.raises(fp.BadParmError, match="epsilon"):
        args.set(
            bn,
            fp.BatchNormInferenceArgs(
                *(torch.randn(6),) * 0,
                scale=torch.randn(6),
                bias=torch.randn(6),
                mean=torch.randn(6),
                variance=torch.rand(6),
                epsilon=-1.0,
            ),
        )
    with pytest.raises(fp.BadParmError, match="variance is required"):
        args.set(bn, fp.BatchNormInferenceArgs(scale=torch.randn(6), bias=torch.randn(6), mean=torch.randn(6)))
    with pytest.raises(fp.BadParmError, match="alpha"):
        args.set(act, fp.ActivationArgs(alpha=float("inf")))
    with pytest.raises(fp.BadParmError, match="activ_alpha"):
        args.set(act, fp.ActivationArgs(activ_alpha="x"))
    # accepted forms: (K,), (1,K,1,1) and any contiguous tensor of K elements
    for b in (torch.randn(6), torch.randn(1, 6, 1, 1), torch.randn(2, 3)):
        args.set(bias, fp.BiasArgs(bias=b))
    assert len(args) == 1 and bias in args


# ---- reuse and invalidation ----------------------------------------------------------------------
class CountingSolver(solvers.Solver):
    name, family = "counting", "reference"

    def __init__(self):
        self.builds = 0

    def why_not(self, spec, handle):
        return None

    def build(self, spec, handle):
        self.builds += 1
        return solvers.solver_named("reference").build(spec, handle)


@pytest.fixture
def counting(monkeypatch):
    solver = CountingSolver()
    monkeypatch.setattr(solvers, "REGISTRY", [solver, *solvers.REGISTRY])
    return solver


def test_new_arguments_and_tensors_need_no_recompile(handle, counting):
    plan = cbna_plan()
    assert plan.compile(handle) == "counting" and counting.builds == 1
    for _ in range(3):
        x = make_input((2, 4, 9, 7), torch.float32)
        args = random_args(plan)
        y = torch.full((2, 6, 9, 7), float("nan"))
        plan.execute(handle, x, y, args)
        assert not torch.isnan(y).any()
    assert counting.builds == 1


def test_same_signature_shares_the_handle_kernel(handle, counting):
    cbna_plan().compile(handle)
    cbna_plan().compile(handle)
    assert counting.builds == 1
    cbna_plan().compile(fp.Handle("cpu"))  # another handle compiles its own
    assert counting.builds == 2


def test_adding_an_operator_invalidates(compiled):
    plan, handle, x, y, args = compiled
    plan.execute(handle, x, y, args)
    plan.add_activation_forward(fp.ActivationMode.ABS)
    assert not plan.is_compiled(handle)
    before = y.clone()
    with pytest.raises(fp.NotCompiledError, match="changed"):
        plan.execute(handle, x, y, args)
    _assert_untouched(y, before)
    plan.compile(handle)
    args.set(plan.ops[-1], fp.ActivationArgs())
    plan.execute(handle, x, y, args)


def test_plan_compiled_for_one_handle_is_recompiled_for_another(compiled):
    plan, handle, x, y, args = compiled
    other = fp.Handle("cpu")
    with pytest.raises(fp.NotCompiledError):
        plan.execute(other, x, y, args)
    plan.compile(other)
    plan.execute(other, x, y, args)
    assert plan.is_compiled(handle) and plan.is_compiled(other)


def test_in_place_weight_update_is_seen(handle):
    """The CPU solver folds BN into the weights once per argument set; an in-place change of a
    weight (or BN) tensor must refresh the fold (version counters)."""
    plan = cbna_plan()
    assert plan.compile(handle) == "cpu-folded"
    args = random_args(plan)
    x = make_input((2, 4, 9, 7), torch.float32)
    y1, y2 = torch.empty(2, 6, 9, 7), torch.empty(2, 6, 9, 7)
    plan.execute(handle, x, y1, args)
    args.get(plan.ops[0]).weight.mul_(-1)
    args.get(plan.ops[2]).variance.add_(3.0)
    plan.execute(handle, x, y2, args)
    from fusionplan.oracle.reference import run_reference

    ref = run_reference(plan.ops, x, [args.get(op) for op in plan.ops]).output
    torch.testing.assert_close(y2.double(), ref, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(y1, y2)


# ---- repeated calls reuse the last call's checks; anything different is checked again --------------
def test_checks_reused_only_for_identical_calls(compiled):
    plan, handle, x, y, args = compiled
    plan.execute(handle, x, y, args)
    plan.execute(handle, x, y, args)  # the reused path
    for bad_y, error in ((y[:, :5], fp.TensorMismatchError), (y.double(), fp.TensorMismatchError)):
        with pytest.raises(error):
            plan.execute(handle, x, bad_y, args)
    with pytest.raises(fp.TensorMismatchError):
        plan.execute(handle, x.to(memory_format=torch.channels_last), y, args)
    with pytest.raises(fp.MissingArgumentError):
        plan.execute(handle, x, y, fp.OperatorArgs())
    with pytest.raises(fp.TensorMismatchError):
        plan.execute(handle, x, y, args, y_desc=desc((2, 6, 9, 7), layout="NHWC"))


def test_new_arguments_after_a_reused_call_are_checked_and_used(compiled):
    plan, handle, x, y, args = compiled
    from fusionplan.oracle.reference import run_reference

    plan.execute(handle, x, y, args)
    plan.execute(handle, x, y, args)
    with pytest.raises(fp.BadParmError):
        args.set(plan.ops[1], fp.BiasArgs(bias=torch.randn(7)))  # refused at set: nothing changes
    args.set(plan.ops[3], fp.ActivationArgs(beta=0.5))  # now the prior output is needed
    prior = torch.randn(2, 6, 9, 7)
    y.copy_(prior)
    plan.execute(handle, x, y, args)
    ref = run_reference(plan.ops, x, [args.get(op) for op in plan.ops], prior).output
    torch.testing.assert_close(y.double(), ref, rtol=1e-5, atol=1e-5)
    other, third = random_args(plan), random_args(plan)  # other arguments objects (beta 0), alternating
    for a in (other, third, other, third, args):  # each set's checks are remembered; each result its own
        y2 = torch.full((2, 6, 9, 7), float("nan"))
        plan.execute(handle, x, y2, a, prior=prior if a is args else None)
        ref = run_reference(plan.ops, x, [a.get(op) for op in plan.ops], prior if a is args else None).output
        torch.testing.assert_close(y2.double(), ref, rtol=1e-5, atol=1e-5)


def test_repeated_calls_with_separate_priors_use_each_prior(compiled):
    plan, handle, x, y, args = compiled
    from fusionplan.oracle.reference import run_reference

    args.set(plan.ops[2], fp.BatchNormInferenceArgs(**{**args.get(plan.ops[2]).field_values(), "beta": 1.0}))
    records = [args.get(op) for op in plan.ops]
    for _ in range(3):  # the second and third calls take the checked path
        prior = torch.randn(2, 6, 9, 7)
        plan.execute(handle, x, y, args, prior=prior)
        ref = run_reference(plan.ops, x, records, prior).output
        torch.testing.assert_close(y.double(), ref, rtol=1e-5, atol=1e-5)
    with pytest.raises(fp.TensorMismatchError):
        plan.execute(handle, x, y, args, prior=torch.randn(2, 6, 9, 8))


def test_repeater_repeats_a_checked_call_for_new_tensors(compiled):
    plan, handle, x, y, args = compiled
    from fusionplan.oracle.reference import run_reference

    assert plan.repeater(handle, x, y, args) is None  # nothing checked yet
    plan.execute(handle, x, y, args)
    run = plan.repeater(handle, x, y, args)
    assert plan.repeater(handle, x, y[:, :5], args) is None  # tensors unlike the checked call's
    records = [args.get(op) for op in plan.ops]
    for _ in range(2):
        x2, y2 = torch.randn_like(x), torch.full_like(y, float("nan"))
        assert run(x2, y2, None)
        torch.testing.assert_close(y2.double(), run_reference(plan.ops, x2, records).output, rtol=1e-5, atol=1e-5)
    args.set(plan.ops[3], fp.ActivationArgs(beta=0.5))  # arguments set again: the repeater declines
    y3 = torch.full_like(y, float("nan"))
    assert not run(x, y3, None) and torch.isnan(y3).all()


@pytest.mark.parametrize("grad", [False, True])
def test_a_vouched_call_raises_fusionplans_error_types(compiled, monkeypatch, grad):
    """execute_vouched (the training chains' checked-before calls), with grad mode on or off: a
    kernel's own failure is an InternalError naming the solver; fusionplan's errors pass as they are."""
    plan, handle, x, y, args = compiled
    records = [args.get(plan.get_op(i)) for i in range(len(plan.spec().ops))]
    kernel = plan._entry(handle).kernel
    failures = iter([RuntimeError("a fault inside the kernel"), fp.BadParmError("a bad argument")])

    def failing(*a):
        raise next(failures)

    monkeypatch.setattr(kernel, "run", failing)
    with torch.set_grad_enabled(grad):
        with pytest.raises(
            fp.InternalError, match=f"solver {plan.compiled_solver(handle)} failed: RuntimeError: a fault"
        ):
            plan.execute_vouched(handle, x, y, records)
        with pytest.raises(fp.BadParmError, match="a bad argument"):
            plan.execute_vouched(handle, x, y, records)


def test_a_tensors_device_finds_the_default_handle_of_its_device_and_settings(monkeypatch):
    """default_handle of a concrete torch.device (a tensor's) is the one of its device named any
    other way, and follows the environment's settings as they change and change back."""
    monkeypatch.delenv("FUSIONPLAN_BACKEND", raising=False)
    device = torch.randn(1).device
    first = fp.default_handle(device)
    assert first is fp.default_handle("cpu") is fp.default_handle(device)
    monkeypatch.setenv("FUSIONPLAN_BACKEND", "reference")
    other = fp.default_handle(device)
    assert other is not first and other.settings.backend == "reference" and other is fp.default_handle("cpu")
    monkeypatch.delenv("FUSIONPLAN_BACKEND")
    assert fp.default_handle(device) is first
    with pytest.raises(fp.BadParmError, match="CUDA"):
        fp.default_handle(torch.device("cuda", 0)) if not torch.cuda.is_available() else fp.default_handle(
            torch.device("cuda", torch.cuda.device_count())
        )
