"""The sm_90 SASS of a solver's kernels, hashed, to show a change to a template left the compiled
code as it was (a dead branch removed changes the source, so kernel_fingerprint.py cannot).

Compiled on the CPU, without a GPU, for each layer with and without a prior output:

    python lab/probes/sass_fingerprint.py before.json gluon-nchw r50_22:float16:NCHW r50_18:bfloat16:NCHW:8
    python lab/probes/sass_fingerprint.py after.json gluon-nchw r50_22:float16:NCHW r50_18:bfloat16:NCHW:8
    python lab/probes/sass_fingerprint.py --compare before.json after.json

A case is LAYER:DTYPE:LAYOUT[:BATCH] (ResNet-50's layer names, CBNA; batch 32 by default). The
kernel's name and the file's header lines are left out of the hash.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import sys
from pathlib import Path

os.environ.pop("TRITON_INTERPRET", None)  # compile, not interpret

import torch  # noqa: E402

import fusionplan as fp  # noqa: E402
from fusionplan.runtime.sass import compile_for_hopper  # noqa: E402
from fusionplan.solvers import solver_named  # noqa: E402
from fusionplan.tools.shapes import resnet50_layer  # noqa: E402
from fusionplan.tools.verify import layer_plan  # noqa: E402

HEADER = re.compile(r"\.(text|section|global|type|size|file|headerflags|elftype)|Function :|^\s*$|//--")
KERNEL_NAME = re.compile(r"\b\w+_kernel\b")


def sass_digest(sass: str) -> tuple[str, int]:
    body = "\n".join(line for line in sass.split("\n") if not HEADER.search(line))
    body = KERNEL_NAME.sub("KERNEL", body)
    return hashlib.sha1(body.encode()).hexdigest()[:16], body.count("\n") + 1


def case_kernel(solver: str, case: str):
    name, dtype, layout, *batch = case.split(":")
    shape = resnet50_layer(name)
    x = torch.empty(int(batch[0]) if batch else 32, shape.c, shape.h, shape.w, dtype=getattr(torch, dtype))
    if layout == "NHWC":
        x = x.to(memory_format=torch.channels_last)
    return solver_named(solver).build(layer_plan(shape, x, "CBNA").spec(), fp.Handle("cpu"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("args", nargs="*", help="OUT SOLVER CASE...")
    parser.add_argument("--compare", nargs=2, metavar=("BEFORE", "AFTER"))
    opts = parser.parse_args(argv)
    if opts.compare:
        before, after = (json.loads(Path(p).read_text()) for p in opts.compare)
        differ = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
        print("differences:", differ or "none")
        return 1 if differ else 0
    if len(opts.args) < 3:
        parser.error("give OUT SOLVER CASE..., or --compare BEFORE AFTER")
    out, solver, *cases = opts.args
    result = {}
    for case in cases:
        kernel = case_kernel(solver, case)
        for prior in (False, True):
            result[f"{solver}:{case}:{'prior' if prior else 'plain'}"] = sass_digest(
                compile_for_hopper(kernel, prior)[1].asm["sass"]
            )
    Path(out).write_text(json.dumps(result, indent=1))
    print(f"{len(result)} kernels -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
