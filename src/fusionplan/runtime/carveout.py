"""The shared-memory carve-out a compiled kernel prefers: the smallest that holds as many of its
programs as a multiprocessor holds anyway, the rest of the multiprocessor's memory left to L1
(launch.Launcher applies it to the kernels it loads)."""

from __future__ import annotations

import ctypes
import functools
import logging

import torch

log = logging.getLogger("fusionplan")


#: cuFuncSetAttribute's CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT: the percentage of the
#: multiprocessor's shared memory at most that a kernel prefers as shared memory (the rest is L1).
_CARVEOUT_ATTRIBUTE = 9
#: Shared memory the driver reserves for each program (sm_80 and later).
_DRIVER_SHARED_BYTES = 1024
#: Programs a multiprocessor holds at once at most (sm_80 and later).
_MAX_PROGRAMS = 32


@functools.cache
def _cuda_driver():
    """The CUDA driver library (None where it cannot be loaded)."""
    try:
        return ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None


def carveout_percent(shared: int, multiprocessor_shared: int, programs: int = 1) -> int:
    """The smallest carve-out, in percent of ``multiprocessor_shared``, that holds ``programs``
    programs of ``shared`` bytes and the driver's reservation each (the driver rounds up to a size
    it has)."""
    need = programs * (shared + _DRIVER_SHARED_BYTES)
    return max(1, min(100, -(-need * 100 // multiprocessor_shared)))


def programs_per_multiprocessor(threads: int, registers: int, shared: int, props) -> int:
    """Programs of ``threads`` threads, ``registers`` a thread and ``shared`` bytes that a
    multiprocessor of ``props`` (torch's device properties) holds at once with the largest
    carve-out: what its threads, its register file (256 registers a warp at a time) and its shared
    memory allow, at least 1."""
    warps = -(-threads // 32)
    warp_registers = -(-max(registers, 1) * 32 // 256) * 256
    by_registers = getattr(props, "regs_per_multiprocessor", 65536) // (warp_registers * warps)
    by_threads = getattr(props, "max_threads_per_multi_processor", 2048) // (warps * 32)
    total = getattr(props, "shared_memory_per_multiprocessor", 0)
    by_shared = total // (shared + _DRIVER_SHARED_BYTES) if total else 1
    return max(1, min(by_registers, by_threads, by_shared, _MAX_PROGRAMS))


def fit_shared_carveout(kernel) -> None:
    """Let a compiled kernel prefer the smallest shared-memory carve-out that holds as many of its
    programs as a multiprocessor holds anyway (programs_per_multiprocessor; carveout_percent), the
    rest of the multiprocessor's memory L1. Triton asks for the most shared memory for every kernel
    of over 48 KB (cache config PREFER_SHARED), leaving 28 KB of L1 on an H100: too little for a
    kernel whose asynchronous copies land in L1 on their way. A hint: where the driver cannot take
    it, the kernel runs as Triton loaded it."""
    driver = _cuda_driver()
    if driver is None:
        return
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    total = getattr(props, "shared_memory_per_multiprocessor", 0)
    if not total:
        return
    shared = int(kernel.metadata.shared)
    threads = int(kernel.metadata.num_warps) * 32  # every partition's warps (Triton counts them all)
    programs = programs_per_multiprocessor(threads, int(getattr(kernel, "n_regs", 0) or 0), shared, props)
    percent = carveout_percent(shared, total, programs)
    status = driver.cuFuncSetAttribute(ctypes.c_void_p(kernel.function), _CARVEOUT_ATTRIBUTE, percent)
    if status:
        log.warning("the kernel's shared-memory carve-out (%d %%) was refused: CUDA error %d", percent, status)
