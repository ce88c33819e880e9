"""The compiled kernels' structure on Hopper, checked without a GPU: Triton's own ptxas builds the
sm_90 binary (scripts/inspect_sass.py) and the SASS shows what the H100 measurements depend on
(bench/NOTES.md, section 10)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "inspect_sass.py"


def inspect(*args: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, env=env, timeout=300)
    if out.returncode != 0 and "ptxas" in out.stderr:
        pytest.skip(f"no usable ptxas in this Triton: {out.stderr[-300:]}")
    assert out.returncode == 0, out.stderr[-2000:]
    lines = [line.strip() for line in out.stdout.splitlines() if line.startswith("  ")]
    return dict(line.split(": ", 1) for line in lines)


pytest.importorskip("triton")


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
    from .util import compile_sm90

    build = (
        "x = torch.empty(4, 128, 15, 15, dtype=torch.float16).to(memory_format=torch.channels_last)\n"
        "plan = fp.FusionPlan(fp.TensorDescriptor.from_tensor(x))\n"
        "add_chain(plan, 'CBNA', conv=fp.ConvolutionDescriptor((1, 1), (2, 2)), k=128, r=3, s=3, param_dtype='half')"
    )
    info = compile_sm90(build, "triton-window")
    assert "class_desc = tl.make_tensor_descriptor" in info["source"] and info["HGMMA"] > 0
