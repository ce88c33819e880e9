"""Probe: a 1x1 convolution (+ bias, ReLU) on NCHW input of 14x14 or 7x7 planes through TMA boxes
of plane groups (lab/probes/plane_groups.py's move, in a pipelined warp-specialized kernel),
against cuDNN and fusionplan's own NCHW kernel for the layer (CUDA only; `--sass` compiles for
sm_90 without a GPU).

    python lab/probes/plane_groups_gemm.py --layers r50_13,r50_15,r50_17,r50_19,r50_21
    python lab/probes/plane_groups_gemm.py --sass

G planes of an image together are whole 16-byte units (G = 2 for 14x14, 8 for 7x7 in fp16), so
the input seen as [N * C / G, G * H * W] is a valid tensor descriptor. Plane j of a group (its
residue) starts j * H * W elements into the row; its boxes ([GROUPS, 64]: GROUPS groups, 64
columns) start at the 16-byte unit below, (j * H * W) mod 8 elements before the plane, and a
shifter warp moves such boxes left by that many columns, the next box's first columns shifted in
(gluon_rows.move_function). The filter is packed by residue ([G * K, C / G]: residue j's input
channels j, j + G, ...), so each residue's product is [128 output channels, GROUPS] x [GROUPS, 64
pixels] per part of the plane (4 parts of 64 for 196 pixels, 1 for 49).

A program computes one image's plane (all its parts; 7x7: two images' planes) for 128 output
channels, two computing warpgroups of 64 each; each reduction step takes GROUPS * G input
channels (64 for 14x14, 128 for 7x7) through a ring (3 stages; 2 for 7x7) filled by a loading
warp; ``ready`` (TMA), ``shifted`` (the shifter) and ``empty`` (both warpgroups' products done)
barriers per stage. The epilogue adds the bias, applies ReLU and stores each channel's pixels by
pointer (8-byte stores for 14x14 planes).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))

from plane_groups import compile_summary  # noqa: E402

from fusionplan.runtime.codegen import load_module  # noqa: E402

BLOCK_K = 128  # output channels of a program


@dataclass(frozen=True)
class Geometry:
    """Where each residue's boxes start and how far its plane sits inside them."""

    plane: int  # pixels of a plane (H * W)
    groups: int  # plane groups a box holds (the reduction of one residue's product)
    images: int = 1  # images a program computes (each its own boxes, moves and accumulators)

    @property
    def residues(self) -> int:  # planes of a group: whole 16-byte units of fp16
        return next(g for g in (1, 2, 4, 8) if self.plane * g % 8 == 0)

    @property
    def parts(self) -> int:  # 64-pixel parts of the plane
        return -(-self.plane // 64)

    def start(self, j: int) -> int:
        return j * self.plane // 8 * 8

    def shift(self, j: int) -> int:
        return j * self.plane % 8

    def fills(self, j: int, q: int) -> bool:
        """Whether part q of residue j reaches into the next box (its pixels past the box's end)."""
        return self.shift(j) + min(64, self.plane - 64 * q) > 64

    def columns(self) -> list[int]:
        """The columns of a step's boxes: each residue's parts, and the next box where a part
        reaches into it (residues share boxes that start at the same column)."""
        wanted = {
            self.start(j) + 64 * (q + extra)
            for j in range(self.residues)
            for q in range(self.parts)
            for extra in ((0, 1) if self.fills(j, q) else (0,))
        }
        return sorted(wanted)

    def moved(self) -> list[tuple[int, int]]:
        """(residue, part) of each moved box of a step."""
        return [(j, q) for j in range(self.residues) if self.shift(j) for q in range(self.parts)]

    def stages(self) -> int:
        """Ring stages (at most 3) whose boxes, moved boxes and filter tiles fit 220 KB."""
        boxes = (len(self.columns()) + len(self.moved())) * self.images * self.groups * 64 * 2
        weights = self.residues * BLOCK_K * self.groups * 2
        return min(3, 220 * 1024 // (boxes + weights))


#: 14x14 planes: an image a program (four 64-pixel parts fill the accumulators); 7x7: two images a
#: program, so that the filter's tiles serve 98 pixels (with one, r50_21's programs would read
#: 64 MB of filter from L2).
GEOMETRIES = {196: Geometry(196, 32), 49: Geometry(49, 16, images=2)}

_SOURCE = """
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared, mbarrier, tma, warpgroup_mma, warpgroup_mma_wait,
)


{helpers}{moves}


@gluon.jit
def _load(x_desc, w_desc, boxes, w_bufs, ready, empty, C, K, NUM_STAGES: gl.constexpr):
    n = gl.program_id(0)
    k0 = gl.program_id(1) * w_desc.block_type.shape[0]
    GROUPS: gl.constexpr = x_desc.block_type.shape[0]
    nbytes: gl.constexpr = {step_boxes} * x_desc.block_type.nbytes + {residues} * w_desc.block_type.nbytes
    for i in range(C // ({residues} * GROUPS)):
        s = i % NUM_STAGES
        mbarrier.wait(empty.index(s), ((i // NUM_STAGES) & 1) ^ 1)
        mbarrier.expect(ready.index(s), nbytes)
{box_loads}
        for j in gl.static_range({residues}):
            {tma_load}(w_desc, [j * K + k0, i * GROUPS], ready.index(s), w_bufs.index(s * {residues} + j))


@gluon.jit
def _shift(boxes, moved, ready, shifted, C, NUM_STAGES: gl.constexpr, GROUPS: gl.constexpr):
    # the planes inside their boxes moved to column 0, the next box's columns shifted in
    rows: gl.constexpr = gl.BlockedLayout([1, 64], [32, 1], [gl.num_warps(), 1], [1, 0])
    for i in range(C // ({residues} * GROUPS)):
        s = i % NUM_STAGES
        mbarrier.wait(ready.index(s), (i // NUM_STAGES) & 1)
{moves_done}
        fence_async_shared()
        {thread_barrier}()
        mbarrier.arrive(shifted.index(s))


@gluon.jit
def _compute(
    boxes, moved, w_bufs, ready, shifted, empty, y_ptr, bias_ptr, C, K,
    NUM_STAGES: gl.constexpr, GROUPS: gl.constexpr, CONSUMER: gl.constexpr, PLANE: gl.constexpr,
):
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[gl.num_warps(), 1], instr_shape=[16, 64, 16]
    )
{acc_init}
    for i in range(C // ({residues} * GROUPS)):
        s = i % NUM_STAGES
        phase = (i // NUM_STAGES) & 1
        mbarrier.wait(ready.index(s), phase)
        mbarrier.wait(shifted.index(s), phase)
{products}
        {waited} = warpgroup_mma_wait(num_outstanding=0, deps=[{accs}])
        mbarrier.arrive(empty.index(s))
    n = gl.program_id(0)
    k0 = gl.program_id(1) * 128 + CONSUMER * 64
    out_layout: gl.constexpr = gl.BlockedLayout([1, 4], [2, 16], [gl.num_warps(), 1], [1, 0])
    r = gl.arange(0, 64, layout=gl.SliceLayout(1, out_layout))
    c = gl.arange(0, 64, layout=gl.SliceLayout(0, out_layout))
    bias = gl.load(bias_ptr + k0 + r)
{stores}


@gluon.jit
def plane_groups_gemm_kernel(
    x_desc, w_desc, y_ptr, bias_ptr, C, K, NUM_STAGES: gl.constexpr, PLANE: gl.constexpr,
):
    GROUPS: gl.constexpr = x_desc.block_type.shape[0]
    flat: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
    boxes = gl.allocate_shared_memory(x_desc.dtype, [NUM_STAGES * {step_boxes}, GROUPS, 64], x_desc.layout)
    moved = gl.allocate_shared_memory(x_desc.dtype, [NUM_STAGES * {step_moved}, GROUPS, 64], flat)
    w_bufs = gl.allocate_shared_memory(w_desc.dtype, [NUM_STAGES * {residues}, 128, GROUPS], w_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    shifted = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(NUM_STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(shifted.index(i), count=1)
        mbarrier.init(empty.index(i), count=2)
    fence_async_shared()
    gl.warp_specialize(
        [
            (_compute, (boxes, moved, w_bufs, ready, shifted, empty, y_ptr, bias_ptr, C, K,
                        NUM_STAGES, GROUPS, 0, PLANE)),
            (_compute, (boxes, moved, w_bufs, ready, shifted, empty, y_ptr, bias_ptr, C, K,
                        NUM_STAGES, GROUPS, 1, PLANE)),
            (_load, (x_desc, w_desc, boxes, w_bufs, ready, empty, C, K, NUM_STAGES)),
            (_shift, (boxes, moved, ready, shifted, C, NUM_STAGES, GROUPS)),
        ],
        [4, 1, 1],
        [208, 96, 96],
    )
    for i in gl.static_range(NUM_STAGES):  # after their last use (PTX, before the memory serves anything else)
        mbarrier.invalidate(ready.index(i))
        mbarrier.invalidate(empty.index(i))
        mbarrier.invalidate(shifted.index(i))
"""


def render(geo: Geometry) -> str:
    """The probe's kernel source for one plane size."""
    from fusionplan.solvers.gluon_toolkit import gluon_names
    from fusionplan.solvers.templates.gluon_rows import MOVE_HELPERS, move_function

    names = gluon_names()
    columns = geo.columns()
    box_at = {col: t for t, col in enumerate(columns)}
    moved_of = {key: m for m, key in enumerate(geo.moved())}
    n_boxes, n_moved = len(columns), max(1, len(moved_of))
    step_boxes, step_moved = n_boxes * geo.images, n_moved * geo.images
    box_loads, moves_done, products, stores = [], [], [], []
    for b in range(geo.images):
        box_loads.append(f"        row = (n * {geo.images} + {b}) * (C // {geo.residues}) + i * GROUPS")
        box_loads += [
            f"        {names['tma_load']}(x_desc, [row, {col}], ready.index(s), "
            f"boxes.index(s * {step_boxes} + {b * n_boxes + t}))"
            for t, col in enumerate(columns)
        ]
        for (j, q), m in moved_of.items():
            col = geo.start(j) + 64 * q
            moves_done.append(f"        x = boxes.index(s * {step_boxes} + {b * n_boxes + box_at[col]}).load(rows)")
            if geo.fills(j, q):
                nxt = b * n_boxes + box_at[col + 64]
                moves_done.append(f"        y = boxes.index(s * {step_boxes} + {nxt}).load(rows)")
                move = f"_moved_{geo.shift(j)}(x, y)"
            else:
                move = f"_shift_{geo.shift(j)}(x)"
            moves_done.append(f"        moved.index(s * {step_moved} + {b * n_moved + m}).store({move})")
        for q in range(geo.parts):
            acc = f"a{b}{q}"
            for j in range(geo.residues):
                if geo.shift(j):
                    operand = f"moved.index(s * {step_moved} + {b * n_moved + moved_of[(j, q)]})"
                else:
                    operand = f"boxes.index(s * {step_boxes} + {b * n_boxes + box_at[geo.start(j) + 64 * q]})"
                w = f"w_bufs.index(s * {geo.residues} + {j}).slice(CONSUMER * 64, 64)"
                products.append(f"        {acc} = warpgroup_mma({w}, {operand}, {acc}, is_async=True)")
            stores += [
                f"    plane = ((n * {geo.images} + {b}) * K + k0 + r) * PLANE",
                f"    h = gl.convert_layout({acc}, out_layout) + bias[:, None]",
                "    h = gl.maximum(h, 0.0).to(y_ptr.dtype.element_ty)",
                f"    col = {q * 64} + c",
                "    gl.store(y_ptr + plane[:, None] + col[None, :], h, mask=(col < PLANE)[None, :])",
            ]
    names_acc = [f"a{b}{q}" for b in range(geo.images) for q in range(geo.parts)]
    accs = ", ".join(names_acc)
    filled = {geo.shift(j) for j, q in moved_of if geo.fills(j, q)}
    zeroed = {geo.shift(j) for j, q in moved_of if not geo.fills(j, q)}
    moves = [move_function(f"_moved_{d}", d, 64, with_next=True) for d in sorted(filled)]
    moves += [move_function(f"_shift_{d}", d, 64) for d in sorted(zeroed)]
    return _SOURCE.format(
        helpers=MOVE_HELPERS,
        moves="\n\n".join(moves),
        step_boxes=step_boxes,
        step_moved=step_moved,
        residues=geo.residues,
        box_loads="\n".join(box_loads),
        moves_done="\n".join(moves_done) or "        pass",
        acc_init="\n".join(f"    {a} = gl.zeros((64, 64), gl.float32, acc_layout)" for a in names_acc),
        products="\n".join(products),
        accs=accs,
        waited=accs if len(names_acc) > 1 else names_acc[0],
        stores="\n".join(stores),
        tma_load=names["tma_load"],
        thread_barrier=names["thread_barrier"],
    )


def build(geo: Geometry):
    return load_module(render(geo), "plane_groups_gemm")[0].plane_groups_gemm_kernel


def launch(kernel, geo: Geometry, x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor, y: torch.Tensor) -> None:
    """y = relu(conv1x1(x, w) + bias), x [N, C, H, W] and y [N, K, H, W] NCHW fp16."""
    from fusionplan.solvers.gluon_toolkit import gluon_descriptor

    n, c = x.shape[:2]
    k, g = w.shape[0], geo.residues
    groups = x.reshape(n * c // g, g * geo.plane)
    x_desc = gluon_descriptor(groups, list(groups.shape), [g * geo.plane, 1], [geo.groups, 64], 128, 16)
    by_residue = w.reshape(k, c // g, g).permute(2, 0, 1).reshape(g * k, c // g).contiguous()
    swizzle = min(128, geo.groups * 2)
    w_desc = gluon_descriptor(by_residue, [g * k, c // g], [c // g, 1], [BLOCK_K, geo.groups], swizzle, 16)
    kernel[(n // geo.images, k // BLOCK_K)](x_desc, w_desc, y, bias, c, k, geo.stages(), geo.plane, num_warps=4)


def graph_time_us(fn, reps: int = 20, rounds: int = 15) -> float:
    """Median time of ``fn`` in a CUDA graph of ``reps`` calls, per call."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(reps):
            fn()
    times = []
    for _ in range(rounds):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1000 / reps)
    return sorted(times)[len(times) // 2]


def layer_tensors(shape) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A 1x1 layer's fresh random NCHW fp16 input at batch 32, its filter [K, C, 1, 1] (fp16, scaled
    by 1 / sqrt(C)) and an fp32 bias, on the GPU."""
    x = torch.randn(32, shape.c, shape.h, shape.w, device="cuda").half()
    w = (torch.randn(shape.k, shape.c, 1, 1, device="cuda") / shape.c**0.5).half()
    return x, w, torch.randn(shape.k, device="cuda")


def fusionplan_times(shape, x: torch.Tensor) -> dict[str, tuple[str, float]]:
    """fusionplan's CBA plan of the layer ``shape`` on ``x`` (NCHW) and on x channels-last: for each
    layout, the solver compile picked and its time (graph_time_us)."""
    import fusionplan as fp
    from fusionplan.tools.verify import layer_plan, random_args

    times = {}
    for layout, xin in (("NCHW", x), ("NHWC", x.to(memory_format=torch.channels_last))):
        plan = layer_plan(shape, xin, "CBA")
        handle = fp.Handle("cuda")
        plan.compile(handle)
        args = random_args(plan, "cuda", param_dtype=torch.float32)
        out = torch.empty(plan.output_desc.dims, device="cuda", dtype=torch.float16)
        if layout == "NHWC":
            out = out.to(memory_format=torch.channels_last)
        run = lambda p=plan, h=handle, xi=xin, o=out, a=args: p.execute(h, xi, o, a)  # noqa: E731
        times[layout] = (plan.compiled_solver(handle), graph_time_us(run))
    return times


def measure(layer: str, images_7x7: int) -> None:
    import fusionplan as fp
    from fusionplan.tools.shapes import resnet50_layer
    from fusionplan.tools.verify import layer_plan, random_args

    s = resnet50_layer(layer)
    geo = GEOMETRIES.get(s.h * s.w)
    assert geo and (s.r, s.stride) == (1, 1), f"{layer}: a stride-1 1x1 layer on 14x14 or 7x7 planes"
    if geo.plane == 49:
        geo = replace(geo, images=images_7x7)
    x, w, bias = layer_tensors(s)
    y = torch.full((32, s.k, s.h, s.w), float("nan"), device="cuda", dtype=torch.float16)
    kernel = build(geo)
    launch(kernel, geo, x, w, bias, y)
    expected = torch.relu(torch.nn.functional.conv2d(x.float(), w.float()) + bias[None, :, None, None])
    err = ((y.float() - expected).norm() / expected.norm()).item()
    probe = graph_time_us(lambda: launch(kernel, geo, x, w, bias, y))
    cudnn = graph_time_us(lambda: torch.relu(torch.nn.functional.conv2d(x, w, bias.half())))
    plan = layer_plan(s, x, "CBA")
    handle = fp.Handle("cuda")
    plan.compile(handle)
    args = random_args(plan, "cuda", param_dtype=torch.float32)
    out = torch.empty(plan.output_desc.dims, device="cuda", dtype=torch.float16)
    ours = graph_time_us(lambda: plan.execute(handle, x, out, args))
    print(
        f"{layer}: probe ({geo.images} image(s) a program) {probe:.2f} us "
        f"(rel. error {err:.1e}, NaN left {int(y.isnan().sum())}), "
        f"{plan.compiled_solver(handle)} {ours:.2f}, cuDNN conv+bias+relu (unfused calls) {cudnn:.2f}"
    )


def print_sass(geo: Geometry) -> None:
    from triton.experimental.gluon import language as gl

    x_layout = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
    w_layout = gl.NVMMASharedLayout(swizzle_byte_width=min(128, geo.groups * 2), element_bitwidth=16, rank=2)
    signature = {
        "x_desc": f"tensordesc<fp16[{geo.groups},64],{x_layout!r}>",
        "w_desc": f"tensordesc<fp16[{BLOCK_K},{geo.groups}],{w_layout!r}>",
    }
    info = compile_probe(build(geo), signature, {"NUM_STAGES": geo.stages(), "PLANE": geo.plane})
    print(f"{geo.plane}-pixel planes:", summary_line(info))


def compile_probe(kernel, descriptors: dict, constexprs: dict) -> dict:
    """The SASS summary (plane_groups.compile_summary) of a probe kernel whose parameters are
    ``descriptors`` then (y_ptr, bias_ptr, C, K) then ``constexprs`` (name: value), as a launch
    specializes them."""
    signature = descriptors | {"y_ptr": "*fp16", "bias_ptr": "*fp32", "C": "i32", "K": "i32"}
    first = len(descriptors)
    values = {(len(signature) + i,): v for i, v in enumerate(constexprs.values())}
    signature |= {name: "constexpr" for name in constexprs}
    aligned = [["tt.divisibility", 16]]  # as a launch specializes 16-byte aligned pointers
    return compile_summary(kernel, signature, values, {(first,): aligned, (first + 1,): aligned})


def summary_line(info: dict) -> str:
    """A probe's SASS summary on one line: instruction counts, stores, waits, resources, shared memory."""
    waits = len(info["wgmma waits (outstanding groups allowed)"])
    stores, shared = info["global stores by bytes"], info["shared bytes (dynamic)"]
    return f"{info['counts']} stores by bytes {stores} waits {waits} {info['resources']} shared {shared}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", default="r50_13,r50_15,r50_17,r50_19,r50_21")
    p.add_argument("--sass", action="store_true", help="compile for sm_90 and print the SASS summaries")
    p.add_argument("--images-7x7", type=int, default=2, choices=(1, 2), help="images a program on 7x7 planes")
    a = p.parse_args()
    if a.sass or not torch.cuda.is_available():
        for geo in GEOMETRIES.values():
            print_sass(geo)
        return
    for layer in a.layers.split(","):
        measure(layer, a.images_7x7)


if __name__ == "__main__":
    main()
