"""config-daemon's Enable, Disable and QueryStatus, for the operator's ``runtime-kit`` command only.

The plugin never switches Runtime Kit (R14: it may restart containerd or
flip node features): ``XdmClient`` has no such method and the plugin's
schema bindings hold no Enable or Disable RPC. This module is the one place
that can call them, and only ``cli/runtime_kit.py`` imports it
(``tests/hardening/test_layers.py`` checks that). Like the Controller's Job
Agent on Kubernetes, it is run by a person or a sysbatch job, once.

The schema is bound as the plugin binds it (``xdm_schema``): config-daemon's
own reflection, the operator's official proto, or the reconstruction, whose
service name is then probed with the read-only QueryStatus, never with a
call that changes anything. Enable and Disable get a long deadline (R14:
they may take a while); the result is judged by QueryStatus afterwards, so a
``success`` field the schema lacks (or a wrong guess of it) cannot make a
failure look like success.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf.message import Message

from nomad_plugin.config.model import PluginConfig
from nomad_plugin.goplugin.logging import get_logger
from nomad_plugin.model.errors import BackendUnavailable, PluginError, SchemaMismatch
from nomad_plugin.xdm import adapter, binder
from nomad_plugin.xdm.adapter import RuntimeKitStatus
from nomad_plugin.xdm.binder import MISMATCH_PREFIX, SWITCH_RPCS, Binding, SchemaError, bind, builtin_set
from nomad_plugin.xdm.client import CHANNEL_OPTIONS, classify_rpc_error, socket_problem

log = get_logger(__name__)

#: Enable/Disable may restart services on the node: wait long (R14).
SWITCH_TIMEOUT_S = 120.0
ACTIONS = ("Enable", "Disable")


@dataclass(frozen=True)
class SwitchOutcome:
    """What one Enable or Disable did: XDM's answer and the status before and after."""

    action: str  # "Enable" or "Disable"
    before: RuntimeKitStatus
    after: RuntimeKitStatus
    called: bool  # False when the status already was the wanted one (nothing sent)
    success: bool | None = None  # the answer's ``success``; None when the schema has no such field
    message: str = ""

    @property
    def wanted(self) -> bool:
        return self.action == "Enable"

    @property
    def done(self) -> bool:
        """The node is now as asked (QueryStatus says so)."""
        return self.after.enabled == self.wanted


class RuntimeKitSwitch:
    def __init__(self, config: PluginConfig, timeout: float = SWITCH_TIMEOUT_S) -> None:
        self.path = config.config_socket
        self.schema = config.xdm_schema.strip() or "auto"
        self.aliases = dict(config.xdm_field_aliases)
        self.query_timeout = max(1.0, float(config.xdm_call_timeout))
        self.switch_timeout = timeout
        self._channel: grpc.Channel | None = None
        self._binding: Binding | None = None
        self._service: str | None = None
        self._lock = threading.Lock()

    # ------------------------------------------------------------ public
    def status(self) -> RuntimeKitStatus:
        b = self.binding()
        read = b.rpc("QueryStatus").response.read
        msg = self._call("QueryStatus", b.rpc("QueryStatus").request.new(), self.query_timeout)
        return RuntimeKitStatus(bool(read["enabled"](msg)), str(read["message"](msg)))

    def enable(self) -> SwitchOutcome:
        return self.switch("Enable")

    def disable(self) -> SwitchOutcome:
        return self.switch("Disable")

    def switch(self, action: str) -> SwitchOutcome:
        """Call ``action`` unless the status already is the wanted one; then read the status again."""
        if action not in ACTIONS:
            raise ValueError(f"action: {action!r} is not Enable or Disable")
        before = self.status()
        if before.enabled == (action == "Enable"):
            return SwitchOutcome(action, before, before, called=False)
        b = self.binding()
        rpc = b.rpc(action)
        log.info("calling config-daemon %s on %s", action, self.path)
        answer = self._call(action, rpc.request.new(), self.switch_timeout)
        success = bool(rpc.response.read["success"](answer)) if rpc.response.has("success") else None
        message = str(rpc.response.read["message"](answer)) if rpc.response.has("message") else ""
        return SwitchOutcome(action, before, self.status(), True, success, message)

    def describe(self) -> str:
        """Where the calls go: socket, schema source and service."""
        b = self._binding
        where = self._paths(b)["QueryStatus"].rsplit("/", 1)[0].strip("/") if b is not None else "?"
        return f"{self.path} ({where}, schema {b.source if b is not None else self.schema})"

    def close(self) -> None:
        with self._lock:
            channel, self._channel = self._channel, None
        if channel is not None:
            channel.close()

    # ------------------------------------------------------------ binding
    def binding(self) -> Binding:
        if self._binding is not None:
            return self._binding
        found = self._bind()
        missing = [m for m, _, _ in SWITCH_RPCS if m not in found.rpcs]
        if missing:
            raise SchemaMismatch(
                f"{MISMATCH_PREFIX}: config-daemon's schema ({found.source}) has no {', '.join(missing)} RPC"
            )
        self._binding = found
        return found

    def _bind(self) -> Binding:
        try:
            if self.schema == "builtin":
                return bind(builtin_set(), "builtin", self.aliases, probe_service=True, rpcs=SWITCH_RPCS)
            if binder.is_path(self.schema):
                return bind(binder.load_path(self.schema), self.schema, self.aliases, rpcs=SWITCH_RPCS)
            try:
                fds = binder.reflect(self._get_channel(), timeout=self.query_timeout)
            except grpc.RpcError as exc:
                raise self._classify(exc, "ServerReflectionInfo") from None
            if fds is None:
                if self.schema == "reflection":
                    raise SchemaMismatch(
                        f'{MISMATCH_PREFIX}: xdm_schema is "reflection" but config-daemon does not serve gRPC '
                        f"server reflection on {self.path}"
                    )
                return bind(builtin_set(), "builtin", self.aliases, probe_service=True, rpcs=SWITCH_RPCS)
            found = bind(fds, "reflection (config-daemon)", self.aliases, rpcs=SWITCH_RPCS)
            if self.schema == "auto" and "QueryStatus" not in found.rpcs:
                return bind(builtin_set(), "builtin", self.aliases, probe_service=True, rpcs=SWITCH_RPCS)
            return found
        except SchemaError as exc:
            raise SchemaMismatch(f"{MISMATCH_PREFIX}: {exc}") from None

    def _paths(self, b: Binding) -> dict[str, str]:
        """Method -> wire path: the schema's, or the probed service's (the reconstruction)."""
        service = self._service or adapter.qualified(adapter.CONFIG_PACKAGE, adapter.CONFIG_SERVICE)
        return {m: b.rpc(m).path or f"/{service}/{m}" for m in b.rpcs}

    def _probe_service(self, b: Binding) -> None:
        """Find the config service name with QueryStatus only (it changes nothing)."""
        last: PluginError | None = None
        request = b.rpc("QueryStatus").request
        for package in adapter.CONFIG_PACKAGE_CANDIDATES:
            service = adapter.qualified(package, adapter.CONFIG_SERVICE)
            try:
                self._raw_call(f"/{service}/QueryStatus", "QueryStatus", request.new(), self.query_timeout)
            except BackendUnavailable as exc:
                if exc.kind != "unimplemented":
                    raise
                last = exc
                continue
            self._service = service
            return
        raise BackendUnavailable(
            f"no config service answers QueryStatus on {self.path} (tried "
            f"{', '.join(adapter.CONFIG_PACKAGE_CANDIDATES)}): {last}",
            kind="unimplemented",
        )

    # ------------------------------------------------------------ calls
    def _get_channel(self) -> grpc.Channel:
        with self._lock:
            if self._channel is None:
                problem = socket_problem(self.path)
                if problem is not None:
                    raise problem
                self._channel = grpc.insecure_channel(f"unix://{self.path}", options=list(CHANNEL_OPTIONS))
            return self._channel

    def _call(self, method: str, request: Message, timeout: float) -> Message:
        b = self.binding()
        if b.rpc(method).path is None and self._service is None:
            self._probe_service(b)
        return self._raw_call(self._paths(b)[method], method, request, timeout)

    def _raw_call(self, path: str, method: str, request: Message, timeout: float) -> Message:
        b = self.binding()
        response_cls = b.rpc(method).response.cls
        fn = self._get_channel().unary_unary(
            path, request_serializer=adapter.serialize, response_deserializer=response_cls.FromString
        )
        try:
            answer: Message = fn(request, timeout=timeout, wait_for_ready=True)
        except grpc.RpcError as exc:
            raise self._classify(exc, method) from None
        return answer

    def _classify(self, exc: grpc.RpcError, method: str) -> PluginError:
        code: Any = exc.code() if callable(getattr(exc, "code", None)) else None
        details = exc.details() if callable(getattr(exc, "details", None)) else str(exc)
        diagnosis = (
            socket_problem(self.path)
            if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
            else None
        )
        return classify_rpc_error(code, str(details or ""), f"config-daemon {method}", diagnosis)
