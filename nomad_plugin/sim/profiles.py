"""The node types the simulator presents: cards and their per-card topology JSON.

Cards derive deterministically from profile + minor, so Nomad device IDs stay stable across simulator
restarts. Minors are 0-based; real XDM might count from 1 (docs/xdm-risks.md).

Topology: GPU 0 of the M890P and 810E families is exactly the XDM API reference's example
(tests/seed_topologies.py); the other cards generalise it. NVIDIA's shape is a guess (no published example).
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, replace
from typing import Any

_UUID_NAMESPACE = uuid.UUID("6f1e0c2a-54f4-4b8e-9a57-1d2c3e4f5a6b")
NVML_PROFILE = "nvml"
TOPOLOGY_VARIANTS = ("normal", "extra-level", "malformed")
Level = dict[str, Any]


@dataclass(frozen=True)
class ProfileSpec:
    """One node type: ``count`` identical cards of ``model``."""

    name: str
    count: int
    model: str
    vendor: str  # lower-case, as nomad_plugin.model.card.Card expects
    xpu_type: str  # the family ListSupportedXPUType reports
    memory_mib: int
    mig_capable: bool
    driver_version: str
    sdk_version: str
    power_limit_w: int
    topology_family: str  # a key of _FAMILIES
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
        ProfileSpec("h800-8", 8, "NVIDIA H800", "nvidia", "gpu", 81559, True, "535.161.08", "12.2", 700, "nvidia",
                    sorted_levels=False, pci_buses=_NVIDIA_BUSES,
                    description="8 x NVIDIA H800 80GB, MIG-capable (levels emitted unsorted)"),
        ProfileSpec("a100-8", 8, "NVIDIA A100-SXM4-80GB", "nvidia", "gpu", 81920, True, "535.161.08", "12.2", 400,
                    "nvidia", sorted_levels=False, pci_buses=(0x07, 0x0F, 0x47, 0x4E, 0x87, 0x90, 0xB7, 0xBD),
                    description="8 x NVIDIA A100-SXM4-80GB, MIG-capable"),
        ProfileSpec("m890p-8", 8, "PPU M890P", "alibaba", "ppu", 147456, False, "1.5.0", "1.5.0", 600, "m890p",
                    pci_buses=tuple(0x10 + 0x10 * i for i in range(8)),
                    description="8 x PPU M890P 144 GiB, no MIG (seed topology)"),
        ProfileSpec("810e-16", 16, "PPU 810E", "alibaba", "ppu", 98304, False, "1.4.0", "1.4.0", 400, "810e",
                    pci_buses=tuple(0x08 + 0x0C * i for i in range(16)),
                    description="16 x PPU 810E 96 GiB, no MIG, ICN links (seed topology)"),
        ProfileSpec("l20-8", 8, "NVIDIA L20", "nvidia", "gpu", 46068, False, "535.161.08", "12.2", 350, "nvidia",
                    pci_buses=_NVIDIA_BUSES, description="8 x NVIDIA L20 48GB, no MIG (negative tests for slices)"),
    )
}  # fmt: skip

# The names the XDM reference's profile table uses for the same nodes.
ALIASES: dict[str, str] = {
    "nvidia-h800-8": "h800-8",
    "nvidia-a100-8": "a100-8",
    "ppu-m890p-8": "m890p-8",
    "ppu-810e-16": "810e-16",
    "nvidia-nomig-8": "l20-8",
    "nvidia-l20-8": "l20-8",
}


def resolve_profile(name: str) -> ProfileSpec:
    spec = PROFILES.get(ALIASES.get(name, name))
    if spec is None:
        raise ValueError(f"profile: unknown profile {name!r} (known: {', '.join(sorted([*PROFILES, *ALIASES]))})")
    return spec


def build_cards(spec: ProfileSpec, topology_variant: str = "normal") -> list[CardSpec]:
    cards = []
    for minor in range(spec.count):
        topo = topology_for(spec.topology_family, minor, spec.count, sorted_levels=spec.sorted_levels)
        numa = next(lvl[f"topo{lvl['level']}"][0] for lvl in topo["levels"] if lvl["name"] == "numaNodes")
        bus = spec.pci_buses[minor] if minor < len(spec.pci_buses) else 0x80 + minor
        serial = int(uuid.uuid5(_UUID_NAMESPACE, f"serial/{spec.name}/{minor}")) % 10**13
        prefix = "GPU" if spec.vendor == "nvidia" else "PPU"
        cards.append(CardSpec(
            minor=minor, uuid=f"{prefix}-{uuid.uuid5(_UUID_NAMESPACE, f'{spec.name}/{minor}')}", model=spec.model,
            vendor=spec.vendor, xpu_type=spec.xpu_type, memory_mib=spec.memory_mib, total_core=100,
            pci_bus_id=f"0000:{bus:02x}:00.0", mig_capable=spec.mig_capable, driver_version=spec.driver_version,
            sdk_version=spec.sdk_version, serial_number=str(serial).zfill(13), numa_node=int(numa),
            power_limit_w=spec.power_limit_w, topology_json=render_topology(topo, topology_variant),
        ))  # fmt: skip
    return cards


def render_topology(topo: dict[str, Any], variant: str) -> str:
    """``malformed``: truncated JSON (the client must keep the card and say so); ``extra-level``: a level 15."""
    if variant == "malformed":
        return json.dumps(topo)[:40]
    if variant == "extra-level":
        levels = list(topo["levels"])
        levels.insert(len(levels) // 2, {"level": 15, "name": "rack2", "topo15": "rack2-01", "weight": 3.5})
        topo = {**topo, "levels": levels}
    return json.dumps(topo)


def _intra(level: int, name: str, domain: int, peers: list[int] | None) -> Level:
    out: Level = {"level": level, "name": name, f"topo{level}": [domain]}
    if peers is not None:
        out["peers"] = peers
    return out


def _named(level: int, name: str, value: str) -> Level:
    return {"level": level, "name": name, f"topo{level}": value}


def _group(minor: int, size: int, count: int) -> list[int]:
    start = minor // size * size
    return list(range(start, min(start + size, count)))


def _m890p(minor: int, count: int) -> list[Level]:
    return [
        _intra(1, "pcieSwitches", minor // 2, _group(minor, 2, count)),
        _intra(2, "numaNodes", minor // 2, _group(minor, 2, count)),
        _intra(3, "cpuSockets", minor // 4, _group(minor, 4, count)),
        _named(11, "hyperNode", "hypernode-001"),
        _named(21, "leafSwitch", "asw-001"),
        _named(22, "pointOfDelivery", "pod-g13-p1"),
    ]


# The 810E seed example: ICN pairs are not consecutive, the NUMA nodes interleave quads,
# GPU 0 sits on PCIe switch 4 and NUMA node 1, and cpuSockets lists no peers.
_810E_ICN2 = ((0, 3), (1, 2), (4, 7), (5, 6), (8, 11), (9, 10), (12, 15), (13, 14))
_810E_NUMA = ((1, (0, 1, 2, 3, 8, 9, 10, 11)), (0, (4, 5, 6, 7, 12, 13, 14, 15)))


def _810e(minor: int, count: int) -> list[Level]:
    if count != 16:
        raise ValueError(f"810e topology: the seed's table covers 16 cards, not {count}")
    pair = next(i for i, p in enumerate(_810E_ICN2) if minor in p)
    numa, numa_peers = next((n, peers) for n, peers in _810E_NUMA if minor in peers)
    return [
        _intra(1, "icnLink2", pair, list(_810E_ICN2[pair])),
        _intra(2, "icnLink4", minor // 4, _group(minor, 4, count)),
        _intra(3, "icnLink8", minor // 8, _group(minor, 8, count)),
        _intra(4, "pcieSwitches", 4 + minor // 4, _group(minor, 4, count)),
        _intra(5, "numaNodes", numa, list(numa_peers)),
        _intra(6, "cpuSockets", 1 - numa, None),
        _named(21, "leafSwitch", "ASW-VM-SQA-G10-P2-S25"),
        _named(22, "pointOfDelivery", "VM-SQA-G10-P2"),
    ]


def _nvidia(minor: int, count: int) -> list[Level]:
    return [
        _intra(1, "pcieSwitches", minor // 2, _group(minor, 2, count)),
        _intra(2, "numaNodes", minor // 4, _group(minor, 4, count)),
        _intra(3, "cpuSockets", minor // 4, _group(minor, 4, count)),
        _named(21, "leafSwitch", f"asw-{1 + minor // 4:03d}"),
        _named(22, "pointOfDelivery", "pod-a01-p1"),
    ]


_FAMILIES = {"m890p": _m890p, "810e": _810e, "nvidia": _nvidia}


def topology_for(family: str, minor: int, count: int, *, sorted_levels: bool = True) -> dict[str, Any]:
    """Card ``minor``'s topology object. Unsorted: network levels first, then the others reversed
    (real emitters need not sort; clients sort by ``level`` themselves)."""
    levels = _FAMILIES[family](minor, count)
    if not sorted_levels:
        named = [lvl for lvl in levels if isinstance(lvl[f"topo{lvl['level']}"], str)]
        levels = named + [lvl for lvl in reversed(levels) if lvl not in named]
    return {"levels": levels}


def with_level(card: CardSpec, name: str, value: str | None) -> CardSpec:
    """``card`` with the string level ``name`` set to ``value`` (added past level 29 if absent) or removed."""
    try:
        doc = json.loads(card.topology_json)
    except ValueError:
        doc = {}
    levels = [lvl for lvl in (doc.get("levels") or []) if isinstance(lvl, dict)] if isinstance(doc, dict) else []
    kept = [lvl for lvl in levels if lvl.get("name") != name]
    if value is not None:
        numbers: dict[str, int] = {
            str(lvl.get("name")): lvl["level"] for lvl in levels if isinstance(lvl.get("level"), int)
        }
        number = numbers[name] if name in numbers else max([29, *numbers.values()]) + 1
        kept.append({"level": number, "name": name, f"topo{number}": value})
        kept.sort(key=lambda lvl: lvl["level"] if isinstance(lvl.get("level"), int) else 0)
    return replace(card, topology_json=json.dumps({"levels": kept}))
