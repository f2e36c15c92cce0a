"""What the plugin guesses about XDM, fenced off from what it knows.

Lingjun's gRPC API reference gives the RPC names, streaming shapes, units, the topology JSON and a
few field and service names: that contract is bound by ``binder``. Everything here is a guess, needed
while XDM's official ``api_outer.proto`` is not bound. ``docs/xdm-risks.md`` lists what goes then.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from google.protobuf.message import Message
from google.protobuf.unknown_fields import UnknownFieldSet

from nomad_plugin.model.errors import BackendRefused, BackendUnavailable

T = TypeVar("T")

#: Service names from the reference's Go examples (R1, R13); the proto packages around them are not known.
DEVICE_SERVICE = "XpuDeviceManagerService"
CONFIG_SERVICE = "AmpConfigService"
#: Tried in this order when the schema in use is the reconstruction ("" = no package).
DEVICE_PACKAGES = ("xdm", "api", "", "grpc", "outer", "xdmapi", "dp2mgr", "amp.xdm")
CONFIG_PACKAGES = ("config", "configpb", "amp.config", "")
#: Where the monitoring RPCs may live when the device service lacks them.
EXPORTER_SERVICES = tuple(
    "ExporterService XpuExporterService XpuDeviceExporterService XdmExporterService MonitorService".split()
)


def qualified(package: str, service: str) -> str:
    return f"{package}.{service}" if package else service


def device_services(configured: str = "", reflected: Sequence[str] = ()) -> list[str]:
    """Candidates for the device service: ``xdm_service``, reflected ones, then the package guesses."""
    return _unique(configured, *reflected, *(qualified(p, DEVICE_SERVICE) for p in DEVICE_PACKAGES))


def exporter_services(devices: Sequence[str]) -> list[str]:
    """Candidates for a monitoring RPC: the device service(s), then exporter-like names beside them."""
    return _unique(*devices, *(qualified(d.rpartition(".")[0], s) for d in devices for s in EXPORTER_SERVICES))


def config_services(reflected: Sequence[str] = ()) -> list[str]:
    return _unique(*reflected, *(qualified(p, CONFIG_SERVICE) for p in CONFIG_PACKAGES))


def _unique(*names: str) -> list[str]:
    return list(dict.fromkeys(n for n in names if n))


def probe(
    candidates: Sequence[str], attempt: Callable[[str], T], what: str, hint: str = ""
) -> tuple[str, T | BackendRefused]:
    """The first candidate service implementing an RPC, with its answer: UNIMPLEMENTED moves on; a
    refusal proves the service exists and is returned for the caller to raise."""
    for service in candidates:
        try:
            return service, attempt(service)
        except BackendRefused as exc:
            return service, exc
        except BackendUnavailable as exc:
            if exc.kind != "unimplemented":
                raise
    raise BackendUnavailable(
        f"{what}: XDM implements it under none of the known service names ({', '.join(candidates)}){hint}",
        kind="unimplemented",
    )


#: Synonyms tried for a reconstruction field without a field of its own name in XDM's schema (R2);
#: the operator's ``xdm_field_aliases`` come first.
FIELD_ALIASES: Mapping[str, tuple[str, ...]] = {
    "totalMemory": ("memory", "memoryTotal", "totalMem", "memTotal", "memoryMiB", "totalMemoryMiB", "memorySize"),
    "totalCore": ("core", "cores", "totalCores", "coreTotal"),
    "minor": ("minorNumber", "deviceMinor", "index", "deviceIndex", "gpuIndex"),
    "uuid": ("deviceUuid", "gpuUuid", "xpuUuid", "deviceId"),
    "health": ("healthStatus", "healthState", "deviceHealth"),
    "pciBusId": ("busId", "pciAddress", "pciBus", "pci"),
    "extenderResources": ("extendedResources", "extender", "extenderResource", "attributes"),
    "xpuType": ("type", "deviceType", "kind"),
    "xpuTypes": ("types", "supportedTypes", "xpuType"),
    "deviceSpecs": ("deviceNodes", "deviceSpec", "nodes"),
    "envs": ("env", "envVars", "environment", "envs"),
    "gpuInfos": ("gpuInfo", "gpus", "infos", "devices"),
    "dataList": ("data", "metrics", "datas"),
    "metricIds": ("metricId", "metrics", "ids"),
    "cdiDevices": ("cdi", "cdiNames"),
    "migUuid": ("migDeviceUuid", "migId"),
    "driverVersion": ("driver",),
    "annotations": ("annotation",),
    "message": ("msg", "errorMessage", "errMsg", "reason"),
    "status": ("code", "statusCode", "errorCode", "retCode"),
    "permissions": ("permission", "perm", "perms"),
    "readOnly": ("readonly", "ro"),
}

#: How Allocate may encode "minor" (R4): ``explicit`` sets it even for card 0 (proto3 ``optional``);
#: ``omit-zero`` is a plain int32, card 0 absent on the wire (read as "any card": verification catches it).
MINOR_ENCODINGS = ("explicit", "omit-zero")


# Health (R8)
HEALTHY_WORDS = frozenset({"healthy", "ok", "normal", "good", "true"})
UNHEALTHY_WORDS = frozenset({"unhealthy", "false", "bad", "error", "failed", "fault"})
#: ``extenderResources`` keys that may carry the reason of a health state.
REASON_KEYS = ("healthReason", "health_reason", "reason", "healthDescription")
#: Starts the reason of a card whose health could not be read; the guards make it a mismatch.
HEALTH_UNREADABLE = "health unreadable"


def health(word: str, device: Message, number: int, extender: Mapping[str, str]) -> tuple[bool, str]:
    """(healthy, reason) from XDM's health text, case-insensitive; an enum name reads by its last word
    (``HEALTH_OK``), an empty text with a varint at ``number`` among the unknown fields as a bool or
    enum (1 = healthy). Anything else is unreadable, never healthy."""
    reason = next((extender[k] for k in REASON_KEYS if extender.get(k)), "")
    text = word.strip().lower()
    last = text.rsplit("_", 1)[-1]
    if text in HEALTHY_WORDS or last in HEALTHY_WORDS:
        return True, ""
    if text in UNHEALTHY_WORDS or last in UNHEALTHY_WORDS:
        return False, reason or f"XDM reports {word}"
    for item in _unknown(device) if not text else ():
        if item.field_number == number and item.wire_type == 0:
            return (True, "") if item.data == 1 else (False, reason or f"XDM reports health code {item.data}")
    shown = repr(word[:40]) if text else "nothing"
    return False, f"{HEALTH_UNREADABLE}: XDM sent {shown}"


def _unknown(msg: Message) -> list[Any]:
    fields = UnknownFieldSet(msg)
    return [fields[i] for i in range(len(fields))]


def recovered_int(msg: Message, number: int) -> int:
    """A declared integer field that arrived as another wire type (a varint, or digits as a string)."""
    for data in (item.data for item in _unknown(msg) if item.field_number == number):
        if isinstance(data, int):
            return data
        if isinstance(data, bytes) and data.decode("utf-8", "replace").strip().isdigit():
            return int(data)
    return 0


def error_code_hints(msg: Message) -> tuple[str, ...]:
    """Non-zero unknown varints on a response: where ``status`` would be if its number is wrong."""
    name = msg.DESCRIPTOR.full_name
    return tuple(f"{name} field {u.field_number} = {u.data}" for u in _unknown(msg) if u.wire_type == 0 and u.data)


_NVIDIA_MODEL = re.compile(r"\b(nvidia|tesla|geforce|rtx|quadro|[ahlbv]\d{2,3}|t4|gh200|gb200)\b", re.I)
_AMD_MODEL = re.compile(r"\b(amd|instinct|radeon|mi\d{2,3}x?)\b", re.I)


def vendor_of(xpu_type: str, model: str) -> str:
    """Lower-case vendor from XDM's xpuType and model name."""
    kind = xpu_type.strip().lower()
    if "ppu" in kind or "ppu" in model.lower() or kind in ("alibaba", "t-head", "thead", "zhenwu"):
        return "alibaba"
    if kind in ("amd", "rocm") or _AMD_MODEL.search(model):
        return "amd"
    if kind in ("nvidia", "cuda", "gpu") or _NVIDIA_MODEL.search(model):
        return "nvidia"
    return kind or "unknown"


def xpu_type_of(xpu_type: str, vendor: str) -> str:
    """The family, lower-case: "ppu" for Alibaba PPU, "gpu" for NVIDIA/AMD."""
    kind = xpu_type.strip().lower()
    if vendor == "alibaba" or kind == "ppu":
        return "ppu"
    if vendor in ("nvidia", "amd") or kind in ("gpu", "nvidia", "amd", "cuda", "rocm", ""):
        return "gpu"
    return kind


#: In-band refusal codes are undocumented: a refusal whose text says this counts as released (R6).
NOT_FOUND_WORDS = ("not found", "not exist", "no such", "no allocation", "unknown allocation", "unknown id")


def says_not_found(text: str) -> bool:
    lowered = text.lower()
    return any(word in lowered for word in NOT_FOUND_WORDS)
