"""torch's convolution, called only in ways known to compute correctly.

torch 2.13's CPU convolution (oneDNN) has two bugs that plans can reach (docs/torch-cpu-conv-bugs.md
has the repros):

- A grouped convolution whose channels-last weight has an unusual stride on a size-1 axis gives
  wrong results. torch calls such a weight contiguous, so ``.contiguous()`` keeps the strides;
  only a copy into canonical strides fixes it. The same is done for the input.
- A channels-last input of width 1 (or 2), with padding, a stride or a dilation along it, and a
  bias, kills the process. Without the bias the call is fine, so on small planes the bias is
  added after the call.

The reference solver, cpu-folded and the oracles go through ``conv2d`` here.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from fusionplan.descriptors import ConvolutionDescriptor

Tensor = torch.Tensor

#: Planes with a side this short or shorter get their bias added outside torch's call.
SMALL_PLANE_SIDE = 2


def canonical_strides(shape: tuple[int, ...], channels_last: bool) -> tuple[int, ...]:
    """The strides of a dense NCHW (or NHWC) tensor of ``shape``, size-1 axes included."""
    n, c, h, w = shape
    if channels_last:
        return (h * w * c, 1, w * c, c)
    return (c * h * w, h * w, w, 1)


def is_channels_last(t: Tensor) -> bool:
    """Whether ``t`` is NHWC: its strides are NHWC's exactly (which tells the layouts apart on
    1x1 planes too), or its channels are its innermost axis of those longer than 1."""
    shape = tuple(t.shape)
    if t.stride() in (canonical_strides(shape, True), canonical_strides(shape, False)):
        return t.stride() == canonical_strides(shape, True) and t.stride() != canonical_strides(shape, False)
    inner = [t.stride(d) for d in (2, 3) if t.shape[d] > 1]
    return t.shape[1] > 1 and bool(inner) and t.stride(1) < min(inner)


def canonical(t: Tensor, channels_last: bool) -> Tensor:
    """``t`` itself when its strides are canonical for the layout, else a copy that has them."""
    strides = canonical_strides(tuple(t.shape), channels_last)
    if t.stride() == strides:
        return t
    return torch.empty_strided(t.shape, strides, dtype=t.dtype, device=t.device).copy_(t)


def conv2d(x: Tensor, w: Tensor, bias: Tensor | None, conv: ConvolutionDescriptor) -> Tensor:
    """``F.conv2d(x, w, bias, ...)`` with ``conv``'s geometry, on canonical copies where needed."""
    # on 1x1 planes both layouts order the input alike: follow the weight's (a copy of x is small)
    channels_last = is_channels_last(w if x.shape[2] == x.shape[3] == 1 else x)
    x = canonical(x, channels_last)
    w = canonical(w, channels_last)
    small = min(x.shape[2], x.shape[3]) <= SMALL_PLANE_SIDE
    inside = bias if not (small and x.device.type == "cpu") else None
    y = F.conv2d(x, w, inside, conv.strides, conv.pads, conv.dilations, conv.groups)
    if bias is not None and inside is None:
        y = y.add_(bias.reshape(1, -1, 1, 1))
    return y
