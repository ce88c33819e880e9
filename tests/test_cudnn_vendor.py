"""The cudnn solver (the vendor floor) without a GPU: which plans it takes, and which argument
sets go to cuDNN's one call and with what arguments (torch's cuDNN calls replaced by float64
stand-ins of their documented formula), and that the others run the folded stages right."""

import pytest
import torch
import torch.nn.functional as F

import fusionplan as fp
from fusionplan.core.enums import ActivationMode
from fusionplan.oracle.reference import run_reference
from fusionplan.solvers.cudnn_vendor import CudnnKernel, CudnnSolver, plan_shape_why_not
from fusionplan.tools.verify import TOLERANCE, add_chain, compare, random_record

from .util import CONV_SHAPES, make_input, plan_for, poisoned, shape_plan


class _CudaHandle:
    """What the solver reads of a handle: a CUDA device (its checks of cuDNN and dtype come next)."""

    device = torch.device("cuda")

    def tf32_allowed(self) -> bool:
        return False


def test_a_cpu_handle_is_refused_with_the_device_named():
    plan, _ = shape_plan("1x1", "CBNA", torch.float32, "NHWC")
    verdict = {v.solver: v for v in plan.explain(fp.Handle())}["cudnn"]
    assert not verdict.applicable and "CUDA devices only" in verdict.reason and "cpu" in verdict.reason


@pytest.mark.parametrize("chain", ["CBNA", "CNA", "CA", "CBA", "CNBA"])
def test_conv_affine_relu_chains_are_taken(chain, monkeypatch):
    monkeypatch.setattr("fusionplan.solvers.cudnn_vendor.cudnn_available", lambda: True)
    plan, _ = shape_plan("1x1", chain, torch.float16, "NHWC")
    solver = CudnnSolver()
    assert solver.why_not(plan.spec(), _CudaHandle()) is None
    assert solver.defer_why(plan.spec(), _CudaHandle()), "it runs only where find measured it faster"


@pytest.mark.parametrize(
    ("chain", "act", "words"),
    [
        ("CB", None, "ends with ReLU"),
        ("CN", None, "ends with ReLU"),
        ("NCA", None, "starts with the convolution"),
        ("BA", None, "starts with the convolution"),
        ("CBA", ActivationMode.LOGISTIC, "ends with ReLU"),
        ("CBA", ActivationMode.CLIPPEDRELU, "ends with ReLU"),
        ("CANA", None, "only bias and batch-norm"),
    ],
)
def test_other_chains_are_refused_with_the_reason(chain, act, words, monkeypatch):
    monkeypatch.setattr("fusionplan.solvers.cudnn_vendor.cudnn_available", lambda: True)
    x = make_input((2, 8, 7, 5), torch.float16, "NHWC")
    try:
        plan = add_chain(plan_for(x), chain, k=8, activation=act or ActivationMode.RELU)
    except fp.FusionError as exc:  # a chain the plan itself refuses: not the solver's question
        pytest.skip(f"the plan refuses {chain}: {exc}")
    reason = CudnnSolver().why_not(plan.spec(), _CudaHandle())
    assert reason is not None and words in reason
    assert plan_shape_why_not(plan.spec()) == reason


def test_double_data_and_missing_cudnn_are_refused(monkeypatch):
    plan, _ = shape_plan("1x1", "CBA", torch.float64, "NCHW")
    monkeypatch.setattr("fusionplan.solvers.cudnn_vendor.cudnn_available", lambda: True)
    assert "DOUBLE" in CudnnSolver().why_not(plan.spec(), _CudaHandle())
    monkeypatch.setattr("fusionplan.solvers.cudnn_vendor.cudnn_available", lambda: False)
    assert "no cuDNN" in CudnnSolver().why_not(plan.spec(), _CudaHandle())


def test_the_vendor_family_is_a_backend_choice():
    assert "vendor" in fp.core.settings.FAMILIES
    plan, _ = shape_plan("1x1", "CBA", torch.float32, "NCHW")
    with pytest.raises(fp.UnsupportedOpError, match="CUDA devices only"):
        plan.compile(fp.Handle(), backend="vendor")


# -- the kernel, with torch's cuDNN calls replaced --------------------------------------------


def _cudnn_relu(h):
    return torch.fmax(h, torch.zeros_like(h))


@pytest.fixture
def fake_cudnn(monkeypatch):
    """torch.cudnn_convolution_relu / _add_relu as float64 stand-ins of cuDNN's formula,
    relu(conv(x, w) + bias + alpha * z), recording each call's name and alpha. Their ReLU maps NaN
    to 0, as cuDNN's does, and an infinite input makes every output NaN, as its FFT engine can."""
    calls: list[tuple[str, float | None]] = []

    def conv(x, w, bias, stride, padding, dilation, groups):
        b = None if bias is None else bias.double()
        h = F.conv2d(x.double(), w.double(), b, stride, padding, dilation, groups)
        return h.fill_(float("nan")) if torch.isinf(x).any() else h

    def relu(x, w, bias, stride, padding, dilation, groups):
        assert w.dtype == x.dtype and (bias is None or bias.dtype == x.dtype)
        calls.append(("relu", None))
        return _cudnn_relu(conv(x, w, bias, stride, padding, dilation, groups)).to(x.dtype)

    def add_relu(x, w, z, alpha, bias, stride, padding, dilation, groups):
        assert w.dtype == x.dtype and z.dtype == x.dtype and isinstance(alpha, float)
        calls.append(("add_relu", alpha))
        h = conv(x, w, bias, stride, padding, dilation, groups) + alpha * z.double()
        return _cudnn_relu(h).to(x.dtype)

    monkeypatch.setattr(torch, "cudnn_convolution_relu", relu)
    monkeypatch.setattr(torch, "cudnn_convolution_add_relu", add_relu)
    return calls


def _run_kernel(plan, x, records, with_prior):
    y = poisoned(plan.output_desc, "NHWC" if x.is_contiguous(memory_format=torch.channels_last) else "NCHW")
    prior = torch.randn(y.shape, dtype=y.dtype).to(memory_format=torch.channels_last) if with_prior else None
    ref = run_reference(plan.ops, x, records, prior, torch.float64).output
    CudnnKernel(plan.spec(), tf32=False).run(x, y, records, prior)
    assert not torch.isnan(y).any(), "some output elements were not written"
    result = compare(y, ref)
    assert result.rel_norm < TOLERANCE[x.dtype], result
    assert result.rms_ok, result


def _records(plan, betas=None, alphas=None):
    betas, alphas = betas or {}, alphas or {}
    return [random_record(op, "cpu", alpha=alphas.get(op.index, 1.0), beta=betas.get(op.index, 0.0)) for op in plan.ops]


@pytest.mark.parametrize("shape", ["1x1", "stride2", "grouped", "dilation2", "asymmetric"])
@pytest.mark.parametrize("chain", ["CBNA", "CNA", "CA"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_conv_affine_relu_is_one_call(fake_cudnn, shape, chain, dtype, layout):
    plan, x = shape_plan(shape, chain, dtype, layout)
    _run_kernel(plan, x, _records(plan), with_prior=False)
    assert fake_cudnn == [("relu", None)]


@pytest.mark.parametrize("chain", ["CBA", "CA"])
def test_a_scalar_residual_on_the_convolution_is_add_relu(fake_cudnn, chain):
    plan, x = shape_plan("stride2", chain, torch.float16, "NHWC")
    _run_kernel(plan, x, _records(plan, {0: 0.75}), with_prior=True)
    assert fake_cudnn == [("add_relu", 0.75)]


def test_fuses_residual_form_is_add_relu(fake_cudnn):
    """fuse(model) puts a block's shortcut as batch-norm's beta = 1: relu(bn(conv(x)) + shortcut)."""
    plan, x = shape_plan("1x1", "CNA", torch.float16, "NHWC")
    _run_kernel(plan, x, _records(plan, {1: 1.0}), with_prior=True)
    assert fake_cudnn == [("add_relu", 1.0)]


@pytest.mark.parametrize(
    ("chain", "betas", "alphas"),
    [
        ("CNA", {0: 0.5}, {}),  # the prior's coefficient is per channel (batch-norm scales it)
        ("CBA", {2: 0.5}, {}),  # the prior is blended after the ReLU
        ("CBA", {}, {2: 2.0}),  # the ReLU's output scaled
        ("CNA", {}, {1: 0.5}),  # batch-norm's output scaled: folds into the weights, still one call
    ],
    ids=["per-channel-prior", "blend-after-relu", "relu-scaled", "bn-scaled"],
)
def test_what_one_call_cannot_express_runs_the_folded_stages(fake_cudnn, chain, betas, alphas):
    plan, x = shape_plan("grouped", chain, torch.float32, "NCHW")
    _run_kernel(plan, x, _records(plan, betas, alphas), with_prior=bool(betas))
    one_call = not betas and 2 not in alphas
    assert fake_cudnn == ([("relu", None)] if one_call else [])


def test_all_conv_shapes_reach_one_call(fake_cudnn):
    for shape in CONV_SHAPES:
        plan, x = shape_plan(shape, "CBA", torch.float32, "NHWC")
        _run_kernel(plan, x, _records(plan), with_prior=False)
    assert fake_cudnn == [("relu", None)] * len(CONV_SHAPES)


@pytest.mark.parametrize(("dtype", "tf32", "seen"), [(torch.float32, False, False), (torch.float32, True, True),
                                                      (torch.float16, False, "unchanged")])  # fmt: skip
def test_the_handles_tf32_holds_during_the_call_only(monkeypatch, dtype, tf32, seen):
    """cuDNN's TF32 switch as the handle has it during a float32 call, restored after; half data
    leaves it alone."""
    during = []
    monkeypatch.setattr(
        torch, "cudnn_convolution_relu", lambda x, w, *a: during.append(torch.backends.cudnn.allow_tf32) or x[:, :1]
    )
    plan, x = shape_plan("1x1", "CA", dtype, "NCHW")
    y = torch.empty(plan.output_desc.dims, dtype=dtype)
    kernel = CudnnKernel(plan.spec(), tf32=tf32)
    for before in (True, False):
        monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", before)
        kernel.run(x, y, _records(plan), None)
        assert during[-1] == (before if seen == "unchanged" else seen)
        assert torch.backends.cudnn.allow_tf32 == before


# -- what cuDNN's call would get wrong, or turns down ------------------------------------------


def _same_specials_and_close(y, ref):
    """NaN and each infinity where the float64 chain has them, and the finite rest within tolerance."""
    for special in (torch.isnan, torch.isposinf, torch.isneginf):
        assert torch.equal(special(y), special(ref.to(y.dtype))), special.__name__
    finite = torch.isfinite(ref)
    assert finite.any()
    result = compare(y[finite], ref[finite])
    assert result.rel_norm < TOLERANCE[y.dtype], result


@pytest.mark.parametrize("where", ["input NaN", "input Inf", "prior NaN"])
@pytest.mark.parametrize("shape", ["stride2", "grouped", "dilation2", "asymmetric"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_non_finite_data_comes_out_as_the_chain_computes_it(fake_cudnn, where, shape, dtype):
    """cuDNN's ReLU maps NaN to 0 and its transforms spread an Inf: with such data in the input or
    the prior, the outputs are computed directly, in the same launch that would copy cuDNN's."""
    plan, x = shape_plan(shape, "CBA", dtype, "NHWC")
    with_prior = where.startswith("prior")
    records = _records(plan, {0: 0.75} if with_prior else None)
    y = poisoned(plan.output_desc, "NHWC")
    prior = torch.randn(y.shape).to(dtype).to(memory_format=torch.channels_last) if with_prior else None
    target = prior if with_prior else x
    target[0, 1, 2, 3] = float("nan") if "NaN" in where else float("inf")
    target[-1, -1, -1, -2] = -float("inf")
    ref = run_reference(plan.ops, x, records, prior, torch.float64).output
    assert torch.isnan(ref).any() or torch.isinf(ref).any(), "the special must reach the output"
    CudnnKernel(plan.spec(), tf32=False).run(x, y, records, prior)
    assert fake_cudnn == [("add_relu", 0.75) if with_prior else ("relu", None)]
    _same_specials_and_close(y, ref)


def test_non_finite_data_on_the_folded_stages_runs_them_without_cudnn(fake_cudnn, monkeypatch):
    """A blend after the ReLU is no one call: the folded stages check the data on the host."""
    plan, x = shape_plan("grouped", "CBA", torch.float32, "NCHW")
    records = _records(plan, {2: 0.5})
    x[0, 0, 1, 1] = float("inf")
    y = torch.randn(plan.output_desc.dims)
    ref = run_reference(plan.ops, x, records, y.clone(), torch.float64).output
    enabled = []
    real_conv2d = F.conv2d
    monkeypatch.setattr(F, "conv2d", lambda *a: enabled.append(torch.backends.cudnn.enabled) or real_conv2d(*a))
    CudnnKernel(plan.spec(), tf32=False).run(x, y, records, y)
    assert fake_cudnn == [] and enabled == [False]
    _same_specials_and_close(y, ref)


@pytest.mark.parametrize("special", [None, "nan"])
@pytest.mark.parametrize(("x_layout", "y_form"), [("NHWC", "NCHW"), ("NCHW", "stepped"), ("NHWC", "x's storage")])
def test_the_store_follows_ys_strides(fake_cudnn, x_layout, y_form, special):
    """y in another layout than cuDNN's result, a stepped view, or in the storage that holds x:
    every element written where y's strides put it, and nothing else."""
    plan, x = shape_plan("1x1", "CBA", torch.float32, x_layout)
    dims = plan.output_desc.dims
    if y_form == "x's storage":  # x and y side by side in one buffer
        buf = torch.randn(x.numel() + y_numel(dims))
        x = buf[: x.numel()].view(x.shape[0], x.shape[2], x.shape[3], x.shape[1]).permute(0, 3, 1, 2).copy_(x)
        base, y = buf, buf[x.numel() :].view(dims[0], dims[2], dims[3], dims[1]).permute(0, 3, 1, 2)
    elif y_form == "stepped":
        base = torch.full((dims[0], dims[1], dims[2], dims[3] * 2), 7.0)
        y = base[..., ::2]
    else:
        base = y = poisoned(plan.output_desc, y_form)
    if special:
        x[1, 2, 3, 4] = float(special)
    x_before = x.clone()
    records = _records(plan)
    ref = run_reference(plan.ops, x_before, records, None, torch.float64).output
    CudnnKernel(plan.spec(), tf32=False).run(x, y, records, None)
    _same_specials_and_close(y, ref)
    assert torch.equal(x.nan_to_num(), x_before.nan_to_num()), "x was written"
    if y_form == "stepped":
        assert (base[..., 1::2] == 7.0).all(), "elements between y's were overwritten"


def y_numel(dims) -> int:
    return dims[0] * dims[1] * dims[2] * dims[3]


def test_a_16_bit_weight_that_folding_overflows_skips_the_call(fake_cudnn):
    """Batch-norm's scale folded into fp16 weights overflows (6e5 > 65504) where the chain's values do not."""
    plan, x = shape_plan("1x1", "CNA", torch.float16, "NHWC")
    x = (x.float() * 1e-4).half()
    records = _records(plan)
    bn = records[1]
    bn.scale.fill_(6e4)
    bn.variance.fill_(0.01)
    bn.mean.zero_()
    _run_kernel(plan, x, records, with_prior=False)
    assert fake_cudnn == []


def _no_engine(*args):
    raise RuntimeError("cuDNN error: GET was unable to find an engine to execute this computation")


def test_a_call_cudnn_has_no_engine_for_runs_the_folded_stages_from_then_on(monkeypatch):
    tries = []
    monkeypatch.setattr(torch, "cudnn_convolution_relu", lambda *a: tries.append(1) or _no_engine())
    plan, x = shape_plan("grouped", "CBA", torch.float16, "NCHW")
    kernel = CudnnKernel(plan.spec(), tf32=False)
    records = _records(plan)
    ref = run_reference(plan.ops, x, records, None, torch.float64).output
    for _ in range(2):
        y = poisoned(plan.output_desc)
        kernel.run(x, y, records, None)
        assert not torch.isnan(y).any()
        assert compare(y, ref).rel_norm < TOLERANCE[x.dtype]
    assert tries == [1] and kernel.no_engine


def test_another_error_of_the_call_is_raised_and_nothing_written(monkeypatch):
    def out_of_memory(*args):
        raise torch.OutOfMemoryError("CUDA out of memory")

    monkeypatch.setattr(torch, "cudnn_convolution_relu", out_of_memory)
    plan, x = shape_plan("1x1", "CBA", torch.float16, "NHWC")
    kernel = CudnnKernel(plan.spec(), tf32=False)
    y = poisoned(plan.output_desc, "NHWC")
    with pytest.raises(torch.OutOfMemoryError):
        kernel.run(x, y, _records(plan), None)
    assert torch.isnan(y).all() and not kernel.no_engine
