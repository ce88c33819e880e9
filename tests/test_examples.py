"""The seeds' examples, ported line for line, run as scripts."""

import os
import pathlib
import subprocess
import sys

import pytest
import torch

EXAMPLES = sorted((pathlib.Path(__file__).parents[1] / "examples").glob("*.py"))


@pytest.mark.parametrize("script", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_example_runs_and_passes(script):
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "PASSED" in done.stdout or "Speedup" in done.stdout or "OK" in done.stdout


def test_host_profile_script_runs_on_the_cpu():
    """scripts/host_profile.py (host time of a fused ResNet-50's forwards and chains) keeps working
    where there is no GPU: every line it prints on one is printed here too, but the launch's."""
    script = pathlib.Path(__file__).parents[1] / "scripts" / "host_profile.py"
    args = [sys.executable, str(script), "--device", "cpu", "--batch", "1", "--iters", "1", "--no-compile"]
    done = subprocess.run(args, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    for line in ("eager: host", "fused: host", "chain calls", "chain(x), whole call", "the plan's repeater"):
        assert line in done.stdout, done.stdout


def test_training_step_probe_parses_and_says_it_needs_cuda():
    """scripts/training_step_probe.py (a fused training step's synchronizations, host phases and
    graphed time): its options parse, and without CUDA it says so and exits non-zero."""
    script = pathlib.Path(__file__).parents[1] / "scripts" / "training_step_probe.py"
    shown = subprocess.run([sys.executable, str(script), "--help"], capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0 and "--batch" in shown.stdout, shown.stderr
    done = subprocess.run(
        [sys.executable, str(script), "--batch", "2"], capture_output=True, text=True, timeout=120,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
    )  # fmt: skip
    assert done.returncode != 0 and "needs a CUDA device" in done.stderr, done.stdout + done.stderr


def test_host_profile_times_a_bound_launchs_pieces():
    """host_profile.launch_pieces: the whole launch, the encoder's flat arguments and the C
    launcher alone with them, each called over the call's pointers (a recording stand-in for a
    bound descriptor launch); without an encoder or a C launcher, only what the launch has."""
    import importlib.util

    import torch

    path = pathlib.Path(__file__).parents[1] / "scripts" / "host_profile.py"
    spec = importlib.util.spec_from_file_location("host_profile", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    calls = []

    class Encoder:
        def flat_arguments(self, ptrs):
            calls.append(("flat", ptrs))
            return ["desc", *ptrs]

    class Bound:
        encoder, raw = Encoder(), ("c_launch",)

        def launch(self, ptrs):
            calls.append(("launch", ptrs))

        def _launch_raw(self, flat):
            calls.append(("raw", tuple(flat)))

    x, y = torch.empty(4), torch.empty(4)
    ptrs = (x.data_ptr(), y.data_ptr(), y.data_ptr())
    rows = module.launch_pieces(Bound(), x, y, iters=3)
    assert [name for _, name in rows] == [
        "BoundLaunch.launch",
        "DescriptorEncoder.flat_arguments",
        "the C launcher alone (4 arguments)",
    ]
    assert all(us >= 0 for us, _ in rows)
    assert ("launch", ptrs) in calls and ("flat", ptrs) in calls and ("raw", ("desc", *ptrs)) in calls
    Bound.encoder, Bound.raw = None, None
    assert [name for _, name in module.launch_pieces(Bound(), x, y, iters=3)] == ["BoundLaunch.launch"]


def test_tile_sweep_script_parses_its_options_and_needs_a_gpu():
    """scripts/tile_sweep.py (the sweeps behind the small-grid tiles): options parsed, bad ones
    refused, and on a machine without CUDA a clear refusal instead of a crash."""
    import importlib.util

    import torch

    from fusionplan.runtime import tuning
    from fusionplan.tools.bench.cli import tuning_choices, tuning_override

    path = pathlib.Path(__file__).parents[1] / "scripts" / "tile_sweep.py"
    spec = importlib.util.spec_from_file_location("tile_sweep", path)
    sweep = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sweep)
    assert sweep.parse_tiles("keep,32x64,128x128w8s3,64x64s5,64x64k128w4,128x128w4s6c2") == [
        None,
        (32, 64, None, None, None, None),
        (128, 128, None, 8, 3, None),
        (64, 64, None, None, 5, None),
        (64, 64, 128, 4, None, None),
        (128, 128, None, 4, 6, 2),
    ]
    assert sweep.parse_splits("auto,1,8") == [None, 1, 8]
    assert tuning_override("GLUON_PLANE_CHUNKS_IMAGE_TILES=1") == ("GLUON_PLANE_CHUNKS_IMAGE_TILES", 1)
    assert tuning_override("SPLIT_K_TARGET=114") == ("SPLIT_K_TARGET", 114)
    assert sweep.tuning_choices is tuning_choices  # the script's --tuning parses as fusionplan-bench's
    choices = [tuning_choices("WINDOW_MIN_PROGRAMS=50,100"), tuning_choices("SPLIT_K_TARGET=114")]
    assert choices == [("WINDOW_MIN_PROGRAMS", (50, 100)), ("SPLIT_K_TARGET", (114,))]
    assert tuning.override_combinations(choices) == [
        {"WINDOW_MIN_PROGRAMS": 50, "SPLIT_K_TARGET": 114},
        {"WINDOW_MIN_PROGRAMS": 100, "SPLIT_K_TARGET": 114},
    ]
    assert tuning.override_combinations([]) == [{}]
    for bad in ("NO_SUCH=1", "SPLIT_K_TARGET=x", "WINDOW_CANDIDATES=1"):
        with pytest.raises(Exception, match="constant of fusionplan.runtime.tuning|NAME=NUMBER"):
            tuning_override(bad)
    for bad in ("32by64", "x64", "32x64w", "32x64s3w8", "32x64c2s3"):
        with pytest.raises(Exception, match="expected MxN"):
            sweep.parse_tiles(bad)
    with pytest.raises(Exception, match="positive integer"):
        sweep.parse_splits("0")
    if not torch.cuda.is_available():
        done = subprocess.run([sys.executable, str(path), "--layers", "r50_18"], capture_output=True, text=True)
        assert done.returncode == 2 and "needs a CUDA GPU" in done.stderr


def test_tile_sweep_runs_every_configuration_in_the_interpreter(tmp_path, monkeypatch):
    """The sweep's plumbing (tiles, splits, verification, the timed calls on rotated input sets) on a
    small layer through Triton's interpreter, with a stand-in timer: every configuration computes the
    reference's result."""
    import argparse
    import importlib.util

    from fusionplan.runtime.codegen import interpreter_active

    if not interpreter_active():
        pytest.skip("runs the kernels through Triton's interpreter")
    path = pathlib.Path(__file__).parents[1] / "scripts" / "tile_sweep.py"
    spec = importlib.util.spec_from_file_location("tile_sweep", path)
    sweep = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sweep)
    monkeypatch.setenv("FUSIONPLAN_BACKEND", "triton")
    shapes = tmp_path / "small.csv"
    shapes.write_text("name,C,K,H,W,R,S,stride,pad\nsmall,16,32,6,5,3,3,1,1\n")
    from fusionplan.tools.shapes import load_shapes

    (layer,) = load_shapes(shapes)
    opts = argparse.Namespace(
        batch=1,
        precision="fp32",
        layout="NHWC",
        mode="CBA",
        solver="triton-conv",
        device="cpu",
        tiles=sweep.parse_tiles("keep,32x32,16x16k32w2s2"),
        splits=sweep.parse_splits("auto,1,2"),
    )
    calls = []

    def timer(fn):  # each timed call takes its index, which picks the input set (rotated sets)
        calls.extend(fn(i) for i in (0, 1))
        return 1.0

    rows = sweep.sweep_layer(layer, opts, timer=timer)
    assert len(rows) >= 6 and all(line.endswith(" ok") for _, line in rows), rows
    assert len(calls) == 2 * len(rows)


def test_training_step_probe_profiles_a_fused_step():
    """training_step_probe.profile on the CPU: a fused model's steps under cProfile, the fused
    chains' autograd function among the functions it lists."""
    import importlib.util

    from torch import nn

    from fusionplan.tools.bench.train_models import Trainer
    from fusionplan.torch import fuse

    path = pathlib.Path(__file__).parents[1] / "scripts" / "training_step_probe.py"
    spec = importlib.util.spec_from_file_location("training_step_probe", path)
    probe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(probe)
    layers = nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 36, 4)
    model = nn.Sequential(*layers)
    trainer = Trainer(fuse(model.train()).train(), "fp32", torch.device("cpu"))
    x, label = torch.randn(2, 3, 6, 6), torch.randint(0, 4, (2,))
    trainer.step(x, label)  # the plans compiled
    report = probe.profile(trainer, x, label, steps=2, top=200)
    assert "Python calls a step:" in report
    assert "torch_train.py" in report and "(forward)" in report and "(backward)" in report, report
