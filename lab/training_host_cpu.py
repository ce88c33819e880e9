"""Host time of fused training chains on the CPU, the kernels' work taken out: what fusionplan's
own Python costs a chain, forward and backward, over eager PyTorch's.

    python lab/training_host_cpu.py                 # the training kernel's run a no-op
    python lab/training_host_cpu.py --template      # and its repeat a no-op (as a GPU launch template)
    python lab/training_host_cpu.py --kernels       # the CPU training kernel's real work

A stack of conv (1x1, 8 channels) -> batch-norm -> ReLU chains on 2x8x4x4 channels-last tensors,
the fused model (fusionplan.torch.fuse in training mode) against the same model in eager, SGD
free (forward and backward alone). Prints the medians of alternated rounds, fused minus eager a
chain, and the Python calls a chain and step (cProfile, the backward on the calling thread).
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import time

import torch
from torch import nn

import fusionplan.torch as fpt
from fusionplan.solvers.cpu_training import CpuTrainingKernel


class Chains(nn.Module):
    def __init__(self, count: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(
            nn.Sequential(nn.Conv2d(8, 8, 1, bias=False), nn.BatchNorm2d(8), nn.ReLU()) for _ in range(count)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x.mean()


def step(model: nn.Module, x: torch.Tensor) -> None:
    model(x).backward()


def seconds_a_step(model: nn.Module, x: torch.Tensor, steps: int) -> float:
    start = time.perf_counter()
    for _ in range(steps):
        step(model, x)
    return (time.perf_counter() - start) / steps


def calls_a_step(model: nn.Module, x: torch.Tensor, steps: int = 10) -> float:
    profiler = cProfile.Profile()
    with torch.autograd.set_multithreading_enabled(False):
        profiler.enable()
        for _ in range(steps):
            step(model, x)
        profiler.disable()
    return pstats.Stats(profiler).total_calls / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chains", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--kernels", action="store_true", help="keep the CPU training kernel's work")
    parser.add_argument("--template", action="store_true", help="the kernel's repeat a no-op too")
    opts = parser.parse_args()
    if not opts.kernels:
        CpuTrainingKernel.run = lambda self, x, y, records, prior: None
        if opts.template:
            CpuTrainingKernel.repeat_with_tensors = lambda self, x, y, records: lambda tensors: True
    torch.manual_seed(0)
    x = torch.randn(2, 8, 4, 4).to(memory_format=torch.channels_last)
    eager = Chains(opts.chains).train()
    fused = fpt.fuse(Chains(opts.chains).train())
    for _ in range(3):
        step(eager, x), step(fused, x)
    times: dict[str, list[float]] = {"eager": [], "fused": []}
    for _ in range(opts.rounds):  # alternated, so that the machine's drift falls on both
        times["eager"].append(seconds_a_step(eager, x, opts.steps))
        times["fused"].append(seconds_a_step(fused, x, opts.steps))
    eager_s, fused_s = (statistics.median(times[k]) for k in ("eager", "fused"))
    print(f"eager {eager_s * 1e6:.0f} us a step, fused {fused_s * 1e6:.0f} us")
    print(f"fused minus eager: {(fused_s - eager_s) / opts.chains * 1e6:.1f} us a chain, forward and backward")
    for name, model in (("eager", eager), ("fused", fused)):
        print(f"{name}: {calls_a_step(model, x) / opts.chains:.0f} Python calls a chain and step")


if __name__ == "__main__":
    main()
