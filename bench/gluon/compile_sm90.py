"""Compile bench/gluon/window_ws.py for sm_90 without a GPU and summarize its SASS (Triton 3.6).

CFG=TILE_N,TILE_H,TILE_W,BLOCK_N,BLOCK_K,STAGES,WARPS python bench/gluon/compile_sm90.py
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import triton
import triton.backends.nvidia as nvidia
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource
from triton.experimental.gluon.language._layouts import NVMMASharedLayout

sys.path.insert(0, str(Path(__file__).parent))
import window_ws  # noqa: E402


def main() -> None:
    tn, th, tw, bn, bk, stages, warps = (int(v) for v in os.environ.get("CFG", "4,4,4,128,64,6,4").split(","))
    x_layout = NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=4)
    w_layout = NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
    signature = {
        "x_desc": f"tensordesc<fp16[{tn},{th},{tw},{bk}],{x_layout!r}>",
        "w_desc": f"tensordesc<fp16[{bn},{bk}],{w_layout!r}>",
        "y_ptr": "*fp16",
        "scale_ptr": "*fp32",
        "shift_ptr": "*fp32",
        **{name: "i32" for name in ("N", "C", "K", "H", "W", "pad_h", "pad_w")},
    }
    values = {"R": 3, "S": 3, "TILE_N": tn, "TILE_H": th, "TILE_W": tw, "BLOCK_N": bn, "BLOCK_K": bk}
    values.update(NUM_STAGES=stages, NUM_WARPS=warps)
    signature.update({name: "constexpr" for name in values})
    names = list(signature)
    constexprs = {(names.index(name),): value for name, value in values.items()}
    source = GluonASTSource(window_ws.window_ws_kernel, signature, constexprs)
    compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps})
    tools = os.path.join(os.path.dirname(nvidia.__file__), "bin")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compiled.asm["cubin"])
        f.flush()
        sass = subprocess.run([f"{tools}/nvdisasm", "-c", f.name], capture_output=True, text=True).stdout
        usage = subprocess.run([f"{tools}/cuobjdump", "-res-usage", f.name], capture_output=True, text=True).stdout
    print(f"shared bytes {compiled.metadata.shared}; {usage.strip().splitlines()[-1].strip()}")
    waits = re.findall(r"WARPGROUP\.DEPBAR\.LE gsb0, (0x[0-9a-f]+)", sass)
    counts = {op: sass.count(op) for op in ("HGMMA", "UTMALDG", "SETMAXREG", "LDSM")}
    print(f"{counts}, wgmma waits (outstanding groups allowed): {waits}")


if __name__ == "__main__":
    main()
