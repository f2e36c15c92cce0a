"""An httpx transport whose every socket operation keeps one overall deadline per call.

httpx's timeouts bound each read, not a call: an API that answers one byte every half second keeps
each read inside its timeout for ever. Inside ``deadline(seconds)`` every connect, read, write and
TLS handshake on the thread gets at most the time left, and none at all once it has passed.
"""

from __future__ import annotations

import ssl
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import httpcore
    import httpx

_deadlines = threading.local()


@contextmanager
def deadline(seconds: float) -> Iterator[None]:
    """Every socket operation on this thread, until the block ends, gets at most the time left."""
    previous = getattr(_deadlines, "at", None)
    _deadlines.at = time.monotonic() + seconds
    try:
        yield
    finally:
        _deadlines.at = previous


def _time_left(timeout: float | None) -> float | None:
    """``timeout`` cut to the time left until this thread's deadline; raises when none is left."""
    at: float | None = getattr(_deadlines, "at", None)
    if at is None:
        return timeout
    import httpcore

    left = at - time.monotonic()
    if left <= 0:
        raise httpcore.ReadTimeout("the call's overall deadline passed")
    return left if timeout is None else min(timeout, left)


def deadline_transport(ssl_context: ssl.SSLContext | None, uds: str | None) -> httpx.HTTPTransport:
    """httpx's own transport over httpcore's pool, whose every socket operation keeps the call's deadline."""
    import httpcore
    import httpx

    class Stream(httpcore.NetworkStream):
        def __init__(self, inner: httpcore.NetworkStream) -> None:
            self._inner = inner

        def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
            return self._inner.read(max_bytes, _time_left(timeout))

        def write(self, buffer: bytes, timeout: float | None = None) -> None:
            self._inner.write(buffer, _time_left(timeout))

        def close(self) -> None:
            self._inner.close()

        def start_tls(
            self, ssl_context: ssl.SSLContext, server_hostname: str | None = None, timeout: float | None = None
        ) -> httpcore.NetworkStream:
            return Stream(self._inner.start_tls(ssl_context, server_hostname, _time_left(timeout)))

        def get_extra_info(self, info: str) -> Any:
            return self._inner.get_extra_info(info)

    class Backend(httpcore.SyncBackend):
        def connect_tcp(
            self,
            host: str,
            port: int,
            timeout: float | None = None,
            local_address: str | None = None,
            socket_options: Any = None,
        ) -> httpcore.NetworkStream:
            return Stream(super().connect_tcp(host, port, _time_left(timeout), local_address, socket_options))

        def connect_unix_socket(
            self, path: str, timeout: float | None = None, socket_options: Any = None
        ) -> httpcore.NetworkStream:
            return Stream(super().connect_unix_socket(path, _time_left(timeout), socket_options))

    class DeadlineTransport(httpx.HTTPTransport):
        # httpx's __init__ offers no way to pass a network backend and would build (and load the CA bundle
        # for) a pool only to have it replaced: this is the pool it builds with its defaults (100
        # connections, 20 kept alive for 5 s). handle_request and close use nothing but the pool.
        def __init__(self) -> None:  # deliberately not calling super().__init__ (above)
            self._pool = httpcore.ConnectionPool(
                ssl_context=ssl_context,
                max_connections=100,
                max_keepalive_connections=20,
                keepalive_expiry=5.0,
                uds=uds,
                network_backend=Backend(),
            )

    return DeadlineTransport()
