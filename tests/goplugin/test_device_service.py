"""DeviceService/BaseService over a real gRPC server on a Unix socket, with a scripted PluginApp."""

from __future__ import annotations

import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor

import grpc
import msgpack
import pytest
from google.protobuf import duration_pb2

from nomad_plugin._proto.nomad import base_pb2, base_pb2_grpc, device_pb2, device_pb2_grpc
from nomad_plugin.app import PluginApp, apply_logging
from nomad_plugin.config.model import ConfigError, PluginConfig
from nomad_plugin.goplugin.serve import Lifecycle
from nomad_plugin.journal.datadir import DataDirRefused
from nomad_plugin.journal.store import JournalFull
from nomad_plugin.model.errors import BackendRefused, BackendUnavailable, GrantMismatch, ReservationRejected
from nomad_plugin.nomad.container import GrantRejected
from nomad_plugin.nomad.reserve import AfterReply
from nomad_plugin.nomad.services import BaseService, DeviceService, stats_interval
from nomad_plugin.util.threads import Backoff
from nomad_plugin.xdm.client import GrpcRefused


class ScriptedApp(PluginApp):
    def __init__(self) -> None:
        super().__init__()
        self.reserve_error: BaseException | None = None
        self.reserve_reply = device_pb2.ReserveResponse()
        self.after_reply: AfterReply | None = None
        self.run_after_reply: list[tuple[str, threading.Event]] = []
        self.fingerprint_failures = 0
        self.fingerprint_opens = 0
        self.cancels: list[threading.Event] = []
        self.intervals: list[float] = []
        self.set_config_error: BaseException | None = None
        self.configs: list[PluginConfig] = []

    def set_config(self, config: PluginConfig) -> None:
        if self.set_config_error is not None:
            raise self.set_config_error
        self.configs.append(config)

    def fingerprints(self, cancel: threading.Event) -> Iterator[device_pb2.FingerprintResponse]:
        self.fingerprint_opens += 1
        self.cancels.append(cancel)
        if self.fingerprint_opens <= self.fingerprint_failures:
            if self.fingerprint_opens % 2:
                raise RuntimeError("engine exploded")
            return  # ran dry without being cancelled
        yield device_pb2.FingerprintResponse(device_group=[device_pb2.DeviceGroup(vendor="alibaba")])
        cancel.wait()

    def stats(self, interval: float, cancel: threading.Event) -> Iterator[device_pb2.StatsResponse]:
        self.intervals.append(interval)
        self.cancels.append(cancel)
        while not cancel.is_set():
            yield device_pb2.StatsResponse()
            cancel.wait(interval)

    def reserve(self, device_ids: Sequence[str], after_reply: AfterReply | None = None) -> device_pb2.ReserveResponse:
        self.after_reply = after_reply
        for name, ran in self.run_after_reply:
            assert after_reply is not None and after_reply(ran.set), name
        if self.reserve_error is not None:
            raise self.reserve_error
        return self.reserve_reply


@pytest.fixture
def served() -> Iterator[tuple[ScriptedApp, Lifecycle, grpc.Channel]]:
    app, lifecycle = ScriptedApp(), Lifecycle()
    server = grpc.server(ThreadPoolExecutor(max_workers=8))
    fast = lambda: Backoff(initial=0.01, cap=0.05, jitter=0.0)  # noqa: E731
    device_pb2_grpc.add_DevicePluginServicer_to_server(DeviceService(app, lifecycle, retry=fast), server)
    base_pb2_grpc.add_BasePluginServicer_to_server(BaseService(app, apply_logging), server)
    with tempfile.TemporaryDirectory(prefix="dsvc", dir="/tmp") as directory:
        server.add_insecure_port(f"unix:{directory}/s.sock")
        server.start()
        channel = grpc.insecure_channel(f"unix:{directory}/s.sock")
        try:
            yield app, lifecycle, channel
        finally:
            lifecycle.request_stop("test end")
            channel.close()
            server.stop(0).wait(5)


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (ReservationRejected("unknown device IDs: x"), grpc.StatusCode.INVALID_ARGUMENT),
        (ConfigError("bad"), grpc.StatusCode.INVALID_ARGUMENT),
        (BackendUnavailable("socket missing", kind="socket-missing"), grpc.StatusCode.UNAVAILABLE),
        (BackendRefused("no capacity", status=3), grpc.StatusCode.FAILED_PRECONDITION),
        (GrantMismatch("wrong card"), grpc.StatusCode.FAILED_PRECONDITION),
        (GrantRejected("XDM returned device node '/dev/sda'", "device"), grpc.StatusCode.FAILED_PRECONDITION),
        (
            GrpcRefused("card 1 has no free memory", grpc.StatusCode.RESOURCE_EXHAUSTED),
            grpc.StatusCode.RESOURCE_EXHAUSTED,
        ),
        (JournalFull("the grant journal holds 4096 grants"), grpc.StatusCode.RESOURCE_EXHAUSTED),
        (DataDirRefused("data_dir '/tmp' is the system directory /tmp"), grpc.StatusCode.FAILED_PRECONDITION),
        (
            BackendUnavailable("XDM Allocate unavailable: the stream was reset", "unavailable"),
            grpc.StatusCode.UNAVAILABLE,
        ),
        (KeyError("surprise"), grpc.StatusCode.INTERNAL),
    ],
)
def test_reserve_maps_errors_to_codes(
    served: tuple[ScriptedApp, Lifecycle, grpc.Channel], error: Exception, code: grpc.StatusCode
) -> None:
    app, _, channel = served
    app.reserve_error = error
    with pytest.raises(grpc.RpcError) as err:
        device_pb2_grpc.DevicePluginStub(channel).Reserve(device_pb2.ReserveRequest(device_ids=["x"]), timeout=5)
    assert err.value.code() == code
    assert str(error).strip("'") in err.value.details()


def test_an_error_reaches_nomad_as_one_bounded_line(served: tuple[ScriptedApp, Lifecycle, grpc.Channel]) -> None:
    """Under gRPC's metadata limit, and without a newline or ESC that would forge a line in the agent's log."""
    app, _, channel = served
    app.reserve_error = ReservationRejected("device ID(s) " + "\x1b[31mX\n[ERROR] agent: forged, " * 5000)
    with pytest.raises(grpc.RpcError) as err:
        device_pb2_grpc.DevicePluginStub(channel).Reserve(device_pb2.ReserveRequest(device_ids=["x"]), timeout=5)
    details = err.value.details()
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert len(details) < 4200 and "more characters" in details
    assert "\n" not in details and "\x1b" not in details and "\\x1b[31m" in details


def test_reserve_always_carries_container_res(served: tuple[ScriptedApp, Lifecycle, grpc.Channel]) -> None:
    _, _, channel = served
    reply = device_pb2_grpc.DevicePluginStub(channel).Reserve(device_pb2.ReserveRequest(device_ids=["a"]), timeout=5)
    assert reply.HasField("container_res")


def test_reserve_runs_what_the_app_defers_after_the_reply(served: tuple[ScriptedApp, Lifecycle, grpc.Channel]) -> None:
    app, _, channel = served
    ran = threading.Event()
    app.run_after_reply = [("the audit line", ran)]
    stub = device_pb2_grpc.DevicePluginStub(channel)
    call = stub.Reserve.future(device_pb2.ReserveRequest(device_ids=["a"]), timeout=5)
    assert call.result().HasField("container_res")
    assert ran.wait(5), "the deferred function never ran"
    app.reserve_error = ReservationRejected("unknown device IDs: b")
    ran.clear()
    with pytest.raises(grpc.RpcError):
        stub.Reserve(device_pb2.ReserveRequest(device_ids=["b"]), timeout=5)
    assert ran.wait(5), "a failed Reserve still ends its call, and runs what it deferred"


def test_fingerprint_survives_engine_failures_and_stays_open(
    served: tuple[ScriptedApp, Lifecycle, grpc.Channel],
) -> None:
    app, _, channel = served
    app.fingerprint_failures = 3  # raise, run dry, raise; then a real engine
    call = device_pb2_grpc.DevicePluginStub(channel).Fingerprint(device_pb2.FingerprintRequest())
    first = next(call)
    assert first.device_group[0].vendor == "alibaba"
    assert app.fingerprint_opens == 4
    time.sleep(0.3)
    assert call.is_active()
    call.cancel()
    assert app.cancels[-1].wait(5), "cancelling the call must set the engine's cancel Event"


def test_stats_interval_zero_absent_and_given(served: tuple[ScriptedApp, Lifecycle, grpc.Channel]) -> None:
    app, _, channel = served
    stub = device_pb2_grpc.DevicePluginStub(channel)
    for request in (
        device_pb2.StatsRequest(),
        device_pb2.StatsRequest(collection_interval=duration_pb2.Duration()),
        device_pb2.StatsRequest(collection_interval=duration_pb2.Duration(seconds=2, nanos=500_000_000)),
    ):
        call = stub.Stats(request)
        next(call)
        call.cancel()
    assert app.intervals == [1.0, 1.0, 2.5]
    assert stats_interval(device_pb2.StatsRequest(collection_interval=duration_pb2.Duration(seconds=-3))) == 1.0


def test_process_stop_ends_open_streams(served: tuple[ScriptedApp, Lifecycle, grpc.Channel]) -> None:
    app, lifecycle, channel = served
    call = device_pb2_grpc.DevicePluginStub(channel).Stats(device_pb2.StatsRequest())
    next(call)
    assert len(lifecycle._streams) == 1, "the open Stats stream is not tracked"
    lifecycle.request_stop("test")
    assert app.cancels[-1].wait(5)
    remaining = list(call)  # the stream ends instead of hanging
    assert len(remaining) <= 1
    assert not lifecycle._streams, "the ended stream is still tracked"


def test_set_config_is_idempotent_and_maps_app_errors(served: tuple[ScriptedApp, Lifecycle, grpc.Channel]) -> None:
    app, _, channel = served
    base = base_pb2_grpc.BasePluginStub(channel)
    request = base_pb2.SetConfigRequest(
        msgpack_config=msgpack.packb({"default_mode": "tdm"}), plugin_api_version="0.1.0"
    )
    for _ in range(3):
        base.SetConfig(request, timeout=5)
    assert len(app.configs) == 3 and len(set(app.configs)) == 1
    assert app.configs[0].default_mode == "tdm"
    app.set_config_error = ConfigError('card[0]: model "T4" cannot run in mig mode')
    with pytest.raises(grpc.RpcError) as err:
        base.SetConfig(request, timeout=5)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "T4" in err.value.details()
    app.set_config_error = BackendUnavailable("xdm socket missing")
    with pytest.raises(grpc.RpcError) as err:
        base.SetConfig(request, timeout=5)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
