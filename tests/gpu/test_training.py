"""The training plans on the GPU (triton-batchnorm): every dtype and layout, both modes, odd shapes,
the same bits run after run, and tensors past 32-bit offsets.

python -m pytest -m gpu tests/gpu/test_training.py -n 8
"""

from __future__ import annotations

import pytest
import torch

import fusionplan as fp
from fusionplan.core.enums import ActivationMode, BatchNormMode
from fusionplan.oracle.reference import run_reference
from fusionplan.runtime import tuning
from fusionplan.tools.verify import TOLERANCE, compare

from ..util import bn_backward_args, bn_forward_args

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

SPATIAL, PER_ACT = BatchNormMode.SPATIAL, BatchNormMode.PER_ACTIVATION
SHAPES = [
    (32, 64, 56, 56),
    (32, 2048, 7, 7),
    (3, 17, 13, 11),
    (1, 3, 224, 224),
    (7, 1, 5, 5),
    (64, 160, 1, 1),
    (2, 320, 7, 7),
]


def tensor(shape, dtype, layout, shift=0.0, scale=1.0):
    t = (torch.randn(shape, device="cuda") * scale + shift).to(dtype)
    return t.contiguous(memory_format=torch.channels_last) if layout == "NHWC" else t


def forward(x, mode, act, running=True):
    pshape = (1, x.shape[1], 1, 1) if mode == SPATIAL else (1, *x.shape[1:])
    plan = fp.FusionPlan(fp.TensorDescriptor.from_tensor(x))
    ops = [plan.add_batchnorm_forward(mode, running)]
    if act is not None:
        ops.append(plan.add_activation_forward(act))
    handle = fp.Handle("cuda")
    assert plan.compile(handle) == "triton-batchnorm"
    scale, bias = torch.rand(pshape, device="cuda") + 0.5, torch.randn(pshape, device="cuda")
    stats = [torch.full(pshape, float("nan"), device="cuda") for _ in range(2)]
    run = [torch.zeros(pshape, device="cuda"), torch.ones(pshape, device="cuda")] if running else [None, None]
    args = fp.OperatorArgs()
    args.set(
        ops[0],
        bn_forward_args(scale, bias, (stats[0], stats[1]), (run[0], run[1]), exp_avg_factor=0.1),
    )
    if act is not None:
        args.set(ops[1], fp.ActivationArgs(activ_alpha=0.3))
    base = ops[0].check_args(
        fp.BatchNormForwardArgs(
            scale=scale,
            bias=bias,
            running_mean=None if not running else run[0].clone(),
            running_variance=None if not running else run[1].clone(),
            exp_avg_factor=0.1,
        )
    )
    records = [base] + [args.get(op) for op in ops[1:]]
    y = torch.full_like(x, float("nan"))
    plan.execute(handle, x, y, args)
    ref = run_reference(plan.ops, x, records, None, torch.float64)
    return plan, handle, args, y, stats, run, ref


def assert_close(got, want, dtype):
    c = compare(got, want.reshape(got.shape))
    assert c.nonfinite == 0 and c.rel_norm < TOLERANCE[dtype], c


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("mode", [SPATIAL, PER_ACT], ids=lambda m: m.name)
@pytest.mark.parametrize("engine", [0, 1], ids=["three-launches", "one-launch"])
def test_forward_and_backward_against_float64(shape, dtype, layout, mode, engine, monkeypatch):
    monkeypatch.setattr(tuning, "BATCHNORM_ONE_LAUNCH", engine)
    x = tensor(shape, dtype, layout, shift=0.5, scale=2.0)
    if mode == PER_ACT and shape[0] < 2:
        pytest.skip("per-activation running statistics need 2 images")
    _, handle, _, y, stats, run, ref = forward(x, mode, ActivationMode.LEAKYRELU)
    assert_close(y, ref.output, dtype)
    for t, name in zip((*stats, *run), ("saved_mean", "saved_inv_variance", "running_mean", "running_variance")):
        assert_close(t, ref.side[(0, name)], torch.float32)
    dy = tensor(shape, dtype, layout)
    plan = fp.FusionPlan(fp.TensorDescriptor.from_tensor(dy))
    bn, act = plan.add_batchnorm_backward(mode), plan.add_activation_backward(ActivationMode.LEAKYRELU)
    assert plan.compile(handle) == "triton-batchnorm"
    pshape = stats[0].shape
    grads = [torch.full(pshape, float("nan"), device="cuda") for _ in range(2)]
    scale, bias = torch.rand(pshape, device="cuda") + 0.5, torch.randn(pshape, device="cuda")
    args = fp.OperatorArgs()
    args.set(
        bn,
        bn_backward_args(x, scale, bias, (grads[0], grads[1]), (stats[0], stats[1])),
    )
    args.set(act, fp.ActivationBackwardArgs(activ_alpha=0.3))
    dx = torch.full_like(dy, float("nan"))
    plan.execute(handle, dy, dx, args)
    ref = run_reference(plan.ops, dy, [args.get(bn), args.get(act)], None, torch.float64)
    assert_close(dx, ref.output, dtype)
    assert_close(grads[0], ref.side[(0, "result_scale_diff")], dtype)
    assert_close(grads[1], ref.side[(0, "result_bias_diff")], dtype)


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_same_bits_run_after_run(layout):
    x = tensor((32, 256, 28, 28), torch.float16, layout, shift=3.0)
    plan, handle, args, y, stats, _, _ = forward(x, SPATIAL, ActivationMode.RELU, running=False)
    first = y.clone(), stats[0].clone(), stats[1].clone()
    for _ in range(5):
        plan.execute(handle, x, y, args)
        assert torch.equal(y, first[0]) and torch.equal(stats[0], first[1]) and torch.equal(stats[1], first[2])


@pytest.mark.parametrize("layout", ["NHWC", "NCHW"])
def test_training_past_int32_offsets(layout, gigabytes):
    """Forward and backward on fp16 tensors of 2.2e9 elements (4.4 GB each): statistics against
    torch's float64 per-channel sums, y and dx checked image slice by image slice."""
    shape = (33, 4, 4096, 4096)
    x = tensor(shape, torch.float16, layout, shift=1.0)
    assert x.numel() > 2**31
    plan, handle, args, y, stats, _, _ = _forward_only(x)
    x64_mean = torch.stack([x[:, c].double().mean() for c in range(shape[1])])
    x64_var = torch.stack([x[:, c].double().var(unbiased=False) for c in range(shape[1])])
    torch.testing.assert_close(stats[0].reshape(-1).double(), x64_mean, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(stats[1].reshape(-1).double(), torch.rsqrt(x64_var + 1e-5), rtol=1e-4, atol=1e-5)
    scale, bias = (args.get(plan.ops[0]).scale.reshape(1, -1, 1, 1), args.get(plan.ops[0]).bias.reshape(1, -1, 1, 1))
    mean, inv = stats[0].reshape(1, -1, 1, 1), stats[1].reshape(1, -1, 1, 1)
    for n in range(0, shape[0], 4):
        part = slice(n, n + 4)
        want = torch.relu((x[part].float() - mean) * inv * scale + bias)
        c = compare(y[part], want.double())
        assert c.nonfinite == 0 and c.rel_norm < 1e-2, (n, c)
    del y
    torch.cuda.empty_cache()
    dy = tensor(shape, torch.float16, layout)
    bplan = fp.FusionPlan(fp.TensorDescriptor.from_tensor(dy))
    bn, act = bplan.add_batchnorm_backward(SPATIAL), bplan.add_activation_backward(ActivationMode.RELU)
    assert bplan.compile(handle) == "triton-batchnorm"
    grads = [torch.full((1, shape[1], 1, 1), float("nan"), device="cuda") for _ in range(2)]
    bargs = fp.OperatorArgs()
    bargs.set(
        bn,
        bn_backward_args(x, scale, bias, (grads[0], grads[1]), (mean, inv)),
    )
    bargs.set(act, fp.ActivationBackwardArgs())
    dx = torch.full_like(dy, float("nan"))
    bplan.execute(handle, dy, dx, bargs)
    dbias = torch.zeros(shape[1], dtype=torch.float64, device="cuda")
    dscale = torch.zeros_like(dbias)
    for n in range(shape[0]):
        xhat = (x[n : n + 1].float() - mean) * inv
        g = dy[n : n + 1].float() * ((xhat * scale + bias) > 0)
        dbias += g.double().sum(dim=(0, 2, 3))
        dscale += (g * xhat).double().sum(dim=(0, 2, 3))
    torch.testing.assert_close(grads[1].reshape(-1).double(), dbias, rtol=1e-3, atol=1e-2)
    torch.testing.assert_close(grads[0].reshape(-1).double(), dscale, rtol=1e-3, atol=1e-2)
    m = x.numel() // shape[1]
    for n in range(0, shape[0], 4):
        part = slice(n, n + 4)
        xhat = (x[part].float() - mean) * inv
        g = dy[part].float() * ((xhat * scale + bias) > 0)
        want = scale * inv * (g - (dbias.float() / m).view(1, -1, 1, 1) - xhat * (dscale.float() / m).view(1, -1, 1, 1))
        c = compare(dx[part], want.double())
        assert c.nonfinite == 0 and c.rel_norm < 1e-2, (n, c)


def _forward_only(x):
    pshape = (1, x.shape[1], 1, 1)
    plan = fp.FusionPlan(fp.TensorDescriptor.from_tensor(x))
    ops = [plan.add_batchnorm_forward(SPATIAL, False), plan.add_activation_forward(ActivationMode.RELU)]
    handle = fp.Handle("cuda")
    assert plan.compile(handle) == "triton-batchnorm"
    stats = [torch.full(pshape, float("nan"), device="cuda") for _ in range(2)]
    args = fp.OperatorArgs()
    args.set(
        ops[0],
        fp.BatchNormForwardArgs(
            scale=torch.rand(pshape, device="cuda") + 0.5,
            bias=torch.randn(pshape, device="cuda"),
            saved_mean=stats[0],
            saved_inv_variance=stats[1],
        ),
    )
    args.set(ops[1], fp.ActivationArgs())
    y = torch.full_like(x, float("nan"))
    plan.execute(handle, x, y, args)
    return plan, handle, args, y, stats, None, None


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_reruns_take_new_tensors_and_edited_arguments(layout):
    """Repeated executes go through the bound launches: other inputs and outputs of the same geometry,
    parameters edited in place, and an output over the input (which the bound launches refuse)."""
    x = tensor((8, 24, 9, 10), torch.float16, layout, shift=1.0)
    plan, handle, args, y, stats, _, _ = _forward_only(x)
    bn = args.get(plan.ops[0])
    for step in range(4):
        x2 = tensor(x.shape, torch.float16, layout, shift=float(step))
        y2 = torch.full_like(x2, float("nan"))
        if step == 2:
            bn.scale.mul_(2.0)
        if step == 3:
            y2 = x2
        want = torch.relu(
            torch.nn.functional.batch_norm(
                x2.double(), None, None, bn.scale.reshape(-1).double(), bn.bias.reshape(-1).double(), True, 0.0, 1e-5
            )
        )
        want_mean = x2.double().mean(dim=(0, 2, 3))  # before y2 (at step 3, x2 itself) is written
        plan.execute(handle, x2, y2, args)
        assert_close(y2, want, torch.float16)
        assert_close(stats[0], want_mean, torch.float32)


def _step_args(plan, x, direction):
    """A new argument record on new parameter and statistics tensors, as a framework's step makes."""
    c = x.shape[1]
    scale, bias = torch.rand(c, device="cuda") + 0.5, torch.randn(c, device="cuda")
    args = fp.OperatorArgs()
    if direction == "forward":
        saved = [torch.full((c,), float("nan"), device="cuda") for _ in range(2)]
        args.set(
            plan.ops[0],
            fp.BatchNormForwardArgs(scale=scale, bias=bias, saved_mean=saved[0], saved_inv_variance=saved[1]),
        )
        args.set(plan.ops[1], fp.ActivationArgs())
        return args, (scale, bias, saved)
    var, mean = torch.var_mean(x.float(), dim=(0, 2, 3), unbiased=False)
    grads = [torch.full((c,), float("nan"), device="cuda") for _ in range(2)]
    args.set(
        plan.ops[0],
        bn_backward_args(x, scale, bias, (grads[0], grads[1]), (mean, torch.rsqrt(var + 1e-5))),
    )
    args.set(plan.ops[1], fp.ActivationBackwardArgs())
    return args, (scale, bias, grads)


def _step_oracle(x, dy, scale, bias):
    x64, s64, b64 = (t.double().requires_grad_(True) for t in (x, scale, bias))
    y = torch.relu(torch.nn.functional.batch_norm(x64, None, None, s64, b64, True, 0.0, 1e-5))
    return (y.detach(), x64.detach().mean(dim=(0, 2, 3))), torch.autograd.grad(y, (x64, s64, b64), dy.double())


@pytest.mark.parametrize("direction", ["forward", "backward"])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_new_records_each_step_reuse_the_geometrys_launches(direction, layout, monkeypatch):
    """A framework's step: new tensors and a new argument record at every call, one geometry. The
    launches run bound after the first call; every step is right, also one on another stream and
    one whose output overlaps its input (both run unbound)."""
    from fusionplan.solvers import triton_batchnorm as tb

    shape = (8, 24, 9, 10)
    plan = fp.FusionPlan(fp.TensorDescriptor.from_tensor(tensor(shape, torch.float16, layout)))
    if direction == "forward":
        plan.add_batchnorm_forward(SPATIAL, False), plan.add_activation_forward(ActivationMode.RELU)
    else:
        plan.add_batchnorm_backward(SPATIAL), plan.add_activation_backward(ActivationMode.RELU)
    handle = fp.Handle("cuda")
    assert plan.compile(handle) == "triton-batchnorm"
    unbound = []
    kernel_class = tb.TritonBatchNormForwardKernel if direction == "forward" else tb.TritonBatchNormBackwardKernel
    launch_all = kernel_class._launch_all
    monkeypatch.setattr(kernel_class, "_launch_all", lambda self, *a: unbound.append(1) or launch_all(self, *a))
    side = torch.cuda.Stream()
    for step in range(6):
        x = tensor(shape, torch.float16, layout, shift=float(step))
        dy = tensor(shape, torch.float16, layout)
        args, (scale, bias, side_outputs) = _step_args(plan, x, direction)
        (y_want, mean_want), grads_want = _step_oracle(x, dy, scale, bias)
        source = x if direction == "forward" else dy
        out = torch.full_like(x, float("nan"))
        if step == 4:  # the output one element past the input, in the same memory
            flat = torch.empty(source.numel() + 8, dtype=source.dtype, device="cuda")
            flat[8:].copy_(source.reshape(-1) if layout == "NCHW" else source.permute(0, 2, 3, 1).reshape(-1))
            view = (
                flat[8:].view(shape)
                if layout == "NCHW"
                else flat[8:].view(shape[0], *shape[2:], shape[1]).permute(0, 3, 1, 2)
            )
            source, out = (
                view,
                flat[:-8].view_as(view)
                if layout == "NCHW"
                else flat[:-8].view(shape[0], *shape[2:], shape[1]).permute(0, 3, 1, 2),
            )
            if direction == "backward":
                dy = source
        stream = side if step == 5 else torch.cuda.current_stream()
        with torch.cuda.stream(stream):
            plan.execute(handle, source, out, args)
        stream.synchronize()
        if direction == "forward":
            assert_close(out, y_want, torch.float16)
            assert_close(side_outputs[0], mean_want, torch.float32)
        else:
            for got, want in zip((out, *side_outputs), grads_want):
                assert_close(got, want, torch.float16)
        if step == 3:
            assert len(unbound) == 1, unbound
    assert len(unbound) == 3
