"""Time of fusionplan.conv_bias_activation that allocates its channels-last output, by the two ways
of making an empty channels-last tensor.

    python lab/api_output_alloc.py [--layer r50_22] [--batch 1,32]

``memory_format``: ``torch.empty(..., memory_format=torch.channels_last)`` (the API's way);
``.to(memory_format)``: ``torch.empty(...).to(memory_format=torch.channels_last)``, which copies the
new tensor into a channels-last one, a kernel of the output's size at every call. Each call is
timed on the GPU by events around 200 calls (fp16, NHWC input, ReLU; host time included).
"""

from __future__ import annotations

import argparse

import torch

import fusionplan as fp
import fusionplan.api as api
from fusionplan.tools.shapes import resnet50_layer


def copying_empty(desc, device, layout):
    fmt = torch.channels_last if layout == fp.Layout.NHWC else torch.contiguous_format
    return torch.empty(desc.dims, dtype=desc.dtype.torch_dtype, device=device).to(memory_format=fmt)


def per_call_us(layer: str, batch: int, calls: int = 200) -> float:
    s = resnet50_layer(layer)
    x = torch.randn(batch, s.c, s.h, s.w, device="cuda").half().to(memory_format=torch.channels_last)
    w = (torch.randn(s.k, s.c, s.r, s.s, device="cuda") / (s.c * s.r * s.s) ** 0.5).half()
    w = w.to(memory_format=torch.channels_last)
    b = torch.randn(s.k, device="cuda").half()

    def call() -> torch.Tensor:
        return fp.conv_bias_activation(x, w, b, stride=s.stride, padding=s.pad)

    for _ in range(10):
        call()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(calls):
        call()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / calls * 1e3


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layer", default="r50_22")
    p.add_argument("--batch", default="1,32")
    a = p.parse_args()
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, {a.layer}, fp16 NHWC, us per call")
    print("| batch | memory_format | .to(memory_format) |")
    print("|---|---|---|")
    own = api.empty_like_layout
    for batch in (int(b) for b in a.batch.split(",")):
        api.empty_like_layout = own
        direct = per_call_us(a.layer, batch)
        api.empty_like_layout = copying_empty
        copied = per_call_us(a.layer, batch)
        api.empty_like_layout = own
        print(f"| {batch} | {direct:.1f} | {copied:.1f} |")


if __name__ == "__main__":
    main()
