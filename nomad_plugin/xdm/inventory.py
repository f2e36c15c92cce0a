"""Pure inventory composition: ListAndWatch cards + ListGpuInfo facts -> cards.

ListAndWatch carries health and topology; ListGpuInfo carries static facts
(driver version, NUMA node, PCI address, MIG state). Before the first push
(R12) the cards come from ListGpuInfo alone.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from nomad_plugin.model.card import Card
from nomad_plugin.xdm.adapter import vendor_of, xpu_type_of
from nomad_plugin.xdm.types import GpuFacts

HEALTH_NOT_YET_REPORTED = "health not yet reported by ListAndWatch"


def merge_facts(card: Card, facts: GpuFacts | None) -> Card:
    """Fill what ListAndWatch left empty from ListGpuInfo; never overrides health."""
    if facts is None:
        return card
    return replace(
        card,
        uuid=card.uuid or facts.uuid,
        model=card.model or facts.model,
        memory_mib=card.memory_mib or facts.memory_mib,
        pci_bus_id=card.pci_bus_id or facts.pci_bus_id,
        driver_version=facts.driver_version or card.driver_version,
        numa_node=facts.numa_node if facts.numa_node is not None else card.numa_node,
        mig_capable=card.mig_capable or facts.mig_enabled,
    )


def card_from_facts(facts: GpuFacts) -> Card:
    vendor = vendor_of(facts.xpu_type or facts.vendor, facts.model)
    return Card(
        minor=facts.minor,
        uuid=facts.uuid,
        model=facts.model,
        vendor=vendor,
        xpu_type=xpu_type_of(facts.xpu_type, vendor),
        memory_mib=facts.memory_mib,
        pci_bus_id=facts.pci_bus_id,
        healthy=True,
        health_reason=HEALTH_NOT_YET_REPORTED,
        driver_version=facts.driver_version,
        numa_node=facts.numa_node,
        mig_capable=facts.mig_enabled,
    )


def compose_cards(stream_cards: Sequence[Card] | None, facts: Sequence[GpuFacts]) -> tuple[Card, ...]:
    """The card list to publish: the last push enriched with facts, else facts alone."""
    by_uuid: Mapping[str, GpuFacts] = {f.uuid: f for f in facts if f.uuid}
    by_minor: Mapping[int, GpuFacts] = {f.minor: f for f in facts}
    if stream_cards is None:
        return tuple(sorted((card_from_facts(f) for f in facts), key=lambda c: c.minor))
    merged = (merge_facts(c, by_uuid.get(c.uuid) or by_minor.get(c.minor)) for c in stream_cards)
    return tuple(sorted(merged, key=lambda c: c.minor))


def driver_versions(facts: Sequence[GpuFacts], cards: Sequence[Card] = ()) -> str:
    versions = {f.driver_version for f in facts if f.driver_version}
    versions |= {c.driver_version for c in cards if c.driver_version}
    return ",".join(sorted(versions))
