"""Profiles and topologies: seed goldens, invariants, variants, inventory over the wire."""

from __future__ import annotations

import json

import pytest

from nomad_plugin._proto.lingjun import api_outer_pb2 as pb
from nomad_plugin.sim import ALIASES, PROFILES, Simulator
from nomad_plugin.sim.profiles import build_cards, resolve_profile
from tests.seed_topologies import E810_GPU0 as GOLDEN_810E_GPU0
from tests.seed_topologies import M890P_GPU0 as GOLDEN_M890P_GPU0
from tests.sim.topology_invariants import check_invariants


def _devices(client) -> list[pb.Device]:
    stream = client.xdm.ListAndWatch(pb.ListAndWatchRequest(), timeout=5)
    first = next(stream)
    stream.cancel()
    return list(first.devices)


@pytest.mark.parametrize(("profile", "golden"), [("m890p-8", GOLDEN_M890P_GPU0), ("810e-16", GOLDEN_810E_GPU0)])
def test_gpu0_topology_equals_seed_example(make_sim, profile, golden):
    _, c = make_sim(profile)
    device0 = _devices(c)[0]
    assert device0.minor == 0
    assert json.loads(device0.extenderResources["topology"]) == json.loads(golden)


@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_invariants_hold_for_every_profile(profile):
    cards = build_cards(PROFILES[profile])
    topologies = {c.minor: json.loads(c.topology_json) for c in cards}
    assert check_invariants(topologies) == []
    assert len({c.uuid for c in cards}) == len(cards)
    assert len({c.pci_bus_id for c in cards}) == len(cards)
    for card in cards:
        assert card.pci_bus_id.startswith("0000:") and card.pci_bus_id.endswith(":00.0")
        for level in topologies[card.minor]["levels"]:
            assert None not in level.values()


def test_invariant_checker_catches_broken_data():
    topo = {
        0: {"levels": [{"level": 1, "name": "x", "topo1": [0], "peers": [1]}]},
        1: {"levels": [{"level": 1, "name": "x", "topo1": [1], "peers": [1]}]},
    }
    problems = check_invariants(topo)
    assert any("do not include the card itself" in p for p in problems)
    assert any("does not list 0 back" in p for p in problems)
    assert any("another domain" in p for p in problems)


def test_810e_icn_links_are_not_consecutive_and_cpu_socket_has_no_peers():
    cards = build_cards(PROFILES["810e-16"])
    topo = {c.minor: json.loads(c.topology_json)["levels"] for c in cards}
    icn2 = {tuple(lvl["peers"]) for levels in topo.values() for lvl in levels if lvl["name"] == "icnLink2"}
    assert (0, 3) in icn2 and (1, 2) in icn2
    assert all("peers" not in lvl for levels in topo.values() for lvl in levels if lvl["name"] == "cpuSockets")
    assert all(lvl["name"] != "hyperNode" for levels in topo.values() for lvl in levels)


def test_h800_levels_are_emitted_unsorted():
    levels = json.loads(build_cards(PROFILES["h800-8"])[0].topology_json)["levels"]
    numbers = [lvl["level"] for lvl in levels]
    assert numbers != sorted(numbers) and sorted(numbers) == [1, 2, 3, 21, 22]


def test_topology_variants():
    extra = json.loads(build_cards(PROFILES["m890p-8"], "extra-level")[0].topology_json)
    assert {"level": 15, "name": "rack2", "topo15": "rack2-01", "weight": 3.5} in extra["levels"]
    bad = build_cards(PROFILES["m890p-8"], "malformed")[0].topology_json
    with pytest.raises(ValueError):
        json.loads(bad)


@pytest.mark.parametrize(("alias", "name"), sorted(ALIASES.items()))
def test_aliases(alias, name):
    assert resolve_profile(alias).name == name


def test_unknown_profile_is_a_clear_error(sock_dir):
    with pytest.raises(ValueError, match=r"profile: unknown profile 'h900-8'"):
        Simulator(sock_dir, "h900-8")


def test_unknown_option_is_a_clear_error(sock_dir):
    with pytest.raises(TypeError, match="unknown option 'colour'"):
        Simulator(sock_dir, colour="red")
    with pytest.raises(ValueError, match="style: 'xml'"):
        Simulator(sock_dir, style="xml")


@pytest.mark.parametrize(
    ("profile", "model", "memory", "count", "prefix"),
    [
        ("h800-8", "NVIDIA H800", 81559, 8, "GPU-"),
        ("a100-8", "NVIDIA A100-SXM4-80GB", 81920, 8, "GPU-"),
        ("m890p-8", "PPU M890P", 147456, 8, "PPU-"),
        ("810e-16", "PPU 810E", 98304, 16, "PPU-"),
        ("l20-8", "NVIDIA L20", 46068, 8, "GPU-"),
    ],
)
def test_inventory_over_the_wire(make_sim, profile, model, memory, count, prefix):
    sim, c = make_sim(profile)
    devices = _devices(c)
    assert [d.minor for d in devices] == list(range(count))
    assert {d.model for d in devices} == {model} and {d.totalMemory for d in devices} == {memory}
    assert all(d.uuid.startswith(prefix) and d.health == "Healthy" and d.totalCore == 100 for d in devices)
    infos = c.xdm.ListGpuInfo(pb.ListGpuInfoRequest(), timeout=5).gpuInfos
    assert [(i.minor, i.uuid, i.totalMemory) for i in infos] == [(d.minor, d.uuid, d.totalMemory) for d in devices]
    assert all(i.driverVersion and i.vendor and i.serialNumber and i.sdkVersion for i in infos)
    assert {i.migEnabled for i in infos} == {PROFILES[sim.profile].mig_capable}
    xpu = c.xdm.ListSupportedXPUType(pb.XPUTypeRequest(), timeout=5)
    assert list(xpu.xpuTypes) == [PROFILES[sim.profile].xpu_type]


def test_uuids_are_stable_across_instances(sock_dir):
    first = [c.uuid for c in Simulator(sock_dir, "h800-8").cards]
    assert first == [c.uuid for c in Simulator(sock_dir, "nvidia-h800-8").cards]
    assert first != [c.uuid for c in Simulator(sock_dir, "a100-8").cards]


def test_gpu_info_minor_filter(sim_client):
    _, c = sim_client
    infos = c.xdm.ListGpuInfo(pb.ListGpuInfoRequest(minors=[2, 5]), timeout=5).gpuInfos
    assert [i.minor for i in infos] == [2, 5]
