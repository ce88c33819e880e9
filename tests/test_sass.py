"""The compiled kernels' structure on Hopper, checked without a GPU: Triton's own ptxas builds the
sm_90 binary (scripts/inspect_sass.py) and the SASS shows what the H100 measurements depend on
(lab/NOTES.md, section 10)."""

import json
import re
from pathlib import Path

import pytest

from .util import HOPPER_SHARED_BYTES, compile_sm90, compiling_process, layer_build

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "inspect_sass.py"


def inspect(*args: str) -> dict[str, str]:
    # an empty value keeps its key's ": " (a summary line "  key: ")
    lines = [line.lstrip() for line in compiling_process([str(SCRIPT), *args]).splitlines() if line.startswith("  ")]
    return {key: value.strip() for key, value in (line.split(": ", 1) for line in lines)}


triton = pytest.importorskip("triton")


def test_window_kernel_overlaps_its_tensor_core_products():
    """The input box is wgmma's B operand, read from shared memory: no staging through registers
    and one wgmma group left in flight (not a wait for zero after each)."""
    info = inspect("--layer", "r50_10", "--solver", "triton-window")
    assert int(info["HGMMA"]) > 0
    assert int(info["LDSM (operand through registers)"]) == 0
    assert "'0x1'" in info["wgmma waits (outstanding groups allowed)"]
    assert int(info["tensor loads (UTMALDG)"]) > 0


def test_implicit_gemm_uses_tf32_tensor_cores_for_fp32():
    info = inspect("--layer", "r50_12", "--solver", "triton-conv", "--dtype", "fp32")
    assert int(info["HGMMA"]) > 0
    assert "'0x1'" in info["wgmma waits (outstanding groups allowed)"]


def test_window_kernel_with_a_view_per_stride_class_builds():
    """15x15 images at stride 2 are read through a view per stride class, made on the device: the
    kernel must build for sm_90 (the interpreter runs it without Triton's type checks)."""
    build = (
        "x = torch.empty(4, 128, 15, 15, dtype=torch.float16).to(memory_format=torch.channels_last)\n"
        "plan = fp.FusionPlan(fp.TensorDescriptor.from_tensor(x))\n"
        "add_chain(plan, 'CBNA', conv=fp.ConvolutionDescriptor((1, 1), (2, 2)), k=128, r=3, s=3, param_dtype='half')"
    )
    info = compile_sm90(build, "triton-window")
    assert "class_desc = tl.make_tensor_descriptor" in info["source"] and info["HGMMA"] > 0


#: Every descriptor kernel the ResNet-50 layers take on a Hopper GPU (fp16, TF32), compiled for
#: calls that read a prior output (the largest specialization: compile builds the plain one ahead).
FIT = """
import json, types, torch
import fusionplan as fp
from fusionplan import solvers
from fusionplan.runtime.sass import compile_for_hopper
from fusionplan.tools.shapes import load_shapes
from fusionplan.tools.verify import layer_plan

hopper = types.SimpleNamespace(
    device=torch.device("cuda", 0), tf32_allowed=lambda: True, compute_capability=lambda: (9, 0),
    settings=fp.Settings(),
)
seen, rows = set(), []
for shape in load_shapes():
    for dtype in (torch.float16, torch.float32):
        x = torch.empty(32, shape.c, shape.h, shape.w, dtype=dtype).to(memory_format=torch.channels_last)
        spec = layer_plan(shape, x, "CBNA").spec()
        name = solvers.choice(solvers.verdicts(spec, hopper)).solver
        if name not in ("triton-gemm", "triton-window", "gluon-window", "gluon-gemm"):
            continue
        kernel = solvers.solver_named(name).build(spec, fp.Handle("cpu", allow_tf32=True))
        key = (name, kernel.config, str(dtype), shape.r, shape.s, shape.stride)
        if key in seen:
            continue
        seen.add(key)
        shared = []
        for cfg in (kernel.config, kernel.narrower_config()):
            if cfg is not None:
                kernel.config = cfg
                shared.append(compile_for_hopper(kernel, with_prior=True)[1].metadata.shared)
        rows.append([shape.name, str(dtype), name, shared])
print("FIT" + json.dumps(rows))
"""


def test_resnet50_kernels_fit_hopper_shared_memory_with_a_prior_output():
    """A launch reading a prior output compiles at its first call; where the kernel's tiles then
    need more shared memory than sm_90 has (triton-gemm's 128x256 tiles: 240 KB), its narrower
    tiles must fit (the run falls back to them)."""
    stdout = compiling_process(["-c", FIT], timeout=600)
    rows = json.loads(next(line for line in stdout.splitlines() if line.startswith("FIT"))[3:])
    # no layer picks triton-window on Hopper at batch 32 (gluon-window takes every window layer)
    assert {row[2] for row in rows} == {"triton-gemm", "gluon-window", "gluon-gemm"}
    for layer, dtype, solver, shared in rows:
        assert shared[0] <= HOPPER_SHARED_BYTES or shared[-1] <= HOPPER_SHARED_BYTES, (layer, dtype, solver, shared)


@pytest.mark.parametrize(
    "name, dtype, reads",
    [
        ("r50_07", "float16", "boxes"),  # 784-pixel planes: whole 16-byte units, tensor boxes
        ("r50_11", "float32", "boxes"),
        ("r50_15", "float16", "copies"),  # 196: 8-byte copies (the plane size is compiled in)
        ("r50_21", "float16", "elements"),  # 49: no alignment, element loads
    ],
)
def test_nchw_planes_are_read_by_boxes_or_async_copies(name, dtype, reads):
    """triton-gemm-nchw's input: tensor boxes where the planes allow (the weights and the output
    tiles too: no pointer load or store), else pointer loads pipelined as asynchronous copies where
    the planes' alignment allows (a flattened persistent loop had lost it: every load one element);
    wgmma products within sm_90's shared memory. With pointer stores, its tiles of 128 channels
    keep 128 accumulator registers per thread, and the epilogue's pointers beside them spill a
    little (32-176 bytes of stack): measured faster than tiles that do not (64 channels,
    lab/NOTES.md section 18), so the test bounds the stack rather than forbidding it."""
    info = compile_sm90(layer_build(name, dtype, layout="NCHW"), "triton-gemm-nchw")
    weights_only = 32  # the weight tile's copies alone at r50_21's 64 x 128 tiles and 4 stages
    boxes, copies = info["tensor loads (UTMALDG)"], info["async copies (LDGSTS)"]
    assert (boxes > 0) == (reads == "boxes")
    if reads == "boxes":
        assert copies == 0 and not info["global stores by bytes"] and "STACK:0" in info["resources"], info
    else:
        assert copies > weights_only if reads == "copies" else copies > 0
    stack = int(re.search(r"STACK:(\d+)", info["resources"]).group(1))
    assert info["HGMMA"] > 0 and "LOCAL:0" in info["resources"] and stack <= 192, info["resources"]
    assert info["shared bytes (dynamic)"] <= HOPPER_SHARED_BYTES


@pytest.mark.parametrize("name", ["r50_08", "r50_14"])
def test_strided_nchw_row_pairs_are_read_as_boxes(name):
    """triton-gemm-nchw at stride 2 on row pairs of whole 16-byte units (56- and 28-pixel input
    rows): the input's row pairs and the weights by tensor boxes alone, the even columns kept
    before the product (half the wgmma work of a product over whole rows), pipelined; nothing in
    local memory. r50_14's 256 x 256 tiles keep 128 accumulator registers a thread and a stack
    frame beside them with Triton 3.9 (measured faster than 128 channels: tuning). Triton 3.6 waits
    for each product whose operand passed through registers (the even columns), so there the
    products run one at a time (what the H100 measurements of lab/NOTES.md ran)."""
    info = compile_sm90(layer_build(name, "float16", layout="NCHW"), "triton-gemm-nchw")
    assert info["tensor loads (UTMALDG)"] > 0 and info["async copies (LDGSTS)"] == 0, info
    pipelined = set(info["wgmma waits (outstanding groups allowed)"]) - {"0x0"}
    assert info["HGMMA"] > 0 and (pipelined or triton.__version__.startswith("3.6."))
    stack = int(re.search(r"STACK:(\d+)", info["resources"]).group(1))
    assert "LOCAL:0" in info["resources"] and stack <= 512, info["resources"]
    assert info["shared bytes (dynamic)"] <= HOPPER_SHARED_BYTES


@pytest.mark.parametrize(
    "name, input_copy, switches",
    [
        ("r50_08", "16", "g.tile_reads = lambda spec: False\n"),  # 56-pixel rows: 16-byte copies
        ("r50_14", "8", "g.tile_reads = lambda spec: False\n"),  # 28: 8-byte (as for unaligned input)
        ("r50_20", "4", ""),  # 14: 4-byte (28-byte row pairs: no boxes)
    ],
)
def test_strided_nchw_planes_are_read_as_row_copies(name, input_copy, switches):
    """triton-gemm-nchw at stride 2 by pointer: each output row's input row read as contiguous
    columns (the odd ones' products dropped after the reduction) by asynchronous copies as wide as
    the rows' alignment allows, where a pixel-by-pixel gather would load 2-byte elements; wgmma
    products, pipelined from shared memory (no operand staged in registers), nothing spilled."""
    build = "from fusionplan.solvers import triton_gemm_nchw as g\n" + switches
    build += layer_build(name, "float16", layout="NCHW")
    info = compile_sm90(build, "triton-gemm-nchw")
    widths = info["async copies by bytes"]  # the weights' are 16-byte copies
    assert widths.get(input_copy, 0) >= 8 and min(int(b) for b in widths) == int(input_copy), widths
    assert info["HGMMA"] > 0 and set(info["wgmma waits (outstanding groups allowed)"]) - {"0x0"}  # pipelined
    assert info["LDSM (operand through registers)"] == 0 and "STACK:0" in info["resources"], info["resources"]
    assert "LOCAL:0" in info["resources"] and info["shared bytes (dynamic)"] <= HOPPER_SHARED_BYTES


@pytest.mark.parametrize("joined, stores", [(True, {"8"}), (False, {"2"})])
def test_stem_joins_its_runs_for_nchw_stores(joined, stores):
    """tuning.STEM_JOINED_EPILOGUE (the NCHW stem, runs of 4 pixels): the run's accumulators joined
    into one tile of neighbouring pixels store 4 of them at once (8 bytes), where an epilogue per
    pixel of the run stores 2-byte elements 4 pixels apart; nothing spilled either way."""
    switched = f"import fusionplan.runtime.tuning as t\nt.STEM_JOINED_EPILOGUE = {joined}\n"
    build = switched + layer_build("r50_00", "float16", layout="NCHW")
    info = compile_sm90(build, "triton-stem")
    assert set(info["global stores by bytes"]) == stores, info["global stores by bytes"]
    assert "STACK:0" in info["resources"] and "LOCAL:0" in info["resources"], info["resources"]


@pytest.mark.parametrize("dtype, stores", [("float32", {"4"}), ("float16", {"16"})])
def test_gluon_window_epilogue_in_the_accumulators_layout(dtype, stores):
    """r50_22 (7x7 windows of several images): the chain runs in the accumulator's layout; fp32
    output is stored from it (4-byte stores, eight threads writing a pixel's 32 contiguous bytes),
    16-bit output still changes layout for 16-byte stores; products pipelined, nothing spilled."""
    info = compile_sm90(layer_build("r50_22", dtype), "gluon-window")
    assert set(info["global stores by bytes"]) == stores
    assert set(info["wgmma waits (outstanding groups allowed)"]) - {"0x0"}
    assert "STACK:0" in info["resources"] and info["shared bytes (dynamic)"] <= HOPPER_SHARED_BYTES


@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_conv_tap_bits_shorten_the_reduction_loop(dtype):
    """tuning.CONV_TAP_BITS (triton-conv, r50_02: 3x3, 64 channels): the loop over taps and channel
    blocks issues at least a quarter fewer instructions (Triton 3.6: 300 -> 144 for fp16), still
    16-byte asynchronous copies and pipelined products, nothing spilled."""

    def switched(on: int) -> str:
        return f"import fusionplan.runtime.tuning as t\nt.CONV_TAP_BITS = {on}\n" + layer_build("r50_02", dtype)

    before = compile_sm90(switched(0), "triton-conv")
    after = compile_sm90(switched(1), "triton-conv")
    loop = "instructions of the longest loop"
    assert 0 < after[loop] <= 0.75 * before[loop], (before[loop], after[loop])
    assert after["async copies by bytes"] == before["async copies by bytes"]
    assert set(after["wgmma waits (outstanding groups allowed)"]) - {"0x0"} and "STACK:0" in after["resources"]


def test_gluon_gemm_stores_fp32_output_from_the_accumulators_layout():
    """TF32 r50_07 (two warpgroups taking tiles in turn): the fp32 output goes to global memory
    from the accumulator's layout (4-byte stores), with no layout change through shared memory."""
    direct = compile_sm90(layer_build("r50_07", "float32"), "gluon-gemm")
    assert set(direct["global stores by bytes"]) == {"4"}  # keys as JSON strings
    assert "NUM_STAGES" in direct["source"] and "LOCAL:0" in direct["resources"]
    assert direct["shared bytes (dynamic)"] <= HOPPER_SHARED_BYTES


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_gemm_products_overlap_in_tf32_too(dtype):
    """triton-gemm's weights as [K, C] for fp32 data: TF32 wgmma reads its B operand from shared
    memory only along the reduction, and with the weights as [C, K] Triton had fed them through
    registers and waited for every product before the next (r50_07: waits ['0x0'], 2x slower than
    triton-conv on the H100); now one product stays in flight, as for 16-bit data."""
    info = compile_sm90(layer_build("r50_07", dtype), "triton-gemm")
    waits = info["wgmma waits (outstanding groups allowed)"]
    assert info["HGMMA"] > 0 and info["tensor loads (UTMALDG)"] > 0 and set(waits) - {"0x0"}, waits
    assert "LOCAL:0" in info["resources"] and "STACK:0" in info["resources"]


#: The build as on a device that runs programmatic dependent launch (the CPU handle's kernels
#: otherwise launch plainly).
GRID_DEPENDENCY_ON = (
    "from fusionplan.solvers import conv_kernel\nconv_kernel.grid_dependency_capable = lambda handle: True\n"
)
ORDER = "grid dependency (W wait, P trigger, G global access) in order"


@pytest.mark.parametrize(
    "name, solver, layout",
    [
        ("r50_01", "triton-gemm", "NHWC"),
        ("r50_02", "triton-conv", "NHWC"),
        ("r50_00", "triton-stem", "NHWC"),
        ("r50_03", "triton-gemm-nchw", "NCHW"),
        ("r50_10", "triton-window", "NHWC"),
    ],
)
def test_triton_kernels_wait_for_the_kernel_before_them(name, solver, layout):
    """On a device that has it, the kernel launches with programmatic dependent launch, so its first
    instructions may run while the kernel before it still writes; griddepcontrol.wait (ACQBULK) comes
    before any global memory access, the trigger for the next kernel after it. Without, neither is
    there."""
    on = compile_sm90(GRID_DEPENDENCY_ON + layer_build(name, "float16", layout=layout), solver)
    assert on["programmatic dependent launch"] and on[ORDER] == "WPG", on[ORDER]
    off = compile_sm90(layer_build(name, "float16", layout=layout), solver)
    assert not off["programmatic dependent launch"] and off[ORDER] == "G"
    assert "griddepcontrol" not in off["source"]


@pytest.mark.parametrize(
    "name, solver, layout",
    [
        ("r50_19", "gluon-gemm", "NHWC"),
        ("r50_22", "gluon-window", "NHWC"),
        ("r50_22", "gluon-nchw", "NCHW"),
        ("r50_10", "gluon-nchw-regs", "NCHW"),
        ("r50_00", "gluon-stem", "NHWC"),
    ],
)
def test_gluon_kernels_wait_for_the_kernel_before_them(name, solver, layout):
    """The Gluon templates wait for the kernel before them (a no-op in a plain launch) before any
    global memory access but their packed weights' (gluon-stem's filter, r50_22's first round of
    gluon-window's weights: written by stream-ordered copies, never by a kernel that may still
    run): launched with programmatic dependent launch only on a device that has it. The
    warp-specialized ones wait before their partitions start (the SASS places the partitions'
    loads apart from the start, hence the check in the source)."""
    on = compile_sm90(GRID_DEPENDENCY_ON + layer_build(name, "float16", layout=layout), solver)
    source = on["source"]
    assert on["programmatic dependent launch"]
    assert source.index("griddepcontrol.wait") < source.index("griddepcontrol.launch_dependents")
    if "gl.warp_specialize(" in source:
        assert source.index("griddepcontrol.launch_dependents") < source.index("gl.warp_specialize(")
        assert set(on[ORDER]) == {"W", "P", "G"}
    else:
        assert on[ORDER] == "WPG", on[ORDER]
    assert not compile_sm90(layer_build(name, "float16", layout=layout), solver)["programmatic dependent launch"]


#: A plan of 1x1 channel planes (NCHW) beyond one wave: gluon-gemm's persistent tiles of one
#: computing warpgroup, whose epilogue's buffers took the memory of the second warpgroup's unused
#: turn barriers (lab/NOTES.md section 45).
PERSISTENT_PLANES = (
    "x = torch.empty(33, 64, 1024, 1024, dtype=torch.float16, device='meta')\n"
    "plan = fp.FusionPlan(fp.TensorDescriptor.from_tensor(x))\n"
    "add_chain(plan, 'CBNA', conv=fp.ConvolutionDescriptor((0, 0)), k=64, r=1, s=1, param_dtype='float')"
)


@pytest.mark.parametrize(
    "build, solver",
    [
        (PERSISTENT_PLANES, "gluon-gemm"),
        (layer_build("r50_19", "float16"), "gluon-gemm"),
        (layer_build("r50_03", "float16", layout="NCHW"), "gluon-gemm"),
        (layer_build("r50_13", "float16"), "gluon-gemm"),
        (layer_build("r50_13", "float16", layout="NCHW"), "gluon-gemm"),
        (layer_build("r50_22", "float16"), "gluon-window"),
        (layer_build("r50_22", "float16", layout="NCHW"), "gluon-nchw"),
        (layer_build("r50_10", "float16", layout="NCHW"), "gluon-nchw-regs"),
        (layer_build("r50_02", "float16"), "gluon-rows"),
        (layer_build("r50_02", "float16", layout="NCHW"), "gluon-rows"),
        (layer_build("r50_00", "float16"), "gluon-stem"),
    ],
    ids=[
        "gemm-persistent-planes",
        "gemm",
        "gemm-planes",
        "gemm-pingpong",
        "gemm-copied-planes",
        "window",
        "nchw",
        "nchw-regs",
        "rows",
        "rows-planes",
        "stem",
    ],
)
def test_gluon_kernels_invalidate_every_barrier_they_initialize(build, solver):
    """PTX lets an mbarrier's memory serve nothing else until the barrier is invalidated, and
    Triton's allocator hands a barrier's memory to later buffers (an epilogue's) once the barrier
    is dead: so each kernel initializes only the barriers it uses and invalidates every one after
    its last use (on a GPU shared by several processes, an epilogue buffer over an initialized
    barrier came back corrupted)."""
    info = compile_sm90(build, solver)
    inits = info["barriers initialized (PTX mbarrier.init)"]
    assert inits > 0 and info["barriers invalidated (PTX mbarrier.inval)"] == inits
