"""``--nvml-mirror``: this machine's real NVIDIA GPUs presented as an XDM node.

Cards and the exporter's card-level readings come from NVML, read by the NVML
backend's own functions (``nomad_plugin.nvml``); allocation rules, topology
(the NVIDIA shape) and faults are simulated as usual.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from nomad_plugin.model.metrics import METRIC_IDS
from nomad_plugin.nvml import devices, lib
from nomad_plugin.sim.profiles import CardSpec, render_topology, topology_for


class MirrorUnavailable(RuntimeError):
    """NVML cannot present any GPU (no library, no driver, or no device)."""


def _nvml() -> Any:
    try:
        return lib.load()
    except lib.NvmlMissing as exc:
        raise MirrorUnavailable(f"nvml mirror: {exc}") from exc


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
    facts = devices.node_facts(nvml)
    cards: list[CardSpec] = []
    handles: dict[str, Any] = {}
    for index in range(count):
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        uuid = lib.text(nvml.nvmlDeviceGetUUID(handle))
        cards.append(
            CardSpec(
                minor=index,
                uuid=uuid,
                model=lib.text(nvml.nvmlDeviceGetName(handle)),
                vendor="nvidia",
                xpu_type="gpu",
                memory_mib=int(nvml.nvmlDeviceGetMemoryInfo(handle).total) // (1024 * 1024),
                total_core=100,
                pci_bus_id=devices.bus_id(nvml, handle),
                mig_capable=devices.mig_mode(nvml, handle)[0],
                driver_version=facts["driver_version"],
                sdk_version=facts.get("cuda_version", ""),
                serial_number=lib.text(lib.optional(nvml, "nvmlDeviceGetSerial", handle) or ""),
                numa_node=0,
                power_limit_w=int(lib.optional(nvml, "nvmlDeviceGetEnforcedPowerLimit", handle) or 300_000) // 1000,
                topology_json=render_topology(topology_for("nvidia", index, count), topology_variant),
            )
        )
        handles[uuid] = handle
    return cards, handles


# The readings the mirror takes from NVML; the others stay simulated.
MIRRORED = ("core_util_percent", "memory_used_mib", "temperature_c", "power_w", "sm_clock_mhz", "memory_clock_mhz")


def make_reader(handles: Mapping[str, Any]) -> Callable[[CardSpec], dict[int, float]]:
    """The exporter hook: real readings for a card, metric id -> value."""
    nvml = _nvml()

    def read(card: CardSpec) -> dict[int, float]:
        try:
            values = devices.card_values(nvml, handles[card.uuid])
        except nvml.NVMLError:  # a card fault: this collection stays simulated
            return {}
        out = {METRIC_IDS[name]: round(float(values[name]), 1) for name in MIRRORED if name in values}
        if "memory_used_mib" in values:
            out[METRIC_IDS["memory_util_percent"]] = round(values["memory_used_mib"] / card.memory_mib * 100, 2)
        return out

    return read
