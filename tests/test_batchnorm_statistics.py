"""Batch-norm statistics as a plan's last operator ([C, S], [C, B, A, S], [S]): the chain's output
unnormalized, and the statistics a training batch-norm after it would take (saved mean and
inverse deviation, the running statistics updated with the unbiased variance), against float64
torch on the CPU solvers and the reference; where the operator may stand; its arguments' errors,
which write nothing; the Python API and the MIOpen layer's additions."""

import dataclasses

import pytest
import torch
import torch.nn.functional as F

import fusionplan as fp
import fusionplan.miopen as mi
from fusionplan.core.enums import BatchNormMode
from fusionplan.core.ops import ConvForwardOp, Phase
from fusionplan.oracle.reference import run_reference
from fusionplan.tools.verify import add_chain, random_args

from .util import make_input, poisoned

CASES = [
    # (chain, input shape, k, r, s, pads, strides, dilations, groups)
    ("CS", (2, 8, 9, 7), 16, 3, 3, (1, 1), (1, 1), (1, 1), 1),
    ("CBAS", (2, 3, 13, 11), 17, 3, 3, (1, 1), (2, 2), (1, 1), 1),
    ("CS", (1, 12, 10, 10), 12, 3, 3, (2, 2), (1, 1), (2, 2), 4),  # grouped, dilated
    ("CS", (3, 16, 6, 6), 16, 3, 3, (1, 1), (1, 1), (1, 1), 16),  # depthwise
    ("NACS", (2, 16, 7, 7), 8, 1, 1, (0, 0), (1, 1), (1, 1), 1),
    ("S", (4, 5, 3, 3), 1, 1, 1, (0, 0), (1, 1), (1, 1), 1),
]


def _plan(x, chain, k, r, s, pads, strides, dilations, groups):
    plan = fp.FusionPlan(fp.TensorDescriptor.from_tensor(x))
    conv = fp.ConvolutionDescriptor(pads, strides, dilations, groups)
    return add_chain(plan, chain, conv=conv, k=k, r=r, s=s, param_dtype="float")


def _expected(plan, x, args) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The chain's output and its statistics in float64 torch, written out independently of the
    reference: mean and biased variance over N, H, W; the running ones updated."""
    ops = plan.ops
    h = x.double()
    for op in ops[:-1]:
        rec = args.get(op)
        if isinstance(op, ConvForwardOp):
            c = op.conv
            h = F.conv2d(h, rec.weight.double(), None, c.strides, c.pads, c.dilations, c.groups)
        elif op.letter == "B":
            h = h + rec.bias.double().reshape(1, -1, 1, 1)
        elif op.letter == "N":
            inv = torch.rsqrt(rec.variance.double() + rec.epsilon)
            h = (h - rec.mean.double()) * inv * rec.scale.double() + rec.bias.double()
        else:
            h = torch.relu(h)
    rec = args.get(ops[-1])
    mean = h.mean(dim=(0, 2, 3), keepdim=True)
    var = h.var(dim=(0, 2, 3), unbiased=False, keepdim=True)
    count = h.numel() // h.shape[1]
    f = rec.exp_avg_factor
    stats = {
        "saved_mean": mean,
        "saved_inv_variance": torch.rsqrt(var + rec.epsilon),
        "running_mean": (1 - f) * rec.running_mean.double() + f * mean,
        "running_variance": (1 - f) * rec.running_variance.double() + f * var * count / (count - 1),
    }
    return h, stats


def _check(plan, handle, x, layout, tol):
    args = random_args(plan, param_dtype=torch.float32)
    expected, stats = _expected(plan, x, args)
    y = poisoned(plan.output_desc, layout)
    plan.execute(handle, x, y, args)
    assert not torch.isnan(y).any(), "some output elements were not written"
    torch.testing.assert_close(y.double(), expected, rtol=tol, atol=tol * expected.abs().max().item())
    rec = args.get(plan.ops[-1])
    for name, value in stats.items():
        got = getattr(rec, name).double()
        torch.testing.assert_close(got, value, rtol=tol, atol=tol, msg=lambda m, n=name: f"{n}: {m}")


@pytest.mark.parametrize("backend", ["cpu", "reference"])
@pytest.mark.parametrize("case", CASES, ids=[f"{c[0]}-{c[1][1]}ch-g{c[8]}" for c in CASES])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_the_output_and_its_statistics_match_float64(backend, case, layout, dtype):
    chain, shape, *geometry = case
    x = make_input(shape, dtype, layout)
    plan = _plan(x, chain, *geometry)
    handle = fp.Handle("cpu", allow_tf32=False)
    solver = plan.compile(handle, backend=backend)
    assert solver == ("cpu-folded" if backend == "cpu" else "reference")
    assert plan.combination == chain and plan.phase == Phase.STATISTICS
    _check(plan, handle, x, layout, {torch.float32: 1e-5, torch.float16: 1e-2, torch.bfloat16: 2e-2}[dtype])


def _stats_plan(x, running=True):
    plan = fp.FusionPlan(fp.TensorDescriptor.from_tensor(x))
    add_chain(plan, "C", k=4, r=3, s=3, conv=fp.ConvolutionDescriptor((1, 1)))
    return plan, plan.add_batchnorm_statistics(BatchNormMode.SPATIAL, running)


def test_the_statistics_end_the_plan_and_follow_inference_operators_only():
    x = make_input((2, 4, 5, 5), torch.float32)
    plan, _ = _stats_plan(x)
    with pytest.raises(fp.UnsupportedOpError, match="batch-norm statistics ends a plan; cannot add activation"):
        plan.add_activation_forward(fp.ActivationMode.RELU)
    training = fp.FusionPlan(fp.TensorDescriptor.from_tensor(x))
    training.add_batchnorm_forward(BatchNormMode.SPATIAL, True)
    with pytest.raises(fp.UnsupportedOpError, match="follows inference operators only"):
        training.add_batchnorm_statistics(BatchNormMode.SPATIAL)
    backward = fp.FusionPlan(fp.TensorDescriptor.from_tensor(x))
    backward.add_batchnorm_backward(BatchNormMode.SPATIAL)
    with pytest.raises(fp.UnsupportedOpError, match="follows inference operators only"):
        backward.add_batchnorm_statistics(BatchNormMode.SPATIAL)


def test_running_statistics_need_two_values_per_channel():
    x = make_input((1, 4, 1, 1), torch.float32)
    plan = fp.FusionPlan(fp.TensorDescriptor.from_tensor(x))
    with pytest.raises(fp.BadParmError, match="at least 2 values per channel"):
        plan.add_batchnorm_statistics(BatchNormMode.SPATIAL, True)
    plan.add_batchnorm_statistics(BatchNormMode.SPATIAL, False)  # the saved statistics alone are fine


@pytest.mark.parametrize(
    "change, message",
    [
        ({"alpha": 0.5}, "passes its input through: alpha must be 1 and beta 0"),
        ({"beta": 1.0}, "passes its input through: alpha must be 1 and beta 0"),
        ({"running_mean": None}, "argument running_mean is required"),
        ({"exp_avg_factor": 1.5}, r"expAvgFactor must be in \[0, 1\]"),
        ({"epsilon": -1.0}, "epsilon must be >= 0"),
        ({"saved_mean": torch.zeros(5)}, "saved_mean"),
    ],
)
def test_bad_arguments_are_bad_parm_and_write_nothing(change, message):
    x = make_input((2, 4, 5, 5), torch.float32)
    plan, op = _stats_plan(x)
    handle = fp.Handle("cpu")
    plan.compile(handle)
    args = random_args(plan)
    record = args.get(op)
    y, running = poisoned(plan.output_desc), record.running_variance.clone()
    with pytest.raises(fp.BadParmError, match=message):  # when the record is set, or at the latest at execute
        args.set(op, dataclasses.replace(record, **change))
        plan.execute(handle, x, y, args)
    assert torch.isnan(y).all()
    assert torch.equal(record.running_variance, running)


def test_the_python_api_binds_only_the_tensors_given():
    x = make_input((2, 3, 8, 8), torch.float32)
    w = make_input((6, 3, 3, 3), torch.float32)
    mean, inv = torch.empty(6), torch.empty(6)
    y = fp.Plan(x).conv(w, padding=1).statistics(mean, inv, eps=1e-3)(x)
    h = F.conv2d(x.double(), w.double(), padding=1)
    torch.testing.assert_close(y.double(), h, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(mean.double(), h.mean((0, 2, 3)), rtol=1e-5, atol=1e-6)
    var = h.var((0, 2, 3), unbiased=False)
    torch.testing.assert_close(inv.double(), torch.rsqrt(var + 1e-3), rtol=1e-5, atol=1e-6)


def test_the_miopen_layer_creates_and_runs_conv_statistics():
    x = make_input((2, 4, 6, 6), torch.float32, "NHWC")
    w = make_input((8, 4, 1, 1), torch.float32)
    _, handle = mi.miopenCreateOnDevice("cpu")
    _, x_desc = mi.miopenCreateTensorDescriptor()
    mi.miopenSetTensorDescriptor(x_desc, mi.miopenFloat, 4, list(x.shape), list(x.stride()))
    _, w_desc = mi.miopenCreateTensorDescriptor()
    mi.miopenSet4dTensorDescriptor(w_desc, mi.miopenFloat, 8, 4, 1, 1)
    _, conv = mi.miopenCreateConvolutionDescriptor()
    mi.miopenInitConvolutionDescriptor(conv, mi.miopenConvolution, 0, 0, 1, 1, 1, 1)
    _, plan = mi.miopenCreateFusionPlan(mi.miopenVerticalFusion, x_desc)
    _, conv_op = mi.miopenCreateOpConvForward(plan, conv, w_desc)
    status, stats_op = mi.miopenCreateOpBatchNormStatistics(plan, mi.miopenBNSpatial, True)
    assert status == mi.miopenStatusSuccess
    status, _ = mi.miopenCreateOpActivationForward(plan, mi.miopenActivationRELU)
    assert status == mi.miopenStatusUnsupportedOp and "ends a plan" in mi.miopenGetLastErrorString()
    assert mi.miopenCompileFusionPlan(handle, plan) == mi.miopenStatusSuccess
    _, args = mi.miopenCreateOperatorArgs()
    mi.miopenSetOpArgsConvForward(args, conv_op, 1.0, 0.0, w)
    mean, inv = torch.full((8,), float("nan")), torch.full((8,), float("nan"))
    run_mean, run_var = torch.zeros(8), torch.ones(8)
    status = mi.miopenSetOpArgsBatchNormStatistics(args, stats_op, 1.0, 0.0, mean, inv, run_mean, run_var, 0.1, 1e-5)
    assert status == mi.miopenStatusSuccess
    y = torch.full((2, 8, 6, 6), float("nan"))
    status = mi.miopenExecuteFusionPlan(handle, plan, x_desc, x, _desc_of(y), y, args)
    assert status == mi.miopenStatusSuccess, mi.miopenGetLastErrorString()
    h = F.conv2d(x.double(), w.double())
    torch.testing.assert_close(y.double(), h, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(mean.double(), h.mean((0, 2, 3)), rtol=1e-5, atol=1e-6)
    unbiased = h.var((0, 2, 3), unbiased=True)
    torch.testing.assert_close(run_var.double(), 0.9 + 0.1 * unbiased, rtol=1e-5, atol=1e-6)
    status = mi.miopenSetOpArgsBatchNormStatistics(args, stats_op, 2.0, 0.0, mean, inv, run_mean, run_var, 0.1, 1e-5)
    assert status == mi.miopenStatusBadParm and "alpha must be 1" in mi.miopenGetLastErrorString()


def _desc_of(t):
    _, desc = mi.miopenCreateTensorDescriptor()
    mi.miopenSetTensorDescriptor(desc, mi.miopenFloat, 4, list(t.shape), list(t.stride()))
    return desc


TRITON_CASES = [c for c in CASES if c[0] != "S"]


@pytest.mark.parametrize("case", TRITON_CASES, ids=[f"{c[0]}-{c[1][1]}ch-g{c[8]}" for c in TRITON_CASES])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_triton_conv_takes_the_statistics_in_its_epilogue(case, layout, dtype, monkeypatch):
    """Through Triton's interpreter: the tiles' statistics, then the finalize kernel's merge."""
    monkeypatch.setenv("FUSIONPLAN_BACKEND", "triton")
    chain, shape, *geometry = case
    x = make_input(shape, dtype, layout)
    plan = _plan(x, chain, *geometry)
    handle = fp.Handle("cpu", allow_tf32=False)
    assert plan.compile(handle) == "triton-conv"
    assert "batch-norm statistics of the tile" in plan.kernel_source(handle)
    _check(plan, handle, x, layout, {torch.float32: 1e-5, torch.float16: 1e-2}[dtype])


def test_a_split_reduction_and_repeated_executes_take_each_calls_statistics(monkeypatch):
    """A split reduction (the interpreter splits small grids) takes the statistics after the last
    part arrives; a second execute with new data (the repeat path of other plans) takes that
    data's statistics and updates the running ones again."""
    monkeypatch.setenv("FUSIONPLAN_BACKEND", "triton")
    x = make_input((1, 32, 4, 4), torch.float32, "NHWC")
    plan = _plan(x, "CS", 8, 3, 3, (1, 1), (1, 1), (1, 1), 1)
    handle = fp.Handle("cpu", allow_tf32=False)
    plan.compile(handle)
    assert plan._compiled[handle.uid].kernel.config.split_k > 1
    args = random_args(plan, param_dtype=torch.float32)
    rec = args.get(plan.ops[-1])
    for _ in range(2):
        x = make_input((1, 32, 4, 4), torch.float32, "NHWC")
        before = rec.running_mean.clone().double()
        y = poisoned(plan.output_desc, "NHWC")
        plan.execute(handle, x, y, args)
        h = F.conv2d(x.double(), args.get(plan.ops[0]).weight.double(), padding=1)
        torch.testing.assert_close(rec.saved_mean.double().flatten(), h.mean((0, 2, 3)), rtol=1e-5, atol=1e-6)
        expected = 0.7 * before + 0.3 * h.mean((0, 2, 3), keepdim=True)
        torch.testing.assert_close(rec.running_mean.double(), expected, rtol=1e-5, atol=1e-6)


def test_a_blend_before_the_convolution_still_writes_the_statistics(monkeypatch):
    """beta on an operator before the convolution runs the call unfused (the prologue reads no
    prior): the statistics are written there too (found by the fuzzer: they were left NaN)."""
    monkeypatch.setenv("FUSIONPLAN_BACKEND", "triton")
    x = make_input((2, 8, 6, 6), torch.float32, "NHWC")
    plan = _plan(x, "NACS", 8, 3, 3, (1, 1), (1, 1), (1, 1), 1)
    handle = fp.Handle("cpu", allow_tf32=False)
    assert plan.compile(handle) == "triton-conv"
    args = random_args(plan, param_dtype=torch.float32)
    args.set(plan.ops[0], dataclasses.replace(args.get(plan.ops[0]), beta=0.5))
    prior = make_input((2, 8, 6, 6), torch.float32, "NHWC")
    y = prior.clone()
    expected = run_reference(plan.ops, x, [args.get(op) for op in plan.ops], prior, torch.float64)  # before: pure
    plan.execute(handle, x, y, args, prior=prior)
    rec = args.get(plan.ops[-1])
    torch.testing.assert_close(y.double(), expected.output, rtol=1e-5, atol=1e-5)
    for name in ("saved_mean", "saved_inv_variance", "running_mean", "running_variance"):
        torch.testing.assert_close(getattr(rec, name).double(), expected.side[(3, name)], rtol=1e-5, atol=1e-5)


class _SpecializationRecorder:
    """A launcher stand-in that records the specialization of each launch and compile-ahead, then
    hands the call to the real launcher."""

    def __init__(self, real):
        self.real, self.launched, self.ahead = real, [], []

    def _key(self, key, args):
        from fusionplan.runtime.launch import specialization

        return (key, specialization(args, self.real.constexprs))

    def __call__(self, grid, key, args, num_warps, num_stages):
        self.launched.append((grid, self._key(key, args), num_warps, num_stages))
        return self.real(grid, key, args, num_warps, num_stages)

    def compile_ahead(self, grid, key, args, num_warps, num_stages):
        self.ahead.append((grid, self._key(key, args), num_warps, num_stages))
        return self.real.compile_ahead(grid, key, args, num_warps, num_stages)


@pytest.mark.parametrize("running", [True, False])
def test_the_finalize_compiled_ahead_is_the_one_the_first_execute_launches(running, monkeypatch):
    """A plan's kernel compiles ahead (on a GPU, when it is built) the finalize launch that follows
    the convolution too, for the side outputs batch-norm layers pass (float32): the first execute
    then finds it compiled rather than compiling it on the critical path."""
    monkeypatch.setenv("FUSIONPLAN_BACKEND", "triton")
    x = make_input((2, 8, 9, 7), torch.float16, "NHWC")
    plan = fp.FusionPlan(fp.TensorDescriptor.from_tensor(x))
    conv = fp.ConvolutionDescriptor((1, 1), (1, 1), (1, 1), 1)
    plan = add_chain(plan, "CS", conv=conv, k=16, r=3, s=3, param_dtype="float")
    if not running:
        plan = fp.FusionPlan(fp.TensorDescriptor.from_tensor(x))
        plan.add_conv_forward(conv, fp.TensorDescriptor.packed(fp.DataType.HALF, (16, 8, 3, 3)))
        plan.add_batchnorm_statistics(BatchNormMode.SPATIAL, running_mean_variance=False)
    handle = fp.Handle("cpu", allow_tf32=False)
    assert plan.compile(handle) == "triton-conv"
    kernel = plan._compiled[handle.uid].kernel
    recorder = _SpecializationRecorder(kernel._finalize.launcher)
    monkeypatch.setattr(kernel._finalize, "launcher", recorder)
    kernel.compile_ahead(torch.device("cpu"))
    args = random_args(plan, param_dtype=torch.float32)
    if not running:
        rec = args.get(plan.ops[-1])
        args.set(plan.ops[-1], dataclasses.replace(rec, running_mean=None, running_variance=None))
    plan.execute(handle, x, poisoned(plan.output_desc, "NHWC"), args)
    assert len(recorder.ahead) == 1 and recorder.launched == recorder.ahead
