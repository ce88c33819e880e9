"""The epilogue: what runs on a convolution's accumulator (or a pointwise plan's input) after the
main loop, independent of the kernel that computes it.

- ``ACTIVATION_CODE``: the activations' formulas, over fp32 values, in ``tl.*`` primitives only
  (no libdevice), so that the same code runs in Triton's interpreter; Gluon kernels take the
  same text with ``gl.`` for ``tl.``. ``ACTIVATION_BACKWARD_CODE``: their backward, for the
  training plans. A new activation is one entry in each (and one in activations.py,
  the oracle).
- ``emit_stages``: the source of a chain's stages (folding.pointwise_stages) over a tile ``h``:
  each affine stage a scale and shift (and a prior), each activation its formula over its
  parameters ``a{i} b{i} g{i}`` (activAlpha, activBeta, activGamma) and its blend ``al{i} be{i}``.
- ``stage_arguments``: the values of those parameters for one argument set, in emit_stages'
  order, and the constexpr flags that specialize them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from fusionplan.core.enums import ActivationMode
from fusionplan.core.ops import ActivationArgs, ActivationForwardOp, FusionOp, OpArgs
from fusionplan.runtime.folding import ActStage, AffineStage, Stage, stage_affine

Tensor = torch.Tensor


#: Forward formulas over fp32 values: {x} the input, {a} {b} {g} activAlpha, activBeta, activGamma.
#: NaN stays NaN, as in torch's ops: max and min propagate it (by default the GPU's return the other
#: operand). The flag is spelled through ``triton.language`` so that Gluon's copy (``gl.`` for
#: ``tl.``) keeps it; one max.NaN instruction, as cheap as the plain max.
_NAN = "propagate_nan=triton.language.PropagateNan.ALL"
_NONNEGATIVE = "tl.maximum({x}, 0.0, " + _NAN + ")"
ACTIVATION_CODE: dict[ActivationMode, str] = {
    ActivationMode.PASTHRU: "{x}",
    ActivationMode.LOGISTIC: "1.0 / (1.0 + tl.exp(-{x}))",
    ActivationMode.TANH: "{b} * (2.0 / (1.0 + tl.exp(-2.0 * {a} * {x})) - 1.0)",
    ActivationMode.RELU: _NONNEGATIVE,
    ActivationMode.SOFTRELU: _NONNEGATIVE + " + tl.log(1.0 + tl.exp(-tl.abs({x})))",
    ActivationMode.ABS: "tl.abs({x})",
    ActivationMode.POWER: (  # x ** 0 is 1 even where x is infinite (exp(0 * log(inf)) would be NaN)
        "tl.where({a} + {b} * {x} > 1e-6, "
        "tl.where({g} == 0.0, 1.0, tl.exp({g} * tl.log(tl.maximum({a} + {b} * {x}, 1e-6)))), 0.0)"
    ),
    ActivationMode.CLIPPEDRELU: "tl.minimum(" + _NONNEGATIVE + ", {a}, " + _NAN + ")",
    ActivationMode.LEAKYRELU: "tl.where({x} > 0.0, {x}, {a} * {x})",
    ActivationMode.ELU: "tl.where({x} > 0.0, {x}, {a} * (tl.exp(tl.minimum({x}, 0.0, " + _NAN + ")) - 1.0))",
}


def _erf(z: str) -> str:
    """erf(z) by Abramowitz and Stegun 7.1.26 (error below 1.5e-7; exp only, no libdevice)."""
    t = f"(1.0 / (1.0 + 0.3275911 * tl.abs({z})))"
    poly = (
        f"(((((1.061405429 * {t} - 1.453152027) * {t} + 1.421413741) * {t} - 0.284496736) * {t} + 0.254829592) * {t})"
    )
    y = f"(1.0 - {poly} * tl.exp(-({z}) * ({z})))"
    return f"tl.where({z} < 0.0, -{y}, {y})"


def _tanh(u: str) -> str:
    return f"(2.0 / (1.0 + tl.exp(-2.0 * ({u}))) - 1.0)"


#: log(1 + e^x), stable for large |x| (as SOFTRELU)
_SOFTPLUS = "(tl.maximum({x}, 0.0, " + _NAN + ") + tl.log(1.0 + tl.exp(-tl.abs({x}))))"
#: tanh(s) for s >= 0, without overflow
_TANH_SOFTPLUS = "((1.0 - tl.exp(-2.0 * " + _SOFTPLUS + ")) / (1.0 + tl.exp(-2.0 * " + _SOFTPLUS + ")))"
_GELU_K, _GELU_C = "0.7978845608028654", "0.044715"
_GELU_U = f"({_GELU_K} * ({{x}} + {_GELU_C} * {{x}} * {{x}} * {{x}}))"
_PHI = "(0.5 * (1.0 + " + _erf("{x} * 0.7071067811865476") + "))"

#: fusionplan's extension modes, beyond MIOpen's ten (no parameters; torch's NaN and Inf results)
ACTIVATION_CODE.update(
    {
        ActivationMode.SILU: "{x} * (1.0 / (1.0 + tl.exp(-{x})))",
        ActivationMode.HARDSWISH: "{x} * tl.minimum(tl.maximum({x} + 3.0, 0.0, " + _NAN + "), 6.0, " + _NAN + ") / 6.0",
        ActivationMode.HARDSIGMOID: "tl.minimum(tl.maximum({x} / 6.0 + 0.5, 0.0, " + _NAN + "), 1.0, " + _NAN + ")",
        ActivationMode.GELU: "{x} * " + _PHI,
        ActivationMode.GELU_TANH: "0.5 * {x} * (1.0 + " + _tanh(_GELU_U) + ")",
        ActivationMode.MISH: "{x} * " + _TANH_SOFTPLUS,
        # {a}: the channel's slope, loaded (emit_stages)
        ActivationMode.PRELU: "tl.where({x} > 0.0, {x}, {a} * {x})",
    }
)


#: Backward formulas over fp32 values: the gradient of the input, {dy} the gradient of the output
#: and {x} the forward input: activations.py's backward column in the same primitives. POWER is 0
#: where the base is at or below the threshold, whatever dy (an infinite dy too), as there.
_SIGMOID = "(1.0 / (1.0 + tl.exp(-{x})))"
_TANH_AX = "(2.0 / (1.0 + tl.exp(-2.0 * {a} * {x})) - 1.0)"
ACTIVATION_BACKWARD_CODE: dict[ActivationMode, str] = {
    ActivationMode.PASTHRU: "{dy}",
    ActivationMode.LOGISTIC: "{dy} * " + _SIGMOID + " * (1.0 - " + _SIGMOID + ")",
    ActivationMode.TANH: "{dy} * ({a} * {b} * (1.0 - " + _TANH_AX + " * " + _TANH_AX + "))",
    ActivationMode.RELU: "{dy} * tl.where({x} > 0.0, 1.0, 0.0)",
    ActivationMode.SOFTRELU: "{dy} * " + _SIGMOID,
    ActivationMode.ABS: "{dy} * tl.where({x} > 0.0, 1.0, tl.where({x} < 0.0, -1.0, {x} * 0.0))",  # sign; NaN stays
    ActivationMode.POWER: (  # base ** (gamma - 1) is 1 for gamma 1 even where the base is infinite
        "tl.where({a} + {b} * {x} > 1e-6, {dy} * ({b} * {g} * "
        "tl.where({g} == 1.0, 1.0, tl.exp(({g} - 1.0) * tl.log(tl.maximum({a} + {b} * {x}, 1e-6))))), 0.0)"
    ),
    ActivationMode.CLIPPEDRELU: "{dy} * tl.where(({x} > 0.0) & ({x} <= {a}), 1.0, 0.0)",
    ActivationMode.LEAKYRELU: "{dy} * tl.where({x} > 0.0, 1.0, {a})",
    ActivationMode.PRELU: "{dy} * tl.where({x} > 0.0, 1.0, {a})",
    ActivationMode.ELU: "{dy} * tl.where({x} > 0.0, 1.0, {a} * tl.exp(tl.minimum({x}, 0.0)))",
    ActivationMode.SILU: "{dy} * " + _SIGMOID + " * (1.0 + {x} * (1.0 - " + _SIGMOID + "))",
    ActivationMode.HARDSWISH: "{dy} * tl.where({x} <= -3.0, 0.0, tl.where({x} < 3.0, {x} / 3.0 + 0.5, 1.0))",
    ActivationMode.HARDSIGMOID: "{dy} * tl.where(({x} > -3.0) & ({x} < 3.0), 1.0 / 6.0, 0.0)",
    ActivationMode.GELU: "{dy} * (" + _PHI + " + {x} * 0.3989422804014327 * tl.exp(-0.5 * {x} * {x}))",
    ActivationMode.GELU_TANH: (
        "{dy} * (0.5 * (1.0 + "
        + _tanh(_GELU_U)
        + ") + 0.5 * {x} * (1.0 - "
        + _tanh(_GELU_U)
        + " * "
        + _tanh(_GELU_U)
        + ") * "
        + _GELU_K
        + " * (1.0 + 3.0 * "
        + _GELU_C
        + " * {x} * {x}))"
    ),
    ActivationMode.MISH: (
        "{dy} * ("
        + _TANH_SOFTPLUS
        + " + {x} * "
        + _SIGMOID
        + " * (1.0 - "
        + _TANH_SOFTPLUS
        + " * "
        + _TANH_SOFTPLUS
        + "))"
    ),
}


@dataclass(frozen=True)
class TileIndex:
    """Names, in the generated kernel, of what the stages index with. The tile is
    [pixels, channels]: ``ch`` is the channel index along columns, ``ch_mask`` its mask,
    ``elem`` the 2-d index into per-element (C*H*W) parameters, ``mask`` the tile's mask."""

    ch: str = "ch"
    ch_mask: str = "ch_mask"
    elem: str = "elem"
    mask: str = "mask"


@dataclass(frozen=True)
class Epilogue:
    """Generated code for a list of stages: kernel parameters, constexpr flags, body lines."""

    params: list[str]
    constexprs: list[str]
    body: list[str]
    #: with hoisted channel parameters: the lines that load them (``{p}_v``, indexed by ``ch`` under
    #: ``ch_mask``), to run once before a loop over tiles of the same channels
    channel_loads: list[str] = field(default_factory=list)


def emit_stages(
    stages: list[Stage],
    ops: tuple[FusionOp, ...],
    idx: TileIndex = TileIndex(),
    hoist_channels: bool = False,
    prefix: str = "",
    blends_prior: bool = True,
) -> Epilogue:
    """Code that transforms the fp32 tile ``h`` through ``stages``; ``p`` is the prior tile.
    ``hoist_channels``: per-channel parameters are read from ``{p}_v`` vectors that
    Epilogue.channel_loads loads (a persistent kernel's tiles of one channel block share them).
    ``prefix`` starts every parameter's and flag's name (a prologue's beside an epilogue's);
    ``blends_prior=False``: no stage reads ``p`` (their HAS_Q flags stay, always off)."""
    params: list[str] = []
    flags: list[str] = []
    body: list[str] = []
    channel_loads: list[str] = []
    for i, stage in enumerate(stages):
        flags.append(f"{prefix}HAS_Q{i}")
        if isinstance(stage, AffineStage):
            params += [f"{prefix}sc{i}_ptr", f"{prefix}sh{i}_ptr", f"{prefix}q{i}_ptr"]
            channel_load = "tl.load({p} + " + idx.ch + ", mask=" + idx.ch_mask + ", other=0.0)"
            if stage.per_element:
                load = "tl.load({p} + " + idx.elem + ", mask=" + idx.mask + ", other=0.0)"
            elif hoist_channels:
                load = "{p}_v[None, :]"
                channel_loads += [
                    f"{prefix}sc{i}_ptr_v = {channel_load.format(p=f'{prefix}sc{i}_ptr')}",
                    f"{prefix}sh{i}_ptr_v = {channel_load.format(p=f'{prefix}sh{i}_ptr')}",
                    f"if {prefix}HAS_Q{i}:",
                    f"    {prefix}q{i}_ptr_v = {channel_load.format(p=f'{prefix}q{i}_ptr')}",
                ]
            else:
                load = channel_load + "[None, :]"
            body += [
                f"# stage {i}: operators {list(stage.ops)} folded into scale and shift",
                f"h = h * {load.format(p=f'{prefix}sc{i}_ptr')} + {load.format(p=f'{prefix}sh{i}_ptr')}",
            ]
            if blends_prior:
                body += [f"if {prefix}HAS_Q{i}:", f"    h = h + {load.format(p=f'{prefix}q{i}_ptr')} * p"]
        else:
            assert isinstance(stage, ActStage)
            op = ops[stage.op]
            assert isinstance(op, ActivationForwardOp)
            alpha = f"{prefix}a{i}"
            if op.mode.has_slope:  # alpha is a pointer to the per-channel slopes
                alpha = f"{prefix}a{i}_ptr"
                channel_load = "tl.load(" + alpha + " + " + idx.ch + ", mask=" + idx.ch_mask + ", other=0.0)"
                if hoist_channels:
                    channel_loads.append(f"{alpha}_v = {channel_load}")
                    slope = f"{alpha}_v[None, :]"
                else:
                    slope = channel_load + "[None, :]"
            params += [alpha, f"{prefix}b{i}", f"{prefix}g{i}", f"{prefix}al{i}", f"{prefix}be{i}"]
            flags.append(f"{prefix}UNIT_AL{i}")
            a = slope if op.mode.has_slope else alpha
            expr = ACTIVATION_CODE[op.mode].format(x="h", a=a, b=f"{prefix}b{i}", g=f"{prefix}g{i}")
            body += [
                f"# stage {i}: operator {stage.op}, activation {op.mode.name}",
                f"h = {expr}",
                f"if not {prefix}UNIT_AL{i}:"
                "  # the output's scale alpha, 1 in most plans (a multiply per element less)",
                f"    h = h * {prefix}al{i}",
            ]
            if blends_prior:
                body += [f"if {prefix}HAS_Q{i}:", f"    h = h + {prefix}be{i} * p"]
    return Epilogue(params, flags, body, channel_loads)


def stage_arguments(
    stages: Sequence[Stage],
    records: Sequence[OpArgs],
    channels: int,
    spatial: tuple[int, int],
    device: torch.device,
    prefix: str = "",
) -> tuple[list, dict[str, bool]]:
    """Kernel arguments of the epilogue stages for one argument set (fp32 coefficient vectors), and
    the constexpr flags of emit_stages in its order: per stage whether it reads the prior output
    (``HAS_Q``), per activation whether its output scale alpha is 1 (``UNIT_AL``)."""
    values: list = []
    flags: dict[str, bool] = {}
    for i, stage in enumerate(stages):
        if isinstance(stage, AffineStage):
            a = stage_affine(stage, records, torch.float32)
            shape = (1, channels, *spatial) if stage.per_element else (1, channels, 1, 1)
            scale, shift = _vector(a.scale, shape, device), _vector(a.shift, shape, device)
            has_q = not (isinstance(a.prior_coef, float) and a.prior_coef == 0.0)
            values += [scale, shift, _vector(a.prior_coef, shape, device) if has_q else scale]
            flags[f"{prefix}HAS_Q{i}"] = has_q
        else:
            assert isinstance(stage, ActStage)
            rec = records[stage.op]
            assert isinstance(rec, ActivationArgs)
            scalars = [float(v) for v in (rec.activ_alpha, rec.activ_beta, rec.activ_gamma, rec.alpha, rec.beta)]
            values += scalars  # one compiled kernel whatever numeric types were given
            if rec.slope is not None:  # PReLU: the slopes in place of activAlpha, fp32
                values[-5] = _vector(rec.slope, (1, channels, 1, 1), device)
            flags[f"{prefix}HAS_Q{i}"] = scalars[4] != 0
            # alpha 1 skips the multiply: a kernel specialization per value of the test (the stem's
            # latency-bound epilogue gained 3 %)
            flags[f"{prefix}UNIT_AL{i}"] = scalars[3] == 1.0
    return values, flags


def reads_prior(flags: dict[str, bool], prefix: str = "") -> bool:
    """Whether a stage with these flags (stage_arguments', their names starting with ``prefix``)
    reads the prior output."""
    return any(on for name, on in flags.items() if name.startswith(prefix + "HAS_Q"))


def stand_in_stage_arguments(
    stages: Sequence[Stage],
    ops: Sequence[FusionOp],
    channels: int,
    spatial: tuple[int, int],
    device: torch.device,
    with_prior: bool = False,
    prefix: str = "",
) -> tuple[list, dict[str, bool]]:
    """Arguments shaped like ``stage_arguments``' for arguments with alpha 1 and, unless
    ``with_prior``, without beta, with no values computed: compiling ahead needs their types,
    alignment and flags only."""
    values: list = []
    flags: dict[str, bool] = {}
    for i, stage in enumerate(stages):
        if isinstance(stage, AffineStage):
            n = channels * (spatial[0] * spatial[1] if stage.per_element else 1)
            vector = torch.empty(n, dtype=torch.float32, device=device)
            values += [vector, vector, vector]
            flags[f"{prefix}HAS_Q{i}"] = with_prior
        else:
            slope = torch.empty(channels, dtype=torch.float32, device=device) if _has_slope(stage, ops) else 1.0
            values += [slope, 0.0, 1.0, 1.0, 0.0]
            flags[f"{prefix}HAS_Q{i}"] = with_prior
            flags[f"{prefix}UNIT_AL{i}"] = True
    return values, flags


def _has_slope(stage: ActStage, ops: Sequence[FusionOp]) -> bool:
    op = ops[stage.op]
    return isinstance(op, ActivationForwardOp) and op.mode.has_slope


def _vector(c: float | Tensor, shape: tuple[int, ...], device: torch.device) -> Tensor:
    if isinstance(c, float):
        return torch.full((int(torch.Size(shape).numel()),), c, dtype=torch.float32, device=device)
    return c.to(device=device, dtype=torch.float32).expand(shape).contiguous().reshape(-1)
