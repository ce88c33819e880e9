"""The handle: a device, a stream, and the compiled kernels made for them."""

from __future__ import annotations

import contextlib
import itertools
import threading
from collections.abc import Iterator
from typing import Any

import torch

from fusionplan.core.caches import LruCache
from fusionplan.core.errors import BadParmError
from fusionplan.core.settings import Settings

_uids = itertools.count(1)


def default_device() -> torch.device:
    """torch's current CUDA device when there is one, else the CPU."""
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def resolve_device(device: Any) -> torch.device:
    """A concrete torch device (with its index for CUDA), or BadParmError."""
    if device is None:
        return default_device()
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise BadParmError(f"device {device!r}: {exc}") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise BadParmError(f"device {device!r}: CUDA is not available on this machine")
        index = torch.cuda.current_device() if dev.index is None else dev.index
        if not 0 <= index < torch.cuda.device_count():
            raise BadParmError(f"device {device!r}: there are {torch.cuda.device_count()} CUDA devices")
        return torch.device("cuda", index)
    if dev.type != "cpu":
        raise BadParmError(f"device {device!r}: only CPU and CUDA devices are supported")
    return dev


class Handle:
    """Device and stream on which plans compile and execute; it owns their compiled kernels.

    ``stream=None`` means torch's current stream at the time of each execute, which is what a
    framework expects. ``allow_tf32=None`` follows ``torch.backends.cudnn.allow_tf32``.
    ``settings``: the handle's ``Settings`` (None: read from the environment now);
    ``find_mode``: FAST (heuristic tuning) or NORMAL (benchmark the candidates once per
    signature), in place of the settings' own.
    """

    def __init__(
        self,
        device: Any = None,
        stream: Any = None,
        allow_tf32: bool | None = None,
        find_mode: str | None = None,
        settings: Settings | None = None,
    ) -> None:
        if settings is not None and not isinstance(settings, Settings):
            raise BadParmError(f"settings: expected fusionplan.Settings, got {type(settings).__name__}")
        self.device = resolve_device(device)
        self.uid = next(_uids)
        self.allow_tf32 = allow_tf32
        self.settings = settings if settings is not None else Settings.from_environment()
        if find_mode is not None:
            self.settings = self.settings.with_changes(find_mode=find_mode)
        self._stream = None
        self.set_stream(stream)
        self.kernels: dict[tuple, Any] = {}  # plan signature -> compiled kernel
        self.lock = threading.Lock()
        self._caches: dict[str, LruCache] = {}
        self._caches_lock = threading.Lock()

    def cache(self, name: str, size: int) -> LruCache:
        """The handle's cache called ``name`` (made on first use, with at most ``size`` entries):
        what a frontend keeps of this handle's work, gone with the handle."""
        found = self._caches.get(name)
        if found is None:
            with self._caches_lock:
                found = self._caches.setdefault(name, LruCache(name, size, process=False))
        return found

    def clear_caches(self) -> None:
        """Empty the handle's caches (its compiled kernels stay)."""
        for cache in list(self._caches.values()):
            cache.clear()

    @property
    def find_mode(self) -> str:
        """FAST or NORMAL (the settings')."""
        return self.settings.find_mode

    @property
    def stream(self) -> Any:
        return self._stream

    def set_stream(self, stream: Any) -> None:
        if stream is not None:
            if self.device.type != "cuda":
                raise BadParmError("a stream can only be set on a CUDA handle")
            if not isinstance(stream, torch.cuda.Stream):
                raise BadParmError(f"stream: expected a torch.cuda.Stream or None, got {type(stream).__name__}")
            if stream.device != self.device:
                raise BadParmError(f"stream is on {stream.device}, the handle on {self.device}")
        self._stream = stream

    def current_stream(self) -> Any:
        """The stream work goes to now: the handle's own, or torch's current one (None on the CPU)."""
        if self.device.type != "cuda":
            return None
        return self._stream if self._stream is not None else torch.cuda.current_stream(self.device)

    def is_active(self) -> bool:
        """True when ``activate()`` would change nothing: no stream of its own, device current."""
        if self.device.type != "cuda":
            return True
        return self._stream is None and torch.cuda.current_device() == self.device.index

    @contextlib.contextmanager
    def activate(self) -> Iterator[None]:
        """Make the handle's device and stream current for the work inside."""
        if self.device.type != "cuda":
            yield
            return
        with torch.cuda.device(self.device):
            if self._stream is None:
                yield
            else:
                with torch.cuda.stream(self._stream):
                    yield

    def compute_capability(self) -> tuple[int, int] | None:
        """The CUDA device's (major, minor) compute capability; None off CUDA or where torch sees none."""
        if self.device.type != "cuda" or not torch.cuda.is_available():
            return None
        return torch.cuda.get_device_capability(self.device)

    def tf32_allowed(self) -> bool:
        if self.allow_tf32 is not None:
            return self.allow_tf32
        return bool(torch.backends.cudnn.allow_tf32)

    def __repr__(self) -> str:
        return f"<fusionplan.Handle {self.uid} on {self.device}>"
