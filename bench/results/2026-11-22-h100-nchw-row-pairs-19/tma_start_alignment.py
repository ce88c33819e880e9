import subprocess
import sys

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor


@triton.jit
def box_kernel(desc, out_ptr, col, BR: tl.constexpr, BC: tl.constexpr):
    r = tl.program_id(0) * BR
    t = desc.load([r, col])
    offs_r = r + tl.arange(0, BR)
    offs_c = tl.arange(0, BC)
    tl.store(out_ptr + offs_r[:, None] * BC + offs_c[None, :], t)


@triton.jit
def bw_kernel(desc, out_ptr, shift, R, BR: tl.constexpr, BC: tl.constexpr, W: tl.constexpr):
    # sum of boxes: every row block, columns shift, shift+BC (within W)
    pid = tl.program_id(0)
    acc = tl.zeros((BR, BC), tl.float32)
    for r in range(pid * BR, R, tl.num_programs(0) * BR):
        acc += desc.load([r, shift]).to(tl.float32)
    tl.store(out_ptr + pid * BR * BC + tl.arange(0, BR)[:, None] * BC + tl.arange(0, BC)[None, :], acc)


def one(col, dtype=torch.float16, W=392, BC=256):
    R = 4096
    x = torch.randn(R, W, device="cuda").to(dtype)
    desc = TensorDescriptor.from_tensor(x, [16, BC])
    out = torch.full((R, BC), float("nan"), device="cuda", dtype=dtype)
    box_kernel[(R // 16,)](desc, out, col, 16, BC)
    torch.cuda.synchronize()
    ref = torch.zeros(R, BC, device="cuda", dtype=dtype)
    n = max(0, min(BC, W - col))
    ref[:, :n] = x[:, col : col + n]
    ok = torch.equal(out, ref)
    print(f"col={col} bytes_off={col * x.element_size()} ok={ok}", flush=True)


def bw(shift, W=392, BC=256):
    R = 32 * 1024 * 2  # rows of 784 bytes: ~51 MB
    x = torch.randn(R, W, device="cuda", dtype=torch.float16)
    desc = TensorDescriptor.from_tensor(x, [32, BC])
    progs = 132 * 4
    out = torch.empty(progs * 32 * BC, device="cuda", dtype=torch.float32)
    f = lambda: bw_kernel[(progs,)](desc, out, shift, R, 32, BC, W)
    ms = triton.testing.do_bench(f, warmup=50, rep=200)
    moved = R * BC * 2
    print(f"bw shift={shift} {ms * 1e3:.1f} us  {moved / ms / 1e6:.0f} GB/s of box bytes", flush=True)


if __name__ == "__main__":
    if len(sys.argv) > 1:
        kind, v = sys.argv[1], int(sys.argv[2])
        one(v) if kind == "one" else bw(v)
        sys.exit(0)
    print(torch.__version__, triton.__version__, torch.cuda.get_device_name())
    for col in (0, 8, 196, 4, 2, 1, 49, 98, 147, 100):
        r = subprocess.run([sys.executable, __file__, "one", str(col)], capture_output=True, text=True)
        print(r.stdout.strip() or f"FAIL rc={r.returncode} {r.stderr.strip()[-300:]}", flush=True)
    for s in (0, 8, 196, 4, 1):
        r = subprocess.run([sys.executable, __file__, "bw", str(s)], capture_output=True, text=True)
        print(r.stdout.strip() or f"FAIL rc={r.returncode} {r.stderr.strip()[-300:]}", flush=True)
