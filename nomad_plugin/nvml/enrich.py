"""Enriching the XDM backend's cards with what only NVML knows.

XDM reports NVIDIA cards without PCI bus IDs, NUMA nodes or clocks. With
NVML on the node we fill those gaps, matching cards by UUID (fallback: the
minor number), and never overwrite what XDM already gave.

``read_facts`` does the NVML I/O; ``apply_facts`` is pure; ``enrich`` is the
two together. ``Enricher`` keeps NVML initialised between calls for the XDM
backend's resync loop and turns every NVML failure into "no enrichment".
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from nomad_plugin.goplugin.logging import get_logger
from nomad_plugin.model.card import Card, Inventory
from nomad_plugin.nvml import lib
from nomad_plugin.nvml.devices import FirstReadings, bus_id, card_extras, list_devices, numa_node
from nomad_plugin.nvml.lib import Nvml

log = get_logger(__name__)


@dataclass(frozen=True)
class CardFacts:
    """What NVML says about one physical card."""

    uuid: str
    minor: int
    pci_bus_id: str = ""
    numa_node: int | None = None
    extra: Mapping[str, str] = field(default_factory=dict)


def read_facts(nvml: Nvml, sysfs_root: str = "/sys", first: FirstReadings | None = None) -> list[CardFacts]:
    """One pass over an initialised NVML; a card that fails to read is skipped."""
    refs, failed = list_devices(nvml)
    for index, message in failed.items():
        log.warning("enrichment skips GPU index %d: %s", index, message)
    facts = []
    for ref in refs:
        try:
            pci = bus_id(nvml, ref.handle)
            extras = card_extras(nvml, ref.handle)
            facts.append(
                CardFacts(
                    uuid=ref.uuid,
                    minor=ref.minor,
                    pci_bus_id=pci,
                    numa_node=numa_node(nvml, ref.handle, pci, sysfs_root),
                    extra=first.apply(ref.uuid, extras) if first is not None else extras,
                )
            )
        except (nvml.NVMLError, ValueError) as exc:
            log.warning("enrichment skips %s: %s", ref.uuid, exc)
    return facts


def _match(card: Card, by_uuid: Mapping[str, CardFacts], by_minor: Mapping[int, CardFacts]) -> CardFacts | None:
    if card.uuid and card.uuid in by_uuid:
        return by_uuid[card.uuid]
    if card.vendor not in ("", "nvidia"):
        return None  # a non-NVIDIA card's minor says nothing about NVML's cards
    return by_minor.get(card.minor)


def apply_facts(inventory: Inventory, facts: Sequence[CardFacts]) -> Inventory:
    """Fill empty PCI/NUMA fields and missing extra keys; XDM's own values win."""
    by_uuid = {f.uuid: f for f in facts}
    by_minor = {f.minor: f for f in facts}
    cards = []
    changed = False
    for card in inventory.cards:
        found = _match(card, by_uuid, by_minor)
        if found is None:
            cards.append(card)
            continue
        extra = {**found.extra, **card.extra}
        new = replace(
            card,
            pci_bus_id=card.pci_bus_id or found.pci_bus_id,
            numa_node=card.numa_node if card.numa_node is not None else found.numa_node,
            extra=extra,
        )
        changed |= new != card
        cards.append(new)
    return replace(inventory, cards=tuple(cards)) if changed else inventory


def enrich(inventory: Inventory, nvml: Nvml, sysfs_root: str = "/sys", first: FirstReadings | None = None) -> Inventory:
    """``inventory`` with NVML's facts applied (``nvml`` already initialised)."""
    return apply_facts(inventory, read_facts(nvml, sysfs_root, first))


class Enricher:
    """Keeps NVML open for repeated enrichment; a failure returns the input unchanged."""

    def __init__(self, nvml: Nvml | None = None, loader: Callable[[], Nvml] = lib.load, sysfs_root: str = "/sys"):
        self._nvml = nvml
        self._loader = loader
        self._sysfs_root = sysfs_root
        self._open = False
        self._first = FirstReadings()
        self.last_error = ""

    def __call__(self, inventory: Inventory) -> Inventory:
        try:
            if not self._open:
                if self._nvml is None:
                    self._nvml = self._loader()
                self._nvml.nvmlInit()
                self._open = True
            result = enrich(inventory, self._nvml, self._sysfs_root, self._first)
        except lib.NvmlMissing as exc:
            self.last_error = str(exc)
            return inventory
        except Exception as exc:
            nvml = self._nvml
            self.last_error = lib.describe(nvml, exc) if nvml is not None else str(exc)
            log.warning("NVML enrichment failed: %s", self.last_error)
            return inventory
        self.last_error = ""
        return result

    def close(self) -> None:
        if self._open and self._nvml is not None:
            self._open = False
            try:
                self._nvml.nvmlShutdown()
            except self._nvml.NVMLError as exc:
                log.warning("nvmlShutdown failed: %s", exc)
