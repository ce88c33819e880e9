"""The triton-batchnorm solver's kernels (the training plans), through Triton's interpreter, against
float64 autograd: every activation, both batch-norm modes, both layouts, fp32 and fp16, running
statistics on and off, alpha/beta, a large mean, odd sizes, strided views, and bad input."""

import numpy as np
import pytest
import torch

import fusionplan as fp
import fusionplan.miopen as mi
from fusionplan.core.activations import activation_forward
from fusionplan.core.enums import ActivationMode, BatchNormMode
from fusionplan.oracle.reference import run_reference
from fusionplan.tools.verify import ACTIV_PARAMS, TOLERANCE, compare

from .util import bn_backward_args

pytest.importorskip("triton")
from fusionplan.runtime.codegen import interpreter_active  # noqa: E402

pytestmark = pytest.mark.skipif(not interpreter_active(), reason="Triton's interpreter is off (a GPU is present)")

SPATIAL, PER_ACT = BatchNormMode.SPATIAL, BatchNormMode.PER_ACTIVATION
#: the training plans' activations: every mode but PReLU's (a slope, whose gradient no plan gives)
ACTS = [None, *(m for m in ActivationMode if not m.has_slope)]
#: (mode, layout, dtype, running statistics): every activation meets each of these four
SETTINGS = [
    (SPATIAL, "NCHW", torch.float32, True),
    (SPATIAL, "NHWC", torch.float16, False),
    (PER_ACT, "NCHW", torch.float16, True),
    (PER_ACT, "NHWC", torch.float32, False),
]
EPSILON = 1e-5


@pytest.fixture(autouse=True, params=[0, 1], ids=["three-launches", "one-launch"])
def interpreter(request, monkeypatch, tmp_path_factory):
    """Each test on both engines of the training plans."""
    from fusionplan.runtime import tuning

    monkeypatch.setattr(tuning, "BATCHNORM_ONE_LAUNCH", request.param)
    monkeypatch.setenv("FUSIONPLAN_BACKEND", "triton")
    monkeypatch.setenv("FUSIONPLAN_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "fusionplan-cache"))


def data(shape, dtype=torch.float32, layout="NCHW", scale=1.0, shift=0.0, gen=None):
    t = (torch.randn(shape, generator=gen, dtype=torch.float64) * scale + shift).to(dtype)
    return t.contiguous(memory_format=torch.channels_last) if layout == "NHWC" else t


def param_shape(mode, shape):
    return (1, shape[1], 1, 1) if mode == SPATIAL else (1, *shape[1:])


def activ_params(act, backward=False):
    if act == ActivationMode.POWER and backward:
        return 3.0, 0.5, 2.0  # alpha + beta * z kept away from the threshold, where the derivative jumps
    return ACTIV_PARAMS.get(act, (1.0, 0.0, 1.0))


def oracle_forward(x64, scale, bias, mode, act, params):
    """Batch-norm training (biased variance) then the activation, in float64 torch ops."""
    dims = (0, 2, 3) if mode == SPATIAL else (0,)
    mean = x64.mean(dim=dims, keepdim=True)
    var = x64.var(dim=dims, unbiased=False, keepdim=True)
    z = scale * (x64 - mean) / torch.sqrt(var + EPSILON) + bias
    return (z if act is None else activation_forward(act, z, *params)), mean, var


def blend(r, alpha, beta, prior):
    """alpha * r + beta * prior, the prior (NaN where unwritten) read only where beta is not 0."""
    return alpha * r + (beta * prior if beta != 0 else 0.0)


def assert_close(out, ref, dtype):
    c = compare(out, ref)
    assert c.nonfinite == 0, f"{c.nonfinite} elements not finite (unwritten?)"
    assert c.rel_norm < TOLERANCE[dtype], c


def run_forward(x, mode, act, running, y=None, alpha=1.0, beta=0.0, act_blend=(1.0, 0.0), prior=None):
    """The forward plan on x; returns y, the side outputs and the float64 oracle's."""
    pshape = param_shape(mode, x.shape)
    gen = torch.Generator().manual_seed(7)
    scale, bias = torch.randn(pshape, generator=gen) + 1.0, torch.randn(pshape, generator=gen)
    run_mean, run_var = torch.randn(pshape, generator=gen), torch.rand(pshape, generator=gen) + 0.5
    start = run_mean.clone(), run_var.clone()
    saved = torch.full(pshape, float("nan")), torch.full(pshape, float("nan"))
    plan = fp.FusionPlan(fp.TensorDescriptor.from_tensor(x))
    bn = plan.add_batchnorm_forward(mode, running)
    act_op = plan.add_activation_forward(act) if act is not None else None
    handle = fp.Handle("cpu")
    assert plan.compile(handle) == "triton-batchnorm"
    args = fp.OperatorArgs()
    factor = 0.3
    bn_args = fp.BatchNormForwardArgs(
        alpha=alpha,
        beta=beta,
        scale=scale,
        bias=bias,
        saved_mean=saved[0],
        saved_inv_variance=saved[1],
        running_mean=run_mean if running else None,
        running_variance=run_var if running else None,
        exp_avg_factor=factor,
        epsilon=EPSILON,
    )
    args.set(bn, bn_args)
    params = activ_params(act)
    if act_op is not None:
        args.set(
            act_op,
            fp.ActivationArgs(
                alpha=act_blend[0],
                beta=act_blend[1],
                activ_alpha=params[0],
                activ_beta=params[1],
                activ_gamma=params[2],
            ),
        )
    y = torch.full_like(x, float("nan")) if y is None else y
    p64 = (y if prior is None else prior).double()
    plan.execute(handle, x, y, args, prior=prior)
    z, mean, var = oracle_forward(x.double(), scale.double(), bias.double(), mode, None, params)
    ref = blend(z, alpha, beta, p64)
    if act is not None:
        ref = blend(activation_forward(act, ref, *params), *act_blend, p64)
    m = x.numel() // scale.numel()
    expected = {
        "saved mean": (saved[0], mean),
        "saved inverse deviation": (saved[1], torch.rsqrt(var + EPSILON)),
    }
    if running:
        expected["running mean"] = (run_mean, (1 - factor) * start[0].double() + factor * mean)
        expected["running variance"] = (run_var, (1 - factor) * start[1].double() + factor * var * m / (m - 1))
    else:
        assert torch.equal(run_mean, start[0]) and torch.equal(run_var, start[1])
    return y, ref, expected


@pytest.mark.parametrize("setting", SETTINGS, ids=lambda s: f"{s[0].name}-{s[1]}-{s[2]}-running{int(s[3])}")
@pytest.mark.parametrize("act", ACTS, ids=lambda a: "bn" if a is None else a.name)
def test_forward_against_float64(act, setting):
    mode, layout, dtype, running = setting
    x = data((3, 5, 7, 6), dtype, layout, scale=2.0, shift=0.5)
    y, ref, side = run_forward(x, mode, act, running)
    assert_close(y, ref, dtype)
    for name, (got, want) in side.items():
        assert_close(got, want, torch.float32), name


def run_backward(dy, x, mode, act, dx=None, alpha=1.0, beta=0.0, act_blend=(1.0, 0.0), prior=None):
    """The backward plan; returns (dx, dscale, dbias) and float64 autograd's."""
    pshape = param_shape(mode, x.shape)
    gen = torch.Generator().manual_seed(11)
    scale, bias = torch.randn(pshape, generator=gen) + 1.0, torch.randn(pshape, generator=gen)
    params = activ_params(act, backward=True)
    x64 = x.double().requires_grad_(True)
    s64, b64 = scale.double().requires_grad_(True), bias.double().requires_grad_(True)
    out, mean, var = oracle_forward(x64, s64, b64, mode, act, params)
    dx_ref, ds_ref, db_ref = torch.autograd.grad(out, (x64, s64, b64), dy.double())
    dscale, dbias = torch.full(pshape, float("nan")), torch.full(pshape, float("nan"))
    plan = fp.FusionPlan(fp.TensorDescriptor.from_tensor(dy))
    bn = plan.add_batchnorm_backward(mode)
    act_op = plan.add_activation_backward(act) if act is not None else None
    handle = fp.Handle("cpu")
    assert plan.compile(handle) == "triton-batchnorm"
    args = fp.OperatorArgs()
    saved_mean, saved_inv = mean.detach().float(), torch.rsqrt(var.detach() + EPSILON).float()
    args.set(
        bn,
        fp.BatchNormBackwardArgs(
            alpha=alpha,
            beta=beta,
            x=x,
            scale=scale,
            bias=bias,
            result_scale_diff=dscale,
            result_bias_diff=dbias,
            saved_mean=saved_mean,
            saved_inv_variance=saved_inv,
        ),
    )
    if act_op is not None:
        args.set(
            act_op,
            fp.ActivationBackwardArgs(
                alpha=act_blend[0],
                beta=act_blend[1],
                y=None,
                activ_alpha=params[0],
                activ_beta=params[1],
                activ_gamma=params[2],
            ),
        )
    dx = torch.full_like(dy, float("nan")) if dx is None else dx
    p64 = (dx if prior is None else prior).double()
    plan.execute(handle, dy, dx, args, prior=prior)
    if act is not None and act_blend != (1.0, 0.0):  # blended gradient behind the activation: recompute
        dx_ref, ds_ref, db_ref = _blended_backward(x64, s64, b64, mode, act, params, dy, act_blend, p64)
    return (dx, dscale, dbias), (blend(dx_ref, alpha, beta, p64), ds_ref, db_ref)


def _blended_backward(x64, s64, b64, mode, act, params, dy, act_blend, p64):
    """Autograd through batch-norm of the gradient act_alpha * act'(z) * dy + act_beta * prior."""
    z, _, _ = oracle_forward(x64, s64, b64, mode, None, params)
    zd = z.detach().requires_grad_(True)
    (g,) = torch.autograd.grad(activation_forward(act, zd, *params), zd, dy.double())
    g = blend(g, *act_blend, p64)
    return torch.autograd.grad(z, (x64, s64, b64), g)


@pytest.mark.parametrize("setting", SETTINGS, ids=lambda s: f"{s[0].name}-{s[1]}-{s[2]}")
@pytest.mark.parametrize("act", ACTS, ids=lambda a: "bn" if a is None else a.name)
def test_backward_against_float64_autograd(act, setting):
    mode, layout, dtype, _ = setting
    gen = torch.Generator().manual_seed(3)
    x = data((3, 5, 7, 6), dtype, layout, scale=2.0, shift=0.5, gen=gen)
    dy = data((3, 5, 7, 6), dtype, layout, gen=gen)
    got, want = run_backward(dy, x, mode, act)
    for name, g, w in zip(("dx", "dscale", "dbias"), got, want):
        assert_close(g, w, dtype), name


@pytest.mark.parametrize("mode", [SPATIAL, PER_ACT], ids=lambda m: m.name)
def test_alpha_beta_blend_the_prior(mode):
    """alpha/beta on both operators, forward and backward, the prior given or y's own contents (4 images: with
    2, per-activation dx is the cancellation of nearly equal terms, ill-conditioned in fp32)."""
    x = data((4, 6, 5, 4), layout="NHWC", shift=1.0)
    prior = data((4, 6, 5, 4))
    y, ref, _ = run_forward(
        x, mode, ActivationMode.LEAKYRELU, True, alpha=0.5, beta=0.25, act_blend=(2.0, -0.5), prior=prior
    )
    assert_close(y, ref, torch.float32)
    y0 = data((4, 6, 5, 4), layout="NHWC")
    y, ref, _ = run_forward(x, mode, None, False, y=y0.clone(), alpha=1.5, beta=-1.0)
    assert_close(y, ref, torch.float32)
    dy = data((4, 6, 5, 4), layout="NHWC")
    got, want = run_backward(
        dy, x, mode, ActivationMode.ELU, dx=y0.clone(), alpha=0.75, beta=0.5, act_blend=(1.25, 0.5)
    )
    for g, w in zip(got, want):
        assert_close(g, w, torch.float32)


def test_large_mean_keeps_the_variance():
    """Mean 1000, spread 1: a one-pass sum of squares in fp32 would lose every digit of the variance."""
    x = data((4, 3, 16, 12), shift=1000.0, gen=torch.Generator().manual_seed(1))
    y, ref, side = run_forward(x, SPATIAL, None, True)
    # y's error is the fp32 mean's rounding, 1000 * 2^-24 against a spread of 1 (torch's fp32
    # batch_norm: 2.2e-5 on this input), above fp32's 1e-5 tolerance; up to 8e-5 on 12 seeded inputs,
    # 1.2e-4 on one drawn unseeded
    assert compare(y, ref).rel_norm < 1e-4
    got, want = side["saved inverse deviation"]
    assert (got.double() - want).abs().max() / want.abs().max() < 1e-4
    got, want = side["running variance"]
    assert_close(got, want, torch.float32)


@pytest.mark.parametrize(
    "shape, mode, layout, running",
    [
        ((2, 1, 6, 5), SPATIAL, "NCHW", True),  # C=1
        ((7, 9, 1, 1), SPATIAL, "NHWC", True),  # 1x1 planes
        ((5, 17, 1, 1), PER_ACT, "NCHW", True),
        ((1, 4, 13, 11), SPATIAL, "NHWC", True),  # N=1
        ((1, 3, 4, 5), PER_ACT, "NCHW", False),  # N=1 per element: one value, variance 0
        ((2, 3, 16, 16), SPATIAL, "NHWC", False),  # more chunks than a finalize tile
        ((3, 17, 13, 11), SPATIAL, "NCHW", False),
    ],
)
def test_odd_sizes(shape, mode, layout, running):
    x = data(shape, layout=layout, shift=0.3)
    y, ref, side = run_forward(x, mode, ActivationMode.RELU, running)
    assert_close(y, ref, torch.float32)
    for name, (got, want) in side.items():
        assert_close(got, want, torch.float32), name
    dy = data(shape, layout=layout)
    if shape[0] > 1 or mode == SPATIAL:
        got, want = run_backward(dy, x, mode, ActivationMode.RELU)
        for g, w in zip(got, want):
            assert_close(g, w, torch.float32)


def test_strided_views_and_mixed_layouts():
    """An input view with steps on H and C, an output in the other layout."""
    base = data((3, 10, 9, 14), shift=0.2)
    x = base[:, ::2, :, ::2]
    y = torch.full((3, 5, 9, 7), float("nan")).contiguous(memory_format=torch.channels_last)
    out, ref, side = run_forward(x, SPATIAL, ActivationMode.TANH, True, y=y)
    assert_close(out, ref, torch.float32)
    dy = data((3, 5, 9, 7), layout="NHWC")
    dx = torch.full((3, 5, 9, 7), float("nan"))
    got, want = run_backward(dy, x, SPATIAL, ActivationMode.TANH, dx=dx)
    for g, w in zip(got, want):
        assert_close(g, w, torch.float32)


def test_in_place_and_overlapping_outputs():
    """y may be x itself (each element read before it is written); an output overlapping the input
    in other strides goes through a buffer of its own."""
    x = data((2, 4, 6, 6), shift=0.4)
    x_copy = x.clone()
    _, ref, _ = run_forward(x_copy.clone(), SPATIAL, ActivationMode.RELU, False)
    y, _, _ = run_forward(x, SPATIAL, ActivationMode.RELU, False, y=x)
    assert_close(y, ref, torch.float32)


def test_same_bits_run_after_run():
    x = data((4, 6, 9, 7), layout="NHWC", shift=2.0)
    first = run_forward(x, SPATIAL, ActivationMode.ELU, True)
    second = run_forward(x, SPATIAL, ActivationMode.ELU, True)
    assert torch.equal(first[0], second[0])
    for name in first[2]:
        assert torch.equal(first[2][name][0], second[2][name][0]), name


# ---- bad input: a status with its reason, nothing written -----------------------------------------------------
S = mi.miopenStatus_t


@pytest.fixture
def handle():
    h = ok(mi.miopenCreateOnDevice("cpu"))
    yield h
    mi.miopenDestroy(h)


def ok(result):
    status = result[0] if isinstance(result, tuple) else result
    assert status == S.miopenStatusSuccess, mi.miopenGetLastErrorString()
    return result[1] if isinstance(result, tuple) and len(result) == 2 else result


def desc_of(x):
    d = ok(mi.miopenCreateTensorDescriptor())
    ok(mi.miopenSetTensorDescriptor(d, mi.miopenFloat, 4, list(x.shape), list(x.stride())))
    return d


def _forward_plan(handle, x, running=True):
    x_d = desc_of(x)
    plan = ok(mi.miopenCreateFusionPlan(mi.miopenVerticalFusion, x_d))
    bn = ok(mi.miopenCreateOpBatchNormForward(plan, mi.miopenBNSpatial, running))
    act = ok(mi.miopenCreateOpActivationForward(plan, mi.miopenActivationRELU))
    ok(mi.miopenCompileFusionPlan(handle, plan))
    return x_d, plan, bn, act


def _nan(*shape):
    return torch.full(shape, float("nan"))


BAD_FORWARD = {
    "running mean of the wrong shape": dict(running_mean=torch.zeros(4)),
    "running variance of the wrong dtype": dict(running_variance=torch.ones(3, dtype=torch.float64)),
    "expAvgFactor above 1": dict(factor=1.5),
    "expAvgFactor below 0": dict(factor=-0.1),
    "negative epsilon": dict(epsilon=-1.0),
    "running mean missing": dict(running_mean=None),
    "saved mean of the wrong shape": dict(saved_mean=torch.empty(2)),
}


@pytest.mark.parametrize("case", list(BAD_FORWARD), ids=lambda c: c.replace(" ", "-"))
def test_bad_forward_arguments_are_bad_parm(handle, case):
    x = torch.randn(4, 3, 5, 5)
    x_d, plan, bn, act = _forward_plan(handle, x)
    given = {
        "running_mean": torch.zeros(3),
        "running_variance": torch.ones(3),
        "factor": 0.1,
        "epsilon": 1e-5,
        "saved_mean": _nan(3),
    } | BAD_FORWARD[case]
    args = ok(mi.miopenCreateOperatorArgs())
    status = mi.miopenSetOpArgsBatchNormForward(
        args,
        bn,
        1.0,
        0.0,
        torch.ones(3),
        torch.zeros(3),
        given["saved_mean"],
        _nan(3),
        given["running_mean"],
        given["running_variance"],
        given["factor"],
        given["epsilon"],
    )
    assert status == S.miopenStatusBadParm
    assert mi.miopenGetLastErrorString()
    ok(mi.miopenSetOpArgsActivForward(args, act, 1.0, 0.0, 0.0, 0.0, 0.0))
    y = _nan(4, 3, 5, 5)
    assert mi.miopenExecuteFusionPlan(handle, plan, x_d, x, x_d, y, args) != S.miopenStatusSuccess
    assert torch.isnan(y).all()


def test_side_output_overlapping_another_tensor_is_bad_parm(handle):
    x = torch.randn(4, 3, 5, 5)
    x_d, plan, bn, act = _forward_plan(handle, x)
    running = torch.zeros(6)
    y = _nan(4, 3, 5, 5)
    for saved_mean, run_mean, run_var in [
        (running[:3], running[:3], running[3:]),  # saved mean is the running mean
        (y.view(-1)[:3], torch.zeros(3), torch.ones(3)),  # saved mean inside the output
    ]:
        args = ok(mi.miopenCreateOperatorArgs())
        ok(
            mi.miopenSetOpArgsBatchNormForward(
                args, bn, 1.0, 0.0, torch.ones(3), torch.zeros(3), saved_mean, _nan(3), run_mean, run_var, 0.1, 1e-5
            )
        )
        ok(mi.miopenSetOpArgsActivForward(args, act, 1.0, 0.0, 0.0, 0.0, 0.0))
        assert mi.miopenExecuteFusionPlan(handle, plan, x_d, x, x_d, y, args) == S.miopenStatusBadParm
        assert "shares memory" in mi.miopenGetLastErrorString()
        assert torch.isnan(y).all()


def test_bad_backward_arguments_are_bad_parm(handle):
    x = torch.randn(4, 3, 5, 5)
    x_d = desc_of(x)
    plan = ok(mi.miopenCreateFusionPlan(mi.miopenVerticalFusion, x_d))
    bn = ok(mi.miopenCreateOpBatchNormBackward(plan, mi.miopenBNSpatial))
    ok(mi.miopenCompileFusionPlan(handle, plan))
    good = dict(
        x=x,
        scale=torch.ones(3),
        bias=torch.zeros(3),
        dscale=_nan(3),
        dbias=_nan(3),
        mean=torch.zeros(3),
        inv=torch.ones(3),
    )
    bad = {
        "saved mean absent": dict(mean=None),
        "x absent": dict(x=None),
        "x of another shape": dict(x=torch.randn(4, 3, 5, 4)),
        "scale diff of the wrong dtype": dict(dscale=torch.zeros(3, dtype=torch.float64)),
        "saved inverse variance of the wrong shape": dict(inv=torch.ones(1, 3, 2, 1)),
    }
    for name, change in bad.items():
        a = good | change
        args = ok(mi.miopenCreateOperatorArgs())
        status = mi.miopenSetOpArgsBatchNormBackward(
            args, bn, 1.0, 0.0, a["x"], a["scale"], a["bias"], a["dscale"], a["dbias"], a["mean"], a["inv"]
        )
        assert status == S.miopenStatusBadParm, name
        dx = _nan(4, 3, 5, 5)
        assert mi.miopenExecuteFusionPlan(handle, plan, x_d, torch.randn_like(x), x_d, dx, args) != 0, name
        assert torch.isnan(dx).all() and torch.isnan(good["dscale"]).all(), name


def test_explain_names_the_solver():
    x = torch.randn(2, 3, 4, 4)
    for build in (
        lambda p: (p.add_batchnorm_forward(SPATIAL, True), p.add_activation_forward(ActivationMode.RELU)),
        lambda p: (p.add_batchnorm_backward(PER_ACT), p.add_activation_backward(ActivationMode.ELU)),
    ):
        plan = fp.FusionPlan(fp.TensorDescriptor.from_tensor(x))
        build(plan)
        verdicts = {v.solver: v for v in plan.explain(fp.Handle("cpu"))}
        assert verdicts["triton-batchnorm"].applicable
        assert [name for name, v in verdicts.items() if v.applicable] == ["triton-batchnorm"]


def test_numpy_arrays_through_the_layer(handle):
    """Arrays through DLPack, as code outside Python's torch would pass them."""
    x = np.random.default_rng(0).standard_normal((2, 3, 4, 4)).astype(np.float32) + 5.0
    x_d, plan, bn, act = _forward_plan(handle, torch.from_numpy(x), running=False)
    saved = np.full(3, np.nan, np.float32), np.full(3, np.nan, np.float32)
    args = ok(mi.miopenCreateOperatorArgs())
    ok(
        mi.miopenSetOpArgsBatchNormForward(
            args, bn, 1.0, 0.0, np.ones(3, np.float32), np.zeros(3, np.float32), *saved, None, None, 0.1, 1e-5
        )
    )
    ok(mi.miopenSetOpArgsActivForward(args, act, 1.0, 0.0, 0.0, 0.0, 0.0))
    y = np.full_like(x, np.nan)
    ok(mi.miopenExecuteFusionPlan(handle, plan, x_d, x, x_d, y, args))
    np.testing.assert_allclose(saved[0], x.mean(axis=(0, 2, 3)), rtol=1e-5)
    ref = np.maximum(
        (x - x.mean(axis=(0, 2, 3), keepdims=True)) / np.sqrt(x.var(axis=(0, 2, 3), keepdims=True) + 1e-5), 0
    )
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("backend", ["triton", "cpu"])
def test_power_backward_is_zero_below_its_threshold_whatever_dy(backend):
    """The fuzzer's find: an infinite dy where POWER's base is at or below its threshold gave NaN; the
    gradient there is 0, as in the reference, and NaN stays only where the reference has it."""
    x = data((2, 3, 7, 2), shift=0.2)
    dy = data((2, 3, 7, 2))
    xhat = (x - x.mean(dim=(0, 2, 3), keepdim=True)) / x.std(dim=(0, 2, 3), unbiased=False, keepdim=True)
    dy[(xhat < 0.0) & (torch.arange(x.numel()).reshape(x.shape) % 5 == 0)] = float("inf")  # base < 0 there
    plan = fp.FusionPlan(fp.TensorDescriptor.from_tensor(dy))
    bn, act = plan.add_batchnorm_backward(SPATIAL), plan.add_activation_backward(ActivationMode.POWER)
    handle = fp.Handle("cpu")
    plan.compile(handle, backend=backend)
    pshape = (1, 3, 1, 1)
    var, mean = torch.var_mean(x, dim=(0, 2, 3), keepdim=True, unbiased=False)
    outs = torch.full(pshape, float("nan")), torch.full(pshape, float("nan"))
    args = fp.OperatorArgs()
    args.set(
        bn,
        bn_backward_args(
            x, torch.ones(pshape), torch.zeros(pshape), (outs[0], outs[1]), (mean, torch.rsqrt(var + EPSILON))
        ),
    )
    args.set(act, fp.ActivationBackwardArgs(activ_alpha=-0.5, activ_beta=1.0, activ_gamma=2.0))
    dx = torch.full_like(dy, float("nan"))
    plan.execute(handle, dy, dx, args)
    ref = run_reference(plan.ops, dy, [args.get(bn), args.get(act)], None, torch.float64)
    for got, want in (
        (dx, ref.output),
        *zip(outs, (ref.side[(0, "result_scale_diff")], ref.side[(0, "result_bias_diff")])),
    ):
        want = want.reshape(got.shape)
        assert torch.equal(torch.isnan(got), torch.isnan(want)) and torch.equal(torch.isinf(got), torch.isinf(want))


def test_strided_parameters_are_read_as_they_are():
    """scale, bias and the saved statistics with a step of 2 between channels (the shape the plan's
    operator takes, other strides): each read at its own elements, not as one contiguous run."""
    gen = torch.Generator().manual_seed(11)
    x = data((3, 5, 6, 4), layout="NHWC", shift=0.5, gen=gen)
    wide = torch.randn(2, 1, 10, 1, 1, generator=gen, dtype=torch.float64).float()
    wide[0].add_(1.0)
    scale, bias = wide[0, :, ::2], wide[1, :, ::2]
    assert scale.stride(1) == 2
    plan = fp.FusionPlan(fp.TensorDescriptor.from_tensor(x))
    bn = plan.add_batchnorm_forward(SPATIAL, False)
    handle = fp.Handle("cpu")
    assert plan.compile(handle) == "triton-batchnorm"
    saved = torch.full((1, 10, 1, 1), float("nan"))[:, ::2], torch.full((1, 10, 1, 1), float("nan"))[:, ::2]
    args = fp.OperatorArgs()
    args.set(bn, fp.BatchNormForwardArgs(scale=scale, bias=bias, saved_mean=saved[0], saved_inv_variance=saved[1]))
    y = torch.full_like(x, float("nan"))
    plan.execute(handle, x, y, args)
    z, mean, var = oracle_forward(x.double(), scale.double(), bias.double(), SPATIAL, None, None)
    assert_close(y, z, torch.float32)
    assert_close(saved[0], mean, torch.float32)
    dy = data(x.shape, layout="NHWC", gen=gen)
    bplan = fp.FusionPlan(fp.TensorDescriptor.from_tensor(dy))
    bbn = bplan.add_batchnorm_backward(SPATIAL)
    assert bplan.compile(handle) == "triton-batchnorm"
    grads = torch.full((1, 10, 1, 1), float("nan"))[:, ::2], torch.full((1, 10, 1, 1), float("nan"))[:, ::2]
    bargs = fp.OperatorArgs()
    bargs.set(
        bbn,
        bn_backward_args(x, scale, bias, (grads[0], grads[1]), (saved[0], saved[1])),
    )
    dx = torch.full_like(dy, float("nan"))
    bplan.execute(handle, dy, dx, bargs)
    x64, s64, b64 = (t.double().requires_grad_(True) for t in (x, scale, bias))
    out, _, _ = oracle_forward(x64, s64, b64, SPATIAL, None, None)
    want = torch.autograd.grad(out, (x64, s64, b64), dy.double())
    for got, w in zip((dx, *grads), want):
        assert_close(got, w, torch.float32)


def test_output_over_the_input_in_other_strides_blends_its_own_prior():
    """beta != 0 with no prior given: y's contents are the prior, read as they were before the call,
    also where y overlaps x in other strides (the result goes through a buffer of its own)."""
    gen = torch.Generator().manual_seed(5)
    x = data((2, 4, 5, 3), shift=0.3, gen=gen)
    y = x.as_strided(x.shape, x.contiguous(memory_format=torch.channels_last).stride())
    x64, prior64 = x.double().clone(), y.double().clone()
    plan = fp.FusionPlan(fp.TensorDescriptor.from_tensor(x))
    bn = plan.add_batchnorm_forward(SPATIAL, False)
    handle = fp.Handle("cpu")
    assert plan.compile(handle) == "triton-batchnorm"
    scale, bias = torch.rand(1, 4, 1, 1) + 0.5, torch.randn(1, 4, 1, 1)
    args = fp.OperatorArgs()
    args.set(bn, fp.BatchNormForwardArgs(beta=0.5, scale=scale, bias=bias))
    plan.execute(handle, x, y, args)
    z, _, _ = oracle_forward(x64, scale.double(), bias.double(), SPATIAL, None, None)
    assert_close(y, z + 0.5 * prior64, torch.float32)


# ---- the launch templates of repeated geometries (their decisions, without a GPU) -----------------------------
class _Recorder:
    def __init__(self):
        self.calls = []

    def launch(self, pointers):
        self.calls.append(list(pointers))


@pytest.fixture
def template_env(monkeypatch):
    from fusionplan.solvers import triton_batchnorm as tb

    monkeypatch.setattr(tb, "current_raw_stream", lambda: 7)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    return tb


def _template(tb, tensors, recorder):
    y = tensors[0]
    in_place = [t.shape == y.shape and t.stride() == y.stride() for t in tensors]
    return tb._Template([recorder], [tb.extent_bytes(t) for t in tensors], in_place, 7)


def test_a_template_runs_other_tensors_of_its_geometry(template_env):
    tb, rec = template_env, _Recorder()
    y, x, scale = torch.empty(2, 3, 4, 4), torch.randn(2, 3, 4, 4), torch.randn(3)
    template = _template(tb, [y, x, scale], rec)
    others = [torch.empty(2, 3, 4, 4), torch.randn(2, 3, 4, 4), torch.randn(3)]
    assert template.try_launch(others)
    assert rec.calls == [[t.data_ptr() for t in others]]
    assert template.try_launch([others[1], others[1], others[2]])  # in place: y is x, same strides


def test_a_template_refuses_overlap_misalignment_and_another_stream(template_env, monkeypatch):
    tb, rec = template_env, _Recorder()
    y, x, scale = torch.empty(2, 3, 4, 4), torch.randn(2, 3, 4, 4), torch.randn(3)
    template = _template(tb, [y, x, scale], rec)
    base = torch.randn(2 * 3 * 4 * 4 + 8)
    over = base[8:].view(2, 3, 4, 4)
    assert not template.try_launch([over, base[:96].view(2, 3, 4, 4), scale])  # y over x, shifted
    transposed = _template(tb, [y, x.transpose(2, 3), scale], rec)  # a geometry with x in other strides
    assert not transposed.try_launch([x, x.transpose(2, 3), scale])  # y over x, at its address
    assert not template.try_launch([x, torch.randn(2, 3, 4, 4), x.view(-1)[:3]])  # a parameter inside y
    assert not template.try_launch([y, x, base[1:4]])  # 4-byte aligned, not 16
    monkeypatch.setattr(tb, "current_raw_stream", lambda: 8)
    assert not template.try_launch([y, x, scale])
    assert rec.calls == []


def test_template_slots_map_each_argument_to_its_tensor(template_env):
    from types import SimpleNamespace

    tb = template_env
    launcher, kernel = SimpleNamespace(direct=True), object()
    y, x, scale = torch.empty(2, 3, 4, 4), torch.randn(2, 3, 4, 4), torch.randn(1, 3, 1, 1)
    ws = torch.empty(64)
    args = [x, ws[:16], 3, y, scale.reshape(-1), ws[16:], 0.5]
    issued = [(launcher, kernel, (1, 1, 1), args), (launcher, kernel, (2, 1, 1), [ws, y])]
    assert tb._template_slots(issued, [y, x, scale], ws) == [[(3,), (0,), (4,)], [(1,), (), ()]]
    assert tb._template_slots(issued, [y, y, scale], ws) is None  # two slots at one address
    copied = [(launcher, kernel, (1, 1, 1), [x, y, scale.clone().view(-1)])]
    assert tb._template_slots(copied, [y, x, scale], ws) is None  # a stand-in, not the tensor
    uncompiled = [(launcher, None, (1, 1, 1), [x, y])]
    assert tb._template_slots(uncompiled, [y, x], ws) is None


@pytest.mark.parametrize("backend", ["triton", "cpu"])
def test_a_repeated_infinity_keeps_the_mean_infinite(backend):
    """The fuzzer's find (seed 61): a feature whose element slot met -inf twice had a NaN mean, the
    slot's step being -inf - -inf; the exact mean is -inf (and NaN with both infinities)."""
    x = data((64, 3, 8, 8))
    x[:, 1, 0, 0] = float("-inf")  # rows 64 apart: the same element slot again and again
    x[0, 2, 1, 1], x[1, 2, 3, 0] = float("inf"), float("-inf")  # opposite infinities: NaN
    plan = fp.FusionPlan(fp.TensorDescriptor.from_tensor(x))
    bn = plan.add_batchnorm_forward(SPATIAL, True)
    handle = fp.Handle("cpu")
    plan.compile(handle, backend=backend)
    pshape = (1, 3, 1, 1)
    saved = torch.full(pshape, float("nan")), torch.full(pshape, float("nan"))
    running = torch.zeros(pshape), torch.ones(pshape)
    args = fp.OperatorArgs()
    args.set(bn, fp.BatchNormForwardArgs(scale=torch.ones(pshape), bias=torch.zeros(pshape), saved_mean=saved[0],
                                         saved_inv_variance=saved[1], running_mean=running[0],
                                         running_variance=running[1], exp_avg_factor=0.5))  # fmt: skip
    plan.execute(handle, x, torch.empty_like(x), args)
    want = x.double().mean(dim=(0, 2, 3))
    assert want[1].item() == float("-inf") and torch.isnan(want[2])
    got = saved[0].reshape(-1)
    assert torch.equal(torch.isnan(got), torch.isnan(want)) and torch.equal(torch.isinf(got), torch.isinf(want)), got
    torch.testing.assert_close(got[0].double(), want[0], rtol=1e-5, atol=1e-6)
    assert running[0].reshape(-1)[1].item() == float("-inf")
