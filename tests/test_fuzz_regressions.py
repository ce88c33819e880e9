"""Regression tests of the bugs the fuzzer found: crashes, silently wrong results, writes outside
the output, written read-only outputs, stale derived weights, NaN and Inf lost or invented."""

from __future__ import annotations

import math
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest
import torch

import fusionplan as fp
import fusionplan.miopen as mi
from fusionplan.oracle.torch_conv import canonical_strides
from fusionplan.runtime.codegen import interpreter_active

from .fuzz import oracle
from .fuzz.execute import GUARD, MARGIN, compare

CPU_SOLVERS = ("cpu-folded", "reference")
#: Triton's solvers on CPU tensors run through its interpreter (on a GPU machine, the GPU tests cover them).
interpreted = pytest.mark.skipif(not interpreter_active(), reason="Triton's interpreter is off (a GPU is present)")


def _solvers(*names: str) -> list:
    """``names`` as parameters, the Triton ones skipped where the interpreter is off."""
    return [pytest.param(n, marks=interpreted) if n.startswith("triton") else n for n in names]


def _run_child(code: str) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter: a crash there fails the test instead of killing pytest."""
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=300)


def _conv_ref(x, w, pad, stride, dil, groups, bias=None):
    y = oracle.conv2d(x.double().numpy(), w.double().numpy(), pad, stride, dil, groups)
    return y if bias is None else y + bias.double().numpy().reshape(1, -1, 1, 1)


# ---- 1. torch's CPU convolution crashes on thin channels-last planes with a bias ---------------------
@pytest.mark.parametrize("solver", CPU_SOLVERS)
def test_thin_channels_last_plane_with_bias_does_not_crash(solver):
    child = _run_child(
        f"""
        import torch, fusionplan as fp
        x = torch.randn(2, 8, 18, 1).contiguous(memory_format=torch.channels_last)
        w, b = torch.randn(8, 8, 1, 1), torch.randn(8)
        for bn in (False, True):
            p = fp.Plan(x).conv(w, padding=(0, 3), stride=(1, 2), dilation=(2, 3))
            p = p.batchnorm(torch.randn(8), b, torch.randn(8), torch.rand(8) + 0.5) if bn else p.bias(b)
            p.compile(solver="{solver}")
            y = p(x)
            assert y.shape == (2, 8, 18, 4) and torch.isfinite(y).all()
        print("ok")
        """
    )
    assert child.returncode == 0 and "ok" in child.stdout, child.stderr[-2000:]


def test_thin_plane_result_is_right():
    x = torch.randn(2, 8, 18, 1).contiguous(memory_format=torch.channels_last)
    w, b = torch.randn(8, 8, 1, 1), torch.randn(8)
    want = _conv_ref(x, w, (0, 3), (1, 2), (2, 3), 1, b)
    for solver in CPU_SOLVERS:
        p = fp.Plan(x).conv(w, padding=(0, 3), stride=(1, 2), dilation=(2, 3)).bias(b)
        p.compile(solver=solver)
        assert not compare(solver, p(x), want, 1e-5, 2.0**-23)


def test_thin_planes_go_to_torch_in_nchw_and_16_bit_data_in_fp32(monkeypatch):
    """The calls torch_conv hands torch on the CPU: small planes as NCHW copies (channels-last ones
    read past the input: values up to 1e38, fuzz case --seed 20261201 --index 1243), 16-bit data
    in fp32 (bf16 channels-last kernels miscompute and crash on CPUs with AVX512-BF16)."""
    import torch.nn.functional as F

    from fusionplan.oracle import torch_conv

    calls = []
    real = F.conv2d

    def spy(x, w, *args):
        calls.append((x.stride(), w.stride(), x.dtype, w.dtype))
        return real(x, w, *args)

    monkeypatch.setattr(F, "conv2d", spy)
    conv = fp.ConvolutionDescriptor((2, 2), (1, 2), (3, 1))
    x = torch.randn(2, 3, 13, 2).contiguous(memory_format=torch.channels_last)
    w = torch.randn(4, 3, 5, 5).contiguous(memory_format=torch.channels_last)
    torch_conv.conv2d(x, w, None, conv)
    assert calls[-1][:2] == (canonical_strides((2, 3, 13, 2), False), canonical_strides((4, 3, 5, 5), False))
    wide = torch.randn(2, 3, 13, 9).contiguous(memory_format=torch.channels_last)
    y = torch_conv.conv2d(wide.to(torch.bfloat16), w.to(torch.bfloat16), torch.randn(4).to(torch.bfloat16), conv)
    assert calls[-1][2:] == (torch.float32, torch.float32) and y.dtype == torch.bfloat16
    assert calls[-1][0] == canonical_strides((2, 3, 13, 9), True)  # wide planes keep their layout


@pytest.mark.parametrize("solver", CPU_SOLVERS)
def test_bf16_channels_last_view_with_an_infinity_is_right(solver):
    """Fuzz case --seed 20261201 --index 1243: a bf16 channels-last view of width 2, a 5x5 filter
    with padding, stride 2 and dilation 3, an infinity in the input."""
    base = torch.randn(2, 13, 2, 3).to(torch.bfloat16)
    x = base[..., :1].permute(0, 3, 1, 2)  # (2, 1, 13, 2), pixels 3 elements apart
    x[0, 0, 9, 0] = math.inf
    w = torch.randn(1, 1, 5, 5).to(torch.bfloat16)
    p = fp.Plan(x).conv(w, padding=(2, 2), stride=(1, 2), dilation=(3, 1))
    p.compile(solver=solver)
    want = _conv_ref(x, w, (2, 2), (1, 2), (3, 1), 1)
    assert not compare(solver, p(x), want, 1e-2, 2.0**-7)


# ---- 2. torch's CPU convolution miscomputes grouped weights with odd strides on size-1 axes -----------
@pytest.mark.parametrize("solver", CPU_SOLVERS)
@pytest.mark.parametrize("chain", ["C", "CB", "CNA"])
def test_grouped_weight_with_odd_unit_strides(solver, chain):
    torch.manual_seed(3)
    x = torch.randn(2, 18, 9, 10).contiguous(memory_format=torch.channels_last)
    w = torch.randn(12, 2, 3).permute(0, 2, 1).unsqueeze(-1)  # (12, 3, 2, 1), strides (6, 1, 3, 1)
    assert w.stride() == (6, 1, 3, 1) and w.stride() != canonical_strides(tuple(w.shape), True)
    p = fp.Plan(x).conv(w, stride=(2, 3), groups=6)
    want = _conv_ref(x, w, (0, 0), (2, 3), (1, 1), 6)
    if "B" in chain:
        b = torch.randn(12)
        p.bias(b)
        want = want + b.double().numpy().reshape(1, -1, 1, 1)
    if "N" in chain:
        s, sh, m, v = torch.randn(12), torch.randn(12), torch.randn(12), torch.rand(12) + 0.5
        p.batchnorm(s, sh, m, v, eps=1e-5)
        r = lambda t: t.double().numpy().reshape(1, -1, 1, 1)  # noqa: E731
        want = oracle.batchnorm_inference(want, r(s), r(sh), r(m), r(v), 1e-5)
        p.relu()
        want = oracle.activation(3, want, 1, 0, 1)
    p.compile(solver=solver)
    assert not compare(solver, p(x), want, 1e-5, 2.0**-23)


@pytest.mark.parametrize("solver", CPU_SOLVERS)
@pytest.mark.parametrize("groups", [1, 4])
def test_one_channel_groups_into_one_output_column(solver, groups):
    """Fuzz case --mode cpu --seed 94 --index 22965: a channels-last input whose groups read one
    channel each, a 7x7 filter, stride 3 along W, one output column: torch's CPU convolution gave
    wrong values (up to 1e37) in channels-last strides."""
    torch.manual_seed(5)
    base = torch.randn(3, 6, 3, groups).to(torch.bfloat16)  # NHWC storage
    x = base.permute(0, 3, 1, 2)  # (3, C, 6, 3), channel stride 1
    w = torch.randn(groups, 1, 7, 7).to(torch.bfloat16)
    p = fp.Plan(x).conv(w, padding=(2, 3), stride=(1, 3), groups=groups)
    p.compile(solver=solver)
    want = _conv_ref(x, w, (2, 3), (1, 3), (1, 1), groups)
    assert not compare(solver, p(x), want, 1e-2, 2.0**-7)


# ---- 3. triton-pointwise on planes of width 1 whose H stride is not their W stride ------------------
@interpreted
def test_pointwise_width_one_stepped_output_interpreter():
    x = torch.randn(2, 1, 12, 1).contiguous(memory_format=torch.channels_last)
    x = torch.empty_strided((2, 1, 12, 1), (12, 1, 1, 5)).copy_(x)  # H stride 1, W stride 5
    b = torch.randn(1)
    buffer = torch.full((2 * 36 + 2 * MARGIN,), GUARD)
    y = buffer.as_strided((2, 1, 12, 1), (36, 1, 3, 1), MARGIN)  # a stepped view: rows 3 apart
    y.fill_(math.nan)
    before = buffer.clone()
    p = fp.Plan(x).bias(b)
    p.compile(solver="triton-pointwise")
    p(x, out=y)
    assert torch.equal(y, x + b)
    inside = torch.zeros_like(buffer, dtype=torch.bool)
    inside[torch.arange(buffer.numel()).as_strided(y.shape, y.stride(), MARGIN).reshape(-1)] = True
    assert torch.equal(buffer[~inside], before[~inside]), "elements outside the output were written"


# ---- 4. read-only outputs -------------------------------------------------------------------------------
def _plan_and_args():
    x = torch.randn(1, 2, 3, 4)
    p = fp.Plan(x).bias(torch.randn(2)).relu()
    p.compile()
    return p, x


def test_readonly_numpy_output_is_badparm():
    p, x = _plan_and_args()
    y = np.full((1, 2, 3, 4), 7.0, dtype=np.float32)
    y.flags.writeable = False
    with pytest.raises(fp.BadParmError, match="read-only"):
        p(x, out=y)
    assert (y == 7.0).all()


def test_readonly_output_through_miopen_is_badparm():
    p, x = _plan_and_args()
    y = np.full((1, 2, 3, 4), 7.0, dtype=np.float32)
    y.flags.writeable = False
    status, desc = mi.miopenCreateTensorDescriptor()
    mi.miopenSet4dTensorDescriptor(desc, mi.miopenFloat, 1, 2, 3, 4)
    handle = mi.miopenHandle(p.handle)
    status = mi.miopenExecuteFusionPlan(handle, mi.miopenFusionPlanDescriptor(p.core), desc, x, desc, y, _args(p))
    assert status == mi.miopenStatusBadParm and "read-only" in mi.miopenGetLastErrorString()
    assert (y == 7.0).all()


def _args(p: fp.Plan) -> mi.miopenOperatorArgs:
    args = mi.miopenOperatorArgs()
    args.core = p.args
    return args


def test_readonly_memmap_output_is_badparm(tmp_path):
    child = _run_child(
        f"""
        import numpy as np, torch, fusionplan as fp
        path = {str(tmp_path / "y.bin")!r}
        np.memmap(path, dtype=np.float32, mode="w+", shape=(1, 2, 3, 4)).flush()
        y = np.memmap(path, dtype=np.float32, mode="r", shape=(1, 2, 3, 4))
        x = torch.randn(1, 2, 3, 4)
        p = fp.Plan(x).bias(torch.randn(2)).relu()
        try:
            p(x, out=y)
        except fp.BadParmError as exc:
            assert "read-only" in str(exc)
            print("ok")
        """
    )
    assert child.returncode == 0 and "ok" in child.stdout, child.stderr[-2000:]


def test_readonly_side_output_is_badparm():
    plan = fp.FusionPlan(fp.TensorDescriptor.packed("float", (2, 3, 4, 4)))
    op = plan.add_batchnorm_forward(fp.BatchNormMode.SPATIAL, False)
    saved = np.zeros((1, 3, 1, 1), dtype=np.float32)
    saved.flags.writeable = False
    record = fp.BatchNormForwardArgs(scale=torch.ones(3), bias=torch.zeros(3), saved_mean=saved)
    with pytest.raises(fp.BadParmError, match="read-only"):
        fp.OperatorArgs().set(op, record)


# ---- 5. arguments edited in place -----------------------------------------------------------------------
def _bn_conv_plan(w, solver: str):
    """C -> N plan (its batch-norm folds into the weights: derived data), compiled by ``solver``."""
    x = torch.randn(2, 4, 6, 5)
    bn = (torch.randn(5), torch.randn(5), torch.randn(5), torch.rand(5) + 0.5)
    p = fp.Plan(x).conv(w, padding=1).batchnorm(*bn)
    p.compile(solver=solver)
    return p, x, bn


def _cn_ref(x, w, bn):
    s, sh, m, v = (t.double().numpy().reshape(1, -1, 1, 1) for t in bn)
    w = torch.as_tensor(np.asarray(w))
    return oracle.batchnorm_inference(_conv_ref(x, w, (1, 1), (1, 1), (1, 1), 1), s, sh, m, v, 1e-5)


@pytest.mark.parametrize("solver", _solvers("cpu-folded", "triton-conv"))
def test_dlpack_weight_edited_in_numpy_is_seen(solver):
    w = np.random.default_rng(0).standard_normal((5, 4, 3, 3)).astype(np.float32)
    p, x, bn = _bn_conv_plan(w, solver)
    assert not compare("first", p(x), _cn_ref(x, w, bn), 1e-5, 2.0**-23)
    w *= -2.0  # behind torch's back: no version counter moves
    assert not compare("after the edit", p(x), _cn_ref(x, w, bn), 1e-5, 2.0**-23)


@pytest.mark.parametrize("solver", _solvers("cpu-folded", "triton-conv"))
def test_torch_edits_are_seen_and_hidden_edits_need_a_new_set(solver):
    """The contract (README, arguments edited in place): torch's in-place ops move the version
    counter and are seen; edits behind it (``.data``, ``.numpy()``) are seen after the argument
    is set again."""
    w = torch.randn(5, 4, 3, 3)
    p, x, bn = _bn_conv_plan(w, solver)
    p(x)
    w.mul_(0.5)
    assert not compare("torch edit", p(x), _cn_ref(x, w, bn), 1e-5, 2.0**-23)
    w.data.mul_(3.0)
    w.numpy()[0] = 1.0
    p.update(0, weight=w)
    assert not compare("set again", p(x), _cn_ref(x, w, bn), 1e-5, 2.0**-23)


def test_inference_tensor_weights_are_never_stale():
    with torch.inference_mode():
        w = torch.randn(5, 4, 3, 3)
        p, x, bn = _bn_conv_plan(w, "cpu-folded")
        p(x)
        w.mul_(-1.0)  # inference tensors have no version counter
        assert not compare("inference tensor", p(x), _cn_ref(x, w, bn), 1e-5, 2.0**-23)


# ---- 6. NaN and Inf ---------------------------------------------------------------------------------------
ACTS = {0: (1, 0, 1), 1: (1, 0, 1), 2: (0.7, 1.3, 1), 3: (1, 0, 1), 4: (1, 0, 1), 5: (1, 0, 1), 6: (0.5, 0.8, 0.0),
        7: (0.6, 0, 1), 8: (0.1, 0, 1), 9: (0.9, 0, 1)}  # fmt: skip


def _specials(x: torch.Tensor) -> torch.Tensor:
    flat = x.view(-1)
    flat[::7] = math.nan
    flat[3::11] = math.inf
    flat[5::13] = -math.inf
    return x


@pytest.mark.parametrize("mode", sorted(ACTS))
@pytest.mark.parametrize("solver", _solvers("cpu-folded", "reference", "triton-pointwise"))
def test_activation_keeps_nan_and_inf(mode, solver):
    x = _specials(torch.randn(2, 3, 5, 4))
    b = torch.randn(3)
    a, bb, g = ACTS[mode]
    p = fp.Plan(x).bias(b).activation(mode, activ_alpha=a, activ_beta=bb, activ_gamma=g)
    p.compile(solver=solver)
    want = oracle.activation(mode, x.double().numpy() + b.double().numpy().reshape(1, -1, 1, 1), a, bb, g)
    assert not compare(solver, p(x), want, 1e-5, 2.0**-23)


ON_GPU = torch.cuda.is_available()
needs_gpu = pytest.mark.gpu  # deselected where there is no GPU (conftest.py)
#: The Toeplitz solvers run on the GPU where there is one, else through the interpreter.
STEM_SOLVERS = [
    *(("triton-stem", "triton-conv") if ON_GPU else _solvers("triton-stem", "triton-conv")),
    "cpu-folded",
    pytest.param("gluon-stem", marks=needs_gpu),
]


@pytest.mark.parametrize("layout", ["NHWC", "NCHW"])
@pytest.mark.parametrize("solver", STEM_SOLVERS)
def test_infinite_input_makes_nan_only_where_read(solver, layout):
    """The stem's Toeplitz blocks hold zeros for the taps a pixel does not meet: an infinite input
    there must not reach that pixel (0 * inf)."""
    device = "cuda" if ON_GPU and solver != "cpu-folded" else "cpu"
    dtype = torch.float16 if device == "cuda" else torch.float32  # fp32 products would be TF32
    x = torch.randn(1, 3, 16, 16)
    x[0, 1, 5, 7] = math.inf
    x[0, 2, 9, 2] = -math.inf
    x[0, 0, 12, 12] = math.nan
    if layout == "NHWC":
        x = x.contiguous(memory_format=torch.channels_last)
    w = torch.randn(8, 3, 7, 7) * 0.1
    x, w = x.to(dtype), w.to(dtype)
    p = fp.Plan(x.to(device)).conv(w.to(device), padding=3, stride=2).relu()
    p.compile(solver=solver)
    want = oracle.activation(3, _conv_ref(x.double(), w.double(), (3, 3), (2, 2), (1, 1), 1), 1, 0, 1)
    eps = torch.finfo(dtype).eps
    assert not compare(solver, p(x.to(device)).cpu(), want, 1e-2 if dtype == torch.float16 else 1e-5, eps)


# ---- 7. smaller inconsistencies ---------------------------------------------------------------------------
def test_plan_batchnorm_takes_flat_per_activation_parameters():
    x = torch.randn(2, 3, 4, 5)
    s, sh, m, v = torch.randn(60), torch.randn(60), torch.randn(60), torch.rand(60) + 0.5
    y = fp.Plan(x).batchnorm(s, sh, m, v, mode="per_activation")(x)
    r = lambda t: t.double().numpy().reshape(1, 3, 4, 5)  # noqa: E731
    assert not compare(
        "bn", y, oracle.batchnorm_inference(x.double().numpy(), r(s), r(sh), r(m), r(v), 1e-5), 1e-5, 2.0**-23
    )


def test_kernel_failure_is_internal_error():
    x = torch.randn(1, 2, 3, 3)
    p = fp.Plan(x).bias(torch.randn(2))
    p.compile()
    kernel = p.core._compiled[p.handle.uid].kernel

    def broken(*args):
        raise RuntimeError("a fault inside the kernel")

    kernel.run = broken
    y = torch.full((1, 2, 3, 3), math.nan)
    with pytest.raises(fp.InternalError, match="a fault inside the kernel"):
        p(x, out=y)


def test_threads_through_the_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # CPU tensors on machines with a GPU too
    errors, plans = [], []
    for i in range(4):
        x = torch.randn(1, 3 + i, 4, 5)
        p = fp.Plan(x).bias(torch.randn(3 + i)).relu()
        p.compile(solver="triton-pointwise")
        plans.append((p, x))

    def work(p, x):
        try:
            for _ in range(3):
                y = p(x)
                want = torch.relu(x + p.args.get(p.core.ops[0]).bias)
                assert torch.allclose(y, want)
        except Exception as exc:  # collected: pytest sees only the main thread's
            errors.append(exc)

    threads = [threading.Thread(target=work, args=pt) for pt in plans]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


def test_activation_code_keeps_nan_on_the_gpu():
    """On the GPU tl.maximum / tl.minimum return the other operand for a NaN unless told to
    propagate it (the interpreter's numpy always does, so runs there cannot tell): every clamp of
    the activation's input says so."""
    from fusionplan.runtime.epilogue import ACTIVATION_CODE

    for mode, code in ACTIVATION_CODE.items():
        for clamp in ("tl.maximum({x}", "tl.minimum({x}", "tl.minimum(tl.maximum({x}"):
            at = code.find(clamp)
            while at >= 0:
                assert "PropagateNan.ALL" in code[at : code.find(")", code.find("propagate_nan", at)) + 1], mode.name
                at = code.find(clamp, at + 1)
