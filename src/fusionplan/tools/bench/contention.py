"""Other processes on the GPU: a context manager that keeps ``n`` processes running matrix
products for its duration, so that the GPU switches between their contexts and this one's
(time slicing) while a kernel runs. What lab/time_slice_repro.py and the GPU tests use to check
that a kernel's output does not depend on being interrupted."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from collections.abc import Iterator

#: One load process: fp16 matrix products on its own GPU context until ``seconds`` have passed.
_LOAD = (
    "import torch, time\n"
    "a = torch.randn(4096, 4096, device='cuda', dtype=torch.float16)\n"
    "end = time.time() + {seconds}\n"
    "while time.time() < end:\n"
    "    for _ in range(20):\n"
    "        a = (a @ a).clamp_(-1, 1)\n"
    "    torch.cuda.synchronize()\n"
)


@contextlib.contextmanager
def other_processes_on_the_gpu(
    n: int, seconds: float, start_s: float = 5.0, load: str = _LOAD
) -> Iterator[list[subprocess.Popen]]:
    """Run ``n`` processes of ``load`` (Python source, formatted with ``seconds``: how long each
    may run) for the body's duration, waiting ``start_s`` first for their contexts to come up;
    yields them, and kills them on exit."""
    processes = [subprocess.Popen([sys.executable, "-c", load.format(seconds=seconds)]) for _ in range(n)]
    try:
        time.sleep(start_s)
        yield processes
    finally:
        for process in processes:
            process.kill()
        for process in processes:
            process.wait()
