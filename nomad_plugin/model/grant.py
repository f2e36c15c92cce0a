"""Grants: what we ask XDM (or NVML) for, and what comes back.

Units: ``core`` is percent of one card (0 = unlimited), ``memory_gib`` is GiB
(0 = unlimited), ``slices`` is a MIG slice count (0 = not MIG).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class DeviceAsk:
    """One card's worth of a request (one element of XDM ``devices[]``)."""

    minor: int
    core: int = 0
    memory_gib: int = 0
    slices: int = 0
    # An existing MIG instance to hand out (NVML backend); XDM creates its own.
    mig_uuid: str = ""


@dataclass(frozen=True)
class GrantRequest:
    grant_id: str  # a UUID4 string we generate; XDM's allocation id
    asks: tuple[DeviceAsk, ...]
    annotations: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class GrantedDevice:
    minor: int
    uuid: str = ""
    core: int = 0
    memory_gib: int = 0
    slices: int = 0
    mig_uuid: str = ""


@dataclass(frozen=True)
class MountSpec:
    container_path: str
    host_path: str
    read_only: bool = True


@dataclass(frozen=True)
class DeviceNode:
    container_path: str
    host_path: str
    permissions: str = "rwm"


@dataclass(frozen=True)
class Grant:
    """What the backend granted, as received (not yet validated for Nomad)."""

    grant_id: str
    devices: tuple[GrantedDevice, ...] = ()
    envs: Mapping[str, str] = field(default_factory=dict)
    mounts: tuple[MountSpec, ...] = ()
    device_nodes: tuple[DeviceNode, ...] = ()
    annotations: Mapping[str, str] = field(default_factory=dict)
    cdi_devices: tuple[str, ...] = ()
