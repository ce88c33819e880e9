"""Random fused models: small networks of the chains ``fusionplan.torch.fuse`` takes, trained a
few steps beside a float64 copy of themselves in eager PyTorch.

A model case draws a stack of blocks (a convolution or none, a batch-norm, a residual add or none,
an activation or none; grouped, depthwise, strided, dilated, with and without a bias; momentum
0.1, 0.5 or None; a batch-norm now and then without running statistics, or whose output has a
second user), and a schedule of steps: training steps with SGD and momentum (the optimizer made
before ``fuse``), an input of another batch or layout, an eval call, a parameter set anew. Every
step runs the fused model (fp32), an eager fp32 copy and a float64 copy: each of the fused
model's tensors (the output, the input's gradient, every parameter's gradient, every buffer, and
after the optimizer every parameter) must be about as close to the float64 copy's as the eager
fp32 copy's is. A call that eager refuses must be refused by the fused model with the same
exception type.
"""

from __future__ import annotations

import copy
import math
import random
from typing import Any

import torch
from torch import nn

Case = dict[str, Any]

#: The activations a block draws (None: no activation), by name.
ACTIVATIONS = ("relu", "relu", "relu6", "leaky", "elu", "sigmoid", "tanh", "silu", "hardswish", "gelu", "prelu", None)


def draw_model_case(r: random.Random, mode: str, base: Case) -> Case:
    """A model case from ``r``: the blocks and the step schedule (plain data)."""
    hw = 9 if mode != "interp" else 6
    c = r.randint(1, 6)
    blocks = []
    for _ in range(r.randint(1, 4)):
        block = _block(r, c)
        blocks.append(block)
        c = block["k"]
    steps = ["train"] * r.randint(2, 4)
    for event in ("batch", "layout", "eval", "infer", "new parameter", "edit"):
        if r.random() < 0.25:
            steps.insert(r.randint(1, len(steps)), event)
    n = r.randint(2, 4)
    autocast = r.choice([None, None, "bfloat16"])  # the fused and eager fp32 models' steps
    if autocast and mode != "gpu":  # torch's bf16 CPU convolution is wrong with a stride along W
        for block in blocks:  # (docs/torch-cpu-conv-bugs.md, 5): the eager copy could be no reference
            if block["conv"] is not None:
                block["conv"]["stride"] = 1
    return {
        **base,
        "kind": "model",
        "blocks": blocks,
        "input": [n, blocks[0]["c"], r.randint(2, hw), r.randint(2, hw)],
        "layout": r.choice(["NCHW", "NHWC"]),
        "steps": steps,
        "lr": r.choice([0.01, 0.05]),
        "autocast": autocast,
    }


def _block(r: random.Random, c: int) -> dict:
    k = r.choice([1, 2, 3, 4, 6, 8])
    conv = None
    if r.random() < 0.8:
        groups = r.choice([g for g in (1, 1, 2, 3, c) if c % g == 0 and k % g == 0])
        kernel = r.choice([(1, 1), (3, 3), (1, 3), (3, 1), (2, 2)])
        stride = r.choice([1, 1, 2])
        dilation = r.choice([1, 1, 2])
        padding = [(kk - 1) * dilation // 2 for kk in kernel]
        conv = {"kernel": kernel, "stride": stride, "dilation": dilation, "padding": padding, "groups": groups,
                "bias": r.random() < 0.4}  # fmt: skip
    else:
        k = c
    return {
        "c": c,
        "k": k,
        "conv": conv,
        "momentum": r.choice([0.1, 0.1, 0.5, None]),
        "running_stats": r.random() < 0.9,
        "activation": r.choice(ACTIVATIONS),
        "residual": r.random() < 0.5 and _keeps_shape(c, k, conv),  # the block's input added before the activation
        "second_user": r.random() < 0.1,  # the batch-norm's output also added to the block's result
    }


def _keeps_shape(c: int, k: int, conv: dict | None) -> bool:
    """Whether the block's output has its input's shape (a residual add fits)."""
    if c != k:
        return False
    return conv is None or (conv["stride"] == 1 and all(kk % 2 == 1 for kk in conv["kernel"]))


class RandomNet(nn.Module):
    def __init__(self, case: Case) -> None:
        super().__init__()
        self.blocks = nn.ModuleList()
        for b in case["blocks"]:
            parts = nn.ModuleDict()
            if b["conv"] is not None:
                v = b["conv"]
                parts["conv"] = nn.Conv2d(b["c"], b["k"], v["kernel"], v["stride"], v["padding"], v["dilation"],
                                          v["groups"], bias=v["bias"])  # fmt: skip
            parts["bn"] = nn.BatchNorm2d(b["k"], momentum=b["momentum"], track_running_stats=b["running_stats"])
            if b["activation"] is not None:
                parts["act"] = _activation(b["activation"], b["k"])
            self.blocks.append(parts)
        self.flags = [(b["residual"], b["second_user"]) for b in case["blocks"]]
        self.head = nn.Linear(case["blocks"][-1]["k"], 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for parts, (residual, second_user) in zip(self.blocks, self.flags):
            h = parts["conv"](x) if "conv" in parts else x
            y = parts["bn"](h)
            z = y + x if residual else y
            z = parts["act"](z) if "act" in parts else z
            x = z + 0.5 * y if second_user else z
        return self.head(x.mean((2, 3)))


def _activation(name: str, channels: int) -> nn.Module:
    return {
        "relu": lambda: nn.ReLU(),
        "relu6": lambda: nn.ReLU6(),
        "leaky": lambda: nn.LeakyReLU(0.2),
        "elu": lambda: nn.ELU(0.7),
        "sigmoid": lambda: nn.Sigmoid(),
        "tanh": lambda: nn.Tanh(),
        "silu": lambda: nn.SiLU(),
        "hardswish": lambda: nn.Hardswish(),
        "gelu": lambda: nn.GELU(),
        "prelu": lambda: nn.PReLU(channels, 0.2),
    }[name]()


def _randomize(model: nn.Module, g: torch.Generator) -> None:
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.weight.copy_(torch.randn(m.weight.shape, generator=g))
                m.bias.copy_(torch.randn(m.bias.shape, generator=g))
                if m.running_mean is not None:
                    m.running_mean.copy_(torch.randn(m.running_mean.shape, generator=g))
                    m.running_var.copy_(torch.rand(m.running_var.shape, generator=g) + 0.5)


#: _compare_step's word that the case ends there, agreed (an ill-conditioned step).
STOP = "stop"
#: The name of a model case's run in the fuzzer's summary.
RUN_NAME = "fused-model"


def run_model_case(case: Case, device: torch.device) -> list[str]:
    """The case's steps, the fused model (fp32) beside an eager fp32 copy and a float64 copy: the
    failures found (empty: every step agreed)."""
    import os

    if case["mode"] != "interp":
        return _run_steps(case, device)
    before = os.environ.get("FUSIONPLAN_BACKEND")
    os.environ["FUSIONPLAN_BACKEND"] = "triton"  # the Triton training kernels, through the interpreter
    try:
        return _run_steps(case, device)
    finally:
        if before is None:
            del os.environ["FUSIONPLAN_BACKEND"]
        else:
            os.environ["FUSIONPLAN_BACKEND"] = before


def _run_steps(case: Case, device: torch.device) -> list[str]:
    import fusionplan.torch as fpt

    g = torch.Generator().manual_seed(case["data_seed"])
    torch.manual_seed(case["data_seed"])
    model = RandomNet(case)
    _randomize(model, g)
    model = model.to(device).train()
    eager, twin = copy.deepcopy(model), copy.deepcopy(model).double()
    models = [model, eager, twin]
    optimizers = [torch.optim.SGD(m.parameters(), lr=case["lr"], momentum=0.9) for m in models]
    models[0] = fpt.fuse(model)
    shape, layout, failures = list(case["input"]), case["layout"], []
    for i, step in enumerate(case["steps"]):
        if step == "batch":
            shape[0] += 1
        elif step == "layout":
            layout = "NHWC" if layout == "NCHW" else "NCHW"
        elif step == "new parameter":
            _set_a_parameter_anew(models, g)
        elif step == "edit":
            _edit_a_parameter_behind_torchs_back(models, g)
        elif step == "infer":
            x = torch.randn(shape, generator=g).to(device)
            x = x.to(memory_format=torch.channels_last) if layout == "NHWC" else x
            failures += _compare_inference(models, x, f"step {i} (infer, input {shape} {layout})", case.get("autocast"))
        else:
            x = torch.randn(shape, generator=g).to(device)
            if layout == "NHWC":
                x = x.to(memory_format=torch.channels_last)
            weights = torch.randn(shape[0], 3, generator=g).to(device)
            where = f"step {i} ({step}, input {shape} {layout})"
            failures += _compare_step(models, optimizers, x, weights, step == "train", where, case.get("autocast"))
            if failures:
                break
    return [f for f in failures if f is not STOP]


def _set_a_parameter_anew(models: list[nn.Module], g: torch.Generator) -> None:
    """The first batch-norm's weight replaced by a new Parameter in every model (their optimizers
    keep the old ones: none steps the new one)."""
    norms = [_first_batchnorm(model) for model in models]
    value = torch.randn(norms[1].weight.shape, generator=g)
    for bn in norms:
        bn.weight = nn.Parameter(value.to(bn.weight.device, bn.weight.dtype))


def _first_batchnorm(model: nn.Module) -> nn.BatchNorm2d:
    return next(m for m in model.modules() if isinstance(m, nn.BatchNorm2d))


def _forward(model: nn.Module, x: torch.Tensor, autocast: str | None) -> torch.Tensor:
    """The model's output for x in its parameters' dtype, under ``autocast`` (a dtype's name)
    where given, then in fp32."""
    low = getattr(torch, autocast) if autocast else None
    with torch.autocast(x.device.type, dtype=low or torch.bfloat16, enabled=low is not None):
        out = model(x.to(next(model.parameters()).dtype))
    return out.float() if low is not None else out


#: Where each activation's derivative jumps (the ones a block draws).
KINKS = {nn.ReLU: (0.0,), nn.ReLU6: (0.0, 6.0), nn.LeakyReLU: (0.0,), nn.ELU: (0.0,), nn.PReLU: (0.0,),
         nn.Hardswish: (-3.0, 3.0)}  # fmt: skip
#: An activation input this close to a kink (relative to the input's largest magnitude, at least 1;
#: by the steps' autocast dtype) may fall on the other side of it in the fused or eager model: its
#: gradient then differs by the slope's jump, which no rounding bound covers.
NEAR_KINK = {None: 1e-3, "bfloat16": 3e-2}
#: A batch-norm input channel whose values spread less than this (their deviation, relative to
#: their largest magnitude) is a few rounding steps wide in that dtype: its normalization, and the
#: gradients behind it, are rounding noise (a new weight near zero before a sigmoid makes one).
NARROW = {None: 1e-5, "bfloat16": 5e-2}


def _one_step(model: nn.Module, x, weights, train: bool, autocast: str | None, precision: str | None) -> dict:
    """The model's output, input gradient, parameter gradients and buffers of one step (its
    forward under ``autocast``, a dtype's name, where given); or the exception it raised.
    "ill-conditioned": whether an activation's input came within NEAR_KINK of a kink, or a
    batch-norm's input channel was NARROW, for the case's ``precision`` (seen by hooks on the
    modules: the eager models')."""
    model.train(train)
    model.zero_grad(set_to_none=True)
    dtype = next(model.parameters()).dtype
    xi = x.to(dtype).detach().requires_grad_(True)
    near: list[bool] = []
    hooks = [
        m.register_forward_pre_hook(_kink_watch(KINKS[type(m)], near, NEAR_KINK[precision]))
        for m in model.modules()
        if type(m) in KINKS
    ]
    hooks += [
        m.register_forward_pre_hook(_narrow_watch(near, NARROW[precision]))
        for m in model.modules()
        if isinstance(m, nn.BatchNorm2d)
    ]
    try:
        out = _forward(model, xi, autocast)
        (out * weights.to(out.dtype)).sum().backward()
    except Exception as exc:  # eager's refusal (one value per channel) must be the fused one's
        return {"error": exc}
    finally:
        for hook in hooks:
            hook.remove()
    found = {"output": out.detach(), "input gradient": xi.grad, "ill-conditioned": any(near)}
    found.update({f"gradient of {n}": p.grad for n, p in model.named_parameters()})
    found.update({f"buffer {n}": b for n, b in model.named_buffers()})
    return found


def _kink_watch(kinks: tuple, near: list, within: float):
    def watch(module, args) -> None:
        z = args[0].detach().float()
        scale = max(z.abs().max().item(), 1.0)
        near.append(any((z - k).abs().min().item() < within * scale for k in kinks))

    return watch


#: The eager fp32 (or autocast) copy's output or buffers this far from the float64 copy's
#: (relative, in norm), or not finite: the step has no reference (docs/torch-cpu-conv-bugs.md, 5).
UNRELIABLE = 0.5


def _reliable(eager: dict, twin: dict) -> bool:
    for name, want in twin.items():
        if name == "output" or name.startswith("buffer"):
            error = _norm(eager[name].double() - want.double()) / max(_norm(want), 1e-300)
            if not error <= UNRELIABLE:
                return False
    return True


def _narrow_watch(flags: list, within: float):
    def watch(module, args) -> None:
        z = args[0].detach().double().transpose(0, 1).flatten(1)  # a row per channel
        if z.shape[1] > 1:
            spread = z.std(dim=1) / z.abs().amax(dim=1).clamp_min(1e-300)
            flags.append(bool((spread < within).any()))

    return watch


def _edit_a_parameter_behind_torchs_back(models: list[nn.Module], g: torch.Generator) -> None:
    """The first batch-norm's weight overwritten through ``.data`` (no version counter moves) in
    every model, then the fused model told so (``refresh``)."""
    norms = [_first_batchnorm(model) for model in models]
    value = torch.randn(norms[1].weight.shape, generator=g)
    for bn in norms:
        bn.weight.data.copy_(value)
    models[0].refresh()


def _compare_inference(models: list, x: torch.Tensor, where: str, autocast: str | None) -> list[str]:
    """Two grad-free eval calls of each model (the fused one's second by its repeat path): their
    outputs, compared as a step's."""
    found = []
    for model, a in zip(models, (autocast, autocast, None)):
        model.eval()
        with torch.no_grad():
            try:
                found.append({f"output of call {k}": _forward(model, x, a) for k in (1, 2)})
            except Exception as exc:  # as in _compare_step
                found.append({"error": exc})
    refused = _refusals(found, where)
    if refused is not None:
        return refused
    if not _reliable({"output": found[1]["output of call 1"]}, {"output": found[2]["output of call 1"]}):
        return [STOP]
    return _differences(where, *found, autocast)


def _refusals(found: list[dict], where: str) -> list[str] | None:
    """None where every model ran; else the failures: none where the fused model raised what the
    float64 eager one did (eager's refusals must be the fused one's)."""
    errors = [f.get("error") for f in found]
    if all(e is None for e in errors):
        return None
    return [] if type(errors[0]) is type(errors[2]) else [f"{where}: fused raised {errors[0]!r}, eager {errors[2]!r}"]


def _compare_step(models: list, optimizers: list, x, weights, train: bool, where: str, autocast) -> list[str]:
    """One step of each model: each of the fused model's tensors about as close to the float64
    model's as the eager fp32 model's is (see TOLERANCE_FACTOR); then the optimizers' steps and
    the parameters after them, compared the same way."""
    steps = zip(models, (autocast, autocast, None))
    fused, eager, twin = (_one_step(m, x, weights, train, a, autocast) for m, a in steps)
    refused = _refusals([fused, eager, twin], where)
    if refused is not None:
        return refused
    if not _reliable(eager, twin):  # the eager copy itself far off (torch's own bugs, an overflow): no bound
        return [STOP]
    near = [d.pop("ill-conditioned") for d in (fused, eager, twin)]
    if near[1] or near[2]:  # the outputs and buffers alone, then the case ends
        kept = [{n: t for n, t in d.items() if "gradient" not in n} for d in (fused, eager, twin)]
        return _differences(where, *kept, autocast) or [STOP]
    failures = _differences(where, fused, eager, twin, autocast)
    if train and not failures:
        for opt in optimizers:
            opt.step()
        after = [{f"parameter {n} after the step": p.detach() for n, p in m.named_parameters()} for m in models]
        failures = _differences(where, *after, autocast)
    return failures


#: The fused model's error against the float64 model's (in norm) may be this many times the eager
#: fp32 model's (one sample of rounding noise against another: a bug's error is of the tensor's
#: size), at least FLOOR of the tensor's norm and STEP_FLOOR (by the steps' autocast dtype: the
#: noise of a sum of cancelling terms is of the terms' size) of the step's largest tensor norm.
#: A tensor that is zero but for rounding (a convolution bias's gradient before a training
#: batch-norm: a sum of terms that cancel) is noise in all three, as large as the batch-norm's
#: conditioning makes it (a channel whose few values barely differ: its deviation below epsilon):
#: ZERO_FLOOR of the step's norm, a bound on its magnitude alone.
#: And a failure's error is at least REL_GATE of the tensor's norm: a parameter's gradient behind a
#: batch-norm is a sum whose terms cancel (the batch-norm's output does not change with the
#: weight's scale), which two fp32 computations round differently by more than its small value
#: suggests. The errors the model cases are for (a wrong gradient, a stale tensor, a missed
#: update) are of the tensor's size; the plan cases check the kernels' rounding.
TOLERANCE_FACTOR, FLOOR, ZERO_FLOOR, REL_GATE = 10.0, 1e-4, 0.5, 5e-2
STEP_FLOOR = {None: 1e-5, "bfloat16": 1e-1}


def _differences(where: str, fused: dict, eager: dict, twin: dict, autocast: str | None) -> list[str]:
    failures = []
    step_scale = max((_norm(t) for t in twin.values() if t is not None), default=0.0)
    for name, want in twin.items():
        got, same_precision = fused.get(name), eager.get(name)
        if (got is None) != (want is None):
            failures.append(f"{where}: {name} {'missing' if got is None else 'unexpected'}")
            continue
        if want is None:
            continue
        if got.shape != want.shape:
            failures.append(f"{where}: {name} has shape {tuple(got.shape)}, want {tuple(want.shape)}")
            continue
        error = _norm(got.detach().double() - want.detach().double())
        eager_error = _norm(same_precision.detach().double() - want.detach().double())
        if not math.isfinite(eager_error):  # eager's own is not finite (an overflow): no bound
            continue
        zero = _norm(want) <= 1e-6 * step_scale
        floor = (ZERO_FLOOR if zero else STEP_FLOOR[autocast]) * step_scale
        allowed = max(TOLERANCE_FACTOR * eager_error, FLOOR * _norm(want), floor)
        relative = error / max(_norm(want), 1e-300)
        if not (error <= allowed or relative <= REL_GATE):  # NaN too
            failures.append(
                f"{where}: {name}: error {error:.2e} (relative {relative:.2e}), eager fp32's {eager_error:.2e}"
            )
    return failures


def _norm(t: torch.Tensor) -> float:
    return t.detach().double().norm().item()
