"""Without a GPU, Triton kernels run through Triton's interpreter. Triton reads the flag when it
is first imported (its own library functions are decorated then), so it is set here, before any
test module imports it. The CPU solver still comes first on CPU handles; tests that want the
Triton kernels ask for them with FUSIONPLAN_BACKEND=triton.

The tests never write into the user's cache: the whole run (pytest-xdist's workers inherit the
variable) uses one temporary cache directory, removed at the end, or FUSIONPLAN_TEST_CACHE_DIR
where that is set (a GPU host keeping its compiled kernels from one run to the next). Without a
GPU, the tests marked ``gpu`` are deselected rather than reported as skips."""

import os
import shutil
import tempfile
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

_RUN_CACHE = "FUSIONPLAN_TESTS_RUN_CACHE"  # the run's temporary directory, for its workers and children
_MADE_HERE: str | None = None  # removed at the end by the process that made it, and only by it
if "FUSIONPLAN_TEST_CACHE_DIR" in os.environ:
    os.environ["FUSIONPLAN_CACHE_DIR"] = os.environ["FUSIONPLAN_TEST_CACHE_DIR"]
elif _RUN_CACHE in os.environ:  # a pytest-xdist worker, or a test's own pytest run
    os.environ["FUSIONPLAN_CACHE_DIR"] = os.environ[_RUN_CACHE]
else:
    _MADE_HERE = os.environ["FUSIONPLAN_CACHE_DIR"] = os.environ[_RUN_CACHE] = tempfile.mkdtemp(
        prefix="fusionplan-tests-"
    )
os.environ.pop("TRITON_CACHE_DIR", None)  # Triton's cache inside the tests' cache directory too


def pytest_addoption(parser):
    parser.addoption(
        "--part",
        default=None,
        metavar="K/N",
        help="run only the K-th of N parts (1-based) of the selected tests, every N-th in collection "
        "order (so each part takes a share of every parametrized test): a suite too long for one run "
        "split over N runs",
    )
    parser.addoption(
        "--record",
        default=None,
        metavar="FILE",
        help="append to FILE the id of each test that ends with no phase failed (passed or skipped), as it "
        "ends: with --done, a run cut short by a time limit goes on where it stopped",
    )
    parser.addoption(
        "--done",
        default=None,
        metavar="FILE",
        help="deselect the tests FILE lists (a --record file of an earlier run of the same code); a FILE "
        "not there yet deselects none",
    )


def pytest_unconfigure(config):
    if _MADE_HERE:
        shutil.rmtree(_MADE_HERE, ignore_errors=True)


def pytest_configure(config):
    record = config.getoption("--record")
    if record and not hasattr(config, "workerinput"):  # pytest-xdist's workers: their reports reach the main process
        config.pluginmanager.register(RecordOfEnded(record), "fusionplan-record")


@pytest.hookimpl(trylast=True)  # after -m and -k have deselected theirs
def pytest_collection_modifyitems(config, items):
    if not torch.cuda.is_available():
        keep([item for item in items if item.get_closest_marker("gpu") is None], items, config)
    part = config.getoption("--part")
    if part:  # before --done, so that a part holds the same tests in every run of it
        k, n = parse_part(part)
        keep([item for i, item in enumerate(items) if i % n == k - 1], items, config)
    done = config.getoption("--done")
    if done:
        ended = set(Path(done).read_text().splitlines()) if Path(done).exists() else set()
        keep([item for item in items if item.nodeid not in ended], items, config)
    slow_first(items)


def slow_first(items: list) -> None:
    """The tests marked slow (a minute or more each: many kernels compiled one after another) moved ahead of
    the others, each group in its own order. With pytest-xdist's ``--maxschedchunk 1`` (the GPU
    scripts) each worker is handed two tests, then one more as each ends: the slow ones start on
    every worker at once and the short ones fill in around them, instead of a few slow ones at a
    part's end running alone for minutes. (By default xdist hands out runs of consecutive tests,
    which would give the slow ones to a few workers.)"""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


def keep(kept: list, items: list, config) -> None:
    """Narrow ``items`` to ``kept``, reporting the others as deselected."""
    ids = {id(item) for item in kept}
    config.hook.pytest_deselected(items=[item for item in items if id(item) not in ids])
    items[:] = kept


class RecordOfEnded:
    """--record: the id of each test whose setup, call and teardown all ended without failing,
    appended to a file when its teardown ends (one line each, flushed at once, so that a run killed
    by a time limit keeps what it finished)."""

    def __init__(self, path: str) -> None:
        self.path = Path(path)
        self.failed: set[str] = set()

    def pytest_runtest_logreport(self, report) -> None:
        if report.failed:
            self.failed.add(report.nodeid)
        elif report.when == "teardown" and report.nodeid not in self.failed:
            with self.path.open("a") as f:
                f.write(report.nodeid + "\n")


def parse_part(text: str) -> tuple[int, int]:
    """'2/5' -> (2, 5); a usage error naming the option for anything else."""
    try:
        k, n = (int(v) for v in text.split("/"))
    except ValueError:
        raise pytest.UsageError(f"--part {text!r}: expected K/N, e.g. 1/4") from None
    if not 1 <= k <= n:
        raise pytest.UsageError(f"--part {text!r}: K must be between 1 and N")
    return k, n
