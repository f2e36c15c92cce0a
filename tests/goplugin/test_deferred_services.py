"""The handshake comes before the services are imported: early calls wait for them, never fail."""

from __future__ import annotations

import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from nomad_plugin.goplugin import serve


def _server(deferred: serve._Deferred, directory: str) -> grpc.Server:
    server = grpc.server(ThreadPoolExecutor(max_workers=4))
    server.add_generic_rpc_handlers((deferred,))
    server.add_insecure_port(f"unix:{directory}/s.sock")
    server.start()
    return server


def test_a_call_before_the_services_waits_and_is_answered():
    deferred = serve._Deferred()
    with tempfile.TemporaryDirectory(prefix="dfr", dir="/tmp") as directory:
        server = _server(deferred, directory)
        channel = grpc.insecure_channel(f"unix:{directory}/s.sock")
        answer: dict[str, object] = {}

        def ask() -> None:
            stub = health_pb2_grpc.HealthStub(channel)
            answer["status"] = stub.Check(health_pb2.HealthCheckRequest(service="plugin"), timeout=30).status

        caller = threading.Thread(target=ask)
        caller.start()
        caller.join(0.5)
        assert caller.is_alive(), "the call was answered before any service existed"
        servicer = health.HealthServicer()
        servicer.set("plugin", health_pb2.HealthCheckResponse.SERVING)
        health_pb2_grpc.add_HealthServicer_to_server(servicer, deferred)  # type: ignore[arg-type]
        caller.join(0.5)
        assert caller.is_alive(), "the call was answered before the services were ready"
        deferred.ready()
        caller.join(30)
        assert answer.get("status") == health_pb2.HealthCheckResponse.SERVING
        channel.close()
        server.stop(0)


def test_services_that_never_come_answer_unimplemented(monkeypatch):
    monkeypatch.setattr(serve, "SERVICES_WAIT", 0.2)
    deferred = serve._Deferred()
    with tempfile.TemporaryDirectory(prefix="dfr", dir="/tmp") as directory:
        server = _server(deferred, directory)
        channel = grpc.insecure_channel(f"unix:{directory}/s.sock")
        with pytest.raises(grpc.RpcError) as err:
            health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
        assert err.value.code() is grpc.StatusCode.UNIMPLEMENTED
        channel.close()
        server.stop(0)
