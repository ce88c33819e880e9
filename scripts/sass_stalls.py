"""Stall samples of each SASS instruction from an Nsight Compute report's source page.

    ncu --clock-control none --profile-from-start off --kernel-name regex:gluon_rows --set full \\
        --import-source no -o rows python lab/ncu_layer.py --layer r50_02 --solver gluon-rows
    ncu --import rows.ncu-rep --page source --csv --print-source sass > rows-sass.csv
    python scripts/sass_stalls.py rows-sass.csv

prints every instruction with samples in address order: its share of all samples and its three
largest stall reasons (which partition waits where, in a warp-specialized kernel).
"""

from __future__ import annotations

import argparse
import csv


def number(text: str) -> float:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return 0.0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("csv", help="ncu --page source --csv --print-source sass output")
    rows = list(csv.reader(open(p.parse_args().csv, errors="replace")))
    at = next(i for i, row in enumerate(rows) if any("Sampling" in cell for cell in row))
    head = rows[at]
    col = {name: i for i, name in enumerate(head)}
    samples = next(name for name in head if name.startswith("Warp Stall Sampling (All"))
    reasons = [name for name in head if name.startswith("stall_") and "Not Issued" not in name]
    body = [row for row in rows[at + 1 :] if len(row) == len(head)]
    total = sum(number(row[col[samples]]) for row in body)
    print(f"samples: {total:.0f}")
    for row in body:
        n = number(row[col[samples]])
        if n <= 0:
            continue
        top = sorted(((number(row[col[r]]), r) for r in reasons), reverse=True)[:3]
        why = " ".join(f"{r[len('stall_') :]}={v:.0f}" for v, r in top if v)
        print(f"{row[col['Address']]:>8} {n:6.0f} {100 * n / total:5.1f}% {row[col['Source']][:70]:70} {why}")


if __name__ == "__main__":
    main()
