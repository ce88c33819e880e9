"""The MIOpen-compatible layer, against its contract (shared reference: miopen-python-binding)."""

import logging

import numpy as np
import pytest
import torch

import fusionplan.miopen as mi
from fusionplan.oracle.reference import run_reference

S = mi.miopenStatus_t


# ---- enumerations ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "enum_cls, expected",
    [
        (
            mi.miopenStatus_t,
            dict(
                miopenStatusSuccess=0,
                miopenStatusNotInitialized=1,
                miopenStatusInvalidValue=2,
                miopenStatusBadParm=3,
                miopenStatusAllocFailed=4,
                miopenStatusInternalError=5,
                miopenStatusNotImplemented=6,
                miopenStatusUnknownError=7,
                miopenStatusUnsupportedOp=8,
                miopenStatusGpuOperationsSkipped=9,
                miopenStatusVersionMismatch=10,
            ),
        ),
        (
            mi.miopenDataType_t,
            dict(miopenHalf=0, miopenFloat=1, miopenInt32=2, miopenInt8=3, miopenBFloat16=5, miopenDouble=6),
        ),
        (mi.miopenTensorLayout_t, dict(miopenTensorNCHW=0, miopenTensorNHWC=1)),
        (mi.miopenFusionDirection_t, dict(miopenVerticalFusion=0, miopenHorizontalFusion=1)),
        (
            mi.miopenConvolutionMode_t,
            dict(miopenConvolution=0, miopenTranspose=1, miopenGroupConv=2, miopenDepthwise=3),
        ),
        (
            mi.miopenConvFwdAlgorithm_t,
            dict(
                miopenConvolutionFwdAlgoGEMM=0,
                miopenConvolutionFwdAlgoDirect=1,
                miopenConvolutionFwdAlgoFFT=2,
                miopenConvolutionFwdAlgoWinogradFwd=3,
                miopenConvolutionFwdAlgoImplicitGEMM=5,
            ),
        ),
        (
            mi.miopenActivationMode_t,
            dict(
                miopenActivationPASTHRU=0,
                miopenActivationLOGISTIC=1,
                miopenActivationTANH=2,
                miopenActivationRELU=3,
                miopenActivationSOFTRELU=4,
                miopenActivationABS=5,
                miopenActivationPOWER=6,
                miopenActivationCLIPPEDRELU=7,
                miopenActivationLEAKYRELU=8,
                miopenActivationELU=9,
            ),
        ),
        (mi.miopenBatchNormMode_t, dict(miopenBNPerActivation=0, miopenBNSpatial=1)),
    ],
)
def test_enumerations(enum_cls, expected):
    assert {m.name: m.value for m in enum_cls} == expected
    for name, value in expected.items():
        assert getattr(mi, name) == value and isinstance(getattr(mi, name), enum_cls)


# ---- helpers ------------------------------------------------------------------------------------
def ok(result):
    status = result[0] if isinstance(result, tuple) else result
    assert status == S.miopenStatusSuccess, mi.miopenGetLastErrorString()
    return result[1] if isinstance(result, tuple) and len(result) == 2 else result


def tensor_desc(dtype, dims, strides=None):
    d = ok(mi.miopenCreateTensorDescriptor())
    ok(mi.miopenSetTensorDescriptor(d, dtype, len(dims), list(dims), strides))
    return d


def desc_of(t):
    dtype = {torch.float32: mi.miopenFloat, torch.float16: mi.miopenHalf, torch.bfloat16: mi.miopenBFloat16}[t.dtype]
    return tensor_desc(dtype, t.shape, list(t.stride()))


@pytest.fixture
def handle():
    h = ok(mi.miopenCreateOnDevice("cpu"))
    yield h
    mi.miopenDestroy(h)


def conv_desc(pad=1, stride=1, dil=1, groups=1):
    c = ok(mi.miopenCreateConvolutionDescriptor())
    ok(mi.miopenInitConvolutionDescriptor(c, mi.miopenConvolution, pad, pad, stride, stride, dil, dil))
    if groups != 1:
        ok(mi.miopenSetConvolutionGroupCount(c, groups))
    return c


def cbna(
    handle, x, k=6, layout_out=None, bn_mode=mi.miopenBNSpatial, act=mi.miopenActivationRELU, dtype=mi.miopenFloat
):
    """Build, compile and set arguments of a CBNA plan for x, as C code would."""
    c = x.shape[1]
    x_d = desc_of(x)
    w = torch.randn(k, c, 3, 3).to(x.dtype)
    w_d = desc_of(w)
    conv = conv_desc()
    _, n, oc, oh, ow = mi.miopenGetConvolutionForwardOutputDim(conv, x_d, w_d)
    plan = ok(mi.miopenCreateFusionPlan(mi.miopenVerticalFusion, x_d))
    conv_op = ok(mi.miopenCreateOpConvForward(plan, conv, w_d))
    b_d = tensor_desc(dtype, (1, k, 1, 1))
    bias_op = ok(mi.miopenCreateOpBiasForward(plan, b_d))
    pdims = (1, k, 1, 1) if bn_mode == mi.miopenBNSpatial else (1, k, oh, ow)
    bn_d = tensor_desc(mi.miopenFloat, pdims)
    bn_op = ok(mi.miopenCreateOpBatchNormInference(plan, bn_mode, bn_d))
    act_op = ok(mi.miopenCreateOpActivationForward(plan, act))
    ok(mi.miopenCompileFusionPlan(handle, plan))
    args = ok(mi.miopenCreateOperatorArgs())
    ok(mi.miopenSetOpArgsConvForward(args, conv_op, 1.0, 0.0, w))
    ok(mi.miopenSetOpArgsBiasForward(args, bias_op, 1.0, 0.0, torch.randn(k).to(x.dtype)))
    ok(
        mi.miopenSetOpArgsBatchNormInference(
            args,
            bn_op,
            1.0,
            0.0,
            torch.randn(pdims),
            torch.randn(pdims),
            torch.randn(pdims),
            torch.rand(pdims) + 0.5,
            1e-5,
        )
    )
    ok(mi.miopenSetOpArgsActivForward(args, act_op, 1.0, 0.0, 0.5, 0.0, 1.0))
    y = torch.full((n, oc, oh, ow), float("nan"), dtype=x.dtype)
    if layout_out == "NHWC":
        y = y.to(memory_format=torch.channels_last)
    return plan, args, x_d, y, desc_of(y), (conv_op, bias_op, bn_op, act_op)


def reference_of(plan, args, x):
    core = plan.core
    return run_reference(core.ops, x, [args.core.get(op) for op in core.ops]).output


# ---- descriptors --------------------------------------------------------------------------------
def test_tensor_descriptor_calls():
    d = ok(mi.miopenCreateTensorDescriptor())
    ok(mi.miopenSet4dTensorDescriptor(d, mi.miopenHalf, 2, 3, 4, 5))
    assert mi.miopenGetTensorDescriptor(d) == (S.miopenStatusSuccess, mi.miopenHalf, [2, 3, 4, 5], [60, 20, 5, 1])
    assert mi.miopenGetTensorDescriptorSize(d) == (S.miopenStatusSuccess, 4)
    ok(mi.miopenSetNdTensorDescriptorWithLayout(d, mi.miopenBFloat16, mi.miopenTensorNHWC, [2, 3, 4, 5], 4))
    assert mi.miopenGetTensorDescriptor(d)[3] == [60, 1, 15, 3]
    ok(mi.miopenSetTensorDescriptor(d, mi.miopenFloat, 4, [2, 3, 4, 5], [60, 1, 15, 3]))
    assert mi.miopenGetTensorDescriptor(d)[1:] == (mi.miopenFloat, [2, 3, 4, 5], [60, 1, 15, 3])
    ok(mi.miopenDestroyTensorDescriptor(d))
    assert mi.miopenGetTensorDescriptor(d) == (S.miopenStatusBadParm, None, None, None)
    assert "destroyed" in mi.miopenGetLastErrorString()


@pytest.mark.parametrize(
    "call, reason",
    [
        (lambda d: mi.miopenSet4dTensorDescriptor(d, mi.miopenFloat, 2, 0, 4, 5), "dims"),
        (lambda d: mi.miopenSet4dTensorDescriptor(d, 4, 2, 3, 4, 5), "data type"),
        (lambda d: mi.miopenSetTensorDescriptor(d, mi.miopenFloat, 3, [2, 3, 4, 5], None), "count says 3"),
        (lambda d: mi.miopenSetTensorDescriptor(d, mi.miopenFloat, 4, [2, 3, 4, 5], [1, 1, 1, 1]), "overlap"),
        (lambda d: mi.miopenSetNdTensorDescriptorWithLayout(d, mi.miopenFloat, 7, [2, 3, 4, 5], 4), "layout"),
        (lambda d: mi.miopenGetTensorDescriptor(d), "never set"),
        (
            lambda d: mi.miopenSet4dTensorDescriptor("not a descriptor", mi.miopenFloat, 1, 1, 1, 1),
            "expected a tensor descriptor",
        ),
    ],
)
def test_tensor_descriptor_errors(call, reason):
    d = ok(mi.miopenCreateTensorDescriptor())
    result = call(d)
    assert (result[0] if isinstance(result, tuple) else result) == S.miopenStatusBadParm
    assert reason in mi.miopenGetLastErrorString()


def test_convolution_descriptor_calls():
    conv = conv_desc(pad=2, stride=2, dil=2)
    x_d = tensor_desc(mi.miopenFloat, (2, 6, 13, 11))
    w_d = tensor_desc(mi.miopenFloat, (9, 2, 3, 3))
    assert mi.miopenGetConvolutionForwardOutputDim(conv, x_d, w_d)[0] == S.miopenStatusBadParm  # 6 != 2 * groups
    ok(mi.miopenSetConvolutionGroupCount(conv, 3))
    expected = torch.nn.functional.conv2d(torch.empty(2, 6, 13, 11), torch.empty(9, 2, 3, 3), None, 2, 2, 2, 3).shape
    assert mi.miopenGetConvolutionForwardOutputDim(conv, x_d, w_d) == (S.miopenStatusSuccess, *expected)
    nd = ok(mi.miopenCreateConvolutionDescriptor())
    ok(mi.miopenInitConvolutionNdDescriptor(nd, 2, [2, 2], [2, 2], [2, 2], mi.miopenGroupConv))
    ok(mi.miopenSetConvolutionGroupCount(nd, 3))
    assert mi.miopenGetConvolutionNdForwardOutputDim(nd, x_d, w_d) == (S.miopenStatusSuccess, 4, list(expected))
    assert mi.miopenInitConvolutionNdDescriptor(nd, 2, [1], [1, 1], [1, 1], 0) == S.miopenStatusBadParm
    assert mi.miopenSetConvolutionGroupCount(nd, 0) == S.miopenStatusBadParm
    assert mi.miopenInitConvolutionDescriptor(nd, 0, -1, 0, 1, 1, 1, 1) == S.miopenStatusBadParm
    ok(mi.miopenDestroyConvolutionDescriptor(conv))


def test_activation_descriptor_calls():
    a = ok(mi.miopenCreateActivationDescriptor())
    ok(mi.miopenSetActivationDescriptor(a, mi.miopenActivationLEAKYRELU, 0.1, 0.0, 1.0))
    assert mi.miopenSetActivationDescriptor(a, 12, 0.1, 0.0, 1.0) == S.miopenStatusBadParm
    ok(mi.miopenDestroyActivationDescriptor(a))


def test_handle_calls():
    status, h = mi.miopenCreate()
    assert status == S.miopenStatusSuccess
    assert mi.miopenGetStream(h) == (S.miopenStatusSuccess, None) if not torch.cuda.is_available() else True
    h2 = ok(mi.miopenCreateWithStream(None))
    assert mi.miopenSetStream(h2, None) == S.miopenStatusSuccess
    assert mi.miopenCreateOnDevice("tpu:0")[0] == S.miopenStatusBadParm
    if not torch.cuda.is_available():
        assert mi.miopenCreateOnDevice("cuda")[0] == S.miopenStatusBadParm
        assert "CUDA is not available" in mi.miopenGetLastErrorString()
        assert mi.miopenSetStream(h, object()) == S.miopenStatusBadParm
    ok(mi.miopenDestroy(h))
    assert mi.miopenGetStream(h)[0] == S.miopenStatusBadParm


# ---- fusion plans -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "layout_in, layout_out", [("NCHW", "NCHW"), ("NHWC", "NHWC"), ("NCHW", "NHWC"), ("NHWC", "NCHW")]
)
@pytest.mark.parametrize("bn_mode", [mi.miopenBNSpatial, mi.miopenBNPerActivation])
def test_cbna_executes_correctly(handle, layout_in, layout_out, bn_mode):
    x = torch.randn(2, 4, 9, 7)
    if layout_in == "NHWC":
        x = x.to(memory_format=torch.channels_last)
    plan, args, x_d, y, y_d, _ = cbna(handle, x, layout_out=layout_out, bn_mode=bn_mode)
    ok(mi.miopenExecuteFusionPlan(handle, plan, x_d, x, y_d, y, args))
    ref = reference_of(plan, args, x)
    assert not torch.isnan(y).any()
    torch.testing.assert_close(y.double(), ref, rtol=1e-5, atol=1e-5)


def test_plan_queries(handle):
    x = torch.randn(2, 4, 9, 7)
    plan, args, x_d, y, y_d, ops = cbna(handle, x)
    assert mi.miopenFusionPlanGetOp(plan, 2) == (S.miopenStatusSuccess, ops[2])
    assert mi.miopenFusionPlanGetOp(plan, 4) == (S.miopenStatusBadParm, None)
    assert mi.miopenFusionPlanGetWorkSpaceSize(handle, plan, mi.miopenConvolutionFwdAlgoDirect) == (
        S.miopenStatusSuccess,
        0,
    )
    status, count, algos = mi.miopenFusionPlanConvolutionGetAlgo(plan, 4)
    assert status == S.miopenStatusSuccess and count == len(algos) >= 1
    assert mi.miopenFusionPlanConvolutionGetAlgo(plan, 0)[0] == S.miopenStatusBadParm
    ok(mi.miopenFusionPlanConvolutionSetAlgo(plan, mi.miopenConvolutionFwdAlgoDirect))
    assert mi.miopenFusionPlanConvolutionSetAlgo(plan, 4) == S.miopenStatusBadParm
    na_plan = ok(mi.miopenCreateFusionPlan(mi.miopenVerticalFusion, x_d))
    assert mi.miopenFusionPlanConvolutionGetAlgo(na_plan, 1)[0] == S.miopenStatusBadParm
    assert "no convolution" in mi.miopenGetLastErrorString()


def test_unsupported_at_operator_creation(handle):
    x_d = tensor_desc(mi.miopenFloat, (2, 4, 9, 7))
    w_d = tensor_desc(mi.miopenFloat, (4, 4, 3, 3))
    plan = ok(mi.miopenCreateFusionPlan(mi.miopenVerticalFusion, x_d))
    ok(mi.miopenCreateOpConvForward(plan, conv_desc(), w_d))
    assert mi.miopenCreateOpConvForward(plan, conv_desc(), w_d) == (S.miopenStatusUnsupportedOp, None)
    assert "at most one convolution" in mi.miopenGetLastErrorString()
    assert mi.miopenCreateOpBatchNormBackward(plan, mi.miopenBNSpatial)[0] == S.miopenStatusUnsupportedOp
    assert mi.miopenCreateOpBatchNormForward(plan, mi.miopenBNSpatial, True)[0] == S.miopenStatusUnsupportedOp
    horizontal = ok(mi.miopenCreateFusionPlan(mi.miopenHorizontalFusion, x_d))
    assert mi.miopenCreateOpActivationForward(horizontal, mi.miopenActivationRELU)[0] == S.miopenStatusUnsupportedOp
    assert "horizontal" in mi.miopenGetLastErrorString()
    back = ok(mi.miopenCreateFusionPlan(mi.miopenVerticalFusion, x_d))
    assert mi.miopenCreateOpActivationBackward(back, mi.miopenActivationRELU)[0] == S.miopenStatusUnsupportedOp
    ok(mi.miopenCreateOpBatchNormBackward(back, mi.miopenBNSpatial))
    ok(mi.miopenCreateOpActivationBackward(back, mi.miopenActivationRELU))
    assert mi.miopenCreateOpActivationForward(back, mi.miopenActivationRELU)[0] == S.miopenStatusUnsupportedOp
    tconv = ok(mi.miopenCreateConvolutionDescriptor())
    ok(mi.miopenInitConvolutionDescriptor(tconv, mi.miopenTranspose, 0, 0, 1, 1, 1, 1))
    fresh = ok(mi.miopenCreateFusionPlan(mi.miopenVerticalFusion, x_d))
    assert mi.miopenCreateOpConvForward(fresh, tconv, w_d)[0] == S.miopenStatusUnsupportedOp


def test_badparm_at_operator_creation():
    x_d = tensor_desc(mi.miopenFloat, (2, 4, 9, 7))
    plan = ok(mi.miopenCreateFusionPlan(mi.miopenVerticalFusion, x_d))
    assert (
        mi.miopenCreateOpConvForward(plan, conv_desc(), tensor_desc(mi.miopenFloat, (8, 3, 3, 3)))[0]
        == S.miopenStatusBadParm
    )
    assert "filter channels" in mi.miopenGetLastErrorString()
    assert mi.miopenCreateOpBiasForward(plan, tensor_desc(mi.miopenFloat, (1, 5, 1, 1)))[0] == S.miopenStatusBadParm
    assert (
        mi.miopenCreateOpBatchNormInference(plan, mi.miopenBNPerActivation, tensor_desc(mi.miopenFloat, (1, 4, 1, 1)))[
            0
        ]
        == S.miopenStatusBadParm
    )
    assert mi.miopenCreateOpActivationForward(plan, 42)[0] == S.miopenStatusBadParm
    assert (
        mi.miopenCreateFusionPlan(mi.miopenVerticalFusion, ok(mi.miopenCreateTensorDescriptor()))[0]
        == S.miopenStatusBadParm
    )
    assert mi.miopenCreateFusionPlan(3, x_d)[0] == S.miopenStatusBadParm


def test_execute_failures_return_badparm_and_write_nothing(handle, caplog):
    x = torch.randn(2, 4, 9, 7)
    plan, args, x_d, y, y_d, ops = cbna(handle, x)
    y.copy_(torch.randn_like(y))
    before = y.clone()
    uncompiled = ok(mi.miopenCreateFusionPlan(mi.miopenVerticalFusion, x_d))
    ok(mi.miopenCreateOpActivationForward(uncompiled, mi.miopenActivationRELU))
    other_args = ok(mi.miopenCreateOperatorArgs())
    cases = [
        (lambda: mi.miopenExecuteFusionPlan(handle, uncompiled, x_d, x, x_d, x.clone(), args), "not compiled"),
        (lambda: mi.miopenExecuteFusionPlan(handle, plan, x_d, x, y_d, y, other_args), "no arguments"),
        (lambda: mi.miopenExecuteFusionPlan(handle, plan, x_d, x.half(), y_d, y, args), "dtype"),
        (lambda: mi.miopenExecuteFusionPlan(handle, plan, x_d, x[:1], y_d, y, args), "shape"),
        (
            lambda: mi.miopenExecuteFusionPlan(
                handle,
                plan,
                desc_of(x.to(memory_format=torch.channels_last)),
                x.to(memory_format=torch.channels_last),
                y_d,
                y,
                args,
            ),
            "input descriptor",
        ),
        (
            lambda: mi.miopenExecuteFusionPlan(
                handle, plan, x_d, x, y_d, y.to(memory_format=torch.channels_last), args
            ),
            "strides",
        ),
        (lambda: mi.miopenExecuteFusionPlan(handle, plan, x_d, x, x_d, y, args), "output descriptor"),
        (lambda: mi.miopenExecuteFusionPlan(handle, plan, x_d, None, y_d, y, args), "NULL"),
        (lambda: mi.miopenExecuteFusionPlan(handle, plan, x_d, x.to("meta"), y_d, y, args), "device"),
    ]
    for call, reason in cases:
        with caplog.at_level(logging.WARNING, logger="fusionplan"):
            assert call() == S.miopenStatusBadParm, reason
        assert reason in mi.miopenGetLastErrorString(), (reason, mi.miopenGetLastErrorString())
        assert reason in caplog.text
        assert torch.equal(y, before), reason
    # adding an operator invalidates the compiled plan until it is compiled again
    act2 = ok(mi.miopenCreateOpActivationForward(plan, mi.miopenActivationABS))
    ok(mi.miopenSetOpArgsActivForward(args, act2, 1.0, 0.0, 0.0, 0.0, 0.0))
    assert mi.miopenExecuteFusionPlan(handle, plan, x_d, x, y_d, y, args) == S.miopenStatusBadParm
    assert torch.equal(y, before)
    ok(mi.miopenCompileFusionPlan(handle, plan))
    ok(mi.miopenExecuteFusionPlan(handle, plan, x_d, x, y_d, y, args))


def test_compile_reports_kernels_that_build_nowhere_as_internal_error(handle, monkeypatch):
    """When no applicable solver can build its kernel (say, every tile too large for the device),
    compile returns miopenStatusInternalError with each failure in the error string, and the
    plan stays uncompiled: executing it is miopenStatusBadParm and writes nothing."""
    from fusionplan import solvers

    def out_of_resources(self, spec, handle):
        raise RuntimeError("out of resource: shared memory")

    for solver in solvers.REGISTRY:
        monkeypatch.setattr(type(solver), "build", out_of_resources)
    x = torch.randn(2, 4, 9, 7)
    x_d = desc_of(x)
    plan = ok(mi.miopenCreateFusionPlan(mi.miopenVerticalFusion, x_d))
    act = ok(mi.miopenCreateOpActivationForward(plan, mi.miopenActivationRELU))
    assert mi.miopenCompileFusionPlan(handle, plan) == S.miopenStatusInternalError
    assert "could build" in mi.miopenGetLastErrorString() and "out of resource" in mi.miopenGetLastErrorString()
    args = ok(mi.miopenCreateOperatorArgs())
    ok(mi.miopenSetOpArgsActivForward(args, act, 1.0, 0.0, 0.0, 0.0, 0.0))
    y = torch.full_like(x, float("nan"))
    assert mi.miopenExecuteFusionPlan(handle, plan, x_d, x, x_d, y, args) == S.miopenStatusBadParm
    assert torch.isnan(y).all()


def test_set_args_errors(handle):
    x = torch.randn(2, 4, 9, 7)
    plan, args, x_d, y, y_d, (conv_op, bias_op, bn_op, act_op) = cbna(handle, x)
    assert (
        mi.miopenSetOpArgsConvForward(args, conv_op, 1.0, 0.0, torch.randn(6, 4, 3, 3).half()) == S.miopenStatusBadParm
    )
    assert mi.miopenSetOpArgsConvForward(args, bias_op, 1.0, 0.0, torch.randn(6)) == S.miopenStatusBadParm
    assert mi.miopenSetOpArgsConvForward(args, conv_op, None, 0.0, torch.randn(6, 4, 3, 3)) == S.miopenStatusBadParm
    assert mi.miopenSetOpArgsConvForward(args, conv_op, 1.0, 0.0, None) == S.miopenStatusBadParm
    assert mi.miopenSetOpArgsBiasForward(args, bias_op, 1.0, 0.0, torch.randn(5)) == S.miopenStatusBadParm
    assert (
        mi.miopenSetOpArgsBatchNormInference(
            args, bn_op, 1.0, 0.0, torch.randn(6), torch.randn(6), torch.randn(6), torch.rand(6), -1.0
        )
        == S.miopenStatusBadParm
    )
    assert mi.miopenSetOpArgsActivForward(args, act_op, 1.0, 0.0, float("nan"), 0, 0) == S.miopenStatusBadParm
    assert mi.miopenSetOpArgsActivForward("args", act_op, 1.0, 0.0, 0, 0, 0) == S.miopenStatusBadParm
    ok(mi.miopenDestroyOperatorArgs(args))
    assert mi.miopenSetOpArgsActivForward(args, act_op, 1.0, 0.0, 0, 0, 0) == S.miopenStatusBadParm


def test_alpha_beta_and_new_arguments_without_recompile(handle):
    x = torch.randn(2, 4, 9, 7)
    plan, args, x_d, y, y_d, (conv_op, bias_op, bn_op, act_op) = cbna(handle, x)
    ok(mi.miopenSetOpArgsConvForward(args, conv_op, 0.5, 0.25, torch.randn(6, 4, 3, 3)))
    ok(mi.miopenSetOpArgsActivForward(args, act_op, 2.0, -0.5, 0.0, 0.0, 0.0))
    prior = torch.randn_like(y)
    y.copy_(prior)
    ok(mi.miopenExecuteFusionPlan(handle, plan, x_d, x, y_d, y, args))
    core = plan.core
    ref = run_reference(core.ops, x, [args.core.get(op) for op in core.ops], prior).output
    torch.testing.assert_close(y.double(), ref, rtol=1e-5, atol=1e-5)


def test_dlpack_tensors(handle):
    """Any DLPack-capable array works: numpy in, numpy out (written in place)."""
    x = np.random.default_rng(0).standard_normal((1, 3, 8, 8), dtype=np.float32)
    w = np.random.default_rng(1).standard_normal((4, 3, 3, 3), dtype=np.float32)
    y = np.full((1, 4, 8, 8), np.nan, dtype=np.float32)
    x_d, w_d, y_d = (tensor_desc(mi.miopenFloat, a.shape) for a in (x, w, y))
    plan = ok(mi.miopenCreateFusionPlan(mi.miopenVerticalFusion, x_d))
    conv_op = ok(mi.miopenCreateOpConvForward(plan, conv_desc(), w_d))
    act_op = ok(mi.miopenCreateOpActivationForward(plan, mi.miopenActivationLOGISTIC))
    ok(mi.miopenCompileFusionPlan(handle, plan))
    args = ok(mi.miopenCreateOperatorArgs())
    ok(mi.miopenSetOpArgsConvForward(args, conv_op, 1.0, 0.0, w))
    ok(mi.miopenSetOpArgsActivForward(args, act_op, 1.0, 0.0, 0.0, 0.0, 0.0))
    ok(mi.miopenExecuteFusionPlan(handle, plan, x_d, x, y_d, y, args))
    ref = torch.sigmoid(
        torch.nn.functional.conv2d(torch.from_numpy(x).double(), torch.from_numpy(w).double(), padding=1)
    )
    np.testing.assert_allclose(y, ref.numpy(), rtol=1e-5, atol=1e-6)


def test_training_plans_through_the_layer(handle):
    x = torch.randn(4, 3, 5, 5)
    x_d = desc_of(x)
    fwd = ok(mi.miopenCreateFusionPlan(mi.miopenVerticalFusion, x_d))
    bn = ok(mi.miopenCreateOpBatchNormForward(fwd, mi.miopenBNSpatial, True))
    act = ok(mi.miopenCreateOpActivationForward(fwd, mi.miopenActivationRELU))
    ok(mi.miopenCompileFusionPlan(handle, fwd))
    scale, bias = torch.randn(1, 3, 1, 1), torch.randn(1, 3, 1, 1)
    saved_mean, saved_inv = torch.empty(1, 3, 1, 1), torch.empty(1, 3, 1, 1)
    rm, rv = torch.zeros(3), torch.ones(3)
    args = ok(mi.miopenCreateOperatorArgs())
    ok(mi.miopenSetOpArgsBatchNormForward(args, bn, 1.0, 0.0, scale, bias, saved_mean, saved_inv, rm, rv, 0.1, 1e-5))
    ok(mi.miopenSetOpArgsActivForward(args, act, 1.0, 0.0, 0.0, 0.0, 0.0))
    y = torch.empty_like(x)
    ok(mi.miopenExecuteFusionPlan(handle, fwd, x_d, x, x_d, y, args))
    expected = torch.relu(
        torch.nn.functional.batch_norm(x, None, None, scale.flatten(), bias.flatten(), True, 0.1, 1e-5)
    )
    torch.testing.assert_close(y, expected, rtol=1e-5, atol=1e-5)
    assert not torch.equal(rm, torch.zeros(3))

    bwd = ok(mi.miopenCreateFusionPlan(mi.miopenVerticalFusion, x_d))
    bn_b = ok(mi.miopenCreateOpBatchNormBackward(bwd, mi.miopenBNSpatial))
    act_b = ok(mi.miopenCreateOpActivationBackward(bwd, mi.miopenActivationRELU))
    ok(mi.miopenCompileFusionPlan(handle, bwd))
    dscale, dbias = torch.empty(1, 3, 1, 1), torch.empty(1, 3, 1, 1)
    bargs = ok(mi.miopenCreateOperatorArgs())
    ok(mi.miopenSetOpArgsBatchNormBackward(bargs, bn_b, 1.0, 0.0, x, scale, bias, dscale, dbias, saved_mean, saved_inv))
    ok(mi.miopenSetOpArgsActivBackward(bargs, act_b, 1.0, 0.0, y, None, 0.0, 0.0, 0.0))
    dy, dx = torch.randn_like(x), torch.empty_like(x)
    ok(mi.miopenExecuteFusionPlan(handle, bwd, x_d, dy, x_d, dx, bargs))
    xr, sr, br = (
        x.clone().requires_grad_(),
        scale.flatten().clone().requires_grad_(),
        bias.flatten().clone().requires_grad_(),
    )
    out = torch.relu(torch.nn.functional.batch_norm(xr, None, None, sr, br, True, 0.1, 1e-5))
    gx, gs, gb = torch.autograd.grad(out, (xr, sr, br), dy)
    torch.testing.assert_close(dx, gx, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(dscale.flatten(), gs, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(dbias.flatten(), gb, rtol=1e-4, atol=1e-5)


def test_convolution_bias_activation_forward(handle):
    x = torch.randn(2, 4, 9, 7)
    w = torch.randn(6, 4, 3, 3)
    b = torch.randn(1, 6, 1, 1)
    z = torch.randn(2, 6, 9, 7)
    y = torch.full_like(z, float("nan"))
    act = ok(mi.miopenCreateActivationDescriptor())
    ok(mi.miopenSetActivationDescriptor(act, mi.miopenActivationLEAKYRELU, 0.2, 0.0, 1.0))
    conv = conv_desc()
    args = (
        handle,
        0.7,
        desc_of(x),
        x,
        desc_of(w),
        w,
        conv,
        mi.miopenConvolutionFwdAlgoImplicitGEMM,
        None,
        0,
        0.3,
        desc_of(z),
        z,
        desc_of(b),
        b,
        act,
        desc_of(y),
        y,
    )
    ok(mi.miopenConvolutionBiasActivationForward(*args))
    pre = 0.7 * torch.nn.functional.conv2d(x.double(), w.double(), padding=1) + 0.3 * z.double() + b.double()
    torch.testing.assert_close(y.double(), torch.where(pre > 0, pre, 0.2 * pre), rtol=1e-5, atol=1e-5)
    # z in place (z is y), and a bad filter: BadParm, y untouched
    ok(mi.miopenConvolutionBiasActivationForward(*args[:12], y, *args[13:]))
    before = y.clone()
    bad = list(args)
    bad[4] = desc_of(torch.randn(6, 3, 3, 3))
    bad[5] = torch.randn(6, 3, 3, 3)
    assert mi.miopenConvolutionBiasActivationForward(*bad) == S.miopenStatusBadParm
    bad = list(args)
    bad[12] = None
    assert mi.miopenConvolutionBiasActivationForward(*bad) == S.miopenStatusBadParm
    assert "z" in mi.miopenGetLastErrorString()
    assert torch.equal(y, before)


def test_last_error_is_per_thread():
    import threading

    mi.miopenCreateFusionPlan(9, None)
    main_msg = mi.miopenGetLastErrorString()
    seen = []
    t = threading.Thread(target=lambda: seen.append(mi.miopenGetLastErrorString()))
    t.start()
    t.join()
    assert main_msg and seen == [""]


def test_failed_calls_print_nothing_without_logging_configured():
    """A refused call is logged at WARNING on the ``fusionplan`` logger (the binding's contract),
    and an application that configured no logging sees nothing on stderr: the status and
    miopenGetLastErrorString() carry the reason."""
    import subprocess
    import sys

    code = (
        "from fusionplan.miopen import *\n"
        "status, d = miopenCreateTensorDescriptor()\n"
        "assert miopenSet4dTensorDescriptor(d, miopenFloat, 1, -3, 4, 4) == miopenStatusBadParm\n"
        "assert miopenGetLastErrorString()\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stderr == ""


def test_the_layer_keeps_miopens_ten_activation_modes():
    """The MIOpen enumeration has MIOpen's ten modes; fusionplan's extension values (SiLU = 100 ...)
    are BadParm through this layer, on operators and activation descriptors alike."""
    assert [m.value for m in mi.miopenActivationMode_t] == list(range(10))
    x_d = tensor_desc(mi.miopenFloat, (2, 4, 9, 7))
    plan = ok(mi.miopenCreateFusionPlan(mi.miopenVerticalFusion, x_d))
    for value in (100, 105, 10):
        assert mi.miopenCreateOpActivationForward(plan, value) == (S.miopenStatusBadParm, None)
        assert "not a valid value" in mi.miopenGetLastErrorString()
    assert (
        "SILU is in its Python API" in (mi.miopenCreateOpActivationForward(plan, 100), mi.miopenGetLastErrorString())[1]
    )
    desc = ok(mi.miopenCreateActivationDescriptor())
    assert mi.miopenSetActivationDescriptor(desc, 103, 1.0, 0.0, 1.0) == S.miopenStatusBadParm
