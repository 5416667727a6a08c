"""One lock per key, made on first use: threads that want the same thing (one jump host,
one identity file, one known_hosts file) wait for one attempt at it; others go on."""

from __future__ import annotations

import threading
from collections.abc import Hashable


class KeyedLocks:
    """``locks(key)``: the lock for ``key``, the same one for every thread that asks."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._locks: dict[Hashable, threading.Lock] = {}

    def __call__(self, key: Hashable) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault(key, threading.Lock())
