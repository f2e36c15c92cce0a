"""go-plugin's own services: GRPCController, GRPCStdio and GRPCBroker (§1.6.1, §1.7).

Nomad's client calls Shutdown when it kills the plugin, opens StreamStdio once
at connect time and StartStream (broker) in the background. Nomad never
syncs stdio or dials the broker, so both streams just stay open, sending
nothing, until the call is cancelled or the plugin stops.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import grpc
from google.protobuf import empty_pb2

from nomad_plugin._proto.goplugin import (
    grpc_broker_pb2,
    grpc_broker_pb2_grpc,
    grpc_controller_pb2,
    grpc_controller_pb2_grpc,
    grpc_stdio_pb2,
    grpc_stdio_pb2_grpc,
)
from nomad_plugin.goplugin.lifecycle import Lifecycle

log = logging.getLogger(__name__)


def _hold_open(lifecycle: Lifecycle, context: grpc.ServicerContext) -> None:
    cancel = lifecycle.open_stream(context)
    try:
        cancel.wait()
    finally:
        lifecycle.close_stream(cancel)


class Controller(grpc_controller_pb2_grpc.GRPCControllerServicer):
    def __init__(self, lifecycle: Lifecycle) -> None:
        self._lifecycle = lifecycle

    def Shutdown(self, request: grpc_controller_pb2.Empty, context: grpc.ServicerContext) -> grpc_controller_pb2.Empty:
        # Reply first: serve's main thread sees the stop request and tears
        # the server down with a grace period that lets this reply go out.
        log.debug("shutdown requested by the host")
        self._lifecycle.request_stop("GRPCController.Shutdown")
        return grpc_controller_pb2.Empty()


class Stdio(grpc_stdio_pb2_grpc.GRPCStdioServicer):
    def __init__(self, lifecycle: Lifecycle) -> None:
        self._lifecycle = lifecycle

    def StreamStdio(
        self, request: empty_pb2.Empty, context: grpc.ServicerContext
    ) -> Iterator[grpc_stdio_pb2.StdioData]:
        _hold_open(self._lifecycle, context)
        yield from ()


class Broker(grpc_broker_pb2_grpc.GRPCBrokerServicer):
    def __init__(self, lifecycle: Lifecycle) -> None:
        self._lifecycle = lifecycle

    def StartStream(
        self, request_iterator: Iterator[grpc_broker_pb2.ConnInfo], context: grpc.ServicerContext
    ) -> Iterator[grpc_broker_pb2.ConnInfo]:
        _hold_open(self._lifecycle, context)
        yield from ()
