"""ResNet-50 fused by fusionplan in one call: outputs compared with eager, then timed.

    python examples/resnet50.py                       # GPU: fp16 channels_last, batch 1, 32, 128
    python examples/resnet50.py --batches 1 --device cpu

torchvision's ResNet-50 with random weights (nothing is downloaded); without torchvision, the
same architecture defined below. Batch-norm statistics are randomized so that batch-norm is not
the identity. Times are medians of CUDA-event timings (GPU) or wall clock (CPU), eager vs fused vs
torch.compile (default mode; on the CPU only with --compile, it takes minutes there).
``--latency`` adds, on a GPU, each call's wall time (host and GPU, the result ready) of eager,
fused, fused with ``cuda_graph=True`` and torch.compile's mode="reduce-overhead" (its CUDA graphs).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch
from torch import nn

import fusionplan.torch as fpt


# ---- ResNet-50 v1.5 (torchvision's architecture) when torchvision is absent ---------------------------
class Bottleneck(nn.Module):
    def __init__(self, c_in: int, width: int, stride: int) -> None:
        super().__init__()
        c_out = width * 4
        self.conv1, self.bn1 = nn.Conv2d(c_in, width, 1, bias=False), nn.BatchNorm2d(width)
        self.conv2, self.bn2 = nn.Conv2d(width, width, 3, stride, 1, bias=False), nn.BatchNorm2d(width)
        self.conv3, self.bn3 = nn.Conv2d(width, c_out, 1, bias=False), nn.BatchNorm2d(c_out)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = None
        if stride != 1 or c_in != c_out:
            self.downsample = nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride, bias=False), nn.BatchNorm2d(c_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        return self.relu(self.bn3(self.conv3(out)) + identity)


class ResNet50(nn.Module):
    def __init__(self, num_classes: int = 1000) -> None:
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64)
        self.relu, self.maxpool = nn.ReLU(inplace=True), nn.MaxPool2d(3, 2, 1)
        layers, c_in = [], 64
        for width, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
            stage = []
            for i in range(blocks):
                stage.append(Bottleneck(c_in, width, stride if i == 0 else 1))
                c_in = width * 4
            layers.append(nn.Sequential(*stage))
        self.layer1, self.layer2, self.layer3, self.layer4 = layers
        self.avgpool, self.fc = nn.AdaptiveAvgPool2d(1), nn.Linear(2048, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def resnet50() -> nn.Module:
    try:
        import torchvision

        return torchvision.models.resnet50(weights=None)
    except ImportError:
        return ResNet50()


def randomize_batchnorm(model: nn.Module) -> None:
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.normal_(0, 0.1)
                m.running_var.uniform_(0.5, 1.5)
                m.weight.uniform_(0.5, 1.5)
                m.bias.normal_(0, 0.1)


def median_ms(module, x: torch.Tensor, iters: int) -> float:
    """Median milliseconds of ``module(x)``."""
    device = x.device
    for _ in range(3):
        module(x)
    samples = []
    for _ in range(iters):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            module(x)
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            module(x)
            samples.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(samples)


def wall_ms(module, x: torch.Tensor, iters: int) -> float:
    """Median milliseconds from a call of ``module(x)`` to its result on the host's side of a
    synchronize: what a caller serving one request at a time waits."""
    for _ in range(3):
        module(x)
    torch.cuda.synchronize(x.device)
    samples = []
    for _ in range(iters):
        t0 = time.perf_counter()
        module(x)
        torch.cuda.synchronize(x.device)
        samples.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(samples)


def latency_rows(model: nn.Module, fused: nn.Module, batches: list[int], dtype, device, iters: int) -> list[str]:
    """Wall time per call: eager, fused, fused with CUDA graphs, torch.compile reduce-overhead."""
    graphed = fpt.fuse(model, cuda_graph=True)
    reduced = torch.compile(model, mode="reduce-overhead")
    header = (
        f"{'batch':>5} | {'eager ms':>9} | {'fused ms':>9} | {'fused+graph ms':>14} | {'reduce-overhead ms':>18} | "
        "fused+graph/reduce-overhead"
    )
    rows = [header, "|".join("---" for _ in header.split("|"))]
    for batch in batches:
        x = torch.randn(batch, 3, 224, 224, device=device).to(dtype).to(memory_format=torch.channels_last)
        with torch.inference_mode():
            times = [wall_ms(m, x, iters) for m in (model, fused, graphed, reduced)]
        rows.append(
            f"{batch:>5} | {times[0]:>9.3f} | {times[1]:>9.3f} | {times[2]:>14.3f} | {times[3]:>18.3f} | "
            f"{times[2] / times[3]:>27.2f}"
        )
        print("  wall time per call: " + rows[-1])
    print(f"  graphs of the fused model: {graphed.graph_report()}")
    return rows


def graph_ms(module, x: torch.Tensor, iters: int) -> float:
    """Median milliseconds of one replay of ``module(x)`` captured in a CUDA graph: GPU time alone,
    no host overhead (NaN when the module cannot be captured)."""
    static_x = x.clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    try:
        with torch.cuda.stream(side):
            for _ in range(3):
                module(static_x)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            module(static_x)
    except Exception as exc:  # e.g. a module that synchronizes
        print(f"  (no CUDA graph of {type(module).__name__}: {type(exc).__name__}: {exc})")
        return float("nan")
    return median_ms(lambda _: graph.replay(), x, iters)


def write_markdown(path: str, rows: list[str], device: torch.device, argv: list[str] | None) -> None:
    import triton

    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    args = " ".join(sys.argv[1:] if argv is None else argv)
    lines = [
        f"# ResNet-50 fused by fusionplan.torch ({time.strftime('%Y-%m-%d')})",
        "",
        f"{gpu}, torch {torch.__version__}, Triton {triton.__version__}, cuDNN {torch.backends.cudnn.version()}.",
        f"Command: `python examples/resnet50.py {args}`. Times are medians per forward (ms); ratios above 1",
        "mean fused is faster. fused+compile is torch.compile (default mode) of the fused model.",
        "",
        *[f"| {r} |" if "|" in r else r for r in rows],
        "",
    ]
    with open(path, "w") as f:
        f.write("\n".join(lines))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--batches", default=None, help="comma-separated (default 1,32,128 on a GPU, 1 on the CPU)")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--compile", action="store_true", help="also time torch.compile on the CPU (slow to compile)")
    p.add_argument("--latency", action="store_true", help="GPU: also the wall time per call with CUDA graphs")
    p.add_argument("--out", default=None, help="also write the table, with the environment, to this Markdown file")
    opts = p.parse_args(argv)
    device = torch.device(opts.device)
    gpu = device.type == "cuda"
    dtype = torch.float16 if gpu else torch.float32
    batches = [int(b) for b in (opts.batches or ("1,32,128" if gpu else "1")).split(",")]
    torch.manual_seed(0)
    model = resnet50().eval()
    randomize_batchnorm(model)
    model = model.to(device=device, dtype=dtype, memory_format=torch.channels_last)
    fused = fpt.fuse(model)
    print(f"fused {len(fused.fusion_report.fused)} chains, skipped {len(fused.fusion_report.skipped)}")
    ok = True
    use_compile = gpu or opts.compile
    compiled = torch.compile(model) if use_compile else None
    fused_compiled = torch.compile(fused) if use_compile else None  # Inductor around the fused chains
    header = (
        f"{'batch':>5} | {'eager ms':>9} | {'fused ms':>9} | {'compile ms':>10} | {'fused+compile ms':>16} | "
        "fused/eager | fused/compile | best fused/compile | max rel err | top-1 agree"
    )
    rows = [header, "|".join("---" for _ in header.split("|"))]
    graph_header = (
        f"{'batch':>5} | {'eager ms':>9} | {'fused ms':>9} | {'compile ms':>10} | fused/eager | fused/compile"
    )
    graph_rows = [graph_header, "|".join("---" for _ in graph_header.split("|"))]
    print(header)
    for batch in batches:
        x = torch.randn(batch, 3, 224, 224, device=device).to(dtype).to(memory_format=torch.channels_last)
        with torch.inference_mode():
            ref, out = model(x).float(), fused(x).float()
            err = ((out - ref).abs().max() / ref.abs().max()).item()
            agree = (out.argmax(1) == ref.argmax(1)).float().mean().item()
            t_eager = median_ms(model, x, opts.iters)
            t_fused = median_ms(fused, x, opts.iters)
            t_comp = median_ms(compiled, x, opts.iters) if compiled is not None else float("nan")
            t_fc = median_ms(fused_compiled, x, opts.iters) if fused_compiled is not None else float("nan")
        ok &= err < (2e-2 if gpu else 1e-4) and agree >= 0.9
        best = min(t_fused, t_fc) if t_fc == t_fc else t_fused
        rows.append(
            f"{batch:>5} | {t_eager:>9.3f} | {t_fused:>9.3f} | {t_comp:>10.3f} | {t_fc:>16.3f} | "
            f"{t_eager / t_fused:>11.2f} | {t_comp / t_fused:>13.2f} | {t_comp / best:>18.2f} | {err:>11.2e} | "
            f"{agree:>11.2f}"
        )
        print(rows[-1])
        if gpu:
            with torch.inference_mode():
                g_eager, g_fused = graph_ms(model, x, opts.iters), graph_ms(fused, x, opts.iters)
                g_comp = graph_ms(compiled, x, opts.iters) if compiled is not None else float("nan")
            graph_rows.append(
                f"{batch:>5} | {g_eager:>9.3f} | {g_fused:>9.3f} | {g_comp:>10.3f} | {g_eager / g_fused:>11.2f} | "
                f"{g_comp / g_fused:>13.2f}"
            )
            print("  CUDA-graph replay (GPU time): " + graph_rows[-1])
    print("PASSED" if ok else "FAILED: outputs differ from eager")
    if graph_rows[2:]:
        rows += ["", "GPU time alone: one replay of a CUDA graph of the forward (ms)", "", *graph_rows]
    if gpu and opts.latency:
        latency = latency_rows(model, fused, batches, dtype, device, opts.iters)
        rows += ["", "Wall time per call, the result ready (ms); ratios below 1 mean fused+graph is faster", ""]
        rows += latency
    if opts.out:
        write_markdown(opts.out, rows, device, argv)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
