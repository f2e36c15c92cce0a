"""PCI bus IDs and their sysfs NUMA node: pure parsing plus one file read."""

from __future__ import annotations

import re
from pathlib import Path

_BUS_ID = re.compile(
    r"^(?:(?P<domain>[0-9a-fA-F]{1,8}):)?(?P<bus>[0-9a-fA-F]{1,2}):(?P<dev>[0-9a-fA-F]{1,2})\.(?P<fn>[0-7])$"
)


def normalise_bus_id(raw: str) -> str:
    """``00000000:18:00.0`` (NVML) or ``18:00.0`` -> ``0000:18:00.0`` (sysfs form).

    NVML pads the domain to 8 hex digits and upper-cases; sysfs, Nomad's
    ``hw_locality`` and every other tool use a 4-digit lower-case domain.
    """
    value = raw.strip()
    match = _BUS_ID.match(value)
    if match is None:
        raise ValueError(f"pci_bus_id: {raw!r} is not a PCI address like 0000:18:00.0")
    domain = int(match["domain"] or "0", 16)
    if domain > 0xFFFF:
        raise ValueError(f"pci_bus_id: {raw!r} has a domain above ffff")
    bus, dev, fn = int(match["bus"], 16), int(match["dev"], 16), int(match["fn"])
    if dev > 0x1F:
        raise ValueError(f"pci_bus_id: {raw!r} has a device number above 1f")
    return f"{domain:04x}:{bus:02x}:{dev:02x}.{fn}"


def sysfs_numa_node(bus_id: str, sysfs_root: str = "/sys") -> int | None:
    """The NUMA node the kernel assigns to a PCI device; None if unknown (-1 or absent)."""
    path = Path(sysfs_root) / "bus" / "pci" / "devices" / bus_id / "numa_node"
    try:
        value = int(path.read_text().strip())
    except (OSError, ValueError):
        return None
    return value if value >= 0 else None
