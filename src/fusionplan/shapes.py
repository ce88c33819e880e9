"""Convolution shape suites (the 23 ResNet-50 v1.5 layers ship with the package)."""

from __future__ import annotations

import csv
from dataclasses import dataclass
from importlib import resources
from pathlib import Path


@dataclass(frozen=True)
class ConvShape:
    name: str
    c: int
    k: int
    h: int
    w: int
    r: int
    s: int
    stride: int
    pad: int
    count: int = 1
    groups: int = 1

    def flops(self, n: int) -> int:
        """Multiply-adds x 2 of the convolution at batch ``n``."""
        oh = (self.h + 2 * self.pad - self.r) // self.stride + 1
        ow = (self.w + 2 * self.pad - self.s) // self.stride + 1
        return 2 * n * self.k * oh * ow * (self.c // self.groups) * self.r * self.s


PACKAGED = {"resnet50": "resnet50_v1.5_convs.csv", "mobilenet_v2_depthwise": "mobilenet_v2_depthwise.csv"}


def load_shapes(path: str | Path | None = None) -> list[ConvShape]:
    """Shapes from a CSV with columns name,C,K,H,W,R,S,stride,pad[,count_in_model][,groups]; default
    ResNet-50. ``mobilenet_v2_depthwise`` names the packaged MobileNetV2 depthwise layers."""
    if path is None or str(path) in PACKAGED:
        text = resources.files("fusionplan").joinpath(f"data/{PACKAGED[str(path or 'resnet50')]}").read_text()
    else:
        text = Path(path).read_text()
    rows = csv.DictReader(text.splitlines())
    return [
        ConvShape(
            r["name"],
            int(r["C"]),
            int(r["K"]),
            int(r["H"]),
            int(r["W"]),
            int(r["R"]),
            int(r["S"]),
            int(r["stride"]),
            int(r["pad"]),
            int(r.get("count_in_model") or 1),
            int(r.get("groups") or 1),
        )
        for r in rows
    ]


def resnet50_layer(name: str) -> ConvShape:
    for shape in load_shapes():
        if shape.name == name:
            return shape
    raise KeyError(name)
