"""Benchmark output: a terminal table, CSV, JSON with the environment, PNG plots, a Markdown summary."""

from __future__ import annotations

import csv
import datetime
import json
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import torch

import fusionplan
from fusionplan.tools.bench.runner import Row, geomeans, layout_ratios

SHOWN = ("find", "unfused", "eager", "cudnn", "compile", "compile-max")


def environment(device: torch.device) -> dict:
    env = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(["fusionplan-bench", *sys.argv[1:]]),
        "fusionplan": fusionplan.__version__,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "cpu": platform.processor() or platform.machine(),
        "device": str(device),
    }
    try:
        import triton

        env["triton"] = triton.__version__
    except Exception:  # Triton absent: the CPU solvers still run
        env["triton"] = None
    if device.type == "cuda":
        env["gpu"] = torch.cuda.get_device_name(device)
        env["cudnn"] = torch.backends.cudnn.version()
        env["cuda"] = torch.version.cuda
        env["driver"] = _driver_version()
    return env


def _driver_version() -> str | None:
    if shutil.which("nvidia-smi") is None:
        return None
    done = subprocess.run(
        ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    return done.stdout.strip().splitlines()[0] if done.returncode == 0 and done.stdout.strip() else None


def _geomean_text(stats: dict[str, float]) -> str:
    parts = [f"vs {k} {v:.2f}x" for k, v in stats.items() if k != "time_over_floor"]
    if "time_over_floor" in stats:
        parts.append(f"time/floor {stats['time_over_floor']:.2f}")
    return ", ".join(parts)


def _layout_ratio_lines(rows: list[Row]) -> list[str]:
    """'NCHW time over NHWC time, fp16 CBNA: 1.368x (geometric mean of 23 layers)' per group timed in both."""
    return [
        f"NCHW time over NHWC time, {key}: {r['nchw_over_nhwc']:.3f}x (geometric mean of {r['layers']} layers)"
        for key, r in layout_ratios(rows).items()
    ]


def _fmt(v: float | None, spec: str = ".3f") -> str:
    return "-" if v is None else format(v, spec)


def table_rows(rows: list[Row]) -> tuple[list[str], list[list[str]]]:
    names = [n for n in SHOWN if any(n in r.times for r in rows)]
    header = ["case", "solver", "fused ms", "TFLOP/s", "GB/s", "×floor"]
    header += [f"{n} ms" for n in names] + [f"vs {n}" for n in names]
    body = []
    for r in rows:
        d = r.as_dict()
        cells = [
            r.case.name,
            r.solver,
            _fmt(r.fused_ms, ".4f"),
            _fmt(d["tflops"], ".3g"),
            _fmt(d["gbps"], ".3g"),
            _fmt(d["time_over_floor"], ".2f"),
        ]
        cells += [_fmt(r.times.get(n), ".4f") for n in names]
        cells += [_fmt(r.speedup(n), ".2f") + ("" if (r.speedup(n) or 1) >= 1 else " ⚠") for n in names]
        if r.errors:
            cells[1] += " (" + "; ".join(f"{k} failed" for k in r.errors) + ")"
        body.append(cells)
    return header, body


def print_table(rows: list[Row], peaks: dict) -> None:
    header, body = table_rows(rows)
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:  # plain text without rich
        print(" | ".join(header))
        for cells in body:
            print(" | ".join(cells))
    else:
        table = Table(title="fusionplan vs baselines (median ms; 'vs X' = X time / fused time, ⚠ = X is faster)")
        for h in header:
            table.add_column(h, justify="right" if h != "case" else "left")
        for cells in body:
            table.add_row(*cells)
        Console(width=250).print(table)
    for key, stats in geomeans(rows).items():
        print(f"geometric means, {key}: {_geomean_text(stats)}")
    for line in _layout_ratio_lines(rows):
        print(line)
    for precision, p in peaks.items():
        print(f"peaks ({precision}): matmul {p['matmul_tflops']:.3g} TFLOP/s, copy {p['copy_gbps']:.3g} GB/s")
    for r in rows:
        for name, why in r.errors.items():
            print(f"  {r.case.name}: {name}: {why}")


def write_outputs(rows: list[Row], peaks: dict, env: dict, out_dir: Path, plots: bool = True) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    dicts = [r.as_dict() for r in rows]
    written = [out_dir / "results.csv", out_dir / "results.json", out_dir / "summary.md"]
    keys = (
        sorted(
            {k for d in dicts for k in d},
            key=lambda k: (k not in dicts[0], list(dicts[0]).index(k) if k in dicts[0] else 0),
        )
        if dicts
        else []
    )
    with open(written[0], "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=keys)
        writer.writeheader()
        writer.writerows(dicts)
    summary = geomeans(rows)
    written[1].write_text(
        json.dumps(
            {
                "environment": env,
                "peaks": peaks,
                "geomeans": summary,
                "layout_ratios": layout_ratios(rows),
                "rows": dicts,
            },
            indent=1,
        )
    )
    written[2].write_text(markdown_summary(rows, peaks, env, summary))
    if plots:
        written += make_plots(rows, peaks, out_dir)
    return written


def markdown_summary(rows: list[Row], peaks: dict, env: dict, summary: dict) -> str:
    header, body = table_rows(rows)
    lines = ["# fusionplan benchmark", ""]
    lines += [f"- {k}: {v}" for k, v in env.items()]
    lines += [
        f"- peaks ({p}): matmul {v['matmul_tflops']:.3g} TFLOP/s, copy {v['copy_gbps']:.3g} GB/s"
        for p, v in peaks.items()
    ]
    lines += ["", "## Geometric means of fused's speed-up (baseline time / fused time)", ""]
    lines += [f"- {k}: {_geomean_text(s)}" for k, s in summary.items()]
    ratios = _layout_ratio_lines(rows)
    if ratios:
        lines += ["", "## Layouts", "", *[f"- {line}" for line in ratios]]
    lines += ["", "## Cases", "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(c) + " |" for c in body]
    failures = [f"- {r.case.name}: {k}: {v}" for r in rows for k, v in r.errors.items()]
    if failures:
        lines += ["", "## Not timed", "", *failures]
    return "\n".join(lines) + "\n"


def make_plots(rows: list[Row], peaks: dict, out_dir: Path) -> list[Path]:
    """The seeds' two graphs (fused over unfused per layer; BN+activation bandwidth) and per-layer times."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plots")
        return []
    written = []
    groups: dict[str, list[Row]] = {}
    for r in rows:
        groups.setdefault(f"{r.case.mode} {r.case.precision} {r.case.layout}", []).append(r)
    conv_groups = {k: v for k, v in groups.items() if "C" in k.split()[0]}
    if conv_groups:
        fig, ax = plt.subplots(figsize=(14, 5))
        width = 0.8 / len(conv_groups)
        layers = sorted({r.case.layer.name for v in conv_groups.values() for r in v})
        for gi, (key, members) in enumerate(conv_groups.items()):
            by_layer = {r.case.layer.name: r.speedup("unfused") for r in members}
            ax.bar(
                [i + gi * width for i in range(len(layers))], [by_layer.get(n) or 0 for n in layers], width, label=key
            )
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_xticks([i + 0.4 - width / 2 for i in range(len(layers))], layers, rotation=60)
        ax.set_ylabel("speed-up of fused over unfused")
        ax.set_title("Fused convolution chains over the same operators one launch each")
        ax.legend()
        fig.tight_layout()
        written.append(out_dir / "speedup_fused_vs_unfused.png")
        fig.savefig(written[-1], dpi=110)
        plt.close(fig)
        for key, members in conv_groups.items():
            fig, ax = plt.subplots(figsize=(14, 5))
            names = [n for n in ("fused", "cudnn", "compile", "eager") if any(n in r.times for r in members)]
            width = 0.8 / len(names)
            for ni, name in enumerate(names):
                ax.bar(
                    [i + ni * width for i in range(len(members))],
                    [r.times.get(name, 0) * 1e3 for r in members],
                    width,
                    label="fusionplan" if name == "fused" else name,
                )
            ax.set_xticks(
                [i + 0.4 - width / 2 for i in range(len(members))], [r.case.layer.name for r in members], rotation=60
            )
            ax.set_ylabel("µs")
            ax.set_title(f"Per-layer time, {key}, batch {members[0].case.batch}")
            ax.legend()
            fig.tight_layout()
            written.append(out_dir / f"times_{key.replace(' ', '_')}.png")
            fig.savefig(written[-1], dpi=110)
            plt.close(fig)
    pointwise = [r for r in rows if "C" not in r.case.mode and r.fused_ms]
    if pointwise:
        fig, ax = plt.subplots(figsize=(14, 5))
        ax.bar(range(len(pointwise)), [r.bytes / (r.fused_ms * 1e6) for r in pointwise], label="fused BN+activation")
        if "unfused" in pointwise[0].times:
            ax.plot(
                range(len(pointwise)),
                [r.bytes / (r.times["unfused"] * 1e6) if "unfused" in r.times else 0 for r in pointwise],
                "o",
                color="red",
                label="unfused (effective)",
            )
        copy = max(p["copy_gbps"] for p in peaks.values())
        ax.axhline(copy, color="black", linestyle="--", label=f"measured copy bandwidth {copy:.0f} GB/s")
        ax.set_xticks(
            range(len(pointwise)), [f"{r.case.layer.name} {r.case.precision}" for r in pointwise], rotation=60
        )
        ax.set_ylabel("GB/s (bytes read + written)")
        ax.set_title("Batch-norm + activation: achieved bandwidth")
        ax.legend()
        fig.tight_layout()
        written.append(out_dir / "bandwidth_bn_activation.png")
        fig.savefig(written[-1], dpi=110)
        plt.close(fig)
    return written
