"""fusionplan-bench on the CPU: options documented, outputs written, wrong results never timed."""

import json

import pytest
import torch

import fusionplan as fp
from fusionplan.tools.bench import cases as bench_cases
from fusionplan.tools.bench.cli import build_parser, main

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
    summary = (out / "summary.md").read_text()
    assert "Geometric means" in summary
    # the CPU's small peaks in significant digits (not "0 TFLOP/s"), the time over the floor apart
    # from the speed-ups
    assert " 0 TFLOP/s" not in summary and " 0 GB/s" not in summary and "vs time_over_floor" not in summary
    assert "time/floor" in summary
    # the NCHW target's number: CBNA and CBA timed in both layouts (NA, a pointwise chain, too)
    ratios = data["layout_ratios"]
    assert set(ratios) == {"fp32 CBNA", "fp32 CBA", "fp32 NA"} and all(r["layers"] == 2 for r in ratios.values())
    for key, r in ratios.items():
        fused = {
            (row["layer"], row["layout"]): row["fused_ms"]
            for row in data["rows"]
            if f"{row['precision']} {row['mode']}" == key
        }
        per_layer = [fused[(layer, "NCHW")] / fused[(layer, "NHWC")] for layer in ("r50_01", "r50_22")]
        assert r["nchw_over_nhwc"] == pytest.approx((per_layer[0] * per_layer[1]) ** 0.5)
        assert f"NCHW time over NHWC time, {key}: {r['nchw_over_nhwc']:.3f}x" in text and key in summary
    pngs = sorted(p.name for p in out.glob("*.png"))
    assert "speedup_fused_vs_unfused.png" in pngs and "bandwidth_bn_activation.png" in pngs


def test_training_suite_on_the_cpu(tmp_path, capsys, monkeypatch):
    """--suite training: the training plans verified and timed beside eager PyTorch, written out;
    every shape of the packaged models is a distinct batch-norm layer with its count."""
    from fusionplan.tools.bench.training import model_layers

    monkeypatch.delenv("FUSIONPLAN_BACKEND", raising=False)
    layers = model_layers(["resnet50", "mobilenet_v2", "densenet121"])
    assert {
        m: sum(layer.count for layer in layers if layer.model == m) for m in ("resnet50", "mobilenet_v2", "densenet121")
    } == {
        "resnet50": 53,
        "mobilenet_v2": 52,
        "densenet121": 121,
    }
    argv = [
        "--suite",
        "training",
        "--device",
        "cpu",
        "--batch",
        "2",
        "--iters",
        "1",
        "--warmup",
        "0",
        "--baselines",
        "eager",
        "--layouts",
        "NHWC,NCHW",
        "--shard",
        "1/8",
        "--out",
        str(tmp_path),
    ]
    assert main(argv) == 0
    data = json.loads((tmp_path / "training.json").read_text())
    assert len(data["rows"]) == 3
    for row in data["rows"]:
        assert set(row["forward_us"]) == set(row["backward_us"]) == {"fused", "eager"}
        assert row["errors"] == {"solvers": "cpu-training/cpu-training"}
    assert "| resnet50 | 2 | fp32 |" in (tmp_path / "training.md").read_text()
    assert main(["--suite", "training", "--device", "cpu", "--models", "vgg"]) == 2


def test_training_tuning_columns_compile_under_their_values(tmp_path, monkeypatch):
    """--suite training --tuning NAME=V: each column's plans built under the value, on a handle of
    their own (a handle keeps the kernels it built, whatever the constants are later)."""
    from fusionplan.runtime import tuning
    from fusionplan.tools.bench import training

    monkeypatch.delenv("FUSIONPLAN_BACKEND", raising=False)
    seen = []
    for name in ("forward_plan", "backward_plan"):
        original = getattr(training._CaseRun, name)

        def spy(self, original=original):
            seen.append((tuning.BATCHNORM_ONE_LAUNCH, self.handle.uid))
            return original(self)

        monkeypatch.setattr(training._CaseRun, name, spy)
    argv = ["--suite", "training", "--device", "cpu", "--batch", "2", "--iters", "1", "--warmup", "0"]
    argv += ["--baselines", "none", "--layouts", "NCHW", "--shard", "1/60", "--out", str(tmp_path)]
    assert main([*argv, "--tuning", "BATCHNORM_ONE_LAUNCH=0,1"]) == 0
    row = json.loads((tmp_path / "training.json").read_text())["rows"][0]
    assert set(row["forward_us"]) == {"fused", "tuning:BATCHNORM_ONE_LAUNCH=0", "tuning:BATCHNORM_ONE_LAUNCH=1"}
    assert [v for v, _ in seen] == [-1, 0, 1, -1, 0, 1]
    assert len({uid for _, uid in seen[:3]}) == 3 and tuning.BATCHNORM_ONE_LAUNCH == -1


def test_statistics_mode_times_against_eagers_statistics(tmp_path):
    """--modes CS: the convolution emitting its batch-norm statistics, beside eager's conv and
    torch.var_mean with the running update; checked and timed like any chain."""
    out = tmp_path / "run"
    assert main([*SMALL, "--modes", "C,CS", "--layouts", "NHWC", "--out", str(out), "--no-plots"]) == 0
    rows = json.loads((out / "results.json").read_text())["rows"]
    assert {row["mode"] for row in rows} == {"C", "CS"}
    assert all(row["errors"] == "" and row["fused_ms"] > 0 and row["eager_ms"] > 0 for row in rows), rows


def test_eager_chain_takes_the_statistics_as_a_training_batch_norm():
    from fusionplan.tools.bench.cases import EagerChain
    from fusionplan.tools.verify import add_chain, random_args

    x = torch.randn(2, 4, 6, 6)
    plan = add_chain(fp.FusionPlan(fp.TensorDescriptor.from_tensor(x)), "CS", k=8, r=3, s=3)
    args = random_args(plan)
    rec = args.get(plan.ops[-1])
    running = rec.running_mean.clone(), rec.running_variance.clone()
    y = EagerChain(plan, args)(x)
    h = torch.nn.functional.conv2d(x, args.get(plan.ops[0]).weight)
    torch.testing.assert_close(y, h)
    bn = torch.nn.BatchNorm2d(8, momentum=rec.exp_avg_factor, eps=rec.epsilon).train()
    bn.running_mean.copy_(running[0].flatten()), bn.running_var.copy_(running[1].flatten())
    bn(h)
    torch.testing.assert_close(rec.running_mean.flatten(), bn.running_mean)
    torch.testing.assert_close(rec.running_variance.flatten(), bn.running_var)
    torch.testing.assert_close(rec.saved_mean.flatten(), h.mean((0, 2, 3)))


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


def test_a_solver_whose_kernel_does_not_build_fails_its_column_only(monkeypatch, tmp_path):
    """A solver that cannot build its kernel here (a tile too large for the device): the plan goes
    to the next solver, that solver's column records the failure, the case is still timed."""
    from fusionplan import solvers
    from fusionplan.solvers.cpu_folded import CpuFoldedSolver

    def out_of_resources(self, spec, handle):
        raise RuntimeError("out of resource: shared memory")

    # the CPU solvers only: Triton's interpreter (on in the tests) would take the plan next, slowly
    monkeypatch.setattr(solvers, "REGISTRY", [s for s in solvers.REGISTRY if s.family != "triton"])
    monkeypatch.setattr(CpuFoldedSolver, "build", out_of_resources)
    argv = [*SMALL, "--layers", "r50_22", "--modes", "CBA", "--batch", "1", "--out", str(tmp_path), "--no-plots"]
    assert main(argv) == 0  # reported, not a wrong result
    row = json.loads((tmp_path / "results.json").read_text())["rows"][0]
    assert row["solver"] == "reference" and row["fused_ms"] > 0
    assert "solver:cpu-folded: InternalError" in row["errors"] and "out of resource" in row["errors"]
    assert "solver:cpu-folded_ms" not in row


def test_bad_options_are_refused(capsys):
    """Exit status 2 and the reason on stderr, as the driver's."""
    assert main(["--device", "cpu", "--precisions", "fp8"]) == 2
    assert main(["--device", "cpu", "--layers", "r50_99"]) == 2
    assert main(["--device", "cpu", "--shard", "3/2"]) == 2
    assert main(["--device", "cpu", "--shard", "one/two"]) == 2
    assert main(["--device", "cpu", "--activation", "bogus"]) == 2
    assert main(["--device", "cpu", "--baselines", "tensorrt"]) == 2
    assert main(["--device", "cpu", "--rounds", "0"]) == 2
    assert main(["--device", "cpu", "--iters", "-1"]) == 2
    assert "--rounds must be at least 1" in capsys.readouterr().err


def test_rounds_interleave_the_variants(monkeypatch, tmp_path):
    """--rounds 3: every verified variant is timed once per round, the variants taking turns, and
    its time is the median of its three rounds."""
    from fusionplan.tools.bench import runner

    calls = []
    fake_ms = iter(range(1, 1000))

    def fake_median_ms(fn, device, iters, warmup, graph=False):
        calls.append((fn, iters))
        return float(next(fake_ms))

    monkeypatch.setattr(runner, "median_ms", fake_median_ms)
    argv = [*SMALL, "--layers", "r50_22", "--modes", "CBA", "--iters", "7", "--rounds", "3"]
    assert main([*argv, "--out", str(tmp_path), "--no-plots"]) == 0
    row = json.loads((tmp_path / "results.json").read_text())["rows"][0]
    timed = [k[: -len("_ms")] for k in row if k.endswith("_ms") and k not in ("fused_ms", "floor_ms")]
    n = 1 + len(timed)  # fused and every other variant
    assert len(calls) == 3 * n and all(iters == 3 for _, iters in calls)  # 7 runs in 3 rounds: 3 each
    order = [fn for fn, _ in calls]
    assert order[:n] == order[n : 2 * n] == order[2 * n :] and len(set(order[:n])) == n  # turns, each round
    assert row["fused_ms"] == float(1 + n)  # the median of its rounds' values (1, 1 + n, 1 + 2n)


def test_packaged_depthwise_shapes_run_as_depthwise_plans(capsys):
    from fusionplan.tools.bench.cases import Case, build_plan
    from fusionplan.tools.shapes import load_shapes

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


def test_tuning_columns_run_the_plan_under_their_values(monkeypatch, tmp_path):
    """--tuning NAME=V1,V2: a column per value beside the defaults' 'fused', each compiled and run
    with the constant set (and only then: the defaults stay for 'fused' and after the run);
    bad names and values are refused."""
    import fusionplan as fp
    from fusionplan.runtime import tuning

    seen = []
    execute = fp.FusionPlan.execute

    def spy(self, *args, **kwargs):
        seen.append(tuning.WINDOW_MIN_CHANNELS)
        return execute(self, *args, **kwargs)

    monkeypatch.setattr(fp.FusionPlan, "execute", spy)
    default = tuning.WINDOW_MIN_CHANNELS
    argv = [*SMALL, "--layers", "r50_22", "--modes", "CBA", "--baselines", "none", "--no-plots"]
    assert main([*argv, "--tuning", "WINDOW_MIN_CHANNELS=64,256", "--out", str(tmp_path)]) == 0
    row = json.loads((tmp_path / "results.json").read_text())["rows"][0]
    assert row["tuning:WINDOW_MIN_CHANNELS=64_ms"] > 0 and row["tuning:WINDOW_MIN_CHANNELS=256_ms"] > 0
    assert row["errors"] == "" and {64, 256, default} <= set(seen) and tuning.WINDOW_MIN_CHANNELS == default
    for bad in ("NO_SUCH=1", "WINDOW_MIN_CHANNELS=x", "CONV_CANDIDATES=1"):
        with pytest.raises(SystemExit):
            main([*argv, "--tuning", bad])


def test_part_option_splits_the_selected_tests(tmp_path):
    """`pytest --part K/N` (tests/conftest.py): every N-th selected test from the K-th, the parts
    together the whole selection once; a malformed part is a usage error naming the option."""
    tests = tmp_path / "test_many.py"
    tests.write_text(
        "import pytest\n\n@pytest.mark.parametrize('i', range(7), ids=lambda i: f'case{i}')\n"
        "def test_one(i):\n    print('RAN', i)\n"
    )

    def ran(*options: str) -> list[int]:
        return [int(i) for i in run_pytest_on(tests, *options)[1]]

    parts = [ran("--part", f"{k}/3") for k in (1, 2, 3)]
    assert parts == [[0, 3, 6], [1, 4], [2, 5]]
    # of the selection 0 1 2 4 5 6 ("-k" also matches the test's folders: an id no folder has)
    assert ran("-k", "not case3", "--part", "1/2") == [0, 2, 5]
    code, _ = run_pytest_on(tests, "--part", "4/3")
    assert code == 4  # pytest's usage error


def run_pytest_on(test_file, *options: str) -> tuple[int, list[str]]:
    """The exit code of `pytest -p tests.conftest -s` on ``test_file`` with ``options`` (run from the
    repository, so that the conftest's options exist) and the last word of each line its tests
    printed after "RAN", in order."""
    import subprocess
    import sys
    from pathlib import Path

    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "tests.conftest", "-q", "-s", "-p", "no:cacheprovider"]
        + ["-p", "no:randomly", str(test_file), *options],
        cwd=Path(__file__).resolve().parents[1],
        capture_output=True,
        text=True,
        timeout=120,
    )
    return done.returncode, [line.split()[-1] for line in done.stdout.splitlines() if "RAN " in line]


#: Six cases: case2 fails, case3 skips, case4 kills the process the first time it runs (a run cut
#: short by a time limit), as a marker file beside the tests says.
RESUMED_TESTS = """import os, pathlib, pytest

@pytest.mark.parametrize("i", range(6), ids=lambda i: f"case{i}")
def test_one(i):
    print("RAN", f"case{i}")
    if i == 2:
        assert False
    if i == 3:
        pytest.skip("skipped")
    marker = pathlib.Path(__file__).with_name("killed-once")
    if i == 4 and not marker.exists():
        marker.touch()
        os._exit(3)
"""


def test_record_and_done_go_on_where_a_cut_run_stopped(tmp_path):
    """`pytest --record F` (tests/conftest.py) appends each test that ended without failing (passed
    or skipped) as it ends, so a run killed midway keeps what it finished; `--done F` deselects
    those, so the next run takes the rest and the failures again; with --part, the part is chosen
    first, so that it holds the same tests in every run."""
    tests = tmp_path / "test_resumed.py"
    tests.write_text(RESUMED_TESTS)
    record = tmp_path / "ended.txt"
    options = ("--record", str(record), "--done", str(record))

    def ran(*options: str) -> list[str]:
        return run_pytest_on(tests, *options)[1]

    assert ran(*options) == ["case0", "case1", "case2", "case3", "case4"]  # killed in case4
    ended = [line.split("::")[-1] for line in record.read_text().splitlines()]
    assert ended == ["test_one[case0]", "test_one[case1]", "test_one[case3]"]
    assert ran(*options) == ["case2", "case4", "case5"]
    assert ran(*options) == ["case2"]  # the failure, each time
    record.write_text(record.read_text().splitlines()[0] + "\n")  # case0 alone
    assert ran("--part", "1/2", "--done", str(record)) == ["case2", "case4"]


def test_record_of_parallel_workers_is_written_once(tmp_path):
    """With pytest-xdist's workers the main process writes the record, each test once."""
    pytest.importorskip("xdist")
    tests = tmp_path / "test_resumed.py"
    tests.write_text(RESUMED_TESTS)
    (tmp_path / "killed-once").touch()  # case4 passes
    record = tmp_path / "ended.txt"
    run_pytest_on(tests, "-n", "2", "--record", str(record))
    ended = sorted(line.split("::")[-1] for line in record.read_text().splitlines())
    assert ended == [f"test_one[case{i}]" for i in (0, 1, 3, 4, 5)]


SLOW_AND_SHORT_TESTS = """import pytest

@pytest.mark.parametrize("i", range(3), ids=lambda i: f"short{i}")
def test_short(i):
    print("RAN", f"short{i}")

@pytest.mark.slow
@pytest.mark.parametrize("i", range(3), ids=lambda i: f"slow{i}")
def test_slow(i):
    print("RAN", f"slow{i}")
"""


def test_slow_tests_run_first_within_their_part(tmp_path):
    """Tests marked slow run ahead of the others, each group in collection order (so that pytest-xdist
    starts them on every worker at once, not at a part's end); --part still chooses from collection
    order, so a part holds the same tests as before."""
    tests = tmp_path / "test_slow_and_short.py"
    tests.write_text(SLOW_AND_SHORT_TESTS)
    assert run_pytest_on(tests)[1] == ["slow0", "slow1", "slow2", "short0", "short1", "short2"]
    assert run_pytest_on(tests, "--part", "1/2")[1] == ["slow1", "short0", "short2"]


def test_slow_tests_start_on_every_worker(tmp_path):
    """With pytest-xdist and --maxschedchunk 1 (scripts/gpu_suite.sh, gpu_check.sh) every worker
    starts with slow tests, two each; by default one worker takes all of them."""
    pytest.importorskip("xdist")
    tests = tmp_path / "test_slow_and_short.py"
    tests.write_text(
        "import os, pathlib, pytest\n\n"
        "def note(name):\n"
        "    with pathlib.Path(__file__).with_name('order.txt').open('a') as f:\n"
        "        f.write(os.environ['PYTEST_XDIST_WORKER'] + ' ' + name + '\\n')\n\n"
        "@pytest.mark.parametrize('i', range(40))\n"
        "def test_short(i):\n"
        "    note('short')\n\n"
        "@pytest.mark.slow\n"
        "@pytest.mark.parametrize('i', range(4))\n"
        "def test_slow(i):\n"
        "    note('slow')\n"
    )

    def slow_ones_by_worker(*options: str) -> list[int]:
        """How many slow tests each worker ran, fewest first (its first two, then what it ran after)."""
        (tmp_path / "order.txt").unlink(missing_ok=True)
        run_pytest_on(tests, "-n", "2", *options)
        ran: dict[str, list[str]] = {}
        for line in (tmp_path / "order.txt").read_text().splitlines():
            worker, name = line.split()
            ran.setdefault(worker, []).append(name)
        assert all(names[0] == "slow" or "slow" not in names for names in ran.values())  # slow ones first
        return sorted(names.count("slow") for names in ran.values())

    assert slow_ones_by_worker("--maxschedchunk", "1") == [2, 2]
    assert slow_ones_by_worker() == [0, 4]  # whichever worker is first takes the first five tests


def test_other_processes_run_for_the_body_and_are_killed_after():
    """The load processes of fusionplan.tools.bench.contention (here a sleep, no GPU needed) run
    while the body does and are gone after it, even when it raises."""
    from fusionplan.tools.bench.contention import other_processes_on_the_gpu

    sleeper = "import time\ntime.sleep({seconds})\n"
    with pytest.raises(RuntimeError), other_processes_on_the_gpu(2, 60, start_s=0, load=sleeper) as processes:
        assert len(processes) == 2 and all(p.poll() is None for p in processes)
        raise RuntimeError("the body fails")
    assert all(p.poll() is not None for p in processes)


def test_find_column_runs_the_plan_as_find_chose(tmp_path, monkeypatch):
    """--baselines find: the plan compiled in find mode NORMAL, a column beside fused, its output
    checked like every column's."""
    monkeypatch.delenv("FUSIONPLAN_BACKEND", raising=False)
    monkeypatch.setenv("FUSIONPLAN_CACHE_DIR", str(tmp_path / "cache"))
    argv = [*SMALL, "--layers", "r50_22", "--modes", "CBA", "--baselines", "find,eager", "--no-plots"]
    assert main([*argv, "--out", str(tmp_path)]) == 0
    row = json.loads((tmp_path / "results.json").read_text())["rows"][0]
    assert row["find_ms"] > 0 and row["eager_ms"] > 0 and row["errors"] == ""
    assert "find ms" in (tmp_path / "summary.md").read_text()
