"""XdmClient: gRPC to XDM over its Unix sockets, returning model types.

Calls go through ``channel.unary_unary(path, ...)`` with the adapter's
serializers, so the fully-qualified service name is data, not code (R1): it
comes from ``xdm_service`` or from probing (server reflection if XDM has it,
then the known package candidates, with the read-only ListSupportedXPUType).
Exporter RPCs fall back per RPC to ``<pkg>.ExporterService``-style names when
the device service does not implement them (R13). Every unary call has a
deadline and waits for the channel to be ready within it. Enable/Disable are
not exposed (R14).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

import grpc
from google.protobuf.message import Message

from nomad_plugin.config.model import PluginConfig
from nomad_plugin.goplugin.logging import get_logger
from nomad_plugin.model.card import Card
from nomad_plugin.model.errors import (
    BackendRefused,
    BackendUnavailable,
    GrantMismatch,
    PluginError,
    ReservationRejected,
)
from nomad_plugin.model.grant import Grant, GrantRequest
from nomad_plugin.model.metrics import MetricSample
from nomad_plugin.util.protowire import WireError, encode_len_field, iter_fields
from nomad_plugin.xdm import adapter
from nomad_plugin.xdm.adapter import RpcSpec
from nomad_plugin.xdm.drift import DriftLog
from nomad_plugin.xdm.errors import classify_rpc_error, inband_refusal, is_not_found, socket_problem
from nomad_plugin.xdm.types import ExporterConfig, ExporterStatus, GpuFacts, RuntimeKitStatus
from nomad_plugin.xdm.verify import grant_problem

log = get_logger(__name__)

T = TypeVar("T")

# XDM's documented reconnect rule (1 s initial, 30 s max); keepalive kept at
# 5 min because gRPC servers (Go's default policy) punish more frequent pings.
CHANNEL_OPTIONS: tuple[tuple[str, int], ...] = (
    ("grpc.initial_reconnect_backoff_ms", 1000),
    ("grpc.min_reconnect_backoff_ms", 1000),
    ("grpc.max_reconnect_backoff_ms", 30000),
    ("grpc.keepalive_time_ms", 300000),
    ("grpc.keepalive_timeout_ms", 20000),
    ("grpc.keepalive_permit_without_calls", 0),
)
REFLECTION_PATHS = (
    "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
    "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
)
_LIST_SERVICES = encode_len_field(7, b"")  # ServerReflectionRequest{list_services: ""}


class _Endpoint:
    """One socket: its channel (created lazily, dropped when the socket breaks)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.lock = threading.Lock()
        self.channel: grpc.Channel | None = None
        self.callables: dict[str, Any] = {}

    def get(self) -> grpc.Channel:
        with self.lock:
            if self.channel is None:
                problem = socket_problem(self.path)  # socket-missing / refused / EACCES before dialling
                if problem is not None:
                    raise problem
                self.channel = grpc.insecure_channel(f"unix://{self.path}", options=list(CHANNEL_OPTIONS))
                self.callables = {}
            return self.channel

    def callable(self, key: str, make: Callable[[grpc.Channel], Any]) -> Any:
        channel = self.get()
        with self.lock:
            fn = self.callables.get(key)
            if fn is None:
                fn = self.callables[key] = make(channel)
            return fn

    def reset(self) -> None:
        with self.lock:
            channel, self.channel, self.callables = self.channel, None, {}
        if channel is not None:
            channel.close()


class Subscription(Generic[T]):
    """One server-streaming subscription: iterate it, ``cancel()`` from any thread.

    Iteration ends when the server closes the stream or ``cancel()`` is called;
    any other failure raises a classified ``PluginError``.
    """

    def __init__(self, call: Any, convert: Callable[[Message], T], classify: Callable[[grpc.RpcError], PluginError]):
        self._call = call
        self._convert = convert
        self._classify = classify
        self._cancelled = threading.Event()

    def __iter__(self) -> Iterator[T]:
        try:
            for msg in self._call:
                yield self._convert(msg)
        except grpc.RpcError as exc:
            if self._cancelled.is_set():
                return
            raise self._classify(exc) from None

    def cancel(self) -> None:
        self._cancelled.set()
        self._call.cancel()

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()


class XdmClient:
    """Typed access to XDM's dp2mgr and config-daemon services."""

    def __init__(self, config: PluginConfig, drift: DriftLog | None = None) -> None:
        if config.xdm_minor_encoding not in adapter.MINOR_ENCODINGS:
            raise ValueError(
                f"xdm_minor_encoding must be one of {adapter.MINOR_ENCODINGS}, got {config.xdm_minor_encoding!r}"
            )
        self.drift = drift or DriftLog()
        self._timeout = float(config.xdm_call_timeout)
        self._encoding = config.xdm_minor_encoding
        self._dp2mgr = _Endpoint(config.xdm_socket)
        self._config = _Endpoint(config.config_socket)
        self._configured_service = config.xdm_service.strip()
        self._probe_lock = threading.Lock()
        self._device_service: str | None = self._configured_service or None
        self._config_service: str | None = None
        self._exporter_services: dict[str, str] = {}  # RPC method -> service that implements it (R13)
        self._reflected: list[str] = []
        self._deserializers: dict[str, Callable[[bytes], Message]] = {}

    # ------------------------------------------------------------ public API
    def list_supported_xpu_types(self) -> list[str]:
        return adapter.xpu_types(self._call(adapter.LIST_SUPPORTED_XPU_TYPE, adapter.xpu_type_request()))

    def list_gpu_info(self, minors: tuple[int, ...] = ()) -> list[GpuFacts]:
        return adapter.gpu_facts(self._call(adapter.LIST_GPU_INFO, adapter.list_gpu_info_request(minors)))

    def list_and_watch(self) -> Subscription[list[Card]]:
        """Subscribe once; each item is the complete card list (R12)."""
        path = f"/{self.device_service()}/{adapter.LIST_AND_WATCH.method}"
        return self._stream(path, adapter.LIST_AND_WATCH, adapter.list_and_watch_request(), self._cards)

    def allocate(self, request: GrantRequest) -> Grant:
        """Allocate and verify (R3/R4); on mismatch release at once and raise ``GrantMismatch``."""
        if not request.asks:
            raise ReservationRejected(f"allocation {request.grant_id} asks for no card")
        message = adapter.allocate_request(request, self._encoding)
        try:
            response = self._call(adapter.ALLOCATE, message)
        except BackendUnavailable as exc:
            if exc.kind == "timeout":  # XDM may have granted it after all: undo, best effort
                self._release_quietly(request.grant_id, "Allocate timed out")
            raise
        outcome = adapter.allocate_outcome(response, request.grant_id)
        refusal = inband_refusal(outcome.status, outcome.message, "Allocate")
        if refusal is not None:
            raise refusal
        problem = grant_problem(request, outcome.grant, outcome.unknown_varints)
        if problem is not None:
            released = self._release_quietly(request.grant_id, "grant mismatch")
            suffix = " (allocation released)" if released else " (release failed; it stays recorded for retry)"
            raise GrantMismatch(problem + suffix)
        if outcome.unknown_varints:  # the grant verified: additive fields, already logged by DriftLog
            log.debug("Allocate %s verified despite unknown varints %s", request.grant_id, outcome.unknown_varints)
        return outcome.grant

    def release(self, grant_id: str) -> None:
        """Release; "not found" counts as released (R6)."""
        try:
            response = self._call(adapter.RELEASE, adapter.release_request(grant_id))
        except BackendRefused as exc:
            if is_not_found(exc):
                return
            raise
        status, text = adapter.inband_status(response)
        refusal = inband_refusal(status, text, "Release")
        if refusal is not None and not is_not_found(refusal):
            raise refusal

    def exporter_get_data_list(
        self, devices: tuple[str, ...] = (), metric_ids: tuple[int, ...] = ()
    ) -> list[MetricSample]:
        response = self._call(adapter.EXPORTER_GET_DATA_LIST, adapter.exporter_data_request(devices, metric_ids))
        self._raise_inband(response, "ExporterGetDataList")
        return adapter.metric_samples(response)

    def exporter_data_stream(
        self, devices: tuple[str, ...] = (), metric_ids: tuple[int, ...] = ()
    ) -> Subscription[list[MetricSample]]:
        spec = adapter.EXPORTER_DATA_STREAM
        service = self._exporter_services.get(spec.method) or self._exporter_services.get(
            adapter.EXPORTER_GET_DATA_LIST.method
        )
        if service is None:
            self.exporter_get_data_list(devices, metric_ids)  # resolves the exporter service (R13)
            service = self._exporter_services.get(adapter.EXPORTER_GET_DATA_LIST.method, self.device_service())
        return self._stream(
            f"/{service}/{spec.method}", spec, adapter.exporter_data_request(devices, metric_ids), self._samples
        )

    def exporter_get_config(self) -> ExporterConfig:
        response = self._call(adapter.EXPORTER_GET_CONFIG, adapter.exporter_get_config_request())
        self._raise_inband(response, "ExporterGetConfig")
        return adapter.exporter_config(response)

    def exporter_get_status(self) -> ExporterStatus:
        return adapter.exporter_status(self._call(adapter.EXPORTER_GET_STATUS, adapter.exporter_get_status_request()))

    def query_status(self) -> RuntimeKitStatus:
        """config-daemon QueryStatus, probing the config service name on first use."""
        spec = adapter.QUERY_STATUS
        if self._config_service is not None:
            return adapter.runtime_kit_status(self._config_call(self._config_service, spec))
        last: BackendUnavailable | None = None
        for package in adapter.CONFIG_PACKAGE_CANDIDATES:
            service = adapter.qualified(package, adapter.CONFIG_SERVICE)
            try:
                response = self._config_call(service, spec)
            except BackendUnavailable as exc:
                if exc.kind != "unimplemented":
                    raise
                last = exc
                continue
            self._config_service = service
            log.info("XDM config service is %s", service)
            return adapter.runtime_kit_status(response)
        raise BackendUnavailable(
            f"no config service answers QueryStatus (tried {', '.join(adapter.CONFIG_PACKAGE_CANDIDATES)}): {last}",
            kind="unimplemented",
        )

    def device_service(self) -> str:
        """The fully-qualified device service name, probing once if not configured (R1)."""
        with self._probe_lock:
            if self._device_service is None:
                self._device_service = self._probe_device_service()
                log.info("XDM device service is %s", self._device_service)
            return self._device_service

    def close(self) -> None:
        self._dp2mgr.reset()
        self._config.reset()

    # ------------------------------------------------------------ internals
    def _call(self, spec: RpcSpec, request: Message) -> Message:
        if spec.role == "exporter":
            return self._exporter_call(spec, request)
        service = self.device_service()
        try:
            return self._unary(self._dp2mgr, f"/{service}/{spec.method}", spec, request)
        except BackendUnavailable as exc:
            if exc.kind == "unimplemented" and not self._configured_service:
                self._forget_device_service(service)  # XDM may have changed; probe again next time
            raise

    def _exporter_call(self, spec: RpcSpec, request: Message) -> Message:
        known = self._exporter_services.get(spec.method)
        if known is not None:
            try:
                return self._unary(self._dp2mgr, f"/{known}/{spec.method}", spec, request)
            except BackendUnavailable as exc:
                if exc.kind == "unimplemented":
                    self._exporter_services.pop(spec.method, None)
                raise
        first: BackendUnavailable | None = None
        for service in self._exporter_candidates():
            try:
                response = self._unary(self._dp2mgr, f"/{service}/{spec.method}", spec, request)
            except BackendRefused:
                self._exporter_services[spec.method] = service  # it exists and refused
                raise
            except BackendUnavailable as exc:
                if exc.kind != "unimplemented":
                    raise
                first = first or exc
                continue
            if service != self.device_service():
                log.info("XDM %s is served by %s (R13)", spec.method, service)
            self._exporter_services[spec.method] = service
            return response
        assert first is not None
        raise first

    def _exporter_candidates(self) -> list[str]:
        device = self.device_service()
        package = device.rpartition(".")[0]
        names = [device]
        names += [n for n in self._reflected if "export" in n.lower() or "monitor" in n.lower()]
        names += [adapter.qualified(package, name) for name in adapter.EXPORTER_SERVICE_CANDIDATES]
        return list(dict.fromkeys(names))

    def _config_call(self, service: str, spec: RpcSpec) -> Message:
        return self._unary(self._config, f"/{service}/{spec.method}", spec, adapter.query_status_request())

    def _unary(self, endpoint: _Endpoint, path: str, spec: RpcSpec, request: Message) -> Message:
        deserialize = self._deserializer(spec)
        fn = endpoint.callable(
            path,
            lambda ch: ch.unary_unary(path, request_serializer=adapter.serialize, response_deserializer=deserialize),
        )
        try:
            response: Message = fn(request, timeout=self._timeout, wait_for_ready=True)
        except grpc.RpcError as exc:
            raise self._classify(endpoint, exc, spec.method) from None
        return response

    def _stream(self, path: str, spec: RpcSpec, request: Message, convert: Callable[[Message], T]) -> Subscription[T]:
        deserialize = self._deserializer(spec)
        fn = self._dp2mgr.callable(
            path,
            lambda ch: ch.unary_stream(path, request_serializer=adapter.serialize, response_deserializer=deserialize),
        )
        call = fn(request, wait_for_ready=False)
        return Subscription(call, convert, lambda exc: self._classify(self._dp2mgr, exc, spec.method))

    def _deserializer(self, spec: RpcSpec) -> Callable[[bytes], Message]:
        fn = self._deserializers.get(spec.method)
        if fn is None:
            fn = self._deserializers[spec.method] = adapter.deserializer(spec, self.drift)
        return fn

    def _classify(self, endpoint: _Endpoint, exc: grpc.RpcError, method: str) -> PluginError:
        code, details = _code_and_details(exc)
        diagnosis = None
        if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
            diagnosis = socket_problem(endpoint.path)
            if diagnosis is not None:
                endpoint.reset()  # the daemon is gone: dial afresh once the socket is back
        return classify_rpc_error(code, details, method, diagnosis)

    def _raise_inband(self, response: Message, method: str) -> None:
        status, text = adapter.inband_status(response)
        refusal = inband_refusal(status, text, method)
        if refusal is not None:
            raise refusal

    def _release_quietly(self, grant_id: str, why: str) -> bool:
        try:
            self.release(grant_id)
        except PluginError as exc:
            log.error("XDM Release(%s) after %s failed: %s", grant_id, why, exc)
            return False
        log.warning("released XDM allocation %s after %s", grant_id, why)
        return True

    def _cards(self, msg: Message) -> list[Card]:
        return adapter.cards_from_list_and_watch(msg, self.drift)

    def _samples(self, msg: Message) -> list[MetricSample]:
        return adapter.metric_samples(msg)

    def _forget_device_service(self, service: str) -> None:
        with self._probe_lock:
            if self._device_service == service:
                self._device_service = None
                self._exporter_services.clear()

    def _probe_device_service(self) -> str:
        reflected = self._reflect(self._dp2mgr)
        self._reflected = reflected or []
        wanted = adapter.DEVICE_SERVICE
        candidates = [n for n in self._reflected if n.rpartition(".")[2] == wanted]
        candidates += [adapter.qualified(p, wanted) for p in adapter.DEVICE_PACKAGE_CANDIDATES]
        spec = adapter.LIST_SUPPORTED_XPU_TYPE
        tried = list(dict.fromkeys(candidates))
        for service in tried:
            try:
                self._unary(self._dp2mgr, f"/{service}/{spec.method}", spec, adapter.xpu_type_request())
            except BackendRefused:
                return service  # it exists (and refused a read-only call)
            except BackendUnavailable as exc:
                if exc.kind == "unimplemented":
                    continue
                raise
            return service
        raise BackendUnavailable(
            f"XDM implements none of the known device service names ({', '.join(tried)}); "
            "set xdm_service to the fully-qualified name from the official proto",
            kind="unimplemented",
        )

    def _reflect(self, endpoint: _Endpoint) -> list[str] | None:
        """Service names from gRPC server reflection, or None if XDM has none (cheap: one call)."""
        for path in REFLECTION_PATHS:
            fn = endpoint.callable(path, _bytes_stream_stream(path))
            try:
                responses = fn(iter([_LIST_SERVICES]), timeout=min(self._timeout, 2.0), wait_for_ready=True)
                for raw in responses:
                    responses.cancel()
                    return _reflected_services(raw)
            except grpc.RpcError as exc:
                code, _ = _code_and_details(exc)
                if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                    raise self._classify(endpoint, exc, "ServerReflectionInfo") from None
                continue
        return None


def _bytes_stream_stream(path: str) -> Callable[[grpc.Channel], Any]:
    """A raw-bytes bidi callable (no serializers): reflection has no generated code here."""
    return lambda channel: channel.stream_stream(path, request_serializer=None, response_deserializer=None)


def _reflected_services(raw: bytes) -> list[str] | None:
    """ServerReflectionResponse -> list_services_response.service[].name."""
    names: list[str] = []
    try:
        for number, wire, value in iter_fields(raw):
            if number == 6 and wire == 2 and isinstance(value, bytes):
                for n2, w2, service in iter_fields(value):
                    if n2 == 1 and w2 == 2 and isinstance(service, bytes):
                        for n3, w3, name in iter_fields(service):
                            if n3 == 1 and w3 == 2 and isinstance(name, bytes):
                                names.append(name.decode("utf-8", "replace"))
    except WireError:
        return None
    return names or None


def _code_and_details(exc: grpc.RpcError) -> tuple[grpc.StatusCode | None, str]:
    code_fn = getattr(exc, "code", None)
    details_fn = getattr(exc, "details", None)
    code = code_fn() if callable(code_fn) else None
    details = details_fn() if callable(details_fn) else str(exc)
    return code, str(details or "")
