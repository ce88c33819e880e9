"""Settings: the environment read in one place, each bad value named by its variable; a handle's
settings reach the solvers (backend, find mode), the launchers (direct launch) and compile_all
(threads, worker processes)."""

from __future__ import annotations

import pytest
import torch

import fusionplan as fp
from fusionplan import compiling
from fusionplan.core.settings import VARIABLES, Settings
from fusionplan.runtime import compile_pool, launch
from fusionplan.runtime.launch import Launcher
from fusionplan.tools.shapes import resnet50_layer
from fusionplan.tools.verify import layer_plan


def test_defaults_and_every_variable():
    assert Settings.from_environment({}) == Settings(None, "FAST", True, None, True)
    environ = {
        "FUSIONPLAN_BACKEND": " Triton ",
        "FUSIONPLAN_FIND_MODE": "normal",
        "FUSIONPLAN_DIRECT_LAUNCH": "0",
        "FUSIONPLAN_COMPILE_WORKERS": "3",
        "FUSIONPLAN_COMPILE_PROCESSES": "off",
    }
    assert set(environ) == set(VARIABLES.values())
    assert Settings.from_environment(environ) == Settings("triton", "NORMAL", False, 3, False)
    assert Settings.from_environment({"FUSIONPLAN_BACKEND": ""}).backend is None  # empty: unset


@pytest.mark.parametrize(
    "variable, value, message",
    [
        ("FUSIONPLAN_BACKEND", "cuda", "FUSIONPLAN_BACKEND: backend 'cuda': choose one of"),
        ("FUSIONPLAN_FIND_MODE", "exhaustive", "FUSIONPLAN_FIND_MODE: find mode 'exhaustive'"),
        ("FUSIONPLAN_DIRECT_LAUNCH", "maybe", "FUSIONPLAN_DIRECT_LAUNCH must be one of"),
        ("FUSIONPLAN_COMPILE_WORKERS", "many", "FUSIONPLAN_COMPILE_WORKERS must be a whole number"),
        ("FUSIONPLAN_COMPILE_WORKERS", "0", "FUSIONPLAN_COMPILE_WORKERS: compile_workers must be"),
        ("FUSIONPLAN_COMPILE_PROCESSES", "2", "FUSIONPLAN_COMPILE_PROCESSES must be one of"),
    ],
)
def test_a_bad_value_names_its_variable(variable, value, message, monkeypatch):
    with pytest.raises(fp.BadParmError, match=message):
        Settings.from_environment({variable: value})
    monkeypatch.setenv(variable, value)
    with pytest.raises(fp.BadParmError, match=message):
        fp.Handle("cpu")


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"backend": "gpu"}, "backend 'gpu'"),
        ({"find_mode": 1}, "find mode 1"),
        ({"compile_workers": True}, "compile_workers must be a whole number"),
        ({"direct_launch": "no"}, "direct_launch must be True or False"),
        ({"threads": 2}, "no setting named threads"),
    ],
)
def test_changes_are_checked(changes, message):
    with pytest.raises(fp.BadParmError, match=message):
        Settings().with_changes(**changes)


def test_direct_launch_reaches_the_kernels_launchers(monkeypatch):
    monkeypatch.setattr(launch, "interpreter_active", lambda: False)  # the interpreter never launches directly
    s = resnet50_layer("r50_22")
    x = torch.empty(32, s.c, s.h, s.w, dtype=torch.float16).to(memory_format=torch.channels_last)
    spec = layer_plan(s, x, "CBNA").spec()
    for direct in (True, False):
        handle = fp.Handle("cpu", settings=Settings(direct_launch=direct))
        kernel = fp.solvers.solver_named("gluon-window").build(spec, handle)
        assert kernel.launcher.direct is direct
    assert Launcher(lambda: None, direct=False).direct is False


def test_compile_processes_reach_compile_all(monkeypatch):
    """compile_all hands GPU compiles to worker processes only where the handle's settings allow."""
    entered = []
    monkeypatch.setattr(compiling, "worker_processes", lambda workers, enabled: entered.append(enabled) or _null())
    monkeypatch.setattr(compiling, "on_gpu", lambda device_type: True)
    plans = [fp.FusionPlan(fp.TensorDescriptor.packed("float", (1, 2, 3, 3)))]
    plans[0].add_activation_forward(fp.ActivationMode.RELU)
    for enabled in (True, False):
        fp.compile_all(plans, fp.Handle("cpu", settings=Settings(compile_processes=enabled)), workers=2)
    assert entered == [True, False]
    assert compile_pool.active_pool() is None


def _null():
    import contextlib

    return contextlib.nullcontext()
