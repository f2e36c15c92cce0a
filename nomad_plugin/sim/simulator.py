"""The simulator's public face: :class:`Simulator` (lifecycle, faults, control)."""

from __future__ import annotations

import json
import math
import os
import queue
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from pathlib import Path
from types import TracebackType
from typing import Any

import grpc
from google.protobuf.message import Message

from nomad_plugin._proto.lingjun import api_outer_pb2 as pb
from nomad_plugin._proto.lingjun import config_service_pb2 as cfg
from nomad_plugin.goplugin.logging import get_logger
from nomad_plugin.sim import schema as drift_mod
from nomad_plugin.sim.allocation import GrantRecord, Refusal
from nomad_plugin.sim.core import (
    CLOSE,
    DUPLICATE_ID_MODES,
    ERROR_MODES,
    RELEASE_UNKNOWN_MODES,
    SimCore,
    SimOptions,
    check_choice,
)
from nomad_plugin.sim.profiles import NVML_PROFILE, CardSpec, build_cards, check_invariants, resolve_profile
from nomad_plugin.sim.schema import SCHEMAS, ServedSchema, parse_drift, served_schema

log = get_logger("sim")

DP2MGR_SOCKET = "dp2mgr.sock"
CONFIG_SOCKET = "config-daemon.sock"
CONTROL_SOCKET = "xdm-sim-control.sock"
RPC_NAMES = (
    "ListSupportedXPUType", "ListAndWatch", "Allocate", "Release", "ListGpuInfo", "ExporterGetDataList",
    "ExporterDataStream", "ExporterGetConfig", "ExporterGetStatus", "Enable", "Disable", "QueryStatus",
)  # fmt: skip


class Simulator:
    """A simulated XDM node serving ``dp2mgr.sock`` and ``config-daemon.sock`` in ``socket_dir``.

    Options are :class:`~nomad_plugin.sim.core.SimOptions` fields. Use as a
    context manager or call :meth:`start` / :meth:`stop`.
    """

    def __init__(
        self, socket_dir: Path | str, profile: str = "h800-8", state_file: Path | str | None = None, **options: Any
    ) -> None:
        self.socket_dir = Path(socket_dir)
        self.options = SimOptions.from_kwargs(options)
        self.profile = profile
        cards, reader = self._load_cards(profile)
        if self.options.topology_variant == "normal":
            problems = check_invariants({c.minor: json.loads(c.topology_json) for c in cards})
            if problems:
                raise ValueError(f"profile {profile}: topology self-check failed: {problems[0]}")
        self.cards: list[CardSpec] = cards
        self.state_file = Path(state_file) if state_file is not None else None
        self.core = SimCore(profile, cards, self.options, self.state_file, reader)
        self.dp2mgr_path = self.socket_dir / DP2MGR_SOCKET
        self.config_path = self.socket_dir / CONFIG_SOCKET
        self.control_path = self.socket_dir / CONTROL_SOCKET
        self._servers = XdmServers(
            self.core, self.dp2mgr_path, self.config_path, self.options.schema, self.options.reflection
        )
        self._lifecycle = threading.RLock()
        self._collector_stop = threading.Event()
        self._collector: threading.Thread | None = None
        self._control: Any = None
        self.crashed = False

    def _load_cards(self, profile: str) -> tuple[list[CardSpec], Any]:
        if profile == NVML_PROFILE or self.options.nvml_mirror:
            from nomad_plugin.sim import nvml_mirror

            cards, handles = nvml_mirror.load_cards(self.options.topology_variant)
            self.profile = NVML_PROFILE
            return cards, nvml_mirror.make_reader(handles)
        spec = resolve_profile(profile)
        self.profile = spec.name
        return build_cards(spec, self.options.topology_variant), None

    # ------------------------------------------------------------ lifecycle
    def start(self) -> Simulator:
        with self._lifecycle:
            self._servers.start()
            self.crashed = False
            if self._collector is None:
                self._collector_stop.clear()
                self._collector = threading.Thread(target=self._collect_loop, name="xdm-sim-collector", daemon=True)
                self._collector.start()
            if self.options.control and self._control is None:
                self._start_control()
        log.info(
            "xdm-sim %s: %d cards on %s (%s)",
            self.profile, len(self.cards), self.socket_dir, ", ".join(f"{c.minor}:{c.model}" for c in self.cards[:1]),
        )  # fmt: skip
        return self

    def _start_control(self) -> None:
        from nomad_plugin.sim.control import ControlServer

        self._control = ControlServer(self, self.control_path)
        self._control.start()

    def stop(self) -> None:
        with self._lifecycle:
            if self._control is not None:
                self._control.stop()
                self._control = None
            self._collector_stop.set()
            if self._collector is not None:
                self._collector.join(5.0)
                self._collector = None
            self._servers.stop()
            for path in (self.dp2mgr_path, self.config_path):
                if path.exists():
                    path.unlink()  # also a crash's stale files

    def __enter__(self) -> Simulator:
        return self.start()

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.stop()

    def _collect_loop(self) -> None:
        interval = self.options.collect_interval_ms / 1000.0
        while not self._collector_stop.wait(interval):
            try:
                self.core.collect()
            except Exception:  # never let the collector die silently
                log.exception("metrics collection failed")

    # ------------------------------------------------------------ faults
    def restart(
        self,
        downtime: float = 0.5,
        remove_dir: bool = False,
        schema: str | None = None,
        reflection: bool | None = None,
    ) -> None:
        """Stop both servers (streams end UNAVAILABLE), unlink the sockets, wait, re-bind.

        Grants survive: read back from the state file, or kept in memory.
        ``remove_dir`` also removes the socket directory during the downtime
        (only when nothing but the simulator's own sockets is in it).
        ``schema`` / ``reflection``: come back serving another schema (an
        upgraded XDM), with or without server reflection.
        """
        if schema is not None:
            check_choice("schema", schema, SCHEMAS)
        with self._lifecycle:
            log.info("restart: down for %.2fs", downtime)
            self._servers.stop()
            if schema is not None:
                self.options.schema = schema
                self._servers.set_schema(schema)
            if reflection is not None:
                self.set_reflection(reflection)
            control_was_up = self._control is not None
            if remove_dir:
                self._remove_socket_dir()
            time.sleep(downtime)
            self.core.reload()
            self._servers.start()
            self.crashed = False
            if remove_dir and control_was_up and self._control is None:
                self._start_control()
            log.info("restart: serving again (schema %s, reflection %s)", self.options.schema, self._reflection_word())

    def _remove_socket_dir(self) -> None:
        if self._control is not None:
            self._control.stop()
            self._control = None
        leftovers = [p.name for p in self.socket_dir.iterdir()] if self.socket_dir.exists() else []
        if leftovers:
            raise RuntimeError(f"restart(remove_dir=True): {self.socket_dir} still holds {leftovers}")
        if self.socket_dir.exists():
            self.socket_dir.rmdir()

    def crash(self) -> None:
        """Stop serving and leave stale socket files behind (connects get ECONNREFUSED)."""
        with self._lifecycle:
            self._servers.stop(grace=0.0)
            make_stale_socket(self.dp2mgr_path)
            make_stale_socket(self.config_path)
            self.crashed = True
            log.info("crash: sockets left stale")

    def revive(self) -> None:
        """Come back after :meth:`crash` (grants read back as after a restart)."""
        with self._lifecycle:
            if self._servers.running:
                return
            self.core.reload()
            self._servers.start()
            self.crashed = False
            log.info("revive: serving again")

    def slow_start(self, seconds: float) -> None:
        """Every RPC hangs for ``seconds`` from now (starting the servers if they are down)."""
        with self.core.lock:
            self.core.hang_until = time.monotonic() + seconds
        if not self._servers.running:
            self.revive()

    def set_health(self, minor: int, healthy: bool, reason: str = "") -> None:
        self.core.set_health(minor, healthy, reason)

    def remove_device(self, minor: int) -> None:
        self.core.remove_device(minor)

    def add_device(self, minor: int) -> None:
        self.core.add_device(minor)

    def set_latency(self, rpc: str, seconds: float) -> None:
        """Delay every call of ``rpc`` ("*" = all) by ``seconds``; ``math.inf`` hangs; 0 clears."""
        if rpc != "*" and rpc not in RPC_NAMES:
            raise ValueError(f"rpc: unknown RPC {rpc!r} (known: *, {', '.join(RPC_NAMES)})")
        if seconds < 0 or math.isnan(seconds):
            raise ValueError(f"seconds: {seconds} must be >= 0")
        with self.core.lock:
            if seconds == 0:
                self.core.latency.pop(rpc, None)
            else:
                self.core.latency[rpc] = seconds

    @property
    def schema(self) -> ServedSchema:
        """The schema served now (descriptors, pool, ``emit``)."""
        return self._servers.schema

    def set_reflection(self, on: bool) -> None:
        """Serve gRPC server reflection (the served schema's descriptors) from the next call on."""
        self.options.reflection = on
        self._servers.reflection = on
        log.info("reflection: %s", self._reflection_word())

    def _reflection_word(self) -> str:
        return "on" if self.options.reflection else "off"

    def set_drift(self, mode: str | None) -> None:
        drift = parse_drift(mode)
        with self.core.lock:
            self.core.drift = drift
        log.info("drift: %s", drift.describe())

    def set_error_mode(self, mode: str) -> None:
        check_choice("error_mode", mode, ERROR_MODES)
        self.options.error_mode = mode

    def set_enabled(self, enabled: bool) -> None:
        self.core.set_enabled(enabled)

    def set_topology_level(self, name: str, value: str | None, minors: list[int] | None = None) -> None:
        """Set a string topology level (``leafSwitch``, ``pointOfDelivery``, ...) on cards, or remove it."""
        self.core.set_topology_level(name, value, minors)
        self.cards = [self.core.cards[c.minor] for c in self.cards]

    def calls(self) -> dict[str, int]:
        """How many times each RPC was called (streams count once per subscription)."""
        with self.core.lock:
            return dict(self.core.calls)

    def set_duplicate_id_mode(self, mode: str) -> None:
        check_choice("duplicate_id_mode", mode, DUPLICATE_ID_MODES)
        self.options.duplicate_id_mode = mode

    def set_release_unknown(self, mode: str) -> None:
        check_choice("release_unknown", mode, RELEASE_UNKNOWN_MODES)
        self.options.release_unknown = mode

    def set_exporter_state(self, state: str) -> None:
        """ExporterGetStatus reports ``running``, ``stopped`` or ``error`` (not running: no collections)."""
        self.core.set_exporter_state(state)

    def set_config_failure(self, fail: bool) -> None:
        """Enable/Disable answer ``success: false`` while set."""
        self.core.config_fail = fail

    def grants(self) -> dict[str, GrantRecord]:
        return self.core.grants()

    def close_streams(self) -> None:
        """End every open ListAndWatch / ExporterDataStream with UNAVAILABLE."""
        self._servers.close_streams()

    def status(self) -> dict[str, Any]:
        """A summary for the control channel and logs."""
        with self.core.lock:
            return {
                "profile": self.profile,
                "socket_dir": str(self.socket_dir),
                "serving": self._servers.running,
                "crashed": self.crashed,
                "enabled": self.core.state.enabled,
                "drift": self.core.drift.describe(),
                "schema": self.options.schema,
                "reflection": self.options.reflection,
                "services": self._servers.schema.service_names(),
                "error_mode": self.options.error_mode,
                "exporter": self.core.exporter_state,
                "latency": dict(self.core.latency),
                "cards": [
                    {
                        "minor": c.minor,
                        "uuid": c.uuid,
                        "model": c.model,
                        "present": c.minor in self.core.present,
                        "healthy": self.core.health[c.minor][0],
                        "reason": self.core.health[c.minor][1],
                    }
                    for c in self.cards
                ],
                "grants": len(self.core.state.grants),
                "calls": dict(self.core.calls),
                "subscribers": self.core.subscriber_count(),
            }


# ------------------------------------------------------------ (from server.py)
# gRPC plumbing: the two Unix-socket servers in front of :class:`SimCore`.
#
# Methods are looked up per call by a generic handler, so schema-drift modes
# (another package name, the exporter RPCs in a second service), reflection
# on/off and custom serialisation take effect immediately, even on a running
# server. Every call first passes the fault gate (slow start, per-RPC latency or
# hang). The served schema (:mod:`nomad_plugin.sim.schema`) is applied at this
# edge only: requests are decoded with the served classes and copied into the
# builtin ones, responses the other way, so :class:`SimCore` never changes.


log = get_logger("sim")

DP2MGR_SERVICE = "XpuDeviceManagerService"
EXPORTER_SERVICE = "XpuExporterService"
REFLECTION_SERVICE = "grpc.reflection.v1alpha.ServerReflection"
REFLECTION_PATHS = (
    f"/{REFLECTION_SERVICE}/ServerReflectionInfo",
    "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",  # same wire format as v1alpha
)
EXPORTER_RPCS = ("ListGpuInfo", "ExporterGetDataList", "ExporterDataStream", "ExporterGetConfig", "ExporterGetStatus")
_CANCELLED = object()
MAX_WORKERS = 256  # every open stream holds one worker thread (created lazily)

Unary = Callable[[Any, grpc.ServicerContext], Message]
Streaming = Callable[[Any, grpc.ServicerContext], Iterator[Message]]


class _Dispatch(grpc.GenericRpcHandler):  # type: ignore[type-arg]
    def __init__(self, table: Callable[[], dict[str, grpc.RpcMethodHandler[Any, Any]]]) -> None:
        self._table = table

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler[Any, Any] | None:
        method: str = handler_call_details.method
        return self._table().get(method)


class XdmServers:
    """Both sockets' servers; ``start``/``stop`` may be called repeatedly (restarts)."""

    def __init__(
        self, core: SimCore, dp2mgr_path: Path, config_path: Path, schema: str = "builtin", reflection: bool = False
    ) -> None:
        self.core = core
        self.dp2mgr_path = dp2mgr_path
        self.config_path = config_path
        self.schema: ServedSchema = served_schema(schema)
        self.reflection = reflection
        self._reflectors: dict[tuple[str, str], grpc.RpcMethodHandler[Any, Any]] = {}
        self._servers: list[grpc.Server] = []
        self._stopping = threading.Event()
        self.stream_epoch = 0

    # ------------------------------------------------------------ lifecycle
    def start(self) -> None:
        self._stopping.clear()
        for path, table in ((self.dp2mgr_path, self._dp2mgr_table), (self.config_path, self._config_table)):
            path.parent.mkdir(parents=True, exist_ok=True)
            if path.exists() or path.is_symlink():
                path.unlink()  # a stale socket from a crash
            server = grpc.server(
                futures.ThreadPoolExecutor(max_workers=MAX_WORKERS, thread_name_prefix="xdm-sim"),
                handlers=[_Dispatch(table)],
                maximum_concurrent_rpcs=None,
            )
            server.add_insecure_port(f"unix:{path}")
            server.start()
            self._servers.append(server)

    def stop(self, grace: float = 0.1) -> None:
        """End streams with UNAVAILABLE, stop serving, remove the socket files."""
        self.close_streams()
        self._stopping.set()
        servers, self._servers = self._servers, []
        events = [s.stop(grace) for s in servers]
        for event in events:
            event.wait(5.0)
        for path in (self.dp2mgr_path, self.config_path):
            if path.exists():
                path.unlink()

    @property
    def running(self) -> bool:
        return bool(self._servers)

    def close_streams(self) -> None:
        with self.core.lock:
            self.stream_epoch += 1
        self.core.close_streams()

    def set_schema(self, name: str) -> None:
        """Serve ``name`` from the next call on (use between stop and start for a realistic restart)."""
        self.schema = served_schema(name)

    # ------------------------------------------------------------ method tables
    def _service(self, short: str) -> str:
        """Fully-qualified dp2mgr service name: the schema's package unless drift overrides it."""
        drift = self.core.drift
        if drift.package != drift_mod.DEFAULT_PACKAGE:
            return drift.service(short)
        return f"{self.schema.device_package}.{short}"

    def _reflector(self, services: tuple[str, ...]) -> grpc.RpcMethodHandler[Any, Any]:
        """A ServerReflectionInfo handler answering from the served schema's own descriptor pool."""
        key = (self.schema.name, ",".join(services))
        handler = self._reflectors.get(key)
        if handler is None:
            from grpc_reflection.v1alpha import reflection, reflection_pb2

            servicer = reflection.ReflectionServicer([*services, REFLECTION_SERVICE], pool=self.schema.pool)
            handler = grpc.stream_stream_rpc_method_handler(
                servicer.ServerReflectionInfo,
                request_deserializer=reflection_pb2.ServerReflectionRequest.FromString,
                response_serializer=reflection_pb2.ServerReflectionResponse.SerializeToString,
            )
            self._reflectors[key] = handler
        return handler

    def _add_reflection(self, table: dict[str, grpc.RpcMethodHandler[Any, Any]]) -> None:
        if self.reflection:
            services = tuple(sorted({path.split("/")[1] for path in table}))
            handler = self._reflector(services)
            for path in REFLECTION_PATHS:
                table[path] = handler

    def _dp2mgr_table(self) -> dict[str, grpc.RpcMethodHandler[Any, Any]]:
        drift = self.core.drift
        main = self._service(DP2MGR_SERVICE)
        exporter = self._service(EXPORTER_SERVICE) if drift.split_services else main
        core = self.core
        schema = self.schema
        unary: dict[str, tuple[type[Message], Callable[[Any], Message]]] = {
            "ListSupportedXPUType": (pb.XPUTypeRequest, core.list_xpu_types),
            "Allocate": (pb.AllocateRequest, core.allocate),
            "Release": (pb.ReleaseRequest, core.release),
            "ListGpuInfo": (pb.ListGpuInfoRequest, core.gpu_info),
            "ExporterGetDataList": (pb.ExporterDataRequest, core.data_list),
            "ExporterGetConfig": (pb.ExporterGetConfigRequest, core.exporter_config),
            "ExporterGetStatus": (pb.ExporterGetStatusRequest, core.exporter_status),
        }
        responses: dict[str, type[Message]] = {
            "ListSupportedXPUType": pb.XPUTypeResponse,
            "Allocate": pb.AllocateResponse,
            "Release": pb.ReleaseResponse,
            "ListGpuInfo": pb.ListGpuInfoResponse,
            "ExporterGetDataList": pb.ExporterDataResponse,
            "ExporterGetConfig": pb.ExporterGetConfigResponse,
            "ExporterGetStatus": pb.ExporterGetStatusResponse,
        }
        table: dict[str, grpc.RpcMethodHandler[Any, Any]] = {}
        for name, (req_cls, fn) in unary.items():
            service = exporter if name in EXPORTER_RPCS else main
            table[f"/{service}/{name}"] = grpc.unary_unary_rpc_method_handler(
                self._unary(name, fn, responses[name]),
                request_deserializer=schema.decoder(req_cls),
                response_serializer=self._serialize,
            )
        table[f"/{main}/ListAndWatch"] = grpc.unary_stream_rpc_method_handler(
            self._list_and_watch, request_deserializer=schema.decoder(pb.ListAndWatchRequest),
            response_serializer=self._serialize,
        )  # fmt: skip
        table[f"/{exporter}/ExporterDataStream"] = grpc.unary_stream_rpc_method_handler(
            self._data_stream, request_deserializer=schema.decoder(pb.ExporterDataRequest),
            response_serializer=self._serialize,
        )  # fmt: skip
        self._add_reflection(table)
        return table

    def _config_table(self) -> dict[str, grpc.RpcMethodHandler[Any, Any]]:
        core = self.core
        rpcs: dict[str, tuple[type[Message], type[Message], Callable[[Any], Message]]] = {
            "Enable": (cfg.EnableRequest, cfg.EnableResponse, core.enable),
            "Disable": (cfg.DisableRequest, cfg.DisableResponse, core.disable),
            "QueryStatus": (cfg.QueryStatusRequest, cfg.QueryStatusResponse, core.query_status),
        }
        schema = self.schema
        table = {
            f"/{schema.config_service}/{name}": grpc.unary_unary_rpc_method_handler(
                self._unary(name, fn, resp_cls),
                request_deserializer=schema.decoder(req_cls),
                response_serializer=self._serialize,
            )
            for name, (req_cls, resp_cls, fn) in rpcs.items()
        }
        self._add_reflection(table)
        return table

    def _serialize(self, msg: Message) -> bytes:
        return drift_mod.apply(self.schema.to_served(msg), self.core.drift)

    # ------------------------------------------------------------ fault gate
    def _gate(self, rpc: str, context: grpc.ServicerContext) -> None:
        """Hold the call during slow start and injected latency (inf = hang until the client gives up)."""
        self.core.count_call(rpc)
        with self.core.lock:
            delay = self.core.latency.get(rpc, self.core.latency.get("*", 0.0))
            hang_until = self.core.hang_until
        now = time.monotonic()
        until = max(hang_until, now + delay) if not math.isinf(delay) else math.inf
        while time.monotonic() < until:
            if self._stopping.is_set():
                context.abort(grpc.StatusCode.UNAVAILABLE, "xdm-sim: service stopping")
            if not context.is_active():
                context.abort(grpc.StatusCode.CANCELLED, "client went away")
            self._stopping.wait(min(0.05, max(0.0, until - time.monotonic())))

    def _unary(self, rpc: str, fn: Callable[[Any], Message], resp_cls: type[Message]) -> Unary:
        def handler(request: Any, context: grpc.ServicerContext) -> Message:
            self._gate(rpc, context)
            try:
                response = fn(request)
            except Refusal as why:
                code = grpc.StatusCode[why.code]
                log.info("%s %s -> refused %s: %s", rpc, _summary(request), why.code, why.message)
                if self.core.options.error_mode == "grpc":
                    context.abort(code, why.message)
                return resp_cls(status=code.value[0], message=why.message)
            log.info("%s %s -> ok%s", rpc, _summary(request), _outcome(response))
            return response

        return handler

    # ------------------------------------------------------------ streams
    def _list_and_watch(self, request: pb.ListAndWatchRequest, context: grpc.ServicerContext) -> Iterator[Message]:
        self._gate("ListAndWatch", context)
        core = self.core
        q = core.subscribe()
        context.add_callback(lambda: q.put(_CANCELLED))
        log.info("ListAndWatch subscribed (%d subscribers)", core.subscriber_count())
        try:
            last_sent = time.monotonic()
            if core.options.initial_push:
                yield core.device_list()
            while True:
                repush = core.options.repush_interval
                try:
                    item = q.get(timeout=min(repush, 0.5) if repush > 0 else 0.5)
                except queue.Empty:
                    if not context.is_active():
                        return
                    if repush > 0 and time.monotonic() - last_sent >= repush:
                        last_sent = time.monotonic()
                        yield core.device_list()
                    continue
                if item is _CANCELLED:
                    return
                if item is CLOSE:
                    context.abort(grpc.StatusCode.UNAVAILABLE, "xdm-sim: stream closed (service restart or stop)")
                last_sent = time.monotonic()
                assert isinstance(item, Message)
                yield item
        finally:
            core.unsubscribe(q)
            log.info("ListAndWatch stream ended")

    def _data_stream(self, request: pb.ExporterDataRequest, context: grpc.ServicerContext) -> Iterator[Message]:
        self._gate("ExporterDataStream", context)
        core = self.core
        epoch = self.stream_epoch
        last_gen, samples = core.snapshot()
        try:
            first = core.filter_metrics(request, samples)
        except Refusal as why:
            context.abort(grpc.StatusCode[why.code], why.message)
        log.info(
            "ExporterDataStream subscribed (devices=%s metricIds=%s)", list(request.devices), list(request.metricIds)
        )
        yield first
        while True:
            with core.metrics_cond:
                while self.stream_epoch == epoch and core._snapshot_gen == last_gen and context.is_active():
                    core.metrics_cond.wait(0.25)
                closed = self.stream_epoch != epoch
                last_gen, samples = core._snapshot_gen, list(core._snapshot)
            if closed:
                context.abort(grpc.StatusCode.UNAVAILABLE, "xdm-sim: stream closed (service restart or stop)")
            if not context.is_active():
                return
            yield core.filter_metrics(request, samples)


def _summary(request: Message) -> str:
    if isinstance(request, pb.AllocateRequest):
        devs = [
            {k: v for k, v in (("minor", d.minor if d.HasField("minor") else None), ("core", d.core),
                               ("memory", d.memory), ("slice", d.slice)) if v}
            for d in request.devices
        ]  # fmt: skip
        return f"id={request.id or '-'} devices={devs}"
    if isinstance(request, pb.ReleaseRequest):
        return f"id={request.id or '-'}"
    return ""


def _outcome(response: Message) -> str:
    if isinstance(response, pb.AllocateResponse):
        return f" minors={[d.minor for d in response.devices]}"
    if isinstance(response, pb.ExporterDataResponse):
        return f" samples={len(response.dataList)}"
    return ""


def make_stale_socket(path: Path) -> None:
    """Leave a socket file nobody listens on (what a crashed daemon leaves): connects get ECONNREFUSED."""
    import socket

    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists():
        os.unlink(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(str(path))
    finally:
        sock.close()
