"""XDM's messages <-> the plugin's model through a ``binder.Binding`` (None: the reconstruction),
by reconstruction field name, and whether to trust them.

Every XDM string repeated is escaped and bounded (``util/text.py``): it reaches the agent's log and
Nomad's device names. A wrong but wire-compatible schema decodes *silently* into wrong values (a PCI
address for a UUID), so cards must look plausible; and an Allocate success ``{status: 0}`` is zero
bytes, which parses into any message, so a grant counts only with evidence that matches the request.
"""

from __future__ import annotations

import logging
import operator
import re
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message
from google.protobuf.unknown_fields import UnknownFieldSet

from nomad_plugin.model.card import Card, Topology, parse_topology
from nomad_plugin.model.grant import DeviceNode, Grant, GrantedDevice, GrantRequest, MountSpec
from nomad_plugin.model.metrics import METRIC_NAMES, MetricSample
from nomad_plugin.util import text
from nomad_plugin.xdm import guesses
from nomad_plugin.xdm.binder import Binding, MessageBinding, Rpc, builtin_binding

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GpuFacts:  # static card data from ListGpuInfo, merged into ``Card``
    minor: int
    uuid: str = ""
    model: str = ""
    driver_version: str = ""
    vendor: str = ""
    xpu_type: str = ""
    memory_mib: int = 0
    pci_bus_id: str = ""
    numa_node: int | None = None
    mig_enabled: bool = False
    sdk_version: str = ""


@dataclass(frozen=True)
class ExporterConfig:
    collect_interval_ms: int = 0
    metric_ids: tuple[int, ...] = ()
    config: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class ExporterStatus:
    running: bool = False
    state: str = ""
    last_collect_ms: int = 0
    version: str = ""
    message: str = ""


@dataclass(frozen=True)
class RuntimeKitStatus:
    """config-daemon's QueryStatus. ``doubt``: why the answer cannot be read under the bound schema;
    then ``enabled`` means nothing, and neither the plugin nor an operator's command acts on it."""

    enabled: bool
    message: str = ""
    doubt: str = ""

    @property
    def word(self) -> str:
        return "unknown" if self.doubt else "enabled" if self.enabled else "disabled"


@dataclass(frozen=True)
class UnknownField:
    """A field the bound schema did not read (R2, R16). ``clash``: the schema declares its number, so
    the value came with another wire type; else an additive field (a newer XDM)."""

    message_type: str
    number: int
    wire_type: int
    value: object
    clash: bool

    def describe(self) -> str:
        kind = "wire-type clash" if self.clash else "additive field"
        shown = repr(self.value)
        shown = shown if len(shown) <= 60 else shown[:57] + "..."
        return f"{self.message_type} field {self.number} (wire type {self.wire_type}): {kind}, value {shown}"


def unknown_fields(msg: Message) -> list[UnknownField]:
    """The unknown fields of ``msg`` and every message nested in it (map values too). The Python walk
    runs only when a copy with unknown fields discarded (in C) is smaller: the CPU guard's speed path
    (docs/xdm-risks.md)."""
    bare = type(msg)()
    bare.CopyFrom(msg)
    bare.DiscardUnknownFields()
    return _walk(msg) if bare.ByteSize() != msg.ByteSize() else []


def _walk(msg: Message) -> list[UnknownField]:
    desc = msg.DESCRIPTOR
    declared = {f.number for f in desc.fields}
    unknown = UnknownFieldSet(msg)
    found = [
        UnknownField(desc.full_name, item.field_number, item.wire_type, item.data, item.field_number in declared)
        for item in (unknown[i] for i in range(len(unknown)))
    ]
    for fd, value in msg.ListFields():
        entry = fd.message_type
        if entry is not None and entry.GetOptions().map_entry:
            if entry.fields_by_name["value"].type != FieldDescriptor.TYPE_MESSAGE:
                continue
            value = value.values()
        if entry is not None:
            found += [u for sub in (value if fd.is_repeated else [value]) for u in _walk(sub)]
    return found


class DriftLog:
    """Logs each drift finding once per client (a clash at warning, an additive field at info)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seen: dict[tuple[str, int, bool], UnknownField] = {}

    def _first(self, item: UnknownField) -> bool:
        with self._lock:
            return self._seen.setdefault((item.message_type, item.number, item.clash), item) is item

    def inspect(self, msg: Message) -> None:
        for item in (u for u in unknown_fields(msg) if self._first(u)):
            if item.clash:
                log.warning("XDM possible schema drift: %s", item.describe())
            else:
                log.info("XDM response carries a field the reconstruction lacks: %s", item.describe())

    def warn_once(self, key: str, message: str) -> None:
        if self._first(UnknownField(key, -1, -1, message, True)):
            log.warning("XDM possible schema drift: %s", message)

    def findings(self) -> list[UnknownField]:
        with self._lock:
            return list(self._seen.values())


def _rpc(method: str, binding: Binding | None) -> Rpc:
    return (binding or builtin_binding()).rpc(method)


serialize = operator.methodcaller("SerializeToString")


def deserializer(rpc: Rpc, drift: DriftLog) -> Callable[[bytes], Message]:
    """Parses a response and logs its drift."""

    def parse(data: bytes) -> Message:
        msg = rpc.response.cls.FromString(data)
        drift.inspect(msg)
        return msg

    return parse


def inband_status(msg: Message, b: MessageBinding) -> tuple[int, str]:
    """XDM's in-band (status, message); (0, "") where the response has neither."""
    return int(b.read["status"](msg)) if b.has("status") else 0, str(b.read["message"](msg)) if b.has("message") else ""


def request(method: str, binding: Binding | None = None, **values: Any) -> Message:
    """``method``'s request with reconstruction fields set by name (unbound ones are skipped)."""
    b = _rpc(method, binding).request
    msg = b.new()
    for name, value in values.items():
        b.set(msg, name, value)
    return msg


def allocate_request(
    request: GrantRequest, minor_encoding: str = "explicit", binding: Binding | None = None
) -> Message:
    """``GrantRequest`` -> AllocateRequest; the minor is always sent, as ``minor_encoding`` says (R4)."""
    if minor_encoding not in guesses.MINOR_ENCODINGS:
        raise ValueError(f"xdm_minor_encoding must be one of {guesses.MINOR_ENCODINGS}, got {minor_encoding!r}")
    b = _rpc("Allocate", binding).request
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
    b.set(msg, "annotations", dict(request.annotations))
    return msg


def xpu_types(msg: Message, binding: Binding | None = None) -> list[str]:
    return [t for t in _rpc("ListSupportedXPUType", binding).response.read["xpuTypes"](msg) if t]


def cards_from_list_and_watch(msg: Message, drift: DriftLog, binding: Binding | None = None) -> list[Card]:
    """One ListAndWatch push, the complete device list (R12), as cards."""
    b = _rpc("ListAndWatch", binding).response
    dev = b.child.get("devices")
    return [card_from_device(d, drift, dev) for d in b.read["devices"](msg)] if dev is not None else []


def card_from_device(dev: Message, drift: DriftLog, binding: MessageBinding | None = None) -> Card:
    b = binding or _rpc("ListAndWatch", None).response.child["devices"]
    read = b.read
    extender = {
        text.printable(k, 128): v if k == "topology" else text.printable(v)
        for k, v in read["extenderResources"](dev).items()
    }
    minor = int(read["minor"](dev))
    uuid = text.printable(read["uuid"](dev), 128)
    model = text.name(read["model"](dev))  # becomes the device group's name in Nomad
    xpu = text.printable(read["xpuType"](dev), 64)
    healthy, reason = guesses.health(text.printable(read["health"](dev), 64), dev, b.number.get("health", -1), extender)
    if reason.startswith(guesses.HEALTH_UNREADABLE):
        drift.warn_once("health", f"a card carries no readable health ({reason})")
    vendor = guesses.vendor_of(xpu, model)
    topology = _clean_topology(parse_topology(extender.pop("topology", None)))
    if topology.error:
        drift.warn_once(f"topology:{uuid or minor}", f"card {minor} topology: {topology.error}")
    return Card(
        minor=minor,
        uuid=uuid,
        model=model,
        vendor=vendor,
        xpu_type=guesses.xpu_type_of(xpu, vendor),
        memory_mib=int(read["totalMemory"](dev)) or guesses.recovered_int(dev, b.number.get("totalMemory", -1)),
        total_core=int(read["totalCore"](dev)) or 100,
        pci_bus_id=text.printable(read["pciBusId"](dev), 64),
        healthy=healthy,
        health_reason=reason,
        topology=topology,
        extra=extender,
    )


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
    return replace(topology, levels=levels, error=text.printable(topology.error))


def gpu_facts(msg: Message, binding: Binding | None = None) -> list[GpuFacts]:
    b = _rpc("ListGpuInfo", binding).response
    info_b = b.child.get("gpuInfos")
    if info_b is None:
        return []
    r = info_b.read
    facts = []
    for info in b.read["gpuInfos"](msg):
        numa = int(r["numaNode"](info)) if info_b.has("numaNode") else -1
        facts.append(
            GpuFacts(
                minor=int(r["minor"](info)),
                uuid=text.printable(r["uuid"](info), 128),
                model=text.name(r["model"](info)),
                driver_version=text.printable(r["driverVersion"](info), 128),
                vendor=text.printable(r["vendor"](info), 64).lower(),
                xpu_type=text.printable(r["xpuType"](info), 64),
                memory_mib=int(r["totalMemory"](info))
                or guesses.recovered_int(info, info_b.number.get("totalMemory", -1)),
                pci_bus_id=text.printable(r["pciBusId"](info), 64),
                numa_node=numa if numa >= 0 else None,
                mig_enabled=bool(r["migEnabled"](info)),
                sdk_version=text.printable(r["sdkVersion"](info), 64),
            )
        )
    return facts


@dataclass(frozen=True)
class AllocateOutcome:
    grant: Grant
    status: int
    message: str
    error_code_hints: tuple[str, ...]  # unknown varints that may be a misplaced status (R3)


def allocate_outcome(msg: Message, request_id: str, binding: Binding | None = None) -> AllocateOutcome:
    b = _rpc("Allocate", binding).response
    r = b.read

    def each(name: str) -> tuple[dict[str, Callable[[Message], Any]], list[Message]]:
        child = b.child.get(name)
        return (child.read, r[name](msg)) if child is not None else ({}, [])

    d, granted = each("devices")
    m, mounts = each("mounts")
    n, nodes = each("deviceSpecs")
    grant = Grant(
        grant_id=str(r["id"](msg)) or request_id,
        devices=tuple(
            GrantedDevice(
                minor=int(d["minor"](x)),
                uuid=str(d["uuid"](x)),
                core=int(d["core"](x)),
                memory_gib=int(d["memory"](x)),
                slices=int(d["slice"](x)),
                mig_uuid=str(d["migUuid"](x)),
            )
            for x in granted
        ),
        envs=r["envs"](msg),
        mounts=tuple(
            MountSpec(str(m["containerPath"](x)), str(m["hostPath"](x)), bool(m["readOnly"](x))) for x in mounts
        ),
        device_nodes=tuple(
            DeviceNode(str(n["containerPath"](x)), str(n["hostPath"](x)), str(n["permissions"](x)) or "rwm")
            for x in nodes
        ),
        annotations=r["annotations"](msg),
        cdi_devices=tuple(r["cdiDevices"](msg)),
    )
    return AllocateOutcome(grant, int(r["status"](msg)), str(r["message"](msg)), guesses.error_code_hints(msg))


def metric_samples(msg: Message, binding: Binding | None = None) -> list[MetricSample]:
    """One ExporterGetDataList answer or ExporterDataStream push (the same message, per the reference)."""
    b = _rpc("ExporterGetDataList", binding).response
    data_b = b.child.get("dataList")
    if data_b is None:
        return []
    device, metric, metric_name, value, timestamp = (
        data_b.read[k] for k in ("device", "metricId", "metricName", "value", "timestamp")
    )
    # The message's own map, not a copy: hundreds of samples a second, and only the grant label is read.
    labels = operator.attrgetter(data_b.name["labels"]) if data_b.has("labels") else data_b.read["labels"]
    samples = []
    for data in b.read["dataList"](msg):
        metric_id = int(metric(data)) or guesses.recovered_int(data, data_b.number.get("metricId", -1))
        name = metric_name(data) or METRIC_NAMES.get(metric_id) or f"metric_{metric_id}"
        samples.append(MetricSample(device(data), metric_id, name, value(data), timestamp(data), labels(data)))
    return samples


def exporter_config(msg: Message, binding: Binding | None = None) -> ExporterConfig:
    r = _rpc("ExporterGetConfig", binding).response.read
    return ExporterConfig(
        int(r["collectIntervalMs"](msg)), tuple(int(i) for i in r["metricIds"](msg)), r["config"](msg)
    )


def exporter_status(msg: Message, binding: Binding | None = None) -> ExporterStatus:
    r = _rpc("ExporterGetStatus", binding).response.read
    return ExporterStatus(
        bool(r["running"](msg)),
        str(r["state"](msg)),
        int(r["lastCollectTimestamp"](msg)),
        str(r["version"](msg)),
        str(r["message"](msg)),
    )


def runtime_kit_status(msg: Message, binding: Binding | None = None) -> RuntimeKitStatus:
    """The status, trusted only under a verified schema (reflection or a path: XDM's own numbers) or when
    the answer fits the reconstruction's guessed numbers: a field it does not read as declared (a
    wire-type clash, or a number it lacks) may be the real ``enabled``. An empty answer reads
    "disabled" under any numbering of the documented ``enabled`` bool."""
    response = _rpc("QueryStatus", binding).response
    status = RuntimeKitStatus(bool(response.read["enabled"](msg)), str(response.read["message"](msg)))
    source = binding.source if binding is not None else "builtin"
    unread = unknown_fields(msg) if source == "builtin" else []
    if not response.has("enabled"):
        doubt = f"config-daemon's schema ({source}) has no enabled field in QueryStatus's answer"
    elif unread:
        shown = "; ".join(u.describe() for u in unread[:SHOWN])
        doubt = f"its answer does not fit the built-in reconstruction's guessed field numbers ({shown})"
    else:
        return status
    return replace(status, enabled=False, doubt=f"{doubt}; set xdm_schema to config-daemon's official proto")


# The plausibility guards (R2, R3, R4): loose, they catch swapped fields, not odd values.
MAX_MINOR = 1023
MIN_MEMORY_MIB = 1024
MAX_MEMORY_MIB = 4 * 1024 * 1024
UUID = re.compile(
    r"^(?:[A-Za-z][A-Za-z0-9]{0,7}-)?"
    r"(?:[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}|[0-9a-fA-F]{32})$"
)
SHOWN = 3  # examples named per problem


def _short(value: object) -> str:
    shown = repr(value)
    return shown if len(shown) <= 48 else shown[:45] + "...'"


def _identity_problems(items: Sequence[tuple[int, str, int]], what: str) -> list[str]:
    """(minor, uuid, memory MiB) triples -> problems, each naming a few examples."""
    problems = []
    bad_uuid = [u for _, u, _ in items if not UUID.match(u)]
    if bad_uuid:
        problems.append(
            f"{what}: {len(bad_uuid)} of {len(items)} UUIDs do not look like UUIDs "
            f"(e.g. {', '.join(_short(u) for u in bad_uuid[:SHOWN])})"
        )
    minors = [m for m, _, _ in items]
    out_of_range = [m for m in minors if not 0 <= m <= MAX_MINOR]
    if out_of_range:
        problems.append(f"{what}: minors out of range 0..{MAX_MINOR}: {out_of_range[:SHOWN]}")
    duplicates = sorted({m for m in minors if minors.count(m) > 1})
    if duplicates:
        problems.append(f"{what}: minors are not unique (repeated: {duplicates[:SHOWN]})")
    bad_memory = [mib for _, _, mib in items if not MIN_MEMORY_MIB <= mib <= MAX_MEMORY_MIB]
    if bad_memory:
        problems.append(f"{what}: memory sizes outside {MIN_MEMORY_MIB}..{MAX_MEMORY_MIB} MiB: {bad_memory[:SHOWN]}")
    return problems


def card_problems(cards: Sequence[Card]) -> list[str]:
    """What is implausible about one ListAndWatch push (empty = plausible)."""
    problems = _identity_problems([(c.minor, c.uuid, c.memory_mib) for c in cards], "ListAndWatch")
    unreadable = [c for c in cards if c.health_reason.startswith(guesses.HEALTH_UNREADABLE)]
    if unreadable:
        problems.append(
            f"ListAndWatch: {len(unreadable)} of {len(cards)} cards have no known health word "
            f"({unreadable[0].health_reason})"
        )
    with_topology = [c for c in cards if c.topology.error or c.topology.levels]
    broken = [c for c in with_topology if c.topology.error]
    if len(broken) == len(with_topology) > 1:  # one bad card only loses its topology (R9)
        problems.append(f"ListAndWatch: no card's topology JSON parses ({broken[0].topology.error})")
    return problems


def facts_problems(facts: Sequence[GpuFacts]) -> list[str]:
    """What is implausible about one ListGpuInfo answer (empty = plausible)."""
    return _identity_problems([(f.minor, f.uuid, f.memory_mib) for f in facts], "ListGpuInfo")


def grant_problem(request: GrantRequest, grant: Grant, error_code_hints: Sequence[str] = ()) -> str | None:
    """Why ``grant`` does not answer ``request`` (None when it does): evidence is granted devices, envs,
    device nodes, mounts, CDI names or annotations XDM added; minors, amounts and an echoed id must match."""
    hint = f"; unknown varint field(s) that may carry an error code: {', '.join(error_code_hints)}"
    hint = hint if error_code_hints else ""
    if grant.grant_id and grant.grant_id != request.grant_id:
        return f"XDM answered for allocation {grant.grant_id!r}, not {request.grant_id!r}{hint}"
    added = any(request.annotations.get(key) != value for key, value in grant.annotations.items())
    if not (grant.devices or grant.envs or grant.device_nodes or grant.mounts or grant.cdi_devices or added):
        return f"XDM reported success for allocation {request.grant_id} but granted nothing{hint}"
    if not grant.devices:
        return None  # annotation/env-only style: nothing per card to compare
    asked = sorted(ask.minor for ask in request.asks)
    got = sorted(dev.minor for dev in grant.devices)
    if asked != got:
        return f"XDM granted card(s) {got} but {asked} were requested{hint}"
    by_minor = {dev.minor: dev for dev in grant.devices}
    for ask in request.asks:
        dev = by_minor[ask.minor]
        if (ask.core, ask.memory_gib, ask.slices) != (dev.core, dev.memory_gib, dev.slices):
            return (
                f"card {ask.minor}: asked core={ask.core}% memory={ask.memory_gib}GiB slice={ask.slices}, "
                f"XDM granted core={dev.core}% memory={dev.memory_gib}GiB slice={dev.slices}{hint}"
            )
    return None
