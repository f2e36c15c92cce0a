"""A ``threading.Event`` that also calls back when it is set (here, beside the per-stream events of
``lifecycle``, so that no lower package has to be imported before the handshake).

Why: cancelling a blocking gRPC stream needs someone to call ``cancel()`` on
it when the consumer stops. Watching a plain Event for that takes a thread
that wakes every fraction of a second for the stream's whole life (five
wake-ups a second per stream, idle or not; issue 14). A consumer that owns a
``CancelEvent`` lets the stream register its ``cancel`` instead; code that
only knows ``threading.Event`` still sees one.
"""

from __future__ import annotations

import threading
from collections.abc import Callable


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
