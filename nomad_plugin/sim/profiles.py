"""Node profiles the simulator can present: what cards a node has.

Profiles are data: one :class:`ProfileSpec` per node type, cards derived from
it deterministically (same profile + minor -> same UUID, PCI address and
serial on every run, so Nomad device IDs stay stable across simulator
restarts). Minors are **0-based** (card 0 is "GPU 0" of the topology
examples); the reference notes that real XDM might be 1-based (R4).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

# Fixed namespace so UUIDs are stable across runs and machines.
_UUID_NAMESPACE = uuid.UUID("6f1e0c2a-54f4-4b8e-9a57-1d2c3e4f5a6b")


@dataclass(frozen=True)
class ProfileSpec:
    """One node type: ``count`` identical cards of ``model``."""

    name: str
    count: int
    model: str
    vendor: str  # lower-case, as nomad_plugin.model.card.Card expects
    xpu_type: str  # family as ListSupportedXPUType reports it
    memory_mib: int
    mig_capable: bool
    driver_version: str
    sdk_version: str
    power_limit_w: int
    topology_family: str  # "m890p", "810e" or "nvidia"
    sorted_levels: bool = True
    pci_buses: tuple[int, ...] = ()
    description: str = ""


@dataclass(frozen=True)
class CardSpec:
    """One simulated card's static facts."""

    minor: int
    uuid: str
    model: str
    vendor: str
    xpu_type: str
    memory_mib: int
    total_core: int
    pci_bus_id: str
    mig_capable: bool
    driver_version: str
    sdk_version: str
    serial_number: str
    numa_node: int
    power_limit_w: int
    topology_json: str
    extra: dict[str, str] = field(default_factory=dict)

    @property
    def memory_gib(self) -> int:
        return self.memory_mib // 1024

    @property
    def is_nvidia(self) -> bool:
        return self.vendor == "nvidia"


_NVIDIA_BUSES = (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)

PROFILES: dict[str, ProfileSpec] = {
    p.name: p
    for p in (
        ProfileSpec(
            "h800-8", 8, "NVIDIA H800", "nvidia", "gpu", 81559, True, "535.161.08", "12.2", 700, "nvidia",
            sorted_levels=False, pci_buses=_NVIDIA_BUSES,
            description="8 x NVIDIA H800 80GB, MIG-capable (levels emitted unsorted)",
        ),
        ProfileSpec(
            "a100-8", 8, "NVIDIA A100-SXM4-80GB", "nvidia", "gpu", 81920, True, "535.161.08", "12.2", 400, "nvidia",
            sorted_levels=False, pci_buses=(0x07, 0x0F, 0x47, 0x4E, 0x87, 0x90, 0xB7, 0xBD),
            description="8 x NVIDIA A100-SXM4-80GB, MIG-capable",
        ),
        ProfileSpec(
            "m890p-8", 8, "PPU M890P", "alibaba", "ppu", 147456, False, "1.5.0", "1.5.0", 600, "m890p",
            pci_buses=tuple(0x10 + 0x10 * i for i in range(8)),
            description="8 x PPU M890P 144 GiB, no MIG (seed topology)",
        ),
        ProfileSpec(
            "810e-16", 16, "PPU 810E", "alibaba", "ppu", 98304, False, "1.4.0", "1.4.0", 400, "810e",
            pci_buses=tuple(0x08 + 0x0C * i for i in range(16)),
            description="16 x PPU 810E 96 GiB, no MIG, ICN links (seed topology)",
        ),
        ProfileSpec(
            "l20-8", 8, "NVIDIA L20", "nvidia", "gpu", 46068, False, "535.161.08", "12.2", 350, "nvidia",
            pci_buses=_NVIDIA_BUSES,
            description="8 x NVIDIA L20 48GB, no MIG (negative tests for slices)",
        ),
    )
}  # fmt: skip

# Names the reference (xdm-api.md §5.1) uses for the same profiles.
ALIASES: dict[str, str] = {
    "nvidia-h800-8": "h800-8",
    "nvidia-a100-8": "a100-8",
    "ppu-m890p-8": "m890p-8",
    "ppu-810e-16": "810e-16",
    "nvidia-nomig-8": "l20-8",
    "nvidia-l20-8": "l20-8",
}

NVML_PROFILE = "nvml"


def resolve_profile(name: str) -> ProfileSpec:
    """The profile called ``name`` (or one of its aliases); a clear error otherwise."""
    key = ALIASES.get(name, name)
    spec = PROFILES.get(key)
    if spec is None:
        known = ", ".join(sorted([*PROFILES, *ALIASES]))
        raise ValueError(f"profile: unknown profile {name!r} (known: {known})")
    return spec


def card_uuid(profile: str, minor: int, vendor: str) -> str:
    """Deterministic ``GPU-...`` / ``PPU-...`` UUID for a card."""
    prefix = "GPU" if vendor == "nvidia" else "PPU"
    return f"{prefix}-{uuid.uuid5(_UUID_NAMESPACE, f'{profile}/{minor}')}"


def build_cards(spec: ProfileSpec, topology_variant: str = "normal") -> list[CardSpec]:
    """All cards of a profile, with their topology JSON."""
    cards = []
    for minor in range(spec.count):
        topo = topology_for(spec.topology_family, minor, spec.count, sorted_levels=spec.sorted_levels)
        numa = _numa_of(topo)
        bus = spec.pci_buses[minor] if minor < len(spec.pci_buses) else 0x80 + minor
        serial = str(int(uuid.uuid5(_UUID_NAMESPACE, f"serial/{spec.name}/{minor}")) % 10**13).zfill(13)
        cards.append(
            CardSpec(
                minor=minor,
                uuid=card_uuid(spec.name, minor, spec.vendor),
                model=spec.model,
                vendor=spec.vendor,
                xpu_type=spec.xpu_type,
                memory_mib=spec.memory_mib,
                total_core=100,
                pci_bus_id=f"0000:{bus:02x}:00.0",
                mig_capable=spec.mig_capable,
                driver_version=spec.driver_version,
                sdk_version=spec.sdk_version,
                serial_number=serial,
                numa_node=numa,
                power_limit_w=spec.power_limit_w,
                topology_json=render_topology(topo, topology_variant),
            )
        )
    return cards


def _numa_of(topo: dict[str, object]) -> int:
    levels = topo.get("levels")
    if isinstance(levels, list):
        for lvl in levels:
            if isinstance(lvl, dict) and lvl.get("name") == "numaNodes":
                value = lvl.get(f"topo{lvl['level']}")
                if isinstance(value, list) and value:
                    return int(value[0])
    return 0


def render_topology(topo: dict[str, object], variant: str) -> str:
    import json

    if variant == "malformed":
        # Truncated JSON: the client must keep the card and report the error (R9).
        return json.dumps(topo)[:40]
    if variant == "extra-level":
        levels = list(topo["levels"])  # type: ignore[call-overload]
        levels.insert(len(levels) // 2, {"level": 15, "name": "rack2", "topo15": "rack2-01", "weight": 3.5})
        topo = {**topo, "levels": levels}
    return json.dumps(topo)


TOPOLOGY_VARIANTS = ("normal", "extra-level", "malformed")


# ------------------------------------------------------------ (from topology.py)
# Per-card topology objects (``extenderResources["topology"]``), by family.
#
# GPU 0 of the M890P and 810E families reproduces the two examples of the XDM
# API reference exactly (§3.4 of the seed; xdm-api.md §1.5); the other cards
# generalise them as xdm-api.md §5.2 describes. NVIDIA has no seed example:
# its shape (pcieSwitches / numaNodes / cpuSockets + network levels) is a GUESS.
# :func:`check_invariants` is the simulator's self-check on its own data.


Level = dict[str, Any]

# 810E: hand-written table (the ICN links are not consecutive, as the seed says).
_810E_ICN2 = ((0, 3), (1, 2), (4, 7), (5, 6), (8, 11), (9, 10), (12, 15), (13, 14))
_810E_PCIE_ID = {0: 4, 1: 5, 2: 6, 3: 7}  # quad index -> PCIe switch id (GPU 0 sits on switch 4)
_810E_NUMA = ((1, (0, 1, 2, 3, 8, 9, 10, 11)), (0, (4, 5, 6, 7, 12, 13, 14, 15)))
_810E_SOCKET_OF_NUMA = {1: 0, 0: 1}


def _intra(level: int, name: str, domain: int, peers: Sequence[int] | None) -> Level:
    out: Level = {"level": level, "name": name, f"topo{level}": [domain]}
    if peers is not None:
        out["peers"] = list(peers)
    return out


def _named(level: int, name: str, value: str) -> Level:
    return {"level": level, "name": name, f"topo{level}": value}


def _group(index: int, size: int, count: int) -> list[int]:
    start = (index // size) * size
    return list(range(start, min(start + size, count)))


def m890p_topology(minor: int, count: int) -> dict[str, Any]:
    return {
        "levels": [
            _intra(1, "pcieSwitches", minor // 2, _group(minor, 2, count)),
            _intra(2, "numaNodes", minor // 2, _group(minor, 2, count)),
            _intra(3, "cpuSockets", minor // 4, _group(minor, 4, count)),
            _named(11, "hyperNode", "hypernode-001"),
            _named(21, "leafSwitch", "asw-001"),
            _named(22, "pointOfDelivery", "pod-g13-p1"),
        ]
    }


def e810_topology(minor: int, count: int) -> dict[str, Any]:
    if count != 16:
        raise ValueError(f"810e topology: the hand-written table covers 16 cards, not {count}")
    pair_index = next(i for i, pair in enumerate(_810E_ICN2) if minor in pair)
    numa_id, numa_peers = next((nid, peers) for nid, peers in _810E_NUMA if minor in peers)
    return {
        "levels": [
            _intra(1, "icnLink2", pair_index, sorted(_810E_ICN2[pair_index])),
            _intra(2, "icnLink4", minor // 4, _group(minor, 4, count)),
            _intra(3, "icnLink8", minor // 8, _group(minor, 8, count)),
            _intra(4, "pcieSwitches", _810E_PCIE_ID[minor // 4], _group(minor, 4, count)),
            _intra(5, "numaNodes", numa_id, numa_peers),
            _intra(6, "cpuSockets", _810E_SOCKET_OF_NUMA[numa_id], None),
            _named(21, "leafSwitch", "ASW-VM-SQA-G10-P2-S25"),
            _named(22, "pointOfDelivery", "VM-SQA-G10-P2"),
        ]
    }


def nvidia_topology(minor: int, count: int) -> dict[str, Any]:
    return {
        "levels": [
            _intra(1, "pcieSwitches", minor // 2, _group(minor, 2, count)),
            _intra(2, "numaNodes", minor // 4, _group(minor, 4, count)),
            _intra(3, "cpuSockets", minor // 4, _group(minor, 4, count)),
            _named(21, "leafSwitch", f"asw-{1 + minor // 4:03d}"),
            _named(22, "pointOfDelivery", "pod-a01-p1"),
        ]
    }


_FAMILIES = {"m890p": m890p_topology, "810e": e810_topology, "nvidia": nvidia_topology}


def topology_for(family: str, minor: int, count: int, *, sorted_levels: bool = True) -> dict[str, Any]:
    """The topology object of card ``minor``; levels scrambled when not ``sorted_levels``
    (real emitters need not sort; clients must sort by ``level`` themselves)."""
    try:
        builder = _FAMILIES[family]
    except KeyError:
        raise ValueError(f"topology family: unknown {family!r} (known: {', '.join(_FAMILIES)})") from None
    topo = builder(minor, count)
    if not sorted_levels:
        levels = topo["levels"]
        # Deterministic scramble: network levels first, then intra-node levels reversed.
        topo["levels"] = [lvl for lvl in levels if isinstance(lvl[f"topo{lvl['level']}"], str)] + [
            lvl for lvl in reversed(levels) if not isinstance(lvl[f"topo{lvl['level']}"], str)
        ]
    return topo


def check_invariants(topologies: dict[int, dict[str, Any]]) -> list[str]:
    """Problems in a node's topology (empty list = consistent).

    Checks, per level name: every card is in its own ``peers``; peer sets are
    symmetric; all peers share the same ``topoN`` value; no level is null.
    """
    problems: list[str] = []
    by_name: dict[str, dict[int, Level]] = {}
    for minor, topo in topologies.items():
        for lvl in topo.get("levels", []):
            key = f"topo{lvl.get('level')}"
            if lvl.get(key) is None:
                problems.append(f"card {minor}: level {lvl.get('name')} has no {key}")
                continue
            by_name.setdefault(str(lvl["name"]), {})[minor] = lvl
    for name, levels in by_name.items():
        for minor, lvl in levels.items():
            peers = lvl.get("peers")
            if peers is None:
                continue
            if minor not in peers:
                problems.append(f"card {minor}: {name} peers {peers} do not include the card itself")
            domain = lvl[f"topo{lvl['level']}"]
            for peer in peers:
                other = levels.get(peer)
                if other is None:
                    problems.append(f"card {minor}: {name} peer {peer} has no such level")
                    continue
                if minor not in other.get("peers", []):
                    problems.append(f"card {minor}: {name} peer {peer} does not list {minor} back")
                if other[f"topo{other['level']}"] != domain:
                    problems.append(f"card {minor}: {name} peer {peer} is in another domain")
    return problems
