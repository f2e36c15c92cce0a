"""Nomad's DevicePlugin service: a thin adapter onto ``PluginApp`` (§5).

All device logic lives behind ``PluginApp.fingerprints/reserve/stats``; this
module only enforces Nomad's stream rules and maps errors to gRPC codes:

* Fingerprint and Stats never end or fail while the call is active: Nomad
  treats a closed stream as a plugin failure. If the engine's iterator
  raises or runs dry we log it and start it again after a backoff.
* The call's cancellation (or the plugin's shutdown) sets the Event the
  engine waits on, so the worker thread is released at once.
* Reserve always carries ``container_res`` (Nomad dereferences it).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import TypeVar

import grpc

from nomad_plugin._proto.nomad import device_pb2, device_pb2_grpc
from nomad_plugin.goplugin.lifecycle import Lifecycle
from nomad_plugin.goplugin.logging import get_logger
from nomad_plugin.journal.datadir import DataDirRefused
from nomad_plugin.journal.store import JournalFull
from nomad_plugin.model.errors import (
    BackendRefused,
    BackendUnavailable,
    ConfigError,
    GrantMismatch,
    PluginError,
    ReservationRejected,
)
from nomad_plugin.nomad.container import GrantRejected
from nomad_plugin.nomad.ports import DeviceEngines
from nomad_plugin.nomad.reserve import JournalWriteFailed
from nomad_plugin.util.text import printable
from nomad_plugin.util.threads import Backoff

DEFAULT_STATS_INTERVAL = 1.0  # seconds, when Nomad sends no or a zero interval
MIN_STATS_INTERVAL = 0.1  # never spin faster than this

T = TypeVar("T")
log = get_logger("device")


#: Bound of an error's text: it travels in a gRPC trailer (gRPC's metadata limit is 8-16 KiB) and
#: lands in Nomad's task events and agent log; a Reserve of 10,000 IDs once made one of 59,000 chars.
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
    """The gRPC code and message (one line, bounded) Nomad gets for an engine error."""
    code, message = _status_for(exc)
    return code, printable(message, MAX_ERROR_TEXT)


def _status_for(exc: BaseException) -> tuple[grpc.StatusCode, str]:
    """The code that means it.

    INVALID_ARGUMENT: Nomad's device IDs or the config are wrong. UNAVAILABLE:
    XDM, the journal or the owner lock cannot be had now (a stream reset
    included); retrying may work. XDM's own refusal: its code when it sent one,
    else FAILED_PRECONDITION. FAILED_PRECONDITION too for a grant the plugin
    refuses (it does not match the request, or breaks the content policy: the
    request was valid, XDM's answer was not) and for a data_dir the plugin
    cannot own; RESOURCE_EXHAUSTED for a full journal. INTERNAL only for a bug.
    """
    if isinstance(exc, (ReservationRejected, ConfigError)):
        return grpc.StatusCode.INVALID_ARGUMENT, str(exc)
    if isinstance(exc, BackendUnavailable):
        return grpc.StatusCode.UNAVAILABLE, str(exc)
    if isinstance(exc, BackendRefused):
        code = getattr(exc, "code", None)  # xdm.errors.GrpcRefused: the code XDM answered with
        return (code if code in PASSED_ON else grpc.StatusCode.FAILED_PRECONDITION), str(exc)
    if isinstance(exc, (GrantMismatch, GrantRejected, DataDirRefused)):
        return grpc.StatusCode.FAILED_PRECONDITION, str(exc)
    if isinstance(exc, JournalFull):
        return grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc)
    if isinstance(exc, JournalWriteFailed):
        return grpc.StatusCode.UNAVAILABLE, str(exc)
    if isinstance(exc, PluginError):
        return grpc.StatusCode.INTERNAL, str(exc)
    return grpc.StatusCode.INTERNAL, f"internal error: {type(exc).__name__}: {exc}"


def stats_interval(request: device_pb2.StatsRequest) -> float:
    if not request.HasField("collection_interval"):
        return DEFAULT_STATS_INTERVAL
    seconds = request.collection_interval.seconds + request.collection_interval.nanos / 1e9
    if seconds <= 0:
        return DEFAULT_STATS_INTERVAL
    return max(MIN_STATS_INTERVAL, seconds)


class DeviceService(device_pb2_grpc.DevicePluginServicer):
    def __init__(self, app: DeviceEngines, lifecycle: Lifecycle, retry: Callable[[], Backoff] = Backoff) -> None:
        self._app = app
        self._lifecycle = lifecycle
        self._retry = retry

    def Fingerprint(
        self, request: device_pb2.FingerprintRequest, context: grpc.ServicerContext
    ) -> Iterator[device_pb2.FingerprintResponse]:
        return self._keep_open("fingerprint", self._app.fingerprints, context)

    def Stats(  # type: ignore[override]  # may yield bytes: registered by add_device_service
        self, request: device_pb2.StatsRequest, context: grpc.ServicerContext
    ) -> Iterator[device_pb2.StatsResponse | bytes]:
        """Responses as messages, or as bytes already serialised (see ``add_device_service``)."""
        interval = stats_interval(request)
        serialized = getattr(self._app, "stats_bytes", None)
        if serialized is not None:
            return self._keep_open("stats", lambda cancel: serialized(interval, cancel), context)
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


def _stats_bytes(response: device_pb2.StatsResponse | bytes) -> bytes:
    return response if isinstance(response, bytes) else response.SerializeToString()


def add_device_service(servicer: DeviceService, server: grpc.Server) -> None:
    """``add_DevicePluginServicer_to_server``, except that Stats may yield pre-serialised bytes.

    The stats engine assembles each response as bytes (``stats/assemble.py``);
    handing them to gRPC as they are saves parsing and re-encoding up to
    megabytes every second.
    """
    handlers = {
        "Fingerprint": grpc.unary_stream_rpc_method_handler(
            servicer.Fingerprint,
            request_deserializer=device_pb2.FingerprintRequest.FromString,
            response_serializer=device_pb2.FingerprintResponse.SerializeToString,
        ),
        "Reserve": grpc.unary_unary_rpc_method_handler(
            servicer.Reserve,
            request_deserializer=device_pb2.ReserveRequest.FromString,
            response_serializer=device_pb2.ReserveResponse.SerializeToString,
        ),
        "Stats": grpc.unary_stream_rpc_method_handler(
            servicer.Stats,
            request_deserializer=device_pb2.StatsRequest.FromString,
            response_serializer=_stats_bytes,
        ),
    }
    service = device_pb2.DESCRIPTOR.services_by_name["DevicePlugin"].full_name
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service, handlers),))
    register = getattr(server, "add_registered_method_handlers", None)  # grpcio >= 1.63; not in the stubs
    if register is not None:
        register(service, handlers)
