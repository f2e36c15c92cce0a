"""The serving process moves its bytes with grpcio's own poller, not the EventEngine's threads.

``goplugin/handshake.py`` (``choose_polling``) sets ``GRPC_EXPERIMENTS`` before grpc is imported.
Whether grpcio obeyed is visible in its own trace output: with
``GRPC_TRACE=tcp`` it names the source file of the endpoint in use,
``tcp_posix.cc`` / ``tcp_server_posix.cc`` (grpcio's poller) or
``posix_endpoint.cc`` (the EventEngine). The
real plugin is launched as Nomad launches it and served one health check.
A grpcio that no longer knows these experiment names says "Unknown
experiment" on stderr (Nomad's log): that fails here too.
"""

from __future__ import annotations

import os
import signal
import subprocess

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from nomad_plugin.goplugin.handshake import (
    DIRECT_POLLING,
    MAGIC_COOKIE_KEY,
    MAGIC_COOKIE_VALUE,
    VARIABLE,
    choose_polling,
)
from tests.conformance.hostlib import real_plugin


def test_sets_the_default_only_before_grpc_and_never_over_the_operator():
    env: dict[str, str] = {}
    assert choose_polling(env, loaded=set())
    assert env == {VARIABLE: DIRECT_POLLING}
    operator = {VARIABLE: ""}  # set, even empty: the operator's choice
    assert not choose_polling(operator, loaded=set())
    assert operator == {VARIABLE: ""}
    late: dict[str, str] = {}
    assert not choose_polling(late, loaded={"grpc"})  # grpcio already read its configuration
    assert late == {}


def _serve_one_health_check(extra_env: dict[str, str]) -> str:
    """Launch the real plugin, ask its health service once, stop it; its stderr."""
    env = {k: v for k, v in os.environ.items() if k != VARIABLE}
    env.update({MAGIC_COOKIE_KEY: MAGIC_COOKIE_VALUE, "PLUGIN_PROTOCOL_VERSIONS": "2"})
    env.update({"GRPC_TRACE": "tcp", "GRPC_VERBOSITY": "debug", **extra_env})
    proc = subprocess.Popen([str(real_plugin())], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("1|2|unix|"), f"no handshake line, got {line!r}"
        address = line.split("|")[3]
        with grpc.insecure_channel(f"unix:{address}") as channel:
            status = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service="plugin"), timeout=30
            )
        assert status.status == health_pb2.HealthCheckResponse.SERVING
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    return err


def test_the_real_plugin_serves_with_grpcs_own_poller():
    err = _serve_one_health_check({})
    assert "Unknown experiment" not in err, err[-2000:]
    assert "tcp_server_posix.cc" in err and "tcp_posix.cc" in err, "grpcio's poller served nothing"
    assert "posix_engine_listener.cc" not in err and "posix_endpoint.cc" not in err, "the EventEngine served"


def test_an_operators_grpc_experiments_wins():
    err = _serve_one_health_check({VARIABLE: ""})
    assert "posix_endpoint.cc" in err, "grpcio's default (the EventEngine) was not used"
    assert "tcp_posix.cc" not in err and "tcp_server_posix.cc" not in err
