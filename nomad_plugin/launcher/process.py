"""Launch the plugin the way Nomad's go-plugin client does, and talk to it.

Nomad execs the plugin file with ``NOMAD_PLUGIN_MAGIC_COOKIE`` and
``PLUGIN_PROTOCOL_VERSIONS=2`` in its environment, reads one handshake line
``1|2|unix|<socket>|grpc`` from its stdout, dials the Unix socket and calls
BasePlugin/DevicePlugin over gRPC; hclog JSON lines arrive on stderr. To stop
it, it calls ``GRPCController.Shutdown`` and kills the process if it is still
alive 2 s later (nomad-protocol.md §1, §2.6, §5). :class:`PluginProcess` does
the same, so ``demo``, ``check-job``, ``fingerprint`` and ``doctor`` exercise
the very path a Nomad agent uses.
"""

from __future__ import annotations

import collections
import os
import queue
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Generic, TypeVar

import grpc

from nomad_plugin._proto.goplugin import grpc_controller_pb2, grpc_controller_pb2_grpc
from nomad_plugin._proto.nomad import base_pb2, base_pb2_grpc, device_pb2, device_pb2_grpc
from nomad_plugin.goplugin.handshake import MAGIC_COOKIE_KEY, MAGIC_COOKIE_VALUE
from nomad_plugin.launcher import convert
from nomad_plugin.nomad_view.types import DeviceGroup, InstanceStats, Reservation

T = TypeVar("T")
KILL_GRACE = 2.0  # go-plugin: Shutdown, then SIGKILL after 2 s
STDERR_LINES = 400


class LaunchError(RuntimeError):
    """The plugin did not start, did not hand-shake, or an RPC failed (message says which)."""


@dataclass(frozen=True)
class Handshake:
    core: int
    app: int
    network: str
    address: str
    protocol: str
    seconds: float


@dataclass(frozen=True)
class PluginInfo:
    type: str
    name: str
    version: str
    api_versions: tuple[str, ...]


def parse_handshake(line: str, seconds: float = 0.0) -> Handshake:
    """``CORE|APP|NETWORK|ADDR|PROTOCOL`` -> Handshake; LaunchError names what is wrong."""
    parts = line.strip().split("|")
    if len(parts) < 5:
        raise LaunchError(f"bad handshake line {line.strip()!r}: expected CORE|APP|NETWORK|ADDR|PROTOCOL")
    try:
        core, app = int(parts[0]), int(parts[1])
    except ValueError:
        raise LaunchError(f"bad handshake line {line.strip()!r}: versions are not numbers") from None
    if core != 1:
        raise LaunchError(f"handshake core protocol {core}; Nomad's go-plugin speaks 1")
    if app != 2:
        raise LaunchError(f"handshake app protocol {app}; Nomad offers only 2")
    if parts[4] != "grpc":
        raise LaunchError(f"handshake protocol {parts[4]!r}; Nomad allows only grpc")
    return Handshake(core, app, parts[2], parts[3], parts[4], seconds)


class Stream(Generic[T]):
    """A server stream read by a background thread: every message with its arrival time."""

    def __init__(self, call: Any, convert_message: Callable[[Any], T], name: str) -> None:
        self._call = call
        self._convert = convert_message
        self._cond = threading.Condition()
        self.messages: list[tuple[float, T]] = []
        self.error: str = ""
        self.ended = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            for msg in self._call:
                item = self._convert(msg)
                with self._cond:
                    self.messages.append((time.monotonic(), item))
                    self._cond.notify_all()
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.CANCELLED:
                self.error = f"{exc.code().name}: {exc.details()}"
        finally:
            with self._cond:
                self.ended = True
                self._cond.notify_all()

    def wait_for(self, predicate: Callable[[T], bool], timeout: float, after: int = 0) -> tuple[float, T] | None:
        """The first message from index ``after`` on that satisfies ``predicate``; None on timeout or end."""
        deadline = time.monotonic() + timeout
        index = after
        with self._cond:
            while True:
                while index < len(self.messages):
                    if predicate(self.messages[index][1]):
                        return self.messages[index]
                    index += 1
                left = deadline - time.monotonic()
                if left <= 0 or self.ended:
                    return None
                self._cond.wait(left)

    @property
    def latest(self) -> T | None:
        with self._cond:
            return self.messages[-1][1] if self.messages else None

    def __len__(self) -> int:
        with self._cond:
            return len(self.messages)

    def cancel(self) -> None:
        self._call.cancel()
        self._thread.join(5.0)


class PluginProcess:
    """One plugin process, launched like Nomad launches it. Use as a context manager."""

    def __init__(
        self,
        command: Sequence[str],
        env: dict[str, str] | None = None,
        handshake_timeout: float = 30.0,
        rpc_timeout: float = 30.0,
    ) -> None:
        self.command = list(command)
        self.env = dict(os.environ if env is None else env)
        self.env[MAGIC_COOKIE_KEY] = MAGIC_COOKIE_VALUE
        self.env["PLUGIN_PROTOCOL_VERSIONS"] = "2"
        self.handshake_timeout = handshake_timeout
        self.rpc_timeout = rpc_timeout
        self.proc: subprocess.Popen[bytes] | None = None
        self.handshake: Handshake | None = None
        self.stderr: collections.deque[str] = collections.deque(maxlen=STDERR_LINES)
        self.extra_stdout: list[str] = []
        self._channel: grpc.Channel | None = None
        self._streams: list[Stream[Any]] = []

    # ----------------------------------------------------------------- lifecycle
    def start(self) -> Handshake:
        start = time.monotonic()
        try:
            self.proc = subprocess.Popen(
                self.command, env=self.env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE
            )
        except OSError as exc:
            raise LaunchError(f"cannot execute {self.command[0]}: {exc.strerror or exc}") from None
        lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read_stdout, args=(lines,), name="plugin-stdout", daemon=True).start()
        threading.Thread(target=self._read_stderr, name="plugin-stderr", daemon=True).start()
        try:
            line = lines.get(timeout=self.handshake_timeout)
        except queue.Empty:
            self.kill()
            raise LaunchError(f"no handshake line within {self.handshake_timeout:.0f} s{self._stderr_hint()}") from None
        if line is None:
            code = self.proc.wait(5)
            raise LaunchError(f"plugin exited with status {code} before the handshake{self._stderr_hint()}")
        try:
            self.handshake = parse_handshake(line, time.monotonic() - start)
        except LaunchError:
            self.kill()
            raise
        self._channel = grpc.insecure_channel(f"unix:{self.handshake.address}")
        return self.handshake

    def _read_stdout(self, lines: queue.Queue[str | None]) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        first = True
        for raw in self.proc.stdout:
            text = raw.decode(errors="replace")
            if first:
                lines.put(text)
                first = False
            else:  # go-plugin would log these as "unexpected stdout"; keep them for tests
                self.extra_stdout.append(text)
        if first:
            lines.put(None)

    def _read_stderr(self) -> None:
        assert self.proc is not None and self.proc.stderr is not None
        for raw in self.proc.stderr:
            self.stderr.append(raw.decode(errors="replace").rstrip("\n"))

    def _stderr_hint(self) -> str:
        time.sleep(0.1)
        tail = [line for line in list(self.stderr)[-5:] if line.strip()]
        return ("; plugin stderr: " + " | ".join(tail)) if tail else ""

    def shutdown(self) -> int | None:
        """Nomad's stop: cancel streams, GRPCController.Shutdown, SIGKILL after 2 s; the exit status."""
        for stream in self._streams:
            stream.cancel()
        self._streams.clear()
        if self.proc is None:
            return None
        if self.proc.poll() is None and self._channel is not None:
            try:
                grpc_controller_pb2_grpc.GRPCControllerStub(self._channel).Shutdown(
                    grpc_controller_pb2.Empty(), timeout=KILL_GRACE
                )
            except grpc.RpcError:
                pass
        try:
            code = self.proc.wait(KILL_GRACE)
        except subprocess.TimeoutExpired:
            self.kill()
            code = self.proc.returncode
        if self._channel is not None:
            self._channel.close()
            self._channel = None
        return code

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)

    def __enter__(self) -> PluginProcess:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.shutdown()

    # ----------------------------------------------------------------- RPCs
    @property
    def channel(self) -> grpc.Channel:
        if self._channel is None:
            raise LaunchError("plugin not started")
        return self._channel

    def _rpc(self, what: str, call: Callable[[], T]) -> T:
        try:
            return call()
        except grpc.RpcError as exc:
            raise LaunchError(f"{what} failed: {exc.code().name}: {exc.details()}") from None

    def plugin_info(self) -> PluginInfo:
        stub = base_pb2_grpc.BasePluginStub(self.channel)
        info = self._rpc("PluginInfo", lambda: stub.PluginInfo(base_pb2.PluginInfoRequest(), timeout=self.rpc_timeout))
        kind = base_pb2.PluginType.Name(info.type)
        return PluginInfo(kind, info.name, info.plugin_version, tuple(info.plugin_api_versions))

    def config_schema(self) -> Any:
        stub = base_pb2_grpc.BasePluginStub(self.channel)
        resp = self._rpc(
            "ConfigSchema", lambda: stub.ConfigSchema(base_pb2.ConfigSchemaRequest(), timeout=self.rpc_timeout)
        )
        return resp.spec

    def set_config(self, msgpack_config: bytes, api_version: str = "v0.1.0") -> None:
        """SetConfig; a refusal (bad config) raises LaunchError with the plugin's message."""
        stub = base_pb2_grpc.BasePluginStub(self.channel)
        req = base_pb2.SetConfigRequest(msgpack_config=msgpack_config, plugin_api_version=api_version)
        self._rpc("SetConfig", lambda: stub.SetConfig(req, timeout=self.rpc_timeout))

    def fingerprint(self) -> Stream[list[DeviceGroup]]:
        stub = device_pb2_grpc.DevicePluginStub(self.channel)
        stream: Stream[list[DeviceGroup]] = Stream(
            stub.Fingerprint(device_pb2.FingerprintRequest()), convert.device_groups, "fingerprint"
        )
        self._streams.append(stream)
        return stream

    def stats(self, interval: float = 1.0) -> Stream[list[InstanceStats]]:
        stub = device_pb2_grpc.DevicePluginStub(self.channel)
        req = device_pb2.StatsRequest()
        req.collection_interval.FromNanoseconds(int(interval * 1e9))
        stream: Stream[list[InstanceStats]] = Stream(stub.Stats(req), convert.stats, "stats")
        self._streams.append(stream)
        return stream

    def reserve(self, device_ids: Sequence[str]) -> Reservation:
        stub = device_pb2_grpc.DevicePluginStub(self.channel)
        req = device_pb2.ReserveRequest(device_ids=list(device_ids))
        # Nomad gives Reserve no deadline; a bounded one keeps operator commands from hanging.
        return convert.reservation(self._rpc("Reserve", lambda: stub.Reserve(req, timeout=self.rpc_timeout)))

    def log_lines(self) -> Iterator[str]:
        yield from list(self.stderr)
