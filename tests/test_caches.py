"""Persistent caches: the perf database, the generated-kernel files, concurrency and damage."""

import logging
import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
import torch

import fusionplan as fp
from fusionplan.core.caches import LruCache
from fusionplan.runtime import tuning
from fusionplan.runtime.codegen import interpreter_active
from fusionplan.runtime.perfdb import PerfDB, signature_digest
from fusionplan.tools.cachecli import main as cache_main
from fusionplan.tools.verify import compare, random_args, reference_output


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FUSIONPLAN_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


CONFIG = tuning.CONV_CANDIDATES[0]


def test_database_created_and_keyed(cache):
    db = PerfDB()
    assert db.get("triton-conv", ("sig",), "H100") is None
    db.put("triton-conv", ("sig",), "H100", dict(vars(CONFIG)), 0.5)
    assert (cache / "perfdb.sqlite").exists()
    assert PerfDB().get("triton-conv", ("sig",), "H100") == dict(vars(CONFIG))  # another "process"
    assert db.get("triton-conv", ("sig",), "H200") is None
    assert db.get("triton-pointwise", ("sig",), "H100") is None
    assert db.get("triton-conv", ("other",), "H100") is None
    assert db.count() == 1


def test_corrupted_database_is_rebuilt(cache, caplog):
    db = PerfDB()
    db.put("s", ("k",), "d", {"a": 1})
    (cache / "perfdb.sqlite").write_bytes(b"this is not a database" * 100)
    for suffix in ("-wal", "-shm"):
        (cache / f"perfdb.sqlite{suffix}").unlink(missing_ok=True)
    with caplog.at_level(logging.WARNING, logger="fusionplan"):
        assert PerfDB().get("s", ("k",), "d") is None
    assert "damaged" in caplog.text
    assert list(cache.glob("perfdb.sqlite.corrupt-*"))
    db2 = PerfDB()
    db2.put("s", ("k",), "d", {"a": 2})
    assert db2.get("s", ("k",), "d") == {"a": 2}


def test_truncated_database_is_rebuilt(cache):
    db = PerfDB()
    for i in range(50):
        db.put("s", (i,), "d", {"i": i})
    path = cache / "perfdb.sqlite"
    for suffix in ("-wal", "-shm"):
        (cache / f"perfdb.sqlite{suffix}").unlink(missing_ok=True)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 3])
    db2 = PerfDB()
    assert db2.get("s", (7,), "d") in (None, {"i": 7})  # whatever survives is either absent or right
    db2.put("s", (7,), "d", {"i": 7})
    assert db2.get("s", (7,), "d") == {"i": 7}


def test_find_benchmarks_once_then_reuses(cache):
    calls = []

    def benchmark(cfg):
        calls.append(cfg)
        return 1.0 if cfg == tuning.CONV_CANDIDATES[2] else 2.0

    best = tuning.find_config("triton-conv", ("plan",), "dev", tuning.CONV_CANDIDATES, benchmark)
    assert best == tuning.CONV_CANDIDATES[2] and len(calls) == len(tuning.CONV_CANDIDATES)
    calls.clear()
    again = tuning.find_config("triton-conv", ("plan",), "dev", tuning.CONV_CANDIDATES, benchmark, db=PerfDB())
    assert again == best and calls == []  # a later process: no benchmarking


def test_find_ignores_a_stored_config_that_is_not_a_candidate(cache):
    PerfDB().put("triton-conv", ("plan",), "dev", {"block_m": 7})
    best = tuning.find_config("triton-conv", ("plan",), "dev", tuning.CONV_CANDIDATES[:2], lambda cfg: 1.0)
    assert best == tuning.CONV_CANDIDATES[0]
    assert PerfDB().get("triton-conv", ("plan",), "dev") == dict(vars(best))


def test_find_skips_configs_that_fail(cache):
    def benchmark(cfg):
        if cfg != tuning.CONV_CANDIDATES[1]:
            raise RuntimeError("out of shared memory")
        return 3.0

    assert tuning.find_config("x", ("p",), "d", tuning.CONV_CANDIDATES, benchmark) == tuning.CONV_CANDIDATES[1]


WORKER = textwrap.dedent("""
    import sys, torch, fusionplan as fp
    from fusionplan.runtime.perfdb import PerfDB
    from fusionplan.tools.verify import random_args, reference_output, compare
    worker = int(sys.argv[1])
    db = PerfDB()
    for i in range(40):
        db.put("solver", ("shared", i % 10), "dev", {"worker": worker, "i": i % 10})
        db.put("solver", ("own", worker, i), "dev", {"i": i})
        assert db.get("solver", ("own", worker, i), "dev") == {"i": i}
    x = torch.randn(1, 4, 6, 6)
    plan = fp.FusionPlan(fp.TensorDescriptor.from_tensor(x))
    plan.add_conv_forward(fp.ConvolutionDescriptor((1, 1)), fp.TensorDescriptor.packed("float", (5, 4, 3, 3)))
    plan.add_activation_forward(fp.ActivationMode.RELU)
    handle = fp.Handle("cpu")
    assert plan.compile(handle, backend=sys.argv[2]).startswith(sys.argv[2])
    args = random_args(plan)
    y = torch.full(plan.output_desc.dims, float("nan"))
    plan.execute(handle, x, y, args)
    assert compare(y, reference_output(plan, x, args)).rms_ok
    print("ok", worker)
""")


def test_four_processes_at_once(cache, tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    backend = "triton" if interpreter_active() else "cpu"
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), str(w), backend], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for w in range(4)
    ]
    outs = [p.communicate(timeout=300) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err[-2000:]
        assert out.startswith("ok")
    db = PerfDB()
    assert db.count() == 10 + 4 * 40
    assert db.get("solver", ("shared", 3), "dev")["i"] == 3
    if backend == "triton":
        assert len(list((cache / "kernels").glob("*.py"))) == 1  # one generated file, written once


@pytest.mark.skipif(not interpreter_active(), reason="needs Triton's interpreter")
def test_truncated_kernel_file_is_rewritten(cache, monkeypatch):
    monkeypatch.setenv("FUSIONPLAN_BACKEND", "triton")
    import fusionplan.runtime.codegen as codegen

    x = torch.randn(1, 3, 5, 5)

    def run():
        plan = fp.FusionPlan(fp.TensorDescriptor.from_tensor(x))
        plan.add_activation_forward(fp.ActivationMode.ELU)
        plan.add_bias_forward(fp.TensorDescriptor.packed("float", (1, 3, 1, 1)))
        handle = fp.Handle("cpu")
        plan.compile(handle)
        args = random_args(plan)
        y = torch.full(plan.output_desc.dims, float("nan"))
        plan.execute(handle, x, y, args)
        assert compare(y, reference_output(plan, x, args)).rms_ok

    run()
    (path,) = (cache / "kernels").glob("*.py")
    text = path.read_text()
    path.write_text(text[: len(text) // 2])  # a crash mid-write (by an older writer)
    monkeypatch.setattr(codegen, "_modules", LruCache("kernel modules", None, process=False))  # a new process
    run()
    assert path.read_text() == text


def _conv_tuning_key(
    dtype="float",
    layout="NHWC",
    shape=(2, 8, 9, 9),
    chain="CBA",
    act=fp.ActivationMode.RELU,
    bn=fp.BatchNormMode.SPATIAL,
    conv=((1, 1), (1, 1), (1, 1), 1),
    k=8,
    tf32=False,
):
    x_desc = fp.TensorDescriptor.packed(dtype, shape, layout)
    plan = fp.FusionPlan(x_desc)
    plan.add_conv_forward(
        fp.ConvolutionDescriptor(*conv), fp.TensorDescriptor.packed(dtype, (k, shape[1] // conv[3], 3, 3))
    )
    for letter in chain[1:]:
        ch = plan.output_desc.dims[1]
        if letter == "B":
            plan.add_bias_forward(fp.TensorDescriptor.packed(dtype, (1, ch, 1, 1)))
        elif letter == "N":
            dims = (1, ch, 1, 1) if bn == fp.BatchNormMode.SPATIAL else (1, *plan.output_desc.dims[1:])
            plan.add_batchnorm_inference(bn, fp.TensorDescriptor.packed("float", dims))
        else:
            plan.add_activation_forward(act)
    from fusionplan.solvers.conv_kernel import TritonConvKernel

    handle = fp.Handle("cpu", allow_tf32=tf32)
    return (
        signature_digest(TritonConvKernel(plan.spec(), handle).tuning_key()),
        (plan.spec().signature(), handle.tf32_allowed()),
    )


@pytest.mark.skipif(not interpreter_active(), reason="builds Triton kernels (interpreter)")
@pytest.mark.parametrize(
    "change",
    [
        dict(dtype="half"),
        dict(layout="NCHW"),
        dict(shape=(2, 8, 9, 10)),
        dict(shape=(3, 8, 9, 9)),
        dict(chain="CBNA"),
        dict(chain="CAB"),
        dict(act=fp.ActivationMode.ELU),
        dict(chain="CN", bn=fp.BatchNormMode.SPATIAL),
        dict(conv=((0, 0), (1, 1), (1, 1), 1)),
        dict(conv=((1, 1), (2, 2), (1, 1), 1)),
        dict(conv=((2, 2), (1, 1), (2, 2), 1)),
        dict(conv=((1, 1), (1, 1), (1, 1), 2)),
        dict(k=16),
        dict(tf32=True),
    ],
)
def test_cache_keys_differ_when_code_relevant_fields_differ(cache, change):
    base = _conv_tuning_key()
    assert _conv_tuning_key() == base  # the same plan again: the same keys
    changed = _conv_tuning_key(**change)
    assert changed[0] != base[0] or changed[1] != base[1]


@pytest.mark.skipif(not interpreter_active(), reason="builds Triton kernels (interpreter)")
def test_bn_mode_changes_the_key(cache):
    a = _conv_tuning_key(chain="CN", bn=fp.BatchNormMode.SPATIAL)
    b = _conv_tuning_key(chain="CN", bn=fp.BatchNormMode.PER_ACTIVATION)
    assert a != b


def test_compile_and_execute_from_several_threads(cache):
    x = torch.randn(2, 4, 8, 8)
    plan = fp.FusionPlan(fp.TensorDescriptor.from_tensor(x))
    plan.add_conv_forward(fp.ConvolutionDescriptor((1, 1)), fp.TensorDescriptor.packed("float", (6, 4, 3, 3)))
    plan.add_batchnorm_inference(fp.BatchNormMode.SPATIAL, fp.TensorDescriptor.packed("float", (1, 6, 1, 1)))
    plan.add_activation_forward(fp.ActivationMode.RELU)
    handle = fp.Handle("cpu")
    errors = []

    def work(seed):
        try:
            torch.manual_seed(seed)
            plan.compile(handle)
            for _ in range(10):
                args = random_args(plan)
                xi = torch.randn_like(x)
                y = torch.full(plan.output_desc.dims, float("nan"))
                plan.execute(handle, xi, y, args)
                if not compare(y, reference_output(plan, xi, args)).rms_ok:
                    errors.append(f"thread {seed}: wrong result")
        except Exception as exc:  # reported below
            errors.append(f"thread {seed}: {exc!r}")

    threads = [threading.Thread(target=work, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_cache_command(cache, capsys):
    PerfDB().put("s", ("k",), "d", {"a": 1})
    assert cache_main(["info"]) == 0
    out = capsys.readouterr().out
    assert str(cache) in out and "1 tuned configurations" in out
    assert cache_main(["clear", "--perfdb"]) == 0
    assert "perf database" in capsys.readouterr().out
    assert PerfDB().count() == 0
    assert cache_main(["clear"]) == 0


def test_tune_command_on_the_cpu(cache, capsys):
    from fusionplan.tools.tunecli import main as tune_main

    assert tune_main(["--device", "cpu", "--layers", "r50_01,r50_22", "--batch", "1", "--precisions", "fp32"]) == 0
    out = capsys.readouterr().out
    assert "tuned 0 of 4 plans" in out and "chosen: cpu-folded 4" in out
    assert "0 plans with solvers timed against each other" in out  # Triton's interpreter is not timed
    assert "4 plans compiled by cpu-folded: nothing new stored" in out


# ---- launch records: a damaged or stale record costs a compile, never an error ---------------------------
def test_launch_records_that_cannot_be_used_are_ignored(cache, caplog, monkeypatch):
    import json

    monkeypatch.setenv("TRITON_CACHE_DIR", str(cache / "triton"))

    from fusionplan.runtime.launch import load_recorded_kernel, record_kernel

    class Fn:  # what Triton's source object needs from a kernel function
        __name__ = "conv_kernel"
        arg_names = ["x_ptr"]

    path = cache / "launch" / "r.json"
    assert load_recorded_kernel(path, Fn()) is None  # no record
    path.parent.mkdir(parents=True)
    path.write_text('{"hash": ')  # truncated
    with caplog.at_level(logging.WARNING, logger="fusionplan"):
        assert load_recorded_kernel(path, Fn()) is None
    assert "unreadable" in caplog.text
    stale = {
        "hash": "0" * 64,
        "metadata_file": "conv_kernel.json",
        "signature": [["x_ptr", "*fp32"]],
        "constants": [],
        "attrs": [],
    }
    path.write_text(json.dumps(stale))  # Triton's cache has no such entry
    assert load_recorded_kernel(path, Fn()) is None
    record_kernel(cache / "launch" / "x.json", object())  # not a compiled kernel: nothing written
    assert not (cache / "launch" / "x.json").exists()


@pytest.mark.parametrize(
    ("m", "k", "groups", "taps", "tile"),
    [
        (49, 512, 1, 9, (32, 64)),  # r50_18 at batch 1: 4 programs of 64x128 tiles
        (3136, 64, 1, 9, (32, 64)),  # r50_02 at batch 1: 49 programs
        (49, 2048, 1, 1, (32, 32)),  # r50_19 at batch 1 (1x1): 64 programs of 32x64, still small
        (784, 256, 1, 1, (32, 64)),  # r50_11 at batch 1: 100 programs of 32x64 tiles
        (1568, 512, 1, 9, (64, 128)),  # a 7x7 layer at batch 32: 100 programs, unchanged
        (1568, 2048, 1, 1, (64, 128)),  # r50_19 at batch 32
        (100352, 64, 1, 9, (128, 64)),  # 56x56 at batch 32
        (49, 64, 128, 9, (64, 64)),  # 128 groups of one tile each: the grid fills the GPU
    ],
)
def test_conv_heuristic_takes_small_tiles_for_small_grids(m, k, groups, taps, tile):
    cfg = tuning.conv_heuristic(m, k, 256, torch.float16, False, groups, taps)
    assert (cfg.block_m, cfg.block_n) == tile
    assert tuning.conv_heuristic(m, k, 256, torch.float16, True, groups, taps) == tuning.CONV_INTERPRETER


@pytest.mark.parametrize(
    ("plane", "channels", "fitted"),
    [
        (49, 2048, (64, 64)),  # 7x7: 49 of 64 pixel slots, 64 planes a program
        (196, 1024, (256, 16)),  # 14x14
        (784, 512, (1024, 4)),  # 28x28: the unfitted tile
        (3136, 256, (1024, 4)),  # 56x56: four pixel tiles a plane
        (1, 3, (16, 4)),  # 1x1 planes of 3 channels: the smallest tile
    ],
)
def test_nchw_pointwise_tiles_fit_the_plane(plane, channels, fitted):
    """NCHW pointwise tiles: the plane's pixels rounded up to a power of two by channels up to 4096
    elements; the interpreter's small tiles."""
    cfg = tuning.pointwise_heuristic(False, channels, False, plane)
    assert (cfg.block_p, cfg.block_c) == fitted and cfg.block_p * cfg.block_c <= 4096
    assert tuning.pointwise_heuristic(False, channels, True, plane) == tuning.POINTWISE_INTERPRETER


def test_flat_pointwise_runs_where_they_are_faster(monkeypatch):
    """Flat runs for every NHWC plan and for NCHW planes below POINTWISE_FLAT_NCHW_PLANES_BELOW
    pixels (the tiles are faster on larger ones); the interpreter's short runs."""
    below = tuning.POINTWISE_FLAT_NCHW_PLANES_BELOW
    flat = tuning.PointwiseConfig(tuning.POINTWISE_FLAT_BLOCK, 1, tuning.POINTWISE_FLAT_WARPS)
    monkeypatch.setattr(tuning, "POINTWISE_FLAT_PLANE_VECTORS", 0)
    assert tuning.pointwise_flat_config(False, False, below - 1, 2) == flat
    assert tuning.pointwise_flat_config(False, False, below, 2) is None
    assert tuning.pointwise_flat_config(False, True, 3136, 2) == flat
    assert tuning.pointwise_flat_config(True, False, 49, 2) == tuning.POINTWISE_FLAT_INTERPRETER
    assert tuning.pointwise_flat_config(True, False, below, 2) is None


@pytest.mark.parametrize(
    "plane, size, least, vec",
    [
        (3136, 2, 16, 8),
        (784, 4, 16, 4),
        (196, 2, 16, 1),
        (196, 2, 8, 4),  # 14x14 fp16 in 8-byte vectors
        (196, 4, 16, 4),
        (49, 2, 8, 1),
        (12544, 2, 16, 8),
        (100, 8, 16, 2),
        (100, 1, 4, 4),
    ],
)
def test_flat_runs_on_large_nchw_planes_with_plane_vectors(plane, size, least, vec, monkeypatch):
    """POINTWISE_FLAT_PLANE_VECTORS: NCHW planes of whole vectors (16 bytes, or at least the
    setting's bytes) take vectors of one plane and run flat whatever their size; other planes, and
    NHWC, elements one by one."""
    monkeypatch.setattr(tuning, "POINTWISE_FLAT_PLANE_VECTORS", least)
    assert tuning.pointwise_plane_vector(False, plane, size) == vec
    assert tuning.pointwise_plane_vector(True, plane, size) == 1
    flat = tuning.pointwise_flat_config(False, False, plane, size)
    assert (flat is not None) == (vec > 1 or plane < tuning.POINTWISE_FLAT_NCHW_PLANES_BELOW)
    monkeypatch.setattr(tuning, "POINTWISE_FLAT_PLANE_VECTORS", 0)
    assert tuning.pointwise_plane_vector(False, plane, size) == 1


def test_tests_do_not_write_into_the_users_cache():
    """conftest.py gives the run its own cache directory (Triton's cache within it)."""
    import tempfile

    from fusionplan.runtime.codegen import cache_dir

    if "FUSIONPLAN_TEST_CACHE_DIR" in os.environ:
        pytest.skip("the run was given its cache directory")
    assert Path(cache_dir()).resolve().is_relative_to(Path(tempfile.gettempdir()).resolve())
    # Triton's cache: inside a temporary directory too (an earlier test's, where it set the variable
    # under a cache directory of its own: fusionplan sets it once a process)
    triton_dir = os.environ.get("TRITON_CACHE_DIR")
    assert triton_dir is None or Path(triton_dir).resolve().is_relative_to(Path(tempfile.gettempdir()).resolve())
