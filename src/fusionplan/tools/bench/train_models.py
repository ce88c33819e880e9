"""``fusionplan-bench --suite train-models``: whole models trained by ``fusionplan.torch.fuse``,
against the same model trained in eager PyTorch and under torch.compile, in one process.

Each variant starts from the same weights, with its own SGD optimizer (momentum 0.9); a step is
zero_grad, the forward under autocast (fp16, bf16; fp32 without), the cross-entropy loss, the
backward and the optimizer's step, on random data in the model's layout. Per variant: the wall
time of a synchronized step (median) and the memory a step allocates beyond the model and its
optimizer (its peak, on CUDA). ``--steps N`` also trains eager and fused N steps on a fixed
synthetic data set and reports the largest relative difference of their losses at every 20th
step (and the last).
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from fusionplan.tools.bench.models import _fmt, _geomean, models_and_baselines, wall_ms, write_results
from fusionplan.tools.bench.timing import median_ms, synchronize
from fusionplan.tools.bench.zoo import MODELS, build_model

BASELINES = ("eager", "compile")
#: The models of the issue's acceptance; any zoo model may be named.
DEFAULT_MODELS = ("resnet50", "resnext50_32x4d", "regnet_y_1_6gf")
AUTOCAST = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": None}


@dataclass
class TrainRow:
    model: str
    batch: int
    precision: str
    layout: str
    size: int
    step_ms: dict[str, float] = field(default_factory=dict)
    step_mb: dict[str, float] = field(default_factory=dict)
    graph_ms: dict[str, float] = field(default_factory=dict)  # --graph: the step captured whole, replayed
    graph_errors: dict[str, str] = field(default_factory=dict)  # --graph: why a variant's step was not captured
    loss_gap: float | None = None  # the largest relative loss difference, fused against eager
    chains: int = 0
    eager_chains: list[str] = field(default_factory=list)  # training-mode fallbacks, with reasons
    errors: dict[str, str] = field(default_factory=dict)

    def speedup(self, baseline: str) -> float | None:
        t = self.step_ms
        return t[baseline] / t["fused"] if "fused" in t and baseline in t else None


class Trainer:
    """One variant's model, optimizer and step."""

    def __init__(self, module: torch.nn.Module, precision: str, device: torch.device) -> None:
        self.module = module
        self.optimizer = torch.optim.SGD(module.parameters(), lr=0.01, momentum=0.9)
        self.autocast = AUTOCAST[precision]
        self.device = device

    def loss(self, x: torch.Tensor, label: torch.Tensor) -> torch.Tensor:
        """The forward under autocast and its cross-entropy loss (the step's first part)."""
        with torch.autocast(self.device.type, dtype=self.autocast or torch.bfloat16, enabled=self.autocast is not None):
            logits = _logits(self.module(x))
            return F.cross_entropy(logits, label % logits.shape[1])

    def step(self, x: torch.Tensor, label: torch.Tensor) -> float:
        self.optimizer.zero_grad(set_to_none=True)
        loss = self.loss(x, label)
        loss.backward()
        self.optimizer.step()
        return loss.detach()


def _logits(out) -> torch.Tensor:
    """A classifier's logits, or a dense model's output pooled to one vector an image."""
    out = out["out"] if isinstance(out, dict) else out
    return out if out.dim() == 2 else out.flatten(2).mean(2)


def _variants(model: torch.nn.Module, baselines: Sequence[str], row: TrainRow, precision: str, device) -> dict:
    from fusionplan.torch import fuse

    fused = fuse(copy.deepcopy(model))
    row.chains = len(fused.fusion_report.fused)
    variants = {"fused": Trainer(fused, precision, device)}
    if "eager" in baselines:
        variants["eager"] = Trainer(copy.deepcopy(model), precision, device)
    if "compile" in baselines:
        variants["compile"] = Trainer(torch.compile(copy.deepcopy(model)), precision, device)
    return variants


def graphed_step_ms(trainer: Trainer, x: torch.Tensor, label: torch.Tensor) -> float:
    """The trainer's whole step (forward, backward, optimizer) captured in a CUDA graph after
    warm-up steps on a side stream, then replayed: its device time with no host in it."""
    return median_ms(lambda i: trainer.step(x, label), x.device, iters=1, warmup=0, graph=True, graph_warmup=3)


def _time_graphed_step(row: TrainRow, name: str, trainer: Trainer, x: torch.Tensor, label: torch.Tensor) -> None:
    """graphed_step_ms of the variant, or why its step could not be captured."""
    if x.device.type != "cuda":
        row.graph_errors[name] = "CUDA graphs need a CUDA device"
        return
    try:
        row.graph_ms[name] = graphed_step_ms(trainer, x, label)
    except Exception as exc:  # reported beside the step's time
        row.graph_errors[name] = f"{type(exc).__name__}: {exc}"[:300]


def _step_megabytes(trainer: Trainer, x: torch.Tensor, label: torch.Tensor) -> float:
    if x.device.type != "cuda":
        return float("nan")
    synchronize(x.device)
    torch.cuda.reset_peak_memory_stats(x.device)
    before = torch.cuda.memory_allocated(x.device)
    trainer.step(x, label)
    synchronize(x.device)
    return (torch.cuda.max_memory_allocated(x.device) - before) / 2**20


def _loss_gap(model: torch.nn.Module, precision: str, device, steps: int, batch: int, size: int, fmt) -> float:
    """Eager and fused trained ``steps`` steps from the same weights on the same 8 batches: the
    largest relative difference of their losses at every 20th step and the last."""
    from fusionplan.torch import fuse

    generator = torch.Generator(device="cpu").manual_seed(0)
    classes = 10
    data = [
        (
            torch.randn(batch, 3, size, size, generator=generator).to(device).contiguous(memory_format=fmt),
            torch.randint(0, classes, (batch,), generator=generator).to(device),
        )
        for _ in range(8)
    ]
    eager = Trainer(copy.deepcopy(model), precision, device)
    fused = Trainer(fuse(copy.deepcopy(model)), precision, device)
    gap = 0.0
    for i in range(steps):
        x, label = data[i % len(data)]
        losses = float(eager.step(x, label)), float(fused.step(x, label))
        if (i + 1) % 20 == 0 or i == steps - 1:
            gap = max(gap, abs(losses[1] - losses[0]) / max(abs(losses[0]), 1e-12))
    return gap


def run_train_model(name: str, batch: int, precision: str, layout: str, device, opts, baselines) -> TrainRow:
    size = opts.size or MODELS[name][0]
    row = TrainRow(name, batch, precision, layout, size)
    fmt = torch.channels_last if layout == "NHWC" else torch.contiguous_format
    try:
        model = build_model(name).train().to(device=device, memory_format=fmt)
        x = torch.randn(batch, 3, size, size, device=device).contiguous(memory_format=fmt)
        label = torch.randint(0, 10, (batch,), device=device)
        for label_name, trainer in _variants(model, baselines, row, precision, device).items():
            try:
                row.step_ms[label_name] = wall_ms(lambda t=trainer: t.step(x, label), device, opts.iters, opts.warmup)
                row.step_mb[label_name] = _step_megabytes(trainer, x, label)
                if label_name == "fused":
                    row.eager_chains = _eager_chains(trainer.module)
            except Exception as exc:  # a variant that fails is reported, the suite goes on
                row.errors[label_name] = f"{type(exc).__name__}: {exc}"[:300]
            if getattr(opts, "graph", False) and label_name not in row.errors:
                _time_graphed_step(row, label_name, trainer, x, label)
            if getattr(opts, "profile", None):
                _profile(
                    trainer, x, label, Path(opts.profile) / f"{name}-n{batch}-{precision}-{layout}-{label_name}.txt"
                )
        if opts.steps:
            row.loss_gap = _loss_gap(model, precision, device, opts.steps, batch, size, fmt)
    except Exception as exc:
        row.errors["model"] = f"{type(exc).__name__}: {exc}"[:300]
    return row


def _profile(trainer: Trainer, x: torch.Tensor, label: torch.Tensor, path: Path, steps: int = 3) -> None:
    """``steps`` steps of ``trainer`` under torch.profiler: the first line says how long a step took
    and how much of it the device spent in kernels (a host-bound step computes for a small part of
    its time), then the operators by their device time (and, on a GPU, by their host time)."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if x.device.type == "cuda" else [])
    synchronize(x.device)
    with profile(activities=activities) as prof:
        start = time.perf_counter()
        for _ in range(steps):
            trainer.step(x, label)
        synchronize(x.device)
        wall_us = (time.perf_counter() - start) * 1e6 / steps
    events = prof.key_averages()
    device_us = sum(e.self_device_time_total for e in events) / steps
    sort = "self_device_time_total" if x.device.type == "cuda" else "self_cpu_time_total"
    path.parent.mkdir(parents=True, exist_ok=True)
    head = f"step {wall_us / 1e3:.2f} ms wall, {device_us / 1e3:.2f} ms in device kernels ({device_us / wall_us:.0%})\n"
    text = head + events.table(sort_by=sort, row_limit=40) + "\n"
    if sort != "self_cpu_time_total":  # where the host's time goes, for a step the host bounds
        text += "\nby host time:\n" + events.table(sort_by="self_cpu_time_total", row_limit=40) + "\n"
    path.write_text(text + "\nPython functions by own time (cProfile):\n" + _python_profile(trainer, x, label, steps))


def _python_profile(trainer: Trainer, x: torch.Tensor, label: torch.Tensor, steps: int) -> str:
    """The Python functions ``steps`` steps spend their host time in (cProfile, by own time): the
    torch profiler sees operators, not the Python that issues them."""
    import cProfile
    import io
    import pstats

    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(steps):
        trainer.step(x, label)
    synchronize(x.device)
    profiler.disable()
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(30)
    return out.getvalue()


def _eager_chains(fused) -> list[str]:
    return sorted({s for solvers in fused.fusion_report.solvers().values() for s in solvers if "eagerly" in s})


def table(rows: Sequence[TrainRow], baselines: Sequence[str]) -> str:
    head = ["model", "batch", "precision", "layout", "chains", "fused step ms"]
    head += [f"{b} step ms" for b in baselines] + [f"x{b}" for b in baselines]
    head += ["fused step MB"] + [f"{b} step MB" for b in baselines] + ["loss gap"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r.model, str(r.batch), r.precision, r.layout, str(r.chains), _fmt(r.step_ms.get("fused"))]
        cells += [_fmt(r.step_ms.get(b)) for b in baselines] + [_fmt(r.speedup(b), ".2f") for b in baselines]
        cells += [_fmt(r.step_mb.get(v), ".0f") for v in ("fused", *baselines)]
        cells.append(_fmt(r.loss_gap, ".2e"))
        lines.append("| " + " | ".join(cells) + " |")
    for b in baselines:
        g = _geomean([s for r in rows if (s := r.speedup(b)) is not None and math.isfinite(s)])
        lines.append(f"\ngeomean training-step speedup over {b}: {_fmt(g, '.2f')}")
    graphed = [r for r in rows if r.graph_ms or r.graph_errors]
    if graphed:
        lines += ["", "the step captured in a CUDA graph (ms a replay):", ""]
        lines += ["| model | batch | precision | layout | " + " | ".join(("fused", *baselines)) + " |"]
        lines += ["|" + "---|" * (5 + len(baselines))]
        for r in graphed:
            cells = [r.model, str(r.batch), r.precision, r.layout]
            cells += [_fmt(r.graph_ms.get(v)) if v in r.graph_ms else "-" for v in ("fused", *baselines)]
            lines.append("| " + " | ".join(cells) + " |")
        failed = sorted({f"{r.model} {v}: {why}" for r in graphed for v, why in r.graph_errors.items()})
        lines += [f"- not captured: {why}" for why in failed]
    fallbacks = sorted({reason for r in rows for reason in r.eager_chains})
    if fallbacks:
        lines += ["", "chains trained eagerly:", *[f"- {reason}" for reason in fallbacks]]
    return "\n".join(lines)


def run_train_model_suite(opts, device: torch.device, env: dict) -> int:
    """Each model of ``--models`` (default: ResNet-50, ResNeXt-50 32x4d, RegNetY-1.6GF) at each
    batch, precision and layout; a table, and files in --out."""
    names, baselines = models_and_baselines(opts, DEFAULT_MODELS, BASELINES, "train-models")
    precisions = (opts.precisions or ("bf16,fp16" if device.type == "cuda" else "fp32")).split(",")
    if set(precisions) - set(AUTOCAST):
        raise ValueError(f"unknown precisions {sorted(set(precisions) - set(AUTOCAST))}; known: {', '.join(AUTOCAST)}")
    batches = [int(b) for b in (opts.batch or ("64,128" if device.type == "cuda" else "2")).split(",")]
    runs = [(n, b, p, lay) for n in names for b in batches for p in precisions for lay in opts.layouts.split(",")]
    print(f"fusionplan-bench --suite train-models: {len(runs)} runs on {device}", flush=True)
    rows = []
    for i, run in enumerate(runs, 1):
        rows.append(run_train_model(*run, device, opts, baselines))
        r = rows[-1]
        print(f"  [{i}/{len(runs)}] {r.model} n{r.batch} {r.precision} {r.layout}: {r.step_ms} {r.errors or ''}")
    text = table(rows, baselines)
    print(text)
    if opts.out:
        write_results(Path(opts.out), "train-models", "Models trained fused", env, text, rows)
    return 1 if any(r.errors for r in rows) else 0
