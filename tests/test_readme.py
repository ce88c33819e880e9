"""The README as a user reads it: its snippets run as written, its table is the generated one,
its commands are CI's, and it stays short."""

import os
import pathlib
import re
import subprocess
import sys

import pytest

from fusionplan.tools.support import support_table

ROOT = pathlib.Path(__file__).parents[1]
README = ROOT / "README.md"
SNIPPETS = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)


def test_readme_support_table_is_current():
    text = README.read_text()
    match = re.search(r"<!-- support-table -->\n(.*?)\n<!-- /support-table -->", text, re.S)
    assert match, "README.md lost its support-table markers"
    assert match.group(1).strip() == support_table().strip(), "run: python -m fusionplan.tools.support"


def test_readme_commands_are_the_ci_commands():
    ci = (README.parent / ".ci" / "run").read_text()
    assert "./scripts/install.sh && python -m pytest -q" in README.read_text()
    assert "./scripts/install.sh && python -m pytest -q" in ci


def test_readme_is_short():
    assert len(README.read_text().splitlines()) <= 250


def test_readme_has_snippets():
    assert len(SNIPPETS) >= 3


@pytest.mark.parametrize("index", range(len(SNIPPETS)))
def test_readme_snippet_runs_as_written(index, tmp_path):
    """Each snippet in a fresh interpreter, on the CPU, as a user would paste it."""
    script = tmp_path / f"snippet{index}.py"
    script.write_text(SNIPPETS[index])
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "CUDA_VISIBLE_DEVICES")}
    env["CUDA_VISIBLE_DEVICES"] = ""  # the CPU path, as on a machine without a GPU
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
