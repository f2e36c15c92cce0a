"""A small, real XDM test server for the client tests (real gRPC on a real Unix socket).

Serves the reconstructed proto through the generated servicer base classes,
but registered under a configurable service name (to exercise probing, R1/R13)
and with knobs for the failure modes the client must survive: in-band or gRPC
refusals, wrong grants, raw response bytes (unknown fields, type clashes),
latency, reflection, restart and crash (stale socket file).
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc

from nomad_plugin._proto.lingjun import api_outer_pb2 as pb
from nomad_plugin._proto.lingjun import api_outer_pb2_grpc as pb_grpc
from nomad_plugin._proto.lingjun import config_service_pb2 as cpb
from nomad_plugin._proto.lingjun import config_service_pb2_grpc as cpb_grpc

EXPORTER_METHODS = (
    "ListGpuInfo",
    "ExporterGetDataList",
    "ExporterDataStream",
    "ExporterGetConfig",
    "ExporterGetStatus",
)
STREAM_METHODS = ("ListAndWatch", "ExporterDataStream")


def _topology(minor: int) -> str:
    return json.dumps(
        {
            "levels": [
                {
                    "level": 3,
                    "name": "cpuSockets",
                    "topo3": [minor // 4],
                    "peers": list(range(minor // 4 * 4, minor // 4 * 4 + 4)),
                },
                {
                    "level": 1,
                    "name": "pcieSwitches",
                    "topo1": [minor // 2],
                    "peers": [minor // 2 * 2, minor // 2 * 2 + 1],
                },
                {"level": 21, "name": "leafSwitch", "topo21": "asw-001"},
            ]
        }
    )


def default_devices(count: int = 8) -> list[pb.Device]:
    return [
        pb.Device(
            minor=i,
            uuid=f"GPU-0000000{i}-aaaa-bbbb-cccc-00000000000{i}",
            model="NVIDIA H800",
            xpuType="nvidia",
            health="Healthy",
            totalMemory=81559,
            totalCore=100,
            pciBusId=f"0000:{0x10 + i:02x}:00.0",
            extenderResources={"topology": _topology(i)},
        )
        for i in range(count)
    ]


def _serialize(msg: Any) -> bytes:
    return msg if isinstance(msg, bytes) else msg.SerializeToString()


class FakeXdm(pb_grpc.XpuDeviceManagerServiceServicer):
    """Configure the public attributes, then ``start()``."""

    def __init__(self, socket_path: str, config_path: str | None = None) -> None:
        self.socket_path = socket_path
        self.config_path = config_path
        self.package = "xdm"
        self.config_package = "config"
        self.split_exporter = False  # R13: exporter RPCs under <pkg>.ExporterService
        self.reflection: list[str] | None = None  # service names served by reflection, None = off
        # what reflection describes; None = the reconstruction moved to ``package``
        self.reflection_schema: Any = None
        self.reflection_garbage = False  # answer every reflection request with undecodable bytes
        self.devices = default_devices()
        self.error_mode = "inband"  # how refusals are expressed: "inband" status/message or "grpc" codes
        self.refuse_allocate = False
        self.refusal = "card 1 has no free memory"  # the text of that refusal
        self.grant_mode = "ok"  # ok | wrong-minor | wrong-amount | empty-success | shifted-status
        self.release_unknown = "not-found"  # or "ok"
        self.latency: dict[str, float] = {}
        # Answer Allocate at once with this (code, details), and commit the grant ``commit_delay`` s later:
        # an XDM whose transport gave up on a call its daemon goes on with.
        self.allocate_abort: tuple[grpc.StatusCode, str] | None = None
        self.commit_delay = 1.0
        self.allocate_requests: list[str] = []  # grant ids of every Allocate received, when received
        self.raw: dict[str, Callable[[Any], bytes]] = {}  # method -> raw response bytes
        self.push_on_subscribe = True
        self.enabled = True
        self.grants: dict[str, pb.AllocateRequest] = {}
        self.released: list[str] = []
        self.calls: dict[str, int] = {}
        self.lock = threading.Condition()
        self.version = 0
        self._server: grpc.Server | None = None
        self._config_server: grpc.Server | None = None
        self._stopping = threading.Event()

    # ------------------------------------------------------------ lifecycle
    def start(self) -> FakeXdm:
        self._stopping.clear()
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=16))
        server.add_generic_rpc_handlers(self._handlers())
        server.add_insecure_port(f"unix://{self.socket_path}")
        server.start()
        self._server = server
        if self.config_path:
            cfg = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
            cfg.add_generic_rpc_handlers((self._config_handler(),))
            cfg.add_insecure_port(f"unix://{self.config_path}")
            cfg.start()
            self._config_server = cfg
        return self

    def stop(self, unlink: bool = True) -> None:
        self._stopping.set()
        with self.lock:
            self.lock.notify_all()
        for server in (self._server, self._config_server):
            if server is not None:
                server.stop(grace=None).wait()
        self._server = self._config_server = None
        if unlink:
            for path in (self.socket_path, self.config_path):
                if path and os.path.exists(path):
                    os.unlink(path)

    def crash(self) -> None:
        """Stop but leave a stale socket file behind (connects get ECONNREFUSED)."""
        self.stop(unlink=False)
        if not os.path.exists(self.socket_path):  # grpc removes its socket on stop; recreate a dead one
            import socket as _socket

            dead = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
            dead.bind(self.socket_path)
            dead.close()

    def restart(self, downtime: float = 0.2) -> None:
        self.stop(unlink=True)
        time.sleep(downtime)
        if os.path.exists(self.socket_path):
            os.unlink(self.socket_path)
        self.start()

    def set_health(self, minor: int, health: str) -> None:
        with self.lock:
            for dev in self.devices:
                if dev.minor == minor:
                    dev.health = health
            self.version += 1
            self.lock.notify_all()

    # ------------------------------------------------------------ handlers
    def _handlers(self) -> list[grpc.GenericRpcHandler]:
        device_service = f"{self.package}.XpuDeviceManagerService" if self.package else "XpuDeviceManagerService"
        exporter_service = (
            (f"{self.package}.ExporterService" if self.package else "ExporterService")
            if self.split_exporter
            else device_service
        )
        methods: dict[str, dict[str, grpc.RpcMethodHandler]] = {device_service: {}, exporter_service: {}}
        requests = {
            "ListSupportedXPUType": pb.XPUTypeRequest,
            "ListAndWatch": pb.ListAndWatchRequest,
            "Allocate": pb.AllocateRequest,
            "Release": pb.ReleaseRequest,
            "ListGpuInfo": pb.ListGpuInfoRequest,
            "ExporterGetDataList": pb.ExporterDataRequest,
            "ExporterDataStream": pb.ExporterDataRequest,
            "ExporterGetConfig": pb.ExporterGetConfigRequest,
            "ExporterGetStatus": pb.ExporterGetStatusRequest,
        }
        for name, req in requests.items():
            impl = self._wrap(name, getattr(self, name))
            if name in STREAM_METHODS:
                handler = grpc.unary_stream_rpc_method_handler(impl, req.FromString, _serialize)
            else:
                handler = grpc.unary_unary_rpc_method_handler(impl, req.FromString, _serialize)
            methods[exporter_service if name in EXPORTER_METHODS else device_service][name] = handler
        handlers = [grpc.method_handlers_generic_handler(svc, table) for svc, table in methods.items() if table]
        if self.reflection is not None:
            handlers.append(self._reflection_handler(self.reflection))
        return handlers

    def _wrap(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def call(request: Any, context: grpc.ServicerContext) -> Any:
            with self.lock:
                self.calls[name] = self.calls.get(name, 0) + 1
                if name == "Allocate":
                    self.allocate_requests.append(request.id)
                    self.lock.notify_all()
            delay = self.latency.get(name, 0.0)
            if delay:
                time.sleep(delay)
            if name in self.raw and name not in STREAM_METHODS:
                return self.raw[name](request)
            return fn(request, context)

        return call

    def _config_handler(self) -> grpc.GenericRpcHandler:
        service = f"{self.config_package}.AmpConfigService" if self.config_package else "AmpConfigService"
        servicer = _Config(self)
        handler = grpc.unary_unary_rpc_method_handler(
            servicer.QueryStatus, cpb.QueryStatusRequest.FromString, _serialize
        )
        return grpc.method_handlers_generic_handler(service, {"QueryStatus": handler})

    def _reflection_handler(self, names: list[str]) -> grpc.GenericRpcHandler:
        """grpc.reflection (v1alpha): list_services, file_containing_symbol, file_by_filename."""
        from grpc_reflection.v1alpha import reflection_pb2 as rpb

        from tests.xdm import schemas

        fds = self.reflection_schema
        if fds is None:
            fds = schemas.base()
            if self.package != "xdm":
                fds = schemas.repackaged(fds, "xdm", self.package)
        files = {f.name: f for f in fds.file}
        garbage = self.reflection_garbage

        def owner(symbol: str) -> Any:
            for f in fds.file:
                prefix = f"{f.package}." if f.package else ""
                if any(prefix + s.name == symbol for s in f.service) or any(
                    prefix + m.name == symbol for m in f.message_type
                ):
                    return f
            return None

        def info(requests: Iterator[Any], context: grpc.ServicerContext) -> Iterator[bytes]:
            for req in requests:
                if garbage:
                    yield b"\x0a\xff\xff\xff"
                    continue
                answer = rpb.ServerReflectionResponse(original_request=req)
                kind = req.WhichOneof("message_request")
                if kind == "list_services":
                    answer.list_services_response.service.extend(rpb.ServiceResponse(name=n) for n in names)
                else:
                    found = owner(req.file_containing_symbol) if kind == "file_containing_symbol" else None
                    if kind == "file_by_filename":
                        found = files.get(req.file_by_filename)
                    if found is None:
                        answer.error_response.error_code = grpc.StatusCode.NOT_FOUND.value[0]
                        answer.error_response.error_message = "not found"
                    else:
                        answer.file_descriptor_response.file_descriptor_proto.append(found.SerializeToString())
                yield answer.SerializeToString()

        handler = grpc.stream_stream_rpc_method_handler(
            info, request_deserializer=rpb.ServerReflectionRequest.FromString
        )
        return grpc.method_handlers_generic_handler(
            "grpc.reflection.v1alpha.ServerReflection", {"ServerReflectionInfo": handler}
        )

    # ------------------------------------------------------------ RPCs
    def ListSupportedXPUType(self, request: Any, context: Any) -> Any:
        return pb.XPUTypeResponse(xpuTypes=["nvidia"])

    def ListAndWatch(self, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        seen = -1 if self.push_on_subscribe else self.version
        while not self._stopping.is_set() and context.is_active():
            with self.lock:
                if seen == self.version:
                    self.lock.wait(0.2)
                    continue
                seen = self.version
                devices = [pb.Device().__class__.FromString(d.SerializeToString()) for d in self.devices]
            if "ListAndWatch" in self.raw:
                yield self.raw["ListAndWatch"](None)
            else:
                yield pb.ListAndWatchResponse(devices=devices)

    def Allocate(self, request: Any, context: grpc.ServicerContext) -> Any:
        if self.allocate_abort is not None:
            code, details = self.allocate_abort
            timer = threading.Timer(self.commit_delay, self._commit, args=(request,))
            timer.daemon = True
            timer.start()
            context.abort(code, details)
        if self.refuse_allocate and self.error_mode == "grpc":
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, self.refusal)
        if self.refuse_allocate:
            return pb.AllocateResponse(status=7, message=self.refusal)
        if self.grant_mode == "empty-success":
            return pb.AllocateResponse()
        if self.grant_mode == "shifted-status":
            return pb.AllocateResponse().SerializeToString() + _varint_field(20, 3) + _len_field(21, b"denied")
        granted = []
        for dev in request.devices:
            minor = dev.minor if dev.HasField("minor") else 7  # "auto-assign" lands elsewhere (R4)
            if self.grant_mode == "wrong-minor":
                minor += 1
            memory = dev.memory * (2 if self.grant_mode == "wrong-amount" else 1)
            granted.append(
                pb.AllocatedDevice(minor=minor, uuid=f"GPU-{minor}", core=dev.core, memory=memory, slice=dev.slice)
            )
        with self.lock:
            self.grants[request.id] = request
        return pb.AllocateResponse(
            id=request.id,
            devices=granted,
            envs={"NVIDIA_VISIBLE_DEVICES": ",".join(g.uuid for g in granted)},
            annotations=dict(request.annotations),
        )

    def _commit(self, request: Any) -> None:
        with self.lock:
            self.grants[request.id] = request
            self.lock.notify_all()

    def Release(self, request: Any, context: grpc.ServicerContext) -> Any:
        with self.lock:
            known = self.grants.pop(request.id, None)
            self.released.append(request.id)
        if known is None and self.release_unknown == "not-found":
            if self.error_mode == "grpc":
                context.abort(grpc.StatusCode.NOT_FOUND, f"allocation {request.id} not found")
            return pb.ReleaseResponse(status=404, message=f"allocation {request.id} not found")
        return pb.ReleaseResponse()

    def ListGpuInfo(self, request: Any, context: Any) -> Any:
        infos = [
            pb.GpuInfo(
                minor=d.minor,
                uuid=d.uuid,
                model=d.model,
                driverVersion="535.161.08",
                vendor="NVIDIA",
                xpuType=d.xpuType,
                totalMemory=d.totalMemory,
                pciBusId=d.pciBusId,
                numaNode=d.minor // 4,
                migEnabled=False,
            )
            for d in self.devices
        ]
        return pb.ListGpuInfoResponse(gpuInfos=infos)

    def _samples(self) -> Any:
        now = int(time.time() * 1000)
        data = [
            pb.MetricData(
                device=str(d.minor), metricId=1, value=10.0 + d.minor, timestamp=now, metricName="core_util_percent"
            )
            for d in self.devices
        ]
        return pb.ExporterDataResponse(dataList=data)

    def ExporterGetDataList(self, request: Any, context: Any) -> Any:
        return self._samples()

    def ExporterDataStream(self, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        while not self._stopping.is_set() and context.is_active():
            yield self._samples()
            self._stopping.wait(0.05)

    def ExporterGetConfig(self, request: Any, context: Any) -> Any:
        return pb.ExporterGetConfigResponse(collectIntervalMs=1000, metricIds=[1, 2, 3])

    def ExporterGetStatus(self, request: Any, context: Any) -> Any:
        return pb.ExporterGetStatusResponse(running=True, state="running", version="1.13.0")


class _Config(cpb_grpc.AmpConfigServiceServicer):
    def __init__(self, owner: FakeXdm) -> None:
        self.owner = owner

    def QueryStatus(self, request: Any, context: Any) -> Any:
        return cpb.QueryStatusResponse(enabled=self.owner.enabled)


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        bits, value = value & 0x7F, value >> 7
        out.append(bits | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _varint_field(number: int, value: int) -> bytes:
    return _varint(number << 3) + _varint(value)


def _len_field(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def short_socket_dir() -> Path:
    """A short tmp dir (Unix socket paths must stay under ~100 chars)."""
    import tempfile

    return Path(tempfile.mkdtemp(prefix="xdm", dir="/tmp"))
