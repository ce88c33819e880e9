"""Generated Triton source as modules: the module cache (the epilogue's code is epilogue.py's).

Triton reads a kernel's source with ``inspect``, so generated code is written to a file under
the cache directory (``$FUSIONPLAN_CACHE_DIR``, else ``$XDG_CACHE_HOME/fusionplan``, else
``~/.cache/fusionplan``) and imported from there. Files are named by the hash of their text and
written atomically; the same text is never written twice.

"""

from __future__ import annotations

import ast
import functools
import hashlib
import os
import sys
import tempfile
import threading
from pathlib import Path
from types import ModuleType

from fusionplan.core.caches import LruCache
from fusionplan.core.settings import cache_directory
from fusionplan.runtime.compile_worker import import_file


def indent(lines: list[str], spaces: int) -> str:
    pad = " " * spaces
    return "\n".join(pad + line for line in lines)


# ---- the module cache -----------------------------------------------------------------------------
def cache_dir() -> Path:
    """The on-disk cache's folder (the settings' ``cache_directory``)."""
    return cache_directory()


def use_triton_cache_inside_ours() -> None:
    """Triton's compiled-kernel cache goes under ours, so that ``fusionplan-cache`` can show and
    clear everything a plan compiled; not where the user chose a place (TRITON_CACHE_DIR) or a
    cache manager of their own. It goes through Triton's cache-manager knob: the user's environment
    stays as it was (the compile workers get the variable in theirs)."""
    try:
        from triton import knobs
        from triton.runtime.cache import FileCacheManager
    except ImportError:  # no triton (a CPU install): nothing compiles
        return
    if os.environ.get("TRITON_CACHE_DIR") or knobs.cache.manager_class is not None:
        return
    knobs.cache.manager_class = _cache_manager_under_ours(FileCacheManager)


def triton_cache_dir() -> Path:
    """Where Triton keeps the kernels it compiles for fusionplan: under our cache once
    ``use_triton_cache_inside_ours`` took it there, else the user's TRITON_CACHE_DIR, else ours."""
    knobs = sys.modules.get("triton.knobs")
    taken = knobs is not None and getattr(knobs.cache.manager_class, "under_fusionplan", False)
    chosen = os.environ.get("TRITON_CACHE_DIR")
    return Path(chosen) if chosen and not taken else cache_dir() / "triton"


@functools.cache
def _cache_manager_under_ours(file_cache: type) -> type:
    class UnderFusionplanCache(file_cache):
        """Triton's file cache, in the ``triton`` folder of fusionplan's cache directory (its dump
        and override folders stay Triton's)."""

        under_fusionplan = True

        def __init__(self, key: str, override: bool = False, dump: bool = False) -> None:
            if override or dump:
                super().__init__(key, override=override, dump=dump)
                return
            self.key = key
            self.cache_dir = str(cache_dir() / "triton" / key)
            self.lock_path = os.path.join(self.cache_dir, "lock")
            os.makedirs(self.cache_dir, exist_ok=True)

    return UnderFusionplanCache


#: The generated modules imported so far, by name (one import per name: a second would make new
#: kernel objects, compiled again).
_modules: LruCache[str, ModuleType] = LruCache("kernel modules", None)
_modules_lock = threading.Lock()


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


def write_atomic(path: Path, text: str) -> None:
    """Write through a temporary file and a rename: readers see the old file or the new one."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def _base_name(source: str, stem: str) -> str:
    """A generated module's file stem: the stem and the hash of the text."""
    return f"fusionplan_gen_{stem}_{hashlib.sha256(source.encode()).hexdigest()[:20]}"


def module_name(source: str, stem: str) -> str:
    """The name a generated module is imported as (and Triton names its kernels' module by): its
    file stem, with the interpreter flag (Triton decides at decoration time whether a kernel runs
    compiled or interpreted)."""
    return _base_name(source, stem) + ("_interpret" if _interpreting() else "")


def write_source(source: str, stem: str) -> Path:
    """The file of a generated module, written once (atomically) under the cache directory."""
    use_triton_cache_inside_ours()
    directory = cache_dir() / "kernels"
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{_base_name(source, stem)}.py"
    if not path.exists() or path.read_text() != source:
        write_atomic(path, source)
    return path


def import_source(path: Path, name: str) -> ModuleType:
    """Import the generated module at ``path`` as ``name``, once per name."""
    with _modules_lock:
        module = _modules.get(name)
        if module is None:
            module = _modules.put(name, import_file(path, name))
        return module


def load_module(source: str, stem: str) -> tuple[ModuleType, Path]:
    """Write ``source`` (once, atomically) and import it; modules are kept per text and mode."""
    path = write_source(source, stem)
    return import_source(path, module_name(source, stem)), path


class KernelParam:
    """A kernel parameter as Triton's JIT function lists it: its name and whether it is a constexpr."""

    def __init__(self, name: str, is_constexpr: bool) -> None:
        self.name = name
        self.is_constexpr = is_constexpr


class GeneratedKernel:
    """A ``@triton.jit`` or ``@gluon.jit`` kernel of a generated module, imported only when it is
    compiled: its parameters are read from the source, so a kernel that a launch record names is
    loaded without importing its module (whose jit decorators read and tokenize the source, about
    20 ms a module). It stands in for the JIT function where Triton's compiled kernel takes one
    (``__name__``, ``arg_names``, ``launch_metadata``)."""

    launch_metadata = None

    def __init__(self, source: str, stem: str, fn_name: str) -> None:
        self.path = write_source(source, stem)
        self.module_name = module_name(source, stem)
        self.__name__ = fn_name
        self.gluon, self.params = kernel_signature(source, fn_name)
        self.arg_names = [p.name for p in self.params]

    @property
    def jit(self):
        """Triton's JIT function of the kernel (its module imported now, once)."""
        return getattr(import_source(self.path, self.module_name), self.__name__)


def generated_kernel(source: str, stem: str, fn_name: str):
    """The kernel ``fn_name`` of a generated module as a GeneratedKernel, or (a source whose
    signature is not read that way) Triton's JIT function from the module imported now."""
    try:
        return GeneratedKernel(source, stem, fn_name)
    except (ValueError, SyntaxError):
        return getattr(load_module(source, stem)[0], fn_name)


#: CPython 3.11 keeps the AST constructor's recursion count per interpreter, not per thread: two
#: threads building ASTs at once (compile_all's) can raise SystemError "AST constructor recursion
#: depth mismatch" (cpython issue 106905). The generated sources' ASTs are built one at a time.
_AST_LOCK = threading.Lock()


def again_after_ast_race(work, *args, **kwargs):
    """``work(*args, **kwargs)``, called once more where it failed on that race (a SystemError
    raised while an AST was built, before the work ran anything): for compiles and first
    launches, whose threads race with others' (Triton parses kernels too)."""
    try:
        return work(*args, **kwargs)
    except SystemError as exc:
        if "AST constructor recursion depth mismatch" not in str(exc):
            raise
        return work(*args, **kwargs)


def parse_python(text: str) -> ast.Module:
    """ast.parse, one thread at a time (see _AST_LOCK)."""
    with _AST_LOCK:
        return ast.parse(text)


def kernel_signature(source: str, fn_name: str) -> tuple[bool, list[KernelParam]]:
    """Whether ``fn_name`` in ``source`` is a Gluon kernel, and its parameters, read from its
    ``def`` alone (the generated sources put the decorator on the line before it)."""
    start = source.index(f"def {fn_name}(")
    decorator = source[:start].rstrip().rsplit("\n", 1)[-1].strip()
    if decorator not in ("@triton.jit", "@gluon.jit"):
        raise ValueError(f"{fn_name}: a kernel with decorator {decorator!r} is imported, not read")
    end = source.index("):\n", start) + 3
    tree = parse_python(source[start:end] + "    pass\n")
    fn = tree.body[0]
    assert isinstance(fn, ast.FunctionDef)
    params = [
        KernelParam(a.arg, a.annotation is not None and "constexpr" in ast.unparse(a.annotation)) for a in fn.args.args
    ]
    return decorator == "@gluon.jit", params


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
