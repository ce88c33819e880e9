"""Convolution shape suites (the 23 ResNet-50 v1.5 layers ship with the package)."""

from __future__ import annotations

import csv
from dataclasses import dataclass
from importlib import resources
from pathlib import Path


@dataclass(frozen=True)
class ConvShape:
    """A convolution layer (one image's input C x H x W, K filters of R x S), and where the zoo
    suite has them: the chain that follows it in its models and the models it comes from."""

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
    pad_w: int | None = None  # the padding along W where it differs from ``pad`` (1x7: 0, 3)
    stride_w: int | None = None
    dilation: int = 1
    chain: str = ""  # the operators in data order as letters (C, B, N, A), "" unknown
    activation: str = ""  # the activation after it in the model, by torch's name ("relu", "silu")
    residual: bool = False  # a residual add between the batch-norm and the activation
    models: str = ""  # the models it comes from, with counts: "resnet50:3 wide_resnet50_2:3"

    @property
    def pads(self) -> tuple[int, int]:
        return self.pad, self.pad if self.pad_w is None else self.pad_w

    @property
    def strides(self) -> tuple[int, int]:
        return self.stride, self.stride if self.stride_w is None else self.stride_w

    def out_hw(self) -> tuple[int, int]:
        (ph, pw), (sh, sw), d = self.pads, self.strides, self.dilation
        return (self.h + 2 * ph - d * (self.r - 1) - 1) // sh + 1, (self.w + 2 * pw - d * (self.s - 1) - 1) // sw + 1

    def flops(self, n: int) -> int:
        """Multiply-adds x 2 of the convolution at batch ``n``."""
        oh, ow = self.out_hw()
        return 2 * n * self.k * oh * ow * (self.c // self.groups) * self.r * self.s


PACKAGED = {
    "resnet50": "resnet50_v1.5_convs.csv",
    "mobilenet_v2_depthwise": "mobilenet_v2_depthwise.csv",
    "zoo": "zoo_convs.csv",
}


def _optional(row: dict, name: str) -> int | None:
    value = row.get(name)
    return None if value in (None, "") else int(value)


def load_shapes(path: str | Path | None = None) -> list[ConvShape]:
    """Shapes from a CSV with columns name,C,K,H,W,R,S,stride,pad[,count_in_model][,groups] and,
    optional, pad_w,stride_w,dilation,chain,activation,residual,models; default ResNet-50.
    Packaged sets: ``resnet50``, ``mobilenet_v2_depthwise``, ``zoo`` (the convolutions of
    torchvision's models, fusionplan.tools.bench.zoo)."""
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
            _optional(r, "pad_w"),
            _optional(r, "stride_w"),
            int(r.get("dilation") or 1),
            r.get("chain") or "",
            r.get("activation") or "",
            (r.get("residual") or "0") == "1",
            r.get("models") or "",
        )
        for r in rows
    ]


def resnet50_layer(name: str) -> ConvShape:
    for shape in load_shapes():
        if shape.name == name:
            return shape
    raise KeyError(name)
