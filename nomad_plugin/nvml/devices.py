"""Reading cards, MIG instances and node facts out of an initialised NVML.

Functions here only read; they hold no state and start no threads, so the
backend, the enricher and the GPU check share them.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from nomad_plugin.model.card import Card, MigInstance
from nomad_plugin.nvml import lib
from nomad_plugin.nvml.lib import Nvml
from nomad_plugin.nvml.pci import normalise_bus_id, sysfs_numa_node

# MB/s per lane by PCIe generation, nomad-device-nvidia's table (nvml/driver_linux.go):
# 1024 << (gen - 3) for gen 3..6; other generations count as 0 there, and here.
_PCIE_LANE_MBPS = {3: 1024, 4: 2048, 5: 3072, 6: 4096}
_MIB = 1024 * 1024
#: Readings nomad-device-nvidia takes once, when it fingerprints a card (see ``FirstReadings``).
VOLATILE_EXTRAS = ("power", "cores_clock", "memory_clock")
_MIG_PROFILE = re.compile(r"MIG\s+(\S+)\s*$")
_GPU_SLICES = re.compile(r"(?:^|\.)(\d+)g\.")


@dataclass(frozen=True)
class MemoryReading:
    """A card's memory in MiB; ``host`` when it is the host's RAM (a unified-memory iGPU)."""

    total_mib: int
    used_mib: int
    host: bool = False


def host_memory_mib() -> tuple[int, int]:
    """The host's RAM as sysinfo(2) counts it: (total, total - free) in MiB.

    glibc derives ``SC_PHYS_PAGES`` and ``SC_AVPHYS_PAGES`` from sysinfo's
    ``totalram`` and ``freeram``, the two nomad-device-nvidia reads.
    """
    page = os.sysconf("SC_PAGE_SIZE")
    total = os.sysconf("SC_PHYS_PAGES") * page
    free = os.sysconf("SC_AVPHYS_PAGES") * page
    return total // _MIB, (total - free) // _MIB


def memory_reading(nvml: Nvml, handle: Any) -> MemoryReading:
    """Framebuffer memory, or the host's RAM where NVML has none (GB10: NotSupported).

    nomad-device-nvidia falls back the same way (its nvml/driver_linux.go,
    ``determineMemoryInfo``); any other NVML error propagates.
    """
    try:
        info = nvml.nvmlDeviceGetMemoryInfo(handle)
    except nvml.NVMLError as exc:
        if lib.error_code(nvml, exc) != lib.ERROR_NOT_SUPPORTED:
            raise
        total, used = host_memory_mib()
        return MemoryReading(total, used, host=True)
    return MemoryReading(int(info.total) // _MIB, int(info.used) // _MIB)


@dataclass(frozen=True)
class DeviceRef:
    """One physical GPU as NVML enumerates it; ``handle`` is NVML's opaque handle."""

    index: int
    uuid: str
    minor: int
    handle: Any


def list_devices(nvml: Nvml) -> tuple[list[DeviceRef], dict[int, str]]:
    """Every physical GPU NVML sees, in index order, and the indexes it could not read.

    A card that fell off the bus can fail here while the others work; it is
    reported by index so the caller can keep its last known identity.
    """
    refs, failed = [], {}
    for index in range(int(nvml.nvmlDeviceGetCount())):
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            uuid = lib.text(nvml.nvmlDeviceGetUUID(handle))
            minor = int(nvml.nvmlDeviceGetMinorNumber(handle))
        except nvml.NVMLError as exc:
            failed[index] = lib.describe(nvml, exc)
            continue
        refs.append(DeviceRef(index=index, uuid=uuid, minor=minor, handle=handle))
    return refs, failed


def cuda_version_text(raw: int) -> str:
    """NVML's CUDA driver version integer (12040) as "12.4"."""
    return f"{raw // 1000}.{(raw % 1000) // 10}"


def node_facts(nvml: Nvml) -> dict[str, str]:
    """Node-wide facts: driver and CUDA versions (best effort, never raises for gaps)."""
    facts = {"driver_version": lib.text(nvml.nvmlSystemGetDriverVersion())}
    cuda = lib.optional(nvml, "nvmlSystemGetCudaDriverVersion_v2")
    if cuda is None:
        cuda = lib.optional(nvml, "nvmlSystemGetCudaDriverVersion")
    if cuda is not None:
        facts["cuda_version"] = cuda_version_text(int(cuda))
    return facts


def bus_id(nvml: Nvml, handle: Any) -> str:
    """The card's PCI address in sysfs form ("" if NVML gives none)."""
    info = nvml.nvmlDeviceGetPciInfo(handle)
    raw = lib.text(getattr(info, "busId", b"") or getattr(info, "busIdLegacy", b""))
    return normalise_bus_id(raw) if raw else ""


def numa_node(nvml: Nvml, handle: Any, pci_bus_id: str, sysfs_root: str) -> int | None:
    """CPU-side NUMA node: sysfs first (what the kernel schedules by), then NVML."""
    if pci_bus_id:
        node = sysfs_numa_node(pci_bus_id, sysfs_root)
        if node is not None:
            return node
    value = lib.optional(nvml, "nvmlDeviceGetNumaNodeId", handle)
    return int(value) if value is not None and int(value) >= 0 else None


def _state(value: Any) -> str:
    """NVML's enable state as nomad-device-nvidia sends it: the number, "1" (enabled) or "0".

    Its driver formats go-nvml's ``EnableState`` with ``%v``, which prints the
    enum's value (its docs and unit-test mocks show "Enabled"; its builds do not).
    """
    return str(int(value))


def card_extras(nvml: Nvml, handle: Any) -> dict[str, str]:
    """The attributes nomad-device-nvidia fingerprints, with its names, units and meanings.

    ``power`` is the power *draw* in whole W and ``cores_clock``/``memory_clock``
    the *current* clocks in MHz (its driver_linux.go reads nvmlDeviceGetPowerUsage
    and nvmlDeviceGetClockInfo); ``bar1`` the BAR1 total in MiB; ``pci_bandwidth``
    max link width x its per-lane table in MB/s. ``power_limit`` (W) is ours.

    A reading the card does not support (NotSupported) shows as that plugin
    shows it: ``power`` and ``pci_bandwidth`` 0, ``bar1`` and ``memory_clock``
    absent. Where it would fail the whole fingerprint (clocks, display and
    persistence mode unsupported, or any other NVML error) the attribute is
    left out and the card is still offered.
    """
    extras: dict[str, str] = {}
    graphics = lib.optional(nvml, "nvmlDeviceGetClockInfo", handle, nvml.NVML_CLOCK_GRAPHICS)
    if graphics is not None:
        extras["cores_clock"] = str(int(graphics))
    memory = lib.optional(nvml, "nvmlDeviceGetClockInfo", handle, nvml.NVML_CLOCK_MEM)
    if memory is not None:
        extras["memory_clock"] = str(int(memory))
    draw, why = lib.read(nvml, "nvmlDeviceGetPowerUsage", handle)
    if draw is not None:
        extras["power"] = str(int(draw) // 1000)
    elif why == lib.ERROR_NOT_SUPPORTED:
        extras["power"] = "0"
    limit = lib.optional(nvml, "nvmlDeviceGetPowerManagementLimit", handle)
    if limit is not None:
        extras["power_limit"] = str(int(limit) // 1000)
    bar1 = lib.optional(nvml, "nvmlDeviceGetBAR1MemoryInfo", handle)
    if bar1 is not None:
        extras["bar1"] = str(int(bar1.bar1Total) // _MIB)
    gen, gen_why = lib.read(nvml, "nvmlDeviceGetMaxPcieLinkGeneration", handle)
    width, width_why = lib.read(nvml, "nvmlDeviceGetMaxPcieLinkWidth", handle)
    gen_known = gen is not None or gen_why == lib.ERROR_NOT_SUPPORTED
    width_known = width is not None or width_why == lib.ERROR_NOT_SUPPORTED
    if gen_known and width_known:
        lanes = int(width) if width is not None else 0
        extras["pci_bandwidth"] = str(_PCIE_LANE_MBPS.get(int(gen or 0), 0) * lanes)
    display = lib.optional(nvml, "nvmlDeviceGetDisplayMode", handle)
    if display is not None:
        extras["display_state"] = _state(display)
    persistence = lib.optional(nvml, "nvmlDeviceGetPersistenceMode", handle)
    if persistence is not None:
        extras["persistence_mode"] = _state(persistence)
    capability = lib.optional(nvml, "nvmlDeviceGetCudaComputeCapability", handle)
    if capability is not None:
        extras["compute_capability"] = f"{capability[0]}.{capability[1]}"
    return extras


class FirstReadings:
    """Keeps the first power draw and clocks read per card, as nomad-device-nvidia does.

    It reads them when it fingerprints and re-sends only when cards come or
    go, so Nomad keeps the first values. Re-reading them every resync would
    change the fingerprint (and re-send it) on every load swing.
    """

    def __init__(self) -> None:
        self._seen: dict[str, dict[str, str]] = {}

    def apply(self, uuid: str, extras: Mapping[str, str]) -> dict[str, str]:
        first = self._seen.setdefault(uuid, {})
        for key in VOLATILE_EXTRAS:
            if key in extras:
                first.setdefault(key, extras[key])
        return {**extras, **first}


def mig_mode(nvml: Nvml, handle: Any) -> tuple[bool, bool]:
    """(MIG capable, MIG currently enabled)."""
    modes = lib.optional(nvml, "nvmlDeviceGetMigMode", handle)
    if modes is None:
        return False, False
    return True, int(modes[0]) == int(nvml.NVML_DEVICE_MIG_ENABLE)


def profile_from_name(name: str) -> str:
    """ "NVIDIA A100-SXM4-80GB MIG 1g.10gb" -> "1g.10gb" ("" when the name has none)."""
    match = _MIG_PROFILE.search(name)
    return match.group(1) if match else ""


def slices_from_profile(profile: str) -> int:
    """GPU slices of a profile: "3g.40gb" -> 3, "1c.2g.20gb" -> 2, unknown -> 0."""
    match = _GPU_SLICES.search(profile)
    return int(match.group(1)) if match else 0


#: Codes ``nvmlDeviceGetMigDeviceHandleByIndex`` answers for a slot that holds no MIG device.
_EMPTY_SLOT = (lib.ERROR_NOT_FOUND, lib.ERROR_INVALID_ARGUMENT, lib.ERROR_NOT_SUPPORTED)


def mig_instances(nvml: Nvml, handle: Any) -> tuple[MigInstance, ...]:
    """The MIG devices that exist on a MIG-enabled card (NVML cannot create them)."""
    found = []
    for slot in range(int(nvml.nvmlDeviceGetMaxMigDeviceCount(handle))):
        try:
            mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
        except nvml.NVMLError as exc:
            if lib.error_code(nvml, exc) in _EMPTY_SLOT:
                continue  # an empty slot
            raise
        name = lib.text(nvml.nvmlDeviceGetName(mig))
        profile = profile_from_name(name)
        attrs = lib.optional(nvml, "nvmlDeviceGetAttributes", mig)
        slices = int(attrs.gpuInstanceSliceCount) if attrs is not None else slices_from_profile(profile)
        found.append(
            MigInstance(
                uuid=lib.text(nvml.nvmlDeviceGetUUID(mig)),
                profile=profile,
                slices=slices,
                memory_mib=memory_reading(nvml, mig).total_mib,
                gpu_instance_id=int(nvml.nvmlDeviceGetGpuInstanceId(mig)),
                compute_instance_id=int(nvml.nvmlDeviceGetComputeInstanceId(mig)),
                name=name,
            )
        )
    return tuple(found)


#: ``Card.extra`` key set when the card's memory is the host's RAM (a unified-memory iGPU).
HOST_MEMORY_KEY = "memory_source"


def read_card(
    nvml: Nvml,
    ref: DeviceRef,
    node: Mapping[str, str],
    sysfs_root: str = "/sys",
    first: FirstReadings | None = None,
) -> Card:
    """One whole card with its static facts; health is overlaid by the backend."""
    handle = ref.handle
    pci = bus_id(nvml, handle)
    capable, enabled = mig_mode(nvml, handle)
    memory = memory_reading(nvml, handle)
    extras = card_extras(nvml, handle)
    if first is not None:
        extras = first.apply(ref.uuid, extras)
    if capable:
        extras["mig_mode"] = "enabled" if enabled else "disabled"
    if memory.host:
        extras[HOST_MEMORY_KEY] = "host"
    return Card(
        minor=ref.minor,
        uuid=ref.uuid,
        model=lib.text(nvml.nvmlDeviceGetName(handle)),
        vendor="nvidia",
        xpu_type="gpu",
        memory_mib=memory.total_mib,
        pci_bus_id=pci,
        driver_version=node.get("driver_version", ""),
        numa_node=numa_node(nvml, handle, pci, sysfs_root),
        mig_capable=capable,
        mig_enabled=enabled,
        mig_instances=mig_instances(nvml, handle) if enabled else (),
        extra=extras,
    )
