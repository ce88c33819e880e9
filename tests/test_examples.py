"""The seeds' examples, ported line for line, run as scripts."""

import pathlib
import subprocess
import sys

import pytest

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
