"""XdmClient: gRPC to XDM over its Unix sockets, returning model types.

Before the first call the client *binds* XDM's schema (``xdm_schema``:
server reflection, the operator's official proto, or the reconstruction;
see ``schema_source`` and ``binder``) and logs the binding report once. A
binding that misses what the plugin needs, a schema that cannot be read, or
decoded data that fails the plausibility guards (``guards``) is an "XDM
schema mismatch" finding: calls raise ``SchemaMismatch``, pushes come back
with every card unhealthy for that reason, and ``allocate`` refuses before
sending anything. The binding is dropped (and made again on the next call)
whenever the connection to XDM breaks: an XDM restarted after an upgrade may
serve another schema.

Calls go through ``channel.unary_unary(path, ...)`` with the binding's
message classes, so the service name is data, not code (R1): the schema's
own service, or for the reconstruction ``xdm_service`` or probing (the
reflected service list, then the known package candidates). Exporter RPCs
fall back per RPC to ``<pkg>.ExporterService``-style names when the device
service does not implement them (R13). Every unary call has a deadline and
waits for the channel to be ready within it. Enable/Disable are not exposed
(R14).
"""

from __future__ import annotations

import errno
import os
import socket
import stat
import threading
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any, Generic, TypeVar

import grpc
from google.protobuf.descriptor_pb2 import FileDescriptorSet
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
    SchemaMismatch,
)
from nomad_plugin.model.grant import Grant, GrantRequest
from nomad_plugin.model.metrics import MetricSample
from nomad_plugin.util.protowire import WireError, encode_len_field, iter_fields
from nomad_plugin.util.text import printable
from nomad_plugin.xdm import adapter, binder, guards
from nomad_plugin.xdm.adapter import DriftLog, ExporterConfig, ExporterStatus, GpuFacts, RpcSpec, RuntimeKitStatus
from nomad_plugin.xdm.binder import MISMATCH_PREFIX, Binding, SchemaError, bind, builtin_binding
from nomad_plugin.xdm.guards import grant_problem

log = get_logger(__name__)  # routed at the plugin's log_level (the binding report is info)

T = TypeVar("T")

# XDM's documented reconnect rule (1 s initial, 30 s max); keepalive kept at
# 5 min because gRPC servers (Go's default policy) punish more frequent pings.
# No bandwidth-delay probes: gRPC's client pings after data arrives to size its
# receive window, which on a local socket measures nothing and woke both
# processes for every exporter push (issue 14). The window it would have grown
# to, gRPC's 4 MiB receive limit, is announced up front instead
# (tests/xdm/test_channel_wire.py reads both off the wire).
#: The largest XDM message the plugin takes. gRPC's default (4 MiB) is already far above a real node's
#: need (the simulator's 8-card push is 3.7 KB; a 16-card node with MIG instances and rich topology JSON
#: stays under 1 MiB), so a message past it is malformed; the limit is raised to 16 MiB for headroom, and
#: a message over it fails with a plain "message-too-large" error, logged at error level.
MAX_MESSAGE_BYTES = 16 << 20
CHANNEL_OPTIONS: tuple[tuple[str, int], ...] = (
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.initial_reconnect_backoff_ms", 1000),
    ("grpc.min_reconnect_backoff_ms", 1000),
    ("grpc.max_reconnect_backoff_ms", 30000),
    ("grpc.keepalive_time_ms", 300000),
    ("grpc.keepalive_timeout_ms", 20000),
    ("grpc.keepalive_permit_without_calls", 0),
    ("grpc.http2.bdp_probe", 0),
    ("grpc.http2.lookahead_bytes", 4 << 20),
)
REFLECTION_PATHS = (
    "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
    "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
)
_LIST_SERVICES = encode_len_field(7, b"")  # ServerReflectionRequest{list_services: ""}


def _socket_id(path: str) -> tuple[int, int] | None:
    """(inode, ctime) of the socket file: a daemon that restarts binds a new one; None when absent."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_ino, st.st_ctime_ns


class _Endpoint:
    """One socket: its channel (created lazily, dropped when the socket breaks or is replaced)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.lock = threading.Lock()
        self.channel: grpc.Channel | None = None
        self.callables: dict[str, Any] = {}
        self.socket_id: tuple[int, int] | None = None  # of the socket file the channel dialled

    def get(self) -> grpc.Channel:
        with self.lock:
            if self.channel is None:
                problem = socket_problem(self.path)  # socket-missing / refused / EACCES before dialling
                if problem is not None:
                    raise problem
                self.channel = grpc.insecure_channel(f"unix://{self.path}", options=list(CHANNEL_OPTIONS))
                self.callables = {}
                self.socket_id = _socket_id(self.path)
            return self.channel

    def replaced(self) -> bool:
        """True (and the channel dropped) when the socket file is not the one the channel dialled.

        A daemon that restarts binds a new socket. When no call or stream was under way to fail
        on the way, gRPC would redial the new daemon on the next call as if nothing happened.
        """
        with self.lock:
            if self.channel is None or self.socket_id is None:
                return False
            now = _socket_id(self.path)
            if now is None or now == self.socket_id:
                return False  # gone: the call fails and says why; unchanged: the same daemon
            channel, self.channel, self.callables = self.channel, None, {}
        channel.close()
        return True

    def callable(self, key: str, make: Callable[[grpc.Channel], Any]) -> Any:
        channel = self.get()
        with self.lock:
            fn = self.callables.get(key)
            if fn is None:
                fn = self.callables[key] = make(channel)
            return fn

    def drop_callables(self) -> None:
        with self.lock:
            self.callables = {}

    def reset(self) -> None:
        with self.lock:
            channel, self.channel, self.callables = self.channel, None, {}
        if channel is not None:
            channel.close()


# grpcio's blocking iterators wait in slices of ``grpc._common.MAXIMUM_WAIT_TIMEOUT`` (0.1 s) so
# that a *main* thread blocked on a stream still runs its signal handlers (grpc/grpc#19464).
# The plugin's streams are read by background threads only, which get no signals; their slices
# only cost wake-ups: ten a second per open stream, idle or not, about a fifth of the whole
# plugin's steady-state CPU (issue 14). Cancelling a stream wakes its reader at once whatever the
# slice, so 5 s costs no latency. A private constant: when grpcio drops it, this does nothing
# (tests/stats/test_stream_wakeups.py says so).
STREAM_WAIT_SLICE_S = 5.0


def relax_stream_waits(seconds: float = STREAM_WAIT_SLICE_S) -> bool:
    """Let grpcio's blocking iterators wait ``seconds`` per slice; False when grpcio has no such knob."""
    from grpc import _common

    if not isinstance(getattr(_common, "MAXIMUM_WAIT_TIMEOUT", None), float):
        return False
    _common.MAXIMUM_WAIT_TIMEOUT = max(seconds, _common.MAXIMUM_WAIT_TIMEOUT)
    return True


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
        # Allocate's own deadline: creating MIG instances on a loaded card takes seconds (xdm_allocate_timeout).
        self._allocate_timeout = float(config.xdm_allocate_timeout)
        self._encoding = config.xdm_minor_encoding
        self._dp2mgr = _Endpoint(config.xdm_socket)
        self._config = _Endpoint(config.config_socket)
        self._configured_service = config.xdm_service.strip()
        self._probe_lock = threading.Lock()
        self._device_service: str | None = self._configured_service or None
        self._config_service: str | None = None
        self._exporter_services: dict[str, str] = {}  # RPC method -> service that implements it (R13)
        self._reflected: list[str] = []
        self._deserializers: dict[tuple[str, type[Message]], Callable[[bytes], Message]] = {}
        self._schema = config.xdm_schema.strip() or "auto"
        self._aliases = dict(config.xdm_field_aliases)
        self._bind_lock = threading.RLock()
        self._binding: Binding | None = None  # a usable binding (no mismatch), None = bind on next use
        self._config_bound: Binding | None = None  # config-daemon's, when the main schema lacks it
        self.last_binding: Binding | None = None  # the latest attempt, usable or not (doctor, xdm-probe)
        self.last_bind_error = ""
        self._logged_bind = ""
        # guard findings per RPC, with the digest of the schema that produced them: a
        # re-bind to another schema drops them, a re-bind to the same one keeps them
        # until the RPC answers plausibly (a Reserve in between is still refused)
        self._findings: dict[str, tuple[str, str]] = {}
        self._path_cache: tuple[tuple[str, float, int], FileDescriptorSet] | None = None
        self.binds = 0  # successful (re)binds; for tests and health

    # ------------------------------------------------------------ schema binding
    def binding(self) -> Binding:
        """The bound schema; binds on first use (and after ``invalidate_binding``).

        Raises ``SchemaMismatch`` when it cannot bind what the plugin needs, and
        ``BackendUnavailable`` when XDM cannot be reached to ask (reflection).
        """
        with self._bind_lock:
            if self._binding is not None and not self._restarted():
                return self._binding
            try:
                found = self._bind()
            except SchemaMismatch as exc:
                self.last_bind_error = str(exc)
                self._log_bind(str(exc), None)
                raise
            self.last_binding = found
            if not found.ok:
                self.last_bind_error = found.mismatch_text()
                self._log_bind(found.digest + found.mismatch_text(), found)
                raise SchemaMismatch(found.mismatch_text())
            self.last_bind_error = ""
            self._log_bind(found.digest + found.source, found)
            self._findings = {k: v for k, v in self._findings.items() if v[0] == found.digest}
            self._binding = found
            self.binds += 1
            return found

    def _restarted(self) -> bool:
        """XDM restarted since its channel dialled (a new socket file): bind afresh, it may serve another schema.

        Checked before each call uses the binding, so a restart that no stream or call saw
        (the watch stream between resubscribes, say) is not read with the old schema (R1).
        """
        dp2mgr, config = self._dp2mgr.replaced(), self._config.replaced()
        if dp2mgr or config:
            self.invalidate_binding("XDM's socket was replaced: XDM restarted")
            return True
        return False

    def invalidate_binding(self, why: str) -> None:
        """Forget the binding: the next call binds afresh (R1, item 5)."""
        with self._bind_lock:
            had = self._binding is not None
            self._binding = None
            self._config_bound = None
            self._deserializers.clear()
        self._dp2mgr.drop_callables()
        self._config.drop_callables()
        if had:
            log.debug("XDM schema binding dropped (%s); binding again on the next call", why)

    def schema_finding(self) -> str:
        """The current "XDM schema mismatch: ..." finding, or "" when the schema is trusted."""
        with self._bind_lock:
            if self._binding is None and self.last_bind_error:
                return self.last_bind_error
            return next((text for _, text in self._findings.values()), "")

    def _log_bind(self, key: str, found: Binding | None) -> None:
        """The full report when the schema (or the verdict) changed; one line for a
        re-bind to the same schema; a failing bind that repeats is not logged again."""
        if key == self._logged_bind:
            if found is not None and found.ok:
                log.info("XDM schema re-bound: source %s, sha256 %s, unchanged", found.source, found.digest[:12])
            return
        self._logged_bind = key
        if found is not None:
            log.info("%s", "\n".join(found.report_lines()))
        if found is None or not found.ok:
            log.error("%s", self.last_bind_error)

    def _bind(self) -> Binding:
        source = self._schema
        try:
            if source == "builtin":
                return builtin_binding(self._aliases)
            if binder.is_path(source):
                return bind(self._load_path(source), source, self._aliases)
            fds = self._reflect_schema()
            if fds is None:
                if source == "reflection":
                    raise SchemaMismatch(
                        f'{MISMATCH_PREFIX}: xdm_schema is "reflection" but XDM does not serve gRPC server '
                        f"reflection on {self._dp2mgr.path}"
                    )
                return builtin_binding(self._aliases)
            found = bind(fds, "reflection", self._aliases)
        except SchemaError as exc:
            raise SchemaMismatch(f"{MISMATCH_PREFIX}: {exc}") from None
        if source == "auto" and "ListAndWatch" not in found.rpcs and "Allocate" not in found.rpcs:
            log.info("XDM reflection describes no device service; using the built-in reconstruction")
            return builtin_binding(self._aliases)
        return found

    def _load_path(self, path: str) -> FileDescriptorSet:
        """The operator's schema file, compiled once per (path, mtime, size)."""
        try:
            st = os.stat(path)
            key = (path, st.st_mtime, st.st_size)
        except OSError:
            key = (path, 0.0, -1)
        if self._path_cache is not None and self._path_cache[0] == key:
            return self._path_cache[1]
        fds = binder.load_path(path)
        self._path_cache = (key, fds)
        return fds

    def _reflect_schema(self, endpoint: _Endpoint | None = None) -> FileDescriptorSet | None:
        endpoint = endpoint or self._dp2mgr
        channel = endpoint.get()
        try:
            return binder.reflect(channel, timeout=max(self._timeout, 1.0))
        except grpc.RpcError as exc:
            raise self._classify(endpoint, exc, "ServerReflectionInfo") from None

    def _config_binding(self) -> Binding:
        """The schema for config-daemon.sock: the bound schema when it holds QueryStatus;
        with reflection, what config-daemon itself reflects; else the reconstruction."""
        main = self.binding()
        if "QueryStatus" in main.rpcs:
            return main
        with self._bind_lock:
            if self._config_bound is not None:
                return self._config_bound
        found = builtin_binding(self._aliases)
        if main.source == "reflection":
            try:
                fds = self._reflect_schema(self._config)
                if fds is not None:
                    reflected = bind(fds, "reflection (config-daemon)", self._aliases)
                    if "QueryStatus" in reflected.rpcs:
                        found = reflected
            except SchemaError as exc:
                log.warning("XDM config-daemon reflection unusable (%s); QueryStatus uses the reconstruction", exc)
        with self._bind_lock:
            self._config_bound = found
        return found

    def _judge(self, rpc: str, problems: list[str]) -> str:
        """Record (or clear) the guard finding of one decoded answer; return its text."""
        text = f"{MISMATCH_PREFIX}: " + "; ".join(problems) if problems else ""
        with self._bind_lock:
            previous = self._findings.get(rpc, ("", ""))[1]
            current = self._binding or self.last_binding
            if text:
                self._findings[rpc] = (current.digest if current is not None else "", text)
            else:
                self._findings.pop(rpc, None)
        if text and text != previous:
            source = self.last_binding.source if self.last_binding else self._schema
            log.error("%s (schema source: %s; set xdm_schema to XDM's official proto)", text, source)
        elif previous and not text:
            log.info("XDM %s answers plausibly again", rpc)
        return text

    def _refuse_if_mismatch(self) -> Binding:
        found = self.binding()
        finding = self.schema_finding()
        if finding:
            raise SchemaMismatch(finding)
        return found

    # ------------------------------------------------------------ public API
    def list_supported_xpu_types(self) -> list[str]:
        b = self.binding()
        return adapter.xpu_types(self._call(b, "ListSupportedXPUType", adapter.xpu_type_request(b)), b)

    def list_gpu_info(self, minors: tuple[int, ...] = ()) -> list[GpuFacts]:
        b = self.binding()
        facts = adapter.gpu_facts(self._call(b, "ListGpuInfo", adapter.list_gpu_info_request(minors, b)), b)
        finding = self._judge("ListGpuInfo", guards.facts_problems(facts))
        if finding:
            raise SchemaMismatch(finding)
        return facts

    def list_and_watch(self) -> Subscription[list[Card]]:
        """Subscribe once; each item is the complete card list (R12), judged by the guards."""
        b = self.binding()
        spec = self._spec(b, "ListAndWatch")
        path = spec.path or f"/{self.device_service(b)}/{spec.method}"

        def cards(msg: Message) -> list[Card]:
            found = adapter.cards_from_list_and_watch(msg, self.drift, b)
            finding = self._judge("ListAndWatch", guards.card_problems(found))
            if finding:
                return [replace(c, healthy=False, health_reason=finding) for c in found]
            return found

        return self._stream(path, spec, adapter.list_and_watch_request(b), cards)

    def allocate(self, request: GrantRequest) -> Grant:
        """Allocate and verify (R3/R4); on mismatch release at once and raise ``GrantMismatch``.

        Refused with ``SchemaMismatch`` before anything is sent while the
        schema is not trusted.
        """
        if not request.asks:
            raise ReservationRejected(f"allocation {request.grant_id} asks for no card")
        b = self._refuse_if_mismatch()
        message = adapter.allocate_request(request, self._encoding, b)
        # Any failure leaves the outcome to the caller: the Reserver keeps the intent until
        # XDM is seen not to hold the grant (nomad/reserve.py, ``outcome_known``).
        response = self._call(b, "Allocate", message, timeout=self._allocate_timeout)
        outcome = adapter.allocate_outcome(response, request.grant_id, b)
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
        b = self.binding()
        try:
            response = self._call(b, "Release", adapter.release_request(grant_id, b))
        except BackendRefused as exc:
            if is_not_found(exc):
                return
            raise
        status, text = adapter.inband_status(response, b.rpc("Release").response)
        refusal = inband_refusal(status, text, "Release")
        if refusal is not None and not is_not_found(refusal):
            raise refusal

    def exporter_get_data_list(
        self, devices: tuple[str, ...] = (), metric_ids: tuple[int, ...] = ()
    ) -> list[MetricSample]:
        b = self.binding()
        response = self._call(b, "ExporterGetDataList", adapter.exporter_data_request(devices, metric_ids, b))
        self._raise_inband(response, b, "ExporterGetDataList")
        return adapter.metric_samples(response, b)

    def exporter_data_stream(
        self, devices: tuple[str, ...] = (), metric_ids: tuple[int, ...] = ()
    ) -> Subscription[list[MetricSample]]:
        b = self.binding()
        spec = self._spec(b, "ExporterDataStream")
        path = spec.path
        if path is None:
            service = self._exporter_services.get(spec.method) or self._exporter_services.get(
                adapter.EXPORTER_GET_DATA_LIST.method
            )
            if service is None:
                self.exporter_get_data_list(devices, metric_ids)  # resolves the exporter service (R13)
                service = self._exporter_services.get(adapter.EXPORTER_GET_DATA_LIST.method, self.device_service(b))
            path = f"/{service}/{spec.method}"
        return self._stream(
            path, spec, adapter.exporter_data_request(devices, metric_ids, b), lambda m: adapter.metric_samples(m, b)
        )

    def exporter_get_config(self) -> ExporterConfig:
        b = self.binding()
        response = self._call(b, "ExporterGetConfig", adapter.exporter_get_config_request(b))
        self._raise_inband(response, b, "ExporterGetConfig")
        return adapter.exporter_config(response, b)

    def exporter_get_status(self) -> ExporterStatus:
        b = self.binding()
        return adapter.exporter_status(self._call(b, "ExporterGetStatus", adapter.exporter_get_status_request(b)), b)

    def query_status(self) -> RuntimeKitStatus:
        """config-daemon QueryStatus, from the bound schema when it has the config service,
        else the reconstruction (probing the config service name on first use)."""
        b = self._config_binding()
        spec = self._spec(b, "QueryStatus")
        if spec.path is not None:
            return adapter.runtime_kit_status(
                self._unary(self._config, spec.path, spec, adapter.query_status_request(b)), b
            )
        if self._config_service is not None:
            return adapter.runtime_kit_status(self._config_call(self._config_service, spec, b), b)
        last: BackendUnavailable | None = None
        for package in adapter.CONFIG_PACKAGE_CANDIDATES:
            service = adapter.qualified(package, adapter.CONFIG_SERVICE)
            try:
                response = self._config_call(service, spec, b)
            except BackendUnavailable as exc:
                if exc.kind != "unimplemented":
                    raise
                last = exc
                continue
            self._config_service = service
            log.info("XDM config service is %s", service)
            return adapter.runtime_kit_status(response, b)
        raise BackendUnavailable(
            f"no config service answers QueryStatus (tried {', '.join(adapter.CONFIG_PACKAGE_CANDIDATES)}): {last}",
            kind="unimplemented",
        )

    def device_service(self, b: Binding | None = None) -> str:
        """The fully-qualified device service name: the schema's, else probed once if not configured (R1).

        ``b``: the binding the caller already holds for this call (one restart check per call).
        """
        b = b if b is not None else self.binding()
        rpc = b.rpcs.get("ListAndWatch")
        if rpc is not None and rpc.path:
            return rpc.path.split("/")[1]
        with self._probe_lock:
            if self._device_service is None:
                self._device_service = self._probe_device_service()
                log.info("XDM device service is %s", self._device_service)
            return self._device_service

    def close(self) -> None:
        self._dp2mgr.reset()
        self._config.reset()

    # ------------------------------------------------------------ internals
    def _spec(self, b: Binding, method: str) -> RpcSpec:
        try:
            return adapter.spec(method, b)
        except KeyError:
            raise BackendUnavailable(
                f"XDM {method}: the bound schema ({b.source}) has no such RPC", kind="unimplemented"
            ) from None

    def _call(self, b: Binding, method: str, request: Message, timeout: float | None = None) -> Message:
        spec = self._spec(b, method)
        if spec.path is not None:
            return self._unary(self._dp2mgr, spec.path, spec, request, timeout)
        if spec.role == "exporter":
            return self._exporter_call(spec, request)
        service = self.device_service(b)
        try:
            return self._unary(self._dp2mgr, f"/{service}/{spec.method}", spec, request, timeout)
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

    def _config_call(self, service: str, spec: RpcSpec, b: Binding) -> Message:
        return self._unary(self._config, f"/{service}/{spec.method}", spec, adapter.query_status_request(b))

    def _unary(
        self, endpoint: _Endpoint, path: str, spec: RpcSpec, request: Message, timeout: float | None = None
    ) -> Message:
        deserialize = self._deserializer(spec)
        fn = endpoint.callable(
            f"{path}|{spec.response_type.DESCRIPTOR.full_name}|{id(spec.response_type)}",
            lambda ch: ch.unary_unary(path, request_serializer=adapter.serialize, response_deserializer=deserialize),
        )
        try:
            response: Message = fn(request, timeout=timeout or self._timeout, wait_for_ready=True)
        except grpc.RpcError as exc:
            raise self._classify(endpoint, exc, spec.method) from None
        return response

    def _stream(self, path: str, spec: RpcSpec, request: Message, convert: Callable[[Message], T]) -> Subscription[T]:
        deserialize = self._deserializer(spec)
        fn = self._dp2mgr.callable(
            f"{path}|{spec.response_type.DESCRIPTOR.full_name}|{id(spec.response_type)}",
            lambda ch: ch.unary_stream(path, request_serializer=adapter.serialize, response_deserializer=deserialize),
        )
        call = fn(request, wait_for_ready=False)
        return Subscription(call, convert, lambda exc: self._classify(self._dp2mgr, exc, spec.method))

    def _deserializer(self, spec: RpcSpec) -> Callable[[bytes], Message]:
        key = (spec.method, spec.response_type)
        fn = self._deserializers.get(key)
        if fn is None:
            fn = self._deserializers[key] = adapter.deserializer(spec, self.drift)
        return fn

    def _classify(self, endpoint: _Endpoint, exc: grpc.RpcError, method: str) -> PluginError:
        code, details = _code_and_details(exc)
        diagnosis = None
        if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
            diagnosis = socket_problem(endpoint.path)
            if diagnosis is not None:
                endpoint.reset()  # the daemon is gone: dial afresh once the socket is back
        if code == grpc.StatusCode.UNAVAILABLE or diagnosis is not None:
            self.invalidate_binding(f"{method}: {code}")  # XDM may come back with another schema
        error = classify_rpc_error(code, details, method, diagnosis)
        if isinstance(error, SchemaMismatch):
            self._judge(method, [str(error).removeprefix(f"{MISMATCH_PREFIX}: ")])
        return error

    def _raise_inband(self, response: Message, b: Binding, method: str) -> None:
        status, text = adapter.inband_status(response, b.rpc(method).response)
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


# gRPC codes that mean "XDM understood the request and said no".
REFUSAL_CODES = frozenset(
    {
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.ALREADY_EXISTS,
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.OUT_OF_RANGE,
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.UNAUTHENTICATED,
        grpc.StatusCode.UNKNOWN,
        grpc.StatusCode.DATA_LOSS,
    }
)
# Transport-level codes (retryable; the socket is diagnosed to say why). INTERNAL is one: gRPC
# reports a reset stream with it, and a broken transport, neither of which is XDM saying no.
TRANSPORT_CODES = frozenset(
    {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED, grpc.StatusCode.ABORTED, grpc.StatusCode.INTERNAL}
)

# grpcio reports a failing response deserializer like this (INTERNAL).
_DECODE_FAILURE = "Exception deserializing response"
# ...a stream the peer (or a proxy) reset like this (INTERNAL): "Received RST_STREAM with error code 2".
_STREAM_RESET = "RST_STREAM"
# ...and a message over the channel's receive limit like this (RESOURCE_EXHAUSTED).
_TOO_LARGE = "larger than max"
#: Bound of XDM text repeated in an error (a gRPC error travels in a header; the agent logs it).
MAX_DETAILS = 1024


class GrpcRefused(BackendRefused):
    """A refusal XDM expressed as a gRPC status code (``code`` keeps which)."""

    def __init__(self, message: str, code: grpc.StatusCode) -> None:
        super().__init__(message, status=_grpc_code_number(code))
        self.code = code


def socket_problem(path: str) -> BackendUnavailable | None:
    """Why ``path`` cannot be dialled right now, or None if a connect works.

    Checked before dialling and after a transport failure: a missing path, a
    path that is not a socket, a stale socket file (ECONNREFUSED) and EACCES
    each get their own kind.
    """
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return BackendUnavailable(f"XDM socket {path} does not exist (is XDM running?)", kind="socket-missing")
    except PermissionError:
        return BackendUnavailable(
            f"no permission to reach XDM socket {path} (XDM sockets are root-only)", "permission-denied"
        )
    except OSError as exc:
        return classify_errno(exc.errno or 0, path)
    if not stat.S_ISSOCK(mode):
        return BackendUnavailable(f"XDM socket path {path} exists but is not a socket", kind="socket-missing")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.settimeout(1.0)
        probe.connect(path)
    except OSError as exc:
        return classify_errno(exc.errno or 0, path)
    finally:
        probe.close()
    return None


def classify_errno(err: int, path: str) -> BackendUnavailable:
    """Map an OS error from reaching the socket to a ``BackendUnavailable``."""
    if err in (errno.ENOENT, errno.ENOTDIR):
        return BackendUnavailable(f"XDM socket {path} does not exist (is XDM running?)", kind="socket-missing")
    if err == errno.ECONNREFUSED:
        return BackendUnavailable(
            f"XDM socket {path} refuses connections: a stale socket file, the XDM daemon is down",
            kind="connection-refused",
        )
    if err in (errno.EACCES, errno.EPERM):
        return BackendUnavailable(
            f"no permission to connect to XDM socket {path} (XDM sockets are root-only; run the plugin as root)",
            kind="permission-denied",
        )
    if err in (errno.ETIMEDOUT, errno.EAGAIN):
        return BackendUnavailable(f"connecting to XDM socket {path} timed out", kind="timeout")
    return BackendUnavailable(f"cannot connect to XDM socket {path}: {os.strerror(err)}", kind="unavailable")


def classify_rpc_error(
    code: grpc.StatusCode | None, details: str, method: str, diagnosis: BackendUnavailable | None
) -> PluginError:
    """Map a failed call to a plugin error. ``diagnosis`` is ``socket_problem``'s verdict."""
    where = f"XDM {method}"
    details = printable(details, MAX_DETAILS)
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED and _TOO_LARGE in details:
        return BackendUnavailable(
            f"{where}: XDM's message is over the plugin's receive limit ({details}); a 16-card node needs far "
            "less, so XDM's answer is malformed or the schema binding is wrong",
            kind="message-too-large",
        )
    if code == grpc.StatusCode.INTERNAL and _STREAM_RESET in details:
        return BackendUnavailable(f"{where} unavailable: the stream was reset ({details})", kind="unavailable")
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED) and diagnosis is not None:
        return diagnosis
    if code == grpc.StatusCode.UNIMPLEMENTED:
        return BackendUnavailable(
            f"{where} is not implemented by XDM ({details}): proto package/service name or schema mismatch",
            kind="unimplemented",
        )
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return BackendUnavailable(f"{where} timed out ({details})", kind="timeout")
    if code == grpc.StatusCode.INTERNAL and _DECODE_FAILURE in details:
        return SchemaMismatch(f"XDM schema mismatch: {where}: the response does not decode with the bound schema")
    if code in TRANSPORT_CODES or code is None:
        return BackendUnavailable(f"{where} unavailable: {details or code}", kind="unavailable")
    if code in REFUSAL_CODES:
        return GrpcRefused(details or f"{where} failed with {code.name}", code)
    return BackendUnavailable(f"{where} failed: {code}: {details}", kind="unavailable")


def inband_refusal(status: int, message: str, method: str) -> BackendRefused | None:
    """XDM's in-band ``status``/``message``: 0 is success, anything else a refusal."""
    if status == 0:
        return None
    return BackendRefused(printable(message, MAX_DETAILS) or f"XDM {method} returned status {status}", status=status)


def is_not_found(error: BackendRefused) -> bool:
    """Did XDM refuse because the thing does not exist (Release idempotency, R6)?

    A gRPC refusal counts only when its code is NOT_FOUND. In-band codes are
    undocumented, so an in-band refusal counts when its message says the id is
    unknown (the one place the plugin reads XDM's message text; documented in
    docs/xdm-risks.md, R6).
    """
    if isinstance(error, GrpcRefused):
        return error.code == grpc.StatusCode.NOT_FOUND
    text = str(error).lower()
    return any(
        marker in text
        for marker in ("not found", "not exist", "no such", "no allocation", "unknown allocation", "unknown id")
    )


def _grpc_code_number(code: grpc.StatusCode) -> int:
    value = code.value[0]
    return int(value)
