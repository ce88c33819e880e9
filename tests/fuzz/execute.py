"""One fuzz case: its tensors, its plan through one of three APIs, each solver that claims it, and
the checks of every run against the oracle.

Checks of a run: the call succeeds; every output element is written (outputs start as NaN, or
as the prior where an operator blends one in); NaN and +-Inf stand exactly where the oracle's
result, rounded to the output's dtype, has them; finite elements agree within the dtype's
tolerance and MIOpen's rms rule; the guard band around the output (and the gaps of a stepped
output view) is untouched. A misuse case must give a typed error (or a failing status) and leave
the whole output buffer as it was.
"""

from __future__ import annotations

import math
import os
import tempfile
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

import fusionplan as fp
import fusionplan.miopen as mi

from . import oracle
from .cases import PRELU_MODE, draw_case
from .pool import fatal_text

TORCH_DTYPES = {"float": torch.float32, "half": torch.float16, "bfloat16": torch.bfloat16, "double": torch.float64}
TOLERANCE = {torch.float32: 1e-5, torch.float16: 1e-2, torch.bfloat16: 1e-2, torch.float64: 1e-10}
TF32_TOLERANCE = 2e-3
EPS = {torch.float32: 2.0**-23, torch.float16: 2.0**-10, torch.bfloat16: 2.0**-7, torch.float64: 2.0**-52}
GUARD = 1152.0  # exact in every dtype; the guard band's value
MARGIN = 37  # guard elements before and after the output
MI_DTYPE = {
    "float": mi.miopenFloat,
    "half": mi.miopenHalf,
    "bfloat16": mi.miopenBFloat16,
    "double": mi.miopenDouble,
}
#: Solver families run in each mode: the CPU solvers, Triton's interpreter, or the GPU (sm90 builds
#: the GPU's Gluon kernels on the CPU instead of running them).
MODE_FAMILIES = {
    "cpu": ("cpu", "reference"),
    "interp": ("triton",),
    "gpu": ("triton", "vendor", "reference"),
    "sm90": (),
}
#: A Gluon solver's refusal on a CPU handle when the plan fits and only the device is missing.
GLUON_DEVICE_ONLY = "needs a Hopper GPU (Gluon has no interpreter)"


def only_the_device_missing(verdict) -> bool:
    """Whether a solver's verdict on a CPU handle refuses only for want of a Hopper GPU (a Gluon
    solver that would take the plan there)."""
    return bool(verdict.reason) and verdict.reason.startswith(GLUON_DEVICE_ONLY)


class StatusError(Exception):
    """A MIOpen-layer call that did not return Success."""

    def __init__(self, fn: str, status: int) -> None:
        super().__init__(f"{fn} returned {mi.miopenStatus_t(status).name}: {mi.miopenGetLastErrorString()}")
        self.status = status


@dataclass
class Run:
    solver: str
    failures: list[str] = field(default_factory=list)


# ---- tensors -------------------------------------------------------------------------------------
def _dense(shape, dtype, layout: str, device) -> torch.Tensor:
    t = torch.empty(shape, dtype=dtype, device=device)
    return t.contiguous(memory_format=torch.channels_last) if layout == "NHWC" and len(shape) == 4 else t


def _stepped(shape, dtype, layout: str, device, gap: int) -> torch.Tensor:
    """A 4-d view whose innermost rows are ``gap`` elements apart more than they need."""
    n, c, h, w = shape
    if layout == "NHWC":
        return torch.empty((n, h, w, c + gap), dtype=dtype, device=device)[..., :c].permute(0, 3, 1, 2)
    return torch.empty((n, c, h, w + gap), dtype=dtype, device=device)[..., :w]


def _odd_unit_strides(t: torch.Tensor, rng: np.random.Generator) -> torch.Tensor:
    """A copy of t whose size-1 axes have arbitrary strides (which the contract allows)."""
    strides = [s if d != 1 else int(rng.integers(1, 40)) for d, s in zip(t.shape, t.stride())]
    return torch.empty_strided(t.shape, strides, dtype=t.dtype, device=t.device).copy_(t)


def random_tensor(rng, shape, dtype, device, layout="NCHW", scale=1.0, shift=0.0, positive=False, view=False):
    """A tensor of random values (``rng`` None: uninitialized, a stand-in of the shape and layout)."""
    if rng is None:
        return _stepped(shape, dtype, layout, device, 1) if view else _dense(shape, dtype, layout, device)
    values = rng.random(shape) + 0.5 if positive else rng.standard_normal(shape) * scale + shift
    src = torch.from_numpy(np.asarray(values, dtype=np.float32)).to(dtype)
    t = (
        _stepped(shape, dtype, layout, device, int(rng.integers(1, 4)))
        if view
        else _dense(shape, dtype, layout, device)
    )
    return t.copy_(src.to(device))


def np64(t: torch.Tensor | None) -> np.ndarray | None:
    return None if t is None else t.detach().to("cpu", torch.float64).numpy()


# ---- the case's tensors and the oracle's result --------------------------------------------------
@dataclass
class Tensors:
    x: torch.Tensor
    args: list[dict]  # per operator: name -> tensor (or None)
    out_dims: tuple[int, ...]
    needs_prior: bool
    param_dims: list[tuple[int, ...] | None]


def _param_shape(rng, dims: tuple[int, ...]) -> tuple[int, ...]:
    """A parameter's shape: its descriptor's, or (half of the time) flat, as the contract allows."""
    return (math.prod(dims),) if rng is not None and rng.random() < 0.3 else dims


def make_tensors(case: dict, device, values: bool = True) -> Tensors:
    """The case's tensors (``values`` False: uninitialized stand-ins of inference chains, for asking
    which solvers claim the plan)."""
    rng = np.random.default_rng(case["data_seed"]) if values else None
    dt = TORCH_DTYPES[case["dtype"]]
    dims = tuple(case["dims"])
    x = random_tensor(rng, dims, dt, device, case["x_layout"], view=case["x_view"])
    _inject_specials(x, case["specials"], rng)
    args, param_dims = [], []
    cur = dims
    for op in case["ops"]:
        pdt = TORCH_DTYPES.get(op.get("param_dtype", case["dtype"]), dt)
        kind = op["kind"]
        a: dict = {}
        pd = None
        if kind == "conv":
            k, cg = op["k"], cur[1] // op["groups"]
            wdims = (k, cg, op["r"], op["s"])
            w = random_tensor(rng, wdims, dt, device, op["w_layout"], scale=1.0 / math.sqrt(cg * op["r"] * op["s"]))
            a["weight"] = _odd_unit_strides(w, rng) if op["w_odd_strides"] and rng else w
            cur = (cur[0], k, *op["out"])
        elif kind == "bias":
            pd = (1, cur[1], 1, 1)
            a["bias"] = random_tensor(rng, _param_shape(rng, pd), pdt, device)
        elif kind == "bn_stats":
            pd = (1, *cur[1:]) if op["per_activation"] else (1, cur[1], 1, 1)
            shape = _param_shape(rng, pd)
            for name in ("saved_mean", "saved_inv_variance"):
                a[name] = torch.full(shape, math.nan, dtype=pdt, device=device)
            if op["running"]:
                a["running_mean"] = random_tensor(rng, shape, pdt, device, scale=0.5)
                a["running_variance"] = random_tensor(rng, shape, pdt, device, positive=True)
        elif kind in ("bn", "bn_train", "bn_back"):
            pd = (1, *cur[1:]) if op["per_activation"] else (1, cur[1], 1, 1)
            shape = _param_shape(rng, pd)
            a["scale"] = random_tensor(rng, shape, pdt, device)
            a["bias"] = random_tensor(rng, shape, pdt, device)
            if kind == "bn":
                a["mean"] = random_tensor(rng, shape, pdt, device, scale=0.5)
                a["variance"] = random_tensor(rng, shape, pdt, device, positive=True)
            elif kind == "bn_train":
                for name in ("saved_mean", "saved_inv_variance"):
                    a[name] = torch.full(shape, math.nan, dtype=pdt, device=device)
                if op["running"]:
                    a["running_mean"] = random_tensor(rng, shape, pdt, device, scale=0.5)
                    a["running_variance"] = random_tensor(rng, shape, pdt, device, positive=True)
            else:
                axes = oracle.stat_axes(op["per_activation"])
                fx = random_tensor(rng, cur, dt, device, case["x_layout"])
                fxs = np64(fx)
                mean = fxs.mean(axis=axes, keepdims=True)
                inv = 1.0 / np.sqrt(fxs.var(axis=axes, keepdims=True) + 1e-5)
                a["x"] = fx
                a["saved_mean"] = torch.from_numpy(mean.reshape(shape).astype(np.float32)).to(pdt).to(device)
                a["saved_inv_variance"] = torch.from_numpy(inv.reshape(shape).astype(np.float32)).to(pdt).to(device)
                for name in ("result_scale_diff", "result_bias_diff"):
                    a[name] = torch.full(shape, math.nan, dtype=pdt, device=device)
        elif kind == "act" and op["mode"] == PRELU_MODE:
            pd = (1, 1 if op["one_slope"] else cur[1], 1, 1)
            a["slope"] = random_tensor(rng, _param_shape(rng, pd), pdt, device, scale=0.5, shift=0.25)
        elif kind == "act_back" and op["give_y"]:
            a["y"] = random_tensor(rng, cur, dt, device, case["x_layout"])
        args.append(a)
        param_dims.append(pd)
    needs_prior = any(op["beta"] != 0 for op in case["ops"])
    return Tensors(x, args, cur, needs_prior, param_dims)


def _inject_specials(x: torch.Tensor, count: int, rng) -> None:
    if not count or rng is None:
        return
    for _ in range(count):
        index = tuple(int(rng.integers(0, d)) for d in x.shape)
        value = [math.nan, math.inf, -math.inf][int(rng.integers(0, 3))]
        x[index] = value


def _finite_max(a: np.ndarray) -> float:
    with np.errstate(all="ignore"):
        finite = np.abs(a[np.isfinite(a)])
    return float(finite.max()) if finite.size else 0.0


@dataclass
class Expected:
    """The oracle's output; its side outputs ((op index, name) -> (value, magnitude)); the
    magnitude of the terms the output sums (rounding errors scale with them, not with the result:
    a convolution's or a reduction's cancellations); and per element, the slack that steep
    activations add: a solver's error within the tolerance at an activation's input moves a
    steep activation's output further (a square root near 0, a tanh of large gain)."""

    output: np.ndarray
    side: dict
    magnitude: float
    slack: np.ndarray | float = 0.0


def _activation_slack(op: dict, h: np.ndarray, allowed: np.ndarray, slack, alpha=None) -> np.ndarray:
    """What the activation adds to the slack at its output: how far its output moves when its
    input moves within the error ``allowed`` there (and the slack carried in), beyond that error
    itself (which later tolerances already cover for activations of slope at most 1). ``alpha``:
    activAlpha (the default), or PReLU's slopes."""
    alpha = op["a"] if alpha is None else alpha
    f = lambda v: oracle.activation(op["mode"], v, alpha, op["b"], op["g"])  # noqa: E731
    e = allowed + slack
    at = f(h)
    with np.errstate(all="ignore"):
        moved = np.maximum(np.abs(f(h + e) - at), np.abs(f(h - e) - at))
        grown = np.nan_to_num(moved - allowed, nan=0.0, posinf=0.0, neginf=0.0)
    return np.maximum(grown, 0.0)


def expected(case: dict, t: Tensors, prior: np.ndarray | None, tol: float = 0.0) -> Expected:
    """The oracle's answer for the case (``tol``: the element tolerance the runs are held to, which
    sets the activations' slack)."""
    h = np64(t.x)
    side: dict = {}
    ops = case["ops"]
    if case["phase"] == "backward":
        return _expected_backward(case, t, h, prior, side, tol)
    magnitude = _finite_max(h)
    slack: np.ndarray | float = 0.0
    for i, (op, a) in enumerate(zip(ops, t.args)):
        kind = op["kind"]
        pd = t.param_dims[i]
        p = {k: np64(v) if k == "weight" or v is None else np64(v).reshape(pd) for k, v in a.items()}
        if kind == "conv":
            r = oracle.conv2d(h, p["weight"], op["pad"], op["stride"], op["dil"], op["groups"])
            terms = oracle.conv2d(np.where(np.isfinite(h), np.abs(h), 0.0), np.abs(p["weight"]), op["pad"],
                                  op["stride"], op["dil"], op["groups"])  # fmt: skip
            magnitude = terms.max(initial=0.0)
            slack = (
                oracle.conv2d(
                    slack * np.ones_like(h), np.abs(p["weight"]), op["pad"], op["stride"], op["dil"], op["groups"]
                )  # fmt: skip
                if np.any(slack)
                else 0.0
            )
        elif kind == "bias":
            r = h + p["bias"]
            magnitude += _finite_max(p["bias"])
        elif kind == "bn":
            r = oracle.batchnorm_inference(h, p["scale"], p["bias"], p["mean"], p["variance"], op["eps"])
            with np.errstate(all="ignore"):
                gains = np.abs(p["scale"] / np.sqrt(p["variance"] + op["eps"]))
            gain = _finite_max(gains)
            magnitude = magnitude * gain + _finite_max(p["bias"]) + _finite_max(p["mean"]) * gain
            slack = slack * np.nan_to_num(gains) if np.any(slack) else 0.0
        elif kind == "act":
            alpha = p.get("slope", op["a"])  # PReLU's slopes, (1, C or 1, 1, 1)
            r = oracle.activation(op["mode"], h, alpha, op["b"], op["g"])
            slack = _activation_slack(op, h, tol * (np.abs(np.nan_to_num(h)) + magnitude), slack, alpha)
        elif kind in ("bn_train", "bn_stats"):
            ones = np.ones_like(p["saved_mean"])
            scale, shift = (p["scale"], p["bias"]) if kind == "bn_train" else (ones, 0.0 * ones)
            r, mean, inv, var, count = oracle.batchnorm_training(h, scale, shift, op["eps"], op["per_activation"])
            side[(i, "saved_mean")] = (mean, magnitude)
            side[(i, "saved_inv_variance")] = (inv, 0.0)
            if kind == "bn_stats":
                r = h  # the statistics pass their input through
                # of a computed chain's output, whose elements may be off by tol * magnitude (and their
                # slack): to first order the variance by 2 sqrt(var) times that, the inverse deviation
                # by half inv^3 times the variance's error (a small spread makes it ill-conditioned)
                off = tol * magnitude + (float(np.max(slack)) if np.any(slack) else 0.0)
                with np.errstate(all="ignore"):
                    inv_slack = np.nan_to_num(inv**3 * np.sqrt(var) * off)
                side[(i, "saved_inv_variance")] = (inv, 0.0, inv_slack)
            if op["running"]:
                f = op["factor"]
                side[(i, "running_mean")] = ((1 - f) * p["running_mean"] + f * mean, magnitude)
                unbiased = var * count / (count - 1)
                side[(i, "running_variance")] = ((1 - f) * p["running_variance"] + f * unbiased, magnitude**2)
            if kind == "bn_train":
                magnitude = _finite_max(r)
                slack = slack * np.nan_to_num(np.abs(p["scale"] * inv)) if np.any(slack) else 0.0
        else:
            raise ValueError(kind)
        magnitude = max(magnitude, _finite_max(r))
        h = oracle.blend(r, op["alpha"], op["beta"], prior)
        magnitude = abs(op["alpha"]) * magnitude + (abs(op["beta"]) * _finite_max(prior) if op["beta"] else 0.0)
        slack = slack * abs(op["alpha"])
    return Expected(h, side, magnitude, slack)


def _expected_backward(case, t: Tensors, dy, prior, side, tol: float = 0.0) -> Expected:
    ops = case["ops"]
    bn, a = ops[0], t.args[0]
    pd = t.param_dims[0]
    p = {k: np64(v).reshape(pd) for k, v in a.items() if k != "x"}
    x = np64(a["x"])
    g = dy
    g_slack: np.ndarray | float = 0.0
    if len(ops) > 1:
        act = ops[1]
        z = p["scale"] * (x - p["saved_mean"]) * p["saved_inv_variance"] + p["bias"]
        g = oracle.activation_backward(act["mode"], g, z, act["a"], act["b"], act["g"])
        g_slack = _backward_slack(act, dy, z, tol) * abs(act["alpha"])
        g = oracle.blend(g, act["alpha"], act["beta"], prior)
    dx, dscale, dbias = oracle.batchnorm_backward(
        g, x, p["scale"], p["saved_mean"], p["saved_inv_variance"], bn["per_activation"]
    )
    axes = oracle.stat_axes(bn["per_activation"])
    with np.errstate(all="ignore"):
        xhat = (x - p["saved_mean"]) * p["saved_inv_variance"]
        gain = np.abs(p["scale"] * p["saved_inv_variance"])
        # the activation's slack carried through the reductions and the dx pass
        bias_slack = np.sum(g_slack * np.ones_like(g), axis=axes, keepdims=True)
        scale_slack = np.sum(g_slack * np.abs(xhat), axis=axes, keepdims=True)
        count = g.size // bias_slack.size
        dx_slack = gain * (g_slack + bias_slack / count + np.abs(xhat) * scale_slack / count) * abs(bn["alpha"])
        side[(0, "result_scale_diff")] = (dscale, _finite_max(np.abs(g * xhat).sum(axis=axes)), scale_slack)
        side[(0, "result_bias_diff")] = (dbias, _finite_max(np.abs(g).sum(axis=axes)), bias_slack)
        terms = gain * (np.abs(g) + np.abs(xhat) * _finite_max(g))
    magnitude = _finite_max(terms) * abs(bn["alpha"])
    slack = np.nan_to_num(dx_slack, nan=0.0, posinf=0.0, neginf=0.0)
    return Expected(oracle.blend(dx, bn["alpha"], bn["beta"], prior), side, magnitude, slack)


def _backward_slack(act: dict, dy: np.ndarray, z: np.ndarray, tol: float) -> np.ndarray:
    """How far the activation's backward moves when its recomputed input moves by the kernels'
    error there (``tol`` times its size): POWER below 1 near its threshold has a derivative that
    grows without bound, so a rounding of z moves dz by much more than tol."""
    e = tol * (np.abs(np.nan_to_num(z)) + 1.0)
    f = lambda v: oracle.activation_backward(act["mode"], dy, v, act["a"], act["b"], act["g"])  # noqa: E731
    with np.errstate(all="ignore"):
        at = f(z)
        moved = np.maximum(np.abs(f(z + e) - at), np.abs(f(z - e) - at))
    return np.nan_to_num(moved, nan=0.0, posinf=0.0, neginf=0.0)


# ---- outputs in guard bands ------------------------------------------------------------------------
@dataclass
class Guarded:
    buffer: torch.Tensor  # 1-d: guard, the output's span, guard
    y: torch.Tensor  # the output: a view into buffer
    before: torch.Tensor  # buffer's contents before the call

    def changed_outside(self) -> int:
        """Elements of the buffer outside y's elements that differ (bitwise) from before the call."""
        inside = torch.zeros(self.buffer.numel(), dtype=torch.bool)
        index = torch.arange(self.buffer.numel()).as_strided(self.y.shape, self.y.stride(), self.y.storage_offset())
        inside[index.reshape(-1)] = True
        same = _bits(self.buffer.cpu()) == _bits(self.before.cpu())
        return int((~same & ~inside).sum())

    def changed_anywhere(self) -> int:
        return int((_bits(self.buffer.cpu()) != _bits(self.before.cpu())).sum())


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view({8: torch.int64, 4: torch.int32, 2: torch.int16}[t.element_size()])


def guarded_output(dims, dtype, layout: str, stepped: bool, device, fill: torch.Tensor | None, rng) -> Guarded:
    """An output of ``dims`` inside a guard band, set to NaN, or to ``fill`` (the prior)."""
    shape_of = (
        _stepped(dims, dtype, layout, "meta", int(rng.integers(1, 4)))
        if stepped
        else _dense(dims, dtype, layout, "meta")
    )
    strides = shape_of.stride()
    span = sum((d - 1) * s for d, s in zip(dims, strides)) + 1
    buffer = torch.full((span + 2 * MARGIN,), GUARD, dtype=dtype, device=device)
    y = buffer.as_strided(dims, strides, MARGIN)
    y.copy_(fill if fill is not None else torch.full(dims, math.nan, dtype=dtype))
    return Guarded(buffer, y, buffer.clone())


# ---- comparison ------------------------------------------------------------------------------------
def compare(
    name: str, out: torch.Tensor, ref: np.ndarray, tol: float, eps: float, magnitude: float = 0.0, slack=0.0
) -> list[str]:
    """Failures of ``out`` against the float64 ``ref`` (rounded to out's dtype first); errors are
    measured against max|ref|, or ``magnitude`` where the result is a difference of larger terms,
    each element allowed its ``slack`` besides (Expected.slack)."""
    ref = ref.reshape(out.shape)
    slack = np.asarray(slack, dtype=np.float64)
    slack = slack.reshape(ref.shape) if slack.size == ref.size else np.broadcast_to(slack, ref.shape)
    r = torch.from_numpy(ref).to(out.dtype).to(torch.float64).numpy()
    o = np64(out)
    failures = []
    for what, test in (("NaN", np.isnan), ("+Inf", np.isposinf), ("-Inf", np.isneginf)):
        mo, mr = test(o), test(r)
        if (mo != mr).any():
            failures.append(
                f"{name}: {what} at {int((mo & ~mr).sum())} elements where the oracle has none, "
                f"missing at {int((mr & ~mo).sum())} (first at {np.argwhere(mo != mr)[0].tolist()})"
            )
    finite = np.isfinite(o) & np.isfinite(r)
    if not finite.any():
        return failures
    with np.errstate(invalid="ignore"):  # inf - inf where both are infinite (not compared here)
        diff = np.abs(o - r)[finite]
    scale = max(np.abs(r[finite]).max(), magnitude, 1e-30)
    allowed = slack.reshape(o.shape)[finite]
    bound = tol * (np.abs(r[finite]) + scale) + allowed
    if (diff > bound).any():
        worst = int(np.argmax(diff - bound))
        failures.append(
            f"{name}: {int((diff > bound).sum())} of {diff.size} elements off (worst {o[finite][worst]!r} "
            f"vs {r[finite][worst]!r}; max|ref| {scale:.3g}, tolerance {tol:g})"
        )
    beyond = np.maximum(diff - allowed, 0.0)
    rms = math.sqrt(float((beyond**2).mean())) / scale
    if rms >= 80 * eps:
        failures.append(f"{name}: rms(out - ref) / max|ref| = {rms:.3g} >= 80 eps ({80 * eps:.3g})")
    return failures


# ---- the three APIs ----------------------------------------------------------------------------------
def _desc_dims(t: torch.Tensor) -> fp.TensorDescriptor:
    return fp.TensorDescriptor.from_tensor(t)


def _param_desc(t: torch.Tensor, dims) -> fp.TensorDescriptor:
    return fp.TensorDescriptor.packed(fp.DataType.from_torch(t.dtype), dims)


def _records(case: dict, t: Tensors) -> list:
    recs = []
    for op, a in zip(case["ops"], t.args):
        blend = {"alpha": op["alpha"], "beta": op["beta"]}
        kind = op["kind"]
        if kind == "conv":
            recs.append(fp.ConvArgs(weight=a["weight"], **blend))
        elif kind == "bias":
            recs.append(fp.BiasArgs(bias=a["bias"], **blend))
        elif kind == "bn":
            recs.append(fp.BatchNormInferenceArgs(**a, epsilon=op["eps"], **blend))
        elif kind == "act":
            activation = {"activ_alpha": op["a"], "activ_beta": op["b"], "activ_gamma": op["g"]}
            recs.append(fp.ActivationArgs(**activation, slope=a.get("slope"), **blend))
        elif kind == "bn_train":
            recs.append(fp.BatchNormForwardArgs(**a, exp_avg_factor=op["factor"], epsilon=op["eps"], **blend))
        elif kind == "bn_stats":
            recs.append(fp.BatchNormStatisticsArgs(**a, exp_avg_factor=op["factor"], epsilon=op["eps"], **blend))
        elif kind == "bn_back":
            recs.append(fp.BatchNormBackwardArgs(**a, **blend))
        else:
            acts = {"activ_alpha": op["a"], "activ_beta": op["b"], "activ_gamma": op["g"]}
            recs.append(fp.ActivationBackwardArgs(y=a.get("y"), **acts, **blend))
    return recs


class CorePlan:
    """fp.FusionPlan, its descriptors made from the tensors."""

    def __init__(self, case: dict, t: Tensors, handle: fp.Handle) -> None:
        self.handle = handle
        self.plan = fp.FusionPlan(_desc_dims(t.x))
        for op, a, pd in zip(case["ops"], t.args, t.param_dims):
            kind = op["kind"]
            mode = fp.BatchNormMode.PER_ACTIVATION if op.get("per_activation") else fp.BatchNormMode.SPATIAL
            if kind == "conv":
                conv = fp.ConvolutionDescriptor(tuple(op["pad"]), tuple(op["stride"]), tuple(op["dil"]), op["groups"])
                self.plan.add_conv_forward(conv, _desc_dims(a["weight"]))
            elif kind == "bias":
                self.plan.add_bias_forward(_param_desc(a["bias"], pd))
            elif kind == "bn":
                self.plan.add_batchnorm_inference(mode, _param_desc(a["scale"], pd))
            elif kind == "act":
                self.plan.add_activation_forward(op["mode"])
            elif kind == "bn_train":
                self.plan.add_batchnorm_forward(mode, op["running"])
            elif kind == "bn_stats":
                self.plan.add_batchnorm_statistics(mode, op["running"])
            elif kind == "bn_back":
                self.plan.add_batchnorm_backward(mode)
            else:
                self.plan.add_activation_backward(op["mode"])
        self.args = fp.OperatorArgs()
        for op, rec in zip(self.plan.ops, _records(case, t)):
            self.args.set(op, rec)

    def solvers(self) -> list[tuple[str, str]]:
        return [(v.solver, v.family) for v in self.plan.explain(self.handle) if v.applicable]

    def compile(self, solver: str | None) -> None:
        self.plan.compile(self.handle, solver=solver)

    def execute(self, x, y) -> None:
        self.plan.execute(self.handle, x, y, self.args)


class ApiPlan(CorePlan):
    """fp.Plan, built from the tensors themselves."""

    def __init__(self, case: dict, t: Tensors, handle: fp.Handle) -> None:
        self.handle = handle
        p = fp.Plan(t.x, handle=handle)
        for op, a in zip(case["ops"], t.args):
            blend = {"alpha": op["alpha"], "beta": op["beta"]}
            kind = op["kind"]
            if kind == "conv":
                p.conv(
                    a["weight"],
                    stride=op["stride"],
                    padding=op["pad"],
                    dilation=op["dil"],
                    groups=op["groups"],
                    **blend,
                )
            elif kind == "bias":
                p.bias(a["bias"], **blend)
            elif kind == "bn":
                mode = "per_activation" if op["per_activation"] else "spatial"
                p.batchnorm(a["scale"], a["bias"], a["mean"], a["variance"], eps=op["eps"], mode=mode, **blend)
            elif kind == "bn_stats":
                mode = "per_activation" if op["per_activation"] else "spatial"
                stats = [a.get(n) for n in ("saved_mean", "saved_inv_variance", "running_mean", "running_variance")]
                p.statistics(*stats, exp_avg_factor=op["factor"], eps=op["eps"], mode=mode)
            else:
                activation = {"activ_alpha": op["a"], "activ_beta": op["b"], "activ_gamma": op["g"]}
                p.activation(op["mode"], **activation, slope=a.get("slope"), **blend)
        self.api = p
        self.plan = p.core

    def compile(self, solver: str | None) -> None:
        self.api.compile(solver=solver)

    def execute(self, x, y) -> None:
        self.api(x, out=y)


def _ok(fn, *args):
    result = fn(*args)
    status = result[0] if isinstance(result, tuple) else result
    if status != mi.miopenStatusSuccess:
        raise StatusError(fn.__name__, status)
    return result[1] if isinstance(result, tuple) and len(result) == 2 else result


def _mi_desc(t_or_dims, dtype: str, strides=None):
    desc = _ok(mi.miopenCreateTensorDescriptor)
    if isinstance(t_or_dims, torch.Tensor):
        dims, strides = list(t_or_dims.shape), list(t_or_dims.stride())
    else:
        dims = list(t_or_dims)
        strides = strides or list(fp.TensorDescriptor.packed(MI_DTYPE[dtype], dims).strides)
    _ok(mi.miopenSetTensorDescriptor, desc, MI_DTYPE[dtype], len(dims), dims, strides)
    return desc


def _dtype_name(t: torch.Tensor) -> str:
    return {v: k for k, v in TORCH_DTYPES.items()}[t.dtype]


class MiopenPlan:
    """fusionplan.miopen, call for call as a port of MIOpen C code would make them."""

    def __init__(self, case: dict, t: Tensors, handle: fp.Handle) -> None:
        self.core_handle = handle
        self.handle = _ok(mi.miopenCreateOnDevice, str(handle.device))
        self.x_desc = _mi_desc(t.x, case["dtype"])
        self.plan = _ok(mi.miopenCreateFusionPlan, mi.miopenVerticalFusion, self.x_desc)
        self.args = _ok(mi.miopenCreateOperatorArgs)
        ops = []
        for op, a, pd in zip(case["ops"], t.args, t.param_dims):
            kind = op["kind"]
            mode = mi.miopenBNPerActivation if op.get("per_activation") else mi.miopenBNSpatial
            if kind == "conv":
                conv = _ok(mi.miopenCreateConvolutionDescriptor)
                _ok(
                    mi.miopenInitConvolutionDescriptor,
                    conv,
                    mi.miopenConvolution,
                    *op["pad"],
                    *op["stride"],
                    *op["dil"],
                )
                _ok(mi.miopenSetConvolutionGroupCount, conv, op["groups"])
                w = a["weight"]
                ops.append(_ok(mi.miopenCreateOpConvForward, self.plan, conv, _mi_desc(w, case["dtype"])))
            elif kind == "bias":
                ops.append(_ok(mi.miopenCreateOpBiasForward, self.plan, _mi_desc(pd, _dtype_name(a["bias"]))))
            elif kind == "bn":
                desc = _mi_desc(pd, _dtype_name(a["scale"]))
                ops.append(_ok(mi.miopenCreateOpBatchNormInference, self.plan, mode, desc))
            elif kind == "act":
                ops.append(_ok(mi.miopenCreateOpActivationForward, self.plan, op["mode"]))
            elif kind == "bn_train":
                ops.append(_ok(mi.miopenCreateOpBatchNormForward, self.plan, mode, op["running"]))
            elif kind == "bn_stats":
                ops.append(_ok(mi.miopenCreateOpBatchNormStatistics, self.plan, mode, op["running"]))
            elif kind == "bn_back":
                ops.append(_ok(mi.miopenCreateOpBatchNormBackward, self.plan, mode))
            else:
                ops.append(_ok(mi.miopenCreateOpActivationBackward, self.plan, op["mode"]))
        for op, mop, a in zip(case["ops"], ops, t.args):
            self._set_args(op, mop, a)
        self.dtype = case["dtype"]

    def _set_args(self, op: dict, mop, a: dict) -> None:
        al, be, kind = op["alpha"], op["beta"], op["kind"]
        if kind == "conv":
            _ok(mi.miopenSetOpArgsConvForward, self.args, mop, al, be, a["weight"])
        elif kind == "bias":
            _ok(mi.miopenSetOpArgsBiasForward, self.args, mop, al, be, a["bias"])
        elif kind == "bn":
            _ok(
                mi.miopenSetOpArgsBatchNormInference,
                *(self.args, mop, al, be, a["scale"], a["bias"], a["mean"], a["variance"], op["eps"]),
            )
        elif kind == "act":
            _ok(mi.miopenSetOpArgsActivForward, self.args, mop, al, be, op["a"], op["b"], op["g"])
        elif kind == "bn_train":
            _ok(
                mi.miopenSetOpArgsBatchNormForward,
                *(self.args, mop, al, be, a["scale"], a["bias"], a["saved_mean"], a["saved_inv_variance"]),
                *(a.get("running_mean"), a.get("running_variance"), op["factor"], op["eps"]),
            )
        elif kind == "bn_stats":
            _ok(
                mi.miopenSetOpArgsBatchNormStatistics,
                *(self.args, mop, al, be, a["saved_mean"], a["saved_inv_variance"]),
                *(a.get("running_mean"), a.get("running_variance"), op["factor"], op["eps"]),
            )
        elif kind == "bn_back":
            _ok(
                mi.miopenSetOpArgsBatchNormBackward,
                *(self.args, mop, al, be, a["x"], a["scale"], a["bias"], a["result_scale_diff"]),
                *(a["result_bias_diff"], a["saved_mean"], a["saved_inv_variance"]),
            )
        else:
            _ok(mi.miopenSetOpArgsActivBackward, self.args, mop, al, be, a.get("y"), None, op["a"], op["b"], op["g"])

    def solvers(self) -> list[tuple[str, str]]:
        return [(v.solver, v.family) for v in self.plan.core.explain(self.handle.core) if v.applicable]

    def compile(self, solver: str | None) -> None:
        if solver is None:
            _ok(mi.miopenCompileFusionPlan, self.handle, self.plan)
        else:  # the MIOpen layer has no way to name a solver; the plan it wraps has
            self.plan.core.compile(self.handle.core, solver=solver)

    def execute(self, x, y) -> None:
        y_desc = _mi_desc(list(y.shape), self.dtype, list(y.stride())) if isinstance(y, torch.Tensor) else self.x_desc
        _ok(mi.miopenExecuteFusionPlan, self.handle, self.plan, self.x_desc, x, y_desc, y, self.args)


APIS = {"plan": ApiPlan, "core": CorePlan, "miopen": MiopenPlan}


# ---- running a case ------------------------------------------------------------------------------------
def claims(case: dict, handle: fp.Handle, solver: str) -> bool:
    """Whether ``solver`` takes the case's plan on ``handle`` (asked of stand-in tensors; with the
    sm90 mode's rule for Gluon solvers on the CPU: only the device missing)."""
    plan = CorePlan(case, make_tensors(case, handle.device, values=False), handle)
    for v in plan.plan.explain(handle):
        if v.solver == solver:
            return v.applicable or (case["mode"] == "sm90" and only_the_device_missing(v))
    raise ValueError(f"no solver named {solver!r}")


#: Draws (the plain one and its variants) focused_case tries before it gives up on the focus for an index.
FOCUS_TRIES = 400


def focused_case(seed: int, index: int, mode: str, options: dict, handle: fp.Handle) -> dict:
    """Case ``index`` as ``options`` draw it; with ``options["focus"]`` (a solver's name, or several
    separated by commas, taken in turn), the first of the index's draws that solver takes: the
    plain draw, then its variants (plain and layer-like in turn), so that solvers the draws seldom
    reach get their share of runs."""
    args = (options["training"], options["misuse"], options.get("layers", 0.0))
    case = draw_case(seed, index, mode, *args, models=options.get("models", 0.0))
    if not options.get("focus") or "misuse" in case or case.get("kind") == "model":
        return case
    names = options["focus"].split(",")
    focus = names[index % len(names)]  # several solvers: the indices take them in turn
    for variant in range(1, FOCUS_TRIES):
        if case["phase"] == "inference" and claims(case, handle, focus):
            return case
        case = draw_case(seed, index, mode, *args, variant=variant)
    return case


def fuzz_handle(mode: str) -> fp.Handle:
    """The handle a mode's cases run on (sm90: TF32 allowed, as on the GPU by default for Gluon's fp32)."""
    if mode == "gpu":
        return fp.Handle("cuda")
    return fp.Handle("cpu", allow_tf32=True) if mode == "sm90" else fp.Handle("cpu")


def tolerance(dtype: torch.dtype, handle: fp.Handle) -> tuple[float, float]:
    """(element tolerance, eps for the rms rule) of a run on ``handle``."""
    if dtype == torch.float32 and handle.device.type == "cuda" and handle.tf32_allowed():
        return TF32_TOLERANCE, 2.0**-10
    return TOLERANCE[dtype], EPS[dtype]


#: The side outputs of each operator kind: NaN before every run, so that each must be written.
SIDE_OUTPUTS = {
    "bn_train": ("saved_mean", "saved_inv_variance"),
    "bn_stats": ("saved_mean", "saved_inv_variance"),
    "bn_back": ("result_scale_diff", "result_bias_diff"),
}


def _reset_side_outputs(case: dict, t: Tensors) -> None:
    for op, a in zip(case["ops"], t.args):
        for name in SIDE_OUTPUTS.get(op["kind"], ()):
            a[name].fill_(math.nan)


def picked(name: str, only: str | None) -> bool:
    """Whether solver ``name`` is among ``only``: prefixes, comma separated (None: every solver)."""
    return only is None or name.startswith(tuple(only.split(",")))


def run_case(case: dict, handle: fp.Handle, progress=None, only: str | None = None) -> list[Run]:
    """Every run of ``case``: one per solver that claims it (of the mode's families; with ``only``,
    of those whose names start with one of its prefixes). ``progress(solver)`` is called before each, so that a
    crash can be named."""
    if case.get("kind") == "model":
        return _model_runs(case, handle, progress, only)
    device = handle.device
    t = make_tensors(case, device)
    running0 = {
        (i, n): a[n].clone() for i, a in enumerate(t.args) for n in ("running_mean", "running_variance") if n in a
    }
    plan = APIS[case["api"]](case, t, handle)
    if "misuse" in case:
        return [_misuse(case, plan, t, handle, progress)]
    if case["mode"] == "sm90":
        return _sm90_builds(plan, t, handle, progress, only)
    claimed = [name for name, family in plan.solvers() if family in MODE_FAMILIES[case["mode"]]]
    chosen = [name for name in claimed if picked(name, only)]
    if not chosen:
        return []  # no run: the oracle's float64 chain is not worth computing
    dt = TORCH_DTYPES[case["dtype"]]
    rng = np.random.default_rng(case["data_seed"] + 1)
    prior = random_tensor(rng, t.out_dims, dt, device) if t.needs_prior else None
    tol, eps = tolerance(dt, handle)
    want = expected(case, t, np64(prior) if prior is not None else None, tol)
    runs = []
    for name in chosen:
        if progress:
            progress(name)
        run = Run(name)
        runs.append(run)
        for key, value in running0.items():  # each run updates the running statistics from the same start
            t.args[key[0]][key[1]].copy_(value)
        _reset_side_outputs(case, t)
        layout = case["x_layout"] if case["y_layout"] == "same" else case["y_layout"]
        out = guarded_output(t.out_dims, dt, layout, case["y_view"], device, prior, rng)
        try:
            plan.compile(name)
            plan.execute(t.x, out.y)
            if device.type == "cuda":
                torch.cuda.synchronize(device)  # a fault of the kernel shows here
        except Exception as exc:  # any error on a valid plan is a failure
            run.failures.append(f"{type(exc).__name__}: {exc}"[:600])
            if fatal_text(run.failures[-1] + str(exc.__cause__)):
                break  # the CUDA context is lost: the worker reports and ends
            continue
        run.failures += compare("output", out.y, want.output, tol, eps, want.magnitude, want.slack)
        outside = out.changed_outside()
        if outside:
            run.failures.append(f"{outside} elements outside the output were overwritten")
        for (i, n), (value, scale, *slack) in want.side.items():
            run.failures += compare(f"operator {i} {n}", t.args[i][n], value, tol, eps, scale, *slack)
    return runs


def _model_runs(case: dict, handle: fp.Handle, progress, only: str | None) -> list[Run]:
    """A random fused model's steps against eager's (tests/fuzz/models.py): one run."""
    from .models import RUN_NAME, run_model_case

    if not picked(RUN_NAME, only):
        return []
    if progress:
        progress(RUN_NAME)
    run = Run(RUN_NAME)
    try:
        run.failures = run_model_case(case, handle.device)
    except Exception as exc:  # an error the eager copies did not raise
        run.failures.append(f"{type(exc).__name__}: {exc}"[:600])
    return [run]


# ---- Gluon kernels built on the CPU -------------------------------------------------------------------
def _sm90_builds(plan, t: Tensors, handle: fp.Handle, progress, only: str | None) -> list[Run]:
    """A run per Gluon solver that takes the plan but for the device: its kernel built and its
    launch made (the tensor descriptors, the layouts, the constants), as compiling ahead would on
    sm_90; with FUSIONPLAN_FUZZ_SM90_COMPILE=1 also compiled for sm_90 by Triton's own ptxas."""
    from fusionplan.runtime.sass import captured_launch, compile_for_hopper
    from fusionplan.solvers import solver_named

    core = plan.plan.core if isinstance(plan, MiopenPlan) else plan.plan
    names = [v.solver for v in core.explain(handle) if only_the_device_missing(v)]
    spec = core.spec()
    runs = []
    for name in (n for n in names if picked(n, only)):
        if progress:
            progress(name)
        run = Run(name)
        runs.append(run)
        try:
            kernel = solver_named(name).build(spec, handle)
            for with_prior in (False, True) if t.needs_prior else (False,):
                if os.environ.get("FUSIONPLAN_FUZZ_SM90_COMPILE") == "1":
                    compile_for_hopper(kernel, with_prior)
                else:
                    captured_launch(kernel, with_prior)
        except Exception as exc:  # a solver that takes a plan must build it
            run.failures.append(f"{type(exc).__name__}: {exc}"[:600])
    return runs


# ---- misuse ------------------------------------------------------------------------------------------------
def _readonly_array(dims, memmap: bool):
    if memmap:
        fd, path = tempfile.mkstemp(suffix=".fuzz")
        os.close(fd)
        np.memmap(path, dtype=np.float32, mode="w+", shape=tuple(dims)).flush()
        arr = np.memmap(path, dtype=np.float32, mode="r", shape=tuple(dims))
        os.unlink(path)  # the mapping stays valid
        return arr
    arr = np.full(tuple(dims), np.nan, dtype=np.float32)
    arr.flags.writeable = False
    return arr


def _misuse(case: dict, plan, t: Tensors, handle: fp.Handle, progress) -> Run:
    kind = case["misuse"]
    run = Run(f"misuse:{kind}")
    if progress:
        progress(run.solver)
    dt = TORCH_DTYPES[case["dtype"]]
    device = handle.device
    rng = np.random.default_rng(case["data_seed"] + 2)
    dims = list(t.out_dims)
    x = t.x
    out = guarded_output(tuple(dims), dt, "NCHW", False, device, None, rng)
    y: Any = out.y
    if kind == "not_compiled" and isinstance(plan, ApiPlan):
        return run  # fp.Plan compiles on first use, as documented
    if kind != "not_compiled":
        plan.compile(None)
    if kind == "output_dtype":
        other = torch.float64 if dt != torch.float64 else torch.float32
        out = guarded_output(tuple(dims), other, "NCHW", False, device, None, rng)
        y = out.y
    elif kind == "output_shape":
        dims[int(rng.integers(0, 4))] += 1
        out = guarded_output(tuple(dims), dt, "NCHW", False, device, None, rng)
        y = out.y
    elif kind == "output_overlaps":
        if math.prod(dims) == 1:
            return run  # one element cannot overlap itself
        strides = list(out.y.stride())
        strides[max(range(4), key=lambda d: dims[d])] = 0  # a longest axis' elements all in one place
        y = out.buffer.as_strided(tuple(dims), tuple(strides), MARGIN)
    elif kind in ("output_readonly", "output_memmap_readonly"):
        if device.type != "cpu" or dt != torch.float32:
            return run
        y = _readonly_array(dims, kind == "output_memmap_readonly")
        before = np.array(y, copy=True)
    elif kind == "input_shape":
        x = torch.randn(x.shape[0], x.shape[1] + 1, *x.shape[2:], device=device).to(dt)
    elif kind == "input_dtype":
        x = x.to(torch.float64 if dt != torch.float64 else torch.float32)
    elif kind == "missing_args":
        plan.args = mi.miopenCreateOperatorArgs()[1] if isinstance(plan, MiopenPlan) else fp.OperatorArgs()
        if isinstance(plan, ApiPlan):
            plan.api.args = fp.OperatorArgs()
    elif kind == "weight_shape":
        return run  # caught when the arguments are set (a BadParm then), never reaching execute
    side_before = _side_outputs(case, t)
    try:
        plan.execute(x, y)
        run.failures.append(f"misuse {kind}: the call succeeded")
    except StatusError as exc:
        if exc.status == mi.miopenStatusSuccess:
            run.failures.append(f"misuse {kind}: Success")
    except fp.FusionPlanError:
        pass
    except Exception as exc:
        run.failures.append(f"misuse {kind}: untyped {type(exc).__name__}: {exc}"[:400])
    if isinstance(y, np.ndarray):
        if not np.array_equal(np.asarray(y), before, equal_nan=True):
            run.failures.append(f"misuse {kind}: the read-only output was written")
    elif out.changed_anywhere():
        run.failures.append(f"misuse {kind}: {out.changed_anywhere()} elements of the output buffer were written")
    for (i, name), before in side_before.items():
        now = t.args[i][name]
        if not bool(((now == before) | (now.isnan() & before.isnan())).all()):
            run.failures.append(f"misuse {kind}: operator {i}'s {name} was written")
    return run


def _side_outputs(case: dict, t: Tensors) -> dict:
    """Copies of every tensor a plan's operators write besides the output (saved and running
    statistics, parameter gradients): a refused call must leave them as they were too."""
    names = {kind: (*outputs, "running_mean", "running_variance") for kind, outputs in SIDE_OUTPUTS.items()}
    return {
        (i, n): a[n].clone()
        for i, (op, a) in enumerate(zip(case["ops"], t.args))
        for n in names.get(op["kind"], ())
        if n in a
    }
