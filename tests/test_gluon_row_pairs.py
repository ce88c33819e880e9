"""gluon-row-pairs without a GPU: which plans it takes and why not, where it defers, its tiles and
shared memory, the output's runs, and its generated kernel compiled for sm_90 with Triton's own
ptxas (tests/gpu runs it)."""

import pytest
import torch

import fusionplan as fp
from fusionplan.runtime import tuning
from fusionplan.tools.verify import add_chain

from .test_gluon_nchw import layer
from .util import compile_sm90, layer_build, plan_for

pytest.importorskip("triton")
pairs = pytest.importorskip("fusionplan.solvers.gluon_row_pairs")
staged = pytest.importorskip("fusionplan.solvers.staged_toolkit")
if pairs.gluon_why_not():
    pytest.skip(pairs.gluon_why_not(), allow_module_level=True)


def strided_plan(c: int, h: int, w: int, k: int = 64):
    x = torch.empty(2, c, h, w, dtype=torch.float16)
    conv = fp.ConvolutionDescriptor((0, 0), (2, 2))
    return add_chain(plan_for(x), "CBA", conv=conv, k=k, r=1, s=1, param_dtype="float")


def reason(plan) -> str | None:
    return next(v for v in plan.explain(fp.Handle("cpu")) if v.solver == "gluon-row-pairs").reason


def deferred(plan) -> str | None:
    return pairs.GluonRowPairsSolver().defer_why(plan.spec(), fp.Handle("cpu"))


def test_why_not_names_what_is_missing():
    assert "needs a Hopper GPU" in reason(layer("r50_08"))  # the plan fits: only the device is missing
    assert "needs a Hopper GPU" in reason(layer("r50_08", torch.bfloat16))
    assert "FLOAT data: wgmma reads an operand along its pixels only for 16-bit data" in reason(
        layer("r50_08", torch.float32)
    )
    assert "only 1x1 convolutions at stride 2 without padding" in reason(layer("r50_10"))  # 3x3
    assert "only 1x1 convolutions at stride 2 without padding" in reason(layer("r50_09"))  # stride 1
    assert "not packed NCHW" in reason(layer("r50_08", layout="NHWC"))
    assert "H=15 is odd" in reason(strided_plan(64, 15, 16))
    assert "not whole 4-element units" in reason(strided_plan(64, 10, 9))  # 90-element planes


def test_loads_and_row_slots():
    """16-byte loads where planes and row pairs are whole 8-element units (56x56, 28x28), 8-byte ones
    where only 4-element units (14x14: 196-element planes; 30x30: 900); output rows in power-of-two
    slots, at least a load's half."""
    assert (pairs.pairs_vec(layer("r50_08").spec()), pairs.pairs_row_slots(layer("r50_08").spec())) == (8, 32)
    assert (pairs.pairs_vec(layer("r50_14").spec()), pairs.pairs_row_slots(layer("r50_14").spec())) == (8, 16)
    assert (pairs.pairs_vec(layer("r50_20").spec()), pairs.pairs_row_slots(layer("r50_20").spec())) == (4, 8)
    assert (pairs.pairs_vec(strided_plan(8, 30, 30).spec()), pairs.pairs_row_slots(strided_plan(8, 30, 30).spec())) == (
        4,
        16,
    )


@pytest.mark.parametrize(
    "name, why",
    [
        ("r50_08", None),  # 28x28 output planes
        ("r50_14", "output planes of 196 pixels (< 784)"),
        ("r50_20", "output planes of 49 pixels (< 784)"),
    ],
)
def test_defers_where_other_kernels_measured_faster(name, why):
    found = deferred(layer(name))
    assert found == why if why is None else why in found


def test_before_the_other_strided_1x1_kernels():
    """In the registry before gluon-nchw-regs and triton-gemm-nchw, which took r50_08 before it."""
    from fusionplan.solvers import REGISTRY

    names = [s.name for s in REGISTRY]
    assert names.index("gluon-row-pairs") < min(names.index("gluon-nchw-regs"), names.index("triton-gemm-nchw"))


def test_tiles_and_shared_memory(monkeypatch):
    """256 output channels by 128 slots on two computing warpgroups (128 or 64 channels on one);
    the ring's stages fill PAIRS_SHARED_BYTES beside the staged gathers and any resident weights."""
    cfg = pairs.pairs_config(512, 256)
    assert (cfg.block_m, cfg.block_n, cfg.block_k, cfg.num_warps) == (128, 256, 32, 8)
    assert (pairs.pairs_config(128, 256).block_n, pairs.pairs_config(64, 256).num_warps) == (128, 4)
    staged = pairs.staged_bytes(128)
    assert staged == (tuning.GLUON_ROW_PAIRS_PREFETCH + 1) * 32 * 256 * 2
    assert staged + cfg.num_stages * (128 + 256) * 32 * 2 <= pairs.PAIRS_SHARED_BYTES
    monkeypatch.setattr(tuning, "GLUON_ROW_PAIRS_RESIDENT_BYTES", 128 * 1024)
    monkeypatch.setattr(tuning, "GLUON_ROW_PAIRS_PREFETCH", 1)  # two raw steps staged leave room for them
    resident = pairs.pairs_config(512, 256)
    assert pairs.pairs_resident(256, 256) and not pairs.pairs_resident(256, 512)
    staged = pairs.staged_bytes(128)
    assert staged + 128 * 1024 + resident.num_stages * 128 * 32 * 2 <= pairs.PAIRS_SHARED_BYTES
    monkeypatch.setattr(tuning, "GLUON_ROW_PAIRS_PREFETCH", 3)
    assert not pairs.pairs_resident(256, 256)  # four raw steps leave no room
    monkeypatch.setattr(tuning, "GLUON_ROW_PAIRS_STAGED", 0)
    assert pairs.staged_bytes(128) == 0


def test_persistent_programs():
    """One a multiprocessor, a multiple of the channel blocks, at most one a tile."""
    assert staged.pairs_programs(448, 2, 132) == 132
    assert staged.pairs_programs(224, 4, 132) == 132
    assert staged.pairs_programs(112, 8, 132) == 112
    assert staged.pairs_programs(896, 3, 132) == 132 - 132 % 3
    assert staged.pairs_programs(400, 200, 132) == 200  # more channel blocks than multiprocessors: one each


def test_output_runs():
    """4 (or 2) pixels a store into packed NCHW planes whose rows are whole runs, aligned; else 1."""
    out = torch.empty(2, 512, 28, 28, dtype=torch.float16)
    assert staged.out_vec(out, out.stride(), (512, 28, 28)) == 4
    out = torch.empty(2, 64, 14, 14, dtype=torch.float16)
    assert staged.out_vec(out, out.stride(), (64, 14, 14)) == 2
    out = torch.empty(2, 64, 7, 7, dtype=torch.float16)
    assert staged.out_vec(out, out.stride(), (64, 7, 7)) == 1
    nhwc = torch.empty(2, 512, 28, 28, dtype=torch.float16).to(memory_format=torch.channels_last)
    assert staged.out_vec(nhwc, nhwc.stride(), (512, 28, 28)) == 1
    unaligned = torch.empty(2 * 512 * 784 + 1, dtype=torch.float16)[1:].view(2, 512, 28, 28)
    assert staged.out_vec(unaligned, unaligned.stride(), (512, 28, 28)) == 1


def test_staged_only_from_aligned_input(monkeypatch):
    """Asynchronous copies only from input that starts on a 16-byte boundary (a copy of fewer than 4
    bytes does not compile; the compiler sees 16-byte alignment or none)."""
    x = torch.empty(2 * 64 * 56 * 56 + 8, dtype=torch.float16)
    assert pairs.staged_input(x[:-8]) and not pairs.staged_input(x[1:-7]) and not pairs.staged_input(x[4:-4])
    monkeypatch.setattr(tuning, "GLUON_ROW_PAIRS_STAGED", 0)
    assert not pairs.staged_input(x[:-8])


@pytest.mark.parametrize("staged,store_warps,by_mma", [(1, 2, 1), (0, 2, 1), (1, 0, 1), (1, 2, 0)])
def test_sm90_kernel(staged, store_warps, by_mma):
    """r50_08: 16-byte asynchronous copies of the even rows (staged) or 16-byte loads (fewer
    scoreboards than steps in flight), the weights by TMA (an expect per box, requested by either
    partition), two computing warpgroups' wgmma (one product in flight), 8-byte NCHW stores (by the
    storing partition: 8 a thread for each slice of 8 channels a warp), no spills."""
    build = (
        f"fp.runtime.tuning.GLUON_ROW_PAIRS_STAGED = {staged}\n"
        f"fp.runtime.tuning.GLUON_ROW_PAIRS_STORE_WARPS = {store_warps}\n"
        f"fp.runtime.tuning.GLUON_ROW_PAIRS_WEIGHTS_BY_MMA = {by_mma}\n"
        + layer_build("r50_08", "float16", layout="NCHW")
    )
    info = compile_sm90(build, "gluon-row-pairs")
    if staged:
        assert info["async copies by bytes"] == {"16": 8 * (tuning.GLUON_ROW_PAIRS_PREFETCH + 1)}
    else:
        assert info["global loads by bytes"]["16"] == 8 * (2 * tuning.GLUON_ROW_PAIRS_PREFETCH + 1)
        # why staging: the steps in flight share scoreboards (one with Triton 3.6's ptxas, two with
        # 3.9's), so waiting for one step's values waits for loads of the steps after it
        assert len(info["scoreboards of global loads by bytes"]["16"]) < tuning.GLUON_ROW_PAIRS_PREFETCH + 1
    assert info["HGMMA shapes"] == ["64x128x16"] and "0x1" in info["wgmma waits (outstanding groups allowed)"]
    assert info["bytes barriers expect (TTGIR)"] == info["tensor loads' box bytes (TTGIR)"]
    assert info["global stores by bytes"] == {"8": 256 // store_warps if store_warps else 32}
    assert "STACK:0" in info["resources"] and "LOCAL:0" in info["resources"]


def test_hoisted_channels_only_where_measured(monkeypatch):
    """The chain's per-channel parameters load once a program under the Triton versions where the
    compiler keeps them in registers (measured there), and only with the switch on."""
    import triton

    monkeypatch.setattr(triton, "__version__", "3.6.0")
    assert pairs.pairs_hoist_channels()
    monkeypatch.setattr(tuning, "GLUON_ROW_PAIRS_HOIST_CHANNELS", 0)
    assert not pairs.pairs_hoist_channels()
    monkeypatch.setattr(tuning, "GLUON_ROW_PAIRS_HOIST_CHANNELS", 1)
    monkeypatch.setattr(triton, "__version__", "3.9.0")
    assert not pairs.pairs_hoist_channels()


def test_hoisted_channels_in_the_source():
    """The scale and shift are loaded by both placements, chosen by a constant of the launch: before
    the tiles' loop (HOIST_CHANNELS) or in each epilogue; the chain reads the vectors."""
    from fusionplan.runtime.folding import pointwise_stages, split_at_conv

    spec = layer("r50_08").spec()
    _, conv, post = split_at_conv(spec.ops)
    source = pairs.render_gluon_row_pairs_source(spec, pointwise_stages(post, conv=conv.index))
    partition = source[source.index("def _mma_partition") :]
    loop = partition.index("    for i in range(tiles):\n")
    before, each = partition.index("    if HOIST_CHANNELS:"), partition.index("        if not HOIST_CHANNELS:")
    assert before < loop < each
    for start in (before, each):
        assert "sc0_ptr_v = gl.load(sc0_ptr + ch_v" in partition[start : start + 800]
    assert "h * sc0_ptr_v[None, :] + sh0_ptr_v[None, :]" in partition


def test_hoisted_channels_beside_a_storing_partition(monkeypatch):
    """Only gluon-row-pairs with a storing partition loads them once (without one the computing warps
    spill them); gluon-plane-chunks never."""
    import triton

    from fusionplan.solvers import gluon_plane_chunks

    monkeypatch.setattr(triton, "__version__", "3.6.0")
    kernel = pairs.GluonRowPairsSolver().build(layer("r50_08").spec(), fp.Handle("cpu"))
    assert kernel.hoist_channels(2) and not kernel.hoist_channels(0)
    chunks = gluon_plane_chunks.GluonPlaneChunksSolver().build(layer("r50_19").spec(), fp.Handle("cpu"))
    assert not chunks.hoist_channels(2)


def test_weights_requested_by_the_computing_partition(monkeypatch):
    """gluon-row-pairs' computing partition requests the stages' weights where they are streamed and
    the switch is on; resident weights load once; gluon-plane-chunks' gathering partition requests
    them (measured faster there)."""
    from fusionplan.solvers import gluon_plane_chunks

    kernel = pairs.GluonRowPairsSolver().build(layer("r50_08").spec(), fp.Handle("cpu"))
    cfg = pairs.pairs_config(512, 256)
    assert not kernel.resident(cfg) and kernel.weights_by_mma(cfg)
    monkeypatch.setattr(tuning, "GLUON_ROW_PAIRS_WEIGHTS_BY_MMA", 0)
    assert not kernel.weights_by_mma(cfg)
    monkeypatch.setattr(tuning, "GLUON_ROW_PAIRS_WEIGHTS_BY_MMA", 1)
    monkeypatch.setattr(kernel, "resident", lambda cfg: True)
    assert not kernel.weights_by_mma(cfg)
    chunks = gluon_plane_chunks.GluonPlaneChunksSolver().build(layer("r50_19").spec(), fp.Handle("cpu"))
    assert not chunks.weights_by_mma(gluon_plane_chunks.chunks_config(2048, 512))
