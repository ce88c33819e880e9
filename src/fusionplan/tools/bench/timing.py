"""Timing and machine peaks for the benchmark suite.

GPU times come from CUDA events, the median of many runs after warm-up. Inputs are rotated over
enough copies to exceed twice the L2 cache, so no run finds its activations in cache. Launch gaps
count unless ``graph=True`` replays the calls from a CUDA graph. CPU times are wall-clock medians.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Peaks:
    """Measured ceilings of the device: the floor of a case is max(flops / matmul, bytes / copy)."""

    matmul_tflops: float  # dense matrix product, in the case's dtype
    copy_gbps: float  # device-to-device copy, bytes read plus bytes written

    def floor_ms(self, flops: float, nbytes: float) -> float:
        return max(flops / (self.matmul_tflops * 1e9), nbytes / (self.copy_gbps * 1e6))


def l2_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return int(getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 50 * 2**20))
    return 32 * 2**20  # a typical last-level cache; rotation only makes CPU numbers honest too


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def median_ms(
    fn: Callable[[int], None],
    device: torch.device,
    iters: int = 50,
    warmup: int = 5,
    graph: bool = False,
    graph_warmup: int = 1,
) -> float:
    """Median time of ``fn(i)`` (i selects the rotated input set), in milliseconds. ``graph``:
    of ``iters`` calls captured in one CUDA graph, after ``graph_warmup`` calls on a side stream
    (a training step wants a few: torch's recipe for capturing a whole step)."""
    for i in range(warmup):
        fn(i)
    synchronize(device)
    if device.type != "cuda":
        samples = []
        for i in range(iters):
            t0 = time.perf_counter()
            fn(i)
            samples.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(samples)
    if graph:
        return _graph_ms(fn, device, iters, graph_warmup)
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    for i in range(iters):
        starts[i].record()
        fn(i)
        ends[i].record()
    torch.cuda.synchronize(device)
    return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends))


def _graph_ms(fn: Callable[[int], None], device: torch.device, iters: int, warmup: int = 1) -> float:
    """Capture ``iters`` calls in one CUDA graph; time replays (no launch gaps)."""
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for i in range(warmup):
            fn(i)
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(iters):
            fn(i)
    graph.replay()
    torch.cuda.synchronize(device)
    samples = []
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize(device)
        samples.append(start.elapsed_time(end) / iters)
    return statistics.median(samples)


def measure_peaks(device: torch.device, dtype: torch.dtype) -> Peaks:
    """The matmul rate in ``dtype`` (TF32 follows torch's setting) and the copy bandwidth."""
    if device.type == "cuda":
        n, copy_elems = 8192, 2**28
    else:
        n, copy_elems = 1024, 2**24
    mm_dtype = dtype if device.type == "cuda" or dtype == torch.float32 else torch.float32
    a = torch.randn(n, n, device=device).to(mm_dtype)
    b = torch.randn(n, n, device=device).to(mm_dtype)
    mm_ms = median_ms(lambda i: torch.mm(a, b), device, iters=10, warmup=3)
    src = torch.empty(copy_elems, dtype=torch.uint8, device=device).random_(0, 255)
    dst = torch.empty_like(src)
    copy_ms = median_ms(lambda i: dst.copy_(src), device, iters=10, warmup=3)
    return Peaks(matmul_tflops=2 * n**3 / (mm_ms * 1e9), copy_gbps=2 * copy_elems / (copy_ms * 1e6))
