"""The real executable, launched as go-plugin launches it, over its real Unix socket."""

from __future__ import annotations

import json
import os
import random
import signal
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import grpc
import msgpack
import pytest
from google.protobuf import duration_pb2, empty_pb2
from goplugin_harness import REPO, Plugin, launch, plugin_env
from grpc_health.v1 import health_pb2, health_pb2_grpc

from nomad_plugin import PLUGIN_NAME, __version__
from nomad_plugin._proto.goplugin import (
    grpc_broker_pb2,
    grpc_broker_pb2_grpc,
    grpc_controller_pb2,
    grpc_controller_pb2_grpc,
    grpc_stdio_pb2_grpc,
)
from nomad_plugin._proto.nomad import base_pb2, base_pb2_grpc, device_pb2, device_pb2_grpc
from nomad_plugin.config.options import CARD_BLOCK, OPTIONS

EXIT_BUDGET = 2.0  # go-plugin SIGKILLs after 2 s


def _shutdown(p: Plugin) -> None:
    grpc_controller_pb2_grpc.GRPCControllerStub(p.channel()).Shutdown(grpc_controller_pb2.Empty(), timeout=5)


def _assert_clean_exit(p: Plugin, rc: int, seconds: float) -> None:
    assert rc == 0, p.stderr_text()
    assert seconds < EXIT_BUDGET, f"took {seconds:.2f}s"
    assert not os.path.exists(p.socket)
    assert not os.path.exists(p.socket_dir)
    assert p.rest_of_stdout() == b"", "something besides the handshake reached stdout"


def _run_plain(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "nomad_plugin", *args], cwd=REPO, env=env, capture_output=True, timeout=30
    )


def test_handshake_line_and_private_socket_dir(plugin: Plugin) -> None:
    assert plugin.line.endswith("|grpc\n") and plugin.line.count("|") == 4
    assert stat.S_ISSOCK(os.stat(plugin.socket).st_mode)
    assert stat.S_IMODE(os.stat(plugin.socket_dir).st_mode) == 0o700
    assert len(plugin.socket) < 108


def test_health_reports_plugin_serving(plugin: Plugin) -> None:
    stub = health_pb2_grpc.HealthStub(plugin.channel())
    for service in ("plugin", ""):
        reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING


def test_plugin_info_schema_and_set_config(plugin: Plugin) -> None:
    base = base_pb2_grpc.BasePluginStub(plugin.channel())
    info = base.PluginInfo(base_pb2.PluginInfoRequest(), timeout=5)
    assert info.type == base_pb2.DEVICE
    assert list(info.plugin_api_versions) == ["v0.1.0"]
    assert info.plugin_version == __version__
    assert info.name == PLUGIN_NAME

    spec = base.ConfigSchema(base_pb2.ConfigSchemaRequest(), timeout=5).spec
    assert spec.WhichOneof("block") == "object"
    assert set(spec.object.attributes) == {opt.name for opt in OPTIONS} | {CARD_BLOCK}

    config = {opt.name: None for opt in OPTIONS} | {"tdm_shares": 4, "log_level": "debug", CARD_BLOCK: []}
    request = base_pb2.SetConfigRequest(msgpack_config=msgpack.packb(config), plugin_api_version="v0.1.0")
    for _ in range(3):  # Nomad calls it more than once with the same bytes
        base.SetConfig(request, timeout=5)

    with pytest.raises(grpc.RpcError) as err:
        base.SetConfig(base_pb2.SetConfigRequest(msgpack_config=msgpack.packb({"tdm_shares": 0})), timeout=5)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "tdm_shares" in err.value.details() and "0" in err.value.details()

    with pytest.raises(grpc.RpcError) as err:
        base.SetConfig(base_pb2.SetConfigRequest(plugin_api_version="v0.2.0"), timeout=5)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_secret_never_reaches_the_log(plugin: Plugin) -> None:
    base = base_pb2_grpc.BasePluginStub(plugin.channel())
    token = "5a1c3c3e-9d1f-4c1e-b7a1-supersecret01"
    base.SetConfig(
        base_pb2.SetConfigRequest(msgpack_config=msgpack.packb({"nomad_token": token, "log_level": "trace"})),
        timeout=5,
    )
    with pytest.raises(grpc.RpcError) as err:
        base.SetConfig(
            base_pb2.SetConfigRequest(msgpack_config=msgpack.packb({"nomad_token": token, "tdm_shares": -1})),
            timeout=5,
        )
    assert token not in err.value.details()
    _shutdown(plugin)
    plugin.wait_exit(5)
    assert token not in plugin.stderr_text()


def _own_data_dir(channel: grpc.Channel, data_dir: Path) -> None:
    """The engines start on the first Fingerprint: give them a data_dir of the test's own."""
    config = msgpack.packb({"data_dir": str(data_dir)})
    base_pb2_grpc.BasePluginStub(channel).SetConfig(base_pb2.SetConfigRequest(msgpack_config=config), timeout=5)


def test_fingerprint_stream_stays_open_and_stdio_broker_hold(plugin: Plugin, tmp_path: Path) -> None:
    channel = plugin.channel()
    _own_data_dir(channel, tmp_path / "data")
    call = device_pb2_grpc.DevicePluginStub(channel).Fingerprint(device_pb2.FingerprintRequest())
    first = next(call)
    assert isinstance(first, device_pb2.FingerprintResponse)
    stdio = grpc_stdio_pb2_grpc.GRPCStdioStub(channel).StreamStdio(empty_pb2.Empty())
    broker = grpc_broker_pb2_grpc.GRPCBrokerStub(channel).StartStream(iter([grpc_broker_pb2.ConnInfo()]))
    time.sleep(0.7)
    for stream in (call, stdio, broker):
        assert stream.is_active() and not stream.done()
    for stream in (call, stdio, broker):
        stream.cancel()


def test_shutdown_exits_quickly_and_removes_socket(plugin: Plugin) -> None:
    _shutdown(plugin)
    rc, seconds = plugin.wait_exit(5)
    _assert_clean_exit(plugin, rc, seconds)


def test_sigterm_is_a_graceful_shutdown(plugin: Plugin) -> None:
    plugin.channel()
    plugin.proc.send_signal(signal.SIGTERM)
    rc, seconds = plugin.wait_exit(5)
    _assert_clean_exit(plugin, rc, seconds)


def test_sigterm_at_any_moment_after_the_handshake_stops_it() -> None:
    """SIGTERM right after the line, while the services load, between SIGINTs, or many at once: each launch
    exits cleanly in time. A handler that took a lock could interrupt the main thread holding that very lock
    and wait for ever; the signals' numbers go through a pipe to the main thread instead."""
    rng = random.Random(7)
    for attempt in range(16):
        p = launch()
        try:
            time.sleep(rng.choice([0.0, 0.0005, 0.002, 0.01, 0.05]))
            if attempt % 4 == 1:
                p.proc.send_signal(signal.SIGINT)
            for _ in range(8 if attempt % 4 == 2 else 1):
                p.proc.send_signal(signal.SIGTERM)
            rc, seconds = p.wait_exit(10)
            _assert_clean_exit(p, rc, seconds)
        finally:
            p.close()


def test_sigint_is_ignored(plugin: Plugin) -> None:
    plugin.proc.send_signal(signal.SIGINT)
    time.sleep(0.5)
    assert plugin.proc.poll() is None
    reply = health_pb2_grpc.HealthStub(plugin.channel()).Check(health_pb2.HealthCheckRequest(service="plugin"))
    assert reply.status == health_pb2.HealthCheckResponse.SERVING
    _shutdown(plugin)
    rc, seconds = plugin.wait_exit(5)
    _assert_clean_exit(plugin, rc, seconds)


def test_shutdown_during_open_fingerprint_and_stats_streams(plugin: Plugin, tmp_path: Path) -> None:
    channel = plugin.channel()
    _own_data_dir(channel, tmp_path / "data")
    device = device_pb2_grpc.DevicePluginStub(channel)
    fingerprint = device.Fingerprint(device_pb2.FingerprintRequest())
    next(fingerprint)
    stats = device.Stats(device_pb2.StatsRequest(collection_interval=duration_pb2.Duration(nanos=200_000_000)))
    next(stats)
    ended: list[str] = []

    def drain(name: str, stream: grpc.Call) -> None:
        try:
            for _ in stream:  # type: ignore[attr-defined]
                pass
        except grpc.RpcError:
            pass
        ended.append(name)

    threads = [threading.Thread(target=drain, args=(n, s)) for n, s in (("fp", fingerprint), ("stats", stats))]
    for t in threads:
        t.start()
    _shutdown(plugin)
    rc, seconds = plugin.wait_exit(5)
    _assert_clean_exit(plugin, rc, seconds)
    for t in threads:
        t.join(5)
    assert sorted(ended) == ["fp", "stats"]


def test_every_stderr_line_is_an_hclog_json_entry(plugin: Plugin) -> None:
    base = base_pb2_grpc.BasePluginStub(plugin.channel())
    base.SetConfig(base_pb2.SetConfigRequest(msgpack_config=msgpack.packb({"log_level": "trace"})), timeout=5)
    _shutdown(plugin)
    plugin.wait_exit(5)
    lines = [line for line in plugin.stderr_text().splitlines() if line.strip()]
    assert lines, "expected some log lines at trace level"
    for line in lines:
        entry = json.loads(line)
        assert entry["@level"] in {"trace", "debug", "info", "warn", "error"}
        assert entry["@module"].startswith(PLUGIN_NAME)


@pytest.mark.parametrize("cookie", [None, "wrong"])
def test_missing_or_wrong_cookie_exits_1_with_a_message(cookie: str | None) -> None:
    env = plugin_env(NOMAD_PLUGIN_MAGIC_COOKIE=cookie)
    for args in ((), ("serve",)):
        result = _run_plain(env, *args)
        assert result.returncode == 1
        assert result.stdout == b""
        assert b"plugin" in result.stderr and b"not meant to be executed directly" in result.stderr


def test_protocol_1_only_is_refused() -> None:
    result = _run_plain(plugin_env(PLUGIN_PROTOCOL_VERSIONS="1"))
    assert result.returncode == 1
    assert result.stdout == b""
    assert b"'1'" in result.stderr and b"speaks only version 2" in result.stderr


def test_bad_protocol_entries_are_skipped_with_a_warning() -> None:
    p = launch(plugin_env(PLUGIN_PROTOCOL_VERSIONS="x, 2"))
    try:
        _shutdown(p)
        rc, seconds = p.wait_exit(5)
        _assert_clean_exit(p, rc, seconds)
        assert "ignoring bad entry 'x'" in p.stderr_text()
    finally:
        p.close()
