"""Without a GPU, Triton kernels run through Triton's interpreter. Triton reads the flag when it
is first imported (its own library functions are decorated then), so it is set here, before any
test module imports it. The CPU solver still comes first on CPU handles; tests that want the
Triton kernels ask for them with FUSIONPLAN_BACKEND=triton."""

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_addoption(parser):
    parser.addoption(
        "--part",
        default=None,
        metavar="K/N",
        help="run only the K-th of N parts (1-based) of the selected tests, every N-th in collection "
        "order (so each part takes a share of every parametrized test): a suite too long for one run "
        "split over N runs",
    )


@pytest.hookimpl(trylast=True)  # after -m and -k have deselected theirs
def pytest_collection_modifyitems(config, items):
    part = config.getoption("--part")
    if not part:
        return
    k, n = parse_part(part)
    kept = [item for i, item in enumerate(items) if i % n == k - 1]
    config.hook.pytest_deselected(items=[item for i, item in enumerate(items) if i % n != k - 1])
    items[:] = kept


def parse_part(text: str) -> tuple[int, int]:
    """'2/5' -> (2, 5); a usage error naming the option for anything else."""
    try:
        k, n = (int(v) for v in text.split("/"))
    except ValueError:
        raise pytest.UsageError(f"--part {text!r}: expected K/N, e.g. 1/4") from None
    if not 1 <= k <= n:
        raise pytest.UsageError(f"--part {text!r}: K must be between 1 and N")
    return k, n
