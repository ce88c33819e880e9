"""gluon-window-nchw without a GPU: which plans it takes and why not, the turn's geometry, and its
generated kernel compiled for sm_90 with Triton's own ptxas (tests/test_gpu.py runs it)."""

import pytest
import torch

import fusionplan as fp
from fusionplan.testing import add_chain

from .test_gluon_nchw import layer
from .util import compile_sm90, layer_build, plan_for

pytest.importorskip("triton")
nchw = pytest.importorskip("fusionplan.solvers.gluon_window_nchw")
gluon = pytest.importorskip("fusionplan.solvers.gluon_window")
if gluon.gluon_why_not():
    pytest.skip(gluon.gluon_why_not(), allow_module_level=True)


def reason(plan) -> str | None:
    return next(v for v in plan.explain(fp.Handle("cpu")) if v.solver == "gluon-window-nchw").reason


def test_why_not_names_what_is_missing():
    for name in ("r50_16", "r50_18", "r50_22", "r50_21"):
        assert "needs a Hopper GPU" in reason(layer(name))  # the plan fits: only the device is missing
    assert "needs a Hopper GPU" in reason(layer("r50_22", torch.bfloat16))
    assert "FLOAT data: the turn to channels-last is written for 16-bit data" in reason(layer("r50_22", torch.float32))
    assert "must be packed NCHW" in reason(layer("r50_22", layout="NHWC"))
    assert "planes of 28x28 pixels" in reason(layer("r50_10"))
    assert "(> 65536)" in reason(layer("r50_15"))  # 1024 channels of 14x14 planes: a share of 128 KB
    x = torch.empty(8, 12, 7, 7, dtype=torch.float16)
    plan = add_chain(plan_for(x), "CBA", conv=fp.ConvolutionDescriptor((1, 1)), k=16, r=3, s=3, param_dtype="float")
    assert "C=12: the planes' runs need whole 16-byte units" in reason(plan)


def test_defers_to_the_gather_kernels():
    solver = nchw.GluonWindowNchwSolver()
    assert "slower than gluon-nchw" in solver.defer_why(layer("r50_18").spec(), fp.Handle("cpu"))


@pytest.mark.parametrize(
    "c, hw, images, group, expected",
    [
        (512, 49, 4, 16, (64, 64, 2)),  # r50_22: 7x7 planes, 128 turns of 64 channels by 16 members
        (512, 196, 4, 16, (16, 256, 8)),  # r50_18: 14x14 planes, 4096 elements a block
        (256, 196, 1, 4, (16, 256, 4)),  # r50_16
        (40, 196, 1, 1, (8, 256, 5)),  # C=40: blocks of 8 channels
        (64, 49, 1, 16, (8, 64, 1)),  # blocks of 8 channels, the narrowest: 8 blocks for 16 members
    ],
)
def test_copy_geometry(c, hw, images, group, expected):
    cb, pix, blocks = nchw.copy_geometry(c, hw, images, group)
    assert (cb, pix, blocks) == expected
    assert c % cb == 0 and pix >= hw and blocks * group >= images * (c // cb)


def test_the_pipeline_reads_a_channels_last_view_of_the_input():
    """The window pipeline's checks run on the plan with its input seen channels-last, dims and
    dtype unchanged; gluon-window's own source is unchanged by the fields (no turn, the window's
    origin by the program ids, channels-last stores)."""
    spec = layer("r50_22").spec()
    nhwc = nchw.channels_last_spec(spec)
    assert nhwc.input_desc.dims == spec.input_desc.dims and nhwc.input_desc.strides[1] == 1
    assert nhwc.ops == spec.ops
    source = gluon.render_gluon_source(spec, [])
    assert "pid = gl.program_id(0)" in source and "_channels_last_share" not in source
    assert "ticket" in nchw.render_window_nchw_source(spec, [])


@pytest.mark.parametrize("name, dtype", [("r50_22", "float16"), ("r50_18", "bfloat16")])
def test_kernel_compiles(name, dtype):
    """For sm_90 without spills: the share copied 16 bytes a copy into shared memory, stored 16 bytes
    a thread, the boxes (tensor loads) of gluon-window's ring, the ticket and the group's counters
    (atomics), the output stored along its planes (2-byte stores)."""
    info = compile_sm90(layer_build(name, dtype, layout="NCHW"), "gluon-window-nchw")
    assert info["async copies by bytes"] == {"16": info["async copies (LDGSTS)"]} and info["async copies (LDGSTS)"] > 0
    assert info["global stores by bytes"]["16"] > 0 and info["global stores by bytes"]["2"] > 0
    assert info["HGMMA"] > 0 and info["tensor loads (UTMALDG)"] > 0
    assert "STACK:0" in info["resources"] and "LOCAL:0" in info["resources"]
    assert "fence.proxy.async.global" in info["source"] and "atomic_add(sync_ptr" in info["source"]
