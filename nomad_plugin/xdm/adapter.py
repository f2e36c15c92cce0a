"""Wire <-> model mapping for XDM, through a ``binder.Binding``.

Nothing here knows a field number: every read and write goes through the
binding of the schema in use (the reconstruction, XDM's reflection or the
operator's official proto), by model field name. ``client.py`` only sees
``RpcSpec`` objects, opaque request messages and the model types returned
here. Every function takes an optional binding; None means the built-in
reconstruction (the same code path, bound once per process).

Every mapping degrades instead of failing: a value that arrives with another
wire type lands in unknown fields (see ``drift.py``) and is recovered where
the meaning is clear (health as bool/enum, numbers sent as strings). What the
plausibility guards (``guards.py``) must see is kept visible: an unreadable
health word is reported as such, never defaulted to healthy.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from google.protobuf.message import Message

from nomad_plugin.model.card import Card, Topology, parse_topology
from nomad_plugin.model.grant import DeviceNode, Grant, GrantedDevice, GrantRequest, MountSpec
from nomad_plugin.model.metrics import METRIC_NAMES, MetricSample
from nomad_plugin.util import text
from nomad_plugin.xdm.binder import Binding, MessageBinding, builtin_binding
from nomad_plugin.xdm.drift import DriftLog, own_unknown_fields, top_level_unknown_varints
from nomad_plugin.xdm.guards import HEALTH_UNREADABLE
from nomad_plugin.xdm.types import ExporterConfig, ExporterStatus, GpuFacts, RuntimeKitStatus

# ---------------------------------------------------------------- names (R1, R13)
PROTO_PACKAGE = "xdm"  # the reconstruction's package
DEVICE_SERVICE = "XpuDeviceManagerService"
CONFIG_PACKAGE = "config"
CONFIG_SERVICE = "AmpConfigService"

# Proto packages tried, in order, when the schema is the reconstruction and
# ``xdm_service`` is empty ("" = none).
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
    ``path`` is the wire path from the schema; None when the service name
    must be probed (the reconstruction's package is a guess, R1).
    """

    method: str
    request_type: type[Message]
    response_type: type[Message]
    streaming: bool
    role: str
    path: str | None = None


def _bb(binding: Binding | None) -> Binding:
    return binding if binding is not None else builtin_binding()


def spec(method: str, binding: Binding | None = None) -> RpcSpec:
    """The ``RpcSpec`` of ``method`` in ``binding``; KeyError when the schema lacks it."""
    rpc = _bb(binding).rpc(method)
    return RpcSpec(method, rpc.request.cls, rpc.response.cls, rpc.streaming, rpc.role, rpc.path)


def _req(method: str, binding: Binding | None) -> MessageBinding:
    return _bb(binding).rpc(method).request


def _resp(method: str, binding: Binding | None) -> MessageBinding:
    return _bb(binding).rpc(method).response


LIST_SUPPORTED_XPU_TYPE = spec("ListSupportedXPUType")
LIST_AND_WATCH = spec("ListAndWatch")
ALLOCATE = spec("Allocate")
RELEASE = spec("Release")
LIST_GPU_INFO = spec("ListGpuInfo")
EXPORTER_GET_DATA_LIST = spec("ExporterGetDataList")
EXPORTER_DATA_STREAM = spec("ExporterDataStream")
EXPORTER_GET_CONFIG = spec("ExporterGetConfig")
EXPORTER_GET_STATUS = spec("ExporterGetStatus")
QUERY_STATUS = spec("QueryStatus")
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


def inband_status(msg: Message, binding: MessageBinding | None = None) -> tuple[int, str]:
    """XDM's in-band (status, message); (0, "") for messages without them."""
    if binding is not None:
        return int(binding.read["status"](msg)) if binding.has("status") else 0, (
            str(binding.read["message"](msg)) if binding.has("message") else ""
        )
    names = msg.DESCRIPTOR.fields_by_name
    status = int(getattr(msg, "status", 0)) if "status" in names else 0
    message = str(getattr(msg, "message", "")) if "message" in names else ""
    return status, message


# ---------------------------------------------------------------- requests
def xpu_type_request(binding: Binding | None = None) -> Message:
    return _req("ListSupportedXPUType", binding).new()


def list_and_watch_request(binding: Binding | None = None) -> Message:
    return _req("ListAndWatch", binding).new()


def list_gpu_info_request(minors: Sequence[int] = (), binding: Binding | None = None) -> Message:
    b = _req("ListGpuInfo", binding)
    msg = b.new()
    b.extend(msg, "minors", list(minors))
    return msg


def exporter_data_request(
    devices: Sequence[str] = (), metric_ids: Sequence[int] = (), binding: Binding | None = None
) -> Message:
    b = _req("ExporterGetDataList", binding)
    msg = b.new()
    b.extend(msg, "devices", list(devices))
    b.extend(msg, "metricIds", list(metric_ids))
    return msg


def exporter_get_config_request(binding: Binding | None = None) -> Message:
    return _req("ExporterGetConfig", binding).new()


def exporter_get_status_request(binding: Binding | None = None) -> Message:
    return _req("ExporterGetStatus", binding).new()


def query_status_request(binding: Binding | None = None) -> Message:
    return _req("QueryStatus", binding).new()


def release_request(grant_id: str, binding: Binding | None = None) -> Message:
    b = _req("Release", binding)
    msg = b.new()
    b.set(msg, "id", grant_id)
    return msg


MINOR_ENCODINGS = ("explicit", "omit-zero")


def allocate_request(
    request: GrantRequest, minor_encoding: str = "explicit", binding: Binding | None = None
) -> Message:
    """``GrantRequest`` -> AllocateRequest; the minor is always sent (R4).

    ``explicit``: the minor field is present even for card 0 (proto3
    ``optional``). ``omit-zero``: a plain int32 encoding, where card 0 leaves
    the field off the wire; grant verification then catches an auto-assign.
    """
    if minor_encoding not in MINOR_ENCODINGS:
        raise ValueError(f"xdm_minor_encoding must be one of {MINOR_ENCODINGS}, got {minor_encoding!r}")
    b = _req("Allocate", binding)
    msg = b.new()
    b.set(msg, "id", request.grant_id)
    dev = b.child.get("devices")
    for ask in request.asks:
        item = b.add(msg, "devices")
        if item is None or dev is None:
            break
        dev.set(item, "core", ask.core)
        dev.set(item, "memory", ask.memory_gib)
        dev.set(item, "slice", ask.slices)
        if minor_encoding == "explicit" or ask.minor != 0:
            dev.set(item, "minor", ask.minor)
    b.update(msg, "annotations", dict(request.annotations))
    return msg


# ---------------------------------------------------------------- responses
def xpu_types(msg: Message, binding: Binding | None = None) -> list[str]:
    return [t for t in _resp("ListSupportedXPUType", binding).read["xpuTypes"](msg) if t]


def cards_from_list_and_watch(msg: Message, drift: DriftLog, binding: Binding | None = None) -> list[Card]:
    """One ListAndWatch push (the complete device list, R12) -> cards."""
    b = _resp("ListAndWatch", binding)
    dev = b.child.get("devices")
    if dev is None:
        return []
    return [card_from_device(d, drift, dev) for d in b.read["devices"](msg)]


def card_from_device(dev: Message, drift: DriftLog, binding: MessageBinding | None = None) -> Card:
    b = binding if binding is not None else _resp("ListAndWatch", None).child["devices"]
    read = b.read
    unknown = _own_unknowns(dev)
    extender = {_text(k, 128): v if k == "topology" else _text(v) for k, v in read["extenderResources"](dev).items()}
    minor = int(read["minor"](dev))
    uuid = _text(read["uuid"](dev), 128)
    model = text.name(read["model"](dev))  # the device group's name: Nomad's vendor/type/name
    xpu = _text(read["xpuType"](dev), 64)
    healthy, reason = _health(_text(read["health"](dev), 64), b.number.get("health", -1), unknown, extender, drift)
    vendor = vendor_of(xpu, model)
    memory = int(read["totalMemory"](dev)) or _recovered_int(unknown, b.number.get("totalMemory", -1))
    topology = _clean_topology(parse_topology(extender.pop("topology", None)))
    if topology.error:
        drift.warn_once(f"topology:{uuid or minor}", f"card {minor} topology: {topology.error}")
    return Card(
        minor=minor,
        uuid=uuid,
        model=model,
        vendor=vendor,
        xpu_type=xpu_type_of(xpu, vendor),
        memory_mib=memory,
        total_core=int(read["totalCore"](dev)) or 100,
        pci_bus_id=_text(read["pciBusId"](dev), 64),
        healthy=healthy,
        health_reason=reason,
        topology=topology,
        extra=extender,
    )


def _text(value: object, limit: int = text.MAX_TEXT) -> str:
    """An XDM string as the plugin repeats it: control characters escaped, bounded (``util/text.py``)."""
    return text.printable(value, limit)


def _clean_topology(topology: Topology) -> Topology:
    """Level names and string domains become attribute keys and values: no control characters, no '/'."""
    levels = tuple(
        replace(
            lvl,
            name=text.name(lvl.name, 64),
            domain=text.name(lvl.domain, 256) if isinstance(lvl.domain, str) else lvl.domain,
        )
        for lvl in topology.levels
    )
    return replace(topology, levels=levels, error=_text(topology.error))


_HEALTHY_WORDS = frozenset({"healthy", "ok", "normal", "good", "true"})
_UNHEALTHY_WORDS = frozenset({"unhealthy", "false", "bad", "error", "failed", "fault"})
_REASON_KEYS = ("healthReason", "health_reason", "reason", "healthDescription")
HEALTH_UNKNOWN = HEALTH_UNREADABLE


def _health(
    text_raw: str, number: int, unknown: Sequence[_Unknown], extender: dict[str, str], drift: DriftLog
) -> tuple[bool, str]:
    """R8: a word compared case-insensitively (enum names too: ``HEALTH_OK`` ->
    ``ok``); a varint at the health number read as bool/enum (1 = healthy).
    Anything else is *unreadable*: unhealthy with ``HEALTH_UNKNOWN``, which the
    plausibility guards turn into a schema-mismatch finding."""
    reason = next((extender[k] for k in _REASON_KEYS if extender.get(k)), "")
    text = text_raw.strip().lower()
    word = text.rsplit("_", 1)[-1] if "_" in text else text
    if text in _HEALTHY_WORDS or word in _HEALTHY_WORDS:
        return True, ""
    if text in _UNHEALTHY_WORDS or word in _UNHEALTHY_WORDS:
        return False, reason or f"XDM reports {text_raw}"
    if not text:
        for item in unknown:
            if item.number == number and item.wire_type == 0 and isinstance(item.data_int, int):
                if item.data_int == 1:
                    return True, ""
                return False, reason or f"XDM reports health code {item.data_int}"
    shown = repr(text_raw[:40]) if text else "nothing"
    drift.warn_once("health", f"a card carries no readable health ({shown})")
    return False, f"{HEALTH_UNKNOWN}: XDM sent {shown}"


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


def gpu_facts(msg: Message, binding: Binding | None = None) -> list[GpuFacts]:
    b = _resp("ListGpuInfo", binding)
    info_b = b.child.get("gpuInfos")
    if info_b is None:
        return []
    r = info_b.read
    facts = []
    for info in b.read["gpuInfos"](msg):
        unknown = _own_unknowns(info)
        memory = int(r["totalMemory"](info)) or _recovered_int(unknown, info_b.number.get("totalMemory", -1))
        numa = int(r["numaNode"](info)) if info_b.has("numaNode") else -1
        facts.append(
            GpuFacts(
                minor=int(r["minor"](info)),
                uuid=_text(r["uuid"](info), 128),
                model=text.name(r["model"](info)),
                driver_version=_text(r["driverVersion"](info), 128),
                vendor=_text(r["vendor"](info), 64).lower(),
                xpu_type=_text(r["xpuType"](info), 64),
                memory_mib=memory,
                pci_bus_id=_text(r["pciBusId"](info), 64),
                numa_node=numa if numa >= 0 else None,
                mig_enabled=bool(r["migEnabled"](info)),
                firmware_version=_text(r["firmwareVersion"](info), 128),
                sdk_version=_text(r["sdkVersion"](info), 128),
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


def allocate_outcome(msg: Message, request_id: str, binding: Binding | None = None) -> AllocateOutcome:
    b = _resp("Allocate", binding)
    r = b.read
    dev, mount, node = b.child.get("devices"), b.child.get("mounts"), b.child.get("deviceSpecs")
    devices: tuple[GrantedDevice, ...] = ()
    if dev is not None:
        d = dev.read
        devices = tuple(
            GrantedDevice(
                minor=int(d["minor"](x)),
                uuid=str(d["uuid"](x)),
                core=int(d["core"](x)),
                memory_gib=int(d["memory"](x)),
                slices=int(d["slice"](x)),
                mig_uuid=str(d["migUuid"](x)),
            )
            for x in r["devices"](msg)
        )
    mounts: tuple[MountSpec, ...] = ()
    if mount is not None:
        m = mount.read
        mounts = tuple(
            MountSpec(str(m["containerPath"](x)), str(m["hostPath"](x)), bool(m["readOnly"](x)))
            for x in r["mounts"](msg)
        )
    nodes: tuple[DeviceNode, ...] = ()
    if node is not None:
        n = node.read
        nodes = tuple(
            DeviceNode(str(n["containerPath"](x)), str(n["hostPath"](x)), str(n["permissions"](x)) or "rwm")
            for x in r["deviceSpecs"](msg)
        )
    grant = Grant(
        grant_id=str(r["id"](msg)) or request_id,
        devices=devices,
        envs=r["envs"](msg),
        mounts=mounts,
        device_nodes=nodes,
        annotations=r["annotations"](msg),
        cdi_devices=tuple(r["cdiDevices"](msg)),
    )
    varints = tuple(u.describe() for u in top_level_unknown_varints(msg) if u.value != 0)
    return AllocateOutcome(grant, int(r["status"](msg)), str(r["message"](msg)), varints)


_new_sample = tuple.__new__  # MetricSample's fields without its Python-level __new__


def metric_samples(msg: Message, binding: Binding | None = None) -> list[MetricSample]:
    b = _resp("ExporterGetDataList", binding)
    data_b = b.child.get("dataList")
    if data_b is None:
        return []
    # This runs for every sample of every push: the scalar fields are read in one call (one C-level
    # attrgetter when the schema matches), and each sample is made without NamedTuple's Python __new__.
    fields = data_b.reader_of("device", "metricId", "metricName", "value", "timestamp")
    labels = data_b.read["labels"]
    names = METRIC_NAMES
    make = _new_sample
    samples = []
    for data in b.read["dataList"](msg):
        device, metric_id, name, value, timestamp = fields(data)
        if not metric_id:
            metric_id = _recovered_int(_own_unknowns(data), data_b.number.get("metricId", -1))
        if not name:
            name = names.get(metric_id) or f"metric_{metric_id}"
        samples.append(make(MetricSample, (device, metric_id, name, value, timestamp, labels(data))))
    return samples


def exporter_config(msg: Message, binding: Binding | None = None) -> ExporterConfig:
    r = _resp("ExporterGetConfig", binding).read
    return ExporterConfig(
        int(r["collectIntervalMs"](msg)), tuple(int(m) for m in r["metricIds"](msg)), r["config"](msg)
    )


def exporter_status(msg: Message, binding: Binding | None = None) -> ExporterStatus:
    r = _resp("ExporterGetStatus", binding).read
    return ExporterStatus(
        bool(r["running"](msg)),
        str(r["state"](msg)),
        int(r["lastCollectTimestamp"](msg)),
        str(r["version"](msg)),
        str(r["message"](msg)),
    )


def runtime_kit_status(msg: Message, binding: Binding | None = None) -> RuntimeKitStatus:
    r = _resp("QueryStatus", binding).read
    return RuntimeKitStatus(bool(r["enabled"](msg)), str(r["message"](msg)))
