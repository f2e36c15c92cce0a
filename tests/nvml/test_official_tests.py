"""nomad-device-nvidia's own unit-test tables, row by row, through the real plugin process.

Rows of its ``fingerprint_test.go``, ``stats_test.go``, ``device_test.go``
and ``nvml/client_test.go`` (main 05e83c3; facts carried over, not code). The
official tests feed a mocked NVML client to inner functions; here each row
becomes a node of the NVML double that yields the same NVML readings, the
real plugin executable runs on it under the Go conformance host, and the
row's expected result is checked against what the plugin sent Nomad.

Where a row's mock values are ones real NVML cannot produce through that
plugin's own driver, the row is adapted, and ``ADAPTED`` says how: a PCIe
bandwidth of 1 MB/s (NVML gives lane count x a per-lane rate of at least
1024), "Enabled" display and persistence states (its driver prints go-nvml's
enum, "1"), a power usage of 1 mW over 1 W (its stats put the milliwatts
over the watts of the same reading), and two stats nil alone that one NVML
call returns together (GPU and memory utilisation). A "nil" reading is one
NVML cannot take (NoPermission): statsForItem shows it "N/A", as here. Rows
whose outcome is a documented decision (the official ends the stream with an
error where this plugin keeps serving) check this plugin's side of it.

Rows that test an inner function with input the pipeline never builds
(``TestStatsForGroup``: stats of three device names in one group;
``TestAttributesFromFingerprintDeviceData`` "nil values are omitted" with the
memory nil, which NVML always answers or fails) are ported with the nearest
input NVML produces, named in ``ADAPTED``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.conformance.conftest import conformance_host
from tests.doubles.fake_pynvml import (
    NVML_ERROR_NO_PERMISSION,
    NVML_ERROR_NOT_SUPPORTED,
    NVML_ERROR_UNKNOWN,
    FakeGpu,
    FakeMig,
)
from tests.nvml.dropin import PluginNode, Scenario

__all__ = ["conformance_host"]

DENIED = NVML_ERROR_NO_PERMISSION
UNKNOWN = NVML_ERROR_UNKNOWN
ADAPTED = {
    "pci_bandwidth": "1 MB/s is not a PCIe width x lane rate; gen 3 x1 = 1024 MB/s, the smallest NVML yields",
    "enabled": "its driver formats go-nvml's EnableState with %v: 1, not Enabled",
    "power usage": "its stats put the draw in mW over the draw in W: 1000 mW over 1 W",
    "utilization": "GPU and memory utilisation are one NVML call: both are N/A together",
    "nil memory": "NVML answers memory or fails; the reading NVML can leave nil is BAR1 (NotSupported)",
    "group of three names": "the pipeline groups stats by device name: three names are three groups",
    "mig name": "a MIG device's name is NVML's MIG device name (<card> MIG <profile>), not the parent's",
    "stats power": "its stats mocks give the fingerprint 100 W and the stats 1 mW of one reading: 100 W is kept",
}
WORKERS = 3


def dev(uuid: str, name: str, minor: int, **kw: Any) -> dict[str, Any]:
    """A GPU whose NVML readings give the official DeviceInfo of a table row (defaults: the rows' 1s)."""
    gpu = FakeGpu(
        name=name,
        memory_total_mib=kw.pop("memory", 1000),
        pci_bus_id=f"00000000:{0x10 + minor:02X}:00.0",
        minor=minor,
        uuid=uuid,
        power_mw=kw.pop("power_w", 100) * 1000,
        bar1_total_mib=kw.pop("bar1", 256),
        pcie_gen=3,
        pcie_width=kw.pop("pci_lanes", 1),
        graphics_clock_mhz=kw.pop("cores_clock", 1),
        memory_clock_mhz=kw.pop("memory_clock", 1),
        display_mode=1,
        persistence_mode=1,
        mig_capable=False,
    )
    for key, value in kw.items():
        setattr(gpu, key, value)
    return asdict(gpu)


def stats_dev(uuid: str, name: str, minor: int, n: int, **kw: Any) -> dict[str, Any]:
    """A GPU whose stats readings are the rows' ``n`` everywhere (ECC ``100 n``, BAR1 of 256 MiB)."""
    return dev(
        uuid,
        name,
        minor,
        memory=n,
        power_w=n,
        memory_used_mib=n,
        util_gpu=n,
        util_memory=n,
        encoder_util=n,
        decoder_util=n,
        temperature_c=n,
        bar1_used_mib=n,
        ecc_l1_corrected=100 * n,
        ecc_l2_corrected=100 * n,
        ecc_sbe=100 * n,
        **kw,
    )


@dataclass
class Row:
    test: str
    name: str
    node: list[dict[str, Any]] | dict[str, Any]
    config: dict[str, Any] = field(default_factory=dict)
    reserves: list[list[str]] = field(default_factory=list)
    empty: bool = False

    @property
    def id(self) -> str:
        return f"{self.test}/{self.name}"


@dataclass
class Seen:
    groups: list[dict[str, Any]]
    stats: dict[str, dict[str, Any]]
    reserves: list[dict[str, Any]]
    stderr: str
    violations: list[dict[str, Any]]


THREE = [dev(f"UUID{i}", f"DeviceName{i}", i, memory=1000) for i in (1, 2, 3)]
#: Nomad reserves from one group at a time (its device manager picks the group holding every ID)
ONE_GROUP = [dev(f"UUID{i}", "DeviceName", i) for i in (1, 2, 3)]
NAMES = [dev("1", "Name1", 1, memory=10), dev("2", "Name2", 2, memory=11), dev("3", "Name3", 3, memory=12)]
NAMES_2 = [dev("1", "Name1", 1, memory=10), dev("2", "Name2", 2, memory=11), dev("3", "Name2", 3, memory=12)]
TYPE1 = [dev("1", "Type1", 1, memory=100, power_w=2), dev("2", "Type1", 2, memory=100, power_w=2)]
STATS3 = [stats_dev(f"UUID{n}", f"DeviceName{n}", n, n) for n in (1, 2, 3)]
STATS3_2 = [stats_dev("UUID1", "DeviceName1", 1, 1), *(stats_dev(f"UUID{n}", "DeviceName2", n, n) for n in (2, 3))]
ONE = [stats_dev("UUID1", "DeviceName1", 1, 1, bar1_total_mib=256)]


def _nil(errors: dict[str, int]) -> list[dict[str, Any]]:
    return [stats_dev("UUID1", "DeviceName1", 1, 1, errors=errors)]


def _migs() -> list[dict[str, Any]]:
    """client_test "successful migs": UUID1, UUID2 normal; UUID3 a MIG parent whose MIG device is UUID4."""
    parent = dev("UUID3", "ModelName", 3, memory=8, power_w=200, mig_capable=True, mig_enabled=True)
    parent["migs"] = [asdict(FakeMig("1g.10gb", 8, gpu_instance_id=1, uuid="UUID4"))]
    return [
        dev("UUID1", "ModelName", 1, memory=16, power_w=100, bar1=100),
        dev("UUID2", "ModelName", 2, memory=8, power_w=200, bar1=200),
        parent,
    ]


ROWS = [
    # fingerprint_test.go TestIgnoreFingerprintedDevices
    Row("TestIgnoreFingerprintedDevices", "Odd ignored", THREE, {"ignored_gpu_ids": ["UUID2"]}),
    Row("TestIgnoreFingerprintedDevices", "Even ignored", THREE, {"ignored_gpu_ids": ["UUID1", "UUID3"]}),
    Row(
        "TestIgnoreFingerprintedDevices",
        "All ignored",
        THREE,
        {"ignored_gpu_ids": ["UUID1", "UUID2", "UUID3"]},
        empty=True,
    ),
    Row("TestIgnoreFingerprintedDevices", "No ignored", THREE),
    Row(
        "TestIgnoreFingerprintedDevices",
        "No DeviceData provided",
        [],
        {"ignored_gpu_ids": ["UUID1", "UUID2", "UUID3"]},
        empty=True,
    ),
    # fingerprint_test.go TestAttributesFromFingerprintDeviceData
    Row(
        "TestAttributesFromFingerprintDeviceData",
        "All attributes are not nil",
        [dev("1", "Type1", 1, memory=256, power_w=2)],
    ),
    Row(
        "TestAttributesFromFingerprintDeviceData",
        "nil values are omitted",
        [dev("1", "Type1", 1, memory=256, power_w=2, errors={"nvmlDeviceGetBAR1MemoryInfo": NVML_ERROR_NOT_SUPPORTED})],
    ),
    # fingerprint_test.go TestDeviceGroupFromFingerprintData
    Row("TestDeviceGroupFromFingerprintData", "Devices are provided", TYPE1),
    Row(
        "TestDeviceGroupFromFingerprintData",
        "Devices and common attributes are provided",
        {"gpus": TYPE1, "driver_version": "1"},
    ),
    Row("TestDeviceGroupFromFingerprintData", "Devices are not provided", [], empty=True),
    # fingerprint_test.go TestWriteFingerprintToChannel
    Row(
        "TestWriteFingerprintToChannel",
        "Check that FingerprintError is handled properly",
        [dev("1", "Name", 1, errors={"nvmlDeviceGetName": DENIED, "nvmlDeviceGetMemoryInfo": DENIED})],
    ),
    Row(
        "TestWriteFingerprintToChannel",
        "Check ignore devices works correctly",
        {"gpus": [dev("1", "Name", 1, memory=10), dev("2", "Name", 2, memory=10)], "driver_version": "1"},
        {"ignored_gpu_ids": ["1"]},
    ),
    Row(
        "TestWriteFingerprintToChannel",
        "Check devices are split to multiple device groups 1",
        {"gpus": NAMES, "driver_version": "1"},
    ),
    Row(
        "TestWriteFingerprintToChannel",
        "Check devices are split to multiple device groups 2",
        {"gpus": NAMES_2, "driver_version": "1"},
    ),
    # fingerprint_test.go TestFingerprint
    Row(
        "TestFingerprint",
        "Check that working driver returns valid fingeprint data",
        {"gpus": [dev(str(i), "Name1", i, memory=10) for i in (1, 2, 3)], "driver_version": "1"},
    ),
    Row(
        "TestFingerprint",
        "Check that not working driver returns error fingeprint data",
        {"gpus": [dev(str(i), "Name1", i, memory=10) for i in (1, 2, 3)], "init_error": 999},
        empty=True,
    ),
    # stats_test.go TestFilterStatsByID
    Row("TestFilterStatsByID", "All ids are in the map", STATS3_2),
    Row("TestFilterStatsByID", "Odd are not provided in the map", STATS3_2, {"ignored_gpu_ids": ["UUID1", "UUID3"]}),
    Row("TestFilterStatsByID", "Even are not provided in the map", STATS3_2, {"ignored_gpu_ids": ["UUID2"]}),
    Row("TestFilterStatsByID", "No Stats were provided", [], empty=True),
    Row(
        "TestFilterStatsByID",
        "No Ids were provided",
        STATS3_2,
        {"ignored_gpu_ids": ["UUID1", "UUID2", "UUID3"]},
        empty=True,
    ),
    # stats_test.go TestStatsForItem
    Row("TestStatsForItem", "All fields in ItemStat are not nil", ONE),
    Row("TestStatsForItem", "Power usage is nil", _nil({"nvmlDeviceGetPowerUsage": DENIED})),
    Row("TestStatsForItem", "PowerW is nil", _nil({"nvmlDeviceGetPowerUsage": DENIED})),
    Row("TestStatsForItem", "GPUUtilization is nil", _nil({"nvmlDeviceGetUtilizationRates": DENIED})),
    Row("TestStatsForItem", "MemoryUtilization is nil", _nil({"nvmlDeviceGetUtilizationRates": DENIED})),
    Row("TestStatsForItem", "EncoderUtilization is nil", _nil({"nvmlDeviceGetEncoderUtilization": DENIED})),
    Row("TestStatsForItem", "DecoderUtilization is nil", _nil({"nvmlDeviceGetDecoderUtilization": DENIED})),
    Row("TestStatsForItem", "Temperature is nil", _nil({"nvmlDeviceGetTemperature": DENIED})),
    Row("TestStatsForItem", "UsedMemoryMiB is nil", _nil({"nvmlDeviceGetMemoryInfo": DENIED})),
    Row("TestStatsForItem", "MemoryMiB is nil", _nil({"nvmlDeviceGetMemoryInfo": DENIED})),
    Row("TestStatsForItem", "BAR1UsedMiB is nil", _nil({"nvmlDeviceGetBAR1MemoryInfo": DENIED})),
    Row("TestStatsForItem", "BAR1MiB is nil", _nil({"nvmlDeviceGetBAR1MemoryInfo": DENIED})),
    Row("TestStatsForItem", "ECCErrorsL1Cache is nil", _nil({"nvmlDeviceGetMemoryErrorCounter:0": DENIED})),
    Row("TestStatsForItem", "ECCErrorsL2Cache is nil", _nil({"nvmlDeviceGetMemoryErrorCounter:1": DENIED})),
    Row("TestStatsForItem", "ECCErrorsDevice is nil", _nil({"nvmlDeviceGetMemoryErrorCounter:2": DENIED})),
    # stats_test.go TestStatsForGroup, TestWriteStatsToChannel
    Row("TestStatsForGroup", "make sure that all data is transformed correctly", STATS3),
    Row(
        "TestWriteStatsToChannel", "Check that stats with multiple DeviceNames are assigned to different groups", STATS3
    ),
    Row(
        "TestWriteStatsToChannel",
        "Check that stats with multiple DeviceNames are assigned to different groups 2",
        STATS3_2,
    ),
    Row(
        "TestWriteStatsToChannel",
        "Check that only devices from NvidiaDevice.device map stats are reported",
        STATS3,
        {"ignored_gpu_ids": ["UUID3"]},
    ),
    # device_test.go TestReserve
    Row(
        "TestReserve",
        "All RequestedIDs are not managed by Device",
        [],
        reserves=[["UUID1", "UUID2", "UUID3"]],
        empty=True,
    ),
    Row(
        "TestReserve",
        "Some RequestedIDs are not managed by Device",
        [dev("UUID3", "N", 3)],
        reserves=[["UUID1", "UUID2", "UUID3"]],
    ),
    Row("TestReserve", "All RequestedIDs are managed by Device", ONE_GROUP, reserves=[["UUID1", "UUID2", "UUID3"]]),
    Row("TestReserve", "No IDs requested", THREE, reserves=[[]]),
    Row(
        "TestReserve",
        "Device is disabled",
        THREE,
        {"enabled": False},
        reserves=[["UUID1", "UUID2", "UUID3"]],
        empty=True,
    ),
    # nvml/client_test.go TestGetFingerprintDataFromNVML, TestGetStatsDataFromNVML
    Row(
        "TestGetFingerprintDataFromNVML",
        "successful outcome",
        {
            "gpus": [
                dev("UUID1", "ModelName1", 1, memory=16, power_w=100, bar1=100, cores_clock=100, memory_clock=100),
                dev("UUID2", "ModelName2", 2, memory=8, power_w=200, bar1=200, cores_clock=200, memory_clock=200),
            ],
            "driver_version": "driverVersion",
        },
    ),
    Row("TestGetFingerprintDataFromNVML", "successful migs", {"gpus": _migs(), "driver_version": "driverVersion"}),
    Row(
        "TestGetFingerprintDataFromNVML",
        "fail on deviceInfoByUUIDCall",
        [dev("UUID1", "ModelName1", 1, errors={"nvmlDeviceGetPciInfo": DENIED})],
    ),
    Row("TestGetStatsDataFromNVML", "successful migs", {"gpus": _migs(), "driver_version": "driverVersion"}),
    Row(
        "TestGetFingerprintDataFromNVML",
        "fail on systemDriverCallSuccessful",
        {"gpus": [dev("UUID1", "ModelName1", 1)], "errors": {"nvmlSystemGetDriverVersion": UNKNOWN}},
        empty=True,
    ),
    Row(
        "TestGetFingerprintDataFromNVML",
        "fail on deviceCountCallSuccessful",
        {"gpus": [dev("UUID1", "ModelName1", 1)], "errors": {"nvmlDeviceGetCount": UNKNOWN}},
        empty=True,
    ),
    Row(
        "TestGetStatsDataFromNVML",
        "fail on listDeviceUUIDsCallSuccessful",
        {"gpus": [dev("UUID1", "ModelName1", 1)], "errors": {"nvmlDeviceGetCount": UNKNOWN}},
        empty=True,
    ),
    Row(
        "TestGetStatsDataFromNVML",
        "fail on DeviceInfoAndStatusByUUID call",
        [stats_dev("UUID1", "ModelName1", 1, 1, errors={"nvmlDeviceGetUtilizationRates": UNKNOWN})],
    ),
    Row(
        "TestGetStatsDataFromNVML",
        "successful outcome",
        [
            stats_dev("UUID1", "ModelName1", 1, 1, memory_total_mib=16, power_mw=100_000, bar1_total_mib=100),
            stats_dev("UUID2", "ModelName2", 2, 2, memory_total_mib=8, power_mw=200_000, bar1_total_mib=200),
        ],
    ),
    Row(
        "TestWriteStatsToChannel",
        "NVML wrapper returns error",
        [stats_dev("UUID1", "DeviceName1", 1, 1, errors={"nvmlDeviceGetUtilizationRates": UNKNOWN})],
    ),
]
BY_ID = {r.id: r for r in ROWS}


@pytest.fixture(scope="module")
def seen(conformance_host: Path) -> Iterator[dict[str, Seen]]:
    def one(row: Row) -> tuple[str, Seen]:
        scenario = Scenario(row.id, row.node, config=row.config, empty=row.empty)
        with PluginNode(scenario, conformance_host) as node:
            groups = node.fingerprint(want_devices=not row.empty)
            ids = {d["id"] for g in groups for d in g["devices"]}
            stats = node.stats(ids)
            reserves = [node.reserve(r, f"r{n}") for n, r in enumerate(row.reserves)]
            run = node.proc.finish()
        return row.id, Seen(groups, stats, reserves, run.stderr, run.violations)

    with ThreadPoolExecutor(WORKERS) as pool:
        yield dict(pool.map(one, ROWS))


def _row(seen: dict[str, Seen], test: str, name: str) -> Seen:
    found = seen[f"{test}/{name}"]
    assert not found.violations, json.dumps(found.violations)[:2000]
    return found


def _ids(found: Seen) -> list[str]:
    return [d["id"] for g in found.groups for d in g["devices"]]


def _attrs(found: Seen, group: str) -> dict[str, Any]:
    got = {g["name"]: g for g in found.groups}[group]["attributes"]
    return {k: (v["value"], v["unit"]) for k, v in got.items()}


def _official(**values: tuple[Any, str]) -> dict[str, tuple[Any, str]]:
    return values


# The rows' attribute sets, adapted where ADAPTED says (pci_bandwidth, the two states).
ALL_ONES = _official(
    pci_bandwidth=(1024, "MB/s"),
    cores_clock=(1, "MHz"),
    memory_clock=(1, "MHz"),
    display_state=("1", ""),
    persistence_mode=("1", ""),
)


# --- fingerprint_test.go -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "kept"),
    [
        ("Odd ignored", ["UUID1", "UUID3"]),
        ("Even ignored", ["UUID2"]),
        ("All ignored", []),
        ("No ignored", ["UUID1", "UUID2", "UUID3"]),
        ("No DeviceData provided", []),
    ],
)
def test_ignore_fingerprinted_devices(seen: dict[str, Seen], name: str, kept: list[str]) -> None:
    assert sorted(_ids(_row(seen, "TestIgnoreFingerprintedDevices", name))) == kept


def test_attributes_all_not_nil(seen: dict[str, Seen]) -> None:
    attrs = _attrs(_row(seen, "TestAttributesFromFingerprintDeviceData", "All attributes are not nil"), "Type1")
    want = {**ALL_ONES, "memory": (256, "MiB"), "power": (2, "W"), "bar1": (256, "MiB")}
    assert {k: attrs.get(k) for k in want} == want


def test_attributes_nil_values_are_omitted(seen: dict[str, Seen]) -> None:
    """Adapted ("nil memory"): the nil reading is BAR1; it is left out, the others stay."""
    attrs = _attrs(_row(seen, "TestAttributesFromFingerprintDeviceData", "nil values are omitted"), "Type1")
    assert "bar1" not in attrs
    assert attrs["power"] == (2, "W") and attrs["display_state"] == ("1", "") and attrs["persistence_mode"] == ("1", "")


@pytest.mark.parametrize(
    ("name", "driver"),
    [("Devices are provided", "550.54.15"), ("Devices and common attributes are provided", "1")],
)
def test_device_group_from_fingerprint_data(seen: dict[str, Seen], name: str, driver: str) -> None:
    found = _row(seen, "TestDeviceGroupFromFingerprintData", name)
    assert [(g["vendor"], g["type"], g["name"]) for g in found.groups] == [("nvidia", "gpu", "Type1")]
    assert [(d["id"], d["healthy"]) for d in found.groups[0]["devices"]] == [("1", True), ("2", True)]
    want = {**ALL_ONES, "memory": (100, "MiB"), "power": (2, "W"), "bar1": (256, "MiB"), "driver_version": (driver, "")}
    attrs = _attrs(found, "Type1")
    assert {k: attrs.get(k) for k in want} == want


def test_device_group_devices_are_not_provided(seen: dict[str, Seen]) -> None:
    assert _row(seen, "TestDeviceGroupFromFingerprintData", "Devices are not provided").groups == []


def test_write_fingerprint_error_keeps_the_card_unhealthy_instead_of_ending_the_stream(seen: dict[str, Seen]) -> None:
    """The official answers an error and Nomad stops the plugin (docs/nvidia-dropin.md, failed-readings):
    here the card NVML cannot describe stays, unhealthy, with NVML's error as the reason."""
    found = _row(seen, "TestWriteFingerprintToChannel", "Check that FingerprintError is handled properly")
    (device,) = [d for g in found.groups for d in g["devices"]]
    assert device["id"] == "1" and device["healthy"] is False
    assert "Insufficient Permissions" in device["health_description"], device


def test_write_fingerprint_ignore_devices(seen: dict[str, Seen]) -> None:
    found = _row(seen, "TestWriteFingerprintToChannel", "Check ignore devices works correctly")
    assert _ids(found) == ["2"]
    assert _attrs(found, "Name")["memory"] == (10, "MiB") and _attrs(found, "Name")["driver_version"] == ("1", "")


def test_write_fingerprint_split_groups_1(seen: dict[str, Seen]) -> None:
    found = _row(seen, "TestWriteFingerprintToChannel", "Check devices are split to multiple device groups 1")
    assert {g["name"]: [d["id"] for d in g["devices"]] for g in found.groups} == {
        "Name1": ["1"],
        "Name2": ["2"],
        "Name3": ["3"],
    }
    assert [_attrs(found, f"Name{i}")["memory"] for i in (1, 2, 3)] == [(10, "MiB"), (11, "MiB"), (12, "MiB")]


def test_write_fingerprint_split_groups_2(seen: dict[str, Seen]) -> None:
    """Name2 holds devices 2 and 3 with 11 and 12 MiB: the group shows its first device's, 11."""
    found = _row(seen, "TestWriteFingerprintToChannel", "Check devices are split to multiple device groups 2")
    assert {g["name"]: [d["id"] for d in g["devices"]] for g in found.groups} == {"Name1": ["1"], "Name2": ["2", "3"]}
    assert _attrs(found, "Name2")["memory"] == (11, "MiB")
    assert {k: _attrs(found, "Name2")[k] for k in ALL_ONES} == ALL_ONES


def test_fingerprint_working_driver(seen: dict[str, Seen]) -> None:
    found = _row(seen, "TestFingerprint", "Check that working driver returns valid fingeprint data")
    assert [(g["name"], [d["id"] for d in g["devices"]]) for g in found.groups] == [("Name1", ["1", "2", "3"])]
    assert _attrs(found, "Name1")["memory"] == (10, "MiB") and _attrs(found, "Name1")["power"] == (100, "W")


def test_fingerprint_not_working_driver_keeps_the_stream_open(seen: dict[str, Seen]) -> None:
    """The official sends the init error and Nomad stops the plugin; here no device, the stream open, the error logged."""
    found = _row(seen, "TestFingerprint", "Check that not working driver returns error fingeprint data")
    assert found.groups == []
    assert "NVML Error with code 999" in found.stderr or "Unknown Error" in found.stderr, found.stderr[-2000:]


# --- stats_test.go -------------------------------------------------------------------------------


def _stat(found: Seen, uuid: str, name: str) -> tuple[Any, ...]:
    value = found.stats[uuid]["stats"][name]
    if "string" in value:
        return (value["string"], value.get("unit", ""))
    return (value.get("int_numerator"), value.get("int_denominator"), value.get("unit", ""))


def _official_stats(n: int) -> dict[str, tuple[Any, ...]]:
    """statsForItem of a row whose readings are all ``n`` (power usage adapted: n W draw = 1000 n mW)."""
    return {
        "Power usage": (1000 * n, n, "W"),
        "GPU utilization": (n, None, "%"),
        "Memory utilization": (n, None, "%"),
        "Encoder utilization": (n, None, "%"),
        "Decoder utilization": (n, None, "%"),
        "Temperature": (n, None, "C"),
        "Memory state": (n, n, "MiB"),
        "BAR1 buffer state": (n, 256, "MiB"),
        "ECC L1 errors": (100 * n, None, "#"),
        "ECC L2 errors": (100 * n, None, "#"),
        "ECC memory errors": (100 * n, None, "#"),
    }


@pytest.mark.parametrize(
    ("name", "reported"),
    [
        ("All ids are in the map", ["UUID1", "UUID2", "UUID3"]),
        ("Odd are not provided in the map", ["UUID2"]),
        ("Even are not provided in the map", ["UUID1", "UUID3"]),
        ("No Stats were provided", []),
        ("No Ids were provided", []),
    ],
)
def test_filter_stats_by_id(seen: dict[str, Seen], name: str, reported: list[str]) -> None:
    assert sorted(_row(seen, "TestFilterStatsByID", name).stats) == reported


NIL_ROWS = {
    "Power usage is nil": ["Power usage"],
    "PowerW is nil": ["Power usage"],
    "GPUUtilization is nil": ["GPU utilization", "Memory utilization"],  # adapted: "utilization"
    "MemoryUtilization is nil": ["GPU utilization", "Memory utilization"],
    "EncoderUtilization is nil": ["Encoder utilization"],
    "DecoderUtilization is nil": ["Decoder utilization"],
    "Temperature is nil": ["Temperature"],
    "UsedMemoryMiB is nil": ["Memory state"],
    "MemoryMiB is nil": ["Memory state"],
    "BAR1UsedMiB is nil": ["BAR1 buffer state"],
    "BAR1MiB is nil": ["BAR1 buffer state"],
    "ECCErrorsL1Cache is nil": ["ECC L1 errors"],
    "ECCErrorsL2Cache is nil": ["ECC L2 errors"],
    "ECCErrorsDevice is nil": ["ECC memory errors"],
}


def test_stats_for_item_all_fields_not_nil(seen: dict[str, Seen]) -> None:
    found = _row(seen, "TestStatsForItem", "All fields in ItemStat are not nil")
    assert {k: _stat(found, "UUID1", k) for k in _official_stats(1)} == _official_stats(1)
    summary = found.stats["UUID1"]["summary"]
    assert (summary["int_numerator"], summary["int_denominator"], summary["unit"]) == (1, 1, "MiB")


@pytest.mark.parametrize("name", list(NIL_ROWS))
def test_stats_for_item_a_nil_reading_is_na(seen: dict[str, Seen], name: str) -> None:
    found = seen[f"TestStatsForItem/{name}"]
    uuid = "UUID1"
    if name in ("UsedMemoryMiB is nil", "MemoryMiB is nil"):
        # NVML cannot read the card's memory: the card is offered unhealthy, its stats still flow.
        assert [d["healthy"] for g in found.groups for d in g["devices"]] == [False]
    want = _official_stats(1)
    for stat in NIL_ROWS[name]:
        want[stat] = ("N/A", want[stat][-1])
    assert {k: _stat(found, uuid, k) for k in want} == want


def test_stats_for_group_adapted(seen: dict[str, Seen]) -> None:
    """Adapted ("group of three names"): each device's stats under its own name's group, values as its row."""
    found = _row(seen, "TestStatsForGroup", "make sure that all data is transformed correctly")
    for n in (1, 2, 3):
        assert {k: _stat(found, f"UUID{n}", k) for k in _official_stats(n)} == {
            **_official_stats(n),
            "BAR1 buffer state": (n, 256, "MiB"),
        }


@pytest.mark.parametrize(
    ("name", "groups"),
    [
        (
            "Check that stats with multiple DeviceNames are assigned to different groups",
            {"DeviceName1": ["UUID1"], "DeviceName2": ["UUID2"], "DeviceName3": ["UUID3"]},
        ),
        (
            "Check that stats with multiple DeviceNames are assigned to different groups 2",
            {"DeviceName1": ["UUID1"], "DeviceName2": ["UUID2", "UUID3"]},
        ),
        (
            "Check that only devices from NvidiaDevice.device map stats are reported",
            {"DeviceName1": ["UUID1"], "DeviceName2": ["UUID2"]},
        ),
    ],
)
def test_write_stats_to_channel(seen: dict[str, Seen], name: str, groups: dict[str, list[str]]) -> None:
    found = _row(seen, "TestWriteStatsToChannel", name)
    assert {g["name"]: sorted(d["id"] for d in g["devices"]) for g in found.groups} == groups
    assert sorted(found.stats) == sorted(i for ids in groups.values() for i in ids)
    for uuid in found.stats:
        n = int(uuid[-1])
        assert {k: _stat(found, uuid, k) for k in _official_stats(n)} == _official_stats(n), uuid


# --- device_test.go ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "outcome"),
    [
        ("All RequestedIDs are not managed by Device", ("error", ["UUID1", "UUID2", "UUID3"])),
        ("Some RequestedIDs are not managed by Device", ("error", ["UUID1", "UUID2"])),
        ("All RequestedIDs are managed by Device", ("ok", "UUID1,UUID2,UUID3")),
        ("No IDs requested", ("ok", None)),
        ("Device is disabled", ("error", "device is not enabled")),
    ],
)
def test_reserve(seen: dict[str, Seen], name: str, outcome: tuple[str, Any]) -> None:
    (event,) = _row(seen, "TestReserve", name).reserves
    kind, detail = outcome
    if kind == "ok":
        assert event["ok"], event
        assert event["envs"].get("NVIDIA_VISIBLE_DEVICES") == detail, event["envs"]
        if detail is None:
            assert event["envs"] == {} and event["devices"] == [] and event["mounts"] == []
        return
    assert not event["ok"], event
    message = event["message"]
    if isinstance(detail, str):
        assert message.startswith(detail), message
        return
    named = [i for i in ("UUID1", "UUID2", "UUID3") if i in message]
    assert named == detail, message  # the unknown IDs, and only those, as "unknown device IDs: ..." names them


# --- nvml/client_test.go -------------------------------------------------------------------------


def test_get_fingerprint_data_successful_outcome(seen: dict[str, Seen]) -> None:
    found = _row(seen, "TestGetFingerprintDataFromNVML", "successful outcome")
    assert {g["name"]: [d["id"] for d in g["devices"]] for g in found.groups} == {
        "ModelName1": ["UUID1"],
        "ModelName2": ["UUID2"],
    }
    one, two = _attrs(found, "ModelName1"), _attrs(found, "ModelName2")
    assert (one["memory"], one["power"], one["bar1"], one["cores_clock"], one["memory_clock"]) == (
        (16, "MiB"),
        (100, "W"),
        (100, "MiB"),
        (100, "MHz"),
        (100, "MHz"),
    )
    assert (two["memory"], two["power"], two["bar1"], two["cores_clock"]) == (
        (8, "MiB"),
        (200, "W"),
        (200, "MiB"),
        (200, "MHz"),
    )
    assert one["driver_version"] == ("driverVersion", "")


def test_get_fingerprint_data_successful_migs(seen: dict[str, Seen]) -> None:
    """UUID3 is a MIG parent: not fingerprinted; its MIG device UUID4 is (adapted: "mig name")."""
    found = _row(seen, "TestGetFingerprintDataFromNVML", "successful migs")
    assert sorted(_ids(found)) == ["UUID1", "UUID2", "UUID4"]
    (mig_group,) = [g for g in found.groups if g["devices"][0]["id"] == "UUID4"]
    assert mig_group["name"] == "ModelName MIG 1g.10gb"
    assert mig_group["attributes"]["memory"]["value"] == 8 and mig_group["attributes"]["power"]["value"] == 200


def test_get_fingerprint_data_a_failed_device_read_keeps_the_card(seen: dict[str, Seen]) -> None:
    """The official fails the whole fingerprint; here the card stays, unhealthy (failed-readings)."""
    found = _row(seen, "TestGetFingerprintDataFromNVML", "fail on deviceInfoByUUIDCall")
    (device,) = [d for g in found.groups for d in g["devices"]]
    assert device["id"] == "UUID1" and device["healthy"] is False


def test_get_stats_data_successful_migs(seen: dict[str, Seen]) -> None:
    """The official reports stats for UUID1 and UUID2 only; here UUID4, the MIG instance, has its own too."""
    found = _row(seen, "TestGetStatsDataFromNVML", "successful migs")
    assert {"UUID1", "UUID2"} <= set(found.stats) and "UUID3" not in found.stats
    assert found.stats["UUID1"]["stats"]["Memory state"]["int_denominator"] == 16


# --- TestCheckFingerprintUpdates: the set of devices changes while the plugin runs ---------------


def _names(uuids: list[str]) -> list[dict[str, Any]]:
    return [dev(u, "Name", n, memory=10) for n, u in enumerate(uuids)]


@pytest.mark.parametrize(
    ("name", "before", "after"),
    [
        ("No updates", ["1", "2", "3"], ["1", "2", "3"]),
        ("New Device Appeared", ["1", "2", "3"], ["1", "2", "3", "I am new"]),
        ("Device disappeared", ["1", "2", "3"], ["1", "2"]),
        ("No devices in NvidiaDevice map", [], ["1", "2", "3"]),
        ("No devices detected", ["1", "2", "3"], []),
    ],
)
def test_check_fingerprint_updates(conformance_host: Path, name: str, before: list[str], after: list[str]) -> None:
    """A new fingerprint with the new device set goes out when it changed; none when it did not."""
    scenario = Scenario(name, _names(before), config={"fingerprint_period": "1s"}, empty=not before)
    with PluginNode(scenario, conformance_host) as node:
        first = node.fingerprint(want_devices=bool(before))
        assert sorted(d["id"] for g in first for d in g["devices"]) == sorted(before)
        node.write_node(_names(after))
        if before == after:
            # Nothing changed: nothing may be sent. A fixed wait is allowed before asserting that something did
            # not happen (docs/testing.md): three re-reads at fingerprint_period = 1s.
            time.sleep(3.5)
            fps = [e for e in node.proc.events if e.get("event") == "fingerprint"]
            later = fps[next(n for n, e in enumerate(fps) if e["n_devices"]) + 1 :]
            assert all(sorted(d["id"] for g in e["groups"] for d in g["devices"]) == before for e in later), later
        else:
            node.proc.wait_for(
                lambda e: (
                    e["event"] == "fingerprint"
                    and sorted(d["id"] for g in e["groups"] for d in g["devices"]) == sorted(after)
                ),
                60,
            )
        run = node.proc.finish()
    assert not run.violations, run.describe()


@pytest.mark.parametrize(
    ("test", "name"),
    [
        ("TestGetFingerprintDataFromNVML", "fail on systemDriverCallSuccessful"),
        ("TestGetFingerprintDataFromNVML", "fail on deviceCountCallSuccessful"),
        ("TestGetStatsDataFromNVML", "fail on listDeviceUUIDsCallSuccessful"),
    ],
)
def test_nvml_failing_to_list_cards_keeps_the_streams_open(seen: dict[str, Seen], test: str, name: str) -> None:
    """The official answers an error (and Nomad stops the plugin); here no device, no stats, NVML's error logged."""
    found = _row(seen, test, name)
    assert found.groups == [] and found.stats == {}
    assert "NVML watcher failed" in found.stderr and "Unknown Error" in found.stderr, found.stderr[-2000:]


@pytest.mark.parametrize(
    ("test", "name"),
    [
        ("TestWriteStatsToChannel", "NVML wrapper returns error"),
        ("TestGetStatsDataFromNVML", "fail on DeviceInfoAndStatusByUUID call"),
    ],
)
def test_a_failing_status_read_shows_na_and_keeps_the_stream(seen: dict[str, Seen], test: str, name: str) -> None:
    """The official sends a stats error (Nomad retries it with backoff); here the card's official stats are N/A."""
    found = _row(seen, test, name)
    assert {k: _stat(found, "UUID1", k)[0] for k in _official_stats(1)} == dict.fromkeys(_official_stats(1), "N/A")
    assert "NVML readings for UUID1 failed: Unknown Error" in found.stderr, found.stderr[-2000:]


def test_get_stats_data_successful_outcome(seen: dict[str, Seen]) -> None:
    """Adapted ("stats power"): the draw is the fingerprint's 100 and 200 W, so Power usage is 100000 / 100 W."""
    found = _row(seen, "TestGetStatsDataFromNVML", "successful outcome")
    for uuid, n, total, watts, bar1 in (("UUID1", 1, 16, 100, 100), ("UUID2", 2, 8, 200, 200)):
        assert {k: _stat(found, uuid, k) for k in _official_stats(n)} == {
            **_official_stats(n),
            "Power usage": (1000 * watts, watts, "W"),
            "Memory state": (n, total, "MiB"),
            "BAR1 buffer state": (n, bar1, "MiB"),
        }, uuid
