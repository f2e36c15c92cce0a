"""No silent config mistakes: each one is refused or warned about, by name."""

from __future__ import annotations

import logging
import time

import msgpack
import pytest

from nomad_plugin.config.decode import decode_config
from nomad_plugin.config.model import CardRule, ConfigError, PluginConfig
from nomad_plugin.launcher import LaunchError
from nomad_plugin.launcher.process import LiveNode
from nomad_plugin.model.grant import Grant, GrantedDevice
from nomad_plugin.model.instances import GroupKey, Instance, Kind
from nomad_plugin.nomad.catalog import check_modes
from nomad_plugin.nomad.container import build_container, mig_core_percent
from nomad_plugin.reconcile.nomad_api import NomadApiError, NomadApiSettings, NomadClient
from tests.doubles.nomad_api import NomadApiDouble
from tests.fingerprint.helpers import FakeBackend, h800_node


def rejected(**values: object) -> str:
    with pytest.raises(ConfigError) as err:
        decode_config(msgpack.packb(values))
    return str(err.value)


# --- refused: INVALID_ARGUMENT from SetConfig ---------------------------------------------


@pytest.mark.parametrize("name", ["xdm_socket", "config_socket"])
def test_relative_socket_path_is_refused(name: str) -> None:
    message = rejected(**{name: "run/xdm/dp2mgr.sock"})
    assert f'config option "{name}"' in message and "is relative" in message and "absolute path" in message


@pytest.mark.parametrize(
    "address",
    ["127.0.0.1:4646", "localhost", "ftp://nomad:4646", "http://", "http://nomad:notaport", "unix://relative.sock"],
)
def test_nomad_address_that_is_not_a_url_is_refused(address: str) -> None:
    message = rejected(nomad_address=address)
    assert 'config option "nomad_address"' in message and "http://127.0.0.1:4646" in message


@pytest.mark.parametrize(
    "address", ["", "http://127.0.0.1:4646", "https://nomad.service.consul:4646/", "unix:///run/nomad/nomad.sock"]
)
def test_good_nomad_addresses_pass(address: str) -> None:
    assert decode_config(msgpack.packb({"nomad_address": address})).nomad_address == address


@pytest.mark.parametrize(
    ("setting", "needle"),
    [
        ('xdm_socket="rel/x.sock"', 'INVALID_ARGUMENT: config option "xdm_socket"'),
        ('nomad_address="127.0.0.1:4646"', 'INVALID_ARGUMENT: config option "nomad_address"'),
    ],
)
def test_set_config_answers_invalid_argument_naming_the_option(setting: str, needle: str) -> None:
    """Through the real plugin process, as the agent's SetConfig sees it."""
    with pytest.raises(LaunchError) as err, LiveNode(None, [setting], None, None, None):
        pass
    assert needle in str(err.value)


# --- warned: the fingerprint engine logs check_modes' problems --------------------------------


def test_card_block_matching_no_card_is_named() -> None:
    inventory = h800_node(8)
    rules = (CardRule(match="NVIDIA H800 PCIe", mode="tdm"), CardRule(match="3", mode="tdm"))
    problems = check_modes(inventory, PluginConfig(cards=rules))
    named = [p for p in problems if "matches no card" in p]
    assert len(named) == 1, problems
    assert "card[0] match = 'NVIDIA H800 PCIe'" in named[0] and "'NVIDIA H800'" in named[0]


@pytest.mark.parametrize(
    ("config", "needle"),
    [
        (PluginConfig(include_types=("gpus",)), "include_types value 'gpus' names no card"),
        (PluginConfig(exclude_types=("GPU-share",)), "exclude_types value 'GPU-share'"),
        (PluginConfig(include_vendors=("nvida",)), "include_vendors value 'nvida'"),
    ],
)
def test_unknown_type_or_vendor_filter_is_named(config: PluginConfig, needle: str) -> None:
    problems = check_modes(h800_node(2), config)
    assert any(needle in p for p in problems), problems
    assert not check_modes(h800_node(2), PluginConfig(include_types=("gpu",), include_vendors=("nvidia",)))


def test_warnings_reach_the_agent_log(caplog: pytest.LogCaptureFixture) -> None:
    """The fingerprint engine logs every problem once, as a warning the agent shows."""
    from nomad_plugin.nomad.fingerprint import FingerprintEngine

    backend = FakeBackend(h800_node(2))
    config = PluginConfig(cards=(CardRule(match="A100", mode="mig"),), include_types=("npu", "gpu"))
    engine = FingerprintEngine(backend, config)
    caplog.set_level(logging.WARNING)
    engine.start()
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not any("matches no card" in r.message for r in caplog.records):
            time.sleep(0.05)
    finally:
        engine.stop()
    messages = [r.message for r in caplog.records]
    assert any("card[0] match = 'A100' matches no card" in m for m in messages), "awaited the card-block warning"
    assert any("include_types value 'npu'" in m for m in messages)


# --- 403 names the missing capability -------------------------------------------------------


def test_403_on_agent_self_names_agent_read_and_on_allocations_node_read() -> None:
    with NomadApiDouble() as api:
        api.require_token("right")
        client = NomadClient(NomadApiSettings(address=api.address, token="wrong", timeout=2.0))
        try:
            with pytest.raises(NomadApiError) as err:
                client.node_id()
            assert err.value.kind == "forbidden" and "agent:read" in str(err.value)
            assert "nomad_node_id" in str(err.value)
            with pytest.raises(NomadApiError) as err:
                client.node_allocations(api.node_id)
            assert "node:read" in str(err.value) and "agent:read" not in str(err.value)
        finally:
            client.close()


# --- MIG grants' compute env ------------------------------------------------------------------


@pytest.mark.parametrize(("slices", "percent"), [(1, 14), (2, 29), (3, 43), (4, 57), (7, 100)])
def test_mig_core_limit_reflects_the_slice(slices: int, percent: int) -> None:
    assert mig_core_percent(slices) == percent
    insts = [Instance(f"G-mig-{i}", Kind.MIG, "G", 3, i, 0, 10, 1) for i in range(slices)]
    grant = Grant(grant_id="g-1", devices=(GrantedDevice(3, "G", 0, 10 * slices, slices, "MIG-x"),))
    spec = build_container(grant, insts, GroupKey("nvidia", "gpu-mig", "H800 card3"), path_exists=lambda p: False)
    assert spec.envs["LINGJUN_CORE_LIMIT_PERCENT"] == str(percent)
    assert spec.envs["LINGJUN_MIG_SLICES"] == str(slices)


def test_existing_mig_instance_core_limit_from_its_slices() -> None:
    inst = Instance("MIG-a", Kind.MIG_INSTANCE, "G", 3, 0, 0, 40, 3, mig_uuid="MIG-a")
    grant = Grant(grant_id="g-2", devices=(GrantedDevice(3, "G", 0, 0, 0, "MIG-a"),))
    spec = build_container(grant, [inst], GroupKey("nvidia", "gpu", "H800 MIG 3g.40gb"), path_exists=lambda p: False)
    assert spec.envs["LINGJUN_CORE_LIMIT_PERCENT"] == "43"
