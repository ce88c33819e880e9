"""What the cudnn solver's non-finite guard costs: plan.execute timed (do_bench medians, us) with its
store (the scan, then the copy or the direct outputs) and with a plain ``y.copy_`` in its place, next
to cuDNN's own call; then a NaN input checked to come out NaN (CUDA only).

python lab/probes/vendor_guard.py --layers zoo_001,zoo_010,zoo_024,zoo_036,zoo_106,zoo_200
"""

from __future__ import annotations

import argparse
import sys

import torch


def _bench(fn) -> float:
    import triton

    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median") * 1e3


def _copy_only(self, out, y, *rest) -> None:
    y.copy_(out)


def probe_layer(s, batch: int) -> str:
    import fusionplan as fp
    from fusionplan.solvers import cudnn_vendor
    from fusionplan.tools.verify import layer_plan, random_args

    x = torch.randn(batch, s.c, s.h, s.w, device="cuda").half().to(memory_format=torch.channels_last)
    plan = layer_plan(s, x, "CBNA")
    handle = fp.Handle("cuda")
    plan.compile(handle, solver="cudnn")
    args = random_args(plan, "cuda", param_dtype=torch.float32)
    y = torch.empty(plan.output_desc.dims, dtype=x.dtype, device="cuda").to(memory_format=torch.channels_last)
    guarded = cudnn_vendor.CudnnKernel._store
    times = {}
    try:
        for label, store in (("guarded", guarded), ("copy_", _copy_only)):
            cudnn_vendor.CudnnKernel._store = store
            times[label] = _bench(lambda: plan.execute(handle, x, y, args))
    finally:
        cudnn_vendor.CudnnKernel._store = guarded
    w = torch.randn(s.k, s.c // s.groups, s.r, s.s, device="cuda").half().to(memory_format=torch.channels_last)
    b = torch.randn(s.k, device="cuda").half()
    strides, pads = (s.stride, s.stride_w or s.stride), (s.pad, s.pad if s.pad_w is None else s.pad_w)
    raw = _bench(lambda: torch.cudnn_convolution_relu(x, w, b, strides, pads, (s.dilation,) * 2, s.groups))
    x_nan = x.clone()
    x_nan[0, 0, 0, 0] = float("nan")
    plan.execute(handle, x_nan, y, args)
    kept = bool(torch.isnan(y[0, : s.k // s.groups, 0, 0]).all())
    return (
        f"{s.name}: cuDNN's call {raw:.1f} us, execute with copy_ {times['copy_']:.1f}, guarded"
        f" {times['guarded']:.1f} (+{times['guarded'] - times['copy_']:.1f}); NaN kept: {kept}"
    )


def main() -> int:
    from fusionplan.tools.shapes import load_shapes

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", default="zoo_001,zoo_010,zoo_024,zoo_036,zoo_106,zoo_200")
    p.add_argument("--batch", type=int, default=32)
    opts = p.parse_args()
    zoo = {s.name: s for s in load_shapes("zoo")}
    for name in opts.layers.split(","):
        print(probe_layer(zoo[name], opts.batch), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
