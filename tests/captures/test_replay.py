"""Replay every capture bundle under tests/captures/ (issue 12 item 6).

Each bundle directory holds what ``xdm-probe --capture`` wrote plus
``expected-inventory.json``. Until the schema binder lands, a bundle with
reflection descriptors is decoded with them and must give exactly the expected
inventory; a bundle without is decoded with the builtin reconstruction and must
give it exactly when its truth is the builtin schema, and must NOT when it is
not (the silent trap the binder has to turn into a loud mismatch).
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import Any

import pytest

from nomad_plugin._proto.lingjun import api_outer_pb2 as pb
from nomad_plugin._proto.lingjun import config_service_pb2 as cfg
from nomad_plugin.xdm.capture import BINDING_REPORT, CAPTURED_RPCS, FORMAT, WRITING_RPCS, CaptureBundle, load_bundle
from tools.make_capture_bundles import BUNDLES, EXPECTED, make_bundle

HERE = Path(__file__).resolve().parent
BUNDLE_DIRS = sorted(p.parent for p in HERE.glob("*/manifest.json"))
BUILTIN_CLASSES = {
    "ListAndWatch": pb.ListAndWatchResponse,
    "ListGpuInfo": pb.ListGpuInfoResponse,
    "ListSupportedXPUType": pb.XPUTypeResponse,
    "QueryStatus": cfg.QueryStatusResponse,
}


def inventory(bundle: CaptureBundle, decode) -> dict[str, Any]:
    """The bundle's answers in expected-inventory.json's shape (the fields a binder must get right)."""
    law, infos = decode("ListAndWatch"), decode("ListGpuInfo")
    facts = {i.minor: i for i in infos.gpuInfos}
    cards = []
    for d in law.devices:
        info = facts.get(d.minor)
        cards.append({
            "minor": d.minor, "uuid": d.uuid, "model": d.model, "xpu_type": d.xpuType, "memory_mib": d.totalMemory,
            "total_core": d.totalCore, "pci_bus_id": d.pciBusId, "healthy": d.health == "Healthy",
            "vendor": info.vendor if info else "", "driver_version": info.driverVersion if info else "",
        })  # fmt: skip
    return {
        "cards": cards,
        "xpu_types": sorted(decode("ListSupportedXPUType").xpuTypes),
        "runtime_kit_enabled": decode("QueryStatus").enabled,
    }


def _expected(root: Path) -> dict[str, Any]:
    data = json.loads((root / EXPECTED).read_text())
    return {k: data[k] for k in ("cards", "xpu_types", "runtime_kit_enabled")}


def test_the_simulator_bundles_are_shipped():
    assert {p.name for p in BUNDLE_DIRS} >= {b.name for b in BUNDLES}


@pytest.mark.parametrize("root", BUNDLE_DIRS, ids=lambda p: p.name)
def test_bundle_is_complete_and_read_only(root: Path):
    bundle = load_bundle(root)
    assert bundle.manifest["format"] == FORMAT
    assert (root / EXPECTED).exists() and (root / BINDING_REPORT).exists()
    calls = {c["rpc"]: c for c in bundle.manifest["calls"]}
    assert set(calls) == {r[0] for r in CAPTURED_RPCS} and not set(calls) & WRITING_RPCS
    for rpc, call in calls.items():
        assert call["ok"], f"{rpc}: {call['error']}"
        data = bundle.raw(rpc)
        assert data is not None and hashlib.sha256(data).hexdigest() == call["sha256"], rpc
    assert set(bundle.manifest["versions"]) >= {"plugin", "python", "grpcio", "protobuf"}


@pytest.mark.parametrize("root", BUNDLE_DIRS, ids=lambda p: p.name)
def test_replay_gives_the_expected_inventory(root: Path):
    bundle = load_bundle(root)
    expected = _expected(root)
    truth = json.loads((root / EXPECTED).read_text())["source"]
    if bundle.descriptor_set("dp2mgr") is not None:
        assert inventory(bundle, bundle.decode) == expected
        return
    got = inventory(bundle, lambda rpc: BUILTIN_CLASSES[rpc].FromString(bundle.raw(rpc)))
    if truth.get("schema") == "builtin":
        assert got == expected
    else:  # the trap: the builtin numbers decode without error into wrong data
        assert got != expected
        assert [c["uuid"] for c in got["cards"]] == [c["pci_bus_id"] for c in expected["cards"]]


@pytest.mark.parametrize("spec", [b for b in BUNDLES if b.schema != "builtin"], ids=lambda b: b.name)
def test_capture_from_a_live_simulator_matches_the_shipped_bundle(spec, tmp_path, caplog):
    """Capturing again gives the same inventory and the same bytes for the static RPCs; nothing is written."""
    with caplog.at_level(logging.INFO, logger="nomad_plugin.sim"):
        manifest = make_bundle(spec, tmp_path)
    assert manifest["ok"]
    called = [r.getMessage().split(" ")[0] for r in caplog.records]
    assert "ListGpuInfo" in called and not set(called) & WRITING_RPCS
    fresh, shipped = load_bundle(tmp_path / spec.name), load_bundle(HERE / spec.name)
    for rpc in ("ListSupportedXPUType", "ListGpuInfo", "ListAndWatch", "QueryStatus"):
        assert fresh.raw(rpc) == shipped.raw(rpc), rpc
    assert _expected(tmp_path / spec.name) == _expected(HERE / spec.name)


@pytest.mark.parametrize("root", BUNDLE_DIRS, ids=lambda p: p.name)
def test_replay_through_the_binder(root: Path):
    """The plugin's own path: bind the bundle's schema source, decode with the adapter,
    judge with the guards. The real schema gives exactly the expected inventory; the
    builtin guess on a renumbered capture is a loud mismatch, never wrong cards."""
    from nomad_plugin.xdm.capture import bundle_binding, replay

    bundle = load_bundle(root)
    binding = bundle_binding(bundle)
    got = replay(bundle, binding)
    expected = _expected(root)
    truth = json.loads((root / EXPECTED).read_text())["source"]
    if bundle.descriptor_set("dp2mgr") is None and truth.get("schema") != "builtin":
        assert binding.source == "builtin"
        assert any("do not look like UUIDs" in p for p in got.problems), got.problems
        return
    assert got.problems == []
    facts = {f.minor: f for f in got.facts}
    cards = [
        {
            "minor": c.minor, "uuid": c.uuid, "model": c.model, "xpu_type": c.xpu_type, "memory_mib": c.memory_mib,
            "total_core": c.total_core, "pci_bus_id": c.pci_bus_id, "healthy": c.healthy,
            "vendor": facts[c.minor].vendor, "driver_version": facts[c.minor].driver_version,
        }
        for c in got.cards
    ]  # fmt: skip
    assert cards == expected["cards"]
    assert sorted(got.xpu_types) == expected["xpu_types"]
    assert got.runtime_kit_enabled == expected["runtime_kit_enabled"]


@pytest.mark.parametrize("root", BUNDLE_DIRS, ids=lambda p: p.name)
def test_shipped_binding_report_is_the_binders(root: Path):
    from nomad_plugin.xdm.capture import binding_report_hook

    shipped = json.loads((root / BINDING_REPORT).read_text())
    assert shipped == json.loads(json.dumps(binding_report_hook(load_bundle(root), None), sort_keys=True))
