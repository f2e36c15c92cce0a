"""``--nvml-mirror``: this machine's real NVIDIA GPUs presented as an XDM node.

Cards (names, UUIDs, memory, PCI addresses, MIG capability) and the exporter's
card-level readings come from NVML; allocation rules, topology (the NVIDIA
shape) and faults are simulated as usual. pynvml (nvidia-ml-py) is imported
only here, only when asked for.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

from nomad_plugin.model.metrics import METRIC_IDS
from nomad_plugin.sim.profiles import CardSpec, render_topology, topology_for


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


def _or(default: Any, nvml: Any, function: str, *args: Any) -> Any:
    """``nvml.function(*args)``, or ``default`` where this card, driver or binding cannot answer."""
    try:
        return getattr(nvml, function)(*args)
    except Exception:  # an NVMLError: the reading is not supported on this card or driver
        return default


def load_cards(topology_variant: str = "normal") -> tuple[list[CardSpec], dict[str, Any]]:
    """Real GPUs as simulator cards, and their NVML handles by UUID (for the readings)."""
    nvml = _nvml()
    try:
        nvml.nvmlInit()
        count = int(nvml.nvmlDeviceGetCount())
    except Exception as exc:  # NVMLError: no driver or library
        raise MirrorUnavailable(f"nvml mirror: NVML is not usable here: {exc}") from exc
    if count == 0:
        raise MirrorUnavailable("nvml mirror: NVML found no NVIDIA GPU on this machine")
    driver = _text(nvml.nvmlSystemGetDriverVersion())
    cuda = _or(None, nvml, "nvmlSystemGetCudaDriverVersion")
    sdk = f"{int(cuda) // 1000}.{int(cuda) % 1000 // 10}" if cuda is not None else ""
    cards: list[CardSpec] = []
    handles: dict[str, Any] = {}
    for index in range(count):
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        uuid = _text(nvml.nvmlDeviceGetUUID(handle))
        domain, _, rest = _text(nvml.nvmlDeviceGetPciInfo(handle).busId).lower().partition(":")
        cards.append(
            CardSpec(
                minor=index,
                uuid=uuid,
                model=_text(nvml.nvmlDeviceGetName(handle)),
                vendor="nvidia",
                xpu_type="gpu",
                memory_mib=int(nvml.nvmlDeviceGetMemoryInfo(handle).total) // (1024 * 1024),
                total_core=100,
                pci_bus_id=f"{int(domain, 16):04x}:{rest}" if rest else domain,
                mig_capable=_or(None, nvml, "nvmlDeviceGetMigMode", handle) is not None,
                driver_version=driver,
                sdk_version=sdk,
                serial_number=_text(_or("", nvml, "nvmlDeviceGetSerial", handle)),
                numa_node=0,
                power_limit_w=int(_or(300_000, nvml, "nvmlDeviceGetEnforcedPowerLimit", handle)) // 1000,
                topology_json=render_topology(topology_for("nvidia", index, count), topology_variant),
            )
        )
        handles[uuid] = handle
    return cards, handles


def make_reader(handles: Mapping[str, Any]) -> Callable[[CardSpec], dict[int, float]]:
    """The exporter hook: real readings for a card, metric id -> value (what NVML cannot give stays simulated)."""
    nvml = _nvml()

    def read(card: CardSpec) -> dict[int, float]:
        h = handles[card.uuid]
        probes: dict[str, Callable[[], float]] = {
            "core_util_percent": lambda: float(nvml.nvmlDeviceGetUtilizationRates(h).gpu),
            "memory_used_mib": lambda: nvml.nvmlDeviceGetMemoryInfo(h).used / (1024 * 1024),
            "temperature_c": lambda: float(nvml.nvmlDeviceGetTemperature(h, nvml.NVML_TEMPERATURE_GPU)),
            "power_w": lambda: nvml.nvmlDeviceGetPowerUsage(h) / 1000.0,
            "sm_clock_mhz": lambda: float(nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_SM)),
            "memory_clock_mhz": lambda: float(nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_MEM)),
        }
        out: dict[int, float] = {}
        for name, probe in probes.items():
            try:
                out[METRIC_IDS[name]] = round(probe(), 1)
            except Exception:  # noqa: S112 - a reading NVML cannot give stays simulated
                continue
        used = out.get(METRIC_IDS["memory_used_mib"])
        if used is not None:
            out[METRIC_IDS["memory_util_percent"]] = round(used / card.memory_mib * 100, 2)
        return out

    return read
