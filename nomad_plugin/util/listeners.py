"""A thread-safe set of inventory listeners, shared by the backends.

A listener's exception is logged and never reaches the backend's thread:
one buggy subscriber must not stop the others, or the backend's watcher.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")
log = logging.getLogger(__name__)


class Listeners(Generic[T]):
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._items: list[Callable[[T], None]] = []

    def add(self, listener: Callable[[T], None]) -> Callable[[], None]:
        """Register ``listener``; returns the function that unregisters it (idempotent)."""
        with self._lock:
            self._items.append(listener)

        def remove() -> None:
            with self._lock:
                if listener in self._items:
                    self._items.remove(listener)

        return remove

    def notify(self, value: T) -> None:
        """Call every listener registered now with ``value``, outside the lock."""
        with self._lock:
            items = list(self._items)
        for listener in items:
            try:
                listener(value)
            except Exception:
                log.exception("inventory listener failed")
