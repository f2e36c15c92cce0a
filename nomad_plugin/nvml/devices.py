"""Reading cards, MIG instances and node facts out of an initialised NVML.

Functions here only read; they hold no state and start no threads, so the
backend, the enricher and the GPU check share them.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nomad_plugin.model.card import Card, MigInstance
from nomad_plugin.model.metrics import METRIC_IDS, UNSUPPORTED_BITS, MetricSample
from nomad_plugin.nvml import lib
from nomad_plugin.nvml.lib import Nvml

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


PARENT_LABEL = "parent_uuid"
#: What ``nvmlDeviceGetMigDeviceHandleByIndex`` answers for a slot without a MIG device.
_EMPTY_MIG_SLOT = lib.MISSING_CODES | {lib.ERROR_INVALID_ARGUMENT}


@dataclass
class Poll:
    """The result of one poll: samples, plus cards found lost and per-card errors."""

    samples: list[MetricSample] = field(default_factory=list)
    lost: dict[str, str] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    #: set when NVML itself is gone (uninitialised, driver unloaded): the poll is void
    fatal: str = ""


def sample(device: str, name: str, value: float, ts_ms: int, labels: dict[str, str] | None = None) -> MetricSample:
    return MetricSample(
        device=device,
        metric_id=METRIC_IDS[name],
        name=name,
        value=float(value),
        timestamp_ms=ts_ms,
        labels=labels or {},
    )


def _card_values(nvml: Nvml, handle: Any) -> dict[str, float]:
    values: dict[str, float] = {}
    unsupported = 0
    util = lib.optional(nvml, "nvmlDeviceGetUtilizationRates", handle)
    if util is not None:
        values["core_util_percent"] = util.gpu
        values["memory_util_percent"] = util.memory
    try:
        mem = memory_reading(nvml, handle)
    except nvml.NVMLError as exc:
        if lib.error_code(nvml, exc) not in lib.MISSING_CODES:
            raise
    else:
        values["memory_used_mib"] = mem.used_mib
        values["memory_total_mib"] = mem.total_mib
        if mem.host and mem.total_mib > 0:  # NVML's memory utilisation is not reported for an iGPU
            values["memory_util_percent"] = mem.used_mib * 100 // mem.total_mib
    temp, why = lib.read(nvml, "nvmlDeviceGetTemperature", handle, nvml.NVML_TEMPERATURE_GPU)
    if temp is not None:
        values["temperature_c"] = temp
    elif why == lib.ERROR_NOT_SUPPORTED:
        unsupported |= UNSUPPORTED_BITS["temperature_c"]
    power, why = lib.read(nvml, "nvmlDeviceGetPowerUsage", handle)
    if power is not None:
        values["power_w"] = int(power) / 1000.0
    elif why == lib.ERROR_NOT_SUPPORTED:
        unsupported |= UNSUPPORTED_BITS["power_w"]
    limit = lib.optional(nvml, "nvmlDeviceGetEnforcedPowerLimit", handle)
    if limit is not None:
        values["power_limit_w"] = int(limit) / 1000.0
    for name, kind in (
        ("ecc_sbe_total", nvml.NVML_MEMORY_ERROR_TYPE_CORRECTED),
        ("ecc_dbe_total", nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED),
    ):
        count = lib.optional(nvml, "nvmlDeviceGetTotalEccErrors", handle, kind, nvml.NVML_VOLATILE_ECC)
        if count is not None:
            values[name] = count
    for name, clock in (("sm_clock_mhz", nvml.NVML_CLOCK_SM), ("memory_clock_mhz", nvml.NVML_CLOCK_MEM)):
        mhz = lib.optional(nvml, "nvmlDeviceGetClockInfo", handle, clock)
        if mhz is not None:
            values[name] = mhz
    reasons = lib.optional(nvml, "nvmlDeviceGetCurrentClocksEventReasons", handle)
    if reasons is None:
        reasons = lib.optional(nvml, "nvmlDeviceGetCurrentClocksThrottleReasons", handle)
    if reasons is not None:
        values["throttle_reasons"] = reasons
    rows = lib.optional(nvml, "nvmlDeviceGetRemappedRows", handle)
    if rows is not None:
        values["remapped_rows_total"] = int(rows[0]) + int(rows[1])
    extras = official_values(nvml, handle)
    unsupported |= int(extras.pop("nvml_unsupported", 0))
    values.update(extras)
    if unsupported:
        values["nvml_unsupported"] = unsupported
    return values


def official_values(nvml: Nvml, handle: Any) -> dict[str, float]:
    """The readings only nomad-device-nvidia's stats show: encoder/decoder, BAR1, ECC by location.

    ECC counts are corrected errors since the last driver load (volatile), per
    location, as its nvmlDeviceGetDetailedEccErrors(CORRECTED, VOLATILE) call
    reads them (here through nvmlDeviceGetMemoryErrorCounter, which NVML keeps
    in place of that deprecated call). Locations NVML answers NotSupported
    for are set in ``nvml_unsupported``.
    """
    values: dict[str, float] = {}
    for name, function in (
        ("encoder_util_percent", "nvmlDeviceGetEncoderUtilization"),
        ("decoder_util_percent", "nvmlDeviceGetDecoderUtilization"),
    ):
        util = lib.optional(nvml, function, handle)
        if util is not None:
            values[name] = util[0]
    bar1 = lib.optional(nvml, "nvmlDeviceGetBAR1MemoryInfo", handle)
    if bar1 is not None:
        values["bar1_used_mib"] = int(bar1.bar1Used) // _MIB
        values["bar1_total_mib"] = int(bar1.bar1Total) // _MIB
    unsupported = 0
    for name, location in (
        ("ecc_l1_corrected", lib.LOCATION_L1_CACHE),
        ("ecc_l2_corrected", lib.LOCATION_L2_CACHE),
        ("ecc_memory_corrected", lib.LOCATION_DEVICE_MEMORY),
    ):
        count, why = lib.read(
            nvml,
            "nvmlDeviceGetMemoryErrorCounter",
            handle,
            nvml.NVML_MEMORY_ERROR_TYPE_CORRECTED,
            nvml.NVML_VOLATILE_ECC,
            location,
        )
        if count is not None:
            values[name] = count
        elif why == lib.ERROR_NOT_SUPPORTED:
            unsupported |= UNSUPPORTED_BITS[name]
    if unsupported:
        values["nvml_unsupported"] = unsupported
    return values


def _mig_samples(nvml: Nvml, ref: DeviceRef, ts_ms: int) -> list[MetricSample]:
    out: list[MetricSample] = []
    for slot in range(int(nvml.nvmlDeviceGetMaxMigDeviceCount(ref.handle))):
        try:
            mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(ref.handle, slot)
        except nvml.NVMLError as exc:
            if lib.error_code(nvml, exc) in _EMPTY_MIG_SLOT:
                continue
            raise
        uuid = lib.text(nvml.nvmlDeviceGetUUID(mig))
        try:
            mem = memory_reading(nvml, mig)
        except nvml.NVMLError as exc:
            if lib.error_code(nvml, exc) in lib.MISSING_CODES:
                continue
            raise
        labels = {PARENT_LABEL: ref.uuid}
        out.append(sample(uuid, "memory_used_mib", mem.used_mib, ts_ms, labels))
        out.append(sample(uuid, "memory_total_mib", mem.total_mib, ts_ms, labels))
    return out


def poll(nvml: Nvml, refs: Iterable[tuple[DeviceRef, bool]], ts_ms: int) -> Poll:
    """Read every card (and its MIG instances when ``mig_enabled``); never raises per card.

    NVML errors that mean the card is gone land in ``lost``; other per-card
    NVML errors land in ``errors`` and that card's readings are skipped.
    """
    result = Poll()
    for ref, mig_enabled in refs:
        try:
            values = _card_values(nvml, ref.handle)
            migs = _mig_samples(nvml, ref, ts_ms) if mig_enabled else []
        except nvml.NVMLError as exc:
            code = lib.error_code(nvml, exc)
            if code in lib.NVML_GONE_CODES:
                result.fatal = lib.describe(nvml, exc)
                return result
            target = result.lost if code in lib.CARD_FAULT_CODES else result.errors
            target[ref.uuid] = lib.describe(nvml, exc)
            continue
        result.samples.extend(sample(ref.uuid, name, value, ts_ms) for name, value in values.items())
        result.samples.extend(migs)
    return result
