"""runtime.launcher_modules: one C launcher module per launcher source in a process (Triton 3.6
builds and loads one per compiled kernel), checked on a stand-in of Triton's NVIDIA driver."""

import sys
import threading
import types

import pytest

from fusionplan.runtime import launcher_modules as lm

DRIVER_SOURCE = '''
import types

built = []

def compile_module_from_src(src, name, library_dirs=None, include_dirs=None, libraries=None, ccflags=None):
    module = types.ModuleType(name)  # a new module object each build, as Triton's loader makes
    module.source = src
    built.append(src)
    return module

class CudaLauncher:
    """As Triton 3.6's: its launcher module built from the kernel's signature, by the global name."""
    def __init__(self, signature):
        mod = compile_module_from_src(src=f"launcher for {signature}", name="__triton_launcher",
                                      library_dirs=["/lib"], include_dirs=["/inc"], libraries=["cuda"])
        self.launch = mod
'''


def stand_in_driver() -> types.ModuleType:
    driver = types.ModuleType("stand_in_driver")
    exec(DRIVER_SOURCE, driver.__dict__)
    return driver


@pytest.fixture
def fresh(monkeypatch):
    monkeypatch.setattr(lm, "_installed", threading.Event())
    return stand_in_driver()


def test_kernels_of_one_signature_share_one_module(fresh):
    assert lm.install(fresh)
    a, b, c = (fresh.CudaLauncher(sig) for sig in ("*fp16,i32", "*fp16,i32", "*fp32,i32"))
    assert a.launch is b.launch and a.launch is not c.launch
    assert fresh.built == ["launcher for *fp16,i32", "launcher for *fp32,i32"]


def test_other_build_arguments_build_another_module():
    built = []

    def build(src, name, library_dirs=None, include_dirs=None, libraries=None, ccflags=None):
        built.append((src, library_dirs, ccflags))
        return types.ModuleType(name)

    shared = lm.sharing(build)
    first = shared("src", "__triton_launcher", ["/lib"])
    assert shared(src="src", name="__triton_launcher", library_dirs=["/lib"]) is first
    assert shared("src", "__triton_launcher", ["/other"]) is not first
    assert shared("src", "__triton_launcher", ["/lib"], ccflags=["-O3"]) is not first
    assert len(built) == 3


def test_threads_that_miss_together_keep_the_first_module():
    gate = threading.Barrier(4, timeout=10)

    def build(src, name, *rest):
        gate.wait()  # every thread misses before any keeps its module
        return types.ModuleType(name)

    shared = lm.sharing(build)
    got = []
    threads = [threading.Thread(target=lambda: got.append(shared("src", "m"))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(got) == 4 and all(m is got[0] for m in got)
    assert shared("src", "m") is got[0]


def test_installing_twice_wraps_once_and_a_driver_without_the_function_is_left(fresh):
    assert lm.install(fresh)
    wrapped = fresh.compile_module_from_src
    assert lm.install(fresh) and fresh.compile_module_from_src is wrapped
    assert wrapped.__wrapped__ is not None
    lm._installed.clear()  # as if none were patched
    assert not lm.install(types.ModuleType("no_builder"))


@pytest.mark.parametrize("version, patched", [("3.6.0", True), ("3.9.0", False), ("3.5.1", False)])
def test_only_triton_36_is_patched(fresh, monkeypatch, version, patched):
    import triton
    import triton.backends.nvidia as nvidia

    monkeypatch.setattr(triton, "__version__", version)
    monkeypatch.setattr(nvidia, "driver", fresh, raising=False)
    monkeypatch.setitem(sys.modules, "triton.backends.nvidia.driver", fresh)
    original = fresh.compile_module_from_src
    assert lm.share_launcher_modules() is patched
    assert (fresh.compile_module_from_src is not original) is patched
