"""Generated Triton source as modules: the module cache (the epilogue's code is epilogue.py's).

Triton reads a kernel's source with ``inspect``, so generated code is written to a file under
the cache directory (``$FUSIONPLAN_CACHE_DIR``, else ``$XDG_CACHE_HOME/fusionplan``, else
``~/.cache/fusionplan``) and imported from there. Files are named by the hash of their text and
written atomically; the same text is never written twice.

"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
import tempfile
import threading
from pathlib import Path
from types import ModuleType


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
