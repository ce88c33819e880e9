"""Where a fused model's training step spends its time, against the same model in eager PyTorch:
synchronizations, the host's time per phase, and the step with the host taken out (a CUDA graph).

    python scripts/training_step_probe.py [--model resnet50] [--batch 64] [--size 224] [--dtype bf16]

On a CUDA device it prints, for the fused model (fusionplan.torch.fuse in training mode) and eager:
1. how many synchronizing calls one fused step makes (torch's sync debug mode);
2. per step, the host's time in the forward, the backward and the optimizer, and how long the
   device then still ran ("wait": near zero means the host bounds the step);
3. the step captured whole in a CUDA graph and replayed: its device time alone.
SGD with momentum, autocast, channels-last, random data.
"""

from __future__ import annotations

import argparse
import copy
import time
import warnings

import torch
import torch.nn.functional as F

from fusionplan.tools.bench.timing import median_ms
from fusionplan.tools.bench.zoo import build_model
from fusionplan.torch import fuse

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


class Step:
    def __init__(self, module: torch.nn.Module, x: torch.Tensor, label: torch.Tensor, dtype: torch.dtype) -> None:
        self.module, self.x, self.label, self.dtype = module, x, label, dtype
        self.optimizer = torch.optim.SGD(module.parameters(), lr=0.01, momentum=0.9)

    def forward(self) -> torch.Tensor:
        with torch.autocast("cuda", dtype=self.dtype):
            return F.cross_entropy(self.module(self.x), self.label)

    def __call__(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        self.forward().backward()
        self.optimizer.step()

    def phases_ms(self) -> tuple[float, float, float, float]:
        """(forward, backward, optimizer) host time and the device's time after them."""
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        self.optimizer.zero_grad(set_to_none=True)
        loss = self.forward()
        t1 = time.perf_counter()
        loss.backward()
        del loss  # the autograd graph must not outlive the step (a later capture's streams)
        t2 = time.perf_counter()
        self.optimizer.step()
        t3 = time.perf_counter()
        torch.cuda.synchronize()
        t4 = time.perf_counter()
        return tuple(1e3 * d for d in (t1 - t0, t2 - t1, t3 - t2, t4 - t3))

    def graphed_ms(self) -> float:
        """The step captured in a CUDA graph (after warm-up steps on a side stream), per replay."""
        return median_ms(lambda i: self(), torch.device("cuda"), iters=1, warmup=0, graph=True, graph_warmup=3)


def synchronizations(step: Step) -> list[str]:
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode(1)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            step()
            torch.cuda.synchronize()
    finally:
        torch.cuda.set_sync_debug_mode(0)
    return sorted({f"{w.message} @ {w.filename}:{w.lineno}" for w in caught if "synchroniz" in str(w.message)})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="resnet50")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    opts = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("training_step_probe: needs a CUDA device")
    torch.manual_seed(0)
    device = torch.device("cuda")
    model = build_model(opts.model).to(device).to(memory_format=torch.channels_last).train()
    x = torch.randn(opts.batch, 3, opts.size, opts.size, device=device).to(memory_format=torch.channels_last)
    label = torch.randint(0, 1000, (opts.batch,), device=device)
    steps = {
        "fused": Step(fuse(copy.deepcopy(model)).train(), x, label, DTYPES[opts.dtype]),
        "eager": Step(model, x, label, DTYPES[opts.dtype]),
    }
    for step in steps.values():
        for _ in range(3):
            step()
    found = synchronizations(steps["fused"])
    print(f"synchronizing calls in a fused step: {len(found)}", *found, sep="\n  ")
    for name, step in steps.items():
        for _ in range(3):
            fwd, bwd, opt, wait = step.phases_ms()
            host = f"host forward {fwd:.2f} ms, backward {bwd:.2f}, optimizer {opt:.2f}"
            print(f"{name}: {host}; the device after them {wait:.2f} ms")
    for name, step in steps.items():
        try:
            print(f"{name}: graphed step {step.graphed_ms():.2f} ms")
        except Exception as exc:  # reported, the other variant still measured
            print(f"{name}: the step could not be captured: {type(exc).__name__}: {str(exc)[:300]}")


if __name__ == "__main__":
    main()
