"""Plain XDM-level facts that have no home in ``nomad_plugin.model``."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class GpuFacts:
    """Static card data from ListGpuInfo (merged into ``Card``)."""

    minor: int
    uuid: str = ""
    model: str = ""
    driver_version: str = ""
    vendor: str = ""
    xpu_type: str = ""
    memory_mib: int = 0
    pci_bus_id: str = ""
    numa_node: int | None = None
    mig_enabled: bool = False
    firmware_version: str = ""
    sdk_version: str = ""


@dataclass(frozen=True)
class ExporterConfig:
    collect_interval_ms: int = 0
    metric_ids: tuple[int, ...] = ()
    config: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class ExporterStatus:
    running: bool = False
    state: str = ""
    last_collect_ms: int = 0
    version: str = ""
    message: str = ""


@dataclass(frozen=True)
class RuntimeKitStatus:
    """config-daemon QueryStatus. ``enabled`` False may also mean "field absent"."""

    enabled: bool
    message: str = ""
