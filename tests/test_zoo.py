"""The zoo suite: its extraction from a model (torch.fx), the packaged CSV and the bench's
``--shapes zoo --modes layer`` on the CPU."""

import collections
import csv
import json
from importlib import resources

import pytest
import torch
from torch import nn

from fusionplan.tools.bench.cli import main
from fusionplan.tools.bench.zoo import UNet, layers_of
from fusionplan.tools.shapes import load_shapes

#: the Conv2d modules of each model of the suite (torchvision 0.26-0.28, and the UNet)
CONVS = {
    "resnet50": 53, "resnext50_32x4d": 53, "wide_resnet50_2": 53, "regnet_y_1_6gf": 140, "inception_v3": 94,
    "googlenet": 57, "vgg16_bn": 13, "mobilenet_v2": 52, "mobilenet_v3_large": 62, "efficientnet_b0": 81,
    "densenet121": 120, "shufflenet_v2_x1_0": 56, "squeezenet1_0": 26, "deeplabv3_resnet50": 61, "unet": 19,
}  # fmt: skip


class Block(nn.Module):
    """conv-bn-add-relu (a residual), a 1x7 with its own padding, a dilated grouped conv whose
    batch-norm output has a second user (so the chain stops there)."""

    def __init__(self):
        super().__init__()
        self.a = nn.Conv2d(8, 8, 3, padding=1, bias=False)
        self.bn_a = nn.BatchNorm2d(8)
        self.b = nn.Conv2d(8, 12, (1, 7), padding=(0, 3), stride=(1, 2))
        self.c = nn.Conv2d(12, 12, 3, padding=2, dilation=2, groups=4, bias=False)
        self.bn_c = nn.BatchNorm2d(12)

    def forward(self, x):
        y = torch.relu(self.bn_a(self.a(x)) + x)
        z = nn.functional.silu(self.b(y))
        w = self.bn_c(self.c(z))
        return w.relu() + w.sum()


def test_layers_of_a_model_with_their_chains():
    a, b, c = layers_of(Block(), 16, channels=8)
    assert (a.c, a.k, a.h, a.w, a.chain, a.residual, a.activation) == (8, 8, 16, 16, "CNA", True, "relu")
    assert (b.r, b.s, b.pads, b.strides, b.chain, b.activation) == (1, 7, (0, 3), (1, 2), "CBA", "silu")
    assert (c.h, c.w, c.dilation, c.groups, c.chain, c.activation) == (16, 8, 2, 4, "CN", "")


def test_the_unet_layers():
    layers = list(layers_of(UNet(channels=(8, 16, 32)), 32))
    assert len(layers) == 2 * 3 + 2 * 2 + 1
    assert all(lay.chain == "CNA" for lay in layers[:-1]) and layers[-1].chain == "CB"
    assert [lay.h for lay in layers[:6:2]] == [32, 16, 8]


def test_the_packaged_suite_holds_every_convolution_of_its_models():
    text = resources.files("fusionplan").joinpath("data/zoo_convs.csv").read_text()
    rows = list(csv.DictReader(text.splitlines()))
    per_model = collections.Counter()
    for r in rows:
        models = dict(part.split(":") for part in r["models"].split())
        assert sum(map(int, models.values())) == int(r["count_in_model"]), r["name"]
        per_model.update({m: int(n) for m, n in models.items()})
    assert dict(per_model) == CONVS
    shapes = load_shapes("zoo")
    assert len(shapes) == len(rows) == len({s.name for s in shapes})
    assert any(s.pads == (0, 3) for s in shapes) and any(s.dilation == 2 for s in shapes)
    assert any(1 < s.groups < s.c for s in shapes) and any(s.groups == s.c for s in shapes)


@pytest.mark.parametrize("pick", ["asymmetric", "dilated", "grouped"])
def test_the_bench_runs_zoo_layers_with_their_chains(pick, tmp_path, monkeypatch):
    monkeypatch.delenv("FUSIONPLAN_BACKEND", raising=False)
    shapes = load_shapes("zoo")
    test = {
        "asymmetric": lambda s: s.pads[0] != s.pads[1],
        "dilated": lambda s: s.dilation > 1,
        "grouped": lambda s: 1 < s.groups < s.c,
    }[pick]
    shape = min((s for s in shapes if test(s)), key=lambda s: s.flops(1))
    argv = ["--shapes", "zoo", "--layers", shape.name, "--modes", "layer", "--device", "cpu", "--batch", "1"]
    assert main([*argv, "--iters", "1", "--warmup", "0", "--baselines", "eager", "--out", str(tmp_path)]) == 0
    rows = json.loads(next(tmp_path.glob("*.json")).read_text())
    rows = rows["rows"] if isinstance(rows, dict) else rows
    (row,) = rows
    assert row["mode"] == shape.chain and not row.get("errors")
    assert (row["pad"], row["pad_w"], row["dilation"], row["groups"]) == (*shape.pads, shape.dilation, shape.groups)


def test_layer_mode_needs_chains(capsys):
    assert main(["--layers", "r50_01", "--modes", "layer", "--device", "cpu", "--iters", "1"]) == 2
    assert "no chain column" in capsys.readouterr().err


def test_the_model_suite_fuses_a_model_end_to_end(tmp_path, monkeypatch):
    """--suite models: the zoo's UNet fused (every conv -> batch-norm -> ReLU and the head), checked
    by fuse against the model, timed beside eager, written out."""
    monkeypatch.delenv("FUSIONPLAN_BACKEND", raising=False)
    argv = ["--suite", "models", "--models", "unet", "--size", "32", "--batch", "1", "--device", "cpu"]
    argv += ["--baselines", "eager", "--iters", "1", "--warmup", "0", "--layouts", "NCHW,NHWC", "--out", str(tmp_path)]
    assert main(argv) == 0
    rows = json.loads((tmp_path / "models.json").read_text())["rows"]
    assert [(r["layout"], r["chains"], r["skipped"]) for r in rows] == [("NCHW", 19, 0), ("NHWC", 19, 0)]
    assert all(set(r["wall_ms"]) == {"fused", "eager"} and not r["errors"] for r in rows)
    assert "| unet | 1 | fp32 | NHWC | 19 | 0 |" in (tmp_path / "models.md").read_text()
    assert main(["--suite", "models", "--models", "alexnet", "--device", "cpu"]) == 2


def test_the_train_models_suite_trains_a_fused_model_beside_eager(tmp_path, monkeypatch):
    """--suite train-models: the zoo's UNet trained fused and eager from the same weights; the
    losses of a few SGD steps agree; a conv -> ReLU chain without batch-norm trains eagerly, said
    so in the table."""
    monkeypatch.delenv("FUSIONPLAN_BACKEND", raising=False)
    argv = ["--suite", "train-models", "--models", "unet", "--size", "32", "--batch", "2", "--device", "cpu"]
    argv += ["--baselines", "eager", "--iters", "1", "--warmup", "0", "--steps", "3", "--out", str(tmp_path)]
    assert main([*argv, "--profile", str(tmp_path / "profiles")]) == 0
    (row,) = json.loads((tmp_path / "train-models.json").read_text())["rows"]
    assert set(row["step_ms"]) == {"fused", "eager"} and not row["errors"] and row["chains"] == 19
    assert row["loss_gap"] < 1e-4
    assert "trained eagerly" in (tmp_path / "train-models.md").read_text()
    for variant in ("fused", "eager"):  # a profile of each: the step's share in kernels, then the operators
        text = (tmp_path / "profiles" / f"unet-n2-fp32-NHWC-{variant}.txt").read_text()
        assert text.startswith("step ") and "ms in device kernels" in text and "aten::" in text
        assert "Python functions by own time (cProfile)" in text and "tottime" in text
    assert main(["--suite", "train-models", "--models", "alexnet", "--device", "cpu"]) == 2
    assert main(["--suite", "train-models", "--models", "unet", "--precisions", "fp8", "--device", "cpu"]) == 2


def test_graphed_steps_are_tabled_and_a_capture_that_cannot_run_says_why():
    """--graph (train-models): each variant's step captured whole, in a table of its own beside
    the steps' times; on the CPU (no CUDA graphs) the reason instead of a time."""
    import torch

    from fusionplan.tools.bench import train_models as tm

    row = tm.TrainRow("resnet50", 64, "bf16", "NHWC", 224, step_ms={"fused": 49.6, "eager": 41.2})
    tm._time_graphed_step(row, "fused", None, torch.zeros(1), None)
    assert row.graph_errors == {"fused": "CUDA graphs need a CUDA device"} and not row.graph_ms
    row.graph_ms["eager"] = 17.55
    text = tm.table([row], ["eager"])
    assert "the step captured in a CUDA graph (ms a replay):" in text
    assert "| resnet50 | 64 | bf16 | NHWC | - | 17.550 |" in text
    assert "- not captured: resnet50 fused: CUDA graphs need a CUDA device" in text
    assert "captured in a CUDA graph" not in tm.table([tm.TrainRow("unet", 2, "fp32", "NHWC", 32)], ["eager"])


def test_model_selects_a_zoo_models_layers_with_their_chains(capsys, monkeypatch):
    """--model (bench and fusionplan-tune): the zoo layers of the named models, each with its chain."""
    from fusionplan.tools.bench.cli import build_parser, cases_from
    from fusionplan.tools.tunecli import main as tune_main

    opts = build_parser().parse_args(["--model", "vgg16_bn", "--device", "cpu"])
    cases = cases_from(opts, torch.device("cpu"))
    vgg = [s for s in load_shapes("zoo") if "vgg16_bn:" in s.models]
    assert [c.layer.name for c in cases] == [s.name for s in vgg] and len(vgg) == 9
    assert {c.mode for c in cases} == {"CBNA"} and sum(s.count for s in vgg) == 13
    opts = build_parser().parse_args(["--model", "vgg16_bn,squeezenet1_0", "--modes", "CBA", "--device", "cpu"])
    assert {c.mode for c in cases_from(opts, torch.device("cpu"))} == {"CBA"}
    monkeypatch.delenv("FUSIONPLAN_BACKEND", raising=False)
    assert tune_main(["--model", "alexnet", "--device", "cpu"]) == 2
    assert "unknown models ['alexnet']" in capsys.readouterr().err


def test_the_suites_fusable_activations_are_fuses():
    """An activation ends a zoo chain with A exactly where fusionplan.torch.fuse takes it, as the mode
    the suite's table names."""
    from fusionplan.tools.bench import zoo
    from fusionplan.torch_activations import activation_of

    for table in (zoo._ACTIVATION_MODULES, zoo._ACTIVATION_FUNCTIONS):
        for target, name in table.items():
            fused = activation_of(target() if isinstance(target, type) else target)
            want = zoo.FUSABLE_ACTIVATIONS.get(name)
            assert (fused[0].name if fused else None) == want, (target, name)
