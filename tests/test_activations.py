"""Every activation mode against its formula (float64), and its backward against the calculus."""

import math
import warnings

import pytest
import torch

from fusionplan.core.activations import ACTIVATIONS, POWER_EPS, activation_backward, activation_forward
from fusionplan.core.enums import ActivationMode as M


def scalar_formula(mode, x, a, b, g):
    """The formulas of the MIOpen documentation, one float at a time."""
    if mode == M.PASTHRU:
        return x
    if mode == M.LOGISTIC:
        return 1 / (1 + math.exp(-x))
    if mode == M.TANH:
        return b * math.tanh(a * x)
    if mode == M.RELU:
        return max(0.0, x)
    if mode == M.SOFTRELU:
        return math.log1p(math.exp(x)) if x < 30 else x + math.log1p(math.exp(-x))
    if mode == M.ABS:
        return abs(x)
    if mode == M.POWER:
        base = a + b * x
        return base**g if base > POWER_EPS else 0.0
    if mode == M.CLIPPEDRELU:
        return min(a, max(0.0, x))
    if mode in (M.LEAKYRELU, M.PRELU):  # PReLU's slope in alpha's place, one channel's
        return x if x > 0 else a * x
    if mode == M.ELU:
        return x if x > 0 else a * (math.exp(x) - 1)
    return extension_formula(mode, x)


def extension_formula(mode, x):
    """fusionplan's extension modes, from their definitions."""
    softplus = math.log1p(math.exp(x)) if x < 30 else x + math.log1p(math.exp(-x))
    if mode == M.SILU:
        return x / (1 + math.exp(-x)) if x > -700 else 0.0
    if mode == M.HARDSWISH:
        return x * min(max(x + 3, 0.0), 6.0) / 6
    if mode == M.HARDSIGMOID:
        return min(max(x / 6 + 0.5, 0.0), 1.0)
    if mode == M.GELU:
        return x * (1 + math.erf(x / math.sqrt(2))) / 2
    if mode == M.GELU_TANH:
        return x * (1 + math.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3))) / 2
    if mode == M.MISH:
        return x * math.tanh(softplus)
    raise AssertionError(mode)


PARAMS = [(1.0, 0.0, 1.0), (0.3, 1.7, 2.0), (2.5, -0.5, 0.5)]


@pytest.mark.parametrize("mode", list(M))
@pytest.mark.parametrize("params", PARAMS)
def test_forward_matches_formula(mode, params):
    a, b, g = params
    x = torch.cat(
        [torch.randn(500, dtype=torch.float64) * 3, torch.tensor([0.0, 50.0, -50.0, 1e-7], dtype=torch.float64)]
    )
    y = activation_forward(mode, x, a, b, g)
    expected = torch.tensor([scalar_formula(mode, v, a, b, g) for v in x.tolist()], dtype=torch.float64)
    torch.testing.assert_close(y, expected, rtol=1e-12, atol=1e-12)


def test_every_mode_has_an_entry():
    assert set(ACTIVATIONS) == set(M)


def test_power_threshold_is_1e6():
    # alpha + beta*x straddles the threshold: exactly at 1e-6 the result is 0, just above it is not.
    x = torch.tensor([POWER_EPS, 1.5e-6, 0.0, -1.0], dtype=torch.float64)
    y = activation_forward(M.POWER, x, 0.0, 1.0, 0.5)
    assert y[0] == 0 and y[2] == 0 and y[3] == 0
    assert y[1] == pytest.approx(math.sqrt(1.5e-6))


@pytest.mark.parametrize("alpha", [0.0, 0.6, 6.0])
def test_clipped_relu_uses_alpha_as_ceiling(alpha):
    x = torch.linspace(-3, 8, 101, dtype=torch.float64)
    y = activation_forward(M.CLIPPEDRELU, x, alpha, 0.0, 1.0)
    assert y.max().item() == pytest.approx(alpha) and y.min().item() == 0.0


def test_tanh_alpha_beta_leaky_elu_parameters():
    x = torch.tensor([-2.0, 1.0], dtype=torch.float64)
    assert activation_forward(M.TANH, x, 0.5, 3.0, 1.0).tolist() == pytest.approx(
        [3 * math.tanh(-1.0), 3 * math.tanh(0.5)]
    )
    assert activation_forward(M.LEAKYRELU, x, 0.25, 0, 1).tolist() == pytest.approx([-0.5, 1.0])
    assert activation_forward(M.ELU, x, 2.0, 0, 1).tolist() == pytest.approx([2 * (math.exp(-2) - 1), 1.0])


@pytest.mark.parametrize("mode", list(M))
@pytest.mark.parametrize("params", PARAMS)
def test_backward_matches_autograd(mode, params):
    a, b, g = params
    x = torch.randn(400, dtype=torch.float64) * 2
    if mode == M.POWER:  # keep away from the kink at the threshold
        x = x[((a + b * x) - POWER_EPS).abs() > 1e-3]
    if mode in (M.RELU, M.ABS, M.LEAKYRELU, M.ELU, M.CLIPPEDRELU, M.PRELU):
        x = x[(x.abs() > 1e-6) & ((x - a).abs() > 1e-6)]
    x.requires_grad_(True)
    dy = torch.randn_like(x)
    (grad,) = torch.autograd.grad(activation_forward(mode, x, a, b, g), x, dy)
    dx = activation_backward(mode, dy, x.detach(), a, b, g)
    if mode == M.HARDSIGMOID:  # torch's own backward takes float32's 1/6 in float64 too (3e-8 off)
        grad = dy * ((x > -3) & (x < 3)).detach() / 6
    torch.testing.assert_close(dx, grad, rtol=1e-10, atol=1e-12)


def test_prelu_takes_a_slope_per_channel():
    x = torch.randn(2, 3, 4, 5, dtype=torch.float64, requires_grad=True)
    slope = torch.tensor([0.25, -0.5, 2.0], dtype=torch.float64).view(1, 3, 1, 1)
    y = activation_forward(M.PRELU, x, slope, 0.0, 1.0)
    torch.testing.assert_close(y, torch.nn.functional.prelu(x, slope.flatten()), rtol=0, atol=0)
    dy = torch.randn_like(x)
    (grad,) = torch.autograd.grad(y, x, dy)
    torch.testing.assert_close(activation_backward(M.PRELU, dy, x.detach(), slope, 0.0, 1.0), grad)


@pytest.mark.parametrize("mode", [m for m in M if m.is_extension])
def test_extension_backward_keeps_a_nan_or_infinite_dy(mode):
    """dy * f'(x) is NaN where dy is NaN or infinite and f'(x) is 0 (README: NaN and Inf), as the
    Triton kernels compute it; torch's Hardswish backward would select 0 there."""
    x = torch.tensor([-5.0, -5.0, 5.0, 0.5], dtype=torch.float64)
    dy = torch.tensor([float("nan"), float("inf"), float("nan"), 1.0], dtype=torch.float64)
    dx = activation_backward(mode, dy, x, 1.0, 0.0, 1.0)
    assert torch.isnan(dx[0]) and torch.isnan(dx[2]) and torch.isfinite(dx[3])
    assert not torch.isfinite(dx[1])


def test_power_backward_uses_dy():
    # MIOpen's own POWER backward ignores dy; the calculus does not.
    x = torch.tensor([1.0, 2.0], dtype=torch.float64)
    one = activation_backward(M.POWER, torch.ones(2, dtype=torch.float64), x, 1.0, 1.0, 2.0)
    three = activation_backward(M.POWER, 3 * torch.ones(2, dtype=torch.float64), x, 1.0, 1.0, 2.0)
    torch.testing.assert_close(three, 3 * one)


def test_softrelu_is_stable_for_large_inputs():
    y = activation_forward(M.SOFTRELU, torch.tensor([1000.0, -1000.0]), 1, 0, 1)
    assert torch.isfinite(y).all() and y[0].item() == 1000.0 and y[1].item() == 0.0


@pytest.mark.parametrize("mode", [m for m in M if m.is_extension], ids=lambda m: m.name)
def test_extension_kernel_code_matches_the_table(mode, tmp_path, monkeypatch):
    """The Triton formulas of the extension modes (epilogue.ACTIVATION_CODE and _BACKWARD_CODE, tl.*
    primitives only) against the float64 table, through Triton's interpreter: within fp32's
    rounding where finite, NaN and Inf where torch gives them (forward)."""
    pytest.importorskip("triton")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    import importlib.util

    from fusionplan.runtime.epilogue import ACTIVATION_BACKWARD_CODE, ACTIVATION_CODE

    forward = ACTIVATION_CODE[mode].format(x="x", a="1.0", b="0.0", g="1.0")
    backward = ACTIVATION_BACKWARD_CODE[mode].format(dy="dy", x="x", a="1.0", b="0.0", g="1.0")
    source = tmp_path / "act.py"
    source.write_text(
        "import triton\nimport triton.language as tl\n\n\n@triton.jit\n"
        "def kernel(x_ptr, dy_ptr, y_ptr, dx_ptr, N: tl.constexpr):\n"
        "    i = tl.arange(0, N)\n    x = tl.load(x_ptr + i)\n    dy = tl.load(dy_ptr + i)\n"
        f"    tl.store(y_ptr + i, {forward})\n    tl.store(dx_ptr + i, {backward})\n"
    )
    spec = importlib.util.spec_from_file_location("act_kernel", source)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    special = [-float("inf"), -100.0, -3.0, 3.0, 0.0, 100.0, float("inf"), float("nan")]
    x = torch.cat([torch.tensor(special), torch.randn(120) * 4]).float()
    dy = torch.randn(128)
    y, dx = torch.full((128,), 7.0), torch.full((128,), 7.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # numpy's overflow warnings of exp(large), as intended
        module.kernel[(1,)](x, dy, y, dx, 128)
    want = activation_forward(mode, x.double(), 1.0, 0.0, 1.0)
    assert torch.equal(torch.isnan(y), torch.isnan(want)) and torch.equal(torch.isinf(y), torch.isinf(want))
    finite = torch.isfinite(want)
    assert (y.double() - want)[finite].abs().max() < 1e-5 * max(1.0, want[finite].abs().max().item())
    want_dx = activation_backward(mode, dy.double(), x.double(), 1.0, 0.0, 1.0)
    finite = torch.isfinite(want_dx) & torch.isfinite(x)
    assert (dx.double() - want_dx)[finite].abs().max() < 1e-5


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_gelu_of_plus_infinity_is_plus_infinity(dtype):
    """torch 2.13's vectorized GELU on AVX512 CPUs gives NaN at +Inf below float64 (the fuzzer, --mode
    cpu --seed 20261201 --index 34); the definition, x (1 + erf(x / sqrt(2))) / 2, gives +Inf."""
    x = torch.tensor([math.inf, -3.0, 0.5, 2.0] * 16, dtype=dtype)  # long enough for the vector path
    y = activation_forward(M.GELU, x, 1.0, 0.0, 1.0)
    assert torch.isposinf(y[::4]).all()
    torch.testing.assert_close(y[1::4].double(), torch.nn.functional.gelu(x[1::4].double()), rtol=1e-2, atol=1e-3)
