"""Probe: which synchronization after a stage's shared-memory stores drains the loads a gathering
thread has in flight for later stages (Gluon, Triton 3.6; CUDA only).

    python lab/probes/drain_probe.py [--programs-per-sm 1,2] [--rows 256,512]

gluon-nchw's gathering warps load a step's input two or three steps ahead, store the step they
hold to shared memory, then fence (fence_async_shared: wgmma reads the stage through the async
proxy), join their partition's barrier and arrive on the stage's mbarrier. Section 21 of
lab/NOTES.md took the fence's MEMBAR.ALL.CTA to wait for every load the thread has in flight
(deeper prefetching measured no faster), and `lab/l2_loads_probe.py` shows that bytes in
flight set the rate such loads reach. This probe measures whether the fence, or the other
synchronizations a hand-over could use, drains the loads ahead (section 48: it does not).

The kernel: every thread loads a [ROWS, 8] tile of 2-byte elements (lanes on neighbouring rows,
8 columns ROWS elements apart, as the gathers' pixels and channels) two iterations ahead of the
iteration that stores it to shared memory, then synchronizes by SYNC: 0 nothing, 1 the gathers'
fence and barrier, 2 the barrier alone (bar.sync), 3 an mbarrier arrive alone, 4 the barrier and
an mbarrier arrive (a hand-over without the proxy fence). Prints GB/s for each: where a
synchronization drains the loads, its rate falls to about that of a single step in flight.
"""

from __future__ import annotations

import argparse

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier

from fusionplan.tools.bench.timing import median_ms

#: The barrier of a program's warps (3.6: thread_barrier; later: barrier).
warps_barrier = gl.barrier if hasattr(gl, "barrier") else gl.thread_barrier

SYNCS = {
    0: "nothing",
    1: "fence_async_shared + barrier (gluon-nchw)",
    2: "barrier (bar.sync)",
    3: "mbarrier arrive",
    4: "barrier + mbarrier arrive",
}


@gluon.jit
def _handed_over(v):
    # an opaque copy: the values are packed for their store where the store is, not where loaded
    return gl.inline_asm_elementwise("mov.b16 $0, $1;", "=h,h", [v], dtype=v.dtype, is_pure=False, pack=1)


@gluon.jit
def drain_kernel(x_ptr, out_ptr, n_tiles, shift, ITERS: gl.constexpr, ROWS: gl.constexpr, SYNC: gl.constexpr):
    layout: gl.constexpr = gl.BlockedLayout([1, 8], [32, 1], [gl.num_warps(), 1], [1, 0])
    rows = gl.arange(0, ROWS, layout=gl.SliceLayout(1, layout))[:, None]
    cols = gl.arange(0, 8, layout=gl.SliceLayout(0, layout))[None, :]
    offs = rows + cols * ROWS + shift  # shift: a runtime value, no alignment to use (2-byte loads)
    flat: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
    bufs = gl.allocate_shared_memory(gl.int16, [2, ROWS, 8], flat)
    bar = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
    mbarrier.init(bar.index(0), count=1)
    pid = gl.program_id(0)
    programs = gl.num_programs(0)
    v0 = gl.load(x_ptr + (pid % n_tiles) * (ROWS * 8) + offs)
    v1 = gl.load(x_ptr + ((programs + pid) % n_tiles) * (ROWS * 8) + offs)
    for it in range(ITERS):
        v2 = gl.load(x_ptr + (((it + 2) * programs + pid) % n_tiles) * (ROWS * 8) + offs)
        bufs.index(it % 2).store(_handed_over(v0))
        if SYNC == 1:
            fence_async_shared()
        if SYNC == 1 or SYNC == 2 or SYNC == 4:
            warps_barrier()
        if SYNC == 3 or SYNC == 4:
            mbarrier.arrive(bar.index(0))
        v0 = v1
        v1 = v2
    warps_barrier()
    mbarrier.invalidate(bar.index(0))
    total = bufs.index(0).load(layout).to(gl.int32) + v0.to(gl.int32) + v1.to(gl.int32)
    gl.store(out_ptr + pid, gl.sum(gl.sum(total, 1), 0))


def gbps(x, out, programs: int, warps: int, rows: int, sync: int, iters: int, repeats: int) -> float:
    """GB/s of loaded bytes (median of ``repeats`` launches, CUDA events)."""
    n_tiles = (x.numel() - 64) // (rows * 8)

    def launch():
        drain_kernel[(programs,)](x, out, n_tiles, 1, ITERS=iters, ROWS=rows, SYNC=sync, num_warps=warps)

    launch()
    seconds = median_ms(lambda i: launch(), torch.device("cuda"), repeats, warmup=1) / 1e3
    return programs * (iters + 2) * rows * 8 * 2 / seconds / 1e9


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--programs-per-sm", default="1,2")
    p.add_argument("--rows", default="256,512", help="a tile's rows (32 a warp, 8 warps: 256 is one load pass)")
    p.add_argument("--megabytes", type=int, default=16)
    p.add_argument("--iters", type=int, default=64)
    p.add_argument("--repeats", type=int, default=20)
    a = p.parse_args()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    x = torch.randint(-100, 100, (a.megabytes << 19,), dtype=torch.int16, device="cuda")
    out = torch.empty(sms * 8, dtype=torch.int32, device="cuda")
    x.sum()  # the buffer into L2
    print(f"{torch.cuda.get_device_name()}, {sms} multiprocessors, buffer {a.megabytes} MB, 8 warps a program")
    print("| synchronization | programs a multiprocessor | bytes a thread a tile | GB/s |")
    print("|---|---|---|---|")
    for per_sm in (int(v) for v in a.programs_per_sm.split(",")):
        for rows in (int(v) for v in a.rows.split(",")):
            for sync, name in SYNCS.items():
                rate = gbps(x, out, sms * per_sm, 8, rows, sync, a.iters, a.repeats)
                print(f"| {name} | {per_sm} | {rows * 8 * 2 // 256} | {rate:.0f} |")


if __name__ == "__main__":
    main()
