"""Node profiles the simulator can present: what cards a node has.

Profiles are data: one :class:`ProfileSpec` per node type, cards derived from
it deterministically (same profile + minor -> same UUID, PCI address and
serial on every run, so Nomad device IDs stay stable across simulator
restarts). Minors are **0-based** (card 0 is "GPU 0" of the topology
examples); the reference notes that real XDM might be 1-based (R4).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

from nomad_plugin.sim.topology import topology_for

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
