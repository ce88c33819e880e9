import time, torch, triton
import fusionplan as fp
from fusionplan.shapes import load_shapes
from fusionplan.verify import layer_plan, random_args
zoo = {s.name: s for s in load_shapes("zoo")}
def host(f, n=200):
    torch.cuda.synchronize(); best = 1e9
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(n): f()
        best = min(best, (time.perf_counter() - t0) / n * 1e6)
        torch.cuda.synchronize()
    return best
for name in ("zoo_001", "zoo_036"):
    s = zoo[name]
    x = torch.randn(32, s.c, s.h, s.w, device="cuda").half().to(memory_format=torch.channels_last)
    plan = layer_plan(s, x, "CBNA"); h = fp.Handle("cuda"); plan.compile(h, solver="cudnn")
    args = random_args(plan, "cuda", param_dtype=torch.float32)
    y = torch.empty(plan.output_desc.dims, dtype=x.dtype, device="cuda").to(memory_format=torch.channels_last)
    plan.execute(h, x, y, args); torch.cuda.synchronize()
    kern = plan._compiled_kernel() if hasattr(plan, "_compiled_kernel") else None
    from fusionplan.solvers.cudnn_vendor import CudnnKernel
    import gc
    ks = [o for o in gc.get_objects() if isinstance(o, CudnnKernel)]
    k = ks[-1]
    records = [args.get(op) for op in plan.ops]
    prep = k.prepared(records)
    out = k._call(x, prep.call, None)
    print(name, "bound stores:", len(k._stores))
    print(" sum", host(lambda: x.sum(dtype=torch.float32)))
    print(" data_ptr x8", host(lambda: [t.data_ptr() for t in (x, y, out, x, y, out, x, y)]))
    print(" store", host(lambda: k._store(out, y, x, prep.call, None)))
    print(" copy_", host(lambda: y.copy_(out)))
    print(" one call", host(lambda: k._call(x, prep.call, None)))
    print(" prepared", host(lambda: k.prepared(records)))
    print(" kernel.run", host(lambda: k.run(x, y, records, None)))
    print(" execute", host(lambda: plan.execute(h, x, y, args)))
    print(" empty torch op", host(lambda: torch.empty(1, device="cuda")))
