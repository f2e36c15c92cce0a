"""Launch the real plugin executable the way go-plugin does, and talk gRPC to it (test helper)."""

from __future__ import annotations

import os
import re
import select
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest

from nomad_plugin.goplugin.handshake import MAGIC_COOKIE_KEY, MAGIC_COOKIE_VALUE

REPO = Path(__file__).resolve().parents[2]
HANDSHAKE = re.compile(r"^1\|2\|unix\|(/[^|]+)\|grpc$")


def plugin_env(**extra: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in (MAGIC_COOKIE_KEY, "PLUGIN_PROTOCOL_VERSIONS")}
    env[MAGIC_COOKIE_KEY] = MAGIC_COOKIE_VALUE
    env["PLUGIN_PROTOCOL_VERSIONS"] = "2"
    env["PLUGIN_MIN_PORT"], env["PLUGIN_MAX_PORT"] = "10000", "25000"
    for key, value in extra.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env


@dataclass
class Plugin:
    proc: subprocess.Popen[bytes]
    line: str
    socket: str
    stderr_lines: list[str] = field(default_factory=list)
    _reader: threading.Thread | None = None
    _channel: grpc.Channel | None = None

    @property
    def socket_dir(self) -> str:
        return os.path.dirname(self.socket)

    def channel(self) -> grpc.Channel:
        if self._channel is None:
            self._channel = grpc.insecure_channel(f"unix:{self.socket}")
            grpc.channel_ready_future(self._channel).result(timeout=10)
        return self._channel

    def wait_exit(self, timeout: float) -> tuple[int, float]:
        """(exit status, seconds it took); kills and fails if it does not exit in time."""
        start = time.monotonic()
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            pytest.fail(f"plugin did not exit within {timeout}s; stderr: {self.stderr_text()[-2000:]}")
        return rc, time.monotonic() - start

    def rest_of_stdout(self) -> bytes:
        assert self.proc.stdout is not None
        return self.proc.stdout.read()

    def stderr_text(self) -> str:
        if self._reader is not None and self.proc.poll() is not None:
            self._reader.join(timeout=5)
        return "".join(self.stderr_lines)

    def close(self) -> None:
        if self._channel is not None:
            self._channel.close()
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()


def launch(env: dict[str, str] | None = None, timeout: float = 20.0) -> Plugin:
    """Start the console script and read its handshake line (fails the test if none comes)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "nomad_plugin"],
        cwd=REPO,
        env=env if env is not None else plugin_env(),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    plugin = Plugin(proc=proc, line="", socket="")
    plugin._reader = threading.Thread(target=_drain, args=(proc.stderr, plugin.stderr_lines), daemon=True)
    plugin._reader.start()
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    if not ready:
        plugin.close()
        pytest.fail(f"no handshake within {timeout}s; stderr: {plugin.stderr_text()[-2000:]}")
    line = proc.stdout.readline().decode()
    match = HANDSHAKE.match(line.rstrip("\n"))
    if match is None:
        plugin.close()
        pytest.fail(f"bad handshake line {line!r}; stderr: {plugin.stderr_text()[-2000:]}")
    plugin.line, plugin.socket = line, match.group(1)
    return plugin


def _drain(stream: object, sink: list[str]) -> None:
    for raw in iter(stream.readline, b""):  # type: ignore[attr-defined]
        sink.append(raw.decode("utf-8", "replace"))
