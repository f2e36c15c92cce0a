"""What the engines' threads share: an event that calls back when set, listeners, the reconnect backoff."""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

T = TypeVar("T")
log = logging.getLogger(__name__)


class CancelEvent(threading.Event):
    """``threading.Event`` plus ``on_set`` callbacks, each called once, outside any lock: a blocking gRPC
    stream registers its ``cancel()``, where watching a plain Event would take a thread of its own."""

    def __init__(self) -> None:
        super().__init__()
        self._callbacks_lock = threading.Lock()
        self._callbacks: dict[int, Callable[[], None]] = {}
        self._next_token = 0

    def set(self) -> None:
        super().set()
        with self._callbacks_lock:
            callbacks = list(self._callbacks.values())
            self._callbacks.clear()
        for callback in callbacks:
            callback()

    def on_set(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Call ``callback`` when the event is set (at once if it already is); returns an unregister."""
        with self._callbacks_lock:
            if not self.is_set():
                token = self._next_token
                self._next_token += 1
                self._callbacks[token] = callback

                def forget() -> None:
                    with self._callbacks_lock:
                        self._callbacks.pop(token, None)

                return forget
        callback()
        return lambda: None


class Listeners(Generic[T]):
    """A thread-safe set of callbacks; one that raises is logged and never stops the others or the caller."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._items: list[Callable[[T], None]] = []

    def add(self, listener: Callable[[T], None]) -> Callable[[], None]:
        """Returns the function that unregisters ``listener`` (idempotent)."""
        with self._lock:
            self._items.append(listener)

        def remove() -> None:
            with self._lock:
                if listener in self._items:
                    self._items.remove(listener)

        return remove

    def notify(self, value: T) -> None:
        with self._lock:
            items = list(self._items)
        for listener in items:
            try:
                listener(value)
            except Exception:
                log.exception("inventory listener failed")


@dataclass
class Backoff:
    """XDM's reconnect rule (1 s, doubling, capped at 30 s), with jitter so that many plugins do not
    reconnect in lock-step after an XDM restart."""

    initial: float = 1.0
    factor: float = 2.0
    cap: float = 30.0
    jitter: float = 0.2
    rng: random.Random = field(default_factory=random.Random)
    attempt: int = 0

    def next_delay(self) -> float:
        base = min(self.cap, self.initial * (self.factor**self.attempt))
        self.attempt += 1
        spread = base * self.jitter
        return float(max(0.0, min(self.cap, base + self.rng.uniform(-spread, spread))))

    def reset(self) -> None:
        self.attempt = 0
