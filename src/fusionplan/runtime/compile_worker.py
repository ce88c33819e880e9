"""A compiling process of fusionplan.runtime.compile_pool: it compiles the kernels of generated modules as
a fusionplan process captured them (Triton's specialization data: signature, constants,
attributes, options), into the Triton cache both share, and builds their launchers there too.

Run as a script, not with ``-m``: the ``fusionplan`` package imports torch, and this process
needs Triton alone. Requests and replies are JSON objects, each after its length (4 bytes, big
endian), on stdin and stdout. A reply is ``{"hash": ...}`` (the compiled kernel's cache key), or
``{"error": ...}``: the fusionplan process then compiles that kernel itself, and reports the error
as Triton raises it there.
"""

from __future__ import annotations

import importlib.util
import json
import os
import struct
import sys

_LENGTH = struct.Struct(">I")


def read_frame(stream) -> dict | None:
    """The next JSON object on ``stream``, None at its end."""
    head = stream.read(_LENGTH.size)
    if len(head) < _LENGTH.size:
        return None
    body = stream.read(_LENGTH.unpack(head)[0])
    return json.loads(body)


def write_frame(stream, obj: dict) -> None:
    body = json.dumps(obj).encode()
    stream.write(_LENGTH.pack(len(body)) + body)
    stream.flush()


def load_function(path: str, module_name: str, fn_name: str):
    """The JIT function ``fn_name`` of the generated module at ``path``, imported under the name
    the fusionplan process gave it (Triton's cache key of a kernel depends on its module)."""
    module = sys.modules.get(module_name)
    return getattr(module if module is not None else import_file(path, module_name), fn_name)


def import_file(path, name: str):
    """Import the module at ``path`` as ``name`` (registered in sys.modules: Triton resolves a
    kernel's globals through its module)."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _tuples(value):
    """JSON's lists back as the tuples Triton wrote (its signatures and options hold no lists)."""
    return tuple(_tuples(v) for v in value) if isinstance(value, list) else value


def compile_request(request: dict) -> str:
    """Compile one captured kernel; returns its hash in Triton's cache."""
    import triton
    import triton.language as tl
    from triton.backends.compiler import GPUTarget

    fn = load_function(request["path"], request["module"], request["name"])
    data = json.loads(request["data"])

    def constant(value):
        if isinstance(value, str) and tl.dtype.is_dtype(value):
            return tl.dtype(value)
        if isinstance(value, dict) and "constexpr" in value:
            return tl.constexpr(value["constexpr"])
        return value

    constexprs = {tuple(k): constant(v) for k, v in zip(data["constant_keys"], data["constant_vals"])}
    attrs = {tuple(k): v for k, v in zip(data["attrs_keys"], data["attrs_vals"])}
    signature = {k: _tuples(v) for k, v in data["signature"].items()}
    options = {k: _tuples(v) for k, v in data["options"].items()}
    src = source_class(fn)(fn, signature, constexprs, attrs)
    kernel = triton.compile(src, target=GPUTarget(*request["target"]), options=options)
    _build_launcher(kernel)
    return kernel.hash


def source_class(fn):
    """Triton's class of a kernel's source for compiling: GluonASTSource for a Gluon kernel (a
    GluonJITFunction, or a codegen.GeneratedKernel of one), else ASTSource."""
    if getattr(fn, "gluon", False) or type(fn).__name__ == "GluonJITFunction":
        from triton.experimental.gluon._runtime import GluonASTSource

        return GluonASTSource
    from triton.compiler.compiler import ASTSource

    return ASTSource


def _build_launcher(kernel) -> None:
    """Build (into Triton's cache) the C launcher that loading the kernel builds: the fusionplan
    process then finds it. Best effort: where it cannot be built here, that process builds it."""
    try:
        from triton.backends.nvidia.driver import CudaLauncher

        CudaLauncher(kernel.src, kernel.metadata)
    except Exception:  # no CUDA driver library on this machine, another backend, another Triton
        pass


def serve(stdin, stdout) -> None:
    while (request := read_frame(stdin)) is not None:
        try:
            reply = {"hash": compile_request(request)}
        except Exception as exc:  # the fusionplan process compiles it again and reports the error
            reply = {"error": f"{type(exc).__name__}: {exc}"}
        write_frame(stdout, reply)


def main() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    # this file's directory holds fusionplan's torch.py: off the path, so `import torch` in Triton
    # finds torch
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # whatever Triton prints stays out of the replies
    try:  # imported while the first kernels are still being captured
        import triton.compiler  # noqa: F401
    except Exception:  # each request then reports it
        pass
    serve(stdin, stdout)


if __name__ == "__main__":
    main()
