"""Nomad's plugin services, BasePlugin and DevicePlugin: adapters from gRPC onto two narrow ports.

``ConfigTarget`` and ``DeviceEngines`` are what the services need; ``app.PluginApp``
satisfies both and ``app.NomadDevicePlugin`` hands it over (docs/architecture.md).

Nomad calls PluginInfo, ConfigSchema and SetConfig on every launch, SetConfig
possibly several times with the same bytes (so it is idempotent); a config
error is INVALID_ARGUMENT, which makes Nomad refuse to start with our message.
Fingerprint and Stats never end while the call is active (Nomad treats a closed
stream as a plugin failure: ``handleFingerprintError`` in
``client/devicemanager/instance.go``): an engine iterator that raises or runs
dry is restarted after a backoff. Reserve always carries ``container_res``
(Nomad dereferences it).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Protocol, TypeVar

import grpc

from nomad_plugin import PLUGIN_NAME, __version__
from nomad_plugin._proto.nomad import base_pb2, base_pb2_grpc, device_pb2, device_pb2_grpc
from nomad_plugin.config.model import ConfigError, PluginConfig
from nomad_plugin.config.options import config_spec
from nomad_plugin.journal.datadir import DataDirRefused
from nomad_plugin.journal.store import JournalFull
from nomad_plugin.model.errors import (
    BackendRefused,
    BackendUnavailable,
    GrantMismatch,
    PluginError,
    ReservationRejected,
)
from nomad_plugin.nomad.container import GrantRejected
from nomad_plugin.nomad.reserve import AfterReply, JournalWriteFailed
from nomad_plugin.util.text import printable
from nomad_plugin.util.threads import Backoff


class ConfigTarget(Protocol):
    """Judges SetConfig's bytes and takes the config it accepts."""

    def accept_config(self, msgpack_config: bytes) -> PluginConfig:
        """The validated config, or ``ConfigError``: the verdict ``doctor`` gives too."""

    def set_config(self, config: PluginConfig) -> None:
        """Apply an accepted config (idempotent; raises a ``PluginError`` to refuse)."""


class DeviceEngines(Protocol):
    """The three DevicePlugin calls, as plain iterators and values."""

    def fingerprints(self, cancel: threading.Event) -> Iterator[device_pb2.FingerprintResponse]: ...

    def reserve(
        self, device_ids: Sequence[str], after_reply: AfterReply | None = None
    ) -> device_pb2.ReserveResponse: ...

    def stats(self, interval: float, cancel: threading.Event) -> Iterator[device_pb2.StatsResponse]: ...


DEVICE_API_VERSION = "v0.1.0"
# go-version equality: Nomad may echo either spelling back in SetConfig.
ACCEPTED_API_VERSIONS = frozenset({DEVICE_API_VERSION, DEVICE_API_VERSION.lstrip("v")})

log = logging.getLogger(__name__)


class Streams(Protocol):
    """The transport's register of open streams: each ends when the plugin is told to stop."""

    def open_stream(self, context: grpc.ServicerContext) -> threading.Event: ...

    def close_stream(self, cancel: threading.Event) -> None: ...


class BaseService(base_pb2_grpc.BasePluginServicer):
    """``apply_logging`` hands an accepted config's log level and secrets to the composition root's
    log handler before the config is applied."""

    def __init__(self, app: ConfigTarget, apply_logging: Callable[[PluginConfig], None]) -> None:
        self._app = app
        self._apply_logging = apply_logging
        self._lock = threading.Lock()
        self._applied: PluginConfig | None = None

    def PluginInfo(
        self, request: base_pb2.PluginInfoRequest, context: grpc.ServicerContext
    ) -> base_pb2.PluginInfoResponse:
        return base_pb2.PluginInfoResponse(
            type=base_pb2.DEVICE, plugin_api_versions=[DEVICE_API_VERSION], plugin_version=__version__, name=PLUGIN_NAME
        )

    def ConfigSchema(
        self, request: base_pb2.ConfigSchemaRequest, context: grpc.ServicerContext
    ) -> base_pb2.ConfigSchemaResponse:
        return base_pb2.ConfigSchemaResponse(spec=config_spec())

    def SetConfig(
        self, request: base_pb2.SetConfigRequest, context: grpc.ServicerContext
    ) -> base_pb2.SetConfigResponse:
        version = request.plugin_api_version
        if version and version not in ACCEPTED_API_VERSIONS:
            context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"plugin_api_version {version[:40]!r} is not supported; allowed: {DEVICE_API_VERSION}",
            )
        try:
            config = self._app.accept_config(request.msgpack_config)
        except ConfigError as exc:
            log.error("rejected configuration: %s", exc)
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        with self._lock:
            self._apply_logging(config)
            changed = self._applied != config
            try:
                self._app.set_config(config)
            except Exception as exc:
                code, message = grpc_status_for(exc)
                log.error("configuration not applied: %s", message, exc_info=code is grpc.StatusCode.INTERNAL)
                failure: tuple[grpc.StatusCode, str] | None = (code, message)
            else:
                failure = None
                self._applied = config
        if failure is not None:
            context.abort(*failure)
        if changed:
            log.info(
                "configuration applied",
                extra={
                    "fields": {
                        "backend": config.backend,
                        "default_mode": config.default_mode,
                        "cards": len(config.cards),
                    }
                },
            )
        return base_pb2.SetConfigResponse()


DEFAULT_STATS_INTERVAL = 1.0  # seconds, when Nomad sends no or a zero interval
MIN_STATS_INTERVAL = 0.1  # never spin faster than this

T = TypeVar("T")


#: Bound of an error's text: it travels in a gRPC trailer (gRPC's metadata limit is 8-16 KiB) and
#: lands in Nomad's task events and agent log, whatever Nomad sent.
MAX_ERROR_TEXT = 4000
#: XDM's own gRPC refusals, passed on with their code: each already says what is wrong.
PASSED_ON = frozenset(
    {
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.ALREADY_EXISTS,
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.OUT_OF_RANGE,
        grpc.StatusCode.UNAUTHENTICATED,
    }
)


def grpc_status_for(exc: BaseException) -> tuple[grpc.StatusCode, str]:
    """The gRPC code and message (one line, bounded) Nomad gets for an engine error.

    INVALID_ARGUMENT: the request or config is wrong; UNAVAILABLE: retrying may work; XDM's
    refusal keeps its code; FAILED_PRECONDITION: a grant the plugin refuses; INTERNAL: a bug.
    """
    message = str(exc)
    if isinstance(exc, (ReservationRejected, ConfigError)):
        code = grpc.StatusCode.INVALID_ARGUMENT
    elif isinstance(exc, (BackendUnavailable, JournalWriteFailed)):
        code = grpc.StatusCode.UNAVAILABLE
    elif isinstance(exc, BackendRefused):
        answered = getattr(exc, "code", None)  # xdm.client.GrpcRefused: the code XDM answered with
        code = answered if answered in PASSED_ON else grpc.StatusCode.FAILED_PRECONDITION
    elif isinstance(exc, (GrantMismatch, GrantRejected, DataDirRefused)):
        code = grpc.StatusCode.FAILED_PRECONDITION
    elif isinstance(exc, JournalFull):
        code = grpc.StatusCode.RESOURCE_EXHAUSTED
    else:
        code = grpc.StatusCode.INTERNAL
        if not isinstance(exc, PluginError):
            message = f"internal error: {type(exc).__name__}: {exc}"
    return code, printable(message, MAX_ERROR_TEXT)


def stats_interval(request: device_pb2.StatsRequest) -> float:
    if not request.HasField("collection_interval"):
        return DEFAULT_STATS_INTERVAL
    seconds = request.collection_interval.seconds + request.collection_interval.nanos / 1e9
    if seconds <= 0:
        return DEFAULT_STATS_INTERVAL
    return max(MIN_STATS_INTERVAL, seconds)


class DeviceService(device_pb2_grpc.DevicePluginServicer):
    def __init__(self, app: DeviceEngines, lifecycle: Streams, retry: Callable[[], Backoff] = Backoff) -> None:
        self._app = app
        self._lifecycle = lifecycle
        self._retry = retry

    def Fingerprint(
        self, request: device_pb2.FingerprintRequest, context: grpc.ServicerContext
    ) -> Iterator[device_pb2.FingerprintResponse]:
        return self._keep_open("fingerprint", self._app.fingerprints, context)

    def Stats(
        self, request: device_pb2.StatsRequest, context: grpc.ServicerContext
    ) -> Iterator[device_pb2.StatsResponse]:
        interval = stats_interval(request)
        return self._keep_open("stats", lambda cancel: self._app.stats(interval, cancel), context)

    def Reserve(self, request: device_pb2.ReserveRequest, context: grpc.ServicerContext) -> device_pb2.ReserveResponse:
        device_ids = list(request.device_ids)
        try:
            response = self._app.reserve(device_ids, context.add_callback)
        except Exception as exc:
            code, message = grpc_status_for(exc)
            log.error(
                "reserve failed: %s",
                message,
                exc_info=code is grpc.StatusCode.INTERNAL,
                extra={"fields": {"device_ids": device_ids, "code": code.name}},
            )
            context.abort(code, message)
        if not response.HasField("container_res"):
            response.container_res.SetInParent()
        return response

    def _keep_open(
        self, kind: str, open_engine: Callable[[threading.Event], Iterator[T]], context: grpc.ServicerContext
    ) -> Iterator[T]:
        cancel = self._lifecycle.open_stream(context)
        backoff = self._retry()
        try:
            while not cancel.is_set():
                try:
                    for item in open_engine(cancel):
                        yield item
                        backoff.reset()
                    if cancel.is_set():
                        break
                    log.warning("%s engine stream ended while Nomad still listens; restarting it", kind)
                except Exception as exc:
                    log.error("%s engine stream failed; restarting it: %s", kind, exc, exc_info=True)
                cancel.wait(backoff.next_delay())
        finally:
            self._lifecycle.close_stream(cancel)
