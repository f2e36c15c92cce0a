"""An HTTP/2 proxy on Unix sockets that resets chosen gRPC calls between the plugin and XDM.

It passes every frame through, except for calls to the chosen methods (by
the ``:path`` of the request's HEADERS, read with ``hpack``): once the
request has gone to XDM (it has its END_STREAM), the proxy sends the plugin
``RST_STREAM(INTERNAL_ERROR)`` for that stream and drops what XDM answers on
it. XDM therefore runs the call to its end (and may grant), while the plugin
sees what grpcio reports for a stream reset by the peer: INTERNAL, "Received
RST_STREAM with error code 2". This is what a proxy, a sidecar or XDM's own
HTTP/2 layer does when it gives up on a stream (RFC 9113 §6.4).

Frames are read whole on both sides, so an injected frame never lands in
the middle of another. HPACK state is kept per connection (the client's
header blocks, in order), as the decoder must.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterable

from hpack import Decoder
from hyperframe.frame import ContinuationFrame, DataFrame, Frame, HeadersFrame, RstStreamFrame

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
INTERNAL_ERROR = 0x2


class ResettingProxy:
    """``listen`` -> ``upstream``; calls to ``methods`` (e.g. {"Allocate"}) are reset once sent."""

    def __init__(self, listen: str, upstream: str, methods: Iterable[str] = ()) -> None:
        self.upstream = upstream
        self.methods = set(methods)
        self.reset_paths: list[str] = []  # the calls it reset, in order
        self.lock = threading.Lock()
        self._server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._server.bind(listen)
        self._server.listen(8)
        self._open: list[socket.socket] = [self._server]
        threading.Thread(target=self._accept, name="h2-proxy", daemon=True).start()

    def close(self) -> None:
        for sock in list(self._open):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            try:
                sock.close()
            except OSError:
                pass

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                server.connect(self.upstream)
            except OSError:
                client.close()
                continue
            self._open += [client, server]
            conn = _Connection(self, client, server)
            threading.Thread(target=conn.client_to_server, daemon=True).start()
            threading.Thread(target=conn.server_to_client, daemon=True).start()


class _Connection:
    def __init__(self, proxy: ResettingProxy, client: socket.socket, server: socket.socket) -> None:
        self.proxy = proxy
        self.client = client
        self.server = server
        self.decoder = Decoder()
        self.chosen: set[int] = set()  # streams carrying a chosen call
        self.reset: set[int] = set()  # streams reset towards the client
        self.to_client = threading.Lock()  # one writer of whole frames at a time
        self._block: tuple[int, bytes, bool] | None = None  # a header block awaiting CONTINUATION

    def client_to_server(self) -> None:
        pending, preface = b"", False
        while True:
            data = _recv(self.client)
            if not data:
                return self._close()
            pending += data
            if not preface:
                if len(pending) < len(PREFACE):
                    continue
                self._send(self.server, pending[: len(PREFACE)])
                pending, preface = pending[len(PREFACE) :], True
            for frame, raw in _frames(pending):
                pending = pending[len(raw) :]
                self._send(self.server, raw)
                self._look(frame)

    def server_to_client(self) -> None:
        pending = b""
        while True:
            data = _recv(self.server)
            if not data:
                return self._close()
            pending += data
            for frame, raw in _frames(pending):
                pending = pending[len(raw) :]
                if frame.stream_id in self.reset:
                    continue  # the plugin was told the stream is gone
                with self.to_client:
                    self._send(self.client, raw)

    def _look(self, frame: Frame) -> None:
        """Track the client's request frames: note chosen calls, reset them once fully sent."""
        if isinstance(frame, HeadersFrame):
            self._block = (frame.stream_id, bytes(frame.data), "END_STREAM" in frame.flags)
            if "END_HEADERS" in frame.flags:
                self._headers_done()
        elif isinstance(frame, ContinuationFrame) and self._block is not None:
            stream, block, end = self._block
            self._block = (stream, block + bytes(frame.data), end)
            if "END_HEADERS" in frame.flags:
                self._headers_done()
        elif isinstance(frame, DataFrame) and "END_STREAM" in frame.flags and frame.stream_id in self.chosen:
            self._reset(frame.stream_id)

    def _headers_done(self) -> None:
        assert self._block is not None
        stream, block, end = self._block
        self._block = None
        headers = dict(self.decoder.decode(block))
        path = headers.get(":path", "")
        if path.rsplit("/", 1)[-1] in self.proxy.methods:
            self.chosen.add(stream)
            with self.proxy.lock:
                self.proxy.reset_paths.append(path)
            if end:
                self._reset(stream)

    def _reset(self, stream: int) -> None:
        self.reset.add(stream)
        frame = RstStreamFrame(stream)
        frame.error_code = INTERNAL_ERROR
        with self.to_client:
            self._send(self.client, frame.serialize())

    def _send(self, sock: socket.socket, data: bytes) -> None:
        try:
            sock.sendall(data)
        except OSError:
            self._close()

    def _close(self) -> None:
        for sock in (self.client, self.server):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def _recv(sock: socket.socket) -> bytes:
    try:
        return sock.recv(65536)
    except OSError:
        return b""


def _frames(pending: bytes) -> list[tuple[Frame, bytes]]:
    """The whole frames at the start of ``pending``, each with its raw bytes."""
    out: list[tuple[Frame, bytes]] = []
    offset = 0
    while len(pending) - offset >= 9:
        frame, length = Frame.parse_frame_header(memoryview(pending[offset : offset + 9]))
        if len(pending) - offset < 9 + length:
            break
        frame.parse_body(memoryview(pending[offset + 9 : offset + 9 + length]))
        out.append((frame, pending[offset : offset + 9 + length]))
        offset += 9 + length
    return out
