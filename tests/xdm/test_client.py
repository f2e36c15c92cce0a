"""XdmClient against a real gRPC server on a real Unix socket (tests/doubles/fake_xdm.py)."""

from __future__ import annotations

import errno
import logging
import os
import socket
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest

from nomad_plugin.model.errors import BackendRefused, BackendUnavailable, GrantMismatch
from nomad_plugin.model.grant import DeviceAsk, GrantRequest
from nomad_plugin.xdm.client import XdmClient, classify_errno, classify_rpc_error
from tests.doubles.fake_xdm import FakeXdm

MakeFake = Callable[..., FakeXdm]
MakeClient = Callable[..., XdmClient]


def _req(grant_id: str = "g-1", minor: int = 1, core: int = 0, memory: int = 0, slices: int = 0) -> GrantRequest:
    return GrantRequest(grant_id, (DeviceAsk(minor, core, memory, slices),))


# ---------------------------------------------------------------- happy path
def test_inventory_and_metrics_round_trip(make_fake: MakeFake, make_client: MakeClient) -> None:
    make_fake()
    client = make_client()
    assert client.list_supported_xpu_types() == ["nvidia"]
    assert client.device_service() == "xdm.XpuDeviceManagerService"
    infos = client.list_gpu_info()
    assert [i.minor for i in infos] == list(range(8)) and infos[0].driver_version == "535.161.08"
    sub = client.list_and_watch()
    cards = next(iter(sub))
    sub.cancel()
    assert len(cards) == 8
    card = cards[3]
    assert (card.vendor, card.xpu_type, card.memory_mib, card.memory_gib, card.healthy) == (
        "nvidia",
        "gpu",
        81559,
        79,
        True,
    )
    assert [lvl.name for lvl in card.topology.levels] == ["pcieSwitches", "cpuSockets", "leafSwitch"]
    samples = client.exporter_get_data_list()
    assert samples[0].name == "core_util_percent" and samples[0].metric_id == 1
    assert client.exporter_get_config().collect_interval_ms == 1000
    assert client.exporter_get_status().running
    assert client.query_status().enabled is True


def test_allocate_release_and_idempotent_release(make_fake: MakeFake, make_client: MakeClient) -> None:
    fake = make_fake()
    client = make_client()
    grant = client.allocate(_req("g-1", minor=0, core=50, memory=4))
    assert grant.grant_id == "g-1" and grant.devices[0].minor == 0 and grant.envs
    assert "g-1" in fake.grants
    assert fake.grants["g-1"].devices[0].HasField("minor")  # explicit encoding sends card 0 (R4)
    client.release("g-1")
    assert "g-1" not in fake.grants
    client.release("g-1")  # in-band not-found counts as released (R6)
    fake.error_mode = "grpc"
    client.release("never-existed")  # gRPC NOT_FOUND counts as released


def test_data_stream_yields_and_cancels(make_fake: MakeFake, make_client: MakeClient) -> None:
    make_fake()
    sub = make_client().exporter_data_stream()
    got = []
    for batch in sub:
        got.append(batch)
        if len(got) == 2:
            sub.cancel()
    assert len(got) == 2 and len(got[0]) == 8


# ---------------------------------------------------------------- classification
def test_socket_missing(make_client: MakeClient) -> None:
    with pytest.raises(BackendUnavailable) as info:
        make_client().list_supported_xpu_types()
    assert info.value.kind == "socket-missing"


def test_stale_socket_is_connection_refused(sockdir: Path, make_client: MakeClient) -> None:
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dead.bind(str(sockdir / "dp2mgr.sock"))  # bound, never listening: a stale socket file
    dead.close()
    with pytest.raises(BackendUnavailable) as info:
        make_client().list_supported_xpu_types()
    assert info.value.kind == "connection-refused"


def test_crash_mid_session_is_classified_and_recovers(make_fake: MakeFake, make_client: MakeClient) -> None:
    fake = make_fake()
    client = make_client()
    client.list_supported_xpu_types()
    fake.crash()
    with pytest.raises(BackendUnavailable) as info:
        client.list_supported_xpu_types()
    assert info.value.kind == "connection-refused"
    os.unlink(fake.socket_path)
    with pytest.raises(BackendUnavailable) as info:
        client.list_supported_xpu_types()
    assert info.value.kind == "socket-missing"
    fake.start()
    assert client.list_supported_xpu_types() == ["nvidia"]


def test_permission_denied_classifier() -> None:
    # CI runs as root, where chmod cannot stop root: the errno path is tested
    # here, the real EACCES path as an unprivileged user in the next test.
    assert classify_errno(errno.EACCES, "/x.sock").kind == "permission-denied"
    assert classify_errno(errno.ECONNREFUSED, "/x.sock").kind == "connection-refused"
    assert classify_errno(errno.ENOENT, "/x.sock").kind == "socket-missing"


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to drop to an unprivileged user")
def test_permission_denied_for_unprivileged_user(make_fake: MakeFake, sockdir: Path) -> None:
    """Real EACCES: a forked child drops to uid 65534 and runs the pre-dial check."""
    from nomad_plugin.xdm.client import socket_problem

    make_fake()
    os.chmod(sockdir, 0o755)
    os.chmod(sockdir / "dp2mgr.sock", 0o600)  # root-only, like XDM's sockets
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: no gRPC here, only the socket check
        try:
            os.setgid(65534)
            os.setuid(65534)
            problem = socket_problem(str(sockdir / "dp2mgr.sock"))
            os.write(write_fd, (problem.kind if problem else "ok").encode())
        finally:
            os._exit(0)
    os.close(write_fd)
    os.waitpid(pid, 0)
    with os.fdopen(read_fd) as pipe:
        assert pipe.read() == "permission-denied"


def test_unimplemented_when_no_candidate_matches(make_fake: MakeFake, make_client: MakeClient) -> None:
    make_fake(package="totally.unknown")
    with pytest.raises(BackendUnavailable) as info:
        make_client().list_supported_xpu_types()
    assert info.value.kind == "unimplemented" and "xdm_service" in str(info.value)


def test_configured_service_mismatch_is_unimplemented(make_fake: MakeFake, make_client: MakeClient) -> None:
    make_fake()
    with pytest.raises(BackendUnavailable) as info:
        make_client(xdm_service="wrong.XpuDeviceManagerService").list_supported_xpu_types()
    assert info.value.kind == "unimplemented"


def test_deadline_exceeded_is_timeout(make_fake: MakeFake, make_client: MakeClient) -> None:
    fake = make_fake()
    client = make_client(xdm_call_timeout=0.3)
    client.device_service()
    fake.latency["ListGpuInfo"] = 1.0
    with pytest.raises(BackendUnavailable) as info:
        client.list_gpu_info()
    # "timeout" (not an answer) proves the call gave up before the fake's 1 s latency ended.
    assert info.value.kind == "timeout"


def test_inband_refusal_passes_message_verbatim(make_fake: MakeFake, make_client: MakeClient) -> None:
    make_fake(refuse_allocate=True)
    with pytest.raises(BackendRefused) as info:
        make_client().allocate(_req())
    assert str(info.value) == "card 1 has no free memory" and info.value.status == 7


def test_grpc_code_refusal_passes_message_verbatim(make_fake: MakeFake, make_client: MakeClient) -> None:
    make_fake(refuse_allocate=True, error_mode="grpc")
    with pytest.raises(BackendRefused) as info:
        make_client().allocate(_req())
    assert str(info.value) == "card 1 has no free memory"


@pytest.mark.parametrize(
    ("code", "kind"),
    [
        (grpc.StatusCode.UNAVAILABLE, "unavailable"),
        (grpc.StatusCode.DEADLINE_EXCEEDED, "timeout"),
        (grpc.StatusCode.UNIMPLEMENTED, "unimplemented"),
    ],
)
def test_classifier_transport_codes(code: grpc.StatusCode, kind: str) -> None:
    err = classify_rpc_error(code, "x", "Allocate", None)
    assert isinstance(err, BackendUnavailable) and err.kind == kind


@pytest.mark.parametrize(
    "code",
    [
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.ALREADY_EXISTS,
        grpc.StatusCode.NOT_FOUND,
    ],
)
def test_classifier_refusal_codes(code: grpc.StatusCode) -> None:
    err = classify_rpc_error(code, "XDM says no", "Allocate", None)
    assert isinstance(err, BackendRefused) and str(err) == "XDM says no"


# ---------------------------------------------------------------- probing (R1, R13)
@pytest.mark.parametrize("package", ["api", "", "amp.xdm", "dp2mgr"])
def test_probe_finds_other_packages(make_fake: MakeFake, make_client: MakeClient, package: str) -> None:
    make_fake(package=package)
    client = make_client()
    expected = f"{package}.XpuDeviceManagerService" if package else "XpuDeviceManagerService"
    assert client.device_service() == expected
    grant = client.allocate(_req())
    assert grant.devices[0].minor == 1


def test_reflection_names_the_service(make_fake: MakeFake, make_client: MakeClient) -> None:
    fake = make_fake(package="vendor.private", reflection=["vendor.private.XpuDeviceManagerService"])
    client = make_client()
    assert client.device_service() == "vendor.private.XpuDeviceManagerService"
    assert fake.calls.get("ListSupportedXPUType") is None  # the schema names it: no probing at all


def test_exporter_rpcs_fall_back_to_exporter_service(make_fake: MakeFake, make_client: MakeClient) -> None:
    make_fake(split_exporter=True)
    client = make_client()
    assert client.list_gpu_info()[0].model == "NVIDIA H800"
    assert len(client.exporter_get_data_list()) == 8
    sub = client.exporter_data_stream()
    assert len(next(iter(sub))) == 8
    sub.cancel()


def test_config_service_probe(make_fake: MakeFake, make_client: MakeClient) -> None:
    make_fake(config_package="amp.config", enabled=False)
    assert make_client().query_status().enabled is False


def test_reprobe_after_xdm_changes_package(make_fake: MakeFake, make_client: MakeClient) -> None:
    fake = make_fake()
    client = make_client()
    assert client.device_service() == "xdm.XpuDeviceManagerService"
    fake.stop()
    fake.package = "api"
    fake.start()
    with pytest.raises(BackendUnavailable):
        client.list_supported_xpu_types()  # the old name is gone: UNIMPLEMENTED, forgotten
    assert client.list_supported_xpu_types() == ["nvidia"]
    assert client.device_service() == "api.XpuDeviceManagerService"


# ---------------------------------------------------------------- grant verification (R3, R4)
@pytest.mark.parametrize(
    ("mode", "needle"),
    [
        ("wrong-minor", "granted card(s) [2] but [1]"),
        ("wrong-amount", "asked core=50% memory=4GiB"),
        ("empty-success", "granted nothing"),
        ("shifted-status", "may carry an error code"),
    ],
)
def test_mismatched_grant_is_released_at_once(
    make_fake: MakeFake, make_client: MakeClient, mode: str, needle: str
) -> None:
    fake = make_fake(grant_mode=mode, release_unknown="ok")
    client = make_client()
    with pytest.raises(GrantMismatch) as info:
        client.allocate(_req("g-x", minor=1, core=50, memory=4))
    assert needle in str(info.value) and "released" in str(info.value)
    assert fake.released == ["g-x"]
    assert "g-x" not in fake.grants


def test_omit_zero_encoding_auto_assign_is_caught(make_fake: MakeFake, make_client: MakeClient) -> None:
    fake = make_fake(release_unknown="ok")
    client = make_client(xdm_minor_encoding="omit-zero")
    with pytest.raises(GrantMismatch) as info:
        client.allocate(_req("g-0", minor=0))
    assert "[7] but [0]" in str(info.value)
    assert "g-0" not in fake.grants  # released at once
    assert client.allocate(_req("g-1", minor=1)).devices[0].minor == 1


# ---------------------------------------------------------------- unknown fields (R2, R16)
def _tag(number: int, wire: int) -> bytes:
    from tests.doubles.drift import varint as _varint

    return _varint(number << 3 | wire)


def test_additive_and_clashing_fields_logged_once_never_fatal(
    make_fake: MakeFake, make_client: MakeClient, caplog: pytest.LogCaptureFixture
) -> None:
    from nomad_plugin._proto.lingjun import api_outer_pb2 as pb

    base = pb.XPUTypeResponse(xpuTypes=["ppu"]).SerializeToString()
    additive = _tag(40, 0) + b"\x07"
    clash = _tag(2, 2) + b"\x03bad"  # status declared varint, sent as a string
    fake = make_fake()
    fake.raw["ListSupportedXPUType"] = lambda _req: base + additive + clash
    client = make_client()
    with caplog.at_level(logging.INFO, logger="nomad_plugin.xdm.adapter"):
        for _ in range(3):
            assert client.list_supported_xpu_types() == ["ppu"]
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING and "schema drift" in r.getMessage()]
    infos = [r for r in caplog.records if r.levelno == logging.INFO and "field 40" in r.getMessage()]
    assert len(warnings) == 1 and "xdm.XPUTypeResponse field 2" in warnings[0].getMessage()
    assert len(infos) == 1
    assert any(f.clash for f in client.drift.findings())


def test_health_as_bool_and_memory_as_string_recovered(make_fake: MakeFake, make_client: MakeClient) -> None:
    from nomad_plugin._proto.lingjun import api_outer_pb2 as pb

    def device(minor: int, health_varint: int | None) -> bytes:
        uuid = f"PPU-{minor:08d}-0000-4000-8000-000000000000"
        body = pb.Device(minor=minor, uuid=uuid, model="PPU M890P", xpuType="ppu").SerializeToString()
        if health_varint is not None:
            body += _tag(5, 0) + bytes([health_varint])
        body += _tag(6, 2) + b"\x06147456"  # totalMemory as a string
        return _tag(1, 2) + bytes([len(body)]) + body

    fake = make_fake()
    fake.raw["ListAndWatch"] = lambda _req: device(0, 1) + device(1, 0)
    client = make_client()
    sub = client.list_and_watch()
    cards = next(iter(sub))
    sub.cancel()
    assert [(c.healthy, c.health_reason) for c in cards] == [(True, ""), (False, "XDM reports health code 0")]
    assert {c.memory_mib for c in cards} == {147456}
    assert {(c.vendor, c.xpu_type) for c in cards} == {("alibaba", "ppu")}
    assert client.schema_finding() == ""

    # No readable health at all is never defaulted to healthy: a schema-mismatch finding.
    fake.raw["ListAndWatch"] = lambda _req: device(0, 1) + device(2, None)
    sub = client.list_and_watch()
    cards = next(iter(sub))
    sub.cancel()
    assert not any(c.healthy for c in cards)
    assert all(
        c.health_reason.startswith("XDM schema mismatch: ") and "no known health" in c.health_reason for c in cards
    )
    assert client.schema_finding() == cards[0].health_reason
