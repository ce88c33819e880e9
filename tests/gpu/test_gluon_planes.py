"""gluon-row-pairs, gluon-plane-chunks and gluon-halo on the GPU: tiles, unaligned input, layers.

python -m pytest -m gpu tests/gpu -n 12
"""

from __future__ import annotations

import random

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


#: (n, c, h, w, k): gluon-row-pairs' strided 1x1 plans: ResNet-50's three (planes of whole 16-byte
#: units, 56x56 and 28x28; 14x14, 8-byte loads), rows of 15 slots in 16 (8-byte loads), C not a
#: multiple of the reduction step, K of 17 and 136 (tiles past the output's channels), tiles across
#: images and past the batch's last row.
GLUON_ROW_PAIRS_CASES = {
    "r50_08-like": (2, 64, 56, 56, 136),
    "r50_14-like": (3, 96, 28, 28, 72),
    "r50_20-like": (3, 128, 14, 14, 256),
    "30x30-C40": (2, 40, 30, 30, 17),
    "12x20-C48": (3, 48, 12, 20, 64),
}


def compiled_1x1(dims, precision, stride, solver):
    """(plan, handle, kernel, x): a CBNA plan (ELU) of a 1x1 filter at ``stride`` without padding
    on fresh NCHW input of ``dims`` (n, c, h, w, k output channels), compiled with ``solver``."""
    n, c, h, w, k = dims
    x = input_tensor((n, c, h, w), PRECISIONS[precision][0], "NCHW")
    conv = fp.ConvolutionDescriptor((0, 0), (stride, stride))
    plan = add_chain(plan_for(x), "CBNA", conv=conv, k=k, r=1, s=1, activation=ActivationMode.ELU, param_dtype="float")
    handle = fp.Handle("cuda")
    assert plan.compile(handle, solver=solver) == solver
    return plan, handle, plan._entry(handle).kernel, x


def set_random_switches(monkeypatch, rng, switches: dict) -> None:
    """Each tuning constant of ``switches`` set to one of its values, by ``rng``."""
    from fusionplan.runtime import tuning

    for name, values in switches.items():
        monkeypatch.setattr(tuning, name, rng.choice(values))


def check_tile_with_switches(plan, handle, kernel, x, precision, rng, monkeypatch, switches, cfg, tile) -> None:
    """The staged kernels' tile ``cfg`` checked with ``switches`` drawn by ``rng`` and a ring of 2, 3 or
    5 stages, of those that fit (``tile(cfg, stages)``: the tile with that ring; 0: the most that fit)."""
    set_random_switches(monkeypatch, rng, switches)
    most = tile(cfg, 0).num_stages
    kernel.config = tile(cfg, rng.choice([s for s in (2, 3, 5) if s <= most]))
    check_kernel_config(plan, handle, kernel, x, precision, rng)


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
@pytest.mark.parametrize("case", list(GLUON_ROW_PAIRS_CASES))
def test_gluon_row_pairs_tiles(case, precision, monkeypatch):
    """gluon-row-pairs over each of its tiles (128 slots by 256, 128 and 64 output channels), random
    ring depths, loads 1 to 3 steps ahead into registers or staged in shared memory, either side's
    proxy fence, weights resident or a box a stage (requested by either partition), the output
    stored by the computing warps or a storing partition of 2 or 4 warps, the chain's parameters
    loaded once or each tile, output in planes and channels-last, with and without a prior;
    persistent programs over several tiles each."""
    from fusionplan.solvers import gluon_row_pairs

    c = GLUON_ROW_PAIRS_CASES[case][1]
    plan, handle, kernel, x = compiled_1x1(GLUON_ROW_PAIRS_CASES[case], precision, 2, "gluon-row-pairs")
    rng = random.Random(case + precision + "pairs")

    def tile(cfg, stages):
        return gluon_row_pairs.pairs_tile(cfg.block_m, cfg.block_n, cfg.num_warps, c, stages)

    for cfg in kernel.candidates:
        switches = {
            "GLUON_ROW_PAIRS_PREFETCH": (1, 2, 3),
            "GLUON_ROW_PAIRS_STAGED": (0, 1),
            "GLUON_ROW_PAIRS_WEIGHTS_BY_MMA": (0, 1),
            "GLUON_ROW_PAIRS_CONSUMER_FENCE": (0, 1),
            # the channel block's weights resident (C <= 256 at 256 channels) or a box a stage
            "GLUON_ROW_PAIRS_RESIDENT_BYTES": (0, 128 * 1024),
            # the output stored by the computing warps or by a storing partition of 2 or 4 warps
            "GLUON_ROW_PAIRS_STORE_WARPS": (0, 2, 4),
            "GLUON_ROW_PAIRS_HOIST_CHANNELS": (0, 1),
        }
        check_tile_with_switches(plan, handle, kernel, x, precision, rng, monkeypatch, switches, cfg, tile)


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_gluon_row_pairs_unaligned_input(precision):
    """Input starting 2 bytes past a 16-byte boundary: loads into registers (no copy of fewer than 4
    bytes exists), the same results."""
    n, c, h, w, k = GLUON_ROW_PAIRS_CASES["r50_14-like"]
    dtype = PRECISIONS[precision][0]
    x = torch.randn(n * c * h * w + 1, device="cuda").to(dtype)[1:].view(n, c, h, w)
    assert x.data_ptr() % 16 == 2
    conv = fp.ConvolutionDescriptor((0, 0), (2, 2))
    plan = add_chain(plan_for(x), "CBNA", conv=conv, k=k, r=1, s=1, param_dtype="float")
    run_and_check(plan, precision, x, "NCHW", solver="gluon-row-pairs")


@pytest.mark.parametrize("layer", [s for s in LAYERS if s.r == 1 and s.stride == 2], ids=lambda s: s.name)
def test_gluon_row_pairs_layers(layer):
    """gluon-row-pairs on ResNet-50's strided 1x1 layers, bf16 NCHW input and output, batch 3."""
    x = input_tensor((3, layer.c, layer.h, layer.w), torch.bfloat16, "NCHW")
    conv = fp.ConvolutionDescriptor((0, 0), (2, 2))
    plan = add_chain(plan_for(x), "CBNA", conv=conv, k=layer.k, r=1, s=1, param_dtype="float")
    run_and_check(plan, "bf16", x, "NCHW", solver="gluon-row-pairs")


#: (n, c, h, w, k, stride): gluon-halo's plans: ResNet-50's 3x3 layers on 7x7, 14x14 and 28x28 planes
#: (stride 1 and 2) at small batches, odd planes (13x11; 13x13 and 15x9 at stride 2), one channel
#: block (C=64), K past the tile (72, 136, 200) and below it (17), bands of 128-slot tiles.
GLUON_HALO_CASES = {
    "7x7": (3, 128, 7, 7, 136, 1),
    "14x14": (2, 192, 14, 14, 72, 1),
    "13x11": (2, 64, 13, 11, 17, 1),
    "28x28": (2, 64, 28, 28, 128, 1),
    "14x14-s2": (3, 128, 14, 14, 128, 2),
    "13x13-s2": (2, 64, 13, 13, 200, 2),
    "15x9-s2": (2, 64, 15, 9, 64, 2),
    "28x28-s2": (2, 64, 28, 28, 64, 2),
}


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
@pytest.mark.parametrize("case", list(GLUON_HALO_CASES))
def test_gluon_halo_tiles(case, precision, monkeypatch):
    """gluon-halo (each channel block's halo gathered once, the nine taps as views of it shifted by
    whole rows; stride 2 as four phases) over 64- and 128-slot tiles where they fit, 64, 128 and 256
    output channels, weights rings of 2 to 6 stages, two or three halo buffers (of 256- or 128-row
    pieces, loaded one or two at a time), output in planes and channels-last, with and without a
    prior."""
    from fusionplan.solvers import gluon_halo

    n, c, h, w, k, stride = GLUON_HALO_CASES[case]
    x = input_tensor((n, c, h, w), PRECISIONS[precision][0], "NCHW")
    conv = fp.ConvolutionDescriptor((1, 1), (stride, stride))
    plan = add_chain(plan_for(x), "CBNA", conv=conv, k=k, r=3, s=3, activation=ActivationMode.ELU, param_dtype="float")
    handle = fp.Handle("cuda")
    assert plan.compile(handle, solver="gluon-halo") == "gluon-halo"
    kernel = plan._entry(handle).kernel
    rng = random.Random(case + precision + "halo")
    oh, ow = plan.output_desc.dims[2:]
    for pixels in (64, 128):
        for block_n in (64, 128, 256):
            stages = rng.choice((2, 3, 4, 6))
            monkeypatch.setattr(fp.runtime.tuning, "GLUON_HALO_BUFFERS", rng.choice((2, 3)))
            geo = gluon_halo.halo_geometry(oh, ow, stride, pixels, block_n, stages)
            if geo.tile_h == 0 or gluon_halo.shared_bytes(geo, stages) > gluon_halo.SHARED_BYTES:
                continue
            kernel.config = fp.runtime.tuning.ConvConfig(pixels, block_n, 64, 8, geo.computing_warps, stages, 1)
            check_kernel_config(plan, handle, kernel, x, precision, rng)


@pytest.mark.parametrize("layer", ["r50_22", "r50_18", "r50_16", "r50_10"])
def test_gluon_halo_layers(layer):
    """gluon-halo on the ResNet-50 3x3 layers it takes by default (7x7, 14x14 and 28x28 output planes
    at stride 1, 7x7 at stride 2), fp16 NCHW input and output, batch 3."""
    from fusionplan.tools.shapes import resnet50_layer
    from fusionplan.tools.verify import layer_plan

    s = resnet50_layer(layer)
    x = input_tensor((3, s.c, s.h, s.w), torch.float16, "NCHW")
    plan = layer_plan(s, x, "CBNA")
    handle = fp.Handle("cuda")
    assert plan.compile(handle) == "gluon-halo"
    run_and_check(plan, "fp16", x, "NCHW")


#: (n, c, h, w, k): gluon-plane-chunks' plans: ResNet-50's two 7x7 layers (64 slots an image, two
#: images a tile) with K of 136 (tiles past the output's channels) and an odd batch (a tile past
#: the batch's last image), planes of 25 (4 images a tile), 64 (no slot empty) and 15 pixels (8
#: images a tile, 3x5: rows of the plane not square).
GLUON_PLANE_CHUNKS_CASES = {
    "r50_21-like": (3, 256, 7, 7, 136),
    "r50_19-like": (4, 64, 7, 7, 512),
    "5x5-C32": (5, 32, 5, 5, 17),
    "8x8-C96": (3, 96, 8, 8, 64),
    "3x5-C64": (9, 64, 3, 5, 40),
}


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
@pytest.mark.parametrize("case", list(GLUON_PLANE_CHUNKS_CASES))
def test_gluon_plane_chunks_tiles(case, precision, monkeypatch):
    """gluon-plane-chunks over each of its tiles (128 slots by 256, 128 and 64 output channels, and
    one 64-slot image by 128 and 64; steps of 64 channels where C is a multiple of 64, else 32),
    random ring depths, copies 1 to 3 steps ahead or loads into registers, the operand by shifts or
    by the gather, 4 or 8 gathering warps, either side's proxy fence, output in planes and
    channels-last, with and without a prior; persistent programs over several tiles each."""
    from fusionplan.solvers import gluon_plane_chunks

    monkeypatch.setattr(
        fp.runtime.tuning, "GLUON_PLANE_CHUNKS_IMAGE_TILES", 1
    )  # the 64-slot tiles among the candidates
    c = GLUON_PLANE_CHUNKS_CASES[case][1]
    plan, handle, kernel, x = compiled_1x1(GLUON_PLANE_CHUNKS_CASES[case], precision, 1, "gluon-plane-chunks")
    rng = random.Random(case + precision + "chunks")

    def tile(cfg, stages):
        return gluon_plane_chunks.chunks_tile(cfg.block_n, c, stages, cfg.block_m)

    for cfg in kernel.candidates:
        switches = {
            "GLUON_ROW_PAIRS_PREFETCH": (1, 2, 3),
            "GLUON_PLANE_CHUNKS_STAGED": (0, 1),
            "GLUON_PLANE_CHUNKS_SHIFTED": (0, 1),
            "GLUON_PLANE_CHUNKS_GATHER_WARPS": (4, 8),
            "GLUON_ROW_PAIRS_CONSUMER_FENCE": (0, 1),
        }
        check_tile_with_switches(plan, handle, kernel, x, precision, rng, monkeypatch, switches, cfg, tile)


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_gluon_plane_chunks_unaligned_input(precision):
    """Input starting 2 bytes past a 16-byte boundary: loads into registers, the same results."""
    n, c, h, w, k = GLUON_PLANE_CHUNKS_CASES["r50_21-like"]
    dtype = PRECISIONS[precision][0]
    x = torch.randn(n * c * h * w + 1, device="cuda").to(dtype)[1:].view(n, c, h, w)
    assert x.data_ptr() % 16 == 2
    plan = add_chain(plan_for(x), "CBNA", k=k, r=1, s=1, param_dtype="float")
    run_and_check(plan, precision, x, "NCHW", solver="gluon-plane-chunks")


@pytest.mark.parametrize("layer", [s for s in LAYERS if s.r == 1 and s.stride == 1 and s.h == 7], ids=lambda s: s.name)
def test_gluon_plane_chunks_layers(layer):
    """gluon-plane-chunks on ResNet-50's 1x1 layers on 7x7 planes, fp16 NCHW input and output, batch 3."""
    x = input_tensor((3, layer.c, layer.h, layer.w), torch.float16, "NCHW")
    plan = add_chain(plan_for(x), "CBNA", k=layer.k, r=1, s=1, param_dtype="float")
    run_and_check(plan, "fp16", x, "NCHW", solver="gluon-plane-chunks")
