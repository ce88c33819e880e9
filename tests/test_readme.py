"""The README's supported-fusions table is the one the solvers' rules generate."""

import pathlib
import re

from fusionplan.support import support_table

README = pathlib.Path(__file__).parents[1] / "README.md"


def test_readme_support_table_is_current():
    text = README.read_text()
    match = re.search(r"<!-- support-table -->\n(.*?)\n<!-- /support-table -->", text, re.S)
    assert match, "README.md lost its support-table markers"
    assert match.group(1).strip() == support_table().strip(), "run: python -m fusionplan.support"


def test_readme_commands_are_the_ci_commands():
    ci = (README.parent / ".ci" / "run").read_text()
    assert "./scripts/install.sh && python -m pytest -q" in README.read_text()
    assert "./scripts/install.sh && python -m pytest -q" in ci
