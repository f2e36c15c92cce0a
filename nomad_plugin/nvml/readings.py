"""One poll of NVML readings as ``MetricSample``s (NVML has no push).

Readings follow the official Nomad NVIDIA plugin (utilisation, memory,
temperature, power, ECC, clocks) plus clock-event (throttle) reasons,
remapped rows and, unlike the official plugin, per-MIG-instance memory.
A reading the card does not have is left out, never faked as 0; which of
the official ones NVML answered NotSupported for goes in one
``nvml_unsupported`` bit mask, from which the stats layout shows 0 as the
official plugin does (the Prometheus endpoint shows nothing for them).
A unified-memory iGPU (GB10) has no framebuffer reading: its memory is the
host's RAM and its memory utilisation used / total, as the official
plugin derives them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from nomad_plugin.model.metrics import METRIC_IDS, UNSUPPORTED_BITS, MetricSample
from nomad_plugin.nvml import lib
from nomad_plugin.nvml.devices import DeviceRef, memory_reading
from nomad_plugin.nvml.lib import Nvml

_MIB = 1024 * 1024
PARENT_LABEL = "parent_uuid"
#: What ``nvmlDeviceGetMigDeviceHandleByIndex`` answers for a slot without a MIG device.
_EMPTY_SLOT = lib.MISSING_CODES | {lib.ERROR_INVALID_ARGUMENT}


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
            if lib.error_code(nvml, exc) in _EMPTY_SLOT:
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
