"""What fusionplan keeps in memory between calls, as named, bounded, thread-safe caches.

A cache of one handle's work (the one-call API's plans and arguments) hangs off the handle
(``Handle.cache``); a cache of the process's (descriptors, fused-chain plans, per-stream launch
memory, loaded kernel modules, stored find times) is a ``LruCache`` made with a name, and is
listed by ``cache_sizes()`` and emptied by ``clear_caches()``: every entry of every cache can be
made again, so clearing costs time, never correctness.
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

_process_caches: weakref.WeakValueDictionary[str, LruCache] = weakref.WeakValueDictionary()
_registry_lock = threading.Lock()


class LruCache(Generic[K, V]):
    """A map of at most ``size`` entries (None: no bound), the least recently used dropped first.

    ``process=True`` (the default) lists it among the process's caches under ``name``, which must
    then be unique; a handle's caches are not listed (they go with their handle)."""

    def __init__(self, name: str, size: int | None, *, process: bool = True) -> None:
        if size is not None and size < 1:
            raise ValueError(f"cache {name!r}: size must be at least 1, got {size}")
        self.name = name
        self.size = size
        self._entries: OrderedDict[K, V] = OrderedDict()
        self._lock = threading.Lock()
        if process:
            with _registry_lock:
                if name in _process_caches:
                    raise ValueError(f"a process cache named {name!r} exists already")
                _process_caches[name] = self

    def get(self, key: K, default: V | None = None) -> V | None:
        """The entry under ``key`` (now the most recent), or ``default``."""
        with self._lock:
            try:
                value = self._entries[key]
            except KeyError:
                return default
            self._entries.move_to_end(key)
            return value

    def put(self, key: K, value: V) -> V:
        """``value`` under ``key`` (the most recent); returns it."""
        with self._lock:
            self._entries[key] = value
            self._entries.move_to_end(key)
            self._trim()
        return value

    def setdefault(self, key: K, value: V) -> V:
        """The entry under ``key``, ``value`` put there first where there was none."""
        with self._lock:
            if key in self._entries:
                self._entries.move_to_end(key)
                return self._entries[key]
            self._entries[key] = value
            self._trim()
            return value

    def get_or_make(self, key: K, make: Callable[[], V]) -> V:
        """The entry under ``key``, else ``make()`` put there (made outside the lock: two threads
        may both make it, the first one put wins)."""
        found = self.get(key)
        return found if found is not None else self.setdefault(key, make())

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    def values(self) -> list[V]:
        with self._lock:
            return list(self._entries.values())

    def __contains__(self, key: object) -> bool:
        with self._lock:
            return key in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def _trim(self) -> None:
        while self.size is not None and len(self._entries) > self.size:
            self._entries.popitem(last=False)

    def __repr__(self) -> str:
        bound = "unbounded" if self.size is None else f"at most {self.size}"
        return f"<LruCache {self.name!r}: {len(self)} entries, {bound}>"


def cache_sizes() -> dict[str, int]:
    """The process's caches, by name: how many entries each holds now."""
    with _registry_lock:
        caches = list(_process_caches.values())
    return {cache.name: len(cache) for cache in sorted(caches, key=lambda c: c.name)}


def clear_caches() -> None:
    """Empty the process's caches (handles keep theirs: ``Handle.clear_caches``). What was cached
    is made again on its next use."""
    with _registry_lock:
        caches = list(_process_caches.values())
    for cache in caches:
        cache.clear()
