"""One C launcher module per launcher source in a process.

Triton 3.6 gives every compiled kernel a launcher of its own: ``CudaLauncher.__init__`` generates
the launcher's C source from the kernel's signature, then ``compile_module_from_src`` hashes it,
looks the built module up in Triton's cache (directory lookups and a ``makedirs``) and loads it
as a new Python extension module. Kernels of one signature share the source, so in a process the
same module is found and loaded again for each of them: about 30 ms a kernel on a warm cache
(docs/decisions/cold-start.md). ``share_launcher_modules`` makes Triton's driver keep the module
of each source once found, so that later kernels with that source take it as it is. The module
holds the C launch function alone, which takes every launch's arguments, so one module serves
every kernel of its source. Other Triton versions (whose launcher is not built per source, or
whose driver lacks the function) are left as they are.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from types import ModuleType

#: The Triton versions whose NVIDIA driver builds one launcher module per compiled kernel.
PER_KERNEL_LAUNCHER_VERSIONS = ("3.6.",)

_lock = threading.Lock()
_installed = threading.Event()  # set once a driver is patched (at most one)


def sharing(build: Callable[..., ModuleType]) -> Callable[..., ModuleType]:
    """``build`` (Triton's compile_module_from_src) keeping one module per set of arguments: a
    source and what it builds with. Two threads that miss at once may both build (Triton's cache
    writes atomically); the first module kept is the one every later call gets."""
    modules: dict[tuple, ModuleType] = {}

    def shared(src: str, name: str, library_dirs=None, include_dirs=None, libraries=None, ccflags=None, **rest):
        key = (src, name, *(tuple(v or ()) for v in (library_dirs, include_dirs, libraries, ccflags)))
        key += tuple(sorted(rest.items()))
        module = modules.get(key)
        if module is None:
            module = build(src, name, library_dirs, include_dirs, libraries, ccflags, **rest)
            with _lock:
                module = modules.setdefault(key, module)
        return module

    shared.__wrapped__ = build  # type: ignore[attr-defined]
    shared.modules = modules  # type: ignore[attr-defined]
    return shared


def share_launcher_modules() -> bool:
    """Patch this process's Triton NVIDIA driver to share launcher modules (once); whether it is
    patched. A Triton that is not a PER_KERNEL_LAUNCHER_VERSIONS one, or cannot be imported, is
    not touched."""
    if _installed.is_set():
        return True
    try:
        import triton

        if not triton.__version__.startswith(PER_KERNEL_LAUNCHER_VERSIONS):
            return False
        from triton.backends.nvidia import driver
    except Exception:  # no Triton, or no NVIDIA backend: nothing to share
        return False
    return install(driver)


def install(driver: object) -> bool:
    """Share the launcher modules that ``driver`` (a module with ``compile_module_from_src``,
    which its launcher calls by that global name) builds."""
    with _lock:
        if _installed.is_set():
            return True
        build = getattr(driver, "compile_module_from_src", None)
        if not callable(build):
            return False
        if getattr(build, "__wrapped__", None) is None:
            driver.compile_module_from_src = sharing(build)  # type: ignore[attr-defined]
        _installed.set()
    return True
