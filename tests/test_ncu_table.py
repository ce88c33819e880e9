"""fusionplan.tools.bench.ncu_table: Nsight Compute's raw CSV (a units row, numbers with thousands separators)
and lab/ncu_layer.py's case labels, interleaved on one stdout, become one table row a kernel named
by its case."""

import sys

from fusionplan.tools.bench import ncu_table

ISSUE = "smsp__issue_active.avg.pct_of_peak_sustained_elapsed"
HEADER = f'"ID","Kernel Name","gpu__time_duration.sum","lts__t_bytes.sum","{ISSUE}"'
UNITS = '"","","ns","byte","%"'


def kernel_row(i: int, name: str, ns: str, l2: str, issue: str) -> str:
    return f'"{i}","{name}","{ns}","{l2}","{issue}"'


def test_rows_are_named_by_their_cases_and_scaled():
    lines = [
        "==PROF== Connected to process 1 (python)",
        "UserWarning: not a case: a warning's line",
        "r50_21 NHWC: gluon-gemm, config ConvConfig(block_m=128)",
        "r50_21 NCHW: gluon-nchw, config ConvConfig(block_m=64)",
        HEADER,
        UNITS,
        kernel_row(0, "gluon_gemm_kernel", "11,100", "47,900,000", "15.9"),
        kernel_row(1, "gluon_nchw_kernel", "19,600", "94,200,000", "16.9"),
    ]
    out = ncu_table.table(lines).splitlines()
    assert out[0] == "| case | us | L2 MB | issue % |"
    assert out[2] == "| r50_21 NHWC: gluon-gemm | 11.1 | 47.9 | 15.9 |"
    assert out[3] == "| r50_21 NCHW: gluon-nchw | 19.6 | 94.2 | 16.9 |"
    assert len(out) == 4


def test_kernels_not_one_a_case_are_named_by_kernel():
    lines = [
        "r50_21 NCHW: gluon-nchw, config ConvConfig(block_m=64)",
        HEADER,
        UNITS,
        kernel_row(0, "gluon_nchw_kernel", "19,600", "1", "2"),
        kernel_row(1, "a_second_kernel", "1,000", "n/a", "2"),
    ]
    out = ncu_table.table(lines).splitlines()
    assert out[2].startswith("| gluon_nchw_kernel | 19.6 |")
    assert out[3] == "| a_second_kernel | 1.0 |  | 2.0 |"
    assert "2 kernels against 1 cases" in out[-1]


def test_metrics_list_is_what_the_table_reads(capsys, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["ncu_table.py", "--metrics"])
    ncu_table.main()
    assert capsys.readouterr().out.strip().split(",") == [m for m, _, _ in ncu_table.METRICS]
