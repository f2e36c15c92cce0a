"""The plugin launched the way a Nomad client launches it, and talked to over gRPC.

As go-plugin's ``Client.Start`` does (go-plugin/client.go): exec with Nomad's magic cookie and
``PLUGIN_PROTOCOL_VERSIONS=2``, read the handshake line ``CORE|APP|unix|<socket>|grpc``, dial;
stop with ``GRPCController.Shutdown``, SIGKILL 2 s later (``Client.Kill``). :func:`launch` then
calls PluginInfo, ConfigSchema and SetConfig twice (the validate launch sends it too), as Nomad
does; :class:`LiveNode` adds the node to fingerprint, so the operator commands take the agent's path.
"""

from __future__ import annotations

import collections
import json
import os
import queue
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

import grpc

from nomad_plugin import PLUGIN_NAME
from nomad_plugin._proto.goplugin import grpc_controller_pb2, grpc_controller_pb2_grpc
from nomad_plugin._proto.nomad import base_pb2, base_pb2_grpc, device_pb2, device_pb2_grpc
from nomad_plugin.config.options import DEFAULT_SOCKET_DIR
from nomad_plugin.goplugin.handshake import MAGIC_COOKIE_KEY, MAGIC_COOKIE_VALUE
from nomad_plugin.launcher.config import load_config, msgpack_config
from nomad_plugin.nomad_view.types import (
    Attribute,
    Device,
    DeviceGroup,
    InstanceStats,
    Reservation,
    StatValue,
)

T = TypeVar("T")
KILL_GRACE = 2.0
STDERR_LINES = 400
PLUGIN_ENV = "NOMAD_DEVICE_LINGJUN_PLUGIN"
PACKAGE_PARENT = str(Path(__file__).resolve().parents[2])
DP2MGR, CONFIG_DAEMON = "dp2mgr.sock", "config-daemon.sock"


class LaunchError(RuntimeError):
    """The plugin did not start, did not hand-shake, or an RPC failed."""


@dataclass(frozen=True)
class Handshake:
    address: str
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
    return Handshake(parts[3], seconds)


class Stream(Generic[T]):
    """A server stream read by a thread: every message with its arrival time."""

    def __init__(self, call: Any, convert: Callable[[Any], T], name: str) -> None:
        self._call = call
        self._convert = convert
        self._cond = threading.Condition()
        self.messages: list[tuple[float, T]] = []
        self.error = ""
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
        self.extra_stdout: list[str] = []  # go-plugin logs such lines as "unexpected stdout"
        self._channel: grpc.Channel | None = None
        self._streams: list[Stream[Any]] = []
        self._readers: list[threading.Thread] = []

    def start(self) -> Handshake:
        start = time.monotonic()
        try:
            self.proc = subprocess.Popen(
                self.command, env=self.env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE
            )
        except OSError as exc:
            raise LaunchError(f"cannot execute {self.command[0]}: {exc.strerror or exc}") from None
        lines: queue.Queue[str | None] = queue.Queue()
        self._readers = [
            threading.Thread(target=self._read_stdout, args=(lines,), name="plugin-stdout", daemon=True),
            threading.Thread(target=self._read_stderr, name="plugin-stderr", daemon=True),
        ]
        for reader in self._readers:
            reader.start()
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
        first = self.proc.stdout.readline()
        lines.put(first.decode(errors="replace") if first else None)
        for raw in self.proc.stdout:
            self.extra_stdout.append(raw.decode(errors="replace"))

    def _read_stderr(self) -> None:
        assert self.proc is not None and self.proc.stderr is not None
        for raw in self.proc.stderr:
            self.stderr.append(raw.decode(errors="replace").rstrip("\n"))

    def _stderr_hint(self) -> str:
        time.sleep(0.1)
        tail = [line for line in list(self.stderr)[-5:] if line.strip()]
        return ("; plugin stderr: " + " | ".join(tail)) if tail else ""

    def shutdown(self) -> int | None:
        """Nomad's stop: cancel the streams, GRPCController.Shutdown, SIGKILL after 2 s; the exit status."""
        for stream in self._streams:
            stream.cancel()
        self._streams.clear()
        if self.proc is None:
            return None
        if self.proc.poll() is None and self._channel is not None:
            try:
                stub = grpc_controller_pb2_grpc.GRPCControllerStub(self._channel)
                stub.Shutdown(grpc_controller_pb2.Empty(), timeout=KILL_GRACE)
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
        self._close_pipes()
        return code

    def _close_pipes(self) -> None:
        """The pipes closed once their readers reach the end (a dead plugin's pipes end at once)."""
        for reader in self._readers:
            reader.join(KILL_GRACE)
        if self.proc is not None and not any(reader.is_alive() for reader in self._readers):
            for pipe in (self.proc.stdout, self.proc.stderr):
                if pipe is not None:
                    pipe.close()

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)

    def __enter__(self) -> PluginProcess:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

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
        return PluginInfo(
            base_pb2.PluginType.Name(info.type), info.name, info.plugin_version, tuple(info.plugin_api_versions)
        )

    def config_schema(self) -> Any:
        stub = base_pb2_grpc.BasePluginStub(self.channel)
        request = base_pb2.ConfigSchemaRequest()
        return self._rpc("ConfigSchema", lambda: stub.ConfigSchema(request, timeout=self.rpc_timeout)).spec

    def set_config(self, msgpack_config: bytes, api_version: str = "v0.1.0") -> None:
        """SetConfig; a refusal (bad config) raises LaunchError with the plugin's message."""
        stub = base_pb2_grpc.BasePluginStub(self.channel)
        req = base_pb2.SetConfigRequest(msgpack_config=msgpack_config, plugin_api_version=api_version)
        self._rpc("SetConfig", lambda: stub.SetConfig(req, timeout=self.rpc_timeout))

    def fingerprint(self) -> Stream[list[DeviceGroup]]:
        call = device_pb2_grpc.DevicePluginStub(self.channel).Fingerprint(device_pb2.FingerprintRequest())
        stream = Stream(call, device_groups, "fingerprint")
        self._streams.append(stream)
        return stream

    def stats(self, interval: float = 1.0) -> Stream[list[InstanceStats]]:
        req = device_pb2.StatsRequest()
        req.collection_interval.FromNanoseconds(int(interval * 1e9))
        stream = Stream(device_pb2_grpc.DevicePluginStub(self.channel).Stats(req), instance_stats, "stats")
        self._streams.append(stream)
        return stream

    def reserve(self, device_ids: Sequence[str]) -> Reservation:
        stub = device_pb2_grpc.DevicePluginStub(self.channel)
        req = device_pb2.ReserveRequest(device_ids=list(device_ids))
        # Nomad gives Reserve no deadline; a bounded one keeps operator commands from hanging.
        return reservation(self._rpc("Reserve", lambda: stub.Reserve(req, timeout=self.rpc_timeout)))


# -- protobuf -> nomad_view values --------------------------------------------------------
def device_groups(resp: Any) -> list[DeviceGroup]:
    groups = []
    for g in resp.device_group:
        devices = tuple(
            Device(d.ID, d.healthy, d.health_description, d.hw_locality.pci_bus_id if d.HasField("hw_locality") else "")
            for d in g.devices
        )
        attrs = {}
        for key, a in g.attributes.items():
            kind = a.WhichOneof("value")
            attrs[key] = Attribute(getattr(a, kind) if kind else "", a.unit)
        groups.append(DeviceGroup(g.vendor, g.device_type, g.device_name, devices, attrs))
    return groups


def stat_value(msg: Any) -> StatValue:
    """Nomad's rendering priority: bool, string, float, int (Nomad's api/nodes.go, StatValue.String)."""
    for value, denominator in (
        ("bool_val", None),
        ("string_val", None),
        ("float_numerator_val", "float_denominator_val"),
        ("int_numerator_val", "int_denominator_val"),
    ):
        if msg.HasField(value):
            den = getattr(msg, denominator).value if denominator and msg.HasField(denominator) else None
            return StatValue(getattr(msg, value).value, den, msg.unit)
    return StatValue(None, None, msg.unit)


def flatten(obj: Any, prefix: str = "") -> dict[str, StatValue]:
    """A StatObject -> ``{"xdm.SM clock": value, ...}`` (nested names joined with ``.``)."""
    out = {f"{prefix}{key}": stat_value(v) for key, v in obj.attributes.items()}
    for name, nested in obj.nested.items():
        out.update(flatten(nested, f"{prefix}{name}."))
    return out


def instance_stats(resp: Any) -> list[InstanceStats]:
    out = []
    for g in resp.groups:
        for device_id, ds in sorted(g.instance_stats.items()):
            out.append(
                InstanceStats(
                    f"{g.vendor}/{g.type}/{g.name}",
                    device_id,
                    stat_value(ds.summary) if ds.HasField("summary") else None,
                    flatten(ds.stats) if ds.HasField("stats") else {},
                    ds.timestamp.seconds + ds.timestamp.nanos / 1e9 if ds.HasField("timestamp") else 0.0,
                )
            )
    return out


def reservation(resp: Any) -> Reservation:
    res = resp.container_res
    return Reservation(
        envs=dict(res.envs),
        mounts=tuple((m.task_path, m.host_path, m.read_only) for m in res.mounts),
        devices=tuple((d.task_path, d.host_path, d.permissions) for d in res.devices),
    )


# -- the launch sequence -------------------------------------------------------------------


def plugin_command(explicit: str | None = None) -> list[str]:
    """``--plugin`` or ``$NOMAD_DEVICE_LINGJUN_PLUGIN``, else this file when it is the plugin (what runs
    is what Nomad runs), else ``<this interpreter> -m nomad_plugin``; no arguments, as Nomad passes none."""
    chosen = explicit or os.environ.get(PLUGIN_ENV)
    if chosen:
        return [str(Path(chosen).absolute())]
    own = Path(sys.argv[0])
    if own.name.startswith(PLUGIN_NAME) and own.is_file() and os.access(own, os.X_OK):
        return [str(own.absolute())]
    return [sys.executable, "-m", "nomad_plugin"]


def plugin_env(command: list[str]) -> dict[str, str]:
    env = dict(os.environ)
    if command[1:2] == ["-m"]:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (PACKAGE_PARENT, env.get("PYTHONPATH", "")) if p)
    return env


@dataclass
class Session:
    plugin: PluginProcess
    info: PluginInfo
    fingerprints: Stream[list[DeviceGroup]]
    timings: dict[str, float] = field(default_factory=dict)


def launch(config: dict[str, Any], plugin: str | None = None) -> Session:
    """Start the plugin and bring it to the fingerprinting state; LaunchError on any failure."""
    command = plugin_command(plugin)
    proc = PluginProcess(command, env=plugin_env(command))
    t0 = time.monotonic()
    shake = proc.start()
    try:
        info = proc.plugin_info()
        if info.type != "DEVICE" or info.name != PLUGIN_NAME:
            raise LaunchError(f"PluginInfo says {info.type} plugin {info.name!r}; expected DEVICE {PLUGIN_NAME!r}")
        proc.config_schema()
        data = msgpack_config(config)
        for _ in range(2):  # the validate launch and the long-lived one both send it
            proc.set_config(data, info.api_versions[0] if info.api_versions else "v0.1.0")
        t1 = time.monotonic()
        stream = proc.fingerprint()
    except BaseException:
        proc.shutdown()
        raise
    return Session(proc, info, stream, {"handshake": shake.seconds, "set_config": t1 - t0})


def log_text(line: str) -> str:
    """A plugin log line as a person reads it: hclog's JSON reduced to level and message."""
    try:
        entry = json.loads(line)
    except ValueError:
        return line.strip()
    if not isinstance(entry, dict) or "@message" not in entry:
        return line.strip()
    return f"{entry.get('@level', 'info')}: {entry['@message']}"


def wait_for_devices(session: Session, timeout: float) -> list[DeviceGroup]:
    """The first fingerprint holding devices (the first may be empty: the backend starts lazily)."""
    t0 = time.monotonic()
    hit = session.fingerprints.wait_for(lambda groups: any(g.devices for g in groups), timeout)
    if hit is None:
        tail = [log_text(line) for line in list(session.plugin.stderr)[-4:] if line.strip()]
        why = session.fingerprints.error or f"no devices fingerprinted within {timeout:.0f} s"
        raise LaunchError(why + ("; plugin log: " + " | ".join(tail) if tail else ""))
    session.timings["first_devices"] = hit[0] - t0
    return hit[1]


def socket_overrides(socket_dir: str | Path) -> list[str]:
    return [f'xdm_socket="{Path(socket_dir) / DP2MGR}"', f'config_socket="{Path(socket_dir) / CONFIG_DAEMON}"']


def preflight(config: dict[str, Any]) -> None:
    """Fail at once when the plugin would use XDM and its socket cannot be dialled, rather than wait for
    devices that cannot come; a config the plugin refuses is left to its SetConfig's own words."""
    from nomad_plugin.backend_select import accept_config, choose_backend_name
    from nomad_plugin.config.model import ConfigError
    from nomad_plugin.nvml.lib import nvml_available
    from nomad_plugin.xdm.client import socket_problem

    try:
        plugin_config = accept_config(msgpack_config(config))
    except ConfigError:
        return
    if not plugin_config.enabled or choose_backend_name(plugin_config, nvml_available) != "xdm":
        return
    problem = socket_problem(plugin_config.xdm_socket)
    if problem is not None:
        raise LaunchError(f"{problem}{'' if plugin_config.backend == 'xdm' else ' and NVML is not usable here'}")


@dataclass
class LiveNode:
    """The node a dry run looks at: the config Nomad would send, an embedded simulator (``profile``) or
    socket directory, and with ``launch_plugin`` the real plugin on it. It never touches the live
    plugin's journal, Nomad or metrics port (``config`` keeps the node_meta asked for: check-job reads it)."""

    plugin_config: str | None = None
    overrides: list[str] = field(default_factory=list)
    profile: str | None = None
    socket_dir: str | None = None
    plugin: str | None = None
    sim_options: dict[str, Any] = field(default_factory=dict)
    device_timeout: float = 20.0
    launch_plugin: bool = True
    session: Session | None = None
    sim: Any = None
    tmp: Path | None = None
    config: dict[str, Any] = field(default_factory=dict)

    @property
    def source(self) -> str:
        if self.profile:
            return f"embedded simulator, profile {self.profile}"
        if self.socket_dir:
            return f"XDM sockets in {self.socket_dir}"
        where = self.plugin_config or "the default config"
        backend = str(self.config.get("backend", "auto"))
        socket = str(self.config.get("xdm_socket") or Path(DEFAULT_SOCKET_DIR) / DP2MGR)
        if backend == "nvml":
            return f"NVML (backend = nvml from {where})"
        if backend == "auto" and self.config and not Path(socket).exists():
            return f"NVML (backend = auto from {where}: no XDM socket at {socket})"
        return f"XDM socket {socket} (backend = {backend} from {where})"

    def __enter__(self) -> LiveNode:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def start(self) -> None:
        self.tmp = Path(tempfile.mkdtemp(prefix="ndl-", dir="/tmp"))  # short: a Unix socket path is < 108 bytes
        extra: list[str] = []
        if self.profile:
            from nomad_plugin.sim import Simulator

            self.sim = Simulator(self.tmp / "s", self.profile, **self.sim_options).start()
            # nvml_enrich=false: a simulated card must not pick up this host's GPUs
            extra += [*socket_overrides(self.tmp / "s"), 'backend="xdm"', "nvml_enrich=false"]
        elif self.socket_dir:
            extra += [*socket_overrides(self.socket_dir), 'backend="xdm"']
        extra += [f'data_dir="{self.tmp / "data"}"', "reconcile=false", "metrics_port=0"]
        self.config = load_config(self.plugin_config, [*extra, *self.overrides])
        if not self.launch_plugin:
            return
        if not self.profile:
            preflight(self.config)
        self.session = launch({**self.config, "node_meta": False}, plugin=self.plugin)

    def devices(self) -> list[DeviceGroup]:
        assert self.session is not None
        return wait_for_devices(self.session, self.device_timeout)

    def close(self) -> int | None:
        code = self.session.plugin.shutdown() if self.session is not None else None
        self.session = None
        if self.sim is not None:
            self.sim.stop()
            self.sim = None
        if self.tmp is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)
            self.tmp = None
        return code

    def __exit__(self, *exc: object) -> None:
        self.close()
