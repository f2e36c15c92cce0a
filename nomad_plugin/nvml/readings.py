"""One poll of NVML readings as ``MetricSample``s (NVML has no push).

Readings follow the official Nomad NVIDIA plugin (utilisation, memory,
temperature, power, ECC, clocks) plus clock-event (throttle) reasons,
remapped rows and, unlike the official plugin, per-MIG-instance memory.
A reading the card does not support is left out, never faked as 0.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from nomad_plugin.model.metrics import METRIC_IDS, MetricSample
from nomad_plugin.nvml import lib
from nomad_plugin.nvml.devices import DeviceRef
from nomad_plugin.nvml.lib import Nvml

_MIB = 1024 * 1024
PARENT_LABEL = "parent_uuid"


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
    util = lib.optional(nvml, "nvmlDeviceGetUtilizationRates", handle)
    if util is not None:
        values["core_util_percent"] = util.gpu
        values["memory_util_percent"] = util.memory
    mem = lib.optional(nvml, "nvmlDeviceGetMemoryInfo", handle)
    if mem is not None:
        values["memory_used_mib"] = int(mem.used) // _MIB
        values["memory_total_mib"] = int(mem.total) // _MIB
    temp = lib.optional(nvml, "nvmlDeviceGetTemperature", handle, nvml.NVML_TEMPERATURE_GPU)
    if temp is not None:
        values["temperature_c"] = temp
    power = lib.optional(nvml, "nvmlDeviceGetPowerUsage", handle)
    if power is not None:
        values["power_w"] = int(power) / 1000.0
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
    values.update(official_values(nvml, handle))
    return values


def official_values(nvml: Nvml, handle: Any) -> dict[str, float]:
    """The readings only nomad-device-nvidia's stats show: encoder/decoder, BAR1, ECC by location.

    ECC counts are corrected errors since the last driver load (volatile), per
    location, as its nvmlDeviceGetDetailedEccErrors(CORRECTED, VOLATILE) call.
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
    for name, location in (
        ("ecc_l1_corrected", lib.LOCATION_L1_CACHE),
        ("ecc_l2_corrected", lib.LOCATION_L2_CACHE),
        ("ecc_memory_corrected", lib.LOCATION_DEVICE_MEMORY),
    ):
        count = lib.optional(
            nvml,
            "nvmlDeviceGetMemoryErrorCounter",
            handle,
            nvml.NVML_MEMORY_ERROR_TYPE_CORRECTED,
            nvml.NVML_VOLATILE_ECC,
            location,
        )
        if count is not None:
            values[name] = count
    return values


def _mig_samples(nvml: Nvml, ref: DeviceRef, ts_ms: int) -> list[MetricSample]:
    out: list[MetricSample] = []
    for slot in range(int(nvml.nvmlDeviceGetMaxMigDeviceCount(ref.handle))):
        try:
            mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(ref.handle, slot)
        except nvml.NVMLError as exc:
            if lib.error_code(nvml, exc) in lib.MISSING_CODES:
                continue
            raise
        uuid = lib.text(nvml.nvmlDeviceGetUUID(mig))
        mem = lib.optional(nvml, "nvmlDeviceGetMemoryInfo", mig)
        if mem is None:
            continue
        labels = {PARENT_LABEL: ref.uuid}
        out.append(sample(uuid, "memory_used_mib", int(mem.used) // _MIB, ts_ms, labels))
        out.append(sample(uuid, "memory_total_mib", int(mem.total) // _MIB, ts_ms, labels))
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
