"""A markdown table of Nsight Compute counters, one row a kernel, named by lab/ncu_layer.py's cases.

    ncu --clock-control none --profile-from-start off --csv --page raw --print-units base \\
        --metrics "$(python -m fusionplan.tools.bench.ncu_table --metrics)" \\
        python lab/ncu_layer.py --layer r50_21,r50_14 --layout NHWC,NCHW --no-cudnn > ncu.csv
    python -m fusionplan.tools.bench.ncu_table ncu.csv > ncu.md

ncu writes its CSV rows and ncu_layer.py its cases' labels (one a profiled case, in order) to the
same stdout; each case must have launched one kernel (else the rows are named by kernel alone).
"""

from __future__ import annotations

import argparse
import csv
import re
import sys

#: (metric, column title, scale): the time, the bytes through DRAM and L2, shared-memory
#: wavefronts, instructions and how busy the tensor pipe and the issue slots were.
METRICS = (
    ("gpu__time_duration.sum", "us", 1e-3),
    ("dram__bytes_read.sum", "DRAM read MB", 1e-6),
    ("dram__bytes_write.sum", "DRAM write MB", 1e-6),
    ("lts__t_bytes.sum", "L2 MB", 1e-6),
    ("lts__throughput.avg.pct_of_peak_sustained_elapsed", "L2 %", 1.0),
    ("l1tex__data_pipe_lsu_wavefronts_mem_shared.sum", "shared wavefronts M", 1e-6),
    ("sm__inst_executed.sum", "instructions M", 1e-6),
    ("sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_elapsed", "tensor %", 1.0),
    ("smsp__issue_active.avg.pct_of_peak_sustained_elapsed", "issue %", 1.0),
    ("dram__throughput.avg.pct_of_peak_sustained_elapsed", "DRAM %", 1.0),
)


#: A case's label as lab/ncu_layer.py prints it: ``r50_21 NCHW: gluon-nchw, config ...``.
LABEL = re.compile(r"^\S+ (NHWC|NCHW): ")


def number(text: str) -> float | None:
    """A counter's value (ncu writes thousands with commas), or None where it wrote none."""
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


def split(lines: list[str]) -> tuple[list[str], list[str]]:
    """ncu's CSV lines (quoted) and the cases' labels (ncu_layer.py's ``layer layout: solver ...``)."""
    rows = [line for line in lines if line.startswith('"')]
    labels = [line.strip() for line in lines if LABEL.match(line)]
    return rows, labels


def table(lines: list[str]) -> str:
    """The markdown table of the counters in METRICS that ncu wrote, one row a kernel."""
    rows, labels = split(lines)
    records = [r for r in csv.DictReader(rows) if number(r.get("ID", "")) is not None]
    named = len(records) == len(labels)
    present = [(m, title, scale) for m, title, scale in METRICS if records and m in records[0]]
    out = ["| case | " + " | ".join(title for _, title, _ in present) + " |"]
    out.append("|---" * (len(present) + 1) + "|")
    for i, r in enumerate(records):
        name = labels[i].split(", config")[0] if named else r["Kernel Name"][:60]
        values = []
        for m, _, scale in present:
            v = number(r[m])
            values.append("" if v is None else f"{v * scale:.1f}")
        out.append(f"| {name} | " + " | ".join(values) + " |")
    if not named:
        out.append(f"\n{len(records)} kernels against {len(labels)} cases: rows named by kernel.")
    return "\n".join(out)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("csv", nargs="?", help="ncu's output with ncu_layer.py's labels")
    p.add_argument("--metrics", action="store_true", help="print the metrics for ncu --metrics")
    a = p.parse_args()
    if a.metrics:
        print(",".join(m for m, _, _ in METRICS))
        return
    with open(a.csv) if a.csv else sys.stdin as f:
        print(table(f.read().splitlines()))


if __name__ == "__main__":
    main()
