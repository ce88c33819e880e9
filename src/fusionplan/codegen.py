"""Generation of Triton source: epilogue stages from a plan's operator chain, and the module cache.

Triton reads a kernel's source with ``inspect``, so generated code is written to a file under
the cache directory (``$FUSIONPLAN_CACHE_DIR``, else ``$XDG_CACHE_HOME/fusionplan``, else
``~/.cache/fusionplan``) and imported from there. Files are named by the hash of their text and
written atomically; the same text is never written twice.

Activations are written with ``tl.*`` primitives only (no libdevice), so the same code runs in
Triton's interpreter. A new pointwise operator is one entry in ``ACTIVATION_CODE``.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

from fusionplan.enums import ActivationMode
from fusionplan.folding import ActStage, AffineStage, Stage
from fusionplan.ops import ActivationForwardOp, FusionOp

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
    stages: list[Stage], ops: tuple[FusionOp, ...], idx: TileIndex = TileIndex(), hoist_channels: bool = False
) -> Epilogue:
    """Code that transforms the fp32 tile ``h`` through ``stages``; ``p`` is the prior tile.
    ``hoist_channels``: per-channel parameters are read from ``{p}_v`` vectors that
    Epilogue.channel_loads loads (a persistent kernel's tiles of one channel block share them)."""
    params: list[str] = []
    flags: list[str] = []
    body: list[str] = []
    channel_loads: list[str] = []
    for i, stage in enumerate(stages):
        flags.append(f"HAS_Q{i}")
        if isinstance(stage, AffineStage):
            params += [f"sc{i}_ptr", f"sh{i}_ptr", f"q{i}_ptr"]
            channel_load = "tl.load({p} + " + idx.ch + ", mask=" + idx.ch_mask + ", other=0.0)"
            if stage.per_element:
                load = "tl.load({p} + " + idx.elem + ", mask=" + idx.mask + ", other=0.0)"
            elif hoist_channels:
                load = "{p}_v[None, :]"
                channel_loads += [
                    f"sc{i}_ptr_v = {channel_load.format(p=f'sc{i}_ptr')}",
                    f"sh{i}_ptr_v = {channel_load.format(p=f'sh{i}_ptr')}",
                    f"if HAS_Q{i}:",
                    f"    q{i}_ptr_v = {channel_load.format(p=f'q{i}_ptr')}",
                ]
            else:
                load = channel_load + "[None, :]"
            body += [
                f"# stage {i}: operators {list(stage.ops)} folded into scale and shift",
                f"h = h * {load.format(p=f'sc{i}_ptr')} + {load.format(p=f'sh{i}_ptr')}",
                f"if HAS_Q{i}:",
                f"    h = h + {load.format(p=f'q{i}_ptr')} * p",
            ]
        else:
            assert isinstance(stage, ActStage)
            op = ops[stage.op]
            assert isinstance(op, ActivationForwardOp)
            params += [f"a{i}", f"b{i}", f"g{i}", f"al{i}", f"be{i}"]
            flags.append(f"UNIT_AL{i}")
            expr = ACTIVATION_CODE[op.mode].format(x="h", a=f"a{i}", b=f"b{i}", g=f"g{i}")
            body += [
                f"# stage {i}: operator {stage.op}, activation {op.mode.name}",
                f"h = {expr}",
                f"if not UNIT_AL{i}:  # the output's scale alpha, 1 in most plans (a multiply per element less)",
                f"    h = h * al{i}",
                f"if HAS_Q{i}:",
                f"    h = h + be{i} * p",
            ]
    return Epilogue(params, flags, body, channel_loads)


def indent(lines: list[str], spaces: int) -> str:
    pad = " " * spaces
    return "\n".join(pad + line for line in lines)


# ---- the module cache -----------------------------------------------------------------------------
def cache_dir() -> Path:
    base = os.environ.get("FUSIONPLAN_CACHE_DIR")
    if base:
        return Path(base)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "fusionplan"


def use_triton_cache_inside_ours() -> None:
    """Triton's compiled-kernel cache goes under ours (unless the user chose a place for it), so that
    ``fusionplan-cache`` can show and clear everything a plan compiled."""
    os.environ.setdefault("TRITON_CACHE_DIR", str(cache_dir() / "triton"))


_modules: dict[str, ModuleType] = {}
_modules_lock = threading.Lock()


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


def write_atomic(path: Path, text: str) -> None:
    """Write through a temporary file and a rename: readers see the old file or the new one."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def load_module(source: str, stem: str) -> tuple[ModuleType, Path]:
    """Write ``source`` (once, atomically) and import it; modules are kept per text and mode.

    The interpreter flag is part of the key: Triton decides at decoration time whether a kernel
    runs compiled or interpreted.
    """
    use_triton_cache_inside_ours()
    digest = hashlib.sha256(source.encode()).hexdigest()[:20]
    name = f"fusionplan_gen_{stem}_{digest}"
    key = name + (":interpret" if _interpreting() else "")
    with _modules_lock:
        if key in _modules:
            module = _modules[key]
            return module, Path(module.__file__)
        directory = cache_dir() / "kernels"
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / f"{name}.py"
        if not path.exists() or path.read_text() != source:
            write_atomic(path, source)
        spec = importlib.util.spec_from_file_location(key.replace(":", "_"), path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # Triton resolves globals through the module
        spec.loader.exec_module(module)
        _modules[key] = module
        return module, path


def triton_available() -> str | None:
    """None when Triton can be imported, else why not."""
    try:
        import triton  # noqa: F401
        import triton.language  # noqa: F401
    except Exception as exc:  # ImportError, or a broken install
        return f"triton is not importable ({type(exc).__name__}: {exc})"
    return None


def interpreter_active() -> bool:
    return _interpreting()
