"""gluon-nchw and gluon-nchw-regs on the GPU: their tiles and the ResNet-50 layers.

python -m pytest -m gpu tests/gpu -n 12
"""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
import torch

import fusionplan as fp
from fusionplan.core.enums import ActivationMode
from fusionplan.tools.verify import add_chain

from ..util import (
    plan_for,
)
from .common import LAYERS, PRECISIONS, check_kernel_config, input_tensor, run_and_check

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


#: (n, c, h, w, k, r, s, pad, stride, dilation): NCHW planes of 49, 196 and odd sizes, 1x1 and
#: 3x3 (strided, dilated, "valid" 5x5, a 1x5 row), C not a multiple of the reduction step (40,
#: 136), K below a warpgroup's 64 rows and not a multiple of 128, tiles across images.
GLUON_NCHW_CASES = {
    "7x7-1x1": (9, 512, 7, 7, 136, 1, 1, 0, 1, 1),
    "7x7-3x3": (5, 128, 7, 7, 72, 3, 3, 1, 1, 1),
    "14x14-3x3": (3, 256, 14, 14, 192, 3, 3, 1, 1, 1),
    "strided-3x3": (3, 64, 13, 11, 24, 3, 3, 1, 2, 1),
    "strided-1x1": (2, 128, 28, 28, 136, 1, 1, 0, 2, 1),
    "C40-dilated": (2, 40, 12, 10, 17, 3, 3, 2, 1, 2),
    "C136-5x5-valid": (3, 136, 11, 9, 64, 5, 5, 0, 1, 1),
    "1x5-row": (2, 64, 10, 13, 40, (1, 5), 0, (0, 2), (1, 2), 1),
}


def gluon_nchw_case(case: str, dtype):
    """A GLUON_NCHW_CASES case: its NCHW input and a CBNA-ELU plan of it."""
    n, c, h, w, k, r, s, pad, stride, dil = GLUON_NCHW_CASES[case]
    if isinstance(r, tuple):  # a filter row: (R, S), pads and strides per dimension
        (r, s), pads, strides = r, pad, stride
    else:
        pads, strides = (pad, pad), (stride, stride)
    x = input_tensor((n, c, h, w), dtype, "NCHW")
    conv = fp.ConvolutionDescriptor(pads, strides, (dil, dil))
    plan = add_chain(plan_for(x), "CBNA", conv=conv, k=k, r=r, s=s, activation=ActivationMode.ELU, param_dtype="float")
    return plan, x


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["fp16", "bf16", "tf32"])
@pytest.mark.parametrize("case", list(GLUON_NCHW_CASES))
def test_gluon_nchw_tiles(case, precision, monkeypatch):
    """gluon-nchw on NCHW input over each of its tiles (64 x 256, 128 and 64 pixels by 128 and 64
    output channels, steps of 64 or 128 bytes a pixel, random ring depths, reductions whole or split
    in 2 or 3 parts, one to three gathering partitions of 4 or 8 warps, loads 1 to 3 steps ahead,
    the product either way round), output in planes and channels-last, with and without a prior (three launches
    of a split tile: its arrival counters reset by each)."""
    from fusionplan.runtime import tuning
    from fusionplan.solvers import gather_toolkit, gluon_nchw

    pixel_rows = gluon_nchw.pixel_rows
    dtype, tf32 = PRECISIONS[precision][:2]
    plan, x = gluon_nchw_case(case, dtype)
    handle = fp.Handle("cuda", allow_tf32=tf32)
    assert plan.compile(handle, solver="gluon-nchw") == "gluon-nchw"
    kernel = plan._entry(handle).kernel
    rng = random.Random(case + precision)
    for pixels, block_n in gather_toolkit.GATHER_TILES:
        row = rng.choice((64, 128))  # a pixel's bytes in a reduction step (64: strided plans' steps)
        # rings of 6 stages let three partitions run (shared_ring: two stages or more each); 64 x 256
        # tiles of 128-byte steps hold four in tuning.GLUON_NCHW_RING_BYTES
        fitting = [s for s in (2, 3, 4, 6) if s * (pixels + block_n) * row <= tuning.GLUON_NCHW_RING_BYTES]
        cfg = tuning.ConvConfig(pixels, block_n, row // x.element_size(), 8, 4, rng.choice(fitting), 1)
        steps = kernel.programs_and_steps(cfg)[1]  # a split reduction: parts of 1 step or more
        kernel.config = replace(cfg, split_k=rng.choice([k for k in (1, 2, 3) if k <= steps]))
        warps, parts = rng.choice(((4, 1), (4, 2), (4, 3), (8, 1)))  # at most 12 gathering warps
        monkeypatch.setattr(tuning, "GLUON_NCHW_GATHER_WARPS", warps)
        monkeypatch.setattr(tuning, "GLUON_NCHW_GATHERERS", parts)
        monkeypatch.setattr(tuning, "GLUON_NCHW_PREFETCH", rng.choice((1, 2, 3)))
        transposed = rng.choice((False, True))  # the product [channels, pixels] where it could be either
        monkeypatch.setattr(gluon_nchw, "pixel_rows", lambda n, w, t=transposed: not t and pixel_rows(n, w))
        check_kernel_config(plan, handle, kernel, x, precision, rng)


@pytest.mark.parametrize("precision", ["fp16", "tf32"])
@pytest.mark.parametrize("layer", [s for s in LAYERS if s.c > 3], ids=[s.name for s in LAYERS if s.c > 3])
def test_gluon_nchw_layers(layer, precision):
    """gluon-nchw on every ResNet-50 layer but the stem, NCHW input and output, batch 3 (tiles
    across images, a partial last one)."""
    dtype = PRECISIONS[precision][0]
    x = input_tensor((3, layer.c, layer.h, layer.w), dtype, "NCHW")
    conv = fp.ConvolutionDescriptor((layer.pad, layer.pad), (layer.stride, layer.stride))
    plan = add_chain(plan_for(x), "CBNA", conv=conv, k=layer.k, r=layer.r, s=layer.s, param_dtype="float")
    run_and_check(plan, precision, x, "NCHW", solver="gluon-nchw")


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
@pytest.mark.parametrize("case", list(GLUON_NCHW_CASES))
def test_gluon_nchw_regs_tiles(case, precision, monkeypatch):
    """gluon-nchw-regs on gluon-nchw's cases over each of its tiles, random weight rings (2 to 6
    stages), loads 1 to 3 steps ahead, output in planes and channels-last, with
    and without a prior."""
    from fusionplan.runtime import tuning
    from fusionplan.solvers import gluon_nchw_regs

    plan, x = gluon_nchw_case(case, PRECISIONS[precision][0])
    handle = fp.Handle("cuda")
    assert plan.compile(handle, solver="gluon-nchw-regs") == "gluon-nchw-regs"
    kernel = plan._entry(handle).kernel
    rng = random.Random(case + precision + "regs")
    for pixels, block_n, warps in (gluon_nchw_regs.WIDE_1X1_TILE, *gluon_nchw_regs.REGS_TILES):
        monkeypatch.setattr(tuning, "GLUON_NCHW_REGS_STAGES", rng.choice((2, 3, 4, 6)))
        monkeypatch.setattr(tuning, "GLUON_NCHW_REGS_STRIDED_STAGES", rng.choice((2, 3, 4, 6, 8)))
        monkeypatch.setattr(tuning, "GLUON_NCHW_REGS_AHEAD", rng.choice((1, 2, 3)))
        monkeypatch.setattr(tuning, "GLUON_NCHW_REGS_UNROLLED", rng.choice((0, 1)))
        row = rng.choice((64, 128))  # a pixel's bytes in a reduction step (64: strided filters' steps)
        kernel.config = gluon_nchw_regs.regs_tile(pixels, block_n, warps, x.element_size(), row)
        check_kernel_config(plan, handle, kernel, x, precision, rng)


@pytest.mark.parametrize("layer", [s for s in LAYERS if s.c > 3], ids=[s.name for s in LAYERS if s.c > 3])
def test_gluon_nchw_regs_layers(layer):
    """gluon-nchw-regs on every ResNet-50 layer but the stem, fp16 NCHW input and output, batch 3."""
    x = input_tensor((3, layer.c, layer.h, layer.w), torch.float16, "NCHW")
    conv = fp.ConvolutionDescriptor((layer.pad, layer.pad), (layer.stride, layer.stride))
    plan = add_chain(plan_for(x), "CBNA", conv=conv, k=layer.k, r=layer.r, s=layer.s, param_dtype="float")
    run_and_check(plan, "fp16", x, "NCHW", solver="gluon-nchw-regs")
