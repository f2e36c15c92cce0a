"""Reading cards, MIG instances, node facts and readings out of an initialised NVML (stateless)."""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nomad_plugin.model.card import CUDA_VERSION, Card, MigInstance
from nomad_plugin.model.metrics import METRIC_IDS, UNSUPPORTED_BITS, MetricSample
from nomad_plugin.nvml import lib
from nomad_plugin.nvml.lib import Nvml

# MB/s per lane by PCIe generation, nomad-device-nvidia's table (nvml/driver_linux.go):
# 1024 << (gen - 3) for gen 3..6; other generations count as 0 there, and here.
_PCIE_LANE_MBPS = {3: 1024, 4: 2048, 5: 3072, 6: 4096}
_MIB = 1024 * 1024
VOLATILE_EXTRAS = ("power", "cores_clock", "memory_clock")
#: ``Card.extra`` key set when the card's memory is the host's RAM (a unified-memory iGPU).
HOST_MEMORY_KEY = "memory_source"
PARENT_LABEL = "parent_uuid"
_MIG_PROFILE = re.compile(r"MIG\s+(\S+)\s*$")
_GPU_SLICES = re.compile(r"(?:^|\.)(\d+)g\.")
_BUS_ID = re.compile(
    r"^(?:(?P<domain>[0-9a-fA-F]{1,8}):)?(?P<bus>[0-9a-fA-F]{1,2}):(?P<dev>[0-9a-fA-F]{1,2})\.(?P<fn>[0-7])$"
)
#: What ``nvmlDeviceGetMigDeviceHandleByIndex`` answers for a slot that holds no MIG device.
_EMPTY_SLOT = lib.MISSING_CODES | {lib.ERROR_INVALID_ARGUMENT}


def normalise_bus_id(raw: str) -> str:
    """NVML's ``00000000:3B:00.0`` -> ``0000:3b:00.0``, the kernel's name (``%04x:%02x:%02x.%d``), which
    Nomad's NUMA matcher compares case-sensitively."""
    match = _BUS_ID.match(raw.strip())
    if match is None:
        raise ValueError(f"pci_bus_id: {raw!r} is not a PCI address like 0000:18:00.0")
    domain = int(match["domain"] or "0", 16)  # above ffff on VMD domains: the kernel then prints 5 digits
    bus, dev, fn = int(match["bus"], 16), int(match["dev"], 16), int(match["fn"])
    if dev > 0x1F:
        raise ValueError(f"pci_bus_id: {raw!r} has a device number above 1f")
    return f"{domain:04x}:{bus:02x}:{dev:02x}.{fn}"


def sysfs_numa_node(bus_id: str, sysfs_root: str = "/sys") -> int | None:
    """The NUMA node the kernel assigns to a PCI device; None if unknown (-1 or absent)."""
    try:
        value = int((Path(sysfs_root) / "bus" / "pci" / "devices" / bus_id / "numa_node").read_text().strip())
    except (OSError, ValueError):
        return None
    return value if value >= 0 else None


def memory_reading(nvml: Nvml, handle: Any) -> tuple[int, int, bool]:
    """(total, used) MiB of framebuffer memory, or of the host's RAM where NVML has none, and whether
    it is the host's: nomad-device-nvidia's fallback (nvml/driver_linux.go, ``determineMemoryInfo``)
    to sysinfo(2)'s ``totalram`` and ``freeram``, which ``SC_PHYS_PAGES``/``SC_AVPHYS_PAGES`` report."""
    try:
        info = nvml.nvmlDeviceGetMemoryInfo(handle)
    except nvml.NVMLError as exc:
        if lib.error_code(nvml, exc) != lib.ERROR_NOT_SUPPORTED:
            raise
        page = os.sysconf("SC_PAGE_SIZE")
        total, free = os.sysconf("SC_PHYS_PAGES") * page, os.sysconf("SC_AVPHYS_PAGES") * page
        return total // _MIB, (total - free) // _MIB, True
    return int(info.total) // _MIB, int(info.used) // _MIB, False


@dataclass(frozen=True)
class DeviceRef:
    index: int
    uuid: str
    minor: int
    handle: Any


def list_devices(nvml: Nvml) -> tuple[list[DeviceRef], dict[int, str]]:
    """Every physical GPU NVML sees, in index order, and the indexes it could not read (a card off the bus)."""
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


def cuda_version(nvml: Nvml) -> str:
    """The CUDA driver API version ("12.4"), "" where NVML has no reading."""
    cuda = lib.optional(nvml, "nvmlSystemGetCudaDriverVersion_v2")
    if cuda is None:
        cuda = lib.optional(nvml, "nvmlSystemGetCudaDriverVersion")
    return cuda_version_text(int(cuda)) if cuda is not None else ""


def node_facts(nvml: Nvml) -> dict[str, str]:
    facts = {"driver_version": lib.text(nvml.nvmlSystemGetDriverVersion())}
    if cuda := cuda_version(nvml):
        facts[CUDA_VERSION] = cuda
    return facts


def bus_id(nvml: Nvml, handle: Any) -> str:
    info = nvml.nvmlDeviceGetPciInfo(handle)
    raw = lib.text(getattr(info, "busId", b"") or getattr(info, "busIdLegacy", b""))
    return normalise_bus_id(raw) if raw else ""


def numa_node(nvml: Nvml, handle: Any, pci_bus_id: str, sysfs_root: str) -> int | None:
    """CPU-side NUMA node: sysfs first (what the kernel schedules by), then NVML."""
    node = sysfs_numa_node(pci_bus_id, sysfs_root) if pci_bus_id else None
    if node is not None:
        return node
    value = lib.optional(nvml, "nvmlDeviceGetNumaNodeId", handle)
    return int(value) if value is not None and int(value) >= 0 else None


def card_extras(nvml: Nvml, handle: Any) -> dict[str, str]:
    """The attributes nomad-device-nvidia fingerprints, with its names, units and meanings (its
    driver_linux.go): ``power`` the draw in whole W, the clocks the current ones in MHz, ``bar1`` MiB,
    ``pci_bandwidth`` max link width x its per-lane MB/s, ``display_state``/``persistence_mode``
    "1" or "0"; ``power_limit`` and ``compute_capability`` are ours, ``architecture`` and
    ``mig_capable`` GPU Feature Discovery's. NotSupported shows as there
    (``power`` and ``pci_bandwidth`` 0, ``bar1`` and ``memory_clock`` absent); where it would fail
    the whole fingerprint the attribute is left out and the card still offered.
    """
    extras: dict[str, str] = {}
    for key, clock in (("cores_clock", nvml.NVML_CLOCK_GRAPHICS), ("memory_clock", nvml.NVML_CLOCK_MEM)):
        mhz = lib.optional(nvml, "nvmlDeviceGetClockInfo", handle, clock)
        if mhz is not None:
            extras[key] = str(int(mhz))
    draw, why = lib.read(nvml, "nvmlDeviceGetPowerUsage", handle)
    if draw is not None or why == lib.ERROR_NOT_SUPPORTED:
        extras["power"] = str(int(draw or 0) // 1000)
    limit = lib.optional(nvml, "nvmlDeviceGetPowerManagementLimit", handle)
    if limit is not None:
        extras["power_limit"] = str(int(limit) // 1000)
    bar1 = lib.optional(nvml, "nvmlDeviceGetBAR1MemoryInfo", handle)
    if bar1 is not None:
        extras["bar1"] = str(int(bar1.bar1Total) // _MIB)
    gen, gen_why = lib.read(nvml, "nvmlDeviceGetMaxPcieLinkGeneration", handle)
    width, width_why = lib.read(nvml, "nvmlDeviceGetMaxPcieLinkWidth", handle)
    if (gen is not None or gen_why == lib.ERROR_NOT_SUPPORTED) and (
        width is not None or width_why == lib.ERROR_NOT_SUPPORTED
    ):
        extras["pci_bandwidth"] = str(_PCIE_LANE_MBPS.get(int(gen or 0), 0) * int(width or 0))
    for key, function in (
        ("display_state", "nvmlDeviceGetDisplayMode"),
        ("persistence_mode", "nvmlDeviceGetPersistenceMode"),
    ):
        state = lib.optional(nvml, function, handle)
        if state is not None:
            extras[key] = str(int(state))
    capability = lib.optional(nvml, "nvmlDeviceGetCudaComputeCapability", handle)
    if capability is not None:
        major, minor = int(capability[0]), int(capability[1])
        extras["compute_capability"] = f"{major}.{minor}"
        if family := architecture(major, minor):
            extras["architecture"] = family
    capable, _ = mig_mode(nvml, handle)
    extras["mig_capable"] = "true" if capable else "false"
    return extras


def architecture(major: int, minor: int) -> str:
    """The family GPU Feature Discovery labels ``nvidia.com/gpu.family`` with (k8s-device-plugin,
    ``internal/lm/resource.go``), plus Blackwell (10.x and 12.x, NVIDIA's compute capability table);
    "" for a major it does not name."""
    families = {1: "tesla", 2: "fermi", 3: "kepler", 5: "maxwell", 6: "pascal", 9: "hopper", 10: "blackwell"}
    if major == 7:
        return "volta" if minor < 5 else "turing"
    if major == 8:
        return "ampere" if minor < 9 else "ada-lovelace"
    return families.get(major, "blackwell" if major == 12 else "")


class FirstReadings:
    """The first power draw and clocks read per card: nomad-device-nvidia re-sends its fingerprint only
    when cards come or go, so Nomad keeps the first values (and load swings re-send nothing)."""

    def __init__(self) -> None:
        self._seen: dict[str, dict[str, str]] = {}

    def apply(self, uuid: str, extras: Mapping[str, str]) -> dict[str, str]:
        first = self._seen.setdefault(uuid, {})
        for key in VOLATILE_EXTRAS:
            if key in extras:
                first.setdefault(key, extras[key])
        return {**extras, **first}


def mig_mode(nvml: Nvml, handle: Any) -> tuple[bool, bool]:
    """(MIG capable, MIG enabled)."""
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


def mig_handles(nvml: Nvml, handle: Any) -> Iterator[Any]:
    """The MIG devices of a MIG-enabled card."""
    for slot in range(int(nvml.nvmlDeviceGetMaxMigDeviceCount(handle))):
        try:
            yield nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
        except nvml.NVMLError as exc:
            if lib.error_code(nvml, exc) not in _EMPTY_SLOT:
                raise


def mig_instance(nvml: Nvml, mig: Any) -> MigInstance:
    name = lib.text(nvml.nvmlDeviceGetName(mig))
    profile = profile_from_name(name)
    attrs = lib.optional(nvml, "nvmlDeviceGetAttributes", mig)
    return MigInstance(
        uuid=lib.text(nvml.nvmlDeviceGetUUID(mig)),
        profile=profile,
        slices=int(attrs.gpuInstanceSliceCount) if attrs is not None else slices_from_profile(profile),
        memory_mib=memory_reading(nvml, mig)[0],
        gpu_instance_id=int(nvml.nvmlDeviceGetGpuInstanceId(mig)),
        compute_instance_id=int(nvml.nvmlDeviceGetComputeInstanceId(mig)),
        name=name,
    )


def read_card(
    nvml: Nvml, ref: DeviceRef, node: Mapping[str, str], sysfs_root: str = "/sys", first: FirstReadings | None = None
) -> Card:
    handle = ref.handle
    pci = bus_id(nvml, handle)
    capable, enabled = mig_mode(nvml, handle)
    memory_mib, _, host_memory = memory_reading(nvml, handle)
    extras = card_extras(nvml, handle)
    if first is not None:
        extras = first.apply(ref.uuid, extras)
    if capable:
        extras["mig_mode"] = "enabled" if enabled else "disabled"
    if host_memory:
        extras[HOST_MEMORY_KEY] = "host"
    return Card(
        minor=ref.minor,
        uuid=ref.uuid,
        model=lib.text(nvml.nvmlDeviceGetName(handle)),
        vendor="nvidia",
        xpu_type="gpu",
        memory_mib=memory_mib,
        pci_bus_id=pci,
        driver_version=node.get("driver_version", ""),
        numa_node=numa_node(nvml, handle, pci, sysfs_root),
        mig_capable=capable,
        mig_enabled=enabled,
        mig_instances=tuple(mig_instance(nvml, mig) for mig in mig_handles(nvml, handle)) if enabled else (),
        extra=extras,
    )


def sample(device: str, name: str, value: float, ts_ms: int, labels: dict[str, str] | None = None) -> MetricSample:
    return MetricSample(device, METRIC_IDS[name], name, float(value), ts_ms, labels or {})


def _read_into(
    values: dict[str, float], nvml: Nvml, handle: Any, rows: Sequence[tuple[str, str, tuple[Any, ...], int]]
) -> int:
    """Each row (name, getter, arguments, divisor) read into ``values``; returns the ``nvml_unsupported``
    bits of the rows NVML answered NotSupported for (shown as 0, as nomad-device-nvidia does)."""
    unsupported = 0
    for name, function, args, divisor in rows:
        value, why = lib.read(nvml, function, handle, *args)
        if value is not None:
            values[name] = int(value) / divisor if divisor != 1 else value
        elif why == lib.ERROR_NOT_SUPPORTED:
            unsupported |= UNSUPPORTED_BITS.get(name, 0)
    return unsupported


def card_values(nvml: Nvml, handle: Any) -> dict[str, float]:
    """One card's readings: nomad-device-nvidia's and ours. A reading the card lacks is left out, never
    faked as 0; an iGPU's memory utilisation is used / total host RAM, as the official plugin has it."""
    values: dict[str, float] = {}
    util = lib.optional(nvml, "nvmlDeviceGetUtilizationRates", handle)
    if util is not None:
        values["core_util_percent"] = util.gpu
        values["memory_util_percent"] = util.memory
    try:
        total, used, host = memory_reading(nvml, handle)
    except nvml.NVMLError as exc:
        if lib.error_code(nvml, exc) not in lib.MISSING_CODES:
            raise
    else:
        values["memory_used_mib"], values["memory_total_mib"] = used, total
        if host and total > 0:
            values["memory_util_percent"] = used * 100 // total
    volatile = nvml.NVML_VOLATILE_ECC
    unsupported = _read_into(
        values,
        nvml,
        handle,
        (
            ("temperature_c", "nvmlDeviceGetTemperature", (nvml.NVML_TEMPERATURE_GPU,), 1),
            ("power_w", "nvmlDeviceGetPowerUsage", (), 1000),
            ("power_limit_w", "nvmlDeviceGetEnforcedPowerLimit", (), 1000),
            ("ecc_sbe_total", "nvmlDeviceGetTotalEccErrors", (nvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, volatile), 1),
            ("ecc_dbe_total", "nvmlDeviceGetTotalEccErrors", (nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, volatile), 1),
            ("sm_clock_mhz", "nvmlDeviceGetClockInfo", (nvml.NVML_CLOCK_SM,), 1),
            ("memory_clock_mhz", "nvmlDeviceGetClockInfo", (nvml.NVML_CLOCK_MEM,), 1),
        ),
    )
    reasons = lib.optional(nvml, "nvmlDeviceGetCurrentClocksEventReasons", handle)
    if reasons is None:
        reasons = lib.optional(nvml, "nvmlDeviceGetCurrentClocksThrottleReasons", handle)
    if reasons is not None:
        values["throttle_reasons"] = reasons
    rows = lib.optional(nvml, "nvmlDeviceGetRemappedRows", handle)
    if rows is not None:
        values["remapped_rows_total"] = int(rows[0]) + int(rows[1])
    values.update(official_values(nvml, handle))
    unsupported |= int(values.pop("nvml_unsupported", 0))
    if unsupported:
        values["nvml_unsupported"] = unsupported
    return values


def official_values(nvml: Nvml, handle: Any) -> dict[str, float]:
    """The readings only nomad-device-nvidia's stats show: encoder/decoder, BAR1, ECC by location.

    ECC: corrected errors since the driver loaded, by location, as its deprecated
    nvmlDeviceGetDetailedEccErrors(CORRECTED, VOLATILE); here nvmlDeviceGetMemoryErrorCounter
    (nvmlMemoryLocation_t: L1 0, L2 1, device memory 2).
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
    ecc = (nvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, nvml.NVML_VOLATILE_ECC)
    counter = "nvmlDeviceGetMemoryErrorCounter"
    unsupported = _read_into(
        values,
        nvml,
        handle,
        (
            ("ecc_l1_corrected", counter, (*ecc, 0), 1),
            ("ecc_l2_corrected", counter, (*ecc, 1), 1),
            ("ecc_memory_corrected", counter, (*ecc, 2), 1),
        ),
    )
    if unsupported:
        values["nvml_unsupported"] = unsupported
    return values


@dataclass
class Poll:
    """Samples, cards found lost and per-card errors; ``fatal`` voids it (NVML itself is gone)."""

    samples: list[MetricSample] = field(default_factory=list)
    lost: dict[str, str] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    fatal: str = ""


def _mig_samples(nvml: Nvml, ref: DeviceRef, ts_ms: int) -> Iterator[MetricSample]:
    labels = {PARENT_LABEL: ref.uuid}
    for mig in mig_handles(nvml, ref.handle):
        uuid = lib.text(nvml.nvmlDeviceGetUUID(mig))
        try:
            total, used, _ = memory_reading(nvml, mig)
        except nvml.NVMLError as exc:
            if lib.error_code(nvml, exc) in lib.MISSING_CODES:
                continue
            raise
        yield sample(uuid, "memory_used_mib", used, ts_ms, labels)
        yield sample(uuid, "memory_total_mib", total, ts_ms, labels)


def poll(nvml: Nvml, refs: Iterable[tuple[DeviceRef, bool]], ts_ms: int) -> Poll:
    """Every card, and its MIG instances' memory when MIG is on; a card's NVML error skips that card."""
    result = Poll()
    for ref, mig_enabled in refs:
        try:
            values = card_values(nvml, ref.handle)
            migs = list(_mig_samples(nvml, ref, ts_ms)) if mig_enabled else []
        except nvml.NVMLError as exc:
            code = lib.error_code(nvml, exc)
            if code in lib.NVML_GONE_CODES:
                result.fatal = lib.describe(nvml, exc)
                return result
            (result.lost if code in lib.CARD_FAULT_CODES else result.errors)[ref.uuid] = lib.describe(nvml, exc)
            continue
        result.samples.extend(sample(ref.uuid, name, value, ts_ms) for name, value in values.items())
        result.samples.extend(migs)
    return result
