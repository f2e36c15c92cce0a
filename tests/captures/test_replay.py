"""Replay every capture bundle under tests/captures/ through the schema binder.

Each bundle directory holds what ``xdm-probe --capture`` wrote plus
``expected-inventory.json``, whose ``expect`` says what the default config
(``xdm_schema = "auto"``) must make of it: exactly the inventory, or a loud
mismatch (plausibility findings, never wrong cards passed as fine). Simulator
bundles without reflection are also replayed with the served schema given as
``xdm_schema`` (the emitted .proto directory and the descriptor set), which
must give the inventory exactly. Independently of the binder, a bundle with
reflection decodes right with its own descriptors, and the builtin numbers
decode a renumbered bundle wrong without any error (the trap is real).
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
from nomad_plugin.config.decode import decode_config
from nomad_plugin.launcher.config import load_config, msgpack_config
from nomad_plugin.sim.schema import DESCRIPTOR_SET_FILE
from nomad_plugin.xdm.capture import (
    BINDING_REPORT,
    CAPTURED_RPCS,
    FORMAT,
    WRITING_RPCS,
    CaptureBundle,
    bind_bundle,
    replay,
)
from tests.captures.oracle import decode
from tests.doubles.drifted_schemas import served_schema
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
    bundle = CaptureBundle(root)
    assert bundle.manifest["format"] == FORMAT
    assert (root / EXPECTED).exists() and (root / BINDING_REPORT).exists()
    calls = {c["rpc"]: c for c in bundle.manifest["calls"]}
    assert set(calls) == set(CAPTURED_RPCS) and not set(calls) & WRITING_RPCS
    for rpc, call in calls.items():
        assert call["ok"], f"{rpc}: {call['error']}"
        data = bundle.raw(rpc)
        assert data is not None and hashlib.sha256(data).hexdigest() == call["sha256"], rpc
    assert set(bundle.manifest["versions"]) >= {"plugin", "python", "grpcio", "protobuf"}


def _config(*sets: str):
    return decode_config(msgpack_config(load_config(None, list(sets))))


@pytest.mark.parametrize("root", BUNDLE_DIRS, ids=lambda p: p.name)
def test_binder_replay_gives_the_expected_inventory_or_a_loud_mismatch(root: Path):
    bundle = CaptureBundle(root)
    expected = _expected(root)
    expect = json.loads((root / EXPECTED).read_text())["expect"]
    got = replay(bundle, bind_bundle(bundle, _config()))
    problems = got.pop("problems")
    if expect == "inventory":
        assert problems == []
        assert got == expected
    else:
        assert expect == "mismatch"
        assert problems, "wrong data passed every check"
        assert got != expected
    report = json.loads((root / BINDING_REPORT).read_text())
    assert report["available"] and bool(report["findings"]) == (expect == "mismatch")


@pytest.mark.parametrize("root", [p for p in BUNDLE_DIRS if (p / EXPECTED).exists() and json.loads(
    (p / EXPECTED).read_text())["source"].get("kind") == "simulator"], ids=lambda p: p.name)  # fmt: skip
@pytest.mark.parametrize("form", ["proto-dir", "descriptor-set"])
def test_binder_replay_with_the_served_schema_as_xdm_schema(root: Path, form: str, tmp_path: Path):
    truth = json.loads((root / EXPECTED).read_text())["source"]["schema"]
    served_schema(truth).emit(tmp_path)
    path = tmp_path if form == "proto-dir" else tmp_path / DESCRIPTOR_SET_FILE
    if form == "proto-dir":
        (tmp_path / DESCRIPTOR_SET_FILE).unlink()  # a directory of .proto files only
    bundle = CaptureBundle(root)
    binding = bind_bundle(bundle, _config(f'xdm_schema="{path}"'))
    assert binding.source == str(path)
    got = replay(bundle, binding)
    assert got.pop("problems") == []
    assert got == _expected(root)


@pytest.mark.parametrize("root", BUNDLE_DIRS, ids=lambda p: p.name)
def test_replay_without_the_binder(root: Path):
    bundle = CaptureBundle(root)
    expected = _expected(root)
    truth = json.loads((root / EXPECTED).read_text())["source"]
    if bundle.descriptor_set("dp2mgr") is not None:
        assert inventory(bundle, lambda rpc: decode(bundle, rpc)) == expected
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
    fresh, shipped = CaptureBundle(tmp_path / spec.name), CaptureBundle(HERE / spec.name)
    for rpc in ("ListSupportedXPUType", "ListGpuInfo", "ListAndWatch", "QueryStatus"):
        assert fresh.raw(rpc) == shipped.raw(rpc), rpc
    assert _expected(tmp_path / spec.name) == _expected(HERE / spec.name)
