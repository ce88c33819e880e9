"""``fusionplan-bench --suite models``: whole models fused end to end by ``fusionplan.torch.fuse``,
against the same model in eager PyTorch and under torch.compile, in one process.

The models are the zoo suite's (fusionplan.tools.bench.zoo: torchvision's, which needs torchvision,
and a UNet). Each is checked first: fuse's own comparison of the fused model's output with the
original's on the timed input. Times per forward: wall (a synchronized call, host included) and,
with --graph, GPU time (CUDA-graph replays).
"""

from __future__ import annotations

import json
import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from fusionplan.tools.bench.cases import PRECISIONS
from fusionplan.tools.bench.runner import tf32_mode
from fusionplan.tools.bench.timing import median_ms, synchronize
from fusionplan.tools.bench.zoo import MODELS, build_model

BASELINES = ("eager", "compile")


@dataclass
class ModelRow:
    model: str
    batch: int
    precision: str
    layout: str
    size: int
    wall_ms: dict[str, float] = field(default_factory=dict)
    gpu_ms: dict[str, float] = field(default_factory=dict)
    chains: int = 0
    skipped: int = 0
    errors: dict[str, str] = field(default_factory=dict)

    def speedup(self, baseline: str, times: str = "wall_ms") -> float | None:
        t = getattr(self, times)
        return t[baseline] / t["fused"] if "fused" in t and baseline in t else None


def wall_ms(fn: Callable[[], object], device: torch.device, iters: int, warmup: int) -> float:
    """Median time of one synchronized call: what a caller waits for, host time included."""
    for _ in range(warmup):
        fn()
    synchronize(device)
    samples = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        synchronize(device)
        samples.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(samples)


def _variants(model: torch.nn.Module, x: torch.Tensor, baselines: Sequence[str], row: ModelRow) -> dict:
    from fusionplan.torch import fuse

    fused = fuse(model, (x,))  # raises where the fused model's output differs from the model's
    row.chains, row.skipped = len(fused.fusion_report.fused), len(fused.fusion_report.skipped)
    variants = {"fused": fused}
    if "eager" in baselines:
        variants["eager"] = model
    if "compile" in baselines:
        variants["compile"] = torch.compile(model)
    return variants


def run_model(
    name: str, batch: int, precision: str, layout: str, device: torch.device, opts, baselines: Sequence[str]
) -> ModelRow:
    size = opts.size or MODELS[name][0]
    row = ModelRow(name, batch, precision, layout, size)
    dtype, tf32 = PRECISIONS[precision]
    fmt = torch.channels_last if layout == "NHWC" else torch.contiguous_format
    try:
        model = build_model(name).eval().to(device=device, dtype=dtype, memory_format=fmt)
        x = torch.randn(batch, 3, size, size, device=device, dtype=dtype).contiguous(memory_format=fmt)
        with torch.no_grad(), tf32_mode(tf32):
            variants = _variants(model, x, baselines, row)
            for label, module in variants.items():
                try:
                    row.wall_ms[label] = wall_ms(lambda m=module: m(x), device, opts.iters, opts.warmup)
                    if opts.graph and device.type == "cuda":
                        row.gpu_ms[label] = median_ms(lambda i, m=module: m(x), device, opts.iters, 2, graph=True)
                except Exception as exc:  # a variant that fails is reported, the suite goes on
                    row.errors[label] = f"{type(exc).__name__}: {exc}"[:300]
    except Exception as exc:
        row.errors["model"] = f"{type(exc).__name__}: {exc}"[:300]
    return row


def _geomean(values: list[float]) -> float | None:
    return math.exp(sum(map(math.log, values)) / len(values)) if values else None


def table(rows: Sequence[ModelRow], baselines: Sequence[str]) -> str:
    graph = any(r.gpu_ms for r in rows)
    head = ["model", "batch", "precision", "layout", "chains", "skipped", "fused wall ms"]
    head += [f"{b} wall ms" for b in baselines] + [f"x{b} wall" for b in baselines]
    if graph:
        head += ["fused GPU ms"] + [f"x{b} GPU" for b in baselines]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r.model, str(r.batch), r.precision, r.layout, str(r.chains), str(r.skipped)]
        cells += [_fmt(r.wall_ms.get("fused"))] + [_fmt(r.wall_ms.get(b)) for b in baselines]
        cells += [_fmt(r.speedup(b), ".2f") for b in baselines]
        if graph:
            cells += [_fmt(r.gpu_ms.get("fused"))] + [_fmt(r.speedup(b, "gpu_ms"), ".2f") for b in baselines]
        lines.append("| " + " | ".join(cells) + " |")
    for b in baselines:
        g = _geomean([s for r in rows if (s := r.speedup(b)) is not None])
        lines.append(f"\ngeomean wall-time speedup over {b}: {_fmt(g, '.2f')}")
    return "\n".join(lines)


def _fmt(v: float | None, spec: str = ".3f") -> str:
    return "-" if v is None else format(v, spec)


def run_model_suite(opts, device: torch.device, env: dict) -> int:
    """``fusionplan-bench --suite models``: each model of ``--models`` (default: every zoo model) at
    each batch, precision and layout; a table, and files in --out."""
    names, baselines = models_and_baselines(opts, MODELS, BASELINES, "models")
    batches = [int(b) for b in (opts.batch or ("32" if device.type == "cuda" else "1")).split(",")]
    precisions = (opts.precisions or ("fp16" if device.type == "cuda" else "fp32")).split(",")
    layouts = opts.layouts.split(",")
    runs = [(n, b, p, lay) for n in names for b in batches for p in precisions for lay in layouts]
    print(f"fusionplan-bench --suite models: {len(runs)} runs on {device}", flush=True)
    rows = []
    for i, run in enumerate(runs, 1):
        rows.append(run_model(*run, device, opts, baselines))
        r = rows[-1]
        print(
            f"  [{i}/{len(runs)}] {r.model} n{r.batch} {r.precision} {r.layout}: {r.wall_ms} {r.errors or ''}",
            flush=True,
        )
    text = table(rows, baselines)
    print(text)
    if opts.out:
        write_results(Path(opts.out), "models", "Models fused end to end", env, text, rows)
    return 1 if any("model" in r.errors for r in rows) else 0


def models_and_baselines(opts, default_models, known_baselines, suite: str) -> tuple[list[str], list[str]]:
    """A model suite's ``--models`` (zoo models; default ``default_models``) and ``--baselines``
    (of ``known_baselines``, default all; 'none' for fusionplan only), or ValueError naming the
    unknown ones."""
    names = [m for m in (opts.models or ",".join(default_models)).split(",") if m]
    unknown = set(names) - set(MODELS)
    if unknown:
        raise ValueError(f"unknown models {sorted(unknown)}; known: {', '.join(MODELS)}")
    baselines = [b for b in (opts.baselines or ",".join(known_baselines)).split(",") if b and b != "none"]
    if set(baselines) - set(known_baselines):
        raise ValueError(f"unknown baselines for the {suite} suite: {sorted(set(baselines) - set(known_baselines))}")
    return names, baselines


def write_results(out: Path, stem: str, title: str, env: dict, text: str, rows: Sequence) -> None:
    """A suite's table as ``stem``.md (with its environment) and its rows as ``stem``.json in ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.md").write_text(f"# {title}\n\n{json.dumps(env)}\n\n{text}\n")
    (out / f"{stem}.json").write_text(json.dumps({"env": env, "rows": [asdict(r) for r in rows]}, indent=1))
    print(f"wrote {out / (stem + '.md')} and {stem}.json")
