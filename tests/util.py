"""Test helpers: random arguments, poisoned outputs, and the float64 oracle comparison."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys

import pytest
import torch

import fusionplan as fp
from fusionplan.oracle.reference import run_reference
from fusionplan.tools.verify import ACTIV_PARAMS, EPS, TOLERANCE, compare, random_args, random_record  # noqa: F401

#: Shared memory a program of sm_90 may take (227 KB; the H100's and the H200's limit).
HOPPER_SHARED_BYTES = 232448

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
DT_NAME = {torch.float32: "float", torch.float16: "half", torch.bfloat16: "bfloat16", torch.float64: "double"}

# (N, C, H, W, K, R, S, pad, stride, dilation, groups)
CONV_SHAPES = {
    "stem-C3": (2, 3, 13, 11, 17, 3, 3, (1, 1), (1, 1), (1, 1), 1),
    "stride2": (2, 8, 13, 11, 16, 3, 3, (1, 1), (2, 2), (1, 1), 1),
    "dilation2": (1, 5, 12, 10, 7, 3, 3, (2, 2), (1, 1), (2, 2), 1),
    "grouped": (2, 6, 9, 9, 9, 3, 3, (1, 1), (1, 1), (1, 1), 3),
    "depthwise": (2, 8, 11, 7, 8, 3, 3, (1, 1), (1, 1), (1, 1), 8),
    "1x1": (3, 16, 7, 7, 17, 1, 1, (0, 0), (1, 1), (1, 1), 1),
    "asymmetric": (1, 4, 10, 13, 5, 1, 5, (0, 2), (1, 2), (1, 1), 1),
    "7x7-stride2-pad3": (1, 3, 16, 16, 8, 7, 7, (3, 3), (2, 2), (1, 1), 1),
}


def make_input(shape, dtype, layout: str = "NCHW", device="cpu", gen=None) -> torch.Tensor:
    x = torch.randn(shape, generator=gen, dtype=torch.float32).to(dtype)
    if layout == "NHWC":
        x = x.to(memory_format=torch.channels_last)
    return x.to(device)


def seeded_alpha_beta_args(
    plan: fp.FusionPlan, seed: int, device: str = "cpu", param_dtype: torch.dtype | None = None
) -> fp.OperatorArgs:
    """Random arguments of every operator on ``device`` with alpha in [0.5, 2) and beta in [-1, 1),
    drawn from ``seed`` (alpha, then beta, operator by operator)."""
    rng = random.Random(seed)
    args = fp.OperatorArgs()
    for op in plan.ops:
        alpha, beta = rng.uniform(0.5, 2), rng.uniform(-1, 1)
        args.set(op, random_record(op, device, param_dtype=param_dtype, alpha=alpha, beta=beta))
    return args


def plan_for(x: torch.Tensor) -> fp.FusionPlan:
    """An empty plan whose input descriptor is x's."""
    return fp.FusionPlan(fp.TensorDescriptor.from_tensor(x))


#: Odd shapes of 16 or more input channels per group, where triton-conv's reduction runs over taps
#: and channel blocks (fewer fold a filter row into each step): the same kinds as CONV_SHAPES, a
#: channel count that no block divides, and a 7x7 filter (49 taps: more than one bit each in 32).
TAP_SHAPES = {
    "3x3": (2, 24, 13, 11, 17, 3, 3, (1, 1), (1, 1), (1, 1), 1),
    "stride2": (2, 16, 13, 11, 16, 3, 3, (1, 1), (2, 2), (1, 1), 1),
    "dilation2": (1, 20, 12, 10, 7, 3, 3, (2, 2), (1, 1), (2, 2), 1),
    "grouped": (2, 32, 9, 9, 18, 3, 3, (1, 1), (1, 1), (1, 1), 2),
    "asymmetric": (1, 16, 10, 13, 5, 1, 5, (0, 2), (1, 2), (1, 1), 1),
    "5x5-valid": (1, 16, 11, 9, 8, 5, 5, (0, 0), (1, 1), (1, 1), 1),
    "C40": (1, 40, 7, 6, 9, 3, 3, (1, 1), (1, 1), (1, 1), 1),
    "7x7": (1, 16, 9, 9, 8, 7, 7, (3, 3), (1, 1), (1, 1), 1),
}


def shape_plan(
    shape_key, chain, dtype, layout, bn_mode=None, act=None, w_layout="NCHW", device="cpu", shapes=CONV_SHAPES
):
    """A random input of the named odd shape (``shapes``) and the plan of ``chain`` on it."""
    from fusionplan.core.enums import ActivationMode, BatchNormMode
    from fusionplan.tools.verify import add_chain

    n, c, h, w, k, r, s, pad, stride, dil, groups = shapes[shape_key]
    x = make_input((n, c, h, w), dtype, layout, device)
    plan = add_chain(
        plan_for(x),
        chain,
        conv=fp.ConvolutionDescriptor(pad, stride, dil, groups),
        k=k,
        r=r,
        s=s,
        w_layout=w_layout,
        bn_mode=bn_mode if bn_mode is not None else BatchNormMode.SPATIAL,
        activation=act if act is not None else ActivationMode.RELU,
        param_dtype=DT_NAME[dtype],
    )
    return plan, x


def poisoned(desc: fp.TensorDescriptor, layout: str = "NCHW", device="cpu") -> torch.Tensor:
    fmt = torch.channels_last if layout == "NHWC" else torch.contiguous_format
    return torch.full(desc.dims, float("nan"), dtype=desc.dtype.torch_dtype, device=device).to(memory_format=fmt)


def check_against_reference(plan, handle, x, args, y, prior=None, tol=None):
    """Execute ``plan`` into poisoned-or-prior ``y``; compare with the float64 oracle."""
    records = [args.get(op) for op in plan.ops]
    y_prior = y.clone() if prior is None else prior
    needs_prior = any(r.beta != 0 for r in records)
    ref = run_reference(plan.ops, x, records, y_prior if needs_prior else None, torch.float64).output
    plan.execute(handle, x, y, args, prior=prior)
    assert not torch.isnan(y).any(), "some output elements were not written"
    result = compare(y, ref)
    assert result.rel_norm < (tol or TOLERANCE[x.dtype]), f"{plan.combination} {x.dtype}: {result}"
    assert result.rms_ok, f"MIOpen rms rule failed for {plan.combination} {x.dtype}: {result}"
    return result.rel_norm


def random_conv_plan(
    rng,
    dtypes,
    device="cpu",
    batch=(1, 3),
    channels=(1, 3, 4, 6),
    hw=(5, 14),
    filters=(1, 3, 5),
    strides=(1, 2),
    max_pad=2,
    pre_ops=0,
    post_ops=4,
):
    """A randomly drawn convolution plan and its input: shapes, groups/depthwise, padding, stride,
    dilation, chain, dtype, layouts. Returns (plan, x, output layout), or None when the draw gives an
    empty output (which must be the only reason to refuse it)."""
    from fusionplan.core.enums import ActivationMode, BatchNormMode
    from fusionplan.tools.verify import add_chain

    n, c = rng.randint(*batch), rng.choice(list(channels))
    h, w = rng.randint(*hw), rng.randint(*hw)
    groups = rng.choice([1, 1, c])
    k = groups * rng.randint(1, 5)
    conv = fp.ConvolutionDescriptor(
        (rng.randint(0, max_pad), rng.randint(0, max_pad)),
        (rng.randint(*strides), rng.randint(*strides)),
        (rng.randint(1, 2), rng.randint(1, 2)),
        groups,
    )
    dtype = rng.choice(list(dtypes))
    layout = rng.choice(["NCHW", "NHWC"])
    chain = "".join(rng.choice("BNA") for _ in range(rng.randint(0, pre_ops)))
    chain += "C" + "".join(rng.choice("BNA") for _ in range(rng.randint(0, post_ops)))
    x = make_input((n, c, h, w), dtype, layout, device)
    try:
        plan = add_chain(
            fp.FusionPlan(fp.TensorDescriptor.from_tensor(x)),
            chain,
            conv=conv,
            k=k,
            r=rng.choice(list(filters)),
            s=rng.choice(list(filters)),
            w_layout=rng.choice(["NCHW", "NHWC"]),
            bn_mode=rng.choice(list(BatchNormMode)),
            activation=rng.choice(list(ActivationMode)),
        )
    except fp.BadParmError as exc:
        assert "empty" in str(exc)
        return None
    return plan, x, rng.choice(["NCHW", "NHWC"])


#: Compiles in a process of its own: Triton's interpreter, run by other tests in this process,
#: patches language functions that Gluon's compiler then meets.
COMPILE = """
import json, sys
import torch
import fusionplan as fp
from fusionplan.core.enums import ActivationMode, BatchNormMode
from fusionplan.runtime.sass import compile_for_hopper, summarize
from fusionplan.tools.shapes import resnet50_layer
from fusionplan.solvers import solver_named
from fusionplan.tools.verify import add_chain, layer_plan
{build}
kernel = solver_named({solver!r}).build(plan.spec(), fp.Handle("cpu"))
_, compiled = compile_for_hopper(kernel)
info = summarize(compiled)
del info["sass"], info["hex_sass"]
print("SUMMARY" + json.dumps({{**info, "source": kernel.source()}}))
"""


def compiling_process(args: list[str], timeout: int = 300) -> str:
    """The output of ``python ARGS`` run to compile kernels for sm_90 without a GPU: a process of
    its own, outside Triton's interpreter (skipped where Triton has no usable ptxas)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env, timeout=timeout)
    if out.returncode != 0 and "ptxas" in out.stderr:
        pytest.skip(f"no usable ptxas in this Triton: {out.stderr[-300:]}")
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


def layer_build(name: str, dtype: str, chain: str = "CBNA", layout: str = "NHWC", batch: int = 32) -> str:
    """Code (for compile_sm90) that builds the plan of ResNet-50 layer ``name`` at ``batch``."""
    to_layout = ".to(memory_format=torch.channels_last)" if layout == "NHWC" else ""
    return (
        f"s = resnet50_layer({name!r})\n"
        f"x = torch.empty({batch}, s.c, s.h, s.w, dtype=torch.{dtype}){to_layout}\n"
        f"plan = layer_plan(s, x, {chain!r})"
    )


def compile_sm90(build: str, solver: str) -> dict:
    """The SASS summary (fusionplan.runtime.sass) and source of ``solver``'s kernel for the plan that the
    code ``build`` makes, compiled for sm_90 without a GPU (skipped where Triton has no ptxas)."""
    stdout = compiling_process(["-c", COMPILE.format(build=build, solver=solver)])
    line = next(line for line in stdout.splitlines() if line.startswith("SUMMARY"))
    return json.loads(line[len("SUMMARY") :])


def assert_stages_expect_their_boxes(info: dict) -> None:
    """The ring's one barrier expect per stage counts the bytes of every tensor load into the stage
    (its weights' box and each part's): fewer would let the products read a stage still being
    filled; more would leave it waiting for bytes that never come (the kernel hangs)."""
    assert info["bytes barriers expect (TTGIR)"] == [sum(info["tensor loads' box bytes (TTGIR)"])]


def assert_each_expect_counts_its_load(info: dict) -> None:
    """Kernels whose every tensor load has a barrier expect of its own (the gathering partitions'
    weights): each expect counts its load's box, in the order of the code."""
    assert info["bytes barriers expect (TTGIR)"] == info["tensor loads' box bytes (TTGIR)"]


def assert_expects_sum_to_their_loads(info: dict) -> None:
    """Kernels whose expects count several loads each (a filter's taps, a row's boxes, unrolled):
    the bytes all their expects count equal the bytes all their tensor loads bring."""
    assert sum(info["bytes barriers expect (TTGIR)"]) == sum(info["tensor loads' box bytes (TTGIR)"]) > 0


def bn_backward_args(x, scale, bias, grads, saved, **blend) -> fp.BatchNormBackwardArgs:
    """A batch-norm backward record: the forward's input, the parameters, the gradients' outputs
    (dscale, dbias) and the saved statistics (mean, inverse deviation)."""
    return fp.BatchNormBackwardArgs(
        x=x,
        scale=scale,
        bias=bias,
        result_scale_diff=grads[0],
        result_bias_diff=grads[1],
        saved_mean=saved[0],
        saved_inv_variance=saved[1],
        **blend,
    )


def bn_forward_args(scale, bias, saved=(None, None), running=(None, None), **kw) -> fp.BatchNormForwardArgs:
    """A batch-norm forward-training record: the parameters, the saved statistics' outputs (mean,
    inverse deviation) and the running statistics (mean, variance)."""
    return fp.BatchNormForwardArgs(
        scale=scale,
        bias=bias,
        saved_mean=saved[0],
        saved_inv_variance=saved[1],
        running_mean=running[0],
        running_variance=running[1],
        **kw,
    )
