"""Compare fusionplan-bench result sets of two source trees timed in alternating rounds.

    python scripts/ab_compare.py OUTDIR        # OUTDIR/{old,new}-R/results.json, as scripts/ab_commits.sh writes

Per case, each tree's fused time is the median over its rounds; the table gives both and new/old,
then the geometric mean of new/old per precision and layout and overall, and the cases beyond a
bound (``--bound``, default 1.03). Exit status 1 when the overall geomean is beyond the bound.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from collections import defaultdict
from pathlib import Path


def fused_times(out: Path, tree: str) -> tuple[dict[str, list[float]], dict[str, str]]:
    """Case name -> the fused times (ms) of every round of ``tree``; case name -> its precision
    and layout."""
    times: dict[str, list[float]] = defaultdict(list)
    groups: dict[str, str] = {}
    for path in sorted(out.glob(f"{tree}-*/results.json")):
        for row in json.loads(path.read_text())["rows"]:
            if row.get("fused_ms"):
                times[row["case"]].append(float(row["fused_ms"]))
                groups[row["case"]] = f"{row.get('precision')} {row.get('layout')}"
    return times, groups


def geomean(values: list[float]) -> float:
    return math.exp(sum(map(math.log, values)) / len(values))


def compare(out: Path, bound: float) -> tuple[str, float]:
    """The comparison's text and its overall geomean of new/old."""
    (old, groups), (new, _) = fused_times(out, "old"), fused_times(out, "new")
    cases = sorted(set(old) & set(new))
    if not cases:
        raise SystemExit(f"no case timed in both trees under {out}")
    medians = {c: (statistics.median(old[c]), statistics.median(new[c])) for c in cases}
    ratios = {c: n / o for c, (o, n) in medians.items()}
    lines = ["| case | old ms | new ms | new/old |", "|---|---|---|---|"]
    lines += [f"| {c} | {o:.4f} | {n:.4f} | {ratios[c]:.3f} |" for c, (o, n) in medians.items()]
    by_group: dict[str, list[float]] = defaultdict(list)
    for c, r in ratios.items():
        by_group[groups[c]].append(r)
    lines.append("")
    lines += [f"geomean new/old, {name}: {geomean(v):.4f} ({len(v)} cases)" for name, v in sorted(by_group.items())]
    overall = geomean(list(ratios.values()))
    lines.append(f"geomean new/old, all: {overall:.4f} ({len(ratios)} cases); bound {bound}")
    beyond = [c for c, r in ratios.items() if r > bound]
    if beyond:
        lines.append(f"cases beyond the bound: {', '.join(beyond)}")
    return "\n".join(lines), overall


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", type=Path)
    p.add_argument("--bound", type=float, default=1.03)
    opts = p.parse_args(argv)
    text, overall = compare(opts.out, opts.bound)
    print(text)
    (opts.out / "ab.md").write_text(text + "\n")
    return 0 if overall <= opts.bound else 1


if __name__ == "__main__":
    sys.exit(main())
