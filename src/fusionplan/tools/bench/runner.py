"""Runs benchmark cases: verify every variant, then time it; one row of results per case."""

from __future__ import annotations

import contextlib
import gc
import statistics
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch

from fusionplan.tools.bench.cases import Case, make_variants, prepare, verify
from fusionplan.tools.bench.timing import Peaks, l2_bytes, measure_peaks, median_ms

BASELINES = ("find", "unfused", "eager", "cudnn", "compile", "compile-max")


@contextlib.contextmanager
def tf32_mode(enabled: bool) -> Iterator[None]:
    """TF32 on or off for every library in the process (cuDNN and cuBLAS), restored afterwards."""
    saved = (torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32)
    torch.backends.cudnn.allow_tf32 = enabled
    torch.backends.cuda.matmul.allow_tf32 = enabled
    try:
        yield
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


@dataclass
class Row:
    case: Case
    flops: int
    bytes: int
    floor_ms: float
    times: dict[str, float] = field(default_factory=dict)  # variant -> median ms
    errors: dict[str, str] = field(default_factory=dict)  # variant -> why it was not timed
    solver: str = ""

    @property
    def fused_ms(self) -> float | None:
        return self.times.get("fused")

    def speedup(self, baseline: str) -> float | None:
        """baseline time / fused time (> 1: fusionplan is faster)."""
        if self.fused_ms is None or baseline not in self.times:
            return None
        return self.times[baseline] / self.fused_ms

    def as_dict(self) -> dict:
        c = self.case
        fused = self.fused_ms
        out = {
            "case": c.name,
            "layer": c.layer.name,
            "C": c.layer.c,
            "K": c.layer.k,
            "H": c.layer.h,
            "W": c.layer.w,
            "R": c.layer.r,
            "S": c.layer.s,
            "stride": c.layer.stride,
            "pad": c.layer.pad,
            "stride_w": c.layer.strides[1],
            "pad_w": c.layer.pads[1],
            "dilation": c.layer.dilation,
            "groups": c.layer.groups,
            "batch": c.batch,
            "precision": c.precision,
            "layout": c.layout,
            "mode": c.mode,
            "activation": c.activation.name,
            "solver": self.solver,
            "flops": self.flops,
            "bytes": self.bytes,
            "floor_ms": self.floor_ms,
            "fused_ms": fused,
            "tflops": self.flops / (fused * 1e9) if fused else None,
            "gbps": self.bytes / (fused * 1e6) if fused else None,
            "time_over_floor": fused / self.floor_ms if fused and self.floor_ms else None,
        }
        for name, ms in self.times.items():
            out[f"{name}_ms"] = ms
        for name in self.times:
            if name != "fused":
                out[f"speedup_vs_{name}"] = self.speedup(name)
        out["errors"] = "; ".join(f"{k}: {v}" for k, v in self.errors.items())
        return out


def run_case(
    case: Case,
    device: torch.device,
    peaks: Peaks,
    baselines: list[str],
    iters: int,
    warmup: int,
    graph: bool,
    timed: bool = True,
    rounds: int = 1,
) -> Row:
    """Verify every variant, then time those that passed (``timed=False``: verify only, which
    compiles everything). With ``rounds`` > 1 the timed runs are split into rounds in which the
    variants take turns, and each variant's time is the median of its rounds' medians: a drift of a
    shared machine (host-bound timings move by 10-20 % within minutes) falls on every variant alike."""
    with tf32_mode(case.tf32):
        prep = prepare(case, device, 2 * l2_bytes(device))
        row = Row(case, case.flops(), prep.bytes_moved, peaks.floor_ms(case.flops(), prep.bytes_moved))
        try:
            variants = make_variants(prep, device, baselines)
        except Exception as exc:  # the plan itself could not be built or compiled: a failed case
            row.errors["fused"] = f"{type(exc).__name__}: {exc}"
            return row
        row.solver = variants[0].solver
        verified = [v for v in variants if _verified(prep, v, row)]
        if timed:
            _time_in_rounds(verified, row, device, iters, warmup, graph, rounds)
    del prep
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return row


def _verified(prep, variant, row: Row) -> bool:
    """Whether the variant computes the reference's result; why not goes into ``row.errors``."""
    try:
        why = verify(prep, variant)
    except Exception as exc:  # a baseline that cannot run this case (e.g. no kernel for it)
        why = f"{type(exc).__name__}: {str(exc)[:200]}"
    if why is not None:
        row.errors[variant.name] = why
    return why is None


def _time_in_rounds(variants: list, row: Row, device: torch.device, iters: int, warmup: int, graph: bool, rounds: int):
    per_round = max(1, -(-iters // max(1, rounds)))
    medians: dict[str, list[float]] = {v.name: [] for v in variants}
    for r in range(max(1, rounds)):
        for variant in variants:
            if variant.name in row.errors:
                continue
            try:
                ms = median_ms(variant.run, device, per_round, warmup if r == 0 else min(warmup, 2), graph=graph)
            except Exception as exc:
                row.errors[variant.name] = f"{type(exc).__name__}: {str(exc)[:200]}"
                continue
            medians[variant.name].append(ms)
    for name, values in medians.items():
        if values and name not in row.errors:
            row.times[name] = statistics.median(values)


def run_suite(
    cases: list[Case],
    device: torch.device,
    baselines: list[str],
    iters: int = 50,
    warmup: int = 5,
    graph: bool = False,
    progress: Callable[[Case], None] | None = None,
    timed: bool = True,
    rounds: int = 1,
) -> tuple[list[Row], dict]:
    """Run every case; returns the rows and the measured peaks per precision."""
    peaks: dict[str, Peaks] = {}
    rows = []
    for case in cases:
        if case.precision not in peaks:
            with tf32_mode(case.tf32):
                peaks[case.precision] = measure_peaks(device, case.dtype) if timed else Peaks(1.0, 1.0)
        rows.append(run_case(case, device, peaks[case.precision], baselines, iters, warmup, graph, timed, rounds))
        if progress is not None:
            progress(case)
    return rows, {k: vars(v) for k, v in peaks.items()}


def layout_ratios(rows: list[Row]) -> dict[str, dict[str, float]]:
    """Per (precision, mode) group timed in both layouts: the geometric mean over its layers of the
    NCHW fused time over the NHWC fused time (issue 6's NCHW target: at most 1.2), and the layers
    it covers."""
    fused: dict[tuple[str, str, int, str], dict[str, float]] = {}
    for row in rows:
        if row.fused_ms:
            c = row.case
            fused.setdefault((c.precision, c.mode, c.batch, c.layer.name), {})[c.layout] = row.fused_ms
    groups: dict[str, list[float]] = {}
    for (precision, mode, _, _), times in fused.items():
        if {"NCHW", "NHWC"} <= set(times):
            groups.setdefault(f"{precision} {mode}", []).append(times["NCHW"] / times["NHWC"])
    return {k: {"nchw_over_nhwc": statistics.geometric_mean(v), "layers": len(v)} for k, v in groups.items()}


def geomeans(rows: list[Row]) -> dict[str, dict[str, float]]:
    """Per (precision, layout, mode) group: the geometric mean of fused's speed-up over each baseline."""
    groups: dict[str, list[Row]] = {}
    for row in rows:
        groups.setdefault(f"{row.case.precision} {row.case.layout} {row.case.mode}", []).append(row)
    out = {}
    for key, members in groups.items():
        names = sorted({n for r in members for n in r.times if n != "fused"})
        stats = {}
        for name in names:
            values = [s for r in members if (s := r.speedup(name)) is not None]
            if values:
                stats[name] = statistics.geometric_mean(values)
        floors = [r.fused_ms / r.floor_ms for r in members if r.fused_ms and r.floor_ms]
        if floors:
            stats["time_over_floor"] = statistics.geometric_mean(floors)
        out[key] = stats
    return out
