"""XdmClient against the simulator's error modes and schema drift (tests/doubles/drift.py; docs/xdm-risks.md)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from nomad_plugin.config.model import PluginConfig
from nomad_plugin.model.errors import BackendRefused, BackendUnavailable, GrantMismatch
from nomad_plugin.model.grant import DeviceAsk, GrantRequest
from nomad_plugin.xdm.client import XdmClient
from tests.doubles.drifted_sim import DriftedSimulator


@pytest.fixture
def sim(sockdir: Path) -> Iterator[object]:
    s = DriftedSimulator(socket_dir=sockdir, profile="h800-8")
    s.start()
    yield s
    s.stop()


@pytest.fixture
def client(sockdir: Path, sim: object) -> Iterator[XdmClient]:
    c = XdmClient(
        PluginConfig(
            xdm_socket=str(sockdir / "dp2mgr.sock"),
            config_socket=str(sockdir / "config-daemon.sock"),
            xdm_call_timeout=2.0,
        )
    )
    yield c
    c.close()


def _ask(grant_id: str, minor: int, **kw: int) -> GrantRequest:
    return GrantRequest(grant_id, (DeviceAsk(minor=minor, **kw),))


@pytest.mark.parametrize("mode", ["package=api", "package=none", "package=amp.xdm", "split-services"])
def test_probing_finds_the_service(sim: object, client: XdmClient, mode: str) -> None:
    sim.set_drift(mode)  # type: ignore[attr-defined]
    assert client.list_supported_xpu_types()
    assert len(client.list_gpu_info()) == 8
    assert client.exporter_get_data_list()
    grant = client.allocate(_ask("p-1", 3))
    assert grant.devices[0].minor == 3
    client.release("p-1")


def test_extra_fields_accepted_silently(sim: object, client: XdmClient, caplog: pytest.LogCaptureFixture) -> None:
    sim.set_drift("extra-fields")  # type: ignore[attr-defined]
    with caplog.at_level(logging.INFO):
        sub = client.list_and_watch()
        cards = next(iter(sub))
        sub.cancel()
        client.allocate(_ask("e-1", 1, core=50, memory_gib=4))
    assert len(cards) == 8 and all(c.healthy for c in cards)
    assert not any(f.clash for f in client.drift.findings())
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING and "drift" in r.getMessage()]


def test_type_clash_degrades_and_warns(sim: object, client: XdmClient) -> None:
    sim.set_drift("type-clash")  # type: ignore[attr-defined]
    sim.set_health(4, False, "XID 79")  # type: ignore[attr-defined]
    sub = client.list_and_watch()
    cards = next(iter(sub))
    sub.cancel()
    assert [c.minor for c in cards if not c.healthy] == [4]
    assert all(c.memory_mib == 81559 for c in cards)
    assert all(s.metric_id > 0 for s in client.exporter_get_data_list())
    assert any(f.clash for f in client.drift.findings())


def test_status_shift_refusal_is_not_success(sim: object, client: XdmClient) -> None:
    sim.set_drift("status-shift")  # type: ignore[attr-defined]
    with pytest.raises(GrantMismatch) as info:
        client.allocate(_ask("s-1", 99))  # unknown card: refused, status shifted to field 15
    assert "granted nothing" in str(info.value) and "field 15" in str(info.value)


def test_minor_omit_zero_caught_and_released(sim: object, client: XdmClient, sockdir: Path) -> None:
    sim.set_drift("minor-omit-zero")  # type: ignore[attr-defined]
    c = XdmClient(PluginConfig(xdm_socket=str(sockdir / "dp2mgr.sock"), xdm_minor_encoding="omit-zero"))
    try:
        client.allocate(_ask("z-0", 0, core=60))  # card 0 is busy: an auto-assign must land elsewhere
        with pytest.raises(GrantMismatch) as info:
            c.allocate(_ask("z-1", 0, core=50))
        assert "granted card(s) [1] but [0] were requested" in str(info.value)
        assert "z-1" not in sim.grants()  # type: ignore[attr-defined]
        with pytest.raises(GrantMismatch, match="granted nothing"):
            c.allocate(_ask("z-2", 0))  # whole card 0 without a minor reads as a CPU container
        assert "z-2" not in sim.grants()  # type: ignore[attr-defined]
        assert "z-1" not in sim.grants()  # type: ignore[attr-defined]
    finally:
        c.close()


@pytest.mark.parametrize("mode", ["inband", "grpc"])
def test_refusals_pass_the_message_through(sim: object, client: XdmClient, mode: str) -> None:
    sim.set_choice("error_mode", mode)  # type: ignore[attr-defined]
    with pytest.raises(BackendRefused) as info:
        client.allocate(_ask("r-1", 0, core=150))
    assert "core" in str(info.value)
    client.release("never-existed")  # not found counts as released, in both modes


def test_latency_gives_timeout(sim: object, sockdir: Path) -> None:
    c = XdmClient(PluginConfig(xdm_socket=str(sockdir / "dp2mgr.sock"), xdm_call_timeout=0.3))
    try:
        c.device_service()
        sim.set_latency("ListGpuInfo", 1.0)  # type: ignore[attr-defined]
        with pytest.raises(BackendUnavailable) as info:
            c.list_gpu_info()
        assert info.value.kind == "timeout"
    finally:
        c.close()
