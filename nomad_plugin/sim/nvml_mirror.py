"""``--nvml-mirror``: present this machine's real NVIDIA GPUs as an XDM node.

Cards come from NVML (names, UUIDs, memory, PCI addresses, MIG capability)
and the exporter's card-level metrics are real NVML readings; allocation
rules, topology (a generated NVIDIA shape) and faults are simulated as usual.
pynvml (the nvidia-ml-py package) is imported only here, only when asked for.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

from nomad_plugin.model.metrics import METRIC_IDS
from nomad_plugin.sim.profiles import CardSpec, nvidia_topology, render_topology


class MirrorUnavailable(RuntimeError):
    """NVML cannot present any GPU (no library, no driver, or no device)."""


def _nvml() -> Any:
    try:
        return importlib.import_module("pynvml")
    except ImportError as exc:
        raise MirrorUnavailable(
            "nvml mirror: the pynvml module is not installed (pip install nvidia-ml-py, or the plugin's [nvml] extra)"
        ) from exc


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def load_cards(topology_variant: str = "normal") -> tuple[list[CardSpec], dict[str, Any]]:
    """Real GPUs as simulator cards, plus the NVML handles by uuid (for metrics)."""
    nvml = _nvml()
    try:
        nvml.nvmlInit()
        count = int(nvml.nvmlDeviceGetCount())
    except Exception as exc:  # NVMLError: no driver / library
        raise MirrorUnavailable(f"nvml mirror: NVML is not usable here: {exc}") from exc
    if count == 0:
        raise MirrorUnavailable("nvml mirror: NVML found no NVIDIA GPU on this machine")
    driver = _text(nvml.nvmlSystemGetDriverVersion())
    try:
        cuda = int(nvml.nvmlSystemGetCudaDriverVersion())
        sdk = f"{cuda // 1000}.{cuda % 1000 // 10}"
    except Exception:
        sdk = ""
    cards: list[CardSpec] = []
    handles: dict[str, Any] = {}
    for index in range(count):
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        uuid = _text(nvml.nvmlDeviceGetUUID(handle))
        bus = _text(nvml.nvmlDeviceGetPciInfo(handle).busId).lower()
        domain, _, rest = bus.partition(":")
        pci = f"{int(domain, 16):04x}:{rest}" if rest else bus
        try:
            nvml.nvmlDeviceGetMigMode(handle)
            mig = True
        except Exception:
            mig = False
        try:
            serial = _text(nvml.nvmlDeviceGetSerial(handle))
        except Exception:
            serial = ""
        try:
            limit = int(nvml.nvmlDeviceGetEnforcedPowerLimit(handle)) // 1000
        except Exception:
            limit = 300
        cards.append(
            CardSpec(
                minor=index,
                uuid=uuid,
                model=_text(nvml.nvmlDeviceGetName(handle)),
                vendor="nvidia",
                xpu_type="gpu",
                memory_mib=int(nvml.nvmlDeviceGetMemoryInfo(handle).total) // (1024 * 1024),
                total_core=100,
                pci_bus_id=pci,
                mig_capable=mig,
                driver_version=driver,
                sdk_version=sdk,
                serial_number=serial,
                numa_node=0,
                power_limit_w=limit,
                topology_json=render_topology(nvidia_topology(index, count), topology_variant),
            )
        )
        handles[uuid] = handle
    return cards, handles


def make_reader(handles: Mapping[str, Any]) -> Any:
    """A metrics hook returning real readings for a card (missing readings are skipped)."""
    nvml = _nvml()

    def read(card: CardSpec) -> dict[int, float]:
        handle = handles[card.uuid]
        out: dict[int, float] = {}
        probes: dict[str, Callable[[], float]] = {
            "core_util_percent": lambda: float(nvml.nvmlDeviceGetUtilizationRates(handle).gpu),
            "memory_used_mib": lambda: nvml.nvmlDeviceGetMemoryInfo(handle).used / (1024 * 1024),
            "temperature_c": lambda: float(nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU)),
            "power_w": lambda: nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0,
            "sm_clock_mhz": lambda: float(nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM)),
            "memory_clock_mhz": lambda: float(nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_MEM)),
        }
        for name, probe in probes.items():
            try:
                out[METRIC_IDS[name]] = round(probe(), 1)
            except Exception:  # noqa: S112 - a reading NVML cannot give is simply left simulated
                continue
        if METRIC_IDS["memory_used_mib"] in out:
            out[METRIC_IDS["memory_util_percent"]] = round(
                out[METRIC_IDS["memory_used_mib"]] / card.memory_mib * 100, 2
            )
        return out

    return read
