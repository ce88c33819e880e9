"""The idiomatic API: plans from tensors, callables, context manager, one-call CBA with its cache."""

import pytest
import torch

import fusionplan as fp
from fusionplan import api
from fusionplan.oracle.reference import run_reference


def test_plan_from_tensors_is_callable():
    x = torch.randn(2, 3, 13, 11).to(memory_format=torch.channels_last)
    w, b = torch.randn(8, 3, 3, 3), torch.randn(8)
    scale, shift, mean, var = torch.randn(8), torch.randn(8), torch.randn(8), torch.rand(8) + 0.5
    plan = fp.Plan(x).conv(w, stride=2, padding=1).bias(b).batchnorm(scale, shift, mean, var, eps=1e-5).relu()
    y = plan(x)
    assert y.is_contiguous(memory_format=torch.channels_last) and y.shape == (2, 8, 7, 6)
    ref = torch.relu(
        torch.nn.functional.batch_norm(
            torch.nn.functional.conv2d(x.double(), w.double(), b.double(), 2, 1),
            mean.double(),
            var.double(),
            scale.double(),
            shift.double(),
            False,
            0.0,
            1e-5,
        )
    )
    torch.testing.assert_close(y.double(), ref, rtol=1e-5, atol=1e-5)
    assert plan.solver == "cpu-folded" and plan.kernel_source() is None
    from fusionplan import solvers

    assert [v.solver for v in plan.explain()] == [s.name for s in solvers.REGISTRY]
    out = torch.full_like(y, float("nan"))
    assert plan(x, out=out) is out and torch.equal(out, y)


def test_update_arguments_without_recompile():
    x = torch.randn(1, 4, 6, 6)
    plan = fp.Plan(x).conv(torch.randn(4, 4, 1, 1)).activation("leakyrelu", activ_alpha=0.2)
    plan(x)
    w2 = torch.randn(4, 4, 1, 1)
    plan.update(0, weight=w2).update(1, activ_alpha=0.5)
    pre = torch.nn.functional.conv2d(x, w2)
    torch.testing.assert_close(plan(x), torch.where(pre > 0, pre, 0.5 * pre))


def test_descriptors_bind_later_and_missing_arguments_are_reported():
    x = torch.randn(1, 4, 6, 6)
    plan = fp.Plan(x).conv(fp.TensorDescriptor.packed("float", (4, 4, 3, 3)), padding=1).relu()
    with pytest.raises(fp.MissingArgumentError):
        plan(x)
    with pytest.raises(fp.BadParmError, match="weight"):
        plan.update(0)
    plan.update(0, weight=torch.randn(4, 4, 3, 3))
    assert plan(x).shape == (1, 4, 6, 6)


def test_context_manager_compiles_on_exit():
    x = torch.randn(1, 3, 5, 5)
    with fp.Plan(x, backend="reference") as plan:
        plan.bias(torch.randn(3)).activation(fp.ActivationMode.ABS)
    assert plan.core.is_compiled(plan.handle) and plan.solver == "reference"
    torch.testing.assert_close(plan(x), (x + plan.args.get(plan.core.ops[0]).bias).abs())


def test_builder_errors_are_typed():
    x = torch.randn(1, 3, 5, 5)
    with pytest.raises(fp.BadParmError, match="filter channels"):
        fp.Plan(x).conv(torch.randn(4, 2, 3, 3))
    with pytest.raises(fp.UnsupportedOpError):
        fp.Plan(x).conv(torch.randn(4, 3, 1, 1)).conv(torch.randn(4, 4, 1, 1))
    with pytest.raises(fp.BadParmError, match="activation mode"):
        fp.Plan(x).activation("swish")


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_conv_bias_activation_one_call_and_cache(layout):
    handle = fp.Handle("cpu")
    plans = handle.cache("one-call plans", api.PLAN_CACHE_SIZE)
    x = torch.randn(2, 4, 9, 7)
    if layout == "NHWC":
        x = x.to(memory_format=torch.channels_last)
    w, b, z = torch.randn(6, 4, 3, 3), torch.randn(6), torch.randn(2, 6, 9, 7)
    y = fp.conv_bias_activation(x, w, b, padding=1, activation="elu", alpha1=0.5, alpha2=2.0, z=z, handle=handle)
    pre = (
        0.5 * torch.nn.functional.conv2d(x.double(), w.double(), padding=1)
        + 2.0 * z.double()
        + b.double().view(1, -1, 1, 1)
    )
    torch.testing.assert_close(y.double(), torch.where(pre > 0, pre, torch.expm1(pre)), rtol=1e-5, atol=1e-5)
    for _ in range(3):
        fp.conv_bias_activation(
            torch.randn_like(x),
            torch.randn_like(w),
            torch.randn(6),
            padding=1,
            activation="elu",
            alpha2=1.0,
            z=z,
            handle=handle,
        )
    assert len(plans) == 1  # same descriptors: one compiled plan
    fp.conv_bias_activation(x, w, None, padding=1, activation="relu", handle=handle)
    assert len(plans) == 2
    fp.conv_bias_activation(x, w, None, padding=1, activation="relu")
    assert len(plans) == 2  # the default handle's plans are its own
    handle.clear_caches()
    assert len(plans) == 0
    with pytest.raises(fp.BadParmError, match="z"):
        fp.conv_bias_activation(x, w, b, padding=1, alpha2=1.0)


def test_conv_bias_activation_reuses_its_records_and_sees_in_place_changes():
    """Calls with the same weight and bias reuse one argument set (the kernel's derived data is
    found again); an in-place change of the weight is still seen (its version counter)."""
    x, w, b = torch.randn(2, 4, 9, 7), torch.randn(6, 4, 3, 3), torch.randn(6)

    def reference():
        return torch.relu(torch.nn.functional.conv2d(x.double(), w.double(), b.double(), padding=1))

    y0 = fp.conv_bias_activation(x, w, b, padding=1)
    arguments = api.default_handle("cpu").cache("one-call arguments", api.ARGS_CACHE_SIZE)
    records = len(arguments)
    y1 = fp.conv_bias_activation(x, w, b, padding=1)
    assert len(arguments) == records  # the same tensors: the same records
    torch.testing.assert_close(y1, y0)
    w.mul_(-1.0)
    torch.testing.assert_close(fp.conv_bias_activation(x, w, b, padding=1).double(), reference(), rtol=1e-5, atol=1e-5)
    fp.conv_bias_activation(x, w.clone(), b, padding=1)
    assert len(arguments) == records + 1  # another weight tensor: records of its own
    # descriptors are reused by what makes them; an unhashable argument still works (made each time)
    torch.testing.assert_close(
        fp.conv_bias_activation(x, w, b, padding=[1, 1]), fp.conv_bias_activation(x, w, b, padding=1)
    )
    with pytest.raises(fp.BadParmError, match="padding"):
        fp.conv_bias_activation(x, w, b, padding=(1, 1, 1))


def test_plan_with_explicit_prior_matches_reference():
    x = torch.randn(1, 2, 4, 4)
    plan = fp.Plan(x).bias(torch.randn(2), beta=0.5).activation("tanh", activ_alpha=1.0, activ_beta=2.0, beta=-1.0)
    y = torch.randn(1, 2, 4, 4)
    prior = y.clone()
    plan(x, out=y)
    ops = plan.core.ops
    ref = run_reference(ops, x, [plan.args.get(op) for op in ops], prior).output
    torch.testing.assert_close(y.double(), ref, rtol=1e-6, atol=1e-6)
