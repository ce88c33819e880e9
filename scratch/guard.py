"""cudnn solver: GPU time of plan.execute with the finiteness guard vs without, and the raw call."""
import sys, torch, triton
import fusionplan as fp
from fusionplan.shapes import load_shapes
from fusionplan.verify import layer_plan, random_args
from fusionplan.solvers import cudnn_vendor as cv

zoo = {s.name: s for s in load_shapes("zoo")}
names = sys.argv[1].split(",")
import time
def host(f):
    torch.cuda.synchronize(); best = 1e9
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(50): f()
        best = min(best, (time.perf_counter() - t0) / 50 * 1e6)
        torch.cuda.synchronize()
    return best
bench = lambda f: triton.testing.do_bench(f, warmup=25, rep=100, return_mode="median") * 1e3
orig = cv.CudnnKernel._store
copy_only = lambda self, out, y, *a: y.copy_(out)
for name in names:
    s = zoo[name]
    x = torch.randn(32, s.c, s.h, s.w, device="cuda").half().to(memory_format=torch.channels_last)
    plan = layer_plan(s, x, "CBNA")
    h = fp.Handle("cuda")
    plan.compile(h, solver="cudnn")
    args = random_args(plan, "cuda", param_dtype=torch.float32)
    y = torch.empty(plan.output_desc.dims, dtype=x.dtype, device="cuda").to(memory_format=torch.channels_last)
    ex = lambda: plan.execute(h, x, y, args)
    cv.CudnnKernel._store = orig
    guarded = bench(ex); hg = host(ex)
    cv.CudnnKernel._store = copy_only
    plain = bench(ex); hp = host(ex)
    cv.CudnnKernel._store = orig
    w = torch.randn(s.k, s.c // s.groups, s.r, s.s, device="cuda").half().to(memory_format=torch.channels_last)
    b = torch.randn(s.k, device="cuda").half()
    raw = bench(lambda: torch.cudnn_convolution_relu(x, w, b, (s.stride, s.stride_w or s.stride), (s.pad, s.pad_w if s.pad_w is not None else s.pad), (s.dilation,)*2, s.groups))
    # exactness on the GPU: a NaN in x stays NaN
    x2 = x.clone(); x2[0, 0, 0, 0] = float("nan")
    plan.execute(h, x2, y, args); torch.cuda.synchronize()
    nan_kept = bool(torch.isnan(y[0, : s.k // s.groups, 0, 0]).all()) and int(torch.isnan(y).sum())
    print(f"{name} C{s.c} K{s.k} {s.h}x{s.w} {s.r}x{s.s} g{s.groups}: raw {raw:.1f} us, execute {plain:.1f}, guarded {guarded:.1f} (+{guarded-plain:.1f}), NaN kept {nan_kept}; host {hp:.1f} -> {hg:.1f}", flush=True)
