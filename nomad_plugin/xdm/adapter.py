"""Wire <-> model mapping for XDM: the ONLY module importing the generated XDM code.

When the official ``api_outer.proto``/``config_service.proto`` turn up, put
them at ``proto/lingjun/``, run ``tools/gen_protos.py`` and adjust only this
module: message and field names, ``PROTO_PACKAGE``/``DEVICE_SERVICE``, and the
mapping functions below. ``client.py`` only sees ``RpcSpec`` objects, opaque
request messages and the model types returned here.

Every mapping degrades instead of failing: a field the reconstruction got
wrong lands in unknown fields (see ``drift.py``) and is recovered where the
meaning is clear (health as bool/enum, numbers sent as strings).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from google.protobuf.message import Message

from nomad_plugin._proto.lingjun import api_outer_pb2 as pb
from nomad_plugin._proto.lingjun import config_service_pb2 as cpb
from nomad_plugin.model.card import Card
from nomad_plugin.model.grant import DeviceNode, Grant, GrantedDevice, GrantRequest, MountSpec
from nomad_plugin.model.metrics import METRIC_NAMES, MetricSample
from nomad_plugin.model.topology_parse import parse_topology
from nomad_plugin.xdm.drift import DriftLog, own_unknown_fields, top_level_unknown_varints
from nomad_plugin.xdm.types import ExporterConfig, ExporterStatus, GpuFacts, RuntimeKitStatus

# ---------------------------------------------------------------- names (R1, R13)
PROTO_PACKAGE = pb.DESCRIPTOR.package  # "xdm" in the reconstruction
DEVICE_SERVICE = "XpuDeviceManagerService"
CONFIG_PACKAGE = cpb.DESCRIPTOR.package  # "config"
CONFIG_SERVICE = "AmpConfigService"

# Proto packages tried, in order, when ``xdm_service`` is empty ("" = none).
DEVICE_PACKAGE_CANDIDATES: tuple[str, ...] = ("xdm", "api", "", "grpc", "outer", "xdmapi", "dp2mgr", "amp.xdm")
CONFIG_PACKAGE_CANDIDATES: tuple[str, ...] = ("config", "configpb", "amp.config", "")
# Service names tried for exporter RPCs when the device service lacks them (R13).
EXPORTER_SERVICE_CANDIDATES: tuple[str, ...] = (
    "ExporterService",
    "XpuExporterService",
    "XpuDeviceExporterService",
    "XdmExporterService",
    "MonitorService",
)


def qualified(package: str, service: str) -> str:
    return f"{package}.{service}" if package else service


@dataclass(frozen=True)
class RpcSpec:
    """One XDM RPC: its method name, message classes and shape.

    ``role`` says which service holds it: "device" (resource management),
    "exporter" (monitoring; may live in its own service, R13) or "config".
    """

    method: str
    request_type: type[Message]
    response_type: type[Message]
    streaming: bool
    role: str


LIST_SUPPORTED_XPU_TYPE = RpcSpec("ListSupportedXPUType", pb.XPUTypeRequest, pb.XPUTypeResponse, False, "device")
LIST_AND_WATCH = RpcSpec("ListAndWatch", pb.ListAndWatchRequest, pb.ListAndWatchResponse, True, "device")
ALLOCATE = RpcSpec("Allocate", pb.AllocateRequest, pb.AllocateResponse, False, "device")
RELEASE = RpcSpec("Release", pb.ReleaseRequest, pb.ReleaseResponse, False, "device")
LIST_GPU_INFO = RpcSpec("ListGpuInfo", pb.ListGpuInfoRequest, pb.ListGpuInfoResponse, False, "exporter")
EXPORTER_GET_DATA_LIST = RpcSpec(
    "ExporterGetDataList", pb.ExporterDataRequest, pb.ExporterDataResponse, False, "exporter"
)
EXPORTER_DATA_STREAM = RpcSpec("ExporterDataStream", pb.ExporterDataRequest, pb.ExporterDataResponse, True, "exporter")
EXPORTER_GET_CONFIG = RpcSpec(
    "ExporterGetConfig", pb.ExporterGetConfigRequest, pb.ExporterGetConfigResponse, False, "exporter"
)
EXPORTER_GET_STATUS = RpcSpec(
    "ExporterGetStatus", pb.ExporterGetStatusRequest, pb.ExporterGetStatusResponse, False, "exporter"
)
QUERY_STATUS = RpcSpec("QueryStatus", cpb.QueryStatusRequest, cpb.QueryStatusResponse, False, "config")
# Enable/Disable are deliberately absent (R14): the plugin never calls them.


def serialize(msg: Message) -> bytes:
    return msg.SerializeToString()


def deserializer(spec: RpcSpec, drift: DriftLog) -> Callable[[bytes], Message]:
    """A response deserializer that checks every parsed message for drift (R2)."""
    response_type = spec.response_type

    def parse(data: bytes) -> Message:
        msg = response_type.FromString(data)
        drift.inspect(msg)
        return msg

    return parse


def inband_status(msg: Message) -> tuple[int, str]:
    """XDM's in-band (status, message); (0, "") for messages without them."""
    names = msg.DESCRIPTOR.fields_by_name
    status = int(getattr(msg, "status", 0)) if "status" in names else 0
    message = str(getattr(msg, "message", "")) if "message" in names else ""
    return status, message


# ---------------------------------------------------------------- requests
def xpu_type_request() -> Message:
    return pb.XPUTypeRequest()


def list_and_watch_request() -> Message:
    return pb.ListAndWatchRequest()


def list_gpu_info_request(minors: Sequence[int] = ()) -> Message:
    return pb.ListGpuInfoRequest(minors=list(minors))


def exporter_data_request(devices: Sequence[str] = (), metric_ids: Sequence[int] = ()) -> Message:
    return pb.ExporterDataRequest(devices=list(devices), metricIds=list(metric_ids))


def exporter_get_config_request() -> Message:
    return pb.ExporterGetConfigRequest()


def exporter_get_status_request() -> Message:
    return pb.ExporterGetStatusRequest()


def query_status_request() -> Message:
    return cpb.QueryStatusRequest()


def release_request(grant_id: str) -> Message:
    return pb.ReleaseRequest(id=grant_id)


MINOR_ENCODINGS = ("explicit", "omit-zero")


def allocate_request(request: GrantRequest, minor_encoding: str = "explicit") -> Message:
    """``GrantRequest`` -> AllocateRequest; the minor is always sent (R4).

    ``explicit``: the minor field is present even for card 0 (proto3
    ``optional``). ``omit-zero``: a plain int32 encoding, where card 0 leaves
    the field off the wire; grant verification then catches an auto-assign.
    """
    if minor_encoding not in MINOR_ENCODINGS:
        raise ValueError(f"xdm_minor_encoding must be one of {MINOR_ENCODINGS}, got {minor_encoding!r}")
    devices = []
    for ask in request.asks:
        item = pb.DeviceRequest(core=ask.core, memory=ask.memory_gib, slice=ask.slices)
        if minor_encoding == "explicit" or ask.minor != 0:
            item.minor = ask.minor
        devices.append(item)
    return pb.AllocateRequest(id=request.grant_id, devices=devices, annotations=dict(request.annotations))


# ---------------------------------------------------------------- responses
def xpu_types(msg: Message) -> list[str]:
    assert isinstance(msg, pb.XPUTypeResponse)
    return [t for t in msg.xpuTypes if t]


def cards_from_list_and_watch(msg: Message, drift: DriftLog) -> list[Card]:
    """One ListAndWatch push (the complete device list, R12) -> cards."""
    assert isinstance(msg, pb.ListAndWatchResponse)
    return [card_from_device(dev, drift) for dev in msg.devices]


def card_from_device(dev: Message, drift: DriftLog) -> Card:
    assert isinstance(dev, pb.Device)
    unknown = _own_unknowns(dev)
    extender = dict(dev.extenderResources)
    healthy, reason = _health(dev, unknown, extender, drift)
    vendor = vendor_of(dev.xpuType, dev.model)
    memory = int(dev.totalMemory) or _recovered_int(unknown, _number(dev, "totalMemory"))
    topology = parse_topology(extender.pop("topology", None))
    if topology.error:
        drift.warn_once(f"topology:{dev.uuid or dev.minor}", f"card {dev.minor} topology: {topology.error}")
    return Card(
        minor=int(dev.minor),
        uuid=dev.uuid,
        model=dev.model,
        vendor=vendor,
        xpu_type=xpu_type_of(dev.xpuType, vendor),
        memory_mib=memory,
        total_core=int(dev.totalCore) or 100,
        pci_bus_id=dev.pciBusId,
        healthy=healthy,
        health_reason=reason,
        topology=topology,
        extra=extender,
    )


_HEALTHY_WORDS = frozenset({"healthy", "ok", "normal", "good", "true"})
_UNHEALTHY_WORDS = frozenset({"unhealthy", "false", "bad", "error", "failed", "fault"})
_REASON_KEYS = ("healthReason", "health_reason", "reason", "healthDescription")
HEALTH_UNKNOWN = "health unknown (schema)"


def _health(
    dev: pb.Device, unknown: Sequence[_Unknown], extender: Mapping[str, str], drift: DriftLog
) -> tuple[bool, str]:
    """R8: a string compared case-insensitively; a varint at the health number
    read as bool/enum (1 = healthy); nothing readable -> healthy, flagged."""
    reason = next((extender[k] for k in _REASON_KEYS if extender.get(k)), "")
    text = dev.health.strip().lower()
    if text in _HEALTHY_WORDS:
        return True, ""
    if text in _UNHEALTHY_WORDS:
        return False, reason or f"XDM reports {dev.health}"
    if text:
        return False, reason or f"XDM reports health {dev.health!r}"
    number = _number(dev, "health")
    for item in unknown:
        if item.number == number and item.wire_type == 0 and isinstance(item.data_int, int):
            if item.data_int == 1:
                return True, ""
            return False, reason or f"XDM reports health code {item.data_int}"
    drift.warn_once("health", f"card {dev.minor} ({dev.uuid}) carries no readable health; reporting it healthy")
    return True, HEALTH_UNKNOWN


@dataclass(frozen=True)
class _Unknown:
    number: int
    wire_type: int
    data_int: int | None
    data_bytes: bytes | None


def _own_unknowns(msg: Message) -> list[_Unknown]:
    out = []
    for item in own_unknown_fields(msg):
        value = item.value
        out.append(
            _Unknown(
                item.number,
                item.wire_type,
                value if isinstance(value, int) else None,
                value if isinstance(value, bytes) else None,
            )
        )
    return out


def _number(msg: Message, field_name: str) -> int:
    return int(msg.DESCRIPTOR.fields_by_name[field_name].number)


def _recovered_int(unknown: Sequence[_Unknown], number: int) -> int:
    """A declared integer field that arrived with another wire type (R2)."""
    for item in unknown:
        if item.number != number:
            continue
        if item.data_int is not None:
            return item.data_int
        if item.data_bytes is not None:
            text = item.data_bytes.decode("utf-8", "replace").strip()
            if text.isdigit():
                return int(text)
    return 0


_NVIDIA_MODEL = re.compile(r"\b(nvidia|tesla|geforce|rtx|quadro|[ahlbv]\d{2,3}|t4|gh200|gb200)\b", re.I)
_AMD_MODEL = re.compile(r"\b(amd|instinct|radeon|mi\d{2,3}x?)\b", re.I)


def vendor_of(xpu_type: str, model: str) -> str:
    """Lower-case vendor from XDM's xpuType and model name."""
    kind = xpu_type.strip().lower()
    if "ppu" in kind or "ppu" in model.lower() or kind in ("alibaba", "t-head", "thead", "zhenwu"):
        return "alibaba"
    if kind in ("amd", "rocm") or _AMD_MODEL.search(model):
        return "amd"
    if kind in ("nvidia", "cuda") or _NVIDIA_MODEL.search(model):
        return "nvidia"
    if kind == "gpu":
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


def gpu_facts(msg: Message) -> list[GpuFacts]:
    assert isinstance(msg, pb.ListGpuInfoResponse)
    facts = []
    for info in msg.gpuInfos:
        unknown = _own_unknowns(info)
        memory = int(info.totalMemory) or _recovered_int(unknown, _number(info, "totalMemory"))
        facts.append(
            GpuFacts(
                minor=int(info.minor),
                uuid=info.uuid,
                model=info.model,
                driver_version=info.driverVersion,
                vendor=info.vendor.lower(),
                xpu_type=info.xpuType,
                memory_mib=memory,
                pci_bus_id=info.pciBusId,
                numa_node=int(info.numaNode) if info.numaNode >= 0 else None,
                mig_enabled=bool(info.migEnabled),
                firmware_version=info.firmwareVersion,
                sdk_version=info.sdkVersion,
            )
        )
    return facts


@dataclass(frozen=True)
class AllocateOutcome:
    """An AllocateResponse as plain data, plus what R3 needs to judge it."""

    grant: Grant
    status: int
    message: str
    unknown_varints: tuple[str, ...]  # descriptions of top-level unknown varints (possible error codes)


def allocate_outcome(msg: Message, request_id: str) -> AllocateOutcome:
    assert isinstance(msg, pb.AllocateResponse)
    grant = Grant(
        grant_id=msg.id or request_id,
        devices=tuple(
            GrantedDevice(
                minor=int(d.minor),
                uuid=d.uuid,
                core=int(d.core),
                memory_gib=int(d.memory),
                slices=int(d.slice),
                mig_uuid=d.migUuid,
            )
            for d in msg.devices
        ),
        envs=dict(msg.envs),
        mounts=tuple(MountSpec(m.containerPath, m.hostPath, bool(m.readOnly)) for m in msg.mounts),
        device_nodes=tuple(DeviceNode(d.containerPath, d.hostPath, d.permissions or "rwm") for d in msg.deviceSpecs),
        annotations=dict(msg.annotations),
        cdi_devices=tuple(msg.cdiDevices),
    )
    varints = tuple(u.describe() for u in top_level_unknown_varints(msg) if u.value != 0)
    return AllocateOutcome(grant, int(msg.status), msg.message, varints)


def metric_samples(msg: Message) -> list[MetricSample]:
    assert isinstance(msg, pb.ExporterDataResponse)
    samples = []
    names = METRIC_NAMES
    for data in msg.dataList:  # ~400 a second at 16 cards: keep the per-sample work small (issue 14)
        metric_id = int(data.metricId) or _recovered_int(_own_unknowns(data), _number(data, "metricId"))
        name = data.metricName or names.get(metric_id) or f"metric_{metric_id}"
        labels = data.labels
        samples.append(
            MetricSample(
                data.device,
                metric_id,
                name,
                float(data.value),
                int(data.timestamp),
                {key: labels[key] for key in labels} if labels else {},  # twice as fast as dict(labels)
            )
        )
    return samples


def exporter_config(msg: Message) -> ExporterConfig:
    assert isinstance(msg, pb.ExporterGetConfigResponse)
    return ExporterConfig(int(msg.collectIntervalMs), tuple(int(m) for m in msg.metricIds), dict(msg.config))


def exporter_status(msg: Message) -> ExporterStatus:
    assert isinstance(msg, pb.ExporterGetStatusResponse)
    return ExporterStatus(bool(msg.running), msg.state, int(msg.lastCollectTimestamp), msg.version, msg.message)


def runtime_kit_status(msg: Message) -> RuntimeKitStatus:
    assert isinstance(msg, cpb.QueryStatusResponse)
    return RuntimeKitStatus(bool(msg.enabled), msg.message)
