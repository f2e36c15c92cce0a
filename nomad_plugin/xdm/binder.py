"""Bind XDM's real schema by meaning, not by number (R1, R2).

The plugin's model of XDM is the reconstruction in ``proto/lingjun/``: its
*names* (RPC names, message shapes, field names) come from the seed
documents, its *numbers* are guesses. A schema source (``schema_source``)
yields a ``FileDescriptorSet``: the reconstruction itself, XDM's server
reflection, or the operator's official ``.proto`` files. ``bind`` walks the
reconstruction's RPCs and finds each one in that schema:

- services are found by their method names, whatever the package;
- request/response types come from the method descriptors;
- fields are matched by normalised name (``totalMemory`` = ``total_memory``
  = ``TotalMemory``), then a small alias table, then the operator's
  ``xdm_field_aliases`` (``"Device.totalMemory" = "mem_mib"``).

The result, a ``Binding``, holds message classes made by protobuf's own
factory (decoding stays in the C/upb implementation) and, per model field, a
reader/writer closure computed once. It carries a report (model field ->
``Message.field #n type``; missing; unused) and the *mismatch* list: what is
required but did not bind. The built-in reconstruction goes through exactly
this code (one path), so a binding is cached per schema (hash of the
descriptor set bytes plus the aliases).
"""

from __future__ import annotations

import functools
import hashlib
import operator
import os
import re
import tempfile
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.descriptor import Descriptor, FieldDescriptor, MethodDescriptor, ServiceDescriptor
from google.protobuf.message import DecodeError, Message

from nomad_plugin._proto.lingjun import api_outer_pb2 as _pb
from nomad_plugin._proto.lingjun import config_service_pb2 as _cpb

MISMATCH_PREFIX = "XDM schema mismatch"

# (method, role, streaming) for every RPC the plugin may call; Enable/Disable
# are absent on purpose (R14). Roles: device (must be one service), exporter
# (may live in another service, R13), config (config-daemon.sock).
RPCS: tuple[tuple[str, str, bool], ...] = (
    ("ListSupportedXPUType", "device", False),
    ("ListAndWatch", "device", True),
    ("Allocate", "device", False),
    ("Release", "device", False),
    ("ListGpuInfo", "exporter", False),
    ("ExporterGetDataList", "exporter", False),
    ("ExporterDataStream", "exporter", True),
    ("ExporterGetConfig", "exporter", False),
    ("ExporterGetStatus", "exporter", False),
    ("QueryStatus", "config", False),
)
REQUIRED_RPCS = ("ListAndWatch", "Allocate", "Release")
# The Runtime Kit switch, for the operator's ``runtime-kit`` command alone (xdm/runtime_switch.py):
# the plugin's bindings never hold Enable or Disable (R14).
SWITCH_RPCS: tuple[tuple[str, str, bool], ...] = (
    ("QueryStatus", "config", False),
    ("Enable", "config", False),
    ("Disable", "config", False),
)

# Model fields without which a card or a grant would be wrong ("Message.field";
# "a|b" = at least one of them). Everything else degrades (empty value).
REQUIRED_FIELDS: tuple[str, ...] = (
    "ListAndWatchResponse.devices",
    "Device.minor",
    "Device.uuid",
    "Device.health",
    "Device.totalMemory",
    "AllocateRequest.id",
    "AllocateRequest.devices",
    "DeviceRequest.minor",
    "AllocateResponse.status",
    "AllocateResponse.envs|AllocateResponse.deviceSpecs",
    "ReleaseRequest.id",
)

# Plausible synonyms for model fields (normalised form is applied to both sides).
ALIASES: Mapping[str, tuple[str, ...]] = {
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

_INT_TYPES = frozenset(
    {
        FieldDescriptor.TYPE_INT32,
        FieldDescriptor.TYPE_INT64,
        FieldDescriptor.TYPE_UINT32,
        FieldDescriptor.TYPE_UINT64,
        FieldDescriptor.TYPE_SINT32,
        FieldDescriptor.TYPE_SINT64,
        FieldDescriptor.TYPE_FIXED32,
        FieldDescriptor.TYPE_FIXED64,
        FieldDescriptor.TYPE_SFIXED32,
        FieldDescriptor.TYPE_SFIXED64,
    }
)
_TYPE_NAMES = {
    value: name[len("TYPE_") :].lower()
    for name, value in vars(FieldDescriptor).items()
    if name.startswith("TYPE_") and isinstance(value, int)
}


def normalise(name: str) -> str:
    """Case- and separator-insensitive form: ``total_memory`` -> ``totalmemory``."""
    return re.sub(r"[^0-9a-z]", "", name.lower())


def _category(fd: FieldDescriptor) -> str:
    if fd.type == FieldDescriptor.TYPE_MESSAGE:
        if fd.message_type is not None and fd.message_type.GetOptions().map_entry:
            return "map"
        return "message"
    if fd.type in _INT_TYPES:
        return "int"
    if fd.type in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
        return "float"
    if fd.type == FieldDescriptor.TYPE_BOOL:
        return "bool"
    if fd.type == FieldDescriptor.TYPE_ENUM:
        return "enum"
    if fd.type == FieldDescriptor.TYPE_BYTES:
        return "bytes"
    return "string"


# What a model field of category X may bind to when the plugin *reads* it
# (converted to X) or *writes* it (must take X as is).
_READ_OK: Mapping[str, frozenset[str]] = {
    "string": frozenset({"string", "enum", "bool", "int", "bytes"}),
    "int": frozenset({"int", "enum", "string"}),
    "float": frozenset({"float", "int"}),
    "bool": frozenset({"bool", "int", "enum"}),
    "map": frozenset({"map"}),
    "message": frozenset({"message"}),
}
_WRITE_OK: Mapping[str, frozenset[str]] = {
    "string": frozenset({"string"}),
    "int": frozenset({"int"}),
    "float": frozenset({"float"}),
    "bool": frozenset({"bool"}),
    "map": frozenset({"map"}),
    "message": frozenset({"message"}),
}


def type_name(fd: FieldDescriptor) -> str:
    """``int64``, ``repeated string``, ``map<string,string>``, ``repeated xdm.Device``."""
    cat = _category(fd)
    if cat == "map":
        entry = fd.message_type
        assert entry is not None
        return f"map<{type_name(entry.fields_by_name['key'])},{type_name(entry.fields_by_name['value'])}>"
    base = ""
    if cat == "message" and fd.message_type is not None:
        base = fd.message_type.full_name
    elif cat == "enum" and fd.enum_type is not None:
        base = fd.enum_type.full_name
    base = base or _TYPE_NAMES.get(fd.type, str(fd.type))
    return f"repeated {base}" if fd.is_repeated else base


class SchemaError(ValueError):
    """A schema source that cannot be read (bad path, unparsable file, garbage reflection)."""


# ------------------------------------------------------------------ the binding
Reader = Callable[[Message], Any]


@dataclass
class MessageBinding:
    """One model message bound to one XDM message type.

    ``read[f](msg)`` returns model field ``f`` converted to the model's type
    (empty value when unbound); ``name[f]`` is the XDM field name; ``child[f]``
    the binding of a message-typed field; ``number[f]`` the XDM field number.
    """

    model: str  # the reconstruction's message name, e.g. "Device"
    cls: type[Message]
    read: dict[str, Reader] = field(default_factory=dict)
    name: dict[str, str] = field(default_factory=dict)
    number: dict[str, int] = field(default_factory=dict)
    child: dict[str, MessageBinding] = field(default_factory=dict)

    @property
    def full_name(self) -> str:
        return str(self.cls.DESCRIPTOR.full_name)

    def new(self) -> Message:
        return self.cls()

    def has(self, model_field: str) -> bool:
        return model_field in self.name

    def reader_of(self, *model_fields: str) -> Callable[[Message], tuple[Any, ...]]:
        """One reader for several fields at once: ``reader_of("a", "b")(msg) == (read["a"](msg), read["b"](msg))``.

        Why: the exporter's samples are read field by field, hundreds a second
        (issue 14). When every field is a plain attribute of the XDM message
        (no conversion, bound), one C-level ``attrgetter`` reads them all.
        """
        readers = [self.read[f] for f in model_fields]
        if len(readers) > 1 and all(isinstance(r, operator.attrgetter) for r in readers):
            return operator.attrgetter(*(self.name[f] for f in model_fields))
        return lambda msg: tuple([read(msg) for read in readers])

    def set(self, msg: Message, model_field: str, value: Any) -> None:
        """Write a scalar/optional field; an unbound model field is skipped (checked at bind time)."""
        name = self.name.get(model_field)
        if name is not None:
            setattr(msg, name, value)

    def extend(self, msg: Message, model_field: str, values: Sequence[Any]) -> None:
        name = self.name.get(model_field)
        if name is not None and values:
            getattr(msg, name).extend(values)

    def update(self, msg: Message, model_field: str, values: Mapping[Any, Any]) -> None:
        name = self.name.get(model_field)
        if name is not None and values:
            getattr(msg, name).update(values)

    def add(self, msg: Message, model_field: str) -> Message | None:
        """Append an element to a repeated message field; None when unbound."""
        name = self.name.get(model_field)
        return getattr(msg, name).add() if name is not None else None


@dataclass(frozen=True)
class ReportRow:
    model: str  # "Device.totalMemory"
    bound: str  # "xdm.Device.totalMemory #6 int64", or "" when missing
    note: str = ""  # "alias", "xdm_field_aliases", why it is missing


@dataclass(frozen=True)
class Rpc:
    """One bound RPC: the wire path (None = probe the service name) and message bindings."""

    method: str
    role: str
    streaming: bool
    request: MessageBinding
    response: MessageBinding
    path: str | None


@dataclass
class Binding:
    """A whole bound schema. ``mismatch`` lists what is required and did not bind."""

    source: str  # "builtin", "reflection", or the path
    digest: str
    rpcs: dict[str, Rpc]
    rows: list[ReportRow]
    unused: list[str]
    missing_rpcs: list[str]
    mismatch: list[str]
    probe_service: bool  # True for the built-in reconstruction: the package is a guess too (R1)

    def rpc(self, method: str) -> Rpc:
        found = self.rpcs.get(method)
        if found is None:
            raise KeyError(method)
        return found

    @property
    def ok(self) -> bool:
        return not self.mismatch

    def mismatch_text(self) -> str:
        return f"{MISMATCH_PREFIX}: " + "; ".join(self.mismatch) if self.mismatch else ""

    def report_lines(self) -> list[str]:
        """The binding report, one line per model field, then what is missing and unused."""
        lines = [f"XDM schema binding (source {self.source}, sha256 {self.digest[:12]}):"]
        for rpc in self.rpcs.values():
            lines.append(f"  rpc {rpc.method} -> {rpc.path or '(service name probed at run time)'}")
        for method in self.missing_rpcs:
            lines.append(f"  rpc {method} -> MISSING")
        for row in self.rows:
            target = row.bound or "MISSING"
            note = f" ({row.note})" if row.note else ""
            lines.append(f"  {row.model} -> {target}{note}")
        if self.unused:
            lines.append("  unused XDM fields: " + ", ".join(self.unused))
        lines.append("  verdict: " + (self.mismatch_text() if self.mismatch else "ok"))
        return lines

    def report(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "sha256": self.digest,
            "rpcs": {m: r.path for m, r in self.rpcs.items()},
            "missing_rpcs": list(self.missing_rpcs),
            "fields": {r.model: r.bound for r in self.rows if r.bound},
            "missing_fields": [r.model + (f" ({r.note})" if r.note else "") for r in self.rows if not r.bound],
            "unused": list(self.unused),
            "mismatch": list(self.mismatch),
        }


# ------------------------------------------------------------------ the model (reconstruction)
def builtin_set() -> descriptor_pb2.FileDescriptorSet:
    """The reconstruction as a FileDescriptorSet: what ``xdm_schema = "builtin"`` binds."""
    out = descriptor_pb2.FileDescriptorSet()
    for module in (_pb, _cpb):
        proto = out.file.add()
        module.DESCRIPTOR.CopyToProto(proto)
    return out


def _model_methods() -> dict[str, MethodDescriptor]:
    methods: dict[str, MethodDescriptor] = {}
    for module in (_pb, _cpb):
        for service in module.DESCRIPTOR.services_by_name.values():
            for method in service.methods:
                methods[method.name] = method
    return methods


# ------------------------------------------------------------------ building a pool
def pool_from_set(fds: descriptor_pb2.FileDescriptorSet) -> descriptor_pool.DescriptorPool:
    """A fresh pool holding every file of ``fds`` (dependencies first); missing
    well-known imports are taken from protobuf's default pool."""
    pool = descriptor_pool.DescriptorPool()
    by_name = {f.name: f for f in fds.file}
    added: set[str] = set()

    def add(name: str, trail: tuple[str, ...]) -> None:
        if name in added:
            return
        if name in trail:
            raise SchemaError(f"import cycle through {name}")
        proto = by_name.get(name)
        if proto is None:
            try:
                known = descriptor_pool.Default().FindFileByName(name)
            except KeyError:
                raise SchemaError(
                    f"{trail[-1] if trail else name} imports {name}, which the schema does not hold"
                ) from None
            proto = descriptor_pb2.FileDescriptorProto()
            known.CopyToProto(proto)
        for dep in proto.dependency:
            add(dep, (*trail, name))
        try:
            pool.Add(proto)
        except Exception as exc:  # protobuf raises TypeError/ValueError/KeyError for bad descriptors
            raise SchemaError(f"descriptor {name} is invalid: {exc}") from None
        added.add(name)

    for proto in fds.file:
        add(proto.name, ())
    return pool


def digest_of(fds: descriptor_pb2.FileDescriptorSet) -> str:
    return hashlib.sha256(fds.SerializeToString(deterministic=True)).hexdigest()


# ------------------------------------------------------------------ binding
_cache: dict[tuple[str, tuple[tuple[str, str], ...], str, bool, tuple[tuple[str, str, bool], ...]], Binding] = {}
_cache_lock = threading.Lock()
CACHE_LIMIT = 16


def bind(
    fds: descriptor_pb2.FileDescriptorSet,
    source: str,
    aliases: Mapping[str, str] | Sequence[tuple[str, str]] = (),
    *,
    probe_service: bool = False,
    rpcs: tuple[tuple[str, str, bool], ...] = RPCS,
) -> Binding:
    """Bind ``fds`` (cached per schema bytes + aliases). Raises ``SchemaError``
    only when ``fds`` cannot form a descriptor pool; everything else that is
    wrong ends up in ``Binding.mismatch``. ``rpcs`` is the plugin's table;
    only the ``runtime-kit`` command passes ``SWITCH_RPCS``."""
    pairs = tuple(sorted(dict(aliases).items()))
    digest = digest_of(fds)
    key = (digest, pairs, source, probe_service, rpcs)
    with _cache_lock:
        cached = _cache.get(key)
    if cached is not None:
        return cached
    binding = _Binder(pool_from_set(fds), fds, dict(pairs)).run(source, digest, probe_service, rpcs)
    with _cache_lock:
        if len(_cache) >= CACHE_LIMIT:
            _cache.clear()
        _cache[key] = binding
    return binding


def builtin_binding(aliases: Mapping[str, str] | Sequence[tuple[str, str]] = ()) -> Binding:
    """The reconstruction, bound by the same binder (computed once per alias set)."""
    return _builtin(tuple(sorted(dict(aliases).items())))


@functools.lru_cache(maxsize=8)
def _builtin(pairs: tuple[tuple[str, str], ...]) -> Binding:
    return bind(builtin_set(), "builtin", pairs, probe_service=True)


class _Binder:
    def __init__(
        self, pool: descriptor_pool.DescriptorPool, fds: descriptor_pb2.FileDescriptorSet, aliases: dict[str, str]
    ) -> None:
        self.pool = pool
        self.aliases = aliases
        self.services: list[ServiceDescriptor] = []
        for proto in fds.file:
            desc = pool.FindFileByName(proto.name)
            self.services.extend(desc.services_by_name.values())
        self.rows: list[ReportRow] = []
        self.bound: dict[tuple[str, str, str], MessageBinding] = {}
        self.used: dict[str, set[str]] = {}  # XDM message full name -> bound field names
        self.seen_targets: dict[str, Descriptor] = {}
        self.mismatch: list[str] = []

    def run(
        self, source: str, digest: str, probe_service: bool, table: tuple[tuple[str, str, bool], ...] = RPCS
    ) -> Binding:
        model = _model_methods()
        rpcs: dict[str, Rpc] = {}
        missing: list[str] = []
        device_service = self._device_service()
        for method, role, streaming in table:
            found = self._find_method(method, role, device_service)
            if found is None:
                missing.append(method)
                continue
            service, target = found
            if bool(target.server_streaming) != streaming or target.client_streaming:
                self.mismatch.append(
                    f"rpc {service.full_name}.{target.name} is "
                    f"{'server-streaming' if target.server_streaming else 'unary'}"
                    f"{', client-streaming' if target.client_streaming else ''}; "
                    f"the plugin needs {'server-streaming' if streaming else 'unary'}"
                )
                continue
            spec = model[method]
            request = self._message(spec.input_type, target.input_type, write=True)
            response = self._message(spec.output_type, target.output_type, write=False)
            path = None if probe_service else f"/{service.full_name}/{target.name}"
            rpcs[method] = Rpc(method, role, streaming, request, response, path)
        for method in REQUIRED_RPCS if table is RPCS else ():
            if method in missing:
                self.mismatch.append(f"no service has the {method} RPC")
        self._check_required()
        unused = [
            f"{name}.{fname}"
            for name, desc in self.seen_targets.items()
            for fname in desc.fields_by_name
            if fname not in self.used.get(name, set())
        ]
        return Binding(source, digest, rpcs, self.rows, unused, missing, self.mismatch, probe_service)

    # -------------------------------------------------------------- services
    def _methods_named(self, method: str) -> list[tuple[ServiceDescriptor, MethodDescriptor]]:
        want = normalise(method)
        return [(s, m) for s in self.services for m in s.methods if normalise(m.name) == want]

    def _device_service(self) -> ServiceDescriptor | None:
        """The service holding most of the device RPCs (a kubelet-style ``DevicePlugin``
        with only ListAndWatch/Allocate loses to XDM's own service)."""
        wanted = {normalise(m) for m, role, _ in RPCS if role == "device"}
        best: tuple[int, ServiceDescriptor] | None = None
        for service in self.services:
            score = sum(1 for m in service.methods if normalise(m.name) in wanted)
            if score and (best is None or score > best[0]):
                best = (score, service)
        return best[1] if best else None

    def _find_method(
        self, method: str, role: str, device_service: ServiceDescriptor | None
    ) -> tuple[ServiceDescriptor, MethodDescriptor] | None:
        found = self._methods_named(method)
        if not found:
            return None
        if role in ("device", "exporter") and device_service is not None:
            same = [(s, m) for s, m in found if s.full_name == device_service.full_name]
            if same:
                return same[0]
            if role == "device":
                return None  # a device RPC in another service than ListAndWatch's is not ours
        return found[0]

    # -------------------------------------------------------------- messages
    def _message(self, model: Descriptor, target: Descriptor, write: bool) -> MessageBinding:
        key = (model.full_name, target.full_name, "w" if write else "r")
        existing = self.bound.get(key)
        if existing is not None:
            return existing
        binding = MessageBinding(model.name, message_factory.GetMessageClass(target))
        self.bound[key] = binding
        self.seen_targets.setdefault(target.full_name, target)
        used = self.used.setdefault(target.full_name, set())
        matches: dict[str, tuple[FieldDescriptor | None, str]] = {}
        for mfield in model.fields:  # exact names and configured aliases first ...
            matches[mfield.name] = self._match(model.name, mfield, target)
        taken = {t.name for t, _ in matches.values() if t is not None}
        for mfield in model.fields:  # ... then the synonym table, for fields still free
            if matches[mfield.name][0] is None and not matches[mfield.name][1]:
                hit = self._alias(mfield, target, taken)
                if hit is not None:
                    taken.add(hit.name)
                    matches[mfield.name] = (hit, "alias")
        for mfield in model.fields:
            label = f"{model.name}.{mfield.name}"
            tfield, how = matches[mfield.name]
            if tfield is None:
                self._row(label, "", how or "no field of that name")
                continue
            problem = _compatible(mfield, tfield, write)
            if problem:
                self._row(label, "", f"{target.full_name}.{tfield.name} is {type_name(tfield)}: {problem}")
                continue
            used.add(tfield.name)
            binding.name[mfield.name] = tfield.name
            binding.number[mfield.name] = tfield.number
            self._row(label, f"{target.full_name}.{tfield.name} #{tfield.number} {type_name(tfield)}", how)
            if _category(mfield) == "message":
                assert mfield.message_type is not None and tfield.message_type is not None
                binding.child[mfield.name] = self._message(mfield.message_type, tfield.message_type, write)
            binding.read[mfield.name] = _reader(mfield, tfield)
        for mfield in model.fields:
            if mfield.name not in binding.read:
                binding.read[mfield.name] = _empty_reader(mfield)
        return binding

    def _row(self, label: str, bound: str, note: str) -> None:
        if all(r.model != label for r in self.rows):
            self.rows.append(ReportRow(label, bound, note))

    def _match(self, model_msg: str, mfield: FieldDescriptor, target: Descriptor) -> tuple[FieldDescriptor | None, str]:
        by_norm: dict[str, FieldDescriptor] = {}
        for tfield in target.fields:
            by_norm.setdefault(normalise(tfield.name), tfield)
        configured = self.aliases.get(f"{model_msg}.{mfield.name}") or self.aliases.get(mfield.name)
        if configured:
            hit = target.fields_by_name.get(configured) or by_norm.get(normalise(configured))
            if hit is not None:
                return hit, "xdm_field_aliases"
            return None, f"xdm_field_aliases names {configured!r}, which {target.full_name} lacks"
        hit = by_norm.get(normalise(mfield.name))
        if hit is not None:
            return hit, ""
        return None, ""

    def _alias(self, mfield: FieldDescriptor, target: Descriptor, taken: set[str]) -> FieldDescriptor | None:
        owner = mfield.containing_type
        model_names = {normalise(f.name) for f in owner.fields} if owner is not None else set()
        for alias in ALIASES.get(mfield.name, ()):
            for tfield in target.fields:
                norm = normalise(tfield.name)
                if norm == normalise(alias) and tfield.name not in taken and norm not in model_names:
                    return tfield
        return None

    def _check_required(self) -> None:
        rows = {r.model: r for r in self.rows}
        for spec in REQUIRED_FIELDS:
            options = spec.split("|")
            if any(rows.get(o) is not None and rows[o].bound for o in options):
                continue
            seen = [o for o in options if o in rows]
            if not seen:
                continue  # never reached: its RPC or parent field is missing, reported on its own
            why = "; ".join(f"{o}: {rows[o].note}" for o in seen if rows[o].note)
            self.mismatch.append(f"required {' or '.join(options)} not bound" + (f" ({why})" if why else ""))


def _compatible(mfield: FieldDescriptor, tfield: FieldDescriptor, write: bool) -> str:
    mcat, tcat = _category(mfield), _category(tfield)
    if mcat != "map" and bool(mfield.is_repeated) != bool(tfield.is_repeated):
        return "repeated" if tfield.is_repeated else "not repeated"
    allowed = (_WRITE_OK if write else _READ_OK).get(mcat, frozenset({mcat}))
    if tcat not in allowed:
        return f"the plugin needs {type_name(mfield)}"
    if mcat == "map":
        assert mfield.message_type is not None and tfield.message_type is not None
        for part in ("key", "value"):
            sub = _compatible(mfield.message_type.fields_by_name[part], tfield.message_type.fields_by_name[part], write)
            if sub:
                return f"map {part}: {sub}"
    return ""


# ------------------------------------------------------------------ readers
def _empty_reader(mfield: FieldDescriptor) -> Reader:
    cat = _category(mfield)
    if cat == "map":
        return lambda _m: {}
    if mfield.is_repeated:
        return lambda _m: []
    if cat == "message":
        return lambda _m: None
    empty: Any = {"string": "", "int": 0, "float": 0.0, "bool": False, "bytes": b"", "enum": 0}.get(cat, None)
    return lambda _m: empty


def _reader(mfield: FieldDescriptor, tfield: FieldDescriptor) -> Reader:
    """A closure reading ``tfield`` converted to ``mfield``'s model type."""
    name = tfield.name
    mcat, tcat = _category(mfield), _category(tfield)
    if mcat == "map":
        # Copied by iterating the keys: dict(container) goes through protobuf's Python-level
        # Mapping mixins (keys views), twice the cost, for every exporter sample every second.
        return lambda m: {key: found[key] for key in found} if (found := getattr(m, name)) else {}
    if mcat == "message":
        if mfield.is_repeated:
            return lambda m: list(getattr(m, name))
        return lambda m: getattr(m, name) if m.HasField(name) else None
    convert = _converter(mcat, tcat, tfield)
    if mfield.is_repeated:
        if convert is None:
            return lambda m: list(getattr(m, name))
        return lambda m: [convert(v) for v in getattr(m, name)]
    if convert is None:
        return operator.attrgetter(name)  # C-level: read for every exporter sample every second
    return lambda m: convert(getattr(m, name))


def _converter(mcat: str, tcat: str, tfield: FieldDescriptor) -> Callable[[Any], Any] | None:
    if mcat == tcat or (mcat == "int" and tcat == "enum"):
        return None
    if mcat == "string":
        if tcat == "enum":
            enum = tfield.enum_type
            values = {v.number: v.name for v in enum.values} if enum is not None else {}
            return lambda v: values.get(v, str(v))
        if tcat == "bool":
            return lambda v: "true" if v else "false"
        if tcat == "bytes":
            return lambda v: bytes(v).decode("utf-8", "replace")
        return str
    if mcat == "int" and tcat == "string":
        return lambda v: int(v) if v.strip().isdigit() else 0
    if mcat == "float":
        return float
    if mcat == "bool":
        return bool
    return None


KEYWORDS = ("auto", "reflection", "builtin")
REFLECTION_SERVICES = ("grpc.reflection.v1.ServerReflection", "grpc.reflection.v1alpha.ServerReflection")
MAX_SCHEMA_BYTES = 16 << 20
MAX_PROTO_FILES = 256


def is_path(value: str) -> bool:
    return value.strip() not in KEYWORDS


# ------------------------------------------------------------------ files
def load_path(path: str) -> descriptor_pb2.FileDescriptorSet:
    """A ``.proto`` file, a directory of them, or a descriptor set file -> FileDescriptorSet."""
    target = Path(path).expanduser()
    if not target.exists():
        raise SchemaError(f"{path}: no such file or directory")
    if target.is_dir():
        files = sorted(p for p in target.rglob("*.proto") if p.is_file())
        if not files:
            raise SchemaError(f"{path}: the directory holds no .proto file")
        if len(files) > MAX_PROTO_FILES:
            raise SchemaError(f"{path}: {len(files)} .proto files (at most {MAX_PROTO_FILES})")
        fds = compile_protos(target, [p.relative_to(target) for p in files])
    elif target.suffix == ".proto":
        fds = compile_protos(target.parent, [Path(target.name)])
    else:
        fds = read_descriptor_set(target)
    try:
        pool_from_set(fds)
    except SchemaError as exc:
        raise SchemaError(f"{path}: {exc}") from None
    return fds


def read_descriptor_set(path: Path) -> descriptor_pb2.FileDescriptorSet:
    try:
        size = path.stat().st_size
        if size > MAX_SCHEMA_BYTES:
            raise SchemaError(f"{path}: {size} bytes (at most {MAX_SCHEMA_BYTES})")
        data = path.read_bytes()
    except OSError as exc:
        raise SchemaError(f"{path}: cannot read: {exc.strerror or exc}") from None
    fds = descriptor_pb2.FileDescriptorSet()
    try:
        fds.ParseFromString(data)
    except DecodeError as exc:
        raise SchemaError(f"{path}: not a FileDescriptorSet (nor a .proto file or directory): {exc}") from None
    if not fds.file or any(not f.name for f in fds.file):
        raise SchemaError(f"{path}: not a FileDescriptorSet (no named file descriptors in it)")
    return fds


def compile_protos(root: Path, files: list[Path]) -> descriptor_pb2.FileDescriptorSet:
    """Run protoc in-process (grpcio-tools) with the bundled well-known types."""
    try:
        from grpc_tools import protoc  # lazy: a few MB of code only a path schema needs
    except ImportError as exc:  # pragma: no cover - it is a runtime dependency
        raise SchemaError(f"compiling .proto files needs grpcio-tools: {exc}") from None
    import importlib.resources

    well_known = str(importlib.resources.files("grpc_tools") / "_proto")
    with tempfile.TemporaryDirectory(prefix="xdm-schema-") as tmp:
        out = Path(tmp) / "schema.pb"
        errors = Path(tmp) / "errors.txt"
        args = [
            "protoc",
            f"-I{root}",
            f"-I{well_known}",
            "--include_imports",
            f"--descriptor_set_out={out}",
            *(str(f) for f in files),
        ]
        with _stderr_to(errors):
            code = protoc.main(args)
        if code != 0 or not out.exists():
            message = errors.read_text(errors="replace").strip() or f"protoc exited with {code}"
            shown = message if len(message) <= 2000 else message[:2000] + " ..."
            raise SchemaError(f"{root / files[0] if len(files) == 1 else root}: {shown}")
        return read_descriptor_set(out)


class _stderr_to:
    """Send fd 2 to a file while protoc runs (it writes its errors there, never to stdout)."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._saved = -1

    def __enter__(self) -> None:
        self._saved = os.dup(2)
        fd = os.open(self._path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(fd, 2)
        os.close(fd)

    def __exit__(self, *exc: object) -> None:
        os.dup2(self._saved, 2)
        os.close(self._saved)


# ------------------------------------------------------------------ reflection
def reflect(channel: grpc.Channel, timeout: float) -> descriptor_pb2.FileDescriptorSet | None:
    """XDM's schema through server reflection; None when XDM does not serve it.

    Lists the services, asks for the file defining each, and follows imports
    (transitively) by file name. Garbage answers raise ``SchemaError``; a
    transport failure raises ``grpc.RpcError`` for the caller to classify.
    """
    from grpc_reflection.v1alpha import reflection_pb2 as rpb  # v1 messages are wire-identical

    for service in REFLECTION_SERVICES:
        path = f"/{service}/ServerReflectionInfo"
        call = channel.stream_stream(
            path, request_serializer=rpb.ServerReflectionRequest.SerializeToString, response_deserializer=_raw
        )
        try:
            return _Reflector(call, timeout, rpb).run()
        except grpc.RpcError as exc:
            code = exc.code() if callable(getattr(exc, "code", None)) else None
            if code == grpc.StatusCode.UNIMPLEMENTED:
                continue
            raise
    return None


def _raw(data: bytes) -> bytes:
    return data


class _Reflector:
    """One reflection conversation: requests go out one at a time over one stream."""

    def __init__(self, call: Any, timeout: float, rpb: Any) -> None:
        import queue

        self._rpb = rpb
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=2)  # one request in flight + the end marker
        self._responses: Iterator[bytes] = call(iter(self._queue.get, None), timeout=timeout, wait_for_ready=True)

    def _ask(self, **kwargs: Any) -> Any:
        self._queue.put(self._rpb.ServerReflectionRequest(**kwargs))
        try:
            raw = next(self._responses)
        except StopIteration:
            raise SchemaError("server reflection closed the stream before answering") from None
        answer = self._rpb.ServerReflectionResponse()
        try:
            answer.ParseFromString(raw)
        except DecodeError as exc:
            raise SchemaError(f"server reflection answered garbage ({len(raw)} bytes): {exc}") from None
        if answer.HasField("error_response"):
            err = answer.error_response
            raise SchemaError(f"server reflection error {err.error_code}: {err.error_message}")
        return answer

    def run(self) -> descriptor_pb2.FileDescriptorSet:
        try:
            listed = self._ask(list_services="")
            if not listed.HasField("list_services_response"):
                raise SchemaError("server reflection did not answer list_services")
            names = [s.name for s in listed.list_services_response.service]
            files: dict[str, descriptor_pb2.FileDescriptorProto] = {}
            for name in names:
                if name.startswith("grpc.reflection.") or name.startswith("grpc.health."):
                    continue
                self._add(self._ask(file_containing_symbol=name), files)
            pending = [dep for f in list(files.values()) for dep in f.dependency]
            while pending:
                dep = pending.pop()
                if dep in files:
                    continue
                try:
                    answer = self._ask(file_by_filename=dep)
                except SchemaError:
                    continue  # e.g. a well-known type the pool supplies itself
                for new in self._add(answer, files):
                    pending.extend(new.dependency)
            fds = descriptor_pb2.FileDescriptorSet(file=list(files.values()))
            pool_from_set(fds)
            return fds
        finally:
            self._queue.put(None)
            cancel = getattr(self._responses, "cancel", None)
            if callable(cancel):
                cancel()  # done (or given up): end the stream now, whatever the server does

    def _add(
        self, answer: Any, files: dict[str, descriptor_pb2.FileDescriptorProto]
    ) -> list[descriptor_pb2.FileDescriptorProto]:
        if not answer.HasField("file_descriptor_response"):
            raise SchemaError("server reflection did not answer with file descriptors")
        added = []
        for raw in answer.file_descriptor_response.file_descriptor_proto:
            proto = descriptor_pb2.FileDescriptorProto()
            try:
                proto.ParseFromString(raw)
            except DecodeError as exc:
                raise SchemaError(f"server reflection sent an unparsable file descriptor: {exc}") from None
            if not proto.name:
                raise SchemaError("server reflection sent a file descriptor without a name")
            if proto.name not in files:
                if len(files) >= MAX_PROTO_FILES:
                    raise SchemaError(f"server reflection sent more than {MAX_PROTO_FILES} files")
                files[proto.name] = proto
                added.append(proto)
        return added
