"""Generated kernels read from their source: the parameters, the Gluon flag and the module name a
launch record is found by are those of Triton's JIT function, and building a kernel imports
nothing (a kernel with a launch record is loaded without its module)."""

import pytest
import torch

import fusionplan as fp
from fusionplan.core.caches import LruCache
from fusionplan.runtime import codegen
from fusionplan.runtime.codegen import GeneratedKernel, generated_kernel, kernel_signature
from fusionplan.runtime.launch import Launcher, module_of, source_class
from fusionplan.solvers import REGISTRY
from fusionplan.tools.shapes import resnet50_layer
from fusionplan.tools.verify import layer_plan

pytest.importorskip("triton")

LAYERS = ("r50_00", "r50_01", "r50_02", "r50_18", "r50_22")


def built_launchers(monkeypatch) -> list[Launcher]:
    """The launchers of every Triton and Gluon kernel that a CPU handle builds for a few ResNet-50
    layers in both layouts and two dtypes."""
    monkeypatch.setattr(codegen, "_modules", LruCache("kernel modules", None, process=False))
    found = []
    for name in LAYERS:
        for layout in ("NHWC", "NCHW"):
            for dtype in (torch.float16, torch.float32):
                s = resnet50_layer(name)
                x = torch.empty(8, s.c, s.h, s.w, dtype=dtype)
                x = x.to(memory_format=torch.channels_last) if layout == "NHWC" else x
                spec = layer_plan(s, x, "CBNA").spec()
                for solver in REGISTRY:
                    try:
                        kernel = solver.build(spec, fp.Handle("cpu"))
                    except Exception:  # a solver that does not take the plan, or needs a GPU
                        continue
                    found += [v for v in vars(kernel).values() if isinstance(v, Launcher)]
    return found


def test_generated_kernels_read_as_triton_does(monkeypatch):
    launchers = built_launchers(monkeypatch)
    generated = [launcher.fn for launcher in launchers if isinstance(launcher.fn, GeneratedKernel)]
    assert len(generated) >= 10 and any(fn.gluon for fn in generated) and not all(fn.gluon for fn in generated)
    assert len(codegen._modules) == 0  # building imported none of them
    for fn in generated:
        jit = compiled_function(fn.jit)
        assert [(p.name, p.is_constexpr) for p in fn.params] == [(p.name, bool(p.is_constexpr)) for p in jit.params]
        assert fn.arg_names == list(jit.arg_names) and fn.__name__ == jit.__name__
        assert module_of(fn) == module_of(jit) and source_class(fn) is source_class(jit)
        assert fn.gluon == (type(jit).__name__ == "GluonJITFunction")


def compiled_function(jit):
    """Triton's JIT function of ``jit``'s Python function: in the interpreter (these tests) the
    decorator gives a function that lists no parameters."""
    if type(jit).__name__ == "GluonJITFunction":
        return jit
    from triton.runtime.jit import JITFunction

    return JITFunction(jit.fn)


def test_a_launcher_imports_its_module_only_to_compile(monkeypatch):
    launcher = next(x for x in built_launchers(monkeypatch) if isinstance(x.fn, GeneratedKernel))
    assert len(codegen._modules) == 0
    assert launcher.constexprs and launcher.names == launcher.fn.arg_names
    assert launcher.jit is launcher.jit and module_of(launcher.fn) in codegen._modules


SOURCE = """import triton
import triton.language as tl


@triton.jit
def plain_kernel(
    x_ptr, n,
    BLOCK: tl.constexpr, FLAG: "tl.constexpr",
):
    pass


@triton.jit(do_not_specialize=["n"])
def special_kernel(x_ptr, n):
    pass
"""


def test_signature_from_the_def_line():
    gluon, params = kernel_signature(SOURCE, "plain_kernel")
    assert not gluon and [(p.name, p.is_constexpr) for p in params] == [
        ("x_ptr", False),
        ("n", False),
        ("BLOCK", True),
        ("FLAG", True),
    ]


def test_a_decorator_with_arguments_is_imported_not_read(monkeypatch, tmp_path):
    monkeypatch.setenv("FUSIONPLAN_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(codegen, "_modules", LruCache("kernel modules", None, process=False))
    with pytest.raises(ValueError, match="do_not_specialize"):
        GeneratedKernel(SOURCE, "probe", "special_kernel")
    fn = generated_kernel(SOURCE, "probe", "special_kernel")
    assert not isinstance(fn, GeneratedKernel) and fn.arg_names == ["x_ptr", "n"]
    assert isinstance(generated_kernel(SOURCE, "probe", "plain_kernel"), GeneratedKernel)
