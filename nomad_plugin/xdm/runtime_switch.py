"""config-daemon's Enable, Disable and QueryStatus, for the operator's ``runtime-kit`` command only.

The plugin never switches Runtime Kit (R14: it may restart containerd or flip node features); only
``cli/runtime_kit.py`` imports this module (``tests/hardening/test_layers.py``). Under the
reconstruction the service is probed with the read-only QueryStatus, and QueryStatus judges the
outcome, so a missing or misread ``success`` field cannot pass a failure off. A status that the bound
schema cannot vouch for (``RuntimeKitStatus.doubt``) is never switched on: the node may already be as asked.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import grpc
from google.protobuf.message import Message

from nomad_plugin.config.model import PluginConfig
from nomad_plugin.model.errors import BackendRefused, PluginError, SchemaMismatch
from nomad_plugin.xdm import adapter, binder, guesses
from nomad_plugin.xdm.adapter import RuntimeKitStatus
from nomad_plugin.xdm.binder import MISMATCH_PREFIX, SWITCH_RPCS, Binding, FileSet, Rpc
from nomad_plugin.xdm.client import CONFIG_LABEL, Endpoint

log = logging.getLogger(__name__)

SWITCH_TIMEOUT_S = 120.0  # Enable and Disable may restart services on the node: wait long (R14)


@dataclass(frozen=True)
class SwitchOutcome:
    """What one Enable or Disable did: XDM's answer, and the status before and after."""

    action: str
    before: RuntimeKitStatus
    after: RuntimeKitStatus
    success: bool | None = None  # the answer's ``success``; None when the schema has none or cannot read it
    message: str = ""

    @property
    def done(self) -> bool:
        """The node is now as asked (QueryStatus says so, under a schema that reads it)."""
        return not self.after.doubt and self.after.enabled == (self.action == "Enable")


class RuntimeKitSwitch:
    def __init__(self, config: PluginConfig, timeout: float = SWITCH_TIMEOUT_S) -> None:
        self.path = config.config_socket
        self.schema = config.xdm_schema.strip() or "auto"
        self.aliases = tuple(config.xdm_field_aliases)
        self.query_timeout = max(1.0, float(config.xdm_call_timeout))
        self.switch_timeout = timeout
        self._endpoint = Endpoint(self.path)
        self._binding: Binding | None = None
        self._service: str | None = None  # probed, under the reconstruction

    def status(self) -> RuntimeKitStatus:
        return adapter.runtime_kit_status(self._call("QueryStatus", self.query_timeout), self.binding())

    def switch(self, action: str) -> SwitchOutcome:
        """Call ``action`` unless the status already is the wanted one; then read the status again.
        ``SchemaMismatch``, nothing sent, while the status is unknown."""
        if action not in ("Enable", "Disable"):
            raise ValueError(f"action: {action!r} is not Enable or Disable")
        before = self.status()
        if before.doubt:
            raise SchemaMismatch(f"{MISMATCH_PREFIX}: Runtime Kit's status is unknown, because {before.doubt}")
        if before.enabled == (action == "Enable"):
            return SwitchOutcome(action, before, before)  # nothing sent
        response = self.binding().rpc(action).response
        log.info("calling config-daemon %s on %s", action, self.path)
        answer = self._call(action, self.switch_timeout)
        fits = self.binding().source != "builtin" or not adapter.unknown_fields(answer)  # else success is misread
        success = bool(response.read["success"](answer)) if response.has("success") and fits else None
        message = str(response.read["message"](answer)) if response.has("message") and fits else ""
        return SwitchOutcome(action, before, self.status(), success, message)

    def describe(self) -> str:
        """Where the calls go: socket, service and schema source."""
        b = self._binding
        where = self._path(b, "QueryStatus").rsplit("/", 1)[0].strip("/") if b is not None else "?"
        return f"{self.path} ({where}, schema {b.source if b is not None else self.schema})"

    def close(self) -> None:
        self._endpoint.reset()

    def binding(self) -> Binding:
        if self._binding is None:
            found = binder.choose(
                self.schema,
                self.aliases,
                self._reflect,
                f"config-daemon does not serve gRPC server reflection on {self.path}",
                rpcs=SWITCH_RPCS,
                needs=("QueryStatus",),
                label=CONFIG_LABEL,
            )
            missing = [m for m, _, _ in SWITCH_RPCS if m not in found.rpcs]
            if missing:
                raise SchemaMismatch(
                    f"{MISMATCH_PREFIX}: config-daemon's schema ({found.source}) has no {', '.join(missing)} RPC"
                )
            self._binding = found
        return self._binding

    def _reflect(self) -> FileSet | None:
        try:
            return binder.reflect(self._endpoint.get(), timeout=self.query_timeout)
        except grpc.RpcError as exc:
            raise self._classify(exc, "ServerReflectionInfo") from None

    def _path(self, b: Binding, method: str) -> str:
        return b.rpc(method).path or f"/{self._service or '?'}/{method}"

    def _call(self, method: str, timeout: float) -> Message:
        b = self.binding()
        if b.rpc(method).path is None and self._service is None:
            query = b.rpc("QueryStatus")  # it changes nothing: safe to send to a wrong guess
            self._service, answer = guesses.probe(
                guesses.config_services(),
                lambda s: self._unary(f"/{s}/QueryStatus", query, self.query_timeout),
                f"config-daemon QueryStatus on {self.path}",
            )
            if isinstance(answer, BackendRefused):
                raise answer
        return self._unary(self._path(b, method), b.rpc(method), timeout)

    def _unary(self, path: str, rpc: Rpc, timeout: float) -> Message:
        call = self._endpoint.get().unary_unary(
            path, request_serializer=adapter.serialize, response_deserializer=rpc.response.cls.FromString
        )
        try:
            answer: Message = call(rpc.request.new(), timeout=timeout, wait_for_ready=True)
        except grpc.RpcError as exc:
            raise self._classify(exc, rpc.method) from None
        return answer

    def _classify(self, exc: grpc.RpcError, method: str) -> PluginError:
        return self._endpoint.classify(exc, f"config-daemon {method}")[0]
