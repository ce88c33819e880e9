"""The driver: every fusion mode, dtype and layout verifies; bad input exits 2 with the reason."""

import pytest

from fusionplan.tools.driver import FUSION_MODES, build_parser, main

SMALL = ["-n", "2", "-c", "3", "-k", "17", "-H", "13", "-W", "11", "-i", "2"]


@pytest.mark.parametrize("mode", list(FUSION_MODES))
@pytest.mark.parametrize("command", ["CBAInfer", "CBAInferfp16", "CBAInferbfp16"])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_every_mode_verifies(mode, command, layout, capsys):
    assert main([command, "-F", str(mode), "--layout", layout, *SMALL]) == 0
    out = capsys.readouterr().out
    assert "Verifies OK" in out and f"({FUSION_MODES[mode]})" in out


@pytest.mark.parametrize(
    "extra",
    [
        ["-u", "2", "-v", "2", "-l", "2", "-j", "2", "-p", "2", "-q", "0"],
        ["-c", "8", "-k", "8", "-g", "8"],
        ["-c", "6", "-k", "9", "-g", "3", "-y", "1", "-x", "5", "-q", "2"],
        ["-m", "6", "-A", "0.5", "-B", "0.8", "-G", "2"],
        ["-m", "7", "-A", "0.6", "-M", "1"],
        ["-m", "2", "-A", "0.7", "-B", "1.3"],
    ],
)
def test_shape_and_activation_flags(extra, capsys):
    assert main(["CBAInfer", *SMALL, *extra]) == 0
    assert "Verifies OK" in capsys.readouterr().out


def test_timing_prints_fused_unfused_and_speedup(capsys):
    assert main(["CBAInfer", "-t", "1", *SMALL]) == 0
    out = capsys.readouterr().out
    assert "Fused (cpu-folded)" in out and "Unfused" in out and "Speedup" in out


def test_backend_flag(capsys):
    assert main(["CBAInfer", "--backend", "reference", *SMALL]) == 0
    assert "solver: reference" in capsys.readouterr().out


def test_default_is_a_resnet50_layer():
    opts = build_parser().parse_args(["CBAInfer"])
    assert (opts.shape_c, opts.shape_k, opts.shape_H, opts.shape_y, opts.shape_p) == (128, 128, 28, 3, 1)
    assert (opts.activ_mode, opts.activ_alpha, opts.activ_beta, opts.activ_gamma, opts.bn_mode) == (3, 1.0, 0.0, 1.0, 0)
    assert (opts.verify, opts.time) == (1, 0)


@pytest.mark.parametrize(
    "argv, reason",
    [
        (["CBAInfer", "-c", "6", "-g", "4"], "not divisible by groups"),
        (["CBAInfer", "-H", "2", "-W", "2", "-p", "0", "-q", "0"], "empty"),
        (["CBAInfer", "--device", "tpu"], "device"),
    ],
)
def test_refused_plans_exit_2_with_reason(argv, reason, capsys):
    assert main(argv) == 2
    assert reason in capsys.readouterr().err


def test_driver_console_script_runs():
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "fusionplan.tools.driver", "CBAInferfp16", "-F", "2", *SMALL],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "Verifies OK" in done.stdout
