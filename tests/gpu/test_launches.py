"""Launching on the GPU: repeats and their records, direct launches, descriptors rebound per call,
CUDA graphs and streams, DLPack arrays.

    python -m pytest -m gpu tests/gpu -n 12
"""

from __future__ import annotations

import os

import pytest
import torch

import fusionplan as fp
from fusionplan.core.enums import ActivationMode, BatchNormMode
from fusionplan.tools.verify import EPS, add_chain, compare, random_args, reference_output

from ..util import (
    plan_for,
)
from .common import input_tensor, run_and_check

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


@pytest.mark.parametrize("layout", ["NHWC", "NCHW"])
def test_conv_bias_activation_repeats_with_its_records(layout):
    """The one-call convolution on the GPU, called again with the same tensors (its records reused:
    the kernel's derived data and bound launch found again), then after an in-place change of the
    weight and of the bias (seen through their version counters), each result the reference's."""
    x = input_tensor((2, 64, 14, 14), torch.float16, layout)
    w = (torch.randn(64, 64, 3, 3, device="cuda") / 24).half()
    b = torch.randn(64, device="cuda").half()
    if layout == "NHWC":
        w = w.to(memory_format=torch.channels_last)

    def check(y) -> None:
        ref = torch.relu(torch.nn.functional.conv2d(x.double(), w.double(), b.double(), padding=1))
        assert torch.isfinite(y).all() and ((y.double() - ref).norm() / ref.norm()).item() < 1e-2

    for _ in range(3):
        check(fp.conv_bias_activation(x, w, b, padding=1))
    w.mul_(-0.5)
    check(fp.conv_bias_activation(x, w, b, padding=1))
    b.add_(1.0)
    check(fp.conv_bias_activation(x, w, b, padding=1))


@pytest.mark.slow
@pytest.mark.parametrize("chain", ["CBNA", "NA"])
def test_repeated_executes_take_the_direct_launch_path(chain):
    """After the first launch, kernels are called directly; the specialization key must follow
    every change that matters: new inputs, another output layout, a misaligned output view."""
    x0 = input_tensor((4, 32, 14, 14), torch.float16, "NHWC")
    plan = add_chain(
        fp.FusionPlan(fp.TensorDescriptor.from_tensor(x0)),
        chain,
        conv=fp.ConvolutionDescriptor((1, 1), (1, 1), (1, 1), 1),
        k=48,
        r=3,
        s=3,
        bn_mode=BatchNormMode.SPATIAL,
        activation=ActivationMode.RELU,
        param_dtype="half",
    )
    handle = fp.Handle("cuda")
    plan.compile(handle)
    dims = plan.output_desc.dims
    numel = int(torch.Size(dims).numel())
    args = random_args(plan, "cuda", param_dtype=torch.float32)
    for i in range(8):
        x = input_tensor((4, 32, 14, 14), torch.float16, "NHWC")
        if i % 3 == 2:  # new arguments now and then
            args = random_args(plan, "cuda", param_dtype=torch.float32)
        if i % 4 == 3:  # a view starting 2 bytes into its storage: not 16-byte aligned
            y = torch.full((numel + 1,), float("nan"), device="cuda", dtype=torch.float16)[1:].view(dims)
        elif i % 2:
            y = torch.full(dims, float("nan"), device="cuda", dtype=torch.float16)
        else:
            y = torch.full(dims, float("nan"), device="cuda", dtype=torch.float16).to(memory_format=torch.channels_last)
        plan.execute(handle, x, y, args)
        result = compare(y, reference_output(plan, x, args), EPS[torch.float16])
        assert result.nonfinite == 0 and result.rel_norm < 1e-2, (i, str(result))


@pytest.mark.parametrize("solver", ["gluon-window", "gluon-gemm"])
def test_gluon_repeats_rebind_the_input_descriptor(monkeypatch, solver):
    """The Gluon kernels pass their input as host tensor descriptors (gluon-gemm: three): repeated
    executes on new inputs and outputs launch the bound kernel with descriptors over each new
    input, and compute it."""
    from fusionplan.runtime import launch

    repeats = []
    original = launch.BoundLaunch.launch
    monkeypatch.setattr(launch.BoundLaunch, "launch", lambda self, ptrs: repeats.append(ptrs) or original(self, ptrs))
    x0 = input_tensor((8, 128, 14, 14), torch.float16, "NHWC")
    r = 3 if solver == "gluon-window" else 1
    conv = fp.ConvolutionDescriptor((r // 2, r // 2))
    plan = add_chain(plan_for(x0), "CBNA", conv=conv, k=128, r=r, s=r, param_dtype="float")
    handle = fp.Handle("cuda")
    assert plan.compile(handle, solver=solver) == solver
    args = random_args(plan, "cuda", param_dtype=torch.float32)
    inputs = [input_tensor((8, 128, 14, 14), torch.float16, "NHWC") for _ in range(5)]  # 5 addresses
    for i, x in enumerate(inputs):
        y = torch.full(plan.output_desc.dims, float("nan"), device="cuda", dtype=torch.float16)
        y = y.to(memory_format=torch.channels_last)
        plan.execute(handle, x, y, args)
        result = compare(y, reference_output(plan, x, args), EPS[torch.float16])
        assert result.nonfinite == 0 and result.rel_norm < 1e-2, (i, str(result))
    assert len(repeats) == 4 and len({p[0] for p in repeats}) == 4  # every execute after the first


def test_launch_records_keep_kernels_of_one_source_apart(monkeypatch, tmp_path):
    """gluon-gemm's source is one per chain and dtype; a stride-1 plan and a strided one of the
    same tile differ in constexpr arguments (ROW_SLOTS) and descriptor blocks. Each compile in a
    new process finds the other's launch record on disk: it must load its own kernel (a key
    without those values once loaded the stride-1 kernel for the strided plan: "Rank mismatch")."""
    from fusionplan.runtime import tuning
    from fusionplan.solvers import gluon_gemm

    monkeypatch.setenv("FUSIONPLAN_CACHE_DIR", str(tmp_path))  # records of this test only
    tile = tuning.ConvConfig(256, 128, 64, 8, 8, 3, 1)
    monkeypatch.setattr(gluon_gemm, "gluon_gemm_config", lambda *a, **k: tile)
    for stride, hw in ((1, 28), (2, 56), (1, 28), (2, 56)):  # each after the other's record
        x = input_tensor((4, 128, hw, hw), torch.float16, "NHWC")
        conv = fp.ConvolutionDescriptor((0, 0), (stride, stride))
        plan = add_chain(plan_for(x), "CBNA", conv=conv, k=128, r=1, s=1, param_dtype="float")
        run_and_check(plan, "fp16", x, "NHWC", solver="gluon-gemm")  # a fresh plan, kernel and launcher


@pytest.mark.parametrize("chain", ["CBNA", "NA"])
def test_repeats_follow_what_changes(chain):
    """Repeated calls launch a bound kernel directly; each call below changes one thing that must
    send it back through the full path: alternating argument sets, two plans sharing one kernel,
    a parameter changed in place, a misaligned input, the output aliasing the input, a handle
    with its own stream."""
    shape = (4, 32, 14, 14)

    def new_plan():
        x = input_tensor(shape, torch.float16, "NHWC")
        conv = fp.ConvolutionDescriptor((1, 1), (1, 1), (1, 1), 1)
        return add_chain(plan_for(x), chain, conv=conv, k=32, r=3, s=3, param_dtype="float")

    plans = [new_plan(), new_plan()]
    handle = fp.Handle("cuda")
    for plan in plans:
        plan.compile(handle)
    assert plans[0]._entry(handle).kernel is plans[1]._entry(handle).kernel
    arg_sets = [[random_args(p, "cuda", param_dtype=torch.float32) for _ in range(2)] for p in plans]
    stream_handle = fp.Handle("cuda", stream=torch.cuda.Stream())
    plans[0].compile(stream_handle)
    scale = next(r.scale for r in (arg_sets[0][0].get(op) for op in plans[0].ops) if hasattr(r, "scale"))
    n, c, hh, ww = shape
    for i in range(24):
        which, h = i % 2, handle
        x = input_tensor(shape, torch.float16, "NHWC")
        y = torch.full(shape, float("nan"), device="cuda", dtype=torch.float16).to(memory_format=torch.channels_last)
        if i == 8:
            scale.mul_(-1.5)  # in place: the folded coefficients must follow
        elif i == 12:  # an input view 2 bytes into its storage
            x = torch.randn(x.numel() + 1, device="cuda").half()[1:].view(n, hh, ww, c).permute(0, 3, 1, 2)
        elif i in (14, 16):
            y = x  # in place (the convolution goes through a temporary)
        elif i == 18:
            h = stream_handle
        plan, args = plans[which], arg_sets[which][(i // 2) % 2]
        if h is stream_handle:
            plan, args = plans[0], arg_sets[0][0]
        ref = reference_output(plan, x, args)
        torch.cuda.synchronize()  # the stream handle's stream does not wait for the default one
        plan.execute(h, x, y, args)
        torch.cuda.synchronize()
        result = compare(y, ref, EPS[torch.float16])
        assert result.nonfinite == 0 and result.rel_norm < 1e-2, (i, str(result))


def test_kernels_load_from_their_launch_records(tmp_path, monkeypatch):
    """A new launcher (as in a new process) finds the compiled kernel through its launch record,
    without Triton's compile path, and it computes the same results."""
    from fusionplan.runtime.launch import Launcher

    monkeypatch.setenv("FUSIONPLAN_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("TRITON_CACHE_DIR", raising=False)
    x = input_tensor((2, 24, 9, 11), torch.float16, "NHWC")
    plan = add_chain(plan_for(x), "CBNA", conv=fp.ConvolutionDescriptor((1, 1)), k=40, r=3, s=3, param_dtype="float")
    handle = fp.Handle("cuda")
    plan.compile(handle)
    kernel = plan._entry(handle).kernel
    (key,) = kernel.launcher._compiled
    assert list((tmp_path / "launch").glob("*.json"))
    fresh = Launcher(kernel.launcher.fn, kernel.launcher.grid_dependency)  # launched as the plan's kernel is
    cfg = kernel.config
    loaded = fresh._load_recorded(key, fresh._record_path(key, cfg.num_warps, cfg.num_stages))
    assert loaded is not None and loaded is not kernel.launcher._compiled[key]
    kernel.launcher = fresh
    args = random_args(plan, "cuda", param_dtype=torch.float32)
    y = torch.full(plan.output_desc.dims, float("nan"), device="cuda", dtype=torch.float16)
    y = y.to(memory_format=torch.channels_last)
    plan.execute(handle, x, y, args)
    assert list(fresh._compiled.values()) == [loaded]  # the launch used the loaded kernel
    result = compare(y, reference_output(plan, x, args), EPS[torch.float16])
    assert result.nonfinite == 0 and result.rel_norm < 1e-2, str(result)


def test_execute_under_cuda_graph_capture():
    x = input_tensor((8, 64, 28, 28), torch.float16, "NHWC")
    plan = add_chain(
        plan_for(x),
        "CBNA",
        conv=fp.ConvolutionDescriptor((1, 1), (1, 1), (1, 1), 1),
        k=64,
        r=3,
        s=3,
        bn_mode=BatchNormMode.SPATIAL,
        activation=ActivationMode.RELU,
        param_dtype="half",
    )
    handle = fp.Handle("cuda")
    plan.compile(handle)
    args = random_args(plan, "cuda", param_dtype=torch.float32)
    y = torch.empty(plan.output_desc.dims, device="cuda", dtype=torch.float16).to(memory_format=torch.channels_last)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):  # warm up: compile, fold, first launch
            plan.execute(handle, x, y, args)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(100):
            plan.execute(handle, x, y, args)
    x.copy_(torch.randn_like(x))
    y.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    result = compare(y, reference_output(plan, x, args), EPS[torch.float16])
    assert result.nonfinite == 0 and result.rel_norm < 1e-2, str(result)


def test_descriptor_scratch_is_reused_per_stream_and_private_to_graphs():
    """Kernels that build tensor descriptors on the device (windows reading a view per stride
    class: 15x15 images, stride 2) share one scratch buffer per stream (no allocation per launch);
    a captured launch gets its own, as a graph may replay anywhere."""
    from fusionplan.runtime import launch

    x = input_tensor((4, 128, 15, 15), torch.float16, "NHWC")
    conv = fp.ConvolutionDescriptor((1, 1), (2, 2))
    plan = add_chain(plan_for(x), "CBNA", conv=conv, k=128, r=3, s=3, param_dtype="half")
    handle = fp.Handle("cuda")
    assert plan.compile(handle, solver="triton-window") == "triton-window"
    args = random_args(plan, "cuda", param_dtype=torch.float32)
    y = torch.empty(plan.output_desc.dims, device="cuda", dtype=torch.float16).to(memory_format=torch.channels_last)

    def run_and_compare() -> None:
        x.normal_()
        y.fill_(float("nan"))
        plan.execute(handle, x, y, args)
        torch.cuda.synchronize()
        result = compare(y, reference_output(plan, x, args), EPS[torch.float16])
        assert result.nonfinite == 0 and result.rel_norm < 1e-2, str(result)

    launch._SCRATCH.clear()
    for _ in range(3):
        run_and_compare()
    assert len(launch._SCRATCH) == 1
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        run_and_compare()
        assert len(launch._SCRATCH) == 2  # a buffer of the side stream's own
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            plan.execute(handle, x, y, args)
        assert len(launch._SCRATCH) == 2
    torch.cuda.current_stream().wait_stream(side)
    run_and_compare()  # an eager launch between captures and replays
    x.normal_()
    y.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    result = compare(y, reference_output(plan, x, args), EPS[torch.float16])
    assert result.nonfinite == 0 and result.rel_norm < 1e-2, str(result)


@pytest.mark.slow
@pytest.mark.parametrize("solver", ["triton-conv", "triton-window"])
def test_split_reductions_across_streams_and_graphs(solver):
    """A 14x14 layer at batch 1 leaves most multiprocessors idle: its reduction is split. Repeated
    launches, a second stream and a captured graph each use a workspace of their own."""
    x = input_tensor((1, 256, 14, 14), torch.float16, "NHWC")
    plan = add_chain(plan_for(x), "CBNA", conv=fp.ConvolutionDescriptor((1, 1)), k=256, r=3, s=3, param_dtype="half")
    handle = fp.Handle("cuda")
    assert plan.compile(handle, solver=solver) == solver
    assert plan._entry(handle).kernel.config.split_k > 1
    args = random_args(plan, "cuda", param_dtype=torch.float32)
    y = torch.empty(plan.output_desc.dims, device="cuda", dtype=torch.float16).to(memory_format=torch.channels_last)

    def check() -> None:
        torch.cuda.synchronize()
        result = compare(y, reference_output(plan, x, args), EPS[torch.float16])
        assert result.nonfinite == 0 and result.rel_norm < 1e-2, str(result)

    def run_and_check() -> None:
        x.normal_()
        y.fill_(float("nan"))
        plan.execute(handle, x, y, args)
        check()

    for _ in range(3):  # the first launch, then the repeat path
        run_and_check()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        run_and_check()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            plan.execute(handle, x, y, args)
        run_and_check()  # on the capture's stream again: not with the graph's workspace
    torch.cuda.current_stream().wait_stream(side)
    run_and_check()
    for _ in range(2):
        x.normal_()
        y.fill_(float("nan"))
        graph.replay()
        check()


def test_dlpack_arrays_from_cupy_and_jax():
    """Any DLPack-capable array on the same device: CuPy arrays in and out (the output written in
    place), a JAX array in, for a plan and for a fused torch module."""

    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    cupy = pytest.importorskip("cupy")
    x_t = input_tensor((2, 16, 9, 7), torch.float16, "NCHW")
    plan = add_chain(plan_for(x_t), "CBNA", conv=fp.ConvolutionDescriptor((1, 1)), k=24, r=3, s=3)
    handle = fp.Handle("cuda")
    plan.compile(handle)
    args = random_args(plan, "cuda", param_dtype=torch.float32)
    x_cp = cupy.from_dlpack(x_t)
    y_cp = cupy.full(plan.output_desc.dims, cupy.nan, dtype=cupy.float16)
    plan.execute(handle, x_cp, y_cp, args)
    torch.cuda.synchronize()
    result = compare(torch.from_dlpack(y_cp), reference_output(plan, x_t, args), EPS[torch.float16])
    assert result.nonfinite == 0 and result.rel_norm < 1e-2, str(result)

    import fusionplan.torch as fpt

    model = torch.nn.Sequential(torch.nn.Conv2d(16, 8, 3, padding=1), torch.nn.ReLU()).eval().cuda().half()
    fused = fpt.fuse(model)
    chain = next(m for m in fused.modules() if isinstance(m, fpt.FusedChain))
    with torch.no_grad():
        ref = model(x_t)
        torch.testing.assert_close(chain(x_cp), ref, rtol=1e-2, atol=1e-2)
        jax = pytest.importorskip("jax")
        x_jax = jax.dlpack.from_dlpack(x_cp)  # a JAX array on the same GPU
        torch.testing.assert_close(chain(x_jax), ref, rtol=1e-2, atol=1e-2)


def test_fused_model_direct_launches_follow_what_changes(monkeypatch):
    """A fused model's repeated eager calls launch the kernel directly (``Repeat.launch_fresh``)
    and still see every change: parameters replaced, changed in place or given new storage, a
    scalar argument, an input of another layout or alignment, another stream."""
    import fusionplan.torch as fpt
    from fusionplan.runtime.launch import Repeat

    from ..test_torch_fuse import ResidualAdd, randomize_bn

    direct = []
    original = Repeat.launch_fresh
    monkeypatch.setattr(Repeat, "launch_fresh", lambda self, *a: direct.append(1) or original(self, *a))
    model = randomize_bn(ResidualAdd("plus").eval()).cuda().half().to(memory_format=torch.channels_last)
    fused = fpt.fuse(model)

    def check(x):
        out = torch.full_like(x, float("nan"))
        out.copy_(fused(x))
        conv, bn = fused.conv, fused.bn
        h = torch.nn.functional.conv2d(x.double(), conv.weight.double(), padding=1)
        bn_args = (bn.running_mean, bn.running_var, bn.weight, bn.bias)
        h = torch.nn.functional.batch_norm(h, *(t.double() for t in bn_args), False, 0.0, bn.eps)
        expected = torch.relu(x.double() + h)
        result = compare(out, expected, EPS[torch.float16])
        assert result.nonfinite == 0 and result.rel_norm < 1e-2, str(result)

    def fresh():
        return torch.randn(4, 8, 13, 11, device="cuda").half().to(memory_format=torch.channels_last)

    with torch.no_grad():
        for _ in range(3):
            check(fresh())
        assert len(direct) >= 2  # the calls after the first launched directly
        fused.conv.weight.mul_(1.5)  # in place: a new version
        check(fresh())
        fused.bn.running_var = torch.rand_like(fused.bn.running_var) + 0.5  # a new tensor object
        check(fresh())
        fused.bn.weight.data = torch.randn_like(fused.bn.weight)  # new storage, the same parameter
        check(fresh())
        fused.bn.eps = 0.25
        check(fresh())
        check(fresh().contiguous())  # NCHW
        check(torch.randn(4 * 8 * 13 * 11 + 1, device="cuda").half()[1:].view(4, 13, 11, 8).permute(0, 3, 1, 2))
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                check(fresh())
        torch.cuda.current_stream().wait_stream(side)
        calls = len(direct)
        check(fresh())
        assert len(direct) == calls + 1


def test_repeats_do_not_keep_inputs_and_outputs_alive():
    """Repeated calls keep their launches, not the tensors of the call that made them: once the
    caller drops its input and output, their memory is free again."""
    import gc

    import fusionplan.torch as fpt

    model = torch.nn.Sequential(torch.nn.Conv2d(64, 64, 3, padding=1), torch.nn.ReLU()).eval().cuda().half()
    fused = fpt.fuse(model.to(memory_format=torch.channels_last))
    big = (8, 64, 128, 128)  # 16 MiB per activation in fp16

    def run_and_drop():
        with torch.no_grad():
            for _ in range(3):  # the first call makes the repeat, the others take it
                x = torch.randn(big, device="cuda").half().to(memory_format=torch.channels_last)
                y = fused(x)
                del x, y

    torch.cuda.synchronize()
    gc.collect()
    before = torch.cuda.memory_allocated()
    run_and_drop()
    torch.cuda.synchronize()
    gc.collect()
    # what stays is the model's own (folded weights, descriptor scratch: well under a megabyte);
    # the first call's input and output would be 32 MiB
    assert torch.cuda.memory_allocated() - before < 8 * 2**20


@pytest.mark.slow
@pytest.mark.parametrize(
    "first, second, layout",
    [
        ("gluon-window", "gluon-gemm", "NHWC"),
        ("triton-conv", "triton-gemm", "NHWC"),
        ("gluon-nchw", "triton-gemm-nchw", "NCHW"),
        ("gluon-nchw-regs", "gluon-nchw", "NCHW"),
        ("gluon-halo", "gluon-halo", "NCHW"),
    ],
)
def test_grid_dependency_keeps_dependent_launches_in_order(first, second, layout):
    """Programmatic dependent launch: a kernel may begin while the one before it on the stream ends.
    The second plan reads the first's output, which a NaN fill precedes (a read too early would see
    it), launch after launch on one stream and in a replayed graph; each result is the reference's."""
    handle = fp.Handle("cuda")
    x = input_tensor((8, 128, 14, 14), torch.float16, layout)
    conv3 = fp.ConvolutionDescriptor((1, 1))
    plan1 = add_chain(plan_for(x), "CBNA", conv=conv3, k=128, r=3, s=3, param_dtype="float")
    mid = input_tensor(plan1.output_desc.dims, torch.float16, layout)
    r = 3 if second.startswith(("gluon-nchw", "gluon-halo")) else 1
    conv2 = fp.ConvolutionDescriptor((r // 2, r // 2))
    plan2 = add_chain(plan_for(mid), "CBNA", conv=conv2, k=256, r=r, s=r, param_dtype="float")
    assert plan1.compile(handle, solver=first) == first and plan2.compile(handle, solver=second) == second
    assert plan1._entry(handle).kernel.launcher.grid_dependency
    assert plan2._entry(handle).kernel.launcher.grid_dependency
    args1, args2 = (
        random_args(plan1, "cuda", param_dtype=torch.float32),
        random_args(plan2, "cuda", param_dtype=torch.float32),
    )
    y = input_tensor(plan2.output_desc.dims, torch.float16, layout)

    def chain() -> None:
        mid.fill_(float("nan"))
        y.fill_(float("nan"))
        plan1.execute(handle, x, mid, args1)
        plan2.execute(handle, mid, y, args2)

    def check() -> None:
        torch.cuda.synchronize()
        for plan, inp, out, args in ((plan1, x, mid, args1), (plan2, mid, y, args2)):
            result = compare(out, reference_output(plan, inp, args), EPS[torch.float16])
            assert result.nonfinite == 0 and result.rel_norm < 1e-2, str(result)

    for _ in range(3):  # the first launches, then the repeat path, on new input each time
        x.normal_()
        for _ in range(10):
            chain()
        check()
    graph = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        chain()  # first launches on the capture's stream, outside the capture
        with torch.cuda.graph(graph, stream=side):
            for _ in range(5):
                chain()
    torch.cuda.current_stream().wait_stream(side)
    for _ in range(3):
        x.normal_()
        graph.replay()
        check()
