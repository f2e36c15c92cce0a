"""What a backend knows about one physical accelerator card."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from nomad_plugin.model.topology import Topology


@dataclass(frozen=True)
class MigInstance:
    """A MIG instance that already exists on a card (NVML backend only)."""

    uuid: str
    profile: str  # e.g. "1g.10gb"
    slices: int  # compute slices (1..7)
    memory_mib: int
    gpu_instance_id: int = -1
    compute_instance_id: int = -1
    #: NVML's name of the MIG device ("NVIDIA A100-SXM4-80GB MIG 1g.10gb"); "" when unknown
    name: str = ""


@dataclass(frozen=True)
class Card:
    """One physical card as seen by a backend, units normalised.

    ``memory_mib`` is MiB (XDM's ``totalMemory`` unit); ``total_core`` is the
    card's compute capacity in percent of one card (100 for a whole card).
    ``vendor`` is lower-case ("nvidia", "alibaba", "amd"); ``xpu_type`` is the
    family XDM reports ("gpu", "ppu", ...). ``healthy``/``health_reason`` are
    the backend's raw verdict before hysteresis.
    """

    minor: int
    uuid: str
    model: str
    vendor: str
    xpu_type: str
    memory_mib: int
    total_core: int = 100
    pci_bus_id: str = ""
    healthy: bool = True
    health_reason: str = ""
    driver_version: str = ""
    numa_node: int | None = None
    mig_capable: bool = False
    #: MIG mode is on now (NVML backend): only the card's MIG instances can be handed out
    mig_enabled: bool = False
    topology: Topology = field(default_factory=Topology)
    mig_instances: tuple[MigInstance, ...] = ()
    extra: Mapping[str, str] = field(default_factory=dict)

    @property
    def memory_gib(self) -> int:
        """Whole GiB, floor division (R10: 81920 MiB -> 80 GiB)."""
        return self.memory_mib // 1024


@dataclass(frozen=True)
class Inventory:
    """A complete snapshot of the node's cards (every push replaces the last).

    ``reachable`` is False when the backend cannot be reached; the cards are
    then the last known ones and ``unreachable_reason``/``unreachable_since``
    say why and since when (unix seconds). ``node`` holds node-wide facts
    (driver version, xpu types, runtime-kit status) as plain strings.
    """

    cards: tuple[Card, ...] = ()
    reachable: bool = True
    unreachable_reason: str = ""
    unreachable_since: float = 0.0
    node: Mapping[str, str] = field(default_factory=dict)
    generation: int = 0

    def by_minor(self, minor: int) -> Card | None:
        for card in self.cards:
            if card.minor == minor:
                return card
        return None

    def by_uuid(self, uuid: str) -> Card | None:
        for card in self.cards:
            if card.uuid == uuid:
                return card
        return None
