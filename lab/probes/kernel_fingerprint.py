"""What every solver builds for many plans, as a fingerprint to compare across commits.

A refactor that should change nothing (a switch removed with its dead branch, code moved) is
checked by fingerprinting before and after and comparing: each plan's verdicts (solver, taken or
not, the reason) and, for every solver that takes it (or would, but for the GPU), a hash of the
kernel's rendered source and of its configuration.

    python lab/probes/kernel_fingerprint.py before.json          # at the old commit
    python lab/probes/kernel_fingerprint.py after.json           # at the new one
    python lab/probes/kernel_fingerprint.py --compare before.json after.json

The plans: every ResNet-50 and zoo layer in fp16 (CBNA, CA, CBA, NA, BA), bf16, fp32 and TF32,
both layouts, and the sm90 fuzz mode's random draws (``--fuzz``). On a CPU, Gluon kernels build
for sm_90 and the Triton ones build under TRITON_INTERPRET=1 (with the interpreter's tiles); on
a GPU (``--device cuda``) everything builds as it would run, without compiling.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from collections import Counter
from pathlib import Path

import fusionplan as fp
from fusionplan.solvers import solver_named
from fusionplan.tools.bench.cases import Case, build_plan
from fusionplan.tools.shapes import load_shapes

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

GPU_ONLY = "needs a Hopper GPU"
PRECISIONS_MODES = {
    "fp16": ("CBNA", "CA", "CBA", "NA", "BA"),
    "bf16": ("CBNA",),
    "fp32": ("CBNA", "NA"),
    "tf32": ("CBNA",),
}


def digest(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()[:16]


def kernel_state(kernel) -> dict[str, str]:
    """The kernel's plain attributes (numbers, strings, configurations), as text."""
    state = {}
    for name, value in sorted(vars(kernel).items()):
        text = repr(value)
        plain = isinstance(value, (int, float, str, bool, type(None), tuple)) or hasattr(value, "__dataclass_fields__")
        if plain or (isinstance(value, (list, dict)) and len(text) < 2000 and "0x" not in text):
            state[name] = text
    return state


def fingerprint(plan: fp.FusionPlan, handle: fp.Handle) -> list[dict]:
    rows = []
    for verdict in plan.explain(handle):
        row = {"solver": verdict.solver, "ok": verdict.applicable, "why": (verdict.reason or "")[:200]}
        if verdict.applicable or row["why"].startswith(GPU_ONLY):
            try:
                kernel = solver_named(verdict.solver).build(plan.spec(), handle)
                source = kernel.source() if hasattr(kernel, "source") else None
                row["src"] = digest(source) if source else None
                row["state_keys"] = kernel_state(kernel)
                row["state"] = digest(json.dumps(row["state_keys"], sort_keys=True))
            except Exception as exc:  # a build that fails is part of the fingerprint
                row["error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
        rows.append(row)
    return rows


def layer_plans(zoo: bool):
    shapes = load_shapes() + (load_shapes(Path(fp.__file__).parent / "data" / "zoo_convs.csv") if zoo else [])
    for shape in shapes:
        for precision, modes in PRECISIONS_MODES.items():
            for layout in ("NHWC", "NCHW"):
                for mode in modes:
                    case = Case(shape, 32 if precision == "fp16" else 8, precision, layout, mode)
                    yield case.name, lambda case=case: build_plan(case)


def fuzz_plans(count: int, handle: fp.Handle):
    from tests.fuzz.cases import draw_case
    from tests.fuzz.execute import CorePlan, make_tensors

    for index in range(count):
        case = draw_case(5, index, "sm90", 0.0, 0.0, 0.5)
        yield f"fuzz{index}", lambda case=case: CorePlan(case, make_tensors(case, "cpu", values=False), handle).plan


def collect(fuzz: int, device: str, zoo: bool = True) -> dict:
    handle = fp.Handle(device, allow_tf32=True)
    result = {}
    for index, (name, make) in enumerate([*layer_plans(zoo), *fuzz_plans(fuzz, handle)]):
        if index % 500 == 0:
            print(f"{index} plans", file=sys.stderr, flush=True)
        try:
            result[name] = fingerprint(make(), handle)
        except Exception as exc:  # a plan that cannot be made is part of the fingerprint
            result[name] = f"{type(exc).__name__}: {str(exc)[:200]}"
    return result


def compare(before: dict, after: dict, shown: int = 12) -> Counter:
    """The differences, counted by (solver, field), the first ``shown`` printed."""
    diffs: Counter = Counter()
    for name in sorted(set(before) | set(after)):
        old, new = before.get(name), after.get(name)
        if old == new:
            continue
        if isinstance(old, str) or isinstance(new, str) or old is None or new is None or len(old) != len(new):
            diffs["plan"] += 1
            continue
        for a, b in zip(old, new):
            for field in ("ok", "why", "src", "state", "error"):
                if a.get(field) != b.get(field):
                    diffs[(a["solver"], field)] += 1
                    if sum(diffs.values()) <= shown:
                        print(name, a["solver"], field, repr(a.get(field))[:120], "->", repr(b.get(field))[:120])
    return diffs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out", nargs="?", help="where to write the fingerprint (JSON)")
    parser.add_argument("--fuzz", type=int, default=300, help="random sm90 plans besides the layers")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--no-zoo", action="store_true", help="ResNet-50's layers only, not the zoo's")
    parser.add_argument("--compare", nargs=2, metavar=("BEFORE", "AFTER"))
    opts = parser.parse_args(argv)
    if opts.compare:
        diffs = compare(*(json.loads(Path(p).read_text()) for p in opts.compare))
        print("differences:", dict(diffs) or "none")
        return 1 if diffs else 0
    if not opts.out:
        parser.error("give OUT, or --compare BEFORE AFTER")
    result = collect(opts.fuzz, opts.device, zoo=not opts.no_zoo)
    Path(opts.out).write_text(json.dumps(result, indent=0, sort_keys=True))
    print(f"{len(result)} plans -> {opts.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
