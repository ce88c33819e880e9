"""The training suite: the two training plans against eager PyTorch and torch.compile, side by side.

    fusionplan-bench --suite training                                    # ResNet-50's 53 BN layers, batch 32
    fusionplan-bench --suite training --models resnet50,mobilenet_v2,densenet121 --batch 32,256 \\
        --precisions fp16,bf16 --layouts NHWC,NCHW --out lab/results/training

Per batch-norm layer (each distinct shape of a model once, weighted by how often the model has it):
- forward: the plan [BatchNormForward (running statistics), ActivationForward], against
  F.batch_norm(training=True) + the activation, eager and through torch.compile;
- backward: the plan [BatchNormBackward, ActivationBackward], against autograd's backward of that
  forward (eager, and of the compiled forward).

Every fusionplan result (y, saved and running statistics; dx, dscale, dbias) is checked against the
float64 reference before it is timed. Effective bandwidth: the least bytes moved over the time,
3 tensor sizes forward (x twice, y) and 5 backward (dy and x twice, dx), as a share of the measured
device copy bandwidth.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path

import torch
import torch.nn.functional as F

import fusionplan as fp
from fusionplan.core.activations import activation_forward
from fusionplan.core.enums import ActivationMode, BatchNormMode
from fusionplan.oracle.reference import run_reference
from fusionplan.runtime import tuning
from fusionplan.tools.bench.cases import PRECISIONS, TUNING_PREFIX
from fusionplan.tools.bench.timing import l2_bytes, measure_peaks, median_ms
from fusionplan.tools.verify import TOLERANCE, compare

MODELS = ("resnet50", "mobilenet_v2", "densenet121")
EPSILON, FACTOR = 1e-5, 0.1
#: the variants timed per direction: fusionplan's plan, and the baselines
VARIANTS = ("fused", "eager", "compile")


@dataclass(frozen=True)
class Layer:
    model: str
    channels: int
    height: int
    width: int
    count: int  # batch-norm layers of the model with this shape


def model_layers(models: Sequence[str]) -> list[Layer]:
    """Each distinct batch-norm shape of ``models`` (data/batchnorm_layers.csv), in model order."""
    counts: dict[tuple, int] = {}
    with resources.files("fusionplan").joinpath("data/batchnorm_layers.csv").open() as f:
        for row in csv.DictReader(f):
            if row["model"] in models:
                key = (row["model"], int(row["C"]), int(row["H"]), int(row["W"]))
                counts[key] = counts.get(key, 0) + 1
    unknown = set(models) - {k[0] for k in counts}
    if unknown:
        raise ValueError(f"no batch-norm layers for {sorted(unknown)}; known: {', '.join(MODELS)}")
    return [Layer(*key, count) for key, count in counts.items()]


@dataclass(frozen=True)
class TrainingCase:
    layer: Layer
    batch: int
    precision: str
    layout: str
    activation: ActivationMode = ActivationMode.RELU

    @property
    def shape(self) -> tuple[int, int, int, int]:
        return (self.batch, self.layer.channels, self.layer.height, self.layer.width)

    @property
    def dtype(self) -> torch.dtype:
        return PRECISIONS[self.precision][0]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize

    @property
    def name(self) -> str:
        n, c, h, w = self.shape
        return f"{self.layer.model} {n}x{c}x{h}x{w} {self.precision} {self.layout}"


@dataclass
class TrainingRow:
    case: TrainingCase
    forward_us: dict[str, float] = field(default_factory=dict)
    backward_us: dict[str, float] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)

    def speedup(self, direction: str, baseline: str) -> float | None:
        times = self.forward_us if direction == "forward" else self.backward_us
        if "fused" in times and baseline in times:
            return times[baseline] / times["fused"]
        return None

    def bandwidth_share(self, direction: str, copy_gbps: float) -> float | None:
        times = self.forward_us if direction == "forward" else self.backward_us
        if "fused" not in times:
            return None
        moved = (3 if direction == "forward" else 5) * self.case.nbytes
        return moved / (times["fused"] * 1e3) / copy_gbps


def _tensor(shape, dtype, layout, device, gen, shift=0.0) -> torch.Tensor:
    t = torch.randn(shape, generator=gen, device=device, dtype=torch.float32).add_(shift).to(dtype)
    return t.contiguous(memory_format=torch.channels_last) if layout == "NHWC" else t


def _rotation(case: TrainingCase, device: torch.device) -> int:
    """Input copies enough to exceed twice the L2 cache, so that no run finds its input there."""
    return max(1, min(48, math.ceil(2 * l2_bytes(device) / case.nbytes)))  # fewer than the plans' caches hold


class _CaseRun:
    """The tensors, plans and baselines of one case."""

    def __init__(self, case: TrainingCase, device: torch.device, seed: int) -> None:
        gen = torch.Generator(device=device).manual_seed(seed)
        self.case, self.device = case, device
        self.sets = _rotation(case, device)
        shape, dt, layout = case.shape, case.dtype, case.layout
        self.xs = [_tensor(shape, dt, layout, device, gen, shift=0.5) for _ in range(self.sets)]
        self.dys = [_tensor(shape, dt, layout, device, gen) for _ in range(self.sets)]
        self.ys = [torch.empty_like(x) for x in self.xs]
        self.dxs = [torch.empty_like(x) for x in self.xs]
        c = shape[1]
        self.scale = torch.rand(c, generator=gen, device=device) + 0.5
        self.bias = torch.randn(c, generator=gen, device=device)
        self.running = torch.zeros(c, device=device), torch.ones(c, device=device)
        self.saved = [(torch.empty(c, device=device), torch.empty(c, device=device)) for _ in range(self.sets)]
        self.grads = torch.empty(c, device=device), torch.empty(c, device=device)
        self.handle = fp.Handle(device)

    # ---- fusionplan ------------------------------------------------------------------------
    def forward_plan(self) -> Callable[[int], None]:
        plan = fp.FusionPlan(fp.TensorDescriptor.from_tensor(self.xs[0]))
        bn = plan.add_batchnorm_forward(BatchNormMode.SPATIAL, True)
        act = plan.add_activation_forward(self.case.activation)
        handle = self.handle
        self.forward_solver = plan.compile(handle)
        # one argument set, as a framework's layer keeps across steps (its inputs change, its
        # parameters and statistics buffers do not); the backward's holds x, so it is one per input
        a = fp.OperatorArgs()
        mean, inv = self.saved[0]
        a.set(
            bn,
            fp.BatchNormForwardArgs(
                scale=self.scale,
                bias=self.bias,
                saved_mean=mean,
                saved_inv_variance=inv,
                running_mean=self.running[0],
                running_variance=self.running[1],
                exp_avg_factor=FACTOR,
                epsilon=EPSILON,
            ),
        )
        a.set(act, fp.ActivationArgs())
        self.forward_ops, self.forward_args = plan.ops, [a]
        return lambda i: plan.execute(handle, self.xs[i % self.sets], self.ys[i % self.sets], a)

    def backward_plan(self) -> Callable[[int], None]:
        plan = fp.FusionPlan(fp.TensorDescriptor.from_tensor(self.dys[0]))
        bn = plan.add_batchnorm_backward(BatchNormMode.SPATIAL)
        act = plan.add_activation_backward(self.case.activation)
        handle = self.handle
        self.backward_solver = plan.compile(handle)
        for x, (mean, inv) in zip(self.xs, self.saved):  # the forward's statistics, whatever it computed
            var, m = torch.var_mean(x.float(), dim=(0, 2, 3), unbiased=False)
            mean.copy_(m)
            inv.copy_(torch.rsqrt(var + EPSILON))
        args = []
        for x, (mean, inv) in zip(self.xs, self.saved):
            a = fp.OperatorArgs()
            a.set(
                bn,
                fp.BatchNormBackwardArgs(
                    x=x,
                    scale=self.scale,
                    bias=self.bias,
                    result_scale_diff=self.grads[0],
                    result_bias_diff=self.grads[1],
                    saved_mean=mean,
                    saved_inv_variance=inv,
                ),
            )
            a.set(act, fp.ActivationBackwardArgs())
            args.append(a)
        self.backward_ops, self.backward_args = plan.ops, args
        return lambda i: plan.execute(handle, self.dys[i % self.sets], self.dxs[i % self.sets], args[i % self.sets])

    def verify_forward(self, run: Callable[[int], None]) -> str | None:
        start = self.running[0].clone(), self.running[1].clone()
        run(0)
        records = [self.forward_args[0].get(op) for op in self.forward_ops]
        base = fp.BatchNormForwardArgs(
            scale=self.scale,
            bias=self.bias,
            running_mean=start[0],
            running_variance=start[1],
            exp_avg_factor=FACTOR,
            epsilon=EPSILON,
        )
        base = self.forward_ops[0].check_args(base)  # the parameters viewed as the operator's
        ref = run_reference(self.forward_ops, self.xs[0], [base, records[1]], None, torch.float64)
        checks = [("y", self.ys[0], ref.output, self.case.dtype)]
        checks += [
            (n, t, ref.side[(0, n)], torch.float32) for n, t in zip(("saved_mean", "saved_inv_variance"), self.saved[0])
        ]
        checks += [
            (n, t, ref.side[(0, n)], torch.float32) for n, t in zip(("running_mean", "running_variance"), self.running)
        ]
        return _first_wrong(checks)

    def verify_backward(self, run: Callable[[int], None]) -> str | None:
        run(0)
        records = [self.backward_args[0].get(op) for op in self.backward_ops]
        ref = run_reference(self.backward_ops, self.dys[0], records, None, torch.float64)
        checks = [("dx", self.dxs[0], ref.output, self.case.dtype)]
        names = ("result_scale_diff", "result_bias_diff")
        checks += [(n, t, ref.side[(0, n)], self.case.dtype) for n, t in zip(names, self.grads)]
        return _first_wrong(checks)

    # ---- PyTorch ---------------------------------------------------------------------------
    def _eager_fn(self) -> Callable:
        act, rm, rv = self.case.activation, self.running[0], self.running[1]
        if act == ActivationMode.RELU:
            return lambda x, w, b: F.relu(F.batch_norm(x, rm, rv, w, b, True, FACTOR, EPSILON))
        return lambda x, w, b: activation_forward(
            act, F.batch_norm(x, rm, rv, w, b, True, FACTOR, EPSILON), 1.0, 0.0, 1.0
        )

    def torch_forward(self, compiled: bool) -> Callable[[int], None]:
        fn = self._eager_fn()
        fn = torch.compile(fn, dynamic=False) if compiled else fn
        return lambda i: fn(self.xs[i % self.sets], self.scale, self.bias)

    def torch_backward(self, compiled: bool) -> Callable[[int], None]:
        """autograd's backward of the forward, the graph kept (retain_graph) so that it is rerun."""
        fn = self._eager_fn()
        fn = torch.compile(fn, dynamic=False) if compiled else fn
        w, b = self.scale.clone().requires_grad_(True), self.bias.clone().requires_grad_(True)
        leaves = [x.clone().requires_grad_(True) for x in self.xs]
        outs = [fn(x, w, b) for x in leaves]

        def run(i: int) -> None:
            k = i % self.sets
            torch.autograd.grad(outs[k], (leaves[k], w, b), self.dys[k], retain_graph=True)

        return run


def _first_wrong(checks) -> str | None:
    for name, got, want, dtype in checks:
        c = compare(got, want.reshape(got.shape))
        if c.nonfinite or not c.rel_norm < TOLERANCE[dtype]:
            return f"wrong result: {name}: {c}"
    return None


def run_case(
    case: TrainingCase,
    device: torch.device,
    baselines: Sequence[str],
    iters: int,
    warmup: int,
    seed: int = 0,
    graph: bool = False,
) -> TrainingRow:
    row = TrainingRow(case)
    run = _CaseRun(case, device, seed)
    for direction, times in (("forward", row.forward_us), ("backward", row.backward_us)):
        make: dict[str, Callable[[], Callable[[int], None]]] = {
            "fused": run.forward_plan if direction == "forward" else run.backward_plan,
            "eager": lambda d=direction: (run.torch_forward if d == "forward" else run.torch_backward)(False),
            "compile": lambda d=direction: (run.torch_forward if d == "forward" else run.torch_backward)(True),
        }
        for variant in ("fused", *baselines):
            try:
                fn = _variant(variant, make, direction, run)
                if variant == "fused" or variant.startswith(TUNING_PREFIX):
                    wrong = (run.verify_forward if direction == "forward" else run.verify_backward)(fn)
                    if wrong:
                        row.errors[f"{direction} {variant}"] = wrong
                        continue
                times[variant] = 1e3 * median_ms(fn, device, iters=iters, warmup=warmup, graph=graph)
            except Exception as exc:  # a baseline that fails is reported, the suite goes on
                row.errors[f"{direction} {variant}"] = f"{type(exc).__name__}: {exc}"[:300]
    row.errors.update({"solvers": f"{getattr(run, 'forward_solver', '?')}/{getattr(run, 'backward_solver', '?')}"})
    return row


def _variant(variant: str, make: dict, direction: str, run: _CaseRun) -> Callable[[int], None]:
    """The timed function of a variant: fusionplan's plan (compiled with tuning constants set, for
    'tuning:NAME=V,...'), eager PyTorch or torch.compile."""
    if not variant.startswith(TUNING_PREFIX):
        return make[variant]()
    values = dict(tuning.parse_override(part) for part in variant[len(TUNING_PREFIX) :].split(","))
    default, run.handle = run.handle, fp.Handle(run.device)  # a handle of its own: handles keep their kernels
    try:
        with tuning.overridden(values):
            return run.forward_plan() if direction == "forward" else run.backward_plan()
    finally:
        run.handle = default


# ---- report ---------------------------------------------------------------------------------------------------
def _geomean(values: list[tuple[float, int]]) -> float | None:
    total = sum(w for _, w in values)
    return math.exp(sum(w * math.log(v) for v, w in values) / total) if total else None


def summary(rows: list[TrainingRow], baselines: Sequence[str]) -> list[dict]:
    """Per (model, batch, precision, layout): the geomean speedups over the model's layers (each
    shape weighted by its count), the least, and how many shapes are slower."""
    groups: dict[tuple, list[TrainingRow]] = {}
    for r in rows:
        c = r.case
        groups.setdefault((c.layer.model, c.batch, c.precision, c.layout), []).append(r)
    out = []
    for (model, batch, precision, layout), members in groups.items():
        entry = {
            "model": model,
            "batch": batch,
            "precision": precision,
            "layout": layout,
            "layers": sum(r.case.layer.count for r in members),
        }
        for direction in ("forward", "backward"):
            for base in baselines:
                pairs = [(s, r.case.layer.count) for r in members if (s := r.speedup(direction, base)) is not None]
                entry[f"{direction} vs {base} geomean"] = _geomean(pairs)
                entry[f"{direction} vs {base} min"] = min((s for s, _ in pairs), default=None)
                entry[f"{direction} slower than {base}"] = sum(1 for s, _ in pairs if s < 1.0)
        out.append(entry)
    return out


def table(rows: list[TrainingRow], baselines: Sequence[str], copy_gbps: float) -> str:
    head = ["case", "solvers"]
    for d in ("fwd", "bwd"):
        head += [f"{d} fused us", *(f"{d} {b} us" for b in baselines), *(f"{d} x{b}" for b in baselines), f"{d} %copy"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r.case.name, r.errors.get("solvers", "")]
        for direction, times in (("forward", r.forward_us), ("backward", r.backward_us)):
            cells += [_fmt(times.get("fused")), *(_fmt(times.get(b)) for b in baselines)]
            cells += [_fmt(r.speedup(direction, b), ".2f") for b in baselines]
            share = r.bandwidth_share(direction, copy_gbps)
            cells.append("-" if share is None else f"{100 * share:.0f}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def summary_table(entries: list[dict]) -> str:
    if not entries:
        return ""
    keys = list(entries[0])
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    for e in entries:
        lines.append(
            "| " + " | ".join(_fmt(e[k], ".2f") if isinstance(e[k], float) else str(e[k]) for k in keys) + " |"
        )
    return "\n".join(lines)


def _fmt(v: float | None, spec: str = ".1f") -> str:
    return "-" if v is None else format(v, spec)


def run_training_suite(opts, device: torch.device, env: dict) -> int:
    """``fusionplan-bench --suite training``: the cases of ``opts``, a table, and files in --out."""
    models = [m.strip() for m in (opts.models or "resnet50").split(",") if m.strip()]
    batches = [int(b) for b in (opts.batch or ("32" if device.type == "cuda" else "2")).split(",")]
    precisions = (opts.precisions or ("fp16" if device.type == "cuda" else "fp32")).split(",")
    layouts = opts.layouts.split(",")
    baselines = [b for b in (opts.baselines or "eager,compile").split(",") if b and b != "none"]
    unknown = set(baselines) - set(VARIANTS[1:]) | set(precisions) - set(PRECISIONS) - {"fp32"}
    if unknown:
        raise ValueError(f"unknown baselines or precisions for the training suite: {sorted(unknown)}")
    if getattr(opts, "tuning", None):
        baselines += [TUNING_PREFIX + tuning.override_label(c) for c in tuning.override_combinations(opts.tuning)]
    activation = ActivationMode[opts.activation.upper()]
    cases = [
        TrainingCase(layer, batch, precision, layout, activation)
        for layer in model_layers(models)
        for batch in (batches if layer.model == "resnet50" else batches[:1])
        for precision in precisions
        for layout in layouts
    ]
    if opts.shard:
        k, n = (int(v) for v in opts.shard.split("/"))
        cases = cases[k - 1 :: n]
    peaks = measure_peaks(device, PRECISIONS[precisions[0]][0])
    print(f"fusionplan-bench --suite training: {len(cases)} cases on {device}; copy {peaks.copy_gbps:.0f} GB/s")
    rows = []
    for case in cases:
        rows.append(run_case(case, device, baselines, opts.iters, opts.warmup, opts.seed, opts.graph))
        r = rows[-1]
        errors = {k: v for k, v in r.errors.items() if k != "solvers"}
        line = f"  {case.name}: fwd {_times(r.forward_us)} bwd {_times(r.backward_us)}"
        print(line + (f" {errors}" if errors else ""), flush=True)
    entries = summary(rows, baselines)
    text = table(rows, baselines, peaks.copy_gbps) + "\n\n" + summary_table(entries)
    print(text)
    if opts.out:
        out = Path(opts.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "training.md").write_text(
            f"# Training plans\n\n{json.dumps(env)}\n\ncopy bandwidth {peaks.copy_gbps:.0f} GB/s\n\n{text}\n"
        )
        records = [
            {
                **asdict(r.case),
                "activation": r.case.activation.name,
                "forward_us": r.forward_us,
                "backward_us": r.backward_us,
                "errors": r.errors,
            }
            for r in rows
        ]
        (out / "training.json").write_text(
            json.dumps({"env": env, "copy_gbps": peaks.copy_gbps, "rows": records, "summary": entries}, indent=1)
        )
        print(f"wrote {out / 'training.md'} and training.json")
    return 1 if any("wrong result" in e for r in rows for e in r.errors.values()) else 0


def _times(times: dict[str, float]) -> str:
    return " ".join(f"{k} {v:.1f}us" for k, v in times.items())
