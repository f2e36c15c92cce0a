"""gRPC plumbing: the two Unix-socket servers in front of :class:`SimCore`.

Methods are looked up per call by a generic handler, so schema-drift modes
(another package name, the exporter RPCs in a second service), reflection
on/off and custom serialisation take effect immediately, even on a running
server. Every call first passes the fault gate (slow start, per-RPC latency or
hang). The served schema (:mod:`nomad_plugin.sim.schema`) is applied at this
edge only: requests are decoded with the served classes and copied into the
builtin ones, responses the other way, so :class:`SimCore` never changes.
"""

from __future__ import annotations

import math
import os
import queue
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
from google.protobuf.message import Message

from nomad_plugin._proto.lingjun import api_outer_pb2 as pb
from nomad_plugin._proto.lingjun import config_service_pb2 as cfg
from nomad_plugin.goplugin.logging import get_logger
from nomad_plugin.sim import drift as drift_mod
from nomad_plugin.sim.allocate import Refusal
from nomad_plugin.sim.core import CLOSE, SimCore
from nomad_plugin.sim.schema import ServedSchema, served_schema

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
