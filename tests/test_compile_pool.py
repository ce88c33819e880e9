"""Compile worker processes without a GPU: the worker compiles a captured kernel to the very entry
of Triton's cache that compiling it in this process makes (so the process finds it), answers bad
requests with an error instead of dying, and the pool is used only where it can serve."""

import json
import os
import pathlib
import textwrap

import pytest

from fusionplan.runtime import compile_pool
from fusionplan.runtime.codegen import triton_cache_dir, use_triton_cache_inside_ours
from fusionplan.runtime.compile_pool import Worker, worker_processes

from .util import compiling_process

pytest.importorskip("triton")

#: Builds a kernel on a CPU handle, captures its launch, hands Triton's specialization data (as
#: Triton's JIT serializes it) to a worker, then compiles the same source here; prints both hashes
#: and the cache's entries after each.
SAME_ENTRY = textwrap.dedent(
    """
    import json, os, sys, torch
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import make_backend
    import fusionplan as fp
    from fusionplan.runtime.compile_pool import CompilePool
    from fusionplan.runtime.sass import ast_source, captured_launch
    from fusionplan.tools.shapes import resnet50_layer
    from fusionplan.solvers import solver_named
    from fusionplan.tools.verify import layer_plan

    s = resnet50_layer("r50_22")
    x = torch.empty(8, s.c, s.h, s.w, dtype=torch.float16).to(memory_format=torch.channels_last)
    kernel = solver_named(sys.argv[1]).build(layer_plan(s, x, "CBNA").spec(), fp.Handle("cpu"))
    grid, _, args, num_warps, num_stages = captured_launch(kernel)
    fn = kernel.launcher.fn
    src = ast_source(fn.jit, args)
    target = GPUTarget("cuda", 90, 32)
    options = make_backend(target).parse_options(kernel.launcher.compile_options(num_warps, num_stages))
    data = json.dumps({
        "name": fn.__name__, "signature": src.signature,
        "constant_keys": [list(k) for k in src.constants], "constant_vals": list(src.constants.values()),
        "attrs_keys": [list(k) for k in src.attrs], "attrs_vals": list(src.attrs.values()),
        "options": options.__dict__,
    })
    pool = CompilePool(1)
    request = {"path": str(fn.path), "module": fn.module_name, "name": fn.__name__, "data": data,
               "target": ["cuda", 90, 32]}
    worker_hash = pool.compile(request)
    pool.close()
    cache = os.environ["TRITON_CACHE_DIR"]
    made = sorted(os.listdir(cache))
    here = triton.compile(src, target=target, options=options.__dict__)
    print("RESULT" + json.dumps([worker_hash, here.hash, made, sorted(os.listdir(cache))]))
    """
)


@pytest.mark.parametrize("solver", ["triton-conv", "gluon-window"])
def test_the_worker_compiles_the_entry_this_process_would(solver, tmp_path, monkeypatch):
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
    out = compiling_process(["-c", SAME_ENTRY, solver], timeout=600)
    worker_hash, here_hash, made, after = json.loads(next(x for x in out.splitlines() if x.startswith("RESULT"))[6:])
    assert worker_hash is not None and worker_hash == here_hash
    assert made and after == made  # compiling here found the worker's entry: nothing new


def test_a_bad_request_is_answered_with_an_error():
    worker = Worker()
    try:
        reply = worker.ask({"path": "/nonexistent/kernel.py", "module": "m", "name": "k", "data": "{}", "target": []})
        assert "error" in reply and "nonexistent" in reply["error"]
        reply = worker.ask({"unexpected": True})  # the worker still serves
        assert "KeyError" in reply["error"]
    finally:
        worker.close()
    assert worker.process.poll() is not None  # it ends when its input closes


def test_a_dead_worker_means_compiling_here(monkeypatch):
    monkeypatch.setenv("FUSIONPLAN_COMPILE_PROCESSES", "1")
    pool = compile_pool.CompilePool(1)
    assert pool._workers == []  # started as kernels come
    pool._idle.put(pool._take())
    try:
        pool._workers[0].process.kill()
        pool._workers[0].process.wait()
        assert pool.compile({"path": "x", "module": "m", "name": "k", "data": "{}", "target": []}) is None
        assert pool._workers[0].process.poll() is None  # a fresh worker took its place
    finally:
        pool.close()


@pytest.mark.parametrize(
    "workers, enabled, used",
    [(4, True, True), (1, True, False), (4, False, False)],
)
def test_the_pool_serves_gpu_compiles_of_several_workers(monkeypatch, workers, enabled, used):
    started = []
    monkeypatch.setattr(compile_pool, "CompilePool", lambda size: started.append(size) or FakePool(size))
    monkeypatch.setattr(compile_pool, "_pool", None)
    with worker_processes(workers, enabled):
        assert (compile_pool.active_pool() is not None) == used
    assert compile_pool.active_pool() is None and started == ([workers] if used else [])


def test_a_pool_of_other_settings_is_started_again(monkeypatch, tmp_path):
    monkeypatch.setenv("FUSIONPLAN_COMPILE_PROCESSES", "1")
    pools = []
    monkeypatch.setattr(compile_pool, "CompilePool", lambda size: pools.append(FakePool(size)) or pools[-1])
    monkeypatch.setattr(compile_pool, "_pool", None)
    with worker_processes(2, True):
        first = compile_pool.active_pool()
    with worker_processes(2, True):
        assert compile_pool.active_pool() is first  # kept between calls
    monkeypatch.setenv("FUSIONPLAN_CACHE_DIR", str(tmp_path))
    with worker_processes(2, True):
        assert compile_pool.active_pool() is not first and first.closed
    with worker_processes(8, True):
        assert compile_pool.active_pool().size == 8
    compile_pool.close_pool()


class FakePool:
    def __init__(self, size: int) -> None:
        self.size, self.closed = size, False
        self.environment = compile_pool._environment()

    def close(self) -> None:
        self.closed = True


def test_the_pool_is_started_with_the_triton_cache_set(monkeypatch, tmp_path):
    """The workers compile into the cache the kernels are loaded from: Triton's cache goes inside
    fusionplan's before the pool reads its settings (else every kernel compiles in the process)."""
    monkeypatch.setenv("FUSIONPLAN_COMPILE_PROCESSES", "1")
    monkeypatch.setenv("FUSIONPLAN_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("TRITON_CACHE_DIR", raising=False)
    monkeypatch.setattr(compile_pool, "CompilePool", FakePool)
    monkeypatch.setattr(compile_pool, "_pool", None)
    with worker_processes(2, True):
        pool = compile_pool.active_pool()
        assert pool is not None and ("TRITON_CACHE_DIR", str(tmp_path / "triton")) in pool.environment
    assert "TRITON_CACHE_DIR" not in os.environ  # the workers' environment has it, ours does not
    compile_pool.close_pool()


@pytest.fixture
def cache_knob():
    """Triton's cache-manager knob as the environment gives it, before and after the test."""
    from triton import knobs

    del knobs.cache.manager_class
    yield knobs.cache
    del knobs.cache.manager_class


def test_triton_compiles_into_our_cache_without_touching_the_environment(cache_knob, monkeypatch, tmp_path):
    monkeypatch.setenv("FUSIONPLAN_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("TRITON_CACHE_DIR", raising=False)
    before = dict(os.environ)
    use_triton_cache_inside_ours()
    assert dict(os.environ) == before
    from triton.runtime.cache import get_cache_manager

    stored = get_cache_manager("0123abcd" * 8).put(b"cubin", "kernel.cubin", binary=True)
    assert pathlib.Path(stored).parent.parent == tmp_path / "triton" and pathlib.Path(stored).read_bytes() == b"cubin"
    assert triton_cache_dir() == tmp_path / "triton"
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "elsewhere"))  # set later (torch.compile does)
    assert triton_cache_dir() == tmp_path / "triton"  # where the kernels already are


def test_a_triton_cache_the_user_chose_is_kept(cache_knob, monkeypatch, tmp_path):
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "theirs"))
    use_triton_cache_inside_ours()
    assert cache_knob.manager_class is None and os.environ["TRITON_CACHE_DIR"] == str(tmp_path / "theirs")
    assert triton_cache_dir() == tmp_path / "theirs"
    assert ("TRITON_CACHE_DIR", str(tmp_path / "theirs")) in compile_pool._environment()
