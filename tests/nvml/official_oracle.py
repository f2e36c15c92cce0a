"""hashicorp/nomad-device-nvidia (main 05e83c3), restated as an oracle over a ``pynvml``-like module.

The facts come from its source: ``nvml/driver_linux.go`` (which NVML calls,
what each return code does, the unit conversions), ``nvml/client.go`` (MIG
parents skipped, devices sorted by UUID, MIG devices and parents without
stats), ``fingerprint.go`` (groups by device name, attributes of the group's
first device plus ``driver_version``, ignored UUIDs), ``stats.go`` (the eleven
stats, their units and descriptions, "N/A" for a missing value, the memory
state as summary) and ``device.go`` (config schema, Reserve). The code is our
own; it calls the module the way that plugin's driver calls go-nvml, so it
runs on the NVML double here and on real ``pynvml`` on a GPU machine
(``benchmarks/dropin_compare.py``).

Results use the conformance host's event shapes (tests/conformance/README.md),
so they compare directly with what the real plugin sends.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

NORMAL, PARENT, MIG = "normal", "parent", "mig"

SUCCESS = 0
INVALID_ARGUMENT = 2
NOT_SUPPORTED = 3
NOT_FOUND = 6

VENDOR, DEVICE_TYPE, NOT_AVAILABLE = "nvidia", "gpu", "N/A"
VISIBLE_DEVICES = "NVIDIA_VISIBLE_DEVICES"
DISABLED_ERROR = "device is not enabled"
#: ConfigSchema: (type, default) per key, each a Default(Attr, Literal) (device.go).
CONFIG_SCHEMA = {
    "enabled": ("bool", "true"),
    "ignored_gpu_ids": ("list(string)", "[]"),
    "fingerprint_period": ("string", '"1m"'),
}
#: stats.go: name -> (unit, desc).
STATS = {
    "Power usage": (
        "W",
        "Power usage for this GPU in watts and its associated circuitry (e.g. memory) / Maximum GPU Power",
    ),
    "GPU utilization": (
        "%",
        "Percent of time over the past sample period during which one or more kernels were executing on the GPU.",
    ),
    "Memory utilization": ("%", "Percentage of bandwidth used during the past sample period"),
    "Encoder utilization": ("%", "Percent of time over the past sample period during which GPU Encoder was used"),
    "Decoder utilization": ("%", "Percent of time over the past sample period during which GPU Decoder was used"),
    "Temperature": ("C", "Temperature of the Unit"),
    "Memory state": ("MiB", "UsedMemory / TotalMemory"),
    "BAR1 buffer state": ("MiB", "UsedBAR1 / TotalBAR1"),
    "ECC L1 errors": ("#", "Requested L1Cache error counter for the device"),
    "ECC L2 errors": ("#", "Requested L2Cache error counter for the device"),
    "ECC memory errors": ("#", "Requested memory error counter for the device"),
}
#: fingerprint.go: attribute -> unit ("" for strings).
ATTRIBUTES = {
    "memory": "MiB",
    "power": "W",
    "bar1": "MiB",
    "driver_version": "",
    "cores_clock": "MHz",
    "memory_clock": "MHz",
    "pci_bandwidth": "MB/s",
    "display_state": "",
    "persistence_mode": "",
}
_MIB = 1 << 20
#: MB/s per lane, by PCIe generation (driver_linux.go); other generations give 0.
_LANE = {3: 1 << 10, 4: 2 << 10, 5: 3 << 10, 6: 4 << 10}


class OfficialError(Exception):
    """What the official plugin would answer with an error (its ``decode(msg, code)`` text)."""


def _code(nvml: Any, exc: BaseException) -> int:
    value = getattr(exc, "value", None)
    return int(value) if isinstance(value, int) else -1


def _call(nvml: Any, what: str, fn: str, *args: Any, ok: Iterable[int] = ()) -> tuple[Any, int]:
    """(value, SUCCESS) or (None, code) when ``code`` is in ``ok``; any other failure is the plugin's error."""
    try:
        return getattr(nvml, fn)(*args), SUCCESS
    except nvml.NVMLError as exc:
        code = _code(nvml, exc)
        if code in ok:
            return None, code
        raise OfficialError(f"{what}: {exc}") from None


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def host_memory_mib() -> tuple[int, int]:
    """sysinfo(2)'s totalram and totalram - freeram, in MiB (determineMemoryInfo's iGPU branch)."""
    page = os.sysconf("SC_PAGE_SIZE")
    total = os.sysconf("SC_PHYS_PAGES") * page
    free = os.sysconf("SC_AVPHYS_PAGES") * page
    return total // _MIB, (total - free) // _MIB


# --- nvml/driver_linux.go --------------------------------------------------------------------


def list_device_uuids(nvml: Any) -> dict[str, str]:
    """ListDeviceUUIDs: every GPU by UUID as normal, a MIG-enabled one as parent plus its MIG devices."""
    uuids: dict[str, str] = {}
    count, _ = _call(nvml, "failed to get device count", "nvmlDeviceGetCount")
    for index in range(int(count)):
        device, _ = _call(nvml, f"failed to get device handle {index}/{count}", "nvmlDeviceGetHandleByIndex", index)
        modes, code = _call(nvml, "failed to get device MIG mode", "nvmlDeviceGetMigMode", device, ok=(NOT_SUPPORTED,))
        if code == NOT_SUPPORTED or int(modes[0]) == int(nvml.NVML_DEVICE_MIG_DISABLE):
            uuid, _ = _call(nvml, "failed to get device %d uuid", "nvmlDeviceGetUUID", device)
            uuids[_text(uuid)] = NORMAL
            continue
        slots, _ = _call(nvml, "failed to get device MIG device count", "nvmlDeviceGetMaxMigDeviceCount", device)
        parent, code = _call(nvml, "", "nvmlDeviceGetUUID", device, ok=range(1, 1000))
        if code == SUCCESS:
            uuids[_text(parent)] = PARENT
        for slot in range(int(slots)):
            mig, code = _call(
                nvml,
                "failed to get device MIG device handle",
                "nvmlDeviceGetMigDeviceHandleByIndex",
                device,
                slot,
                ok=(NOT_FOUND, INVALID_ARGUMENT),
            )
            if code != SUCCESS:
                continue
            uuid, _ = _call(nvml, f"failed to get mig device uuid {slot}", "nvmlDeviceGetUUID", mig)
            uuids[_text(uuid)] = MIG
    return uuids


def _memory(nvml: Any, device: Any) -> tuple[int, int, bool]:
    """determineMemoryInfo: (total MiB, used MiB, uses the host's memory)."""
    memory, code = _call(
        nvml, "failed to get device memory info", "nvmlDeviceGetMemoryInfo", device, ok=(NOT_SUPPORTED,)
    )
    if code == NOT_SUPPORTED:
        total, used = host_memory_mib()
        return total, used, True
    return int(memory.total) // _MIB, int(memory.used) // _MIB, False


@dataclass
class DeviceInfo:
    """DeviceInfo: ``None`` where the official leaves a pointer nil."""

    uuid: str
    name: str
    memory_mib: int
    power_w: int
    bar1_mib: int | None
    pci_bandwidth: int
    pci_bus_id: str
    cores_clock: int
    memory_clock: int | None
    display_state: str
    persistence_mode: str


def device_info(nvml: Any, uuid: str) -> DeviceInfo:
    """DeviceInfoByUUID: a MIG device's power, BAR1, PCI, clocks and modes come from its parent."""
    device, _ = _call(nvml, "failed to get device handle", "nvmlDeviceGetHandleByUUID", uuid)
    name, _ = _call(nvml, "failed to get device name", "nvmlDeviceGetName", device)
    total, _, _ = _memory(nvml, device)
    parent, code = _call(
        nvml,
        "failed to get device parent device handle",
        "nvmlDeviceGetDeviceHandleFromMigDeviceHandle",
        device,
        ok=(NOT_FOUND, INVALID_ARGUMENT),
    )
    if code == SUCCESS:
        device = parent
    power, _ = _call(nvml, "failed to get device power info", "nvmlDeviceGetPowerUsage", device, ok=(NOT_SUPPORTED,))
    bar1, _ = _call(
        nvml, "failed to get device bar 1 memory info", "nvmlDeviceGetBAR1MemoryInfo", device, ok=(NOT_SUPPORTED,)
    )
    pci, _ = _call(nvml, "failed to get device pci info", "nvmlDeviceGetPciInfo", device)
    width, _ = _call(
        nvml, "failed to get pcie link width", "nvmlDeviceGetMaxPcieLinkWidth", device, ok=(NOT_SUPPORTED,)
    )
    gen, _ = _call(
        nvml, "failed to get pcie link generation", "nvmlDeviceGetMaxPcieLinkGeneration", device, ok=(NOT_SUPPORTED,)
    )
    cores, _ = _call(
        nvml, "failed to get device core clock", "nvmlDeviceGetClockInfo", device, nvml.NVML_CLOCK_GRAPHICS
    )
    memory_clock, _ = _call(
        nvml,
        "failed to get device mem clock",
        "nvmlDeviceGetClockInfo",
        device,
        nvml.NVML_CLOCK_MEM,
        ok=(NOT_SUPPORTED,),
    )
    display, _ = _call(nvml, "failed to get device display mode", "nvmlDeviceGetDisplayMode", device)
    persistence, _ = _call(nvml, "failed to get device persistence mode", "nvmlDeviceGetPersistenceMode", device)
    bus = _text(getattr(pci, "busId", b""))
    return DeviceInfo(
        uuid=uuid,
        name=_text(name),
        memory_mib=total,
        power_w=int(power or 0) // 1000,
        bar1_mib=int(bar1.bar1Total) // _MIB if bar1 is not None else None,
        pci_bandwidth=_LANE.get(int(gen or 0), 0) * int(width or 0),
        pci_bus_id=bus.ljust(32, "\0"),  # buildID: the 32-byte busId array, NULs included
        cores_clock=int(cores),
        memory_clock=int(memory_clock) if memory_clock is not None else None,
        display_state=str(int(display)),  # fmt "%v" of go-nvml's EnableState: the number
        persistence_mode=str(int(persistence)),
    )


def device_status(nvml: Any, uuid: str) -> tuple[DeviceInfo, dict[str, int | None]]:
    """DeviceInfoAndStatusByUUID (called for normal GPUs only)."""
    info = device_info(nvml, uuid)
    device, _ = _call(nvml, "failed to get device info", "nvmlDeviceGetHandleByUUID", uuid)
    total, used, host = _memory(nvml, device)
    bar1, _ = _call(
        nvml, "failed to get device bar1 memory info", "nvmlDeviceGetBAR1MemoryInfo", device, ok=(NOT_SUPPORTED,)
    )
    _, code = _call(
        nvml,
        "failed to get device parent device handle",
        "nvmlDeviceGetDeviceHandleFromMigDeviceHandle",
        device,
        ok=(NOT_FOUND, INVALID_ARGUMENT),
    )
    is_mig = code == SUCCESS
    gpu = mem_util = enc = dec = power = temp = 0
    if not is_mig:
        util, _ = _call(nvml, "failed to get device utilization", "nvmlDeviceGetUtilizationRates", device)
        gpu, mem_util = int(util.gpu), int(util.memory)
        if host and total > 0:
            mem_util = used * 100 // total
        enc_pair, _ = _call(nvml, "failed to get device encoder utilization", "nvmlDeviceGetEncoderUtilization", device)
        dec_pair, _ = _call(nvml, "failed to get device decoder utilization", "nvmlDeviceGetDecoderUtilization", device)
        enc, dec = int(enc_pair[0]), int(dec_pair[0])
        reading, _ = _call(
            nvml,
            "failed to get device temperature",
            "nvmlDeviceGetTemperature",
            device,
            nvml.NVML_TEMPERATURE_GPU,
            ok=(NOT_SUPPORTED,),
        )
        temp = int(reading or 0)
        draw, _ = _call(
            nvml, "failed to get device power usage", "nvmlDeviceGetPowerUsage", device, ok=(NOT_SUPPORTED,)
        )
        power = int(draw or 0)  # milliwatts: not divided, unlike DeviceInfo.PowerW
    ecc, _ = _call(
        nvml,
        "failed to get device ecc error counts",
        "nvmlDeviceGetDetailedEccErrors",
        device,
        nvml.NVML_MEMORY_ERROR_TYPE_CORRECTED,
        nvml.NVML_VOLATILE_ECC,
        ok=(NOT_SUPPORTED,),
    )
    return info, {
        "power_usage": power,
        "gpu_util": gpu,
        "memory_util": mem_util,
        "encoder_util": enc,
        "decoder_util": dec,
        "temperature": temp,
        "memory_used": used,
        "memory_total": total,
        "bar1_used": int(bar1.bar1Used) // _MIB if bar1 is not None else None,
        "ecc_l1": int(ecc.l1Cache) if ecc is not None else 0,
        "ecc_l2": int(ecc.l2Cache) if ecc is not None else 0,
        "ecc_memory": int(ecc.deviceMemory) if ecc is not None else 0,
    }


# --- nvml/client.go, fingerprint.go, stats.go, device.go --------------------------------------


@dataclass
class Fingerprint:
    """What the official plugin sends first: groups, or the error it ends the stream with."""

    groups: list[dict[str, Any]] = field(default_factory=list)
    error: str = ""
    #: it sends nothing at all while the set of device UUIDs is empty (fingerprintChanged is false)
    sent: bool = True
    devices: list[DeviceInfo] = field(default_factory=list)


def _attribute(value: Any, unit: str) -> dict[str, Any]:
    kind = "string" if isinstance(value, str) else "int"
    return {"kind": kind, "unit": unit, "value": value}


def fingerprint(nvml: Any, ignored: Iterable[str] = (), enabled: bool = True) -> Fingerprint:
    """The first FingerprintResponse (GetFingerprintData, ignoreFingerprintedDevices, groups)."""
    if not enabled:
        return Fingerprint(error=DISABLED_ERROR, sent=False)
    try:
        driver, _ = _call(nvml, "nvidia nvml SystemDriverVersion() error", "nvmlSystemGetDriverVersion")
        uuids = list_device_uuids(nvml)
        devices = sorted((device_info(nvml, u) for u, mode in uuids.items() if mode != PARENT), key=lambda d: d.uuid)
    except OfficialError as exc:
        return Fingerprint(error=str(exc))
    skip = set(ignored)
    kept = [d for d in devices if d.uuid not in skip]
    if not kept:
        return Fingerprint(sent=False)
    by_name: dict[str, list[DeviceInfo]] = {}
    for dev in kept:
        by_name.setdefault(dev.name or NOT_AVAILABLE, []).append(dev)
    groups = []
    for name, members in by_name.items():
        first = members[0]
        attrs = {
            "display_state": _attribute(first.display_state, ""),
            "persistence_mode": _attribute(first.persistence_mode, ""),
            "memory": _attribute(first.memory_mib, "MiB"),
            "power": _attribute(first.power_w, "W"),
            "pci_bandwidth": _attribute(first.pci_bandwidth, "MB/s"),
            "cores_clock": _attribute(first.cores_clock, "MHz"),
            "driver_version": _attribute(_text(driver), ""),
        }
        if first.bar1_mib is not None:
            attrs["bar1"] = _attribute(first.bar1_mib, "MiB")
        if first.memory_clock is not None:
            attrs["memory_clock"] = _attribute(first.memory_clock, "MHz")
        groups.append(
            {
                "vendor": VENDOR,
                "type": DEVICE_TYPE,
                "name": name,
                "attributes": attrs,
                "devices": [
                    {"id": d.uuid, "healthy": True, "health_description": "", "pci_bus_id": d.pci_bus_id}
                    for d in members
                ],
            }
        )
    return Fingerprint(groups=groups, devices=kept)


def _stat(name: str, numerator: int | None, denominator: int | None = None, ratio: bool = False) -> dict[str, Any]:
    unit, desc = STATS[name]
    if numerator is None or (ratio and denominator is None):
        return {"string": NOT_AVAILABLE, "unit": unit, "desc": desc}
    out: dict[str, Any] = {"int_numerator": numerator, "unit": unit, "desc": desc}
    if ratio:
        out["int_denominator"] = denominator
    return out


@dataclass
class Stats:
    """The first StatsResponse: per fingerprinted normal GPU, its eleven stats; or the error."""

    instances: dict[str, dict[str, Any]] = field(default_factory=dict)
    error: str = ""


def stats(nvml: Any, fingerprinted: Iterable[str]) -> Stats:
    """GetStatsData for normal GPUs, filtered to the fingerprinted UUIDs (filterStatsByID), statsForItem."""
    wanted = set(fingerprinted)
    try:
        uuids = list_device_uuids(nvml)
        found = {u: device_status(nvml, u) for u, mode in sorted(uuids.items()) if mode == NORMAL}
    except OfficialError as exc:
        return Stats(error=str(exc))
    out: dict[str, dict[str, Any]] = {}
    for uuid, (info, s) in found.items():
        if uuid not in wanted:
            continue
        memory = _stat("Memory state", s["memory_used"], s["memory_total"], ratio=True)
        out[uuid] = {
            "summary": memory,
            "stats": {
                "Power usage": _stat("Power usage", s["power_usage"], info.power_w, ratio=True),
                "GPU utilization": _stat("GPU utilization", s["gpu_util"]),
                "Memory utilization": _stat("Memory utilization", s["memory_util"]),
                "Encoder utilization": _stat("Encoder utilization", s["encoder_util"]),
                "Decoder utilization": _stat("Decoder utilization", s["decoder_util"]),
                "Temperature": _stat("Temperature", s["temperature"]),
                "Memory state": memory,
                "BAR1 buffer state": _stat("BAR1 buffer state", s["bar1_used"], info.bar1_mib, ratio=True),
                "ECC L1 errors": _stat("ECC L1 errors", s["ecc_l1"]),
                "ECC L2 errors": _stat("ECC L2 errors", s["ecc_l2"]),
                "ECC memory errors": _stat("ECC memory errors", s["ecc_memory"]),
            },
        }
    return Stats(instances=out)


def reserve(ids: list[str], fingerprinted: Iterable[str], enabled: bool = True) -> dict[str, Any]:
    """Reserve: {"ok", "envs"} or {"ok": False, "message"} (device.go)."""
    if not ids:
        return {"ok": True, "envs": {}}
    if not enabled:
        return {"ok": False, "message": DISABLED_ERROR}
    known = set(fingerprinted)
    unknown = [i for i in ids if i not in known]
    if unknown:
        return {"ok": False, "message": f"unknown device IDs: {','.join(unknown)}"}
    return {"ok": True, "envs": {VISIBLE_DEVICES: ",".join(ids)}}


def set_config(values: Mapping[str, Any]) -> str:
    """SetConfig: "" when accepted, else its error (only fingerprint_period can fail: time.ParseDuration)."""
    period = str(values.get("fingerprint_period", "1m"))
    return "" if go_parse_duration_ok(period) else f'failed to parse fingerprint period "{period}"'


def go_parse_duration_ok(text: str) -> bool:
    """Whether Go's time.ParseDuration accepts ``text``: [-+]? then (number unit)+, or "0"; int64 ns."""
    units = {"ns": 1, "us": 1e3, "µs": 1e3, "μs": 1e3, "ms": 1e6, "s": 1e9, "m": 60e9, "h": 3600e9}
    body = text[1:] if text[:1] in "+-" else text
    if body == "0":
        return True
    if not body:
        return False
    total, i = 0.0, 0
    while i < len(body):
        start = i
        while i < len(body) and (body[i].isdigit() or body[i] == "."):
            i += 1
        number = body[start:i]
        if not number or number == "." or number.count(".") > 1:
            return False
        start = i
        while i < len(body) and not (body[i].isdigit() or body[i] == "."):
            i += 1
        unit = body[start:i]
        if unit not in units:
            return False
        total += float(number) * units[unit]
    return total <= 2**63 - 1
