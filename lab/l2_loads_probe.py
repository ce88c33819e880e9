"""How many bytes a second global loads bring from L2 into the multiprocessors, by the width of
each lane's load, the alignment of a warp's run and the loads in flight, on the GPU.

    python lab/l2_loads_probe.py [--megabytes 16] [--repeats 20]

The gather kernels (gluon-nchw, gluon-nchw-regs) read NCHW planes of 49 or 196 pixels with 2-byte
loads, a warp's 32 lanes on neighbouring pixels of one channel: runs of 64 bytes that start 2
bytes past a 32-byte sector as often as not. r50_21's profile (lab/NOTES.md section 48) moved
about 15 bytes a cycle per multiprocessor from L2 that way, as much as section 47's 4-byte copies
did. This probe asks whether that is a limit of such loads: every program reads lines no other program of its
multiprocessor reads (each load misses L1) from a buffer small enough to stay in L2, with lanes of
2, 4, 8 or 16 bytes, a warp's run starting on a sector or 2 bytes past one, and more or fewer
loads in flight (warps on a multiprocessor, loads a thread). It prints the bytes a second, in all
and per multiprocessor (at the 1.75-1.8 GHz an H100 runs such loads at, 16 bytes a cycle is
28-29 GB/s a multiprocessor).
"""

from __future__ import annotations

import argparse

import torch
import triton
import triton.language as tl

from fusionplan.tools.bench.timing import median_ms


@triton.jit(do_not_specialize=["shift"])
def l2_loads_kernel(x_ptr, out_ptr, n_tiles, shift, ITERS: tl.constexpr, ROWS: tl.constexpr, VEC: tl.constexpr):
    # Each iteration: a tile of ROWS x VEC int16 elements (a lane's load: a row's VEC neighbouring
    # elements; the rows side by side, a warp's 32 on neighbouring rows), program pid's tiles pid,
    # pid + programs, ... (no tile twice), ``shift`` elements in. VEC 1 takes the shift as a
    # runtime value (no alignment the compiler could use: 2-byte loads whether it is 0 or 1);
    # wider rows are VEC-element loads from aligned rows (shift 0).
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    row = tl.arange(0, ROWS)[:, None]
    elem = tl.arange(0, VEC)[None, :]
    if VEC == 1:
        offs = row + elem + shift
    else:
        offs = tl.max_contiguous(tl.multiple_of(row * VEC + elem, [VEC, VEC]), [1, VEC])
    acc = tl.zeros([ROWS], dtype=tl.int32)
    for it in range(ITERS):
        tile = (it * programs + pid) % n_tiles
        acc += tl.sum(tl.load(x_ptr + tile * (ROWS * VEC) + offs).to(tl.int32), 1)
    tl.store(out_ptr + pid, tl.sum(acc, 0))


def measure(
    x: torch.Tensor,
    out: torch.Tensor,
    programs: int,
    warps: int,
    vec: int,
    loads: int,
    shift: int,
    iters: int,
    repeats: int,
) -> tuple[float, int]:
    """Seconds a launch of ``programs`` programs of ``warps`` warps takes, each thread ``loads``
    loads of ``vec`` int16 elements an iteration (median of ``repeats``, CUDA events), and the warps
    a multiprocessor runs at once."""
    rows = 32 * warps * loads
    n_tiles = (x.numel() - 64) // (rows * vec)

    def launch():
        return l2_loads_kernel[(programs,)](x, out, n_tiles, shift, ITERS=iters, ROWS=rows, VEC=vec, num_warps=warps)

    compiled = launch()
    # programs a multiprocessor holds at once: its 64K registers, and the programs it is given
    resident = min(
        -(-programs // torch.cuda.get_device_properties(0).multi_processor_count),
        65536 // (max(compiled.n_regs, 1) * 32 * warps),
    )
    seconds = median_ms(lambda i: launch(), torch.device("cuda"), repeats, warmup=1) / 1e3
    return seconds, resident * warps


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--megabytes", type=int, default=16, help="the buffer (it must stay in L2: 50 MB on the H100)")
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--iters", type=int, default=64, help="tiles a program reads")
    a = p.parse_args()
    props = torch.cuda.get_device_properties(0)
    sms = props.multi_processor_count
    x = torch.randint(-100, 100, (a.megabytes << 19,), dtype=torch.int16, device="cuda")
    out = torch.empty(sms * 64, dtype=torch.int32, device="cuda")
    x.sum()  # the buffer into L2
    print(f"{props.name}, {sms} multiprocessors, buffer {a.megabytes} MB")
    columns = ["bytes a lane", "run start", "warps a multiprocessor", "bytes a thread in flight", "GB/s"]
    print("| " + " | ".join([*columns, "GB/s a multiprocessor"]) + " |")
    print("|---|---|---|---|---|---|")
    for vec, shift in ((1, 1), (1, 0), (2, 0), (4, 0), (8, 0)):
        for per_sm, in_flight in ((1, 16), (1, 64), (1, 128), (2, 16), (2, 32), (4, 16)):
            programs, warps = sms * per_sm, 16  # per_sm programs of 16 warps a multiprocessor, where they fit
            loads = max(1, in_flight // (2 * vec))
            seconds, resident = measure(x, out, programs, warps, vec, loads, shift, a.iters, a.repeats)
            rate = programs * a.iters * 32 * warps * loads * vec * 2 / seconds
            start = "2 bytes past a sector" if shift else "a sector"
            cells = [2 * vec, start, resident, loads * vec * 2, f"{rate / 1e9:.0f}", f"{rate / 1e9 / sms:.1f}"]
            print("| " + " | ".join(str(c) for c in cells) + " |")


if __name__ == "__main__":
    main()
