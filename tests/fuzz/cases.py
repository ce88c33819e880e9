"""Random fusion plans, as plain data drawn from (seed, index), and their random arguments.

A case is a JSON-able dict: the input geometry, dtype, layouts and views, the operator chain
with its parameters, the API it goes through, and the seed of its data. ``draw_case(seed, i)``
depends on nothing else, so case i of a seed is the same in every run and on every worker.
"""

from __future__ import annotations

import random
from typing import Any

Case = dict[str, Any]

DTYPES = ("float", "half", "bfloat16", "double")
#: Filter sizes (R, S) worth drawing: 1x1, 3x3, 5x5, 7x7, 1x7 / 7x1 (Inception), 2x2 and the odd rest.
FILTERS = ((1, 1), (1, 1), (3, 3), (3, 3), (5, 5), (7, 7), (1, 7), (7, 1), (2, 2), (1, 3), (3, 1), (2, 3))
#: Activation parameters (alpha, beta, gamma) drawn per mode, in MIOpen's mode numbers.
ACTIVATION_PARAMS = {
    2: lambda r: (r.uniform(0.3, 1.5), r.uniform(0.5, 1.5), 1.0),  # TANH
    # POWER: no gamma 0, whose step of 1 at the threshold turns a rounding of alpha + beta * x near 1e-6
    # into a mismatch (tests/test_fuzz_regressions.py covers gamma 0)
    6: lambda r: (r.uniform(0.2, 1.0), r.uniform(0.3, 1.0), r.choice([1.0, 2.0, 0.5, 3.0])),
    7: lambda r: (r.uniform(0.2, 2.0), 0.0, 1.0),  # CLIPPEDRELU
    8: lambda r: (r.uniform(0.0, 0.5), 0.0, 1.0),  # LEAKYRELU
    9: lambda r: (r.uniform(0.2, 1.5), 0.0, 1.0),  # ELU
}
LIMITS = {  # the largest sides drawn: the interpreter runs kernels element by element
    "cpu": {"n": 3, "c": 20, "hw": 14, "k": 20},
    "interp": {"n": 2, "c": 10, "hw": 9, "k": 10},
    "gpu": {"n": 4, "c": 72, "hw": 24, "k": 72},
}
LIMITS["sm90"] = LIMITS["gpu"]  # the GPU's cases, built for sm_90 on the CPU


def _activation(r: random.Random) -> dict:
    mode = r.randrange(10)
    a, b, g = ACTIVATION_PARAMS.get(mode, lambda r: (1.0, 0.0, 1.0))(r)
    return {"kind": "act", "mode": mode, "a": a, "b": b, "g": g}


def _conv(r: random.Random, c: int, h: int, w: int, lim: dict) -> dict | None:
    """A convolution on C channels of an h x w plane, or None when the draw gives no output."""
    divisors = [g for g in range(1, c + 1) if c % g == 0]
    groups = r.choice([1, 1, r.choice(divisors), r.choice(divisors), c])  # plain, grouped, depthwise
    k = groups * r.randint(1, max(1, lim["k"] // groups)) if groups < c else c * r.choice([1, 1, 2])
    rr, ss = r.choice(FILTERS)
    pad = [r.choice([0, 0, rr // 2, r.randint(0, 3)]), r.choice([0, 0, ss // 2, r.randint(0, 3)])]
    stride = [r.choice([1, 1, 2, 3]), r.choice([1, 1, 2, 3])]
    dil = [r.choice([1, 1, 1, 2, 3]), r.choice([1, 1, 1, 2, 3])]
    oh = (h + 2 * pad[0] - dil[0] * (rr - 1) - 1) // stride[0] + 1
    ow = (w + 2 * pad[1] - dil[1] * (ss - 1) - 1) // stride[1] + 1
    if oh < 1 or ow < 1:
        return None
    w_layout, odd = r.choice(["NCHW", "NHWC"]), r.random() < 0.3  # odd: unusual strides on size-1 axes
    return _conv_record(k, rr, ss, pad, stride, dil, groups, w_layout, odd, oh, ow)


def _conv_record(k, r, s, pad, stride, dil, groups, w_layout, w_odd_strides, oh, ow) -> dict:
    return {
        "kind": "conv",
        "k": k,
        "r": r,
        "s": s,
        "pad": pad,
        "stride": stride,
        "dil": dil,
        "groups": groups,
        "w_layout": w_layout,
        "w_odd_strides": w_odd_strides,
        "out": [oh, ow],
    }


def _inference_chain(r: random.Random, c: int, h: int, w: int, lim: dict, dtype: str) -> list[dict]:
    shape = r.random()
    if shape < 0.35:  # the combinations frameworks use most
        letters = r.choice(["CBA", "CBNA", "CNA", "CA", "CB", "CN", "C", "NA", "BA"])
    else:
        letters = "".join(r.choice("BNA") for _ in range(r.randint(0, 4)))
        if r.random() < 0.7:
            at = r.randint(0, len(letters))
            letters = letters[:at] + "C" + letters[at:]
        letters = letters or "A"
    ops: list[dict] = []
    for letter in letters:
        if letter == "C":
            conv = None
            for _ in range(8):
                conv = _conv(r, c, h, w, lim)
                if conv is not None:
                    break
            if conv is None:
                continue
            ops.append(conv)
            c, (h, w) = conv["k"], conv["out"]
        elif letter == "B":
            ops.append({"kind": "bias", "param_dtype": _param_dtype(r, dtype)})
        elif letter == "N":
            ops.append(
                {
                    "kind": "bn",
                    "per_activation": r.random() < 0.25,
                    "eps": r.choice([1e-5, 1e-3, 0.1]),
                    "param_dtype": _param_dtype(r, dtype),
                }
            )
        else:
            ops.append(_activation(r))
    return ops or [_activation(r)]


def _param_dtype(r: random.Random, dtype: str) -> str:
    return r.choice([dtype, "float"]) if dtype in ("half", "bfloat16") else dtype


def _training_chain(r: random.Random, dtype: str, n: int) -> tuple[str, list[dict]]:
    per_activation = r.random() < 0.3
    act = [_activation(r)] if r.random() < 0.7 else []
    if r.random() < 0.5:
        bn = {
            "kind": "bn_train",
            "per_activation": per_activation,
            "running": r.random() < 0.7 and (n >= 2 or not per_activation),  # an unbiased variance needs 2 values
            "factor": r.choice([0.1, 1.0, 0.0, r.random()]),
            "eps": r.choice([1e-5, 1e-3]),
            "param_dtype": _param_dtype(r, dtype),
        }
        return "training forward", [bn, *act]
    bn = {"kind": "bn_back", "per_activation": per_activation, "param_dtype": _param_dtype(r, dtype)}
    back = [{**a, "kind": "act_back", "give_y": r.random() < 0.3} for a in act]
    return "backward", [bn, *back]


def _blends(r: random.Random, ops: list[dict], in_dims: tuple, out_dims: tuple, conv_at: int | None) -> None:
    """alpha on some operators; beta (a blend with the output's prior) where the operator's result
    has the output's shape."""
    for i, op in enumerate(ops):
        op["alpha"], op["beta"] = 1.0, 0.0
        if r.random() < 0.2:
            op["alpha"] = r.choice([r.uniform(0.5, 2.0), -1.0, 0.5])
        same_shape = conv_at is None or i >= conv_at or in_dims == out_dims
        if same_shape and r.random() < 0.15:
            op["beta"] = r.choice([r.uniform(-1.0, 1.0), 1.0])


#: Layer-like cases (``layers``): the channel counts, planes, filters and strides of real networks'
#: convolutions, where the kernels tuned for them (tensor boxes, warp-specialized tiles) take them.
LAYER_CHANNELS = (16, 32, 48, 64, 96, 128, 160, 192, 256)
LAYER_PLANES = (7, 8, 13, 14, 15, 28)
LAYER_FILTERS = ((1, 1), (1, 1), (1, 1), (3, 3), (3, 3), (3, 3), (5, 5), (1, 7), (7, 1), (7, 7))


def _layer_conv(r: random.Random, c: int, h: int, w: int) -> dict:
    rr, ss = r.choice(LAYER_FILTERS)
    stride = r.choice([1, 1, 1, 2])
    groups = r.choice([1, 1, 1, 1, 2, 4, c]) if c % 4 == 0 else 1
    k = c if groups == c else r.choice(LAYER_CHANNELS)
    pad = [rr // 2, ss // 2]
    oh, ow = (h + 2 * pad[0] - rr) // stride + 1, (w + 2 * pad[1] - ss) // stride + 1
    return _conv_record(k, rr, ss, pad, [stride, stride], [1, 1], groups, r.choice(["NCHW", "NHWC"]), False, oh, ow)


def _layer_case(r: random.Random, case: Case) -> Case:
    """A convolution chain shaped like a network's layer, in place of the case's draws."""
    dtype = r.choice(["half", "half", "bfloat16", "float"])
    n, c, side = r.randint(1, 4), r.choice(LAYER_CHANNELS), r.choice(LAYER_PLANES)
    conv = _layer_conv(r, c, side, side)
    letters = r.choice(["CBNA", "CBA", "CNA", "CA", "CB", "CN", "C", "CBNAA", "CNB"])
    ops: list[dict] = []
    for letter in letters:
        if letter == "C":
            ops.append(conv)
        elif letter == "B":
            ops.append({"kind": "bias", "param_dtype": _param_dtype(r, dtype)})
        elif letter == "N":
            ops.append({"kind": "bn", "per_activation": False, "eps": 1e-5, "param_dtype": "float"})
        else:
            ops.append(_activation(r))
    x_layout = r.choice(["NHWC", "NHWC", "NCHW"])
    case.update(dtype=dtype, dims=[n, c, side, side], x_layout=x_layout, x_view=False, y_layout="same", y_view=False)
    case.update(specials=r.choice([0, 0, 0, 1]), phase="inference")
    _blends(r, ops, (n, c, side, side), (n, conv["k"], *conv["out"]), 0)
    case["ops"] = ops
    return case


def draw_case(
    seed: int,
    index: int,
    mode: str = "cpu",
    training: float = 0.1,
    misuse: float = 0.0,
    layers: float = 0.0,
    variant: int = 0,
    models: float = 0.0,
) -> Case:
    """Case ``index`` of the run seeded ``seed``; ``mode`` (cpu, interp, gpu, sm90) bounds the sizes.
        A share ``layers`` of the cases are layer-like (_layer_case), chosen by a stream of their own,
        so that the other cases are those of a run without them; ``variant`` > 0 draws another case in
        the index's place, layer-like for odd variants (focused_case's further tries). A share ``models``
    are random fused models trained a few steps (tests/fuzz/models.py), chosen by a stream of their
    own too."""
    suffix = f":{variant}" if variant else ""
    r = random.Random(f"fusionplan-fuzz:{seed}:{index}{suffix}")
    lim = LIMITS[mode]
    dtype = r.choice(DTYPES if mode != "interp" else ("float", "float", "half", "double"))
    n = r.randint(1, lim["n"])
    c = r.choice([1, 2, 3, 4, r.randint(1, lim["c"]), r.randint(1, lim["c"]), 8, 16])
    h, w = (
        r.choice([1, 1, 2, 3, 7, min(13, lim["hw"]), r.randint(1, lim["hw"]), r.randint(1, lim["hw"])]) for _ in "hw"
    )
    layer = random.Random(f"fusionplan-fuzz-layers:{seed}:{index}{suffix}")
    model = random.Random(f"fusionplan-fuzz-models:{seed}:{index}")
    if not variant and models and mode != "sm90" and model.random() < models:
        from .models import draw_model_case

        base = {"seed": seed, "index": index, "mode": mode, "data_seed": model.getrandbits(32)}
        return draw_model_case(model, mode, base)
    if variant % 2 == 1 or (not variant and layers and layer.random() < layers):
        base = {"seed": seed, "index": index, "mode": mode, "data_seed": layer.getrandbits(32)}
        case = _layer_case(layer, {**base, "api": layer.choice(["plan", "core", "miopen"])})
        return _extension_modes(case, f"{seed}:{index}{suffix}")
    case: Case = {
        "seed": seed,
        "index": index,
        "mode": mode,
        "dtype": dtype,
        "dims": [n, c, h, w],
        "x_layout": r.choice(["NCHW", "NHWC"]),
        "x_view": r.random() < 0.15,  # the input a view with gaps between its rows
        "y_layout": r.choice(["NCHW", "NHWC", "same", "same"]),
        "y_view": r.random() < 0.2,
        "specials": r.choice([0, 0, 0, 0, 0, 1, 2, 3]),  # NaN and infinities in the input
        "data_seed": r.getrandbits(32),
        "api": r.choice(["plan", "core", "miopen"]),
    }
    if r.random() < training and n * h * w >= 2:
        case["phase"], ops = _training_chain(r, dtype, n)
        case["api"] = r.choice(["core", "miopen"])  # fp.Plan builds inference chains only
        _blends(r, ops, (n, c, h, w), (n, c, h, w), None)
    else:
        case["phase"] = "inference"
        ops = _inference_chain(r, c, h, w, lim, dtype)
        conv_at = next((i for i, op in enumerate(ops) if op["kind"] == "conv"), None)
        out = (n, c, h, w) if conv_at is None else (n, ops[conv_at]["k"], *ops[conv_at]["out"])
        _blends(r, ops, (n, c, h, w), out, conv_at)
        if dtype in ("half", "bfloat16") and any(op["kind"] == "conv" for op in ops):
            case["specials"] = min(case["specials"], 1)
    case["ops"] = ops
    if misuse and r.random() < misuse:
        case["misuse"] = r.choice(MISUSES)
    return _statistics(_extension_modes(case, f"{seed}:{index}{suffix}"), f"{seed}:{index}{suffix}")


#: fusionplan's activation modes beyond MIOpen's ten (SiLU ... Mish): the Python APIs take them
EXTENSION_MODES = (100, 101, 102, 103, 104, 105)


def _extension_modes(case: Case, key: str) -> Case:
    """Some activations of a case for the Python APIs made one of the extension modes, drawn from a
    stream of their own, so that every other draw is that of a run without them."""
    if case["api"] == "miopen":  # MIOpen's enumeration has only its ten
        return case
    r = random.Random(f"fusionplan-fuzz-extensions:{key}")
    for op in case["ops"]:
        if op["kind"] in ("act", "act_back") and r.random() < 0.3:
            op.update(mode=r.choice(EXTENSION_MODES), a=1.0, b=0.0, g=1.0)
    return _prelu(case, key)


#: PReLU: an extension mode whose slope is a tensor, one per channel (or one for all); inference
#: plans only (the training and backward plans refuse it)
PRELU_MODE = 106


def _prelu(case: Case, key: str) -> Case:
    """Some activations of an inference case made PReLU, drawn from a stream of their own."""
    if case["phase"] != "inference":
        return case
    r = random.Random(f"fusionplan-fuzz-prelu:{key}")
    for op in case["ops"]:
        if op["kind"] == "act" and r.random() < 0.1:
            op.update(mode=PRELU_MODE, a=1.0, b=0.0, g=1.0, one_slope=r.random() < 0.25)
    return case


def _statistics(case: Case, key: str) -> Case:
    """Batch-norm statistics after some inference chains, drawn from a stream of their own (every
    other draw is that of a run without them): the chain's output passed through, its statistics
    as side outputs."""
    r = random.Random(f"fusionplan-fuzz-statistics:{key}")
    if case["phase"] != "inference" or r.random() >= 0.2:
        return case
    conv = next((op for op in case["ops"] if op["kind"] == "conv"), None)
    n, c, h, w = case["dims"]
    pixels = n * (h * w if conv is None else conv["out"][0] * conv["out"][1])
    case["phase"] = "statistics"
    stats = {
        "kind": "bn_stats",
        "per_activation": r.random() < 0.2,
        "running": r.random() < 0.7,
        "factor": r.choice([0.1, 1.0, 0.0, r.random()]),
        "eps": r.choice([1e-5, 1e-3]),
        "param_dtype": _param_dtype(r, case["dtype"]),
        "alpha": 1.0,
        "beta": 0.0,
    }
    if stats["running"] and (n < 2 if stats["per_activation"] else pixels < 2):
        stats["running"] = False  # an unbiased variance needs 2 values
    case["ops"] = [*case["ops"], stats]
    return case


#: Ways a caller gets it wrong; each must give its typed error (or status) and leave the output alone.
MISUSES = (
    "output_dtype",
    "output_shape",
    "output_overlaps",
    "output_readonly",
    "output_memmap_readonly",
    "input_shape",
    "input_dtype",
    "missing_args",
    "weight_shape",
    "not_compiled",
)
