"""The simulator's Runtime Kit switch (the safest reading, docs/xdm-risks.md) and topology changes."""

from __future__ import annotations

import json
from typing import Any

import grpc
import pytest

from nomad_plugin._proto.lingjun import api_outer_pb2 as pb
from nomad_plugin._proto.lingjun import config_service_pb2 as cfg
from nomad_plugin.sim.simulator import run_command
from tests.sim.topology_invariants import check_invariants


def first_push(c: Any) -> pb.ListAndWatchResponse:
    stream = c.xdm.ListAndWatch(pb.ListAndWatchRequest(), timeout=5)
    try:
        return next(stream)
    finally:
        stream.cancel()


def test_disabled_keeps_cards_and_grants_refuses_only_new_allocations(sim_client) -> None:  # type: ignore[no-untyped-def]
    sim, c = sim_client
    kept = c.allocate("kept", {"minor": 0})
    assert kept.status == 0 and sim.grants()
    assert c.config.Disable(cfg.DisableRequest(), timeout=5).message == "disabled"
    again = c.config.Disable(cfg.DisableRequest(), timeout=5)
    assert again.success and again.message == "already disabled"  # idempotent
    assert len(first_push(c).devices) == len(sim.cards)  # every card still listed
    assert all(d.health == "Healthy" for d in first_push(c).devices)
    refused = c.allocate("new", {"minor": 1})
    assert refused.status != 0 and "disabled" in refused.message
    assert "kept" in sim.grants() and "new" not in sim.grants()
    assert c.xdm.Release(pb.ReleaseRequest(id="kept"), timeout=5).status == 0  # release still works
    assert not sim.grants()
    assert c.config.Enable(cfg.EnableRequest(), timeout=5).success
    assert c.allocate("after", {"minor": 1}).status == 0
    assert sim.calls()["Disable"] == 2 and sim.calls()["Enable"] == 1


def test_disabled_effect_none_allocates_anyway(make_sim) -> None:  # type: ignore[no-untyped-def]
    sim, c = make_sim(disabled_effect="none", enabled=False)
    assert c.config.QueryStatus(cfg.QueryStatusRequest(), timeout=5).enabled is False
    assert c.allocate("g", {"minor": 0}).status == 0 and "g" in sim.grants()


def test_topology_levels_change_and_push(sim_client) -> None:  # type: ignore[no-untyped-def]
    sim, c = sim_client
    stream = c.xdm.ListAndWatch(pb.ListAndWatchRequest(), timeout=10)
    try:
        next(stream)
        sim.set_topology_level("leafSwitch", "asw-107", [6, 7])
        pushed = next(stream)
    finally:
        stream.cancel()
    leaves = {d.minor: _level(d, "leafSwitch") for d in pushed.devices}
    assert leaves[6] == leaves[7] == "asw-107" and leaves[0] == "asw-001"
    run_command(sim, ["topology", "rack", "r9"])  # a new level on every card
    run_command(sim, ["topology", "pointOfDelivery", "none", "0"])
    devices = {d.minor: d for d in first_push(c).devices}
    assert _level(devices[3], "rack") == "r9" and _level(devices[0], "pointOfDelivery") is None
    assert _level(devices[1], "pointOfDelivery") == "pod-a01-p1"
    assert _level(sim.cards[6], "leafSwitch") == "asw-107"  # the cards' own record follows
    assert not check_invariants({c2.minor: json.loads(c2.topology_json) for c2 in sim.cards})
    with pytest.raises(ValueError, match="usage"):
        run_command(sim, ["topology", "rack"])
    with pytest.raises(ValueError, match="no card 99"):
        run_command(sim, ["topology", "rack", "x", "99"])


def _level(device: Any, name: str) -> Any:
    topology = device.extenderResources["topology"] if isinstance(device, pb.Device) else device.topology_json
    for level in json.loads(topology)["levels"]:
        if level["name"] == name:
            return level[f"topo{level['level']}"]
    return None


def test_every_rpc_is_counted(sim_client) -> None:  # type: ignore[no-untyped-def]
    sim, c = sim_client
    c.config.QueryStatus(cfg.QueryStatusRequest(), timeout=5)
    with pytest.raises(grpc.RpcError):
        c.raw("/nope.Service/Nope")
    assert sim.calls()["QueryStatus"] == 1 and "Enable" not in sim.calls()
    assert sim.status()["calls"]["QueryStatus"] == 1
