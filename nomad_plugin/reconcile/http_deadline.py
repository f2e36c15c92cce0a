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


def deadline_transport(ssl_context: ssl.SSLContext | None, uds: str | None) -> httpx.BaseTransport:
    """A transport whose every socket operation keeps the call's deadline: httpx and httpcore through their
    public APIs only (a custom transport, a pool with a network backend), so an upgrade of either cannot
    silently drop the deadline."""
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

    class DeadlineTransport(httpx.BaseTransport):
        """httpx's documented custom-transport interface over an httpcore pool (httpcore's public API)
        with the backend above; the answer is read whole here, inside the call's deadline."""

        def __init__(self) -> None:
            # httpx's own defaults: 100 connections, 20 kept alive for 5 s.
            self._pool = httpcore.ConnectionPool(
                ssl_context=ssl_context,
                max_connections=100,
                max_keepalive_connections=20,
                keepalive_expiry=5.0,
                uds=uds,
                network_backend=Backend(),
            )

        def handle_request(self, request: httpx.Request) -> httpx.Response:
            url = request.url
            core = httpcore.Request(
                request.method,
                httpcore.URL(scheme=url.raw_scheme, host=url.raw_host, port=url.port, target=url.raw_path),
                headers=request.headers.raw,
                content=request.read(),
                extensions=request.extensions,
            )
            try:
                answer = self._pool.handle_request(core)
                try:
                    content = answer.read()
                finally:
                    answer.close()
            except (httpcore.TimeoutException, httpcore.NetworkError, httpcore.ProtocolError) as exc:
                # httpx names its errors as httpcore does (ReadTimeout, ConnectError, RemoteProtocolError...).
                same: Any = getattr(httpx, type(exc).__name__, None)
                error = (
                    same if isinstance(same, type) and issubclass(same, httpx.TransportError) else httpx.TransportError
                )
                raise error(str(exc), request=request) from exc
            return httpx.Response(answer.status, headers=answer.headers, content=content, request=request)

        def close(self) -> None:
            self._pool.close()

    return DeadlineTransport()
