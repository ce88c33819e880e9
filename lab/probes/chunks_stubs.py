"""Probe: where gluon-plane-chunks' time goes, by taking parts of its gathering side away (CUDA only).

    python lab/probes/chunks_stubs.py --layers r50_19           # times each variant (wrong results but the full one)
    python lab/probes/chunks_stubs.py --depths 256,512,1024,2048  # r50_19 with C of each: a step's cost and the rest

Variants of the generated kernel, each timed as tile_sweep times a configuration (CUDA-graph
replays, input sets rotated out of L2; ``--warm``: one set warm in L2, as the stubs recorded in
lab/NOTES.md section 51 ran):
  full:      the kernel as built;
  no-gather: each step's loaded elements stored as the operand unchanged (a reshape), the gather's
             pass through shared memory left out;
  no-loads:  as no-gather, with every load masked off (no input read at all): what is left is the
             pipeline's handshakes, the weights' boxes, the products and the epilogue;
  no-stores: as no-loads, with every store of the output masked off at run time (the chain still
             computed and its layout changed): what the output's stores cost;
  acc-stores: the whole kernel (right results), its output stored from the accumulator's layout
             rather than changed to lanes along the planes first (no pass through shared memory).
The stubs' results are wrong by construction (tile_sweep says so); only their times count.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

from tile_sweep import parse_tiles, sweep_layer  # noqa: E402

from fusionplan.solvers import gluon_plane_chunks, staged_toolkit  # noqa: E402

NO_GATHER = (
    """    _, _, places = geo
    flat = gl.gather(gl.reshape(raw, [RAW_ROWS * RAW_COLS]), places, 0)
    return gl.reshape(flat, [PIXELS, BLOCK_K])""",
    """    return gl.reshape(gl.reshape(raw, [RAW_ROWS * RAW_COLS]), [PIXELS, BLOCK_K])""",
)
NO_LOADS = ("    live = (image < NOH) & (g < n)", "    live = (image < 0) & (g < n)")
NO_STORES = (
    "    mask = m_mask[:, None] & n_mask[None, :]\n",
    "    mask = m_mask[:, None] & n_mask[None, :] & (syn < 0)\n",
)
VARIANTS = {
    "full": (),
    "no-gather": (NO_GATHER,),
    "no-loads": (NO_GATHER, NO_LOADS),
    "no-stores": (NO_GATHER, NO_LOADS),  # and the stores (variant_store)
    "acc-stores": (),  # the template's stores (variant_template)
}
#: The stores' layout: the accumulator's own (after its permutation), for the acc-stores variant.
ACC_STORES = (
    """        if OUT_PIXEL_MAJOR:
            out_layout: gl.constexpr = gl.BlockedLayout([OUT_VEC, 1], [32, 1], [1, gl.num_warps()], [0, 1])
        else:
            out_layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [gl.num_warps(), 1], [1, 0])
        ohw = OH * OW
        acc = gl.permute(acc, (1, 0))  # the chain in the accumulator's own layout, [slots, channels]
""",
    """        ohw = OH * OW
        acc = gl.permute(acc, (1, 0))  # the chain in the accumulator's own layout, [slots, channels]
        out_layout: gl.constexpr = acc.type.layout
""",
)


def replaced(text: str, stubs: tuple) -> str:
    """``text`` with each (old, new) of ``stubs`` replaced (each old found exactly once)."""
    for old, new in stubs:
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    return text


def variant_source(name: str) -> str:
    """The chunks' gather functions of variant ``name``."""
    return replaced(gluon_plane_chunks.CHUNKS_GATHER, VARIANTS[name])


def variant_template(name: str) -> str:
    """gluon-row-pairs' template of variant ``name``."""
    return replaced(staged_toolkit._TEMPLATE, (ACC_STORES,) if name == "acc-stores" else ())


def variant_store(name: str) -> str:
    """gluon-row-pairs' store text of variant ``name``."""
    return replaced(staged_toolkit._STORE, (NO_STORES,) if name == "no-stores" else ())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", default="r50_19")
    p.add_argument("--tiles", type=parse_tiles, default=parse_tiles("keep"))
    p.add_argument("--depths", default="", help="comma-separated input channels: r50_19's shape with each C instead")
    p.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated, of " + ", ".join(VARIANTS))
    p.add_argument("--solver", default="gluon-plane-chunks", help="gluon-row-pairs: the template's variants only")
    p.add_argument("--warm", action="store_true", help="one input set warm in L2 (as the recorded stubs ran)")
    opts = p.parse_args()
    import dataclasses

    from fusionplan.tools.shapes import load_shapes

    shapes = {s.name: s for s in load_shapes(None)}
    if opts.depths:
        base = shapes["r50_19"]
        for c in opts.depths.split(","):
            shapes[f"r50_19-C{c}"] = dataclasses.replace(base, name=f"r50_19-C{c}", c=int(c))
        opts.layers = ",".join(f"r50_19-C{c}" for c in opts.depths.split(","))
    sweep = argparse.Namespace(
        batch=32,
        precision="fp16",
        layout="NCHW",
        mode="CBNA",
        solver=opts.solver,
        tiles=opts.tiles,
        splits=[1],
        warm=opts.warm,
    )
    original = gluon_plane_chunks.CHUNKS_GATHER, staged_toolkit._STORE, staged_toolkit._TEMPLATE
    for layer in opts.layers.split(","):
        for name in opts.variants.split(","):
            patched = variant_source(name), variant_store(name), variant_template(name)
            gluon_plane_chunks.CHUNKS_GATHER, staged_toolkit._STORE, staged_toolkit._TEMPLATE = patched
            try:
                rows = sweep_layer(shapes[layer], sweep)
            finally:
                gluon_plane_chunks.CHUNKS_GATHER, staged_toolkit._STORE, staged_toolkit._TEMPLATE = original
            for _, line in sorted(rows):
                print(f"{layer} {name}:{line}")


if __name__ == "__main__":
    main()
