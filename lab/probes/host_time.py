"""Host time of one eager execute (no synchronization inside the loop), per solver (CUDA only).

python lab/probes/host_time.py --layers r50_22,r50_16 --solvers gluon-window,triton-window
"""

from __future__ import annotations

import argparse
import sys
import time

import torch


def main() -> int:
    import fusionplan as fp
    from fusionplan.tools.shapes import resnet50_layer
    from fusionplan.tools.verify import layer_plan, random_args

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", default="r50_22,r50_16")
    p.add_argument("--solvers", default="gluon-window,triton-window")
    p.add_argument("--batch", type=int, default=32)
    opts = p.parse_args()
    for name in opts.layers.split(","):
        s = resnet50_layer(name)
        x = torch.randn(opts.batch, s.c, s.h, s.w, device="cuda").half().to(memory_format=torch.channels_last)
        for solver in opts.solvers.split(","):
            plan = layer_plan(s, x, "CBNA")
            handle = fp.Handle("cuda")
            plan.compile(handle, solver=solver)
            args = random_args(plan, "cuda", param_dtype=torch.float32)
            y = torch.empty(plan.output_desc.dims, dtype=x.dtype, device="cuda").to(memory_format=torch.channels_last)
            for _ in range(20):
                plan.execute(handle, x, y, args)
            torch.cuda.synchronize()
            host = []
            for _ in range(5):
                t0 = time.perf_counter()
                for _ in range(50):
                    plan.execute(handle, x, y, args)
                host.append((time.perf_counter() - t0) / 50 * 1e6)
                torch.cuda.synchronize()
            print(f"{name} {solver}: host {min(host):.1f} us per execute")
    return 0


if __name__ == "__main__":
    sys.exit(main())
