"""Probe: stride-1 window convolutions (+ per-channel scale and shift, ReLU) with a loading warp
and computing warpgroups (Gluon, Triton 3.6), against triton-window and cuDNN (CUDA only).

    python lab/probes/probe.py --layers r50_22,r50_16,r50_19,r50_21,r50_15,r50_17,r50_10

For each layer and each configuration (warps of the computing partition, pipeline stages, window
pixels) the kernel's output is checked against torch in fp32 (TF32 off), then timed as CUDA-graph
replays (fusionplan-bench --graph's timing); triton-window (the plan's CBA kernel, forced) and
cuDNN's conv+bias+ReLU are timed beside it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))


def graph_us(fn) -> float:
    from fusionplan.tools.bench.timing import median_ms

    return median_ms(lambda i: fn(), torch.device("cuda"), 20, warmup=2, graph=True) * 1e3


def gluon_runner(x, w, scale, shift, pad, window, warps, stages, block_n=128, block_k=64, device_desc=False):
    from triton.experimental.gluon.language._layouts import NVMMASharedLayout
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    from window_ws import window_ws_device_desc_kernel, window_ws_kernel

    n, c, h, wd = x.shape
    k, _, r, s = w.shape
    tile_n, tile_h, tile_w = window
    x_nhwc = x.permute(0, 2, 3, 1)  # channels-last storage seen as [N, H, W, C]
    packed = w.permute(0, 2, 3, 1).reshape(k, -1).contiguous()
    x_desc = TensorDescriptor(
        x_nhwc,
        list(x_nhwc.shape),
        list(x_nhwc.stride()),
        [tile_n, tile_h, tile_w, block_k],
        NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=4),
    )
    w_desc = TensorDescriptor.from_tensor(packed, [block_n, block_k], NVMMASharedLayout(128, 16, rank=2))
    y = torch.empty(n, k, h, wd, dtype=x.dtype, device=x.device).to(memory_format=torch.channels_last)
    grid = (-(-n // tile_n) * -(-h // tile_h) * -(-wd // tile_w), -(-k // block_n))

    kernel = window_ws_device_desc_kernel if device_desc else window_ws_kernel
    if device_desc:  # the kernel builds its descriptors from the pointers
        x_desc, w_desc = x_nhwc, packed

    def run():
        kernel[grid](
            x_desc,
            w_desc,
            y,
            scale,
            shift,
            n,
            c,
            k,
            h,
            wd,
            pad,
            pad,
            R=r,
            S=s,
            TILE_N=tile_n,
            TILE_H=tile_h,
            TILE_W=tile_w,
            BLOCK_N=block_n,
            BLOCK_K=block_k,
            NUM_STAGES=stages,
            NUM_WARPS=warps,
            num_warps=warps,
        )
        return y

    return run


def probe_layer(layer, batch: int, only_heuristic: bool = False) -> None:
    import fusionplan as fp
    from fusionplan.runtime import tuning
    from fusionplan.tools.verify import layer_plan, random_args

    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    dev = torch.device("cuda")
    x = torch.randn(batch, layer.c, layer.h, layer.w, device=dev).half().to(memory_format=torch.channels_last)
    w = (torch.randn(layer.k, layer.c, layer.r, layer.s, device=dev) / (layer.c * layer.r * layer.s) ** 0.5).half()
    scale = torch.rand(layer.k, device=dev) + 0.5
    shift = torch.randn(layer.k, device=dev) * 0.1
    pad = layer.pad
    conv = torch.nn.functional.conv2d(x.float(), w.float(), padding=pad)
    ref = torch.relu(conv * scale[:, None, None] + shift[:, None, None])
    print(f"{layer.name} batch {batch}: C={layer.c} K={layer.k} {layer.h}x{layer.w} {layer.r}x{layer.s}")
    rows = []
    if only_heuristic:
        from fusionplan.solvers.gluon_window import gluon_config

        cfg = gluon_config(layer_plan(layer, x, "CBA").spec())
        window = tuning.window_shape(batch, layer.h, layer.w, cfg.block_m)
        for device_desc in (False, True):
            run = gluon_runner(x, w, scale, shift, pad, window, cfg.num_warps, cfg.num_stages, device_desc=device_desc)
            y = run()
            torch.cuda.synchronize()
            err = ((y.float() - ref).norm() / ref.norm()).item()
            where = "device" if device_desc else "host"
            name = f"gluon {window} w{cfg.num_warps} s{cfg.num_stages} {where} descriptors"
            rows.append((graph_us(run), f"  {name}: rel err {err:.1e}"))
    for pixels in (64, 128, 256) if not only_heuristic else ():
        window = tuning.window_shape(batch, layer.h, layer.w, pixels)
        if window is None:
            continue
        for warps in (4, 8):
            if pixels * 128 // (warps * 32) > 128:  # accumulator registers per thread
                continue
            for stages in (3, 4, 6):
                if stages * (pixels + 128) * 64 * 2 > 200 * 1024:
                    continue
                name = f"gluon {window} warps {warps} stages {stages}"
                try:
                    run = gluon_runner(x, w, scale, shift, pad, window, warps, stages)
                    y = run()
                    torch.cuda.synchronize()
                    err = ((y.float() - ref).norm() / ref.norm()).item()
                    ok = torch.isfinite(y).all().item() and err < 1e-2
                    us = graph_us(run) if ok else float("nan")
                    rows.append((us, f"  {name}: {us:.2f} us, rel err {err:.1e} {'ok' if ok else 'WRONG'}"))
                except Exception as exc:
                    rows.append((float("inf"), f"  {name}: {type(exc).__name__}: {str(exc)[:160]}"))
    for solver in ("triton-window", "gluon-window"):
        plan = layer_plan(layer, x, "CBA")
        handle = fp.Handle("cuda")
        plan.compile(handle, solver=solver)
        args = random_args(plan, "cuda", param_dtype=torch.float32)
        y = torch.empty_like(ref, dtype=x.dtype).to(memory_format=torch.channels_last)
        us = graph_us(lambda p=plan, h=handle, y=y, a=args: p.execute(h, x, y, a))
        rows.append((us, f"  {solver} (CBA)"))
    bias = shift.half()
    cudnn_us = graph_us(lambda: torch.relu(torch.nn.functional.conv2d(x, w, bias, padding=pad)))
    rows.append((cudnn_us, "  cuDNN conv+bias+ReLU"))
    for us, line in sorted(rows):
        print(line if "us" in line else f"{line}: {us:.2f} us")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", default="r50_22,r50_16,r50_19,r50_21,r50_15,r50_17,r50_10")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument(
        "--heuristic", action="store_true", help="gluon-window's configuration only: descriptors from host and device"
    )
    opts = p.parse_args()
    if not torch.cuda.is_available():
        print("probe: needs a CUDA GPU", file=sys.stderr)
        return 2
    import triton

    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device="cuda"))
    from fusionplan.tools.shapes import load_shapes

    shapes = {s.name: s for s in load_shapes(None)}
    for name in opts.layers.split(","):
        layer = shapes[name]
        if layer.stride != 1:
            print(f"{name}: strided, not probed")
            continue
        probe_layer(layer, opts.batch, opts.heuristic)
    return 0


if __name__ == "__main__":
    sys.exit(main())
