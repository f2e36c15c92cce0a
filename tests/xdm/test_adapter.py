"""Pure wire <-> model mapping, plausibility and grant verification (adapter) and the inventory merge (backend)."""

from __future__ import annotations

import pytest

from nomad_plugin._proto.lingjun import api_outer_pb2 as pb
from nomad_plugin.model.card import Card
from nomad_plugin.model.grant import DeviceAsk, DeviceNode, Grant, GrantedDevice, GrantRequest, MountSpec
from nomad_plugin.xdm import adapter, guesses
from nomad_plugin.xdm.adapter import DriftLog, GpuFacts, card_problems, grant_problem
from nomad_plugin.xdm.backend import HEALTH_NOT_YET_REPORTED, compose_cards
from nomad_plugin.xdm.client import XdmClient


@pytest.mark.parametrize(
    ("xpu_type", "model", "vendor", "family"),
    [
        ("nvidia", "NVIDIA A100-SXM4-80GB", "nvidia", "gpu"),
        ("GPU", "NVIDIA H800", "nvidia", "gpu"),
        ("", "H20", "nvidia", "gpu"),
        ("ppu", "PPU M890P", "alibaba", "ppu"),
        ("", "PPU-ZW810E", "alibaba", "ppu"),
        ("amd", "AMD Instinct MI300X", "amd", "gpu"),
    ],
)
def test_vendor_and_family(xpu_type: str, model: str, vendor: str, family: str) -> None:
    assert guesses.vendor_of(xpu_type, model) == vendor
    assert guesses.xpu_type_of(xpu_type, vendor) == family


@pytest.mark.parametrize(("mib", "gib"), [(81920, 80), (98304, 96), (147456, 144), (81559, 79)])
def test_memory_units_r10(mib: int, gib: int) -> None:
    card = adapter.card_from_device(pb.Device(minor=0, totalMemory=mib, health="healthy"), DriftLog())
    assert card.memory_mib == mib and card.memory_gib == gib


@pytest.mark.parametrize(
    ("text", "healthy"), [("Healthy", True), ("HEALTHY", True), ("Unhealthy", False), ("weird", False)]
)
def test_health_strings_case_insensitive(text: str, healthy: bool) -> None:
    assert adapter.card_from_device(pb.Device(health=text), DriftLog()).healthy is healthy


def test_minor_encodings_on_the_wire() -> None:
    req = GrantRequest("id", (DeviceAsk(minor=0, core=50, memory_gib=4),))
    explicit = pb.AllocateRequest.FromString(adapter.allocate_request(req, "explicit").SerializeToString())
    omitted = pb.AllocateRequest.FromString(adapter.allocate_request(req, "omit-zero").SerializeToString())
    assert explicit.devices[0].HasField("minor") and explicit.devices[0].minor == 0
    assert not omitted.devices[0].HasField("minor")
    with pytest.raises(ValueError, match="xdm_minor_encoding"):
        adapter.allocate_request(req, "bogus")


def test_bad_topology_keeps_the_card() -> None:
    drift = DriftLog()
    card = adapter.card_from_device(
        pb.Device(minor=3, extenderResources={"topology": "{nope", "rdma": "mlx5_0"}), drift
    )
    assert card.minor == 3 and card.topology.error and card.extra == {"rdma": "mlx5_0"}
    assert drift.findings()


def test_verify_rules() -> None:
    req = GrantRequest("g", (DeviceAsk(1, core=50, memory_gib=4),), annotations={"k": "v"})
    ok = Grant("g", devices=(GrantedDevice(1, core=50, memory_gib=4),))
    assert grant_problem(req, ok) is None
    assert "granted nothing" in (grant_problem(req, Grant("g", annotations={"k": "v"})) or "")  # echo is no evidence
    assert grant_problem(req, Grant("g", annotations={"xdm.amp.com/devices": "1"})) is None
    assert "not 'g'" in (grant_problem(req, Grant("other", devices=ok.devices)) or "")
    assert "slice=3" in (
        grant_problem(req, Grant("g", devices=(GrantedDevice(1, core=50, memory_gib=4, slices=3),))) or ""
    )


def test_compose_before_first_push_uses_gpu_info_r12() -> None:
    facts = [GpuFacts(minor=1, uuid="GPU-1", model="NVIDIA H800", driver_version="535", memory_mib=81559, numa_node=0)]
    cards = compose_cards(None, facts)
    assert cards[0].uuid == "GPU-1" and cards[0].healthy and cards[0].health_reason == HEALTH_NOT_YET_REPORTED
    pushed = adapter.card_from_device(pb.Device(minor=1, uuid="GPU-1", health="Unhealthy"), DriftLog())
    merged = compose_cards([pushed], facts)[0]
    assert (merged.healthy, merged.driver_version, merged.numa_node, merged.memory_mib) == (False, "535", 0, 81559)


def test_enable_disable_not_exposed_r14() -> None:
    names = {n.lower() for n in dir(XdmClient)}
    assert not {"enable", "disable"} & names
    assert not [n for n in dir(adapter) if n.upper() in ("ENABLE", "DISABLE")]


@pytest.mark.parametrize(
    "evidence",
    [
        {"envs": {"NVIDIA_VISIBLE_DEVICES": "1"}},
        {"device_nodes": (DeviceNode("/dev/nvidia1", "/dev/nvidia1"),)},
        {"mounts": (MountSpec("/usr/lib/x", "/usr/lib/x"),)},
        {"cdi_devices": ("nvidia.com/gpu=1",)},
        {"annotations": {"xdm.amp.com/devices": "1"}},
    ],
    ids=["envs", "device_nodes", "mounts", "cdi_devices", "annotations"],
)
def test_each_kind_of_evidence_alone_is_enough(evidence: dict[str, object]) -> None:
    req = GrantRequest("g", (DeviceAsk(1, core=50, memory_gib=4),))
    assert grant_problem(req, Grant("g", **evidence)) is None  # type: ignore[arg-type]


def test_unknown_varints_are_named_in_every_problem_and_absent_otherwise() -> None:
    req = GrantRequest("g", (DeviceAsk(1, core=50, memory_gib=4),))
    hint = "; unknown varint field(s) that may carry an error code: 7=3, 9=1"
    assert grant_problem(req, Grant("g"), ("7=3", "9=1")) == (
        "XDM reported success for allocation g but granted nothing" + hint
    )
    assert grant_problem(req, Grant("g")) == "XDM reported success for allocation g but granted nothing"
    wrong_card = Grant("g", devices=(GrantedDevice(2, core=50, memory_gib=4),))
    assert grant_problem(req, wrong_card, ("7=3",)) == "XDM granted card(s) [2] but [1] were requested" + hint.replace(
        "7=3, 9=1", "7=3"
    )


def test_xdm_strings_reach_nomad_clean() -> None:
    """A model name with a newline and ESC became a Nomad device group name; every XDM string is cleaned."""
    import json

    topology = json.dumps({"levels": [{"level": 21, "name": "leaf\nSwitch", "topo21": "asw/1\x1b[2J"}]})
    dev = pb.Device(
        minor=0,
        uuid="GPU-0\r",
        model="H800\n[ERROR] forged\x1b[31m",
        health="unhealthy",
        pciBusId="0000:10:00.0\n",
        extenderResources={"topology": topology, "healthReason": "XID 79\n[ERROR] agent: forged", "k\x1b": "v\n"},
    )
    card = adapter.card_from_device(dev, DriftLog())
    assert card.model == "H800 [ERROR] forged [31m", "a valid Nomad name: printable, one line, no '/'"
    assert card.health_reason == "XID 79\\n[ERROR] agent: forged"
    assert card.uuid == "GPU-0\\r" and card.pci_bus_id == "0000:10:00.0\\n"
    (level,) = card.topology.levels
    assert (level.name, level.domain) == ("leaf Switch", "asw-1 [2J")
    assert all(k.isprintable() and v.isprintable() for k, v in card.extra.items()), card.extra
    facts = adapter.gpu_facts(pb.ListGpuInfoResponse(gpuInfos=[pb.GpuInfo(model="A100/80G\x00", driverVersion="5\n")]))
    assert (facts[0].model, facts[0].driver_version) == ("A100-80G", "5\\n")


UUID = "GPU-402d47c0-8e22-5632-bbb8-558d37b74095"


def card(**kw: object) -> Card:
    base = {"minor": 0, "uuid": UUID, "model": "NVIDIA H800", "vendor": "nvidia", "xpu_type": "gpu"}
    base.update({"memory_mib": 81559, **kw})
    return Card(**base)  # type: ignore[arg-type]


def test_guards_accept_real_looking_cards_and_name_each_implausibility() -> None:
    good = [card(minor=0), card(minor=1, uuid="PPU-" + "a" * 32)]
    assert card_problems(good) == []
    assert "do not look like UUIDs" in card_problems([card(uuid="0000:18:00.0")])[0]
    assert "not unique" in card_problems([card(), card(uuid=UUID.replace("4", "5"))])[0]
    assert "out of range" in card_problems([card(minor=5000)])[0]
    assert "memory sizes" in card_problems([card(memory_mib=7)])[0]
    unreadable = card(healthy=False, health_reason=f"{guesses.HEALTH_UNREADABLE}: XDM sent 'PPU M890P'")
    assert "no known health word" in card_problems([unreadable])[0]
