"""Which of torch's activations (modules, functions, methods) fuse() maps to fusionplan's modes,
with their parameters; and which it knows but does not run (reported when a chain stops there)."""

from __future__ import annotations

import torch
import torch.fx
import torch.nn.functional as F
from torch import nn

from fusionplan.core.enums import ActivationMode


def activation_of(target: object, node_args: tuple = (), kwargs: dict | None = None) -> tuple | None:
    """(mode, alpha, beta, gamma) for an activation module or function, or None."""
    kwargs = kwargs or {}
    if isinstance(target, nn.ReLU) or target in (F.relu, torch.relu, torch.relu_):
        return (ActivationMode.RELU, 1.0, 0.0, 1.0)
    if isinstance(target, nn.ReLU6) or target is F.relu6:
        return (ActivationMode.CLIPPEDRELU, 6.0, 0.0, 1.0)
    if isinstance(target, nn.Hardtanh) and target.min_val == 0.0:
        return (ActivationMode.CLIPPEDRELU, float(target.max_val), 0.0, 1.0)
    if isinstance(target, nn.LeakyReLU):
        return (ActivationMode.LEAKYRELU, float(target.negative_slope), 0.0, 1.0)
    if target is F.leaky_relu:
        slope = node_args[1] if len(node_args) > 1 else kwargs.get("negative_slope", 0.01)
        return (ActivationMode.LEAKYRELU, float(slope), 0.0, 1.0) if isinstance(slope, (int, float)) else None
    if isinstance(target, nn.ELU):
        return (ActivationMode.ELU, float(target.alpha), 0.0, 1.0)
    if target is F.elu:
        alpha = node_args[1] if len(node_args) > 1 else kwargs.get("alpha", 1.0)
        return (ActivationMode.ELU, float(alpha), 0.0, 1.0) if isinstance(alpha, (int, float)) else None
    if isinstance(target, nn.Sigmoid) or target in (torch.sigmoid, F.sigmoid):
        return (ActivationMode.LOGISTIC, 1.0, 0.0, 1.0)
    if isinstance(target, nn.Tanh) or target in (torch.tanh, F.tanh):
        return (ActivationMode.TANH, 1.0, 1.0, 1.0)
    if isinstance(target, nn.Softplus) and target.beta == 1:
        # PyTorch returns x above its threshold (20): log(1 + e^x) differs from x by e^-20 there.
        return (ActivationMode.SOFTRELU, 1.0, 0.0, 1.0)
    if isinstance(target, nn.Identity):
        return (ActivationMode.PASTHRU, 1.0, 0.0, 1.0)
    if isinstance(target, nn.PReLU):  # its slopes are a parameter the chain reads (FusedChain._slope)
        return (ActivationMode.PRELU, 1.0, 0.0, 1.0)
    mode = _extension_mode(target, node_args, kwargs)
    return None if mode is None else (mode, 1.0, 0.0, 1.0)


_EXTENSION_MODULES = {
    nn.SiLU: ActivationMode.SILU,
    nn.Hardswish: ActivationMode.HARDSWISH,
    nn.Hardsigmoid: ActivationMode.HARDSIGMOID,
    nn.Mish: ActivationMode.MISH,
}
_EXTENSION_FUNCTIONS = {
    F.silu: ActivationMode.SILU,
    F.hardswish: ActivationMode.HARDSWISH,
    F.hardsigmoid: ActivationMode.HARDSIGMOID,
    F.mish: ActivationMode.MISH,
}


_GELU_FORMS = {"none": ActivationMode.GELU, "tanh": ActivationMode.GELU_TANH}


def _extension_mode(target: object, node_args: tuple, kwargs: dict) -> ActivationMode | None:
    """fusionplan's extension activation of a module or function (GELU by its approximation); in
    place or not (inplace=True), the same value."""
    if isinstance(target, nn.GELU):
        return _GELU_FORMS.get(target.approximate)
    if target is F.gelu:
        return _GELU_FORMS.get(node_args[1] if len(node_args) > 1 else kwargs.get("approximate", "none"))
    return _EXTENSION_MODULES.get(type(target)) or _EXTENSION_FUNCTIONS.get(target)


def activation_node(gm, node) -> tuple | None:
    if node is None:
        return None
    if node.op == "call_module":
        return activation_of(gm.get_submodule(node.target))
    if node.op == "call_function" and node.args:
        return activation_of(node.target, node.args, node.kwargs)  # in place or not: the same value
    if node.op == "call_method" and node.target in ("relu", "relu_", "sigmoid", "tanh"):
        return activation_of(
            {"relu": torch.relu, "relu_": torch.relu, "sigmoid": torch.sigmoid, "tanh": torch.tanh}[node.target]
        )
    return None


#: torch's activation functions by name (those nn.functional and torch define): an activation node
#: fuse() cannot run is reported, not passed over in silence
_ACTIVATION_NAMES = frozenset(
    "relu relu_ relu6 leaky_relu elu selu celu gelu silu mish hardswish hardsigmoid hardtanh prelu rrelu "
    "softplus softsign logsigmoid tanhshrink threshold sigmoid tanh".split()
)


def unfused_activation(gm, node: torch.fx.Node | None) -> str | None:
    """The name of the activation ``node`` is, where fusionplan's kernels do not run it; else None."""
    if node is None or activation_node(gm, node) is not None:
        return None
    if node.op == "call_module":
        module = gm.get_submodule(node.target)
        return type(module).__name__ if type(module).__module__ == "torch.nn.modules.activation" else None
    if node.op in ("call_function", "call_method"):
        name = node.target if node.op == "call_method" else getattr(node.target, "__name__", "")
        return name if name in _ACTIVATION_NAMES else None
    return None
