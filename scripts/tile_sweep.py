"""Time one benchmark layer's convolution kernel over tile and split choices (CUDA only).

    python scripts/tile_sweep.py --layers r50_18,r50_22 --batch 1
    python scripts/tile_sweep.py --layers r50_19 --batch 1 --tiles 32x64,32x32 --splits 1,2,4
    python scripts/tile_sweep.py --layers r50_18 --batch 32 --mode CBNA --tiles keep,128x128w8s3 --splits 1,2
    python scripts/tile_sweep.py --layers r50_07 --batch 32 --mode CBNA --solver gluon-gemm --tiles keep \
        --splits 1 --tuning GLUON_GEMM_PERSISTENT_TMA_MAX_STEPS=8

For each layer the plan (fp16 NHWC by default) is compiled with its usual solver (or ``--solver``);
then its kernel runs with each configuration: block_m x block_n tiles, optionally with their
reduction step, warps and pipeline stages (``128x128k64w8s3``; ``keep``: the solver's own)
and reduction splits (``auto``: what the solver's rule picks for the tile). Every configuration is
checked against the float64 reference (output filled with NaN first) and timed as CUDA-graph
replays of 20 launches (as fusionplan-bench --graph: median of 5 replays, GPU time alone), each
launch on the next of several input and output sets that together exceed twice the L2 cache, as
the bench rotates them. ``--warm`` times one set over and over instead, its input warm in L2, as
the sweeps recorded before lab/NOTES.md section 52 ran: a kernel whose input comes from DRAM can
rank differently (gluon-plane-chunks on r50_21: 16.6 us warm against 20.0 rotated).
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import sys

import torch

from fusionplan.tools.bench.cli import tuning_choices

_TILE = re.compile(r"(\d+)x(\d+)(?:k(\d+))?(?:w(\d+))?(?:s(\d+))?(?:c(\d+))?")


Tile = tuple[int, int, "int | None", "int | None", "int | None", "int | None"]


def parse_tiles(text: str) -> list[Tile | None]:
    """'64x128,128x128k32w8s3' -> [(64, 128, None, None, None, None), (128, 128, 32, 8, 3, None)]:
    block_m x block_n, then optionally the reduction step (block_k), warps, pipeline stages and
    computing warpgroups taking tiles in turn (``c2``: gluon-gemm's ping-pong) (None: the solver's
    own); 'keep' -> None (the solver's own tile)."""
    tiles: list[Tile | None] = []
    for item in text.split(","):
        if item == "keep":
            tiles.append(None)
            continue
        found = _TILE.fullmatch(item)
        if found is None:
            raise argparse.ArgumentTypeError(
                f"tile {item!r}: expected MxN[kBLOCK_K][wWARPS][sSTAGES][cCONSUMERS] (e.g. 32x64, 128x128k32w8s3) "
                "or 'keep'"
            )
        m, n, block_k, warps, stages, consumers = (int(g) if g else None for g in found.groups())
        tiles.append((m, n, block_k, warps, stages, consumers))
    return tiles


def parse_splits(text: str) -> list[int | None]:
    """'1,2,auto' -> [1, 2, None] (None: the solver's rule)."""
    splits: list[int | None] = []
    for item in text.split(","):
        if item == "auto":
            splits.append(None)
        elif item.isdigit() and int(item) >= 1:
            splits.append(int(item))
        else:
            raise argparse.ArgumentTypeError(f"split {item!r}: expected a positive integer or 'auto'")
    return splits


def graph_us(fn, launches: int = 20) -> float:
    """Median GPU microseconds of one ``fn(i)`` (``i``: the call's index, which picks its input set)
    from CUDA-graph replays of ``launches`` calls (fusionplan-bench's graph timing)."""
    from fusionplan.tools.bench.timing import median_ms

    return median_ms(fn, torch.device("cuda"), launches, warmup=1, graph=True) * 1e3


def sweep_layer(layer, opts, timer=None) -> list[tuple[float, str]]:
    """(microseconds, description) of every configuration; ``timer`` replaces ``graph_us`` (tests)."""
    import fusionplan as fp
    from fusionplan.tools.bench.cases import Case, prepare, tolerance
    from fusionplan.tools.bench.timing import l2_bytes

    case = Case(layer, opts.batch, opts.precision, opts.layout, opts.mode)
    device = torch.device(getattr(opts, "device", "cuda"))
    prep = prepare(case, device, 0 if getattr(opts, "warm", False) else 2 * l2_bytes(device))
    handle = fp.Handle(device, allow_tf32=case.tf32)
    prep.plan.compile(handle, solver=opts.solver)
    kernel = prep.plan._entry(handle).kernel
    if not hasattr(kernel, "with_split"):
        raise SystemExit(f"{layer.name}: solver {prep.plan.compiled_solver(handle)} has no tile configuration")
    base = kernel.config
    x, y = prep.xs[0], prep.ys[0]
    records = [prep.args.get(op) for op in prep.plan.ops]
    tol, _ = tolerance(case)
    rows = []
    try:
        for tile in opts.tiles:
            block_m, block_n, block_k, warps, stages, consumers = tile or (base.block_m, base.block_n, *[None] * 4)
            unsplit = dataclasses.replace(
                base,
                block_m=block_m,
                block_n=block_n,
                block_k=block_k or base.block_k,
                num_warps=warps or base.num_warps,
                num_stages=stages or base.num_stages,
                split_k=1,
                consumers=consumers or base.consumers,
            )
            auto = kernel.with_split(unsplit).split_k
            programs, steps = kernel.programs_and_steps(unsplit)
            for split in dict.fromkeys(auto if s is None else s for s in opts.splits):
                if steps // split < 1:
                    continue
                rows.append(_run_config(kernel, unsplit, split, auto, programs, steps, x, y, records, prep, tol, timer))
    finally:
        kernel.config = base
    return rows


def _run_config(kernel, unsplit, split, auto, programs, steps, x, y, records, prep, tol, timer) -> tuple[float, str]:
    from fusionplan.tools.verify import compare

    kernel.config = dataclasses.replace(unsplit, split_k=split)
    kernel._repeats._by_records.clear()  # the next launch binds the new configuration
    c = unsplit
    tile = f"{c.block_m}x{c.block_n}k{c.block_k}w{c.num_warps}s{c.num_stages}"
    tile += f"c{c.consumers}" if c.consumers > 1 else ""
    name = f"{tile} split {split}{' (auto)' if split == auto else ''}"
    try:
        y.fill_(float("nan"))
        kernel.run(x, y, records, None)
        if y.is_cuda:
            torch.cuda.synchronize()
        result = compare(y, prep.reference)
        verdict = "ok" if result.nonfinite == 0 and result.rel_norm < tol else f"WRONG ({result})"
        sets = len(prep.xs)  # the rotated input and output sets (one with --warm)
        us = (timer or graph_us)(lambda i: kernel.run(prep.xs[i % sets], prep.ys[i % sets], records, None))
    except Exception as exc:  # a tile the kernel cannot compile (too much shared memory, ...)
        return float("inf"), f"  {name}: {type(exc).__name__}: {str(exc)[:100]}"
    return us, f"  {name}: programs {programs * split}, steps {steps}: {us:.2f} us {verdict}"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", required=True, help="comma-separated layer names of the shapes file")
    p.add_argument("--shapes", default=None, help="shapes CSV (default: ResNet-50)")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--precision", default="fp16")
    p.add_argument("--layout", default="NHWC")
    p.add_argument("--mode", default="CBA", help="operator letters, as fusionplan-bench's --modes")
    p.add_argument("--solver", default=None, help="force this solver (default: the plan's usual one)")
    p.add_argument("--tiles", type=parse_tiles, default=parse_tiles("keep,64x128,64x64,32x64,32x32,16x64"))
    p.add_argument("--splits", type=parse_splits, default=parse_splits("auto,1,2,4,8,16"))
    p.add_argument("--top", type=int, default=10, help="print this many fastest configurations per layer")
    p.add_argument(
        "--warm", action="store_true", help="time one input set, warm in L2 (default: sets rotated as the bench does)"
    )
    p.add_argument(
        "--tuning",
        type=tuning_choices,
        action="append",
        default=[],
        help=(
            "NAME=VALUE: set a constant of fusionplan.runtime.tuning for this run (an experiment's switch), "
            "repeatable; "
            "NAME=V1,V2: sweep every layer once per value, one after the other in this process (an A/B)"
        ),
    )
    return p


def main(argv: list[str] | None = None) -> int:
    opts = build_parser().parse_args(argv)
    if not torch.cuda.is_available():
        print("tile_sweep: needs a CUDA GPU (it times kernels as CUDA-graph replays)", file=sys.stderr)
        return 2
    from fusionplan.runtime import tuning
    from fusionplan.tools.shapes import load_shapes

    shapes = {s.name: s for s in load_shapes(opts.shapes)}
    unknown = [name for name in opts.layers.split(",") if name not in shapes]
    if unknown:
        print(f"tile_sweep: unknown layers {unknown}", file=sys.stderr)
        return 2
    variants = tuning.override_combinations(opts.tuning)
    for name in opts.layers.split(","):
        for variant in variants:  # each layer's variants one after the other: the same conditions
            with tuning.overridden(variant):
                rows = sweep_layer(shapes[name], opts)
            label = "".join(f" {k}={v}" for k, v in variant.items()) if len(variants) > 1 else ""
            print(f"{name} batch {opts.batch} {opts.precision} {opts.layout} {opts.mode}{label}:")
            for _, line in sorted(rows)[: opts.top]:
                print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
