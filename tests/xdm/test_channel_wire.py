"""What the plugin's XDM channel says on the wire, read frame by frame between it and XDM.

gRPC's client by default measures the link's bandwidth-delay product with a PING after data
arrives, and grows its receive window from the answers. On a local Unix socket that measures
nothing and wakes both processes for every exporter push. The channel announces a window that
holds any message a real node sends (gRPC's default 4 MiB) up front and never probes.

A proxy on a Unix socket passes the bytes through unchanged and parses the client's side with
``hyperframe``.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hyperframe.frame import Frame, PingFrame, SettingsFrame

from nomad_plugin.config.model import PluginConfig
from nomad_plugin.xdm.client import XdmClient
from tests.doubles.fake_xdm import FakeXdm, default_devices

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
FOUR_MIB = 4 << 20


class FrameTap:
    """A Unix-socket proxy that records the HTTP/2 frames the client sends."""

    def __init__(self, listen: str, upstream: str) -> None:
        self.upstream = upstream
        self.frames: list[Frame] = []
        self.lock = threading.Lock()
        self._server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._server.bind(listen)
        self._server.listen(4)
        self._open: list[socket.socket] = [self._server]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            server.connect(self.upstream)
            self._open += [client, server]
            threading.Thread(target=self._pump, args=(client, server, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, False), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, parse: bool) -> None:
        pending = b""
        preface_seen = not parse
        while True:
            try:
                data = src.recv(65536)
            except OSError:
                data = b""
            if not data:
                for sock in (src, dst):
                    try:
                        sock.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass
                return
            try:
                dst.sendall(data)
            except OSError:
                return
            if not parse:
                continue
            pending += data
            if not preface_seen:
                if len(pending) < len(PREFACE):
                    continue
                assert pending.startswith(PREFACE), pending[:24]
                pending = pending[len(PREFACE) :]
                preface_seen = True
            while len(pending) >= 9:
                frame, length = Frame.parse_frame_header(memoryview(pending[:9]))
                if len(pending) < 9 + length:
                    break
                frame.parse_body(memoryview(pending[9 : 9 + length]))
                pending = pending[9 + length :]
                with self.lock:
                    self.frames.append(frame)

    def sent(self, kind: type[Frame]) -> list[Frame]:
        with self.lock:
            return [f for f in self.frames if isinstance(f, kind)]

    def close(self) -> None:
        for sock in self._open:
            try:
                sock.close()
            except OSError:
                pass


@pytest.fixture
def tapped(sockdir: Path, make_fake: Callable[..., FakeXdm]) -> Iterator[tuple[XdmClient, FrameTap]]:
    make_fake(devices=default_devices(8))
    tap = FrameTap(str(sockdir / "tap.sock"), str(sockdir / "dp2mgr.sock"))
    client = XdmClient(
        PluginConfig(
            xdm_socket=str(sockdir / "tap.sock"),
            config_socket=str(sockdir / "config-daemon.sock"),
            xdm_call_timeout=2.0,
        )
    )
    yield client, tap
    client.close()
    tap.close()
    os.unlink(sockdir / "tap.sock")


def test_the_exporter_stream_is_read_without_bandwidth_probes_in_one_large_window(
    tapped: tuple[XdmClient, FrameTap],
) -> None:
    client, tap = tapped
    subscription = client.exporter_data_stream()
    received = 0
    deadline = time.monotonic() + 30
    for batch in subscription:
        assert batch, "every push of the fake carries samples"
        received += 1
        if received >= 40 or time.monotonic() > deadline:
            break
    subscription.cancel()
    assert received >= 40, f"only {received} pushes arrived within 30 s"

    settings = [f for f in tap.sent(SettingsFrame) if "ACK" not in f.flags]
    assert settings, "the client sent no SETTINGS frame"
    window = settings[0].settings.get(SettingsFrame.INITIAL_WINDOW_SIZE)
    assert window is not None and window >= FOUR_MIB, f"initial window {window}, want >= {FOUR_MIB}"
    probes = [f for f in tap.sent(PingFrame) if "ACK" not in f.flags]
    assert not probes, f"the client pinged XDM {len(probes)} times over {received} pushes"
