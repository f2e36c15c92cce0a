"""What the engines' threads share: an Event that calls back when set, a set of listeners, the backoff between reconnects."""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

T = TypeVar("T")
log = logging.getLogger(__name__)

# A ``threading.Event`` that also calls back when it is set (here, beside the per-stream events of
# ``lifecycle``, so that no lower package has to be imported before the handshake).
#
# Why: cancelling a blocking gRPC stream needs someone to call ``cancel()`` on
# it when the consumer stops. Watching a plain Event for that takes a thread
# that wakes every fraction of a second for the stream's whole life (five
# wake-ups a second per stream, idle or not; issue 14). A consumer that owns a
# ``CancelEvent`` lets the stream register its ``cancel`` instead; code that
# only knows ``threading.Event`` still sees one.
#


class CancelEvent(threading.Event):
    """``threading.Event`` plus ``on_set`` callbacks, each called once, outside any lock."""

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
        return _nothing


def _nothing() -> None:
    return None


# Exponential backoff with jitter: XDM's documented reconnect rule.
#
# The XDM reference asks clients to resubscribe after 1 s, doubling, capped at
# 30 s. Jitter (full range ±``jitter`` of the delay) keeps many plugins from
# reconnecting in lock-step after an XDM restart.
#


@dataclass
class Backoff:
    initial: float = 1.0
    factor: float = 2.0
    cap: float = 30.0
    jitter: float = 0.2
    rng: random.Random = field(default_factory=random.Random)
    attempt: int = 0

    def base_delay(self, attempt: int) -> float:
        """The un-jittered delay before retry number ``attempt`` (0-based)."""
        return float(min(self.cap, self.initial * (self.factor**attempt)))

    def next_delay(self) -> float:
        base = self.base_delay(self.attempt)
        self.attempt += 1
        spread = base * self.jitter
        return float(max(0.0, min(self.cap, base + self.rng.uniform(-spread, spread))))

    def reset(self) -> None:
        self.attempt = 0


# A thread-safe set of inventory listeners, shared by the backends.
#
# A listener's exception is logged and never reaches the backend's thread:
# one buggy subscriber must not stop the others, or the backend's watcher.
#


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
