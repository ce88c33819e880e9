"""Training plans: batch-norm forward (+ activation) and their backward, against torch autograd."""

import pytest
import torch
import torch.nn.functional as F

import fusionplan as fp
from fusionplan.core.activations import activation_forward
from fusionplan.core.enums import ActivationMode, BatchNormMode

from .util import ACTIV_PARAMS, bn_backward_args, bn_forward_args, make_input


def param_shape(mode, x):
    return (1, x.shape[1], 1, 1) if mode == BatchNormMode.SPATIAL else (1, *x.shape[1:])


def torch_bn_training(x, scale, bias, mode, eps):
    dims = (0, 2, 3) if mode == BatchNormMode.SPATIAL else (0,)
    mean = x.mean(dim=dims, keepdim=True)
    var = x.var(dim=dims, unbiased=False, keepdim=True)
    return scale * (x - mean) / torch.sqrt(var + eps) + bias, mean, var


def forward_plan(x, mode, act, running):
    plan = fp.FusionPlan(fp.TensorDescriptor.from_tensor(x))
    bn = plan.add_batchnorm_forward(mode, running)
    ops = [bn]
    if act is not None:
        ops.append(plan.add_activation_forward(act))
    return plan, ops


@pytest.mark.parametrize("mode", list(BatchNormMode))
@pytest.mark.parametrize(
    "act", [None, ActivationMode.RELU, ActivationMode.ELU, ActivationMode.TANH, ActivationMode.POWER]
)
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_batchnorm_forward_training(mode, act, layout):
    x = make_input((4, 5, 6, 3), torch.float32, layout) + 0.7
    pshape = param_shape(mode, x)
    scale, bias = torch.randn(pshape), torch.randn(pshape)
    run_mean, run_var = torch.randn(pshape), torch.rand(pshape) + 0.5
    run_mean0, run_var0 = run_mean.clone(), run_var.clone()
    saved_mean, saved_inv = torch.full(pshape, float("nan")), torch.full(pshape, float("nan"))
    eps, factor = 1e-5, 0.3
    plan, ops = forward_plan(x, mode, act, True)
    handle = fp.Handle("cpu")
    assert plan.compile(handle) == "cpu-training"
    args = fp.OperatorArgs()
    args.set(
        ops[0],
        bn_forward_args(scale, bias, (saved_mean, saved_inv), (run_mean, run_var), exp_avg_factor=factor, epsilon=eps),
    )
    a, b, g = ACTIV_PARAMS.get(act, (1.0, 0.0, 1.0))
    if act is not None:
        args.set(ops[1], fp.ActivationArgs(activ_alpha=a, activ_beta=b, activ_gamma=g))
    y = torch.full(x.shape, float("nan"))
    plan.execute(handle, x, y, args)

    x64 = x.double()
    ref, mean, var = torch_bn_training(x64, scale.double(), bias.double(), mode, eps)
    if act is not None:
        ref = activation_forward(act, ref, a, b, g)
    torch.testing.assert_close(y.double(), ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(saved_mean.double(), mean, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(saved_inv.double(), torch.rsqrt(var + eps), rtol=1e-5, atol=1e-6)
    m = x.numel() // scale.numel()
    torch.testing.assert_close(
        run_mean.double(), (1 - factor) * run_mean0.double() + factor * mean, rtol=1e-5, atol=1e-6
    )
    torch.testing.assert_close(
        run_var.double(), (1 - factor) * run_var0.double() + factor * var * m / (m - 1), rtol=1e-5, atol=1e-6
    )


def test_spatial_training_matches_torch_batch_norm():
    x = torch.randn(8, 3, 5, 5)
    rm, rv = torch.zeros(3), torch.ones(3)
    rm_t, rv_t = rm.clone(), rv.clone()
    w, b = torch.randn(3), torch.randn(3)
    expected = F.batch_norm(x, rm_t, rv_t, w, b, training=True, momentum=0.1, eps=1e-5)
    plan, ops = forward_plan(x, BatchNormMode.SPATIAL, None, True)
    handle = fp.Handle("cpu")
    plan.compile(handle)
    args = fp.OperatorArgs()
    args.set(
        ops[0],
        bn_forward_args(w, b, (None, None), (rm, rv), exp_avg_factor=0.1, epsilon=1e-5),
    )
    y = torch.empty_like(x)
    plan.execute(handle, x, y, args)
    torch.testing.assert_close(y, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(rm, rm_t)
    torch.testing.assert_close(rv, rv_t)


def test_running_statistics_required_when_requested():
    x = torch.randn(2, 3, 4, 4)
    plan, ops = forward_plan(x, BatchNormMode.SPATIAL, None, True)
    with pytest.raises(fp.BadParmError, match="running_mean is required"):
        fp.OperatorArgs().set(ops[0], fp.BatchNormForwardArgs(scale=torch.ones(3), bias=torch.zeros(3)))
    plan2, ops2 = forward_plan(x, BatchNormMode.SPATIAL, None, False)
    fp.OperatorArgs().set(ops2[0], fp.BatchNormForwardArgs(scale=torch.ones(3), bias=torch.zeros(3)))
    with pytest.raises(fp.BadParmError, match="expAvgFactor"):
        fp.OperatorArgs().set(
            ops2[0], fp.BatchNormForwardArgs(scale=torch.ones(3), bias=torch.zeros(3), exp_avg_factor=2.0)
        )


@pytest.mark.parametrize("mode", list(BatchNormMode))
@pytest.mark.parametrize("act", [None, *(m for m in ActivationMode if not m.has_slope)])  # PReLU: refused
def test_backward_matches_autograd(mode, act):
    """[BN backward, activation backward] is the backward of [BN forward training, activation forward]."""
    torch.manual_seed(int(mode) * 31 + (0 if act is None else int(act) + 1))
    x = (torch.randn(4, 3, 5, 4, dtype=torch.float64) + 0.3).requires_grad_(True)
    pshape = param_shape(mode, x)
    scale = torch.randn(pshape, dtype=torch.float64).requires_grad_(True)
    bias = torch.randn(pshape, dtype=torch.float64).requires_grad_(True)
    eps = 1e-5
    z, mean, var = torch_bn_training(x, scale, bias, mode, eps)
    a, b, g = ACTIV_PARAMS.get(act, (1.0, 0.0, 1.0))
    if act == ActivationMode.POWER:
        a, b, g = 3.0, 0.5, 2.0  # keep alpha + beta*z away from the threshold
    y = z if act is None else activation_forward(act, z, a, b, g)
    if act == ActivationMode.HARDSIGMOID:  # torch's own backward takes float32's 1/6 in float64 too
        y = torch.clamp(z / 6 + 0.5, 0, 1)
    dy = torch.randn_like(y)
    dx_ref, dscale_ref, dbias_ref = torch.autograd.grad(y, (x, scale, bias), dy)

    plan = fp.FusionPlan(fp.TensorDescriptor.from_tensor(dy))
    bn_op = plan.add_batchnorm_backward(mode)
    act_op = plan.add_activation_backward(act) if act is not None else None
    handle = fp.Handle("cpu")
    plan.compile(handle)
    dscale, dbias = (
        torch.full(pshape, float("nan"), dtype=torch.float64),
        torch.full(pshape, float("nan"), dtype=torch.float64),
    )
    args = fp.OperatorArgs()
    args.set(
        bn_op,
        bn_backward_args(
            x.detach(), scale.detach(), bias.detach(), (dscale, dbias), (mean.detach(), torch.rsqrt(var.detach() + eps))
        ),
    )
    if act_op is not None:
        args.set(act_op, fp.ActivationBackwardArgs(y=y.detach(), activ_alpha=a, activ_beta=b, activ_gamma=g))
    dx = torch.full_like(dy, float("nan"))
    plan.execute(handle, dy, dx, args)
    torch.testing.assert_close(dx, dx_ref, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(dscale, dscale_ref, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(dbias, dbias_ref, rtol=1e-9, atol=1e-9)


def test_backward_in_float32_and_half():
    for dtype, tol in ((torch.float32, 1e-5), (torch.float16, 1e-2)):
        x = torch.randn(4, 3, 5, 4).to(dtype)
        dy = torch.randn(4, 3, 5, 4).to(dtype)
        plan = fp.FusionPlan(fp.TensorDescriptor.from_tensor(dy))
        bn_op = plan.add_batchnorm_backward(BatchNormMode.SPATIAL)
        act_op = plan.add_activation_backward(ActivationMode.RELU)
        handle = fp.Handle("cpu")
        plan.compile(handle)
        x64 = x.double().requires_grad_(True)
        scale, bias = torch.randn(1, 3, 1, 1), torch.randn(1, 3, 1, 1)
        z, mean, var = torch_bn_training(x64, scale.double(), bias.double(), BatchNormMode.SPATIAL, 1e-5)
        (dx_ref,) = torch.autograd.grad(torch.relu(z), x64, dy.double())
        args = fp.OperatorArgs()
        args.set(
            bn_op,
            bn_backward_args(
                x,
                scale,
                bias,
                (torch.empty(3), torch.empty(3)),
                (mean.detach().float(), torch.rsqrt(var.detach() + 1e-5).float()),
            ),
        )
        args.set(act_op, fp.ActivationBackwardArgs())
        dx = torch.full_like(dy, float("nan"))
        plan.execute(handle, dy, dx, args)
        err = (dx.double() - dx_ref).norm() / dx_ref.norm()
        assert err < tol


def test_backward_requires_saved_statistics():
    plan = fp.FusionPlan(fp.TensorDescriptor.packed("float", (2, 3, 4, 4)))
    op = plan.add_batchnorm_backward(BatchNormMode.SPATIAL)
    with pytest.raises(fp.BadParmError, match="saved_mean is required"):
        fp.OperatorArgs().set(
            op,
            fp.BatchNormBackwardArgs(
                x=torch.randn(2, 3, 4, 4),
                scale=torch.ones(3),
                bias=torch.zeros(3),
                result_scale_diff=torch.empty(3),
                result_bias_diff=torch.empty(3),
            ),
        )
    with pytest.raises(fp.BadParmError, match="x"):
        fp.OperatorArgs().set(op, fp.BatchNormBackwardArgs(x=torch.randn(2, 3, 4, 5)))


@pytest.mark.parametrize(
    "moved_mb, programs, one_launch",
    [
        (4.8, 128, True),  # 32x512x7x7 fp16 NCHW forward: 4 features a program
        (8.0, 128, True),  # 32x512x7x7 fp16 NCHW backward
        (19.3, 128, True),  # 32x2048x7x7 fp16 NHWC forward: 16 features a program
        (38.5, 4, False),  # 32x64x56x56 fp16 NHWC forward: four programs stream 13 MB each
        (154.0, 16, False),  # 32x64x112x112 fp16 NCHW forward
        (9.6, 64, False),  # 32x256x14x14 fp16 NCHW forward
    ],
)
def test_the_engine_cost_model(moved_mb, programs, one_launch):
    """tuning.batchnorm_one_launch on shapes of the suite it was fitted on (H200: 132 multiprocessors)."""
    from fusionplan.runtime import tuning

    assert tuning.batchnorm_one_launch(int(moved_mb * 1e6), programs, 132) is one_launch


def test_the_engine_override_wins_over_the_cost_model(monkeypatch):
    from fusionplan.runtime import tuning
    from fusionplan.solvers.triton_batchnorm import choose_config

    for value, expected in ((0, False), (1, True)):
        monkeypatch.setattr(tuning, "BATCHNORM_ONE_LAUNCH", value)
        assert choose_config(True, 512, 1568, 4_800_000, 132).one_launch is expected
    monkeypatch.setattr(tuning, "BATCHNORM_ONE_LAUNCH", -1)
    assert choose_config(False, 512, 1568, 4_800_000, 132).one_launch
    assert not choose_config(True, 64, 100352, 38_500_000, 132).one_launch
