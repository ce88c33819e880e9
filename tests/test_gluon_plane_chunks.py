"""gluon-plane-chunks without a GPU: which plans it takes and why not, an image's slots and a step's
raw elements, where an operand element lies in them (the gather's places emulated with torch
against the plan's input), and its generated kernel compiled for sm_90 with Triton's own ptxas
(tests/gpu runs it)."""

import pytest
import torch

import fusionplan as fp
from fusionplan.runtime import tuning
from fusionplan.tools.verify import add_chain

from .test_gluon_nchw import layer
from .util import compile_sm90, layer_build, plan_for

pytest.importorskip("triton")
chunks = pytest.importorskip("fusionplan.solvers.gluon_plane_chunks")
gluon = pytest.importorskip("fusionplan.solvers.gluon_window")
if gluon.gluon_why_not():
    pytest.skip(gluon.gluon_why_not(), allow_module_level=True)


def plane_plan(c: int, h: int, w: int, k: int = 64, dtype=torch.float16, stride: int = 1):
    x = torch.empty(2, c, h, w, dtype=dtype)
    conv = fp.ConvolutionDescriptor((0, 0), (stride, stride))
    return add_chain(plan_for(x), "CBA", conv=conv, k=k, r=1, s=1, param_dtype="float")


def reason(plan) -> str | None:
    return next(v for v in plan.explain(fp.Handle("cpu")) if v.solver == "gluon-plane-chunks").reason


def test_why_not_names_what_is_missing():
    for name in ("r50_19", "r50_21"):
        assert "needs a Hopper GPU" in reason(layer(name))  # the plan fits: only the device is missing
    assert "needs a Hopper GPU" in reason(layer("r50_21", torch.bfloat16))
    assert "FLOAT data: wgmma reads an operand along its pixels only for 16-bit data" in reason(
        layer("r50_21", torch.float32)
    )
    assert "only 1x1 convolutions at stride 1 without padding" in reason(layer("r50_22"))  # 3x3
    assert "only 1x1 convolutions at stride 1 without padding" in reason(layer("r50_20"))  # stride 2
    assert "not packed NCHW" in reason(layer("r50_21", layout="NHWC"))
    assert "14x14 planes of 196 pixels (> 64)" in reason(layer("r50_15"))
    assert "C=48: a step's chunk of 32 channel planes" in reason(plane_plan(48, 7, 7))


def test_in_the_registry_before_the_gather_kernels():
    """Before gluon-nchw-regs and gluon-nchw, which took the 7x7 1x1 layers before it; a switch."""
    from fusionplan.solvers import REGISTRY

    names = [s.name for s in REGISTRY]
    assert names.index("gluon-plane-chunks") < min(names.index("gluon-nchw-regs"), names.index("gluon-nchw"))
    solver = chunks.GluonPlaneChunksSolver()
    assert solver.defer_why(layer("r50_19").spec(), fp.Handle("cpu")) is None  # 128 tiles
    assert "32 tiles on 132 multiprocessors" in solver.defer_why(layer("r50_21").spec(), fp.Handle("cpu"))
    assert "8 tiles on 132 multiprocessors" in solver.defer_why(layer("r50_19", batch=1).spec(), fp.Handle("cpu"))


@pytest.mark.parametrize("h, w, slots", [(7, 7, 64), (5, 5, 32), (8, 8, 64), (3, 5, 16), (1, 2, 2)])
def test_image_slots(h, w, slots):
    assert chunks.chunk_slots(plane_plan(32, h, w).spec()) == slots


def gathered_operand(x: torch.Tensor, image0: int, c0: int, block_k: int, pixels: int, slots: int) -> torch.Tensor:
    """What the kernel's gather builds for the step of the tile whose first image is ``image0``, its
    channels from ``c0``: the copied chunks as the raw buffer holds them ([images, block_k * slots],
    each image's run from its channel c0, the rest zeros), then each operand element taken from its
    place (the template's _step_geometry arithmetic)."""
    n, _, h, w = x.shape
    plane = h * w
    images, cols = pixels // slots, block_k * slots
    flat = x.reshape(n, -1)
    raw = torch.zeros(images, cols, dtype=x.dtype)
    for i in range(images):
        if image0 + i < n:
            raw[i, : block_k * plane] = flat[image0 + i, c0 * plane : (c0 + block_k) * plane]
    chans = torch.arange(block_k)[:, None]
    q = torch.arange(pixels)[None, :]
    places = chans * plane + (q // slots) * cols + torch.clamp(q % slots, max=plane - 1)
    return raw.reshape(-1)[places.reshape(-1)].reshape(block_k, pixels)


@pytest.mark.parametrize("n, c, h, w", [(3, 64, 7, 7), (5, 32, 5, 5), (9, 64, 3, 5), (2, 96, 8, 8)])
def test_gathered_operand_is_the_step_of_the_input(n, c, h, w):
    """The places the gather reads: slot q of channel c in a step is that channel's pixel q % slots
    of the tile's image q // slots (slots past the plane repeat its last pixel, masked at the
    store), the chunks copied from each image's step channel onwards."""
    x = torch.randn(n, c, h, w)
    plane, block_k, pixels = h * w, 32, 128
    slots = chunks.chunk_slots(plane_plan(32, h, w).spec())
    for image0 in range(0, n, pixels // slots):
        for c0 in range(0, c, block_k):
            got = gathered_operand(x, image0, c0, block_k, pixels, slots)
            for q in range(pixels):
                image, p = image0 + q // slots, min(q % slots, plane - 1)
                want = x[image, c0 : c0 + block_k].reshape(block_k, -1)[:, p] if image < n else torch.zeros(block_k)
                assert torch.equal(got[:, q], want), (image0, c0, q)


def shifted_operand(x: torch.Tensor, image0: int, c0: int, block_k: int, pixels: int, slots: int) -> torch.Tensor:
    """What the shifts (CHUNKS_SHIFTED_GATHER) build for the step of the tile whose first image is
    ``image0``, its channels from ``c0``: each 8-slot group of row c the 16 elements from its channel's
    aligned unit (the kernel's word places and masks, the next group's unit as the window's second
    half, the tile's last group's its own), then the 8 from s = (plane * c) % 8 on."""
    n, _, h, w = x.shape
    plane = h * w
    flat = x.reshape(n, -1)
    groups = pixels // 8
    units = torch.zeros(block_k, groups, 8, dtype=x.dtype)
    for c in range(block_k):
        for k in range(groups):
            image, unit = image0 + k // (slots // 8), plane * c // 8 + k % (slots // 8)
            if image < n and unit * 8 + 8 <= block_k * plane:
                run = flat[image, c0 * plane : (c0 + block_k) * plane]
                units[c, k] = run[unit * 8 : unit * 8 + 8]
    following = torch.clamp(torch.arange(groups) + 1, max=groups - 1)
    windows = torch.cat([units, units[:, following]], dim=2)
    out = torch.empty(block_k, pixels, dtype=x.dtype)
    for c in range(block_k):
        s = plane * c % 8
        out[c] = windows[c, :, s : s + 8].reshape(-1)
    return out


@pytest.mark.parametrize("n, c, h, w", [(3, 64, 7, 7), (2, 96, 8, 8), (5, 32, 6, 6), (3, 32, 4, 5)])
def test_shifted_operand_is_the_step_of_the_input(n, c, h, w):
    """The shifts' windows: slot q of channel c in a step is that channel's pixel q % slots of the
    tile's image q // slots wherever that pixel exists (the slots past the plane are masked at the
    store), on the planes chunks_shifted takes."""
    x = torch.randn(n, c, h, w)
    plane, block_k, pixels = h * w, 32, 128
    spec = plane_plan(32, h, w).spec()
    slots = chunks.chunk_slots(spec)
    assert plane % 8 == 0 or plane <= slots - 8
    for image0 in range(0, n, pixels // slots):
        for c0 in range(0, c, block_k):
            got = shifted_operand(x, image0, c0, block_k, pixels, slots)
            for q in range(pixels):
                image, p = image0 + q // slots, q % slots
                if image < n and p < plane:
                    want = x[image, c0 : c0 + block_k].reshape(block_k, -1)[:, p]
                    assert torch.equal(got[:, q], want), (image0, c0, q)


def test_shifted_only_where_each_pixel_lies_in_its_window(monkeypatch):
    """The shifts take planes of whole units or at least a unit short of their slots (7x7 in 64,
    6x6 in 64, 8x8); 5x5 in 32 slots and 3x5 in 16 keep the gather through shared memory."""
    monkeypatch.setattr(tuning, "GLUON_PLANE_CHUNKS_SHIFTED", 1)
    for (h, w), shifted in {(7, 7): True, (6, 6): True, (8, 8): True, (5, 5): False, (3, 5): False}.items():
        spec = plane_plan(32, h, w).spec()
        assert chunks.chunks_shifted(spec) is shifted, (h, w)
        kernel = chunks.GluonPlaneChunksKernel(spec, fp.Handle("cpu"))
        assert kernel.operand_k_major() is not shifted
    monkeypatch.setattr(tuning, "GLUON_PLANE_CHUNKS_SHIFTED", 0)
    assert not chunks.chunks_shifted(plane_plan(32, 7, 7).spec())


def test_image_tiles_where_pairs_leave_multiprocessors_idle(monkeypatch):
    """With tuning.GLUON_PLANE_CHUNKS_IMAGE_TILES, r50_21 (32 tiles of two images by 256 channels)
    takes tiles of one image by 128 (128 tiles) and is no longer deferred; r50_19's 128 tiles keep
    two images by 256; off, both keep the larger tiles. NORMAL find tries both sizes with it on."""
    solver = chunks.GluonPlaneChunksSolver()
    r50_21, r50_19 = layer("r50_21").spec(), layer("r50_19").spec()
    assert chunks.chunks_tiles(r50_21, 132) == 32 and solver.defer_why(r50_21, fp.Handle("cpu"))
    monkeypatch.setattr(tuning, "GLUON_PLANE_CHUNKS_IMAGE_TILES", 1)
    assert chunks.chunks_tiles(r50_21, 132) == 128 and solver.defer_why(r50_21, fp.Handle("cpu")) is None
    kernel = chunks.GluonPlaneChunksKernel(r50_21, fp.Handle("cpu"))
    assert (kernel.config.block_m, kernel.config.block_n) == (chunks.CHUNK_IMAGE_PIXELS, 128)
    assert kernel.raw_step(kernel.config) == (64, 32)
    assert chunks.chunks_tiles(r50_19, 132) == 128
    wide = chunks.GluonPlaneChunksKernel(r50_19, fp.Handle("cpu")).config
    assert (wide.block_m, wide.block_n) == (128, 256)
    assert {(c.block_m, c.block_n) for c in kernel.candidates} == {
        (128, 256),
        (128, 128),
        (128, 64),
        (64, 128),
        (64, 64),
    }


def test_raw_step_and_geometry(monkeypatch):
    """A step's raw elements: two 7x7 images' chunks of 64 planes in 4096 columns each (3136 used),
    8 elements a load; for the shifts 64 channels' units as 64 words of slot pairs, 4 words a load,
    and the gather again for input not 16-byte aligned. The kernel sees an image as one output row of
    its plane's pixels."""
    spec = layer("r50_21").spec()
    kernel = chunks.GluonPlaneChunksKernel(spec, fp.Handle("cpu"))
    assert kernel.pixel_slots == 64 and kernel.out_hw == (1, 49)
    assert kernel.geometry == (32 * 49, 2048, 512, 1, 49, 1, 49)
    cfg = kernel.config
    assert cfg.block_k == 64 and kernel.raw_step(cfg) == (64, 64) and kernel.load_vec() == 4
    unaligned = torch.empty(33 * 2048 * 49, dtype=torch.float16)[1:]
    assert kernel.raw_step(cfg, unaligned) == (2, 4096) and kernel.load_vec(unaligned) == 8
    assert kernel.operand_k_major(unaligned) and not kernel.operand_k_major()
    monkeypatch.setattr(tuning, "GLUON_PLANE_CHUNKS_SHIFTED", 0)
    assert kernel.raw_step(cfg) == (2, 4096) and kernel.load_vec() == 8
    tiles, steps = kernel.programs_and_steps(kernel.config)
    assert (tiles, steps) == (16 * 2, 32)  # 16 pairs of images by two blocks of 256 output channels


@pytest.mark.parametrize("staged, shifted", [(1, 0), (0, 0), (0, 1)])
def test_sm90_kernel(staged, shifted):
    """r50_19 (64-channel steps): 16-byte asynchronous copies of the chunks (staged; 8 a thread and
    step) or loads, the gather as one 2-byte shared-memory read an element (64 a thread and step; once
    a turn of the loop of loads into registers, unrolled by the steps in flight) or the shifts (16-byte
    loads of the units, no 2-byte shared reads), the weights by TMA, two computing warpgroups' wgmma
    (one product in flight), 2-byte NCHW stores, no spills."""
    build = (
        f"fp.runtime.tuning.GLUON_PLANE_CHUNKS_STAGED = {staged}\n"
        f"fp.runtime.tuning.GLUON_PLANE_CHUNKS_SHIFTED = {shifted}\n" + layer_build("r50_19", "float16", layout="NCHW")
    )
    info = compile_sm90(build, "gluon-plane-chunks")
    if staged:
        assert info["async copies by bytes"] == {"16": 8 * (tuning.GLUON_ROW_PAIRS_PREFETCH + 1)}
    else:
        assert "16" in info["global loads by bytes"]
    shared_reads = info["shared loads by bytes (LDS, not matrix loads)"].get("2", 0)
    assert shared_reads == 0 if shifted else 64 * (1 if staged else tuning.GLUON_ROW_PAIRS_PREFETCH + 1)
    assert info["HGMMA shapes"] == ["64x128x16"] and "0x1" in info["wgmma waits (outstanding groups allowed)"]
    assert info["bytes barriers expect (TTGIR)"] == info["tensor loads' box bytes (TTGIR)"]
    assert info["global stores by bytes"] == {"2": 128}
    assert "STACK:0" in info["resources"] and "LOCAL:0" in info["resources"]


def test_sm90_image_tiles():
    """r50_21 on tiles of one image (tuning.GLUON_PLANE_CHUNKS_IMAGE_TILES) by the shifts: 64-slot
    wgmma, 16-byte loads of the units, no 2-byte shared reads, no spills."""
    build = "fp.runtime.tuning.GLUON_PLANE_CHUNKS_IMAGE_TILES = 1\n" + layer_build("r50_21", "float16", layout="NCHW")
    info = compile_sm90(build, "gluon-plane-chunks")
    assert info["HGMMA shapes"] == ["64x64x16"] and "16" in info["global loads by bytes"]
    assert info["shared loads by bytes (LDS, not matrix loads)"].get("2", 0) == 0
    assert "STACK:0" in info["resources"] and "LOCAL:0" in info["resources"]
