"""One stop signal for the process and a cancel Event per open stream.

Fingerprint, Stats, StreamStdio and StartStream are long-lived: each holds a
worker thread until its call is cancelled. Shutdown (RPC or SIGTERM) must end
them all at once so the server can stop within go-plugin's 2 s budget; every
stream therefore registers an Event that fires on either the call's
cancellation or the process stop.
"""

from __future__ import annotations

import threading

import grpc

from nomad_plugin.goplugin.cancel import CancelEvent


class Lifecycle:
    def __init__(self) -> None:
        self.stopping = threading.Event()
        self.stop_reason = ""
        self._streams: set[threading.Event] = set()
        self._lock = threading.Lock()

    def open_stream(self, context: grpc.ServicerContext) -> threading.Event:
        """An Event set when this call is cancelled/ends or the process stops.

        A ``CancelEvent``: an engine waiting for something else (the fingerprint
        engine waits for a new fingerprint) is woken by its callback instead of
        polling the event (issue 14).
        """
        cancel = CancelEvent()
        if not context.add_callback(cancel.set):
            cancel.set()  # the call already ended
        with self._lock:
            if self.stopping.is_set():
                cancel.set()
            self._streams.add(cancel)
        return cancel

    def close_stream(self, cancel: threading.Event) -> None:
        with self._lock:
            self._streams.discard(cancel)

    def open_count(self) -> int:
        with self._lock:
            return len(self._streams)

    def request_stop(self, reason: str) -> None:
        """Idempotent: the first reason wins; every open stream is released."""
        with self._lock:
            if not self.stopping.is_set():
                self.stop_reason = reason
                self.stopping.set()
            streams = list(self._streams)
        for cancel in streams:
            cancel.set()
