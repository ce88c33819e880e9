"""torch's convolution, called only in ways known to compute correctly.

torch 2.13's CPU convolution (oneDNN) has four bugs that plans can reach (docs/torch-cpu-conv-bugs.md
has the repros):

- A grouped convolution whose channels-last weight has an unusual stride on a size-1 axis gives
  wrong results. torch calls such a weight contiguous, so ``.contiguous()`` keeps the strides;
  only a copy into canonical strides fixes it. The same is done for the input.
- A channels-last input of width 1 (or 2), with padding, a stride or a dilation along it, and a
  bias, kills the process; without the bias it can read past the input (values up to 1e38). On
  small planes the call is made on NCHW copies, and the bias is added after it.
- A channels-last convolution whose groups read one input channel each and whose output is one
  column wide gives wrong values (or up to 1e37); such calls are made on NCHW copies.
- On CPUs with AVX512-BF16, a bf16 convolution of a channels-last input gives wrong values (up
  to 1e13, or NaN), and with a width of 1 and padding, a stride or a dilation along it, kills the
  process, bias or not. 16-bit convolutions on the CPU are therefore computed in fp32 and rounded
  once.

The reference solver, cpu-folded and the oracles go through ``conv2d`` here.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from fusionplan.core.descriptors import ConvolutionDescriptor

Tensor = torch.Tensor

#: Planes with a side this short or shorter get their bias added outside torch's call.
SMALL_PLANE_SIDE = 2
#: Data types whose CPU convolutions run in fp32 (rounded to the type once, at the end).
SIXTEEN_BIT = (torch.float16, torch.bfloat16)


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


def _one_channel_one_column(x: Tensor, w: Tensor, conv: ConvolutionDescriptor) -> bool:
    """Whether each group reads one input channel and the output is one column wide."""
    span = conv.dilations[1] * (w.shape[3] - 1) + 1
    out_w = (x.shape[3] + 2 * conv.pads[1] - span) // conv.strides[1] + 1
    return w.shape[1] == 1 and out_w == 1


def canonical(t: Tensor, channels_last: bool) -> Tensor:
    """``t`` itself when its strides are canonical for the layout, else a copy that has them."""
    strides = canonical_strides(tuple(t.shape), channels_last)
    if t.stride() == strides:
        return t
    return torch.empty_strided(t.shape, strides, dtype=t.dtype, device=t.device).copy_(t)


def conv2d(x: Tensor, w: Tensor, bias: Tensor | None, conv: ConvolutionDescriptor) -> Tensor:
    """``F.conv2d(x, w, bias, ...)`` with ``conv``'s geometry, on canonical copies where needed."""
    cpu = x.device.type == "cpu"
    small = cpu and min(x.shape[2], x.shape[3]) <= SMALL_PLANE_SIDE
    # on 1x1 planes both layouts order the input alike: follow the weight's (a copy of x is small);
    # small planes on the CPU go NCHW (channels-last ones read past the input there), and so do
    # single-channel groups whose output is one column wide (channels-last ones come out wrong)
    channels_last = not small and not (cpu and _one_channel_one_column(x, w, conv))
    channels_last = channels_last and is_channels_last(w if x.shape[2] == x.shape[3] == 1 else x)
    x = canonical(x, channels_last)
    w = canonical(w, channels_last)
    dtype = x.dtype
    if cpu and dtype in SIXTEEN_BIT:  # oneDNN's 16-bit kernels: computed in fp32
        x, w = x.float(), w.float()
        bias = bias.float() if bias is not None else None
    inside = None if small else bias
    y = F.conv2d(x, w, inside, conv.strides, conv.pads, conv.dilations, conv.groups)
    if bias is not None and inside is None:
        y = y.add_(bias.reshape(1, -1, 1, 1))
    return y.to(dtype)
