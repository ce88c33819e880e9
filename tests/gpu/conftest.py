"""Fixtures of every GPU test: FUSIONPLAN_BACKEND=triton (nothing falls back silently), and a
GPU with room for tensors of several gigabytes."""

from __future__ import annotations

import os

import pytest
import torch


@pytest.fixture(autouse=True)
def triton_only(monkeypatch):
    monkeypatch.setenv("FUSIONPLAN_BACKEND", "triton")


@pytest.fixture
def gigabytes():
    """For tests of several GB each: a lock of the host's, so that parallel workers (pytest -n)
    run them one at a time (four at once exhaust an 80 GB GPU), each worker's cached memory handed
    back before the next one starts."""
    import fcntl
    import tempfile

    with open(os.path.join(tempfile.gettempdir(), "fusionplan-gpu-tests-gigabytes.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            fcntl.flock(lock, fcntl.LOCK_UN)
