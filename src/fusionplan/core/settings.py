"""A handle's settings: what fusionplan reads from the environment, read in one place.

A ``Handle`` made without ``settings`` reads them from the environment when it is made (the
default handle of a device is made again when they change); one made with ``settings`` keeps
those. ``Settings.from_environment()`` names the variable behind a bad value.

The location of the on-disk cache (``FUSIONPLAN_CACHE_DIR``, else ``$XDG_CACHE_HOME/fusionplan``,
else ``~/.cache/fusionplan``) belongs to the process, not to a handle (a kernel compiled for one
handle serves every handle): ``cache_directory``, read at each use, so that a process (a test
session, say) may move it.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from pathlib import Path

from fusionplan.core.errors import BadParmError

#: The solver families compile may be restricted to (``backend``).
FAMILIES = ("triton", "cpu", "vendor", "reference")
#: FAST: each solver's heuristic configuration; NORMAL: candidates and solvers timed once per signature.
FIND_MODES = ("FAST", "NORMAL")
#: Each setting's environment variable.
VARIABLES = {
    "backend": "FUSIONPLAN_BACKEND",
    "find_mode": "FUSIONPLAN_FIND_MODE",
    "direct_launch": "FUSIONPLAN_DIRECT_LAUNCH",
    "compile_workers": "FUSIONPLAN_COMPILE_WORKERS",
    "compile_processes": "FUSIONPLAN_COMPILE_PROCESSES",
}
#: The on-disk cache's variable (the process's: ``cache_directory``).
CACHE_VARIABLE = "FUSIONPLAN_CACHE_DIR"
_FALSE = ("0", "false", "off", "no")
_TRUE = ("1", "true", "on", "yes")


@dataclass(frozen=True)
class Settings:
    """``backend``: restrict compile to one solver family (None: any). ``find_mode``: FAST or
    NORMAL. ``direct_launch``: call compiled kernels directly (False: through Triton's launcher
    every time). ``compile_workers``: threads of ``compile_all`` and ``prepare`` (None: the cores
    this process may use). ``compile_processes``: hand GPU compiles to worker processes."""

    backend: str | None = None
    find_mode: str = "FAST"
    direct_launch: bool = True
    compile_workers: int | None = None
    compile_processes: bool = True

    def __post_init__(self) -> None:
        if self.backend is not None:
            backend = str(self.backend).strip().lower()
            if backend not in FAMILIES:
                raise BadParmError(f"backend {self.backend!r}: choose one of {', '.join(FAMILIES)}")
            object.__setattr__(self, "backend", backend)
        mode = str(self.find_mode).strip().upper()
        if mode not in FIND_MODES:
            raise BadParmError(f"find mode {self.find_mode!r}: choose one of {', '.join(FIND_MODES)}")
        object.__setattr__(self, "find_mode", mode)
        workers = self.compile_workers
        if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 1):
            raise BadParmError(f"compile_workers must be a whole number of at least 1, got {workers!r}")
        for name in ("direct_launch", "compile_processes"):
            if not isinstance(getattr(self, name), bool):
                raise BadParmError(f"{name} must be True or False, got {getattr(self, name)!r}")

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """The settings the environment gives (``os.environ`` by default); unset or empty
        variables keep the defaults. BadParmError names the variable of a bad value."""
        if environ is None:  # one parse per distinct set of values (a call per execute reads these)
            return _settings_of(_raw_environment())
        values: dict = {}
        for name, variable in VARIABLES.items():
            text = environ.get(variable, "").strip()
            if not text:
                continue
            values[name] = _parsed(name, variable, text)
            try:
                cls(**{name: values[name]})
            except BadParmError as exc:
                raise BadParmError(f"{variable}: {exc}") from None
        return cls(**values)

    def with_changes(self, **changes) -> Settings:
        """These settings with ``changes`` (checked as at construction)."""
        unknown = set(changes) - {f.name for f in fields(self)}
        if unknown:
            raise BadParmError(f"no setting named {', '.join(sorted(unknown))}")
        return replace(self, **changes)


def _parsed(name: str, variable: str, text: str):
    if name in ("direct_launch", "compile_processes"):
        lowered = text.lower()
        if lowered not in _FALSE + _TRUE:
            raise BadParmError(f"{variable} must be one of 0/1, true/false, on/off, yes/no, got {text!r}")
        return lowered in _TRUE
    if name == "compile_workers":
        try:
            return int(text)
        except ValueError:
            raise BadParmError(f"{variable} must be a whole number, got {text!r}") from None
    return text


def cache_directory(environ: Mapping[str, str] | None = None) -> Path:
    """The on-disk cache's folder: ``FUSIONPLAN_CACHE_DIR``, else ``fusionplan`` under
    ``XDG_CACHE_HOME``, else under ``~/.cache``."""
    environ = os.environ if environ is None else environ
    chosen = environ.get(CACHE_VARIABLE, "").strip()
    if chosen:
        return Path(chosen).expanduser()
    xdg = environ.get("XDG_CACHE_HOME", "").strip()
    return (Path(xdg) if xdg else Path.home() / ".cache") / "fusionplan"


#: The variables as the process environment's own keys, where os.environ keeps its values in a dict
#: of bytes (POSIX): read there, the values of a call per execute cost a tenth of os.environ.get's.
_ENVIRONMENT_KEYS = tuple(os.fsencode(v) for v in VARIABLES.values()) if os.name == "posix" else None


def _raw_environment() -> tuple:
    """The variables' raw values in VARIABLES' order (str or bytes; None or "" where unset)."""
    data = getattr(os.environ, "_data", None)
    if _ENVIRONMENT_KEYS is not None and isinstance(data, dict):
        return tuple(map(data.get, _ENVIRONMENT_KEYS))
    return tuple(os.environ.get(v, "") for v in VARIABLES.values())


@functools.lru_cache(maxsize=32)
def _settings_of(raw: tuple) -> Settings:
    """Settings.from_environment of these raw values, in VARIABLES' order (bad ones raise each time)."""
    text = ["" if v is None else os.fsdecode(v) if isinstance(v, bytes) else v for v in raw]
    return Settings.from_environment(dict(zip(VARIABLES.values(), text)))
