"""Where a fused model's training step spends its time, against the same model in eager PyTorch:
synchronizations, the host's time per phase, and the step with the host taken out (a CUDA graph).

    python scripts/training_step_probe.py [--model resnet50] [--batch 64] [--size 224] [--dtype bf16]

On a CUDA device it prints, for the fused model (fusionplan.torch.fuse in training mode) and eager:
1. how many synchronizing calls one fused step makes (torch's sync debug mode);
2. per step, the host's time in the forward, the backward and the optimizer, and how long the
   device then still ran ("wait": near zero means the host bounds the step);
3. the step captured whole in a CUDA graph and replayed: its device time alone;
4. with ``--profile N``: the host functions of N fused steps that take the most time (cProfile),
   the backward run on the calling thread so that its Python is seen too (autograd runs a CUDA
   backward on a thread of its own otherwise).
SGD with momentum, autocast, channels-last, random data. Each variant's host phases are also
measured with the backward on the calling thread (what a handoff to autograd's thread costs).
"""

from __future__ import annotations

import argparse
import copy
import cProfile
import io
import pstats
import time
import warnings

import torch

from fusionplan.tools.bench.timing import synchronize
from fusionplan.tools.bench.train_models import Trainer, graphed_step_ms
from fusionplan.tools.bench.zoo import build_model
from fusionplan.torch import fuse


def phases_ms(trainer: Trainer, x: torch.Tensor, label: torch.Tensor) -> tuple[float, float, float, float]:
    """A step's host time in the forward, the backward and the optimizer, and the device's time
    after them."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    trainer.optimizer.zero_grad(set_to_none=True)
    loss = trainer.loss(x, label)
    t1 = time.perf_counter()
    loss.backward()
    del loss  # the autograd graph must not outlive the step (a later capture's streams)
    t2 = time.perf_counter()
    trainer.optimizer.step()
    t3 = time.perf_counter()
    torch.cuda.synchronize()
    t4 = time.perf_counter()
    return tuple(1e3 * d for d in (t1 - t0, t2 - t1, t3 - t2, t4 - t3))


def synchronizations(trainer: Trainer, x: torch.Tensor, label: torch.Tensor) -> list[str]:
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode(1)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            trainer.step(x, label)
            torch.cuda.synchronize()
    finally:
        torch.cuda.set_sync_debug_mode(0)
    return sorted({f"{w.message} @ {w.filename}:{w.lineno}" for w in caught if "synchroniz" in str(w.message)})


def profile(trainer: Trainer, x: torch.Tensor, label: torch.Tensor, steps: int, top: int = 25) -> str:
    """cProfile of ``steps`` steps, the backward on the calling thread: Python calls a step, then
    the ``top`` functions by their own time."""
    profiler = cProfile.Profile()
    with torch.autograd.set_multithreading_enabled(False):
        synchronize(x.device)
        profiler.enable()
        for _ in range(steps):
            trainer.step(x, label)
        synchronize(x.device)
        profiler.disable()
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out)
    out.write(f"Python calls a step: {stats.total_calls / steps:.0f}\n")
    stats.sort_stats("tottime").print_stats(top)
    return out.getvalue()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="resnet50")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--dtype", choices=("bf16", "fp16"), default="bf16")
    parser.add_argument("--profile", type=int, default=0, metavar="N", help="cProfile N fused steps")
    opts = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("training_step_probe: needs a CUDA device")
    torch.manual_seed(0)
    device = torch.device("cuda")
    model = build_model(opts.model).to(device).to(memory_format=torch.channels_last).train()
    x = torch.randn(opts.batch, 3, opts.size, opts.size, device=device).to(memory_format=torch.channels_last)
    label = torch.randint(0, 1000, (opts.batch,), device=device)
    trainers = {
        "fused": Trainer(fuse(copy.deepcopy(model)).train(), opts.dtype, device),
        "eager": Trainer(model, opts.dtype, device),
    }
    for trainer in trainers.values():
        for _ in range(3):
            trainer.step(x, label)
    found = synchronizations(trainers["fused"], x, label)
    print(f"synchronizing calls in a fused step: {len(found)}", *found, sep="\n  ")
    for name, trainer in trainers.items():
        for threads in (True, False):
            where = "" if threads else " (the backward on the calling thread)"
            with torch.autograd.set_multithreading_enabled(threads):
                for _ in range(3):
                    fwd, bwd, opt, wait = phases_ms(trainer, x, label)
                    host = f"host forward {fwd:.2f} ms, backward {bwd:.2f}, optimizer {opt:.2f}"
                    print(f"{name}{where}: {host}; the device after them {wait:.2f} ms")
    if opts.profile:
        print(profile(trainers["fused"], x, label, opts.profile))
    for name, trainer in trainers.items():
        try:
            print(f"{name}: graphed step {graphed_step_ms(trainer, x, label):.2f} ms")
        except Exception as exc:  # reported, the other variant still measured
            print(f"{name}: the step could not be captured: {type(exc).__name__}: {str(exc)[:300]}")


if __name__ == "__main__":
    main()
