"""scripts/ab_compare.py: medians over rounds, new/old per case, geomeans by precision and layout."""

import json
import runpy
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "ab_compare.py"


def _write(out: Path, tree: str, round_: int, times: dict[str, float]) -> None:
    rows = [
        {"case": case, "fused_ms": ms, "precision": case.split("-")[0], "layout": case.split("-")[1]}
        for case, ms in times.items()
    ]
    (out / f"{tree}-{round_}").mkdir(parents=True)
    (out / f"{tree}-{round_}" / "results.json").write_text(json.dumps({"rows": rows}))


def test_the_comparison_takes_medians_and_geomeans(tmp_path):
    compare = runpy.run_path(str(SCRIPT))["main"]
    for r, noise in enumerate((1.0, 5.0, 1.0), 1):  # one noisy round: the median ignores it
        _write(tmp_path, "old", r, {"fp16-NHWC-a": 10.0 * noise, "bf16-NCHW-b": 20.0})
        _write(tmp_path, "new", r, {"fp16-NHWC-a": 10.2, "bf16-NCHW-b": 20.0 * noise})
    assert compare([str(tmp_path)]) == 0  # geomean sqrt(1.02 * 1.0) within 1.03
    text = (tmp_path / "ab.md").read_text()
    assert "| fp16-NHWC-a | 10.0000 | 10.2000 | 1.020 |" in text
    assert "geomean new/old, fp16 NHWC: 1.0200 (1 cases)" in text
    assert compare([str(tmp_path), "--bound", "1.005"]) == 1
    assert "cases beyond the bound: fp16-NHWC-a" in (tmp_path / "ab.md").read_text()


def test_nothing_to_compare_is_said(tmp_path):
    with pytest.raises(SystemExit, match="no case timed in both trees"):
        runpy.run_path(str(SCRIPT))["main"]([str(tmp_path)])
