"""fusionplan-bench on the CPU: options documented, outputs written, wrong results never timed."""

import json

import pytest
import torch

from fusionplan.benchmark import cases as bench_cases
from fusionplan.benchmark.cli import build_parser, main

SMALL = ["--device", "cpu", "--layers", "r50_01,r50_22", "--iters", "2", "--warmup", "1"]


def test_help_documents_every_option(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    text = capsys.readouterr().out
    for action in build_parser()._actions:
        for flag in action.option_strings:
            assert flag in text
        assert action.help and len(action.help) > 10


def test_cpu_run_writes_every_output(tmp_path, capsys):
    out = tmp_path / "run"
    assert main([*SMALL, "--modes", "CBNA,CBA,NA", "--layouts", "NHWC,NCHW", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "geometric means" in text and "cpu-folded" in text
    data = json.loads((out / "results.json").read_text())
    assert {"date", "command", "torch", "fusionplan", "device"} <= set(data["environment"])
    assert len(data["rows"]) == 2 * 3 * 2
    for row in data["rows"]:
        assert row["fused_ms"] > 0 and row["eager_ms"] > 0 and row["unfused_ms"] > 0, row
        assert row["errors"] == ""
    assert (out / "results.csv").read_text().count("\n") == 13
    assert "Geometric means" in (out / "summary.md").read_text()
    pngs = sorted(p.name for p in out.glob("*.png"))
    assert "speedup_fused_vs_unfused.png" in pngs and "bandwidth_bn_activation.png" in pngs


def test_warm_only_and_shards(capsys):
    assert main([*SMALL, "--modes", "CBA", "--warm-only", "--shard", "1/2"]) == 0
    assert "warmed 1 cases" in capsys.readouterr().out


def test_a_wrong_result_is_reported_and_not_timed(monkeypatch, tmp_path, capsys):
    def wrong(self, x):
        return torch.zeros(1)

    monkeypatch.setattr(bench_cases.EagerChain, "forward", wrong)
    assert main([*SMALL, "--layers", "r50_22", "--modes", "CBA", "--out", str(tmp_path), "--no-plots"]) == 1
    row = json.loads((tmp_path / "results.json").read_text())["rows"][0]
    assert "eager_ms" not in row and "eager: wrong result" in row["errors"]
    assert row["fused_ms"] > 0


def test_bad_options_are_refused(capsys):
    with pytest.raises(SystemExit):
        main(["--device", "cpu", "--precisions", "fp8"])
    assert main(["--device", "cpu", "--baselines", "tensorrt"]) == 2


def test_packaged_depthwise_shapes_run_as_depthwise_plans(capsys):
    from fusionplan.benchmark.cases import Case, build_plan
    from fusionplan.shapes import load_shapes

    shapes = load_shapes("mobilenet_v2_depthwise")
    assert len(shapes) == 10 and all(s.groups == s.c == s.k for s in shapes)
    assert sum(s.count for s in shapes) == 17  # MobileNetV2's depthwise convolutions
    last = shapes[-1]
    assert last.flops(1) == 2 * 960 * 7 * 7 * 9
    plan = build_plan(Case(last, 1, "fp32", "NHWC", "CBNA"))
    assert plan.ops[0].conv.groups == 960
    args = ["--shapes", "mobilenet_v2_depthwise", "--layers", "mbv2_dw_09", "--device", "cpu", "--batch", "1"]
    assert main([*args, "--modes", "CBNA", "--iters", "2", "--warmup", "1", "--no-plots"]) == 0
    assert "mbv2_dw_09" in capsys.readouterr().out
