"""The zoo suite: the distinct convolution layers of torchvision's models, each with the chain that
follows it in its model (batch-norm, a residual add, the activation) and the models it comes from.

    python -m fusionplan.tools.bench.zoo --out src/fusionplan/data/zoo_convs.csv

It needs torchvision. Each model is traced by torch.fx and its shapes propagated on one image.
A chain follows a convolution while each intermediate has no other user. The packaged
``data/zoo_convs.csv`` is this module's output (``fusionplan-bench --shapes zoo``).
"""

from __future__ import annotations

import argparse
import csv
import operator
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import fx, nn
from torch.fx.passes.shape_prop import ShapeProp

from fusionplan.tools.shapes import ConvShape

#: model -> (input height and width, constructor keywords); "unet" is defined below
MODELS: dict[str, tuple[int, dict]] = {
    "resnet50": (224, {}),
    "resnext50_32x4d": (224, {}),
    "wide_resnet50_2": (224, {}),
    "regnet_y_1_6gf": (224, {}),
    "inception_v3": (299, {"aux_logits": False, "init_weights": False}),
    "googlenet": (224, {"aux_logits": False, "init_weights": False}),
    "vgg16_bn": (224, {}),
    "mobilenet_v2": (224, {}),
    "mobilenet_v3_large": (224, {}),
    "efficientnet_b0": (224, {}),
    "densenet121": (224, {}),
    "shufflenet_v2_x1_0": (224, {}),
    "squeezenet1_0": (224, {}),
    "deeplabv3_resnet50": (512, {"weights_backbone": None, "aux_loss": False}),
    "unet": (256, {}),
}

#: activations by torch's name; those fusionplan runs (fusionplan.torch's mapping, which a test
#: holds this table to) end the chain with A, the rest with no A
FUSABLE_ACTIVATIONS = {"relu": "RELU", "relu6": "CLIPPEDRELU", "sigmoid": "LOGISTIC", "tanh": "TANH",
                       "leaky_relu": "LEAKYRELU", "elu": "ELU", "silu": "SILU", "hardswish": "HARDSWISH",
                       "hardsigmoid": "HARDSIGMOID", "gelu": "GELU"}  # fmt: skip
_ACTIVATION_MODULES = {
    nn.ReLU: "relu", nn.ReLU6: "relu6", nn.SiLU: "silu", nn.Hardswish: "hardswish", nn.Hardsigmoid: "hardsigmoid",
    nn.GELU: "gelu", nn.Sigmoid: "sigmoid", nn.Tanh: "tanh", nn.LeakyReLU: "leaky_relu", nn.ELU: "elu",
}  # fmt: skip
_ACTIVATION_FUNCTIONS = {
    F.relu: "relu", torch.relu: "relu", torch.relu_: "relu", F.relu6: "relu6", F.silu: "silu",
    F.hardswish: "hardswish", F.hardsigmoid: "hardsigmoid", F.gelu: "gelu", torch.sigmoid: "sigmoid",
    torch.tanh: "tanh", F.leaky_relu: "leaky_relu", F.elu: "elu",
}  # fmt: skip
_ACTIVATION_METHODS = {"relu": "relu", "relu_": "relu", "sigmoid": "sigmoid", "tanh": "tanh"}
_ADDS = {operator.add, operator.iadd, torch.add}


def _chain(bias: bool, batchnorm: bool, activation: str) -> str:
    """The operator letters of a convolution and what follows it (A where fusionplan runs the activation)."""
    return "C" + ("B" if bias else "") + ("N" if batchnorm else "") + ("A" if activation in FUSABLE_ACTIVATIONS else "")


@dataclass
class Entry:
    layer: ConvShape  # without name, count and models: one per distinct layer
    models: dict[str, int] = field(default_factory=dict)


class UNet(nn.Module):
    """The UNet of Ronneberger et al. with batch-norm: two 3x3 convolutions a level, 64 to 1024
    channels, transposed convolutions up."""

    def __init__(self, channels: Sequence[int] = (64, 128, 256, 512, 1024), classes: int = 2) -> None:
        super().__init__()
        self.down = nn.ModuleList()
        c_in = 3
        for c in channels:
            self.down.append(self._double(c_in, c))
            c_in = c
        self.up = nn.ModuleList()
        self.merge = nn.ModuleList()
        for c in reversed(channels[:-1]):
            self.up.append(nn.ConvTranspose2d(c_in, c, 2, stride=2))
            self.merge.append(self._double(2 * c, c))
            c_in = c
        self.head = nn.Conv2d(c_in, classes, 1)

    @staticmethod
    def _double(c_in: int, c_out: int) -> nn.Sequential:
        return nn.Sequential(
            nn.Conv2d(c_in, c_out, 3, padding=1, bias=False),
            nn.BatchNorm2d(c_out),
            nn.ReLU(inplace=True),
            nn.Conv2d(c_out, c_out, 3, padding=1, bias=False),
            nn.BatchNorm2d(c_out),
            nn.ReLU(inplace=True),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        skips = []
        for i, block in enumerate(self.down):
            x = block(x if i == 0 else F.max_pool2d(x, 2))
            skips.append(x)
        for up, merge, skip in zip(self.up, self.merge, reversed(skips[:-1])):
            x = merge(torch.cat([up(x), skip], dim=1))
        return self.head(x)


def build_model(name: str) -> nn.Module:
    if name == "unet":
        return UNet()
    import torchvision

    return torchvision.models.get_model(name, weights=None, **MODELS[name][1])


def _single_user(node: fx.Node) -> fx.Node | None:
    users = list(node.users)
    return users[0] if len(users) == 1 else None


def _activation_of(node: fx.Node, modules: dict[str, nn.Module]) -> str | None:
    if node.op == "call_module":
        return _ACTIVATION_MODULES.get(type(modules[node.target]))
    if node.op == "call_function":
        return _ACTIVATION_FUNCTIONS.get(node.target)
    if node.op == "call_method":
        return _ACTIVATION_METHODS.get(node.target)
    return None


def _is_batchnorm(node: fx.Node, modules: dict[str, nn.Module]) -> bool:
    return node.op == "call_module" and isinstance(modules[node.target], nn.BatchNorm2d)


def _is_add(node: fx.Node) -> bool:
    return (node.op == "call_function" and node.target in _ADDS) or (node.op == "call_method" and node.target == "add")


def _chain_after(conv: fx.Node, modules: dict[str, nn.Module]) -> tuple[bool, bool, str]:
    """(a batch-norm follows, then a residual add, the activation's name or ''), each step taken
    only where the node before it has no other user."""
    node, batchnorm, residual = conv, False, False
    nxt = _single_user(node)
    if nxt is not None and _is_batchnorm(nxt, modules):
        node, batchnorm, nxt = nxt, True, _single_user(nxt)
    if nxt is not None and _is_add(nxt):
        node, residual, nxt = nxt, True, _single_user(nxt)
    activation = _activation_of(nxt, modules) if nxt is not None else None
    return batchnorm, residual, activation or ""


def model_layers(name: str) -> Iterator[ConvShape]:
    """Every convolution of a model of the suite, one image at its input size."""
    return layers_of(build_model(name), MODELS[name][0], name)


def layers_of(model: nn.Module, size: int, name: str = "the model", channels: int = 3) -> Iterator[ConvShape]:
    """Every convolution of ``model`` (in eval mode), one image of ``channels`` x size x size."""
    traced = fx.symbolic_trace(model.eval())
    with torch.no_grad():
        ShapeProp(traced).propagate(torch.randn(1, channels, size, size))
    modules = dict(traced.named_modules())
    for node in traced.graph.nodes:
        if node.op != "call_module" or type(modules[node.target]) is not nn.Conv2d:
            continue
        conv = modules[node.target]
        _, c, h, w = node.args[0].meta["tensor_meta"].shape
        if conv.padding_mode != "zeros" or isinstance(conv.padding, str) or conv.dilation[0] != conv.dilation[1]:
            raise ValueError(f"{name}: {node.target} has a padding or dilation the suite does not describe")
        batchnorm, residual, activation = _chain_after(node, modules)
        (sh, sw), (ph, pw) = conv.stride, conv.padding
        yield ConvShape(
            "", c, conv.out_channels, h, w, *conv.kernel_size, sh, ph, groups=conv.groups, pad_w=pw, stride_w=sw,
            dilation=conv.dilation[0], chain=_chain(conv.bias is not None, batchnorm, activation),
            activation=activation, residual=residual,
        )  # fmt: skip


def collect(models: Sequence[str]) -> list[Entry]:
    entries: dict[ConvShape, Entry] = {}
    for name in models:
        for layer in model_layers(name):
            entry = entries.setdefault(layer, Entry(layer))
            entry.models[name] = entry.models.get(name, 0) + 1
    return list(entries.values())


COLUMNS = ["name", "C", "K", "H", "W", "R", "S", "stride", "pad", "count_in_model", "groups", "pad_w", "stride_w",
           "dilation", "chain", "activation", "residual", "models"]  # fmt: skip


def write_csv(entries: Sequence[Entry], path: Path) -> None:
    with path.open("w", newline="") as f:
        out = csv.writer(f)
        out.writerow(COLUMNS)
        for i, e in enumerate(entries):
            lay = e.layer
            models = " ".join(f"{m}:{n}" for m, n in e.models.items())
            (ph, pw), (sh, sw) = lay.pads, lay.strides
            out.writerow([
                f"zoo_{i:03d}", lay.c, lay.k, lay.h, lay.w, lay.r, lay.s, sh, ph, sum(e.models.values()),
                lay.groups, pw, sw, lay.dilation, lay.chain, lay.activation, int(lay.residual), models,
            ])  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m fusionplan.tools.bench.zoo", description=__doc__.splitlines()[0])
    p.add_argument("--models", default=",".join(MODELS), help="comma-separated (default: every model of the suite)")
    p.add_argument("--out", required=True, help="the CSV to write")
    opts = p.parse_args(argv)
    models = [m for m in opts.models.split(",") if m]
    unknown = set(models) - set(MODELS)
    if unknown:
        print(f"unknown models {sorted(unknown)}; known: {', '.join(MODELS)}", file=sys.stderr)
        return 2
    entries = collect(models)
    write_csv(entries, Path(opts.out))
    print(f"wrote {len(entries)} distinct layers of {len(models)} models to {opts.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
