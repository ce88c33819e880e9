"""Host time of a ResNet-50 forward: eager, fused and torch.compile, and where the fused model's goes.

    python scripts/host_profile.py [--batch 32] [--profile 20] [--device cuda]

A forward's host time is the wall time of the call without a synchronization, with the GPU's queue
kept from filling (a synchronize between forwards): what the CPU spends issuing the work. When it
exceeds the forward's GPU time, the model is host-bound. ``--profile N`` adds a cProfile of N fused
forwards, sorted by own time; the last table times the pieces of one fused chain's repeat path.
"""

from __future__ import annotations

import argparse
import cProfile
import functools
import pstats
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))

from resnet50 import randomize_batchnorm, resnet50  # noqa: E402

import fusionplan.torch as fpt  # noqa: E402


def host_us(fn, x: torch.Tensor, iters: int) -> float:
    """Median microseconds of the call itself, the queue emptied before each."""
    for _ in range(3):
        fn(x)
    samples = []
    for _ in range(iters):
        if x.is_cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn(x)
        samples.append((time.perf_counter() - t0) * 1e6)
    if x.is_cuda:
        torch.cuda.synchronize()
    return statistics.median(samples)


def per_call_us(fn, iters: int = 200) -> float:
    """Mean microseconds per call; few enough calls that launches do not fill the GPU's queue."""
    fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - t0) / iters * 1e6


def in_model(fused, x: torch.Tensor, iters: int) -> None:
    """The fused chains' own share of a forward's host time: each chain call timed inside the
    model, and the forward with every chain replaced by returning its last output."""
    from fusionplan.torch import FusedChain

    forward = FusedChain.forward
    spent, outputs = [0.0, 0], {}

    def timed(self, *args, **kwargs):
        t0 = time.perf_counter()
        out = forward(self, *args, **kwargs)
        spent[0] += time.perf_counter() - t0
        spent[1] += 1
        outputs[id(self)] = out
        return out

    FusedChain.forward = timed
    try:
        total = host_us(fused, x, iters)
        calls_per_forward = spent[1] / (iters + 3)
        chains_us = spent[0] / (iters + 3) * 1e6
        FusedChain.forward = lambda self, *args, **kwargs: outputs[id(self)]
        stubbed = host_us(fused, x, iters)
    finally:
        FusedChain.forward = forward
    print(
        f"  fused forward {total:.1f} us: {calls_per_forward:.0f} chain calls, {chains_us:.1f} us in them "
        f"({chains_us / calls_per_forward:.2f} us each, timer included); chains stubbed: {stubbed:.1f} us"
    )


def chain_pieces(fused, x: torch.Tensor) -> None:
    """Times the pieces of the first fused chain's repeat path on an input like its own."""
    from fusionplan.runtime import launch
    from fusionplan.torch import FusedChain, _layout

    chain = next(m for m in fused.modules() if isinstance(m, FusedChain))
    seen = {}
    hook = chain.register_forward_pre_hook(lambda m, args: seen.setdefault("x", args[0]))
    fused(x)
    hook.remove()
    cx = seen["x"]
    shape, strides, run = chain._repeat[4]
    direct = chain._repeat[5]
    out = torch.empty_strided(shape, strides, dtype=cx.dtype, device=cx.device)
    repeat = run.direct_launch()
    rows = [
        ("chain(x), whole call", lambda: chain(cx)),
        (
            "torch.empty_strided of the output",
            lambda: torch.empty_strided(shape, strides, dtype=cx.dtype, device=cx.device),
        ),
        (
            "torch.empty of the output, channels_last",
            lambda: torch.empty(shape, dtype=cx.dtype, device=cx.device, memory_format=torch.channels_last),
        ),
        ("_layout(x)", lambda: _layout(cx)),
        ("chain._scalars()", chain._scalars),
        ("the plan's repeater (checks + launch)", lambda: run(cx, out, None)),
        ("x.data_ptr()", cx.data_ptr),
        ("torch.compiler.is_compiling()", torch.compiler.is_compiling),
    ]
    bound = getattr(repeat, "bound", None) if repeat is not None else None
    if direct is not None:
        rows.append(("the direct path (output, checks, launch)", lambda: direct(cx, None)))
    if cx.is_cuda:
        rows.append(("current_raw_stream()", launch.current_raw_stream))
    if bound is not None:
        ptrs = (cx.data_ptr(), out.data_ptr(), out.data_ptr())
        rows.append(("BoundLaunch.launch (Triton's launcher)", lambda: bound.launch(ptrs)))
    for name, fn in rows:
        print(f"  {per_call_us(fn):8.2f} us  {name}")


def launch_pieces(bound, x: torch.Tensor, y: torch.Tensor, iters: int = 200) -> list[tuple[float, str]]:
    """Microseconds per call of a bound launch's pieces over x -> y: the whole launch, the
    descriptor encoder's flat arguments (descriptor kernels) and the C launcher alone with them laid
    out (where the launch calls it): where a kernel's host time per execute goes."""
    ptrs = (x.data_ptr(), y.data_ptr(), y.data_ptr())
    rows = [("BoundLaunch.launch", lambda: bound.launch(ptrs))]
    encoder = bound.encoder
    if encoder is not None:
        rows.append(("DescriptorEncoder.flat_arguments", lambda: encoder.flat_arguments(ptrs)))
    if bound.raw is not None:
        flat = encoder.flat_arguments(ptrs) if encoder is not None else bound._swapped(ptrs)[0]
        rows.append((f"the C launcher alone ({len(flat)} arguments)", lambda: bound._launch_raw(flat)))
    return [(per_call_us(fn, iters), name) for name, fn in rows]


def launcher_in_words(bound) -> str:
    """The launcher a bound launch calls and, where descriptor arguments keep it on Triton's, why."""
    from fusionplan.runtime.launch import DescriptorEncoder, is_host_descriptor

    words = bound.path()
    descriptors = [i for i, a in enumerate(bound.args) if is_host_descriptor(a)]
    if bound.raw is None and descriptors:
        words += f" ({DescriptorEncoder.refusal(bound.kernel, descriptors)})"
    return words


def plan_calls(layer_names: str, batch: int, device: torch.device) -> None:
    """Host time of ``plan.execute`` repeated on one benchmark case (fp16 NHWC CBA) per layer, and
    how many of the calls took a bound launch (``Repeat.try_launch`` succeeding)."""
    import fusionplan as fp
    from fusionplan.runtime.launch import Repeat
    from fusionplan.tools.bench.cases import Case, prepare
    from fusionplan.tools.shapes import load_shapes

    shapes = {s.name: s for s in load_shapes(None)}
    outcomes, bound = [], []
    original = Repeat.try_launch

    def counted(self, *args):
        ok = original(self, *args)
        outcomes.append(ok)
        bound[:] = [self.bound]
        return ok

    Repeat.try_launch = counted
    try:
        for name in layer_names.split(","):
            prep = prepare(Case(shapes[name], batch, "fp16", "NHWC", "CBA"), device, 0)
            handle = fp.Handle(device)
            prep.plan.compile(handle)
            outcomes.clear()
            call = functools.partial(prep.plan.execute, handle, prep.xs[0], prep.ys[0], prep.args)
            per_call = per_call_us(call, 100)
            print(
                f"  {name} b{batch} {prep.plan.compiled_solver(handle)}: {per_call:.2f} us per execute (host), "
                f"{sum(outcomes)} of {len(outcomes)} repeats launched directly"
            )
            if bound:
                print(f"    through {launcher_in_words(bound[0])}")
                for us, piece in launch_pieces(bound[0], prep.xs[0], prep.ys[0]):
                    print(f"    {us:8.2f} us  {piece}")
    finally:
        Repeat.try_launch = original


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--iters", type=int, default=30)
    p.add_argument("--profile", type=int, default=0, help="cProfile this many fused forwards")
    p.add_argument("--no-compile", action="store_true")
    p.add_argument("--layers", default=None, help="only time plan.execute of these benchmark layers (comma-separated)")
    opts = p.parse_args(argv)
    device = torch.device(opts.device)
    if opts.layers:
        plan_calls(opts.layers, opts.batch, device)
        return 0
    dtype = torch.float16 if device.type == "cuda" else torch.float32
    torch.manual_seed(0)
    model = resnet50().eval()
    randomize_batchnorm(model)
    model = model.to(device=device, dtype=dtype, memory_format=torch.channels_last)
    fused = fpt.fuse(model)
    x = torch.randn(opts.batch, 3, 224, 224, device=device).to(dtype).to(memory_format=torch.channels_last)
    with torch.inference_mode():
        variants = [("eager", model), ("fused", fused)]
        if not opts.no_compile:
            variants.append(("torch.compile", torch.compile(model)))
        for name, module in variants:
            print(f"{name:>14}: host {host_us(module, x, opts.iters):9.1f} us per forward")
        in_model(fused, x, opts.iters)
        if opts.profile:
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(opts.profile):
                fused(x)
            prof.disable()
            pstats.Stats(prof).sort_stats("tottime").print_stats(25)
        print("one fused chain's repeat path, per call:")
        chain_pieces(fused, x)
    return 0


if __name__ == "__main__":
    sys.exit(main())
