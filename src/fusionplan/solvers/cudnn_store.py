"""The cudnn solver's Triton kernels: a scan that flags NaN and infinities, and the store that
copies cuDNN's result into y, or computes each output from its taps where the flag is set
(cudnn_vendor's docstring says why). Imported only where the solver builds a kernel, so that the
library imports without Triton."""

from __future__ import annotations

import triton
import triton.language as tl

from fusionplan.runtime.launch import Launcher


@triton.jit
def _output_index(offs, K, OH, OW, CHANNELS_LAST: tl.constexpr):
    """(n, k, oh, ow) of the outputs at positions ``offs`` of NCHW's (or NHWC's) element order."""
    if CHANNELS_LAST:
        k = offs % K
        t = offs // K
        ow = t % OW
        t = t // OW
        oh = t % OH
        n = t // OH
    else:
        ow = offs % OW
        t = offs // OW
        oh = t % OH
        t = t // OH
        k = t % K
        n = t // K
    return n, k, oh, ow


@triton.jit(do_not_specialize=["tag"])
def _store_kernel(
    out_ptr, y_ptr, x_ptr, w_ptr, b_ptr, p_ptr, flag_ptr, tag, coef,
    TOTAL, K, OH, OW, H, W, C_G, K_G,
    son, sok, soh, sow, syn, syk, syh, syw, sxn, sxc, sxh, sxw, swk, swc, swr, sws, spn, spk, sph, spw,
    STR_H, STR_W, PAD_H, PAD_W, DIL_H, DIL_W, R, S,
    BLOCK: tl.constexpr, FLAT: tl.constexpr, CHANNELS_LAST: tl.constexpr, HAS_BIAS: tl.constexpr,
    HAS_PRIOR: tl.constexpr, IDX64: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    if IDX64:
        pid = pid.to(tl.int64)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < TOTAL
    if tl.load(flag_ptr) != tag:  # finite data: cuDNN's result is the chain's
        if FLAT:  # out and y dense in one order
            tl.store(y_ptr + offs, tl.load(out_ptr + offs, mask=mask), mask=mask)
        else:
            n, k, oh, ow = _output_index(offs, K, OH, OW, CHANNELS_LAST)
            v = tl.load(out_ptr + n * son + k * sok + oh * soh + ow * sow, mask=mask)
            tl.store(y_ptr + n * syn + k * syk + oh * syh + ow * syw, v, mask=mask)
    else:  # each output from its taps: padding adds nothing, NaN and Inf go where the arithmetic puts them
        n, k, oh, ow = _output_index(offs, K, OH, OW, CHANNELS_LAST)
        acc = tl.zeros([BLOCK], dtype=tl.float32)
        x_base = x_ptr + n * sxn + (k // K_G) * C_G * sxc
        w_base = w_ptr + k * swk
        for c in range(C_G):
            for r in range(R):
                ih = oh * STR_H - PAD_H + r * DIL_H
                for s in range(S):
                    iw = ow * STR_W - PAD_W + s * DIL_W
                    inside = mask & (ih >= 0) & (ih < H) & (iw >= 0) & (iw < W)
                    xv = tl.load(x_base + c * sxc + ih * sxh + iw * sxw, mask=inside, other=0.0)
                    acc += xv.to(tl.float32) * tl.load(w_base + c * swc + r * swr + s * sws, mask=mask, other=0.0)
        if HAS_BIAS:
            acc += tl.load(b_ptr + k, mask=mask, other=0.0)
        if HAS_PRIOR:
            acc += coef * tl.load(p_ptr + n * spn + k * spk + oh * sph + ow * spw, mask=mask, other=0.0).to(tl.float32)
        acc = tl.where(acc < 0, 0.0, acc)  # ReLU that keeps NaN
        tl.store(y_ptr + n * syn + k * syk + oh * syh + ow * syw, acc.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit(do_not_specialize=["tag"])
def _scan_kernel(
    t_ptr, flag_ptr, tag, TOTAL, C, H, W, stn, stc, sth, stw,
    BLOCK: tl.constexpr, FLAT: tl.constexpr, CHANNELS_LAST: tl.constexpr, IDX64: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    if IDX64:
        pid = pid.to(tl.int64)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < TOTAL
    if FLAT:  # dense: NCHW's or NHWC's element order is the memory's
        v = tl.load(t_ptr + offs, mask=mask, other=0.0)
    else:
        n, c, h, w = _output_index(offs, C, H, W, CHANNELS_LAST)
        v = tl.load(t_ptr + n * stn + c * stc + h * sth + w * stw, mask=mask, other=0.0)
    v = v.to(tl.float32)
    special = (v != v) | (tl.abs(v) == float("inf"))
    if tl.max(special.to(tl.int32), axis=0) > 0:
        tl.atomic_max(flag_ptr, tag)


STORE = Launcher(_store_kernel)
SCAN = Launcher(_scan_kernel)
STORE_BLOCK = 1024
SCAN_BLOCK = 2048
#: Tags run 1..MAX_TAG, then the flag is zeroed and they start again (int32 arguments).
MAX_TAG = 2**30
