"""fusionplan-bench: fusionplan against cuDNN, PyTorch eager and torch.compile, on any shapes.

    fusionplan-bench                                   # 23 ResNet-50 layers, batch 32, fp16 NHWC, CBNA and CBA
    fusionplan-bench --precisions fp16,fp32 --layouts NHWC,NCHW --modes CBNA,CBA,NA --out lab/results/run
    fusionplan-bench --shapes my_shapes.csv --batch 1,32 --graph
    fusionplan-bench --device cpu --layers r50_01,r50_10   # CPU: cpu solver vs reference vs eager
    fusionplan-bench --layers r50_07 --graph --tuning TMA_STORE_MIN_PIXELS=64,128   # an A/B column
    fusionplan-bench --suite training --models resnet50,mobilenet_v2,densenet121 --layouts NHWC,NCHW

Every variant is verified against the float64 reference before it is timed; a wrong result is
reported, never timed. Times are medians of CUDA-event timings after warm-up, inputs rotated so
they are not served from L2 (``--graph`` replays from a CUDA graph to remove launch gaps).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import torch

from fusionplan.core.enums import ActivationMode
from fusionplan.core.errors import FusionPlanError, coerce_enum
from fusionplan.core.handle import resolve_device
from fusionplan.runtime import tuning
from fusionplan.tools.bench.cases import PRECISIONS, TUNING_PREFIX, Case
from fusionplan.tools.bench.report import environment, print_table, write_outputs
from fusionplan.tools.bench.runner import BASELINES, run_suite
from fusionplan.tools.shapes import load_shapes


def add_case_options(p: argparse.ArgumentParser) -> None:
    """The options that select cases (shared with fusionplan-tune)."""
    p.add_argument(
        "--shapes",
        default=None,
        help="CSV of shapes (name,C,K,H,W,R,S,stride,pad[,count_in_model][,groups]), or a packaged set: "
        "resnet50 (default), mobilenet_v2_depthwise, zoo (the convolutions of 15 torchvision models and a UNet, "
        "fusionplan.tools.bench.zoo)",
    )
    p.add_argument("--layers", default="all", help="comma-separated layer names from the shapes, or 'all' (default)")
    p.add_argument(
        "--model",
        default=None,
        help="comma-separated models of the zoo suite: their layers (--shapes zoo), each with its chain unless "
        "--modes is given",
    )
    p.add_argument("--batch", default=None, help="comma-separated batch sizes (default 32 on a GPU, 1 on the CPU)")
    p.add_argument(
        "--precisions",
        default=None,
        help=f"comma-separated, of {', '.join(PRECISIONS)} (tf32: fp32 data, TF32 allowed everywhere); "
        "default fp16 on a GPU, fp32 on the CPU",
    )
    p.add_argument(
        "--layouts", default="NHWC", help="comma-separated NCHW,NHWC (input and output layout; default NHWC)"
    )
    p.add_argument(
        "--modes",
        default=None,
        help="comma-separated operator chains in data order, letters C B N A (default CBNA,CBA; NA = "
        "batch-norm + activation on the layer's output activation), or 'layer': each shape's chain in its "
        "model (--shapes zoo)",
    )
    p.add_argument("--activation", default="relu", help="activation mode of the chains (default relu)")
    p.add_argument("--device", default=None, help="cpu, cuda, cuda:N (default: a GPU if present)")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="fusionplan-bench",
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_case_options(p)
    p.add_argument(
        "--suite",
        choices=("conv", "training", "models", "train-models"),
        default="conv",
        help="conv: the inference chains on convolution layers (default); training: the training plans on "
        "models' batch-norm layers (fusionplan.tools.bench.training); models: whole models fused end to end "
        "(fusionplan.tools.bench.models); train-models: whole models' training steps, fused, eager and compiled "
        "(fusionplan.tools.bench.train_models)",
    )
    p.add_argument(
        "--steps",
        type=int,
        default=0,
        help="train-models suite: also train eager and fused this many steps and report their losses' largest gap",
    )
    p.add_argument(
        "--profile",
        default=None,
        metavar="DIR",
        help="train-models suite: also profile a few steps of each variant (torch.profiler) and write, per run, "
        "the operators by device time and how much of a step the device computed, into DIR",
    )
    p.add_argument(
        "--models",
        default=None,
        help="training suite: comma-separated of resnet50 (default), mobilenet_v2, densenet121; ResNet-50 runs "
        "at every --batch, the others at the first. models suite: the zoo's models (default: all; torchvision's "
        "need torchvision)",
    )
    p.add_argument("--size", type=int, default=None, help="models suite: input height and width (default: the model's)")
    p.add_argument(
        "--baselines",
        default=None,
        help=f"comma-separated, of {', '.join(BASELINES[:-1])} (default: all on a GPU, unfused,eager on the "
        "CPU); 'none' for fusionplan only",
    )
    p.add_argument("--max-autotune", action="store_true", help="also time torch.compile(mode='max-autotune') (slow)")
    p.add_argument(
        "--tuning",
        type=tuning_choices,
        action="append",
        default=[],
        help="NAME=V1,V2: also time the plan with a constant of fusionplan.runtime.tuning set to each value (a column "
        "'tuning:NAME=V' per value beside 'fused', the defaults); repeatable: every combination",
    )
    p.add_argument("--iters", type=int, default=50, help="timed runs per variant (median; default 50)")
    p.add_argument("--warmup", type=int, default=5, help="untimed runs first (default 5)")
    p.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="split the timed runs into this many rounds in which the variants take turns; each time is "
        "the median of its rounds' medians (default 1; more evens out a shared machine's drift)",
    )
    p.add_argument(
        "--graph",
        action="store_true",
        help="time CUDA-graph replays (no launch gaps); train-models: also each variant's whole step in a graph",
    )
    p.add_argument("--out", default=None, help="directory for results.csv, results.json, summary.md and the PNG plots")
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    p.add_argument("--seed", type=int, default=0, help="random seed of inputs and arguments")
    p.add_argument(
        "--shard", default=None, help="K/N: run only every N-th case starting at K (split a sweep over processes)"
    )
    p.add_argument(
        "--warm-only",
        action="store_true",
        help="compile and verify every variant without timing (fills the kernel caches; run shards of it "
        "in parallel before a timed run)",
    )
    return p


def tuning_choices(text: str) -> tuple[str, tuple]:
    """An argparse type: 'NAME=V1,V2' -> (NAME, values), as tuning.parse_choices, its refusals
    argparse's errors (scripts/tile_sweep.py's --tuning too)."""
    return _argument(tuning.parse_choices, text)


def tuning_override(text: str) -> tuple[str, int | float]:
    """An argparse type: 'NAME=V' -> (NAME, value), as tuning.parse_override, its refusals
    argparse's errors (scripts/inspect_sass.py's --tuning)."""
    return _argument(tuning.parse_override, text)


def _argument(parse, text: str):
    try:
        return parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _split(value: str) -> list[str]:
    return [v.strip() for v in value.split(",") if v.strip()]


class BadArgument(ValueError):
    """A command-line value the bench cannot use (exit status 2, as the driver's)."""


def _shard(cases: list[Case], shard: str) -> list[Case]:
    try:
        k, n = (int(v) for v in shard.split("/"))
    except ValueError:
        raise BadArgument(f"--shard takes K/N (two integers), got {shard!r}") from None
    if not 0 <= k < n:
        raise BadArgument(f"--shard K/N needs 0 <= K < N, got {shard!r}")
    return cases[k::n]


def cases_from(opts: argparse.Namespace, device: torch.device) -> list[Case]:
    shapes = load_shapes("zoo" if opts.model else opts.shapes)
    if opts.model:
        shapes = _model_layers(shapes, _split(opts.model))
    if opts.layers != "all":
        wanted = _split(opts.layers)
        unknown = set(wanted) - {s.name for s in shapes}
        if unknown:
            raise BadArgument(f"unknown layers {sorted(unknown)}")
        shapes = [s for s in shapes if s.name in wanted]
    gpu = device.type == "cuda"
    batches = [int(b) for b in _split(opts.batch or ("32" if gpu else "1"))]
    precisions = _split(opts.precisions or ("fp16" if gpu else "fp32"))
    for name in precisions:
        if name not in PRECISIONS:
            raise BadArgument(f"unknown precision {name!r}; choose from {', '.join(PRECISIONS)}")
    layouts = _split(opts.layouts)
    modes = [m.upper() for m in _split(opts.modes or (LAYER_MODE if opts.model else "CBNA,CBA"))]
    activation = coerce_enum(ActivationMode, opts.activation, "activation")
    if LAYER_MODE in modes and any(not s.chain for s in shapes):
        raise BadArgument(f"--modes {LAYER_MODE.lower()}: the shapes have no chain column (the zoo suite has)")
    return [
        Case(s, b, p, lay, *(_layer_chain(s) if m == LAYER_MODE else (m, activation)))
        for p in precisions
        for lay in layouts
        for m in modes
        for b in batches
        for s in shapes
    ]


def _model_layers(shapes: list, models: list[str]) -> list:
    """The zoo layers that come from any of ``models``."""
    known = {part.split(":")[0] for s in shapes for part in s.models.split()}
    unknown = set(models) - known
    if unknown:
        raise BadArgument(f"unknown models {sorted(unknown)}; the zoo suite has {', '.join(sorted(known))}")
    return [s for s in shapes if {part.split(":")[0] for part in s.models.split()} & set(models)]


#: --modes layer: each shape's own chain (the zoo suite's chain column), with its activation
LAYER_MODE = "LAYER"


def _layer_chain(shape) -> tuple[str, ActivationMode]:
    """The chain a zoo layer has in its model, and its activation (RELU where it has none)."""
    from fusionplan.tools.bench.zoo import FUSABLE_ACTIVATIONS

    mode = FUSABLE_ACTIVATIONS.get(shape.activation)
    return shape.chain, ActivationMode[mode] if mode and "A" in shape.chain else ActivationMode.RELU


def main(argv: Sequence[str] | None = None) -> int:
    opts = build_parser().parse_args(argv)
    try:
        device = resolve_device(opts.device)
    except FusionPlanError as exc:
        print(f"fusionplan-bench: {exc}", file=sys.stderr)
        return 2
    for name in ("iters", "rounds"):
        if getattr(opts, name) < 1:
            print(f"fusionplan-bench: --{name} must be at least 1, got {getattr(opts, name)}", file=sys.stderr)
            return 2
    if opts.suite in ("training", "models", "train-models"):
        if opts.suite == "training":
            from fusionplan.tools.bench.training import run_training_suite as run
        elif opts.suite == "models":
            from fusionplan.tools.bench.models import run_model_suite as run
        else:
            from fusionplan.tools.bench.train_models import run_train_model_suite as run
        try:
            return run(opts, device, environment(device))
        except (ValueError, FusionPlanError) as exc:
            print(f"fusionplan-bench: {exc}", file=sys.stderr)
            return 2
    try:
        cases = cases_from(opts, device)
        cases = _shard(cases, opts.shard) if opts.shard else cases
    except (BadArgument, FusionPlanError) as exc:
        print(f"fusionplan-bench: {exc}", file=sys.stderr)
        return 2
    if opts.baselines == "none":
        baselines = []
    else:
        default = "unfused,eager,cudnn,compile" if device.type == "cuda" else "unfused,eager"
        baselines = _split(opts.baselines or default)
    if opts.max_autotune:
        baselines.append("compile-max")
    unknown = set(baselines) - set(BASELINES)
    if opts.tuning:
        baselines += [TUNING_PREFIX + tuning.override_label(c) for c in tuning.override_combinations(opts.tuning)]
    if unknown:
        print(f"fusionplan-bench: unknown baselines {sorted(unknown)}", file=sys.stderr)
        return 2
    torch.manual_seed(opts.seed)
    print(f"fusionplan-bench: {len(cases)} cases on {device}, baselines: {', '.join(baselines) or 'none'}")
    rows, peaks = _run_with_progress(cases, device, baselines, opts)
    if opts.warm_only:
        wrong = [f"{r.case.name}: {k}: {v}" for r in rows for k, v in r.errors.items()]
        print(f"warmed {len(rows)} cases" + "".join(f"\n  {w}" for w in wrong))
        return 1 if any("wrong result" in w for w in wrong) else 0
    print_table(rows, peaks)
    if opts.out:
        for path in write_outputs(rows, peaks, environment(device), Path(opts.out), plots=not opts.no_plots):
            print(f"wrote {path}")
    return 1 if any("wrong result" in e for r in rows for e in r.errors.values()) else 0


def _run_with_progress(cases, device, baselines, opts):
    kwargs = dict(iters=opts.iters, warmup=opts.warmup, graph=opts.graph, timed=not opts.warm_only, rounds=opts.rounds)
    try:
        from rich.progress import Progress
    except ImportError:
        return run_suite(cases, device, baselines, progress=lambda c: print(f"  done {c.name}", flush=True), **kwargs)
    with Progress(transient=True) as progress:
        task = progress.add_task("benchmarking", total=len(cases))
        return run_suite(cases, device, baselines, progress=lambda c: progress.advance(task), **kwargs)


if __name__ == "__main__":
    sys.exit(main())
