"""Nomad device instances carved out of cards, and the groups they form.

An *instance* is what Nomad schedules: it is given whole to one allocation.
A *group* is one Nomad DeviceGroup (vendor/type/name): one ``device`` request
is filled from one group, and attributes belong to the group.

Instance IDs are stable across plugin, XDM and node restarts because they are
derived only from the card UUID, the kind and the index:

- whole card:  ``<card-uuid>``              (same as HashiCorp's NVIDIA plugin)
- share ``i``: ``<card-uuid>-share-<i>``    (i = 0..N-1, tdm mode)
- MIG unit i:  ``<card-uuid>-mig-<i>``      (i = 0..6, mig mode)
- existing MIG instance (NVML backend): its own MIG UUID (``MIG-...``)
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field

AttrValue = int | float | str | bool


class Kind(enum.Enum):
    WHOLE = "whole"
    SHARE = "share"
    MIG = "mig"
    MIG_INSTANCE = "mig-instance"  # a MIG instance that already exists (NVML)


def share_id(card_uuid: str, index: int) -> str:
    return f"{card_uuid}-share-{index}"


def mig_unit_id(card_uuid: str, index: int) -> str:
    return f"{card_uuid}-mig-{index}"


@dataclass(frozen=True)
class Attr:
    """A group attribute: a value and an optional Nomad unit (MiB, GiB, MHz, W, ...)."""

    value: AttrValue
    unit: str = ""


@dataclass(frozen=True)
class Instance:
    """One schedulable instance: ``core`` percent of a card (0 for MIG units), ``memory_gib`` (0 =
    unlimited), ``slices`` (1 per MIG unit)."""

    id: str
    kind: Kind
    card_uuid: str
    minor: int
    index: int = 0
    core: int = 100
    memory_gib: int = 0
    slices: int = 0
    pci_bus_id: str = ""
    mig_uuid: str = ""


@dataclass(frozen=True)
class GroupKey:
    vendor: str
    device_type: str
    name: str

    def __str__(self) -> str:
        return f"{self.vendor}/{self.device_type}/{self.name}"


@dataclass(frozen=True)
class InstanceGroup:
    key: GroupKey
    instances: tuple[Instance, ...]
    attributes: Mapping[str, Attr] = field(default_factory=dict)


@dataclass(frozen=True)
class Catalog:
    """Everything the last fingerprint advertised; Reserve resolves IDs here."""

    groups: tuple[InstanceGroup, ...] = ()

    def find(self, instance_id: str) -> tuple[InstanceGroup, Instance] | None:
        for group in self.groups:
            for inst in group.instances:
                if inst.id == instance_id:
                    return group, inst
        return None

    def all_ids(self) -> frozenset[str]:
        return frozenset(i.id for g in self.groups for i in g.instances)
