"""Served-schema modes: the simulator answers in a schema other than the reconstruction.

Every field number in ``proto/lingjun/`` is a guess (xdm-api.md R2). A real XDM
that keeps the names but numbers the fields differently decodes *silently* wrong
in a client that trusts the guess. These modes make that trap reproducible:

- ``builtin``: the reconstruction as generated in ``nomad_plugin/_proto/lingjun``.
- ``renumbered``: same packages, services, messages and field names; field
  numbers permuted per message (:data:`RENUMBER`). Most swaps keep the wire type,
  so a builtin client reads UUIDs as PCI bus ids, ``totalCore`` as ``minor``,
  ``migEnabled`` as ``totalMemory``, container paths as host paths; the rest
  clash in wire type and vanish into unknown fields (health, memory, Allocate's
  status, QueryStatus.enabled); AllocateRequest fails to deserialise.
- ``foreign``: the same renumbering under other proto packages
  (:data:`FOREIGN_PACKAGES`), so even the service paths differ.

The schemas are built at run time from the reconstruction's descriptors
(``descriptor_pb2`` edits, a fresh :class:`DescriptorPool`, message classes from
``message_factory.GetMessageClass``). The simulator's logic keeps using the
builtin classes; :meth:`ServedSchema.to_served` / :meth:`ServedSchema.to_builtin`
convert at the gRPC edge by copying fields by name.

Public API (also for tests and the schema binder): :func:`served_schema`,
:data:`SCHEMAS`, :meth:`ServedSchema.descriptor_set`,
:meth:`ServedSchema.render_protos`, :meth:`ServedSchema.emit`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from nomad_plugin._proto.lingjun import api_outer_pb2 as pb
from nomad_plugin._proto.lingjun import config_service_pb2 as cfg
from nomad_plugin.util.protowire import I32, I64, LEN, VARINT, iter_fields, tag, varint

SCHEMAS = ("builtin", "renumbered", "foreign")
DEVICE_FILE = "api_outer.proto"
CONFIG_FILE = "config_service.proto"
DESCRIPTOR_SET_FILE = "descriptor_set.pb"
BUILTIN_PACKAGES = ("xdm", "config")
FOREIGN_PACKAGES = ("ljrk.dp2mgr.v1", "ljrk.controller.v1")  # in no R1 probe candidate list
DEVICE_SERVICE = "XpuDeviceManagerService"
CONFIG_SERVICE = "AmpConfigService"

# message -> field -> served number. Each row is a permutation of that message's
# builtin numbers (one-field messages move instead) (tests/sim/test_schema_modes.py checks it). Comments: what a
# client using the builtin numbers then sees.
# fmt: off
RENUMBER: dict[str, dict[str, int]] = {
    # xpuTypes read as `message` (last type only); xpuTypes empty
    "XPUTypeResponse": {"xpuTypes": 3, "status": 2, "message": 1},
    # minor <- totalCore (100 on every card), uuid <-> pciBusId, model <-> xpuType,
    # health (string) / totalMemory (int64) swap numbers: both clash and vanish
    "Device": {
        "minor": 7, "uuid": 8, "model": 4, "xpuType": 3, "health": 6,
        "totalMemory": 5, "totalCore": 1, "pciBusId": 2, "extenderResources": 9,
    },
    # id (string) lands on devices (message): "Exception deserializing request"
    "AllocateRequest": {"id": 2, "devices": 1, "featureGates": 3, "annotations": 4},
    "DeviceRequest": {"minor": 2, "core": 1, "memory": 4, "slice": 3, "extender": 5},
    # status/message clash (a refusal reads as status 0), envs <-> annotations,
    # devices parsed as Mounts and mounts as AllocatedDevices
    "AllocateResponse": {
        "status": 2, "message": 1, "id": 3, "devices": 6, "envs": 8,
        "mounts": 4, "deviceSpecs": 7, "annotations": 5, "cdiDevices": 9,
    },
    "AllocatedDevice": {"minor": 3, "uuid": 6, "core": 1, "memory": 5, "slice": 4, "migUuid": 2, "extender": 7},
    "Mount": {"containerPath": 2, "hostPath": 1, "readOnly": 3},
    "DeviceSpec": {"containerPath": 2, "hostPath": 1, "permissions": 3},
    # a builtin Release names no id (unknown field 1 is dropped): "empty id"
    "ReleaseRequest": {"id": 2},
    "ReleaseResponse": {"status": 2, "message": 1},
    "ListGpuInfoRequest": {"minors": 2},
    "ListGpuInfoResponse": {"status": 2, "message": 1, "gpuInfos": 3},
    # minor <-> numaNode, uuid <-> pciBusId, model <-> driverVersion,
    # vendor <-> sdkVersion, totalMemory <-> migEnabled (both varints)
    "GpuInfo": {
        "minor": 9, "uuid": 8, "model": 4, "driverVersion": 3, "vendor": 11, "xpuType": 6, "totalMemory": 13,
        "pciBusId": 2, "numaNode": 1, "firmwareVersion": 12, "sdkVersion": 5, "serialNumber": 10, "migEnabled": 7,
    },
    "ExporterDataRequest": {"devices": 2, "metricIds": 1},
    "ExporterDataResponse": {"status": 2, "message": 1, "dataList": 3},
    # device <-> metricName, metricId <-> timestamp (both varints)
    "MetricData": {"device": 5, "metricId": 4, "value": 3, "timestamp": 2, "metricName": 1, "labels": 6},
    # status <- collectIntervalMs: a healthy exporter reads as failing
    "ExporterGetConfigResponse": {"status": 3, "message": 2, "collectIntervalMs": 1, "metricIds": 4, "config": 5},
    "ExporterGetStatusResponse": {
        "status": 1, "message": 6, "running": 3, "state": 2, "lastCollectTimestamp": 5, "version": 4,
    },
    # success/enabled (bool) and message (string) clash: "Runtime Kit disabled"
    "EnableResponse": {"success": 2, "message": 1},
    "DisableResponse": {"success": 2, "message": 1},
    "QueryStatusResponse": {"enabled": 2, "message": 1},
}
# fmt: on


def _builtin_files() -> tuple[descriptor_pb2.FileDescriptorProto, descriptor_pb2.FileDescriptorProto]:
    device = descriptor_pb2.FileDescriptorProto.FromString(pb.DESCRIPTOR.serialized_pb)
    config = descriptor_pb2.FileDescriptorProto.FromString(cfg.DESCRIPTOR.serialized_pb)
    return device, config


def _retype(name: str, old: str, new: str) -> str:
    prefix = f".{old}."
    return f".{new}." + name[len(prefix) :] if name.startswith(prefix) else name


def _transform(
    fdp: descriptor_pb2.FileDescriptorProto, filename: str, package: str, renumber: bool
) -> descriptor_pb2.FileDescriptorProto:
    out = descriptor_pb2.FileDescriptorProto()
    out.CopyFrom(fdp)
    old = fdp.package
    out.name = filename
    out.package = package
    for msg in out.message_type:
        table = RENUMBER.get(msg.name) if renumber else None
        for field in msg.field:
            if field.type_name:
                field.type_name = _retype(field.type_name, old, package)
            if table is not None:
                field.number = table[field.name]
        if table is not None:
            ordered = sorted(msg.field, key=lambda f: f.number)
            copies = [descriptor_pb2.FieldDescriptorProto() for _ in ordered]
            for dst, src in zip(copies, ordered, strict=True):
                dst.CopyFrom(src)
            del msg.field[:]
            msg.field.extend(copies)
            _reindex_oneofs(msg)
        for nested in msg.nested_type:  # map entries
            for field in nested.field:
                if field.type_name:
                    field.type_name = _retype(field.type_name, old, package)
    for service in out.service:
        for method in service.method:
            method.input_type = _retype(method.input_type, old, package)
            method.output_type = _retype(method.output_type, old, package)
    return out


def _reindex_oneofs(msg: descriptor_pb2.DescriptorProto) -> None:
    """Synthetic oneofs (proto3 ``optional``) must follow their field's new position."""
    if not msg.oneof_decl:
        return
    names = {i: d.name for i, d in enumerate(msg.oneof_decl)}
    order: list[str] = []
    for field in msg.field:
        if field.HasField("oneof_index"):
            name = names[field.oneof_index]
            if name not in order:
                order.append(name)
    decls = {d.name: descriptor_pb2.OneofDescriptorProto(name=d.name) for d in msg.oneof_decl}
    del msg.oneof_decl[:]
    msg.oneof_decl.extend(decls[n] for n in order)
    for field in msg.field:
        if field.HasField("oneof_index"):
            field.oneof_index = order.index(names[field.oneof_index])


class ServedSchema:
    """One served schema: its descriptors, pool, message classes and edge conversions."""

    def __init__(self, name: str) -> None:
        if name not in SCHEMAS:
            raise ValueError(f"schema: {name!r} is not one of {', '.join(SCHEMAS)}")
        self.name = name
        device, config = _builtin_files()
        packages = FOREIGN_PACKAGES if name == "foreign" else BUILTIN_PACKAGES
        renumber = name != "builtin"
        self.files = (
            _transform(device, DEVICE_FILE, packages[0], renumber),
            _transform(config, CONFIG_FILE, packages[1], renumber),
        )
        self.device_package, self.config_package = packages
        self.pool = descriptor_pool.DescriptorPool()
        for fdp in self.files:
            self.pool.Add(fdp)
        # A real server's reflection also describes itself (grpcurl describe works on it).
        from grpc_reflection.v1alpha import reflection_pb2

        self.pool.AddSerializedFile(reflection_pb2.DESCRIPTOR.serialized_pb)
        self._classes: dict[str, type[Message]] = {}
        self._by_builtin: dict[type[Message], type[Message]] = {}

    @property
    def builtin(self) -> bool:
        return self.name == "builtin"

    @property
    def device_service(self) -> str:
        return f"{self.device_package}.{DEVICE_SERVICE}"

    @property
    def config_service(self) -> str:
        return f"{self.config_package}.{CONFIG_SERVICE}"

    def service_names(self) -> list[str]:
        return [self.device_service, self.config_service]

    def message_class(self, short_name: str, config: bool = False) -> type[Message]:
        """The served class for a message named as in the reconstruction (e.g. ``"Device"``)."""
        full = f"{self.config_package if config else self.device_package}.{short_name}"
        cls = self._classes.get(full)
        if cls is None:
            cls = message_factory.GetMessageClass(self.pool.FindMessageTypeByName(full))
            self._classes[full] = cls
        return cls

    def served_class(self, builtin_cls: type[Message]) -> type[Message]:
        cls = self._by_builtin.get(builtin_cls)
        if cls is None:
            desc = builtin_cls.DESCRIPTOR
            cls = self.message_class(desc.name, config=desc.file.package == BUILTIN_PACKAGES[1])
            self._by_builtin[builtin_cls] = cls
        return cls

    def to_served(self, msg: Message) -> Message:
        """A builtin message as the served schema's message (copied by field name)."""
        if self.builtin:
            return msg
        out = self.served_class(type(msg))()
        copy_by_name(msg, out)
        return out

    def to_builtin(self, msg: Message, builtin_cls: type[Message]) -> Message:
        if self.builtin:
            return msg
        out = builtin_cls()
        copy_by_name(msg, out)
        return out

    def decoder(self, builtin_cls: type[Message]) -> Callable[[bytes], Message]:
        """A request deserialiser: served wire bytes -> builtin message."""
        if self.builtin:
            return builtin_cls.FromString
        return functools.partial(_decode, self, builtin_cls, self.served_class(builtin_cls))

    # ------------------------------------------------------------ emission
    def descriptor_set(self) -> descriptor_pb2.FileDescriptorSet:
        """Like ``protoc --include_imports --descriptor_set_out`` (the files import nothing)."""
        return descriptor_pb2.FileDescriptorSet(file=list(self.files))

    def render_protos(self) -> dict[str, str]:
        """File name -> ``.proto`` source rendered from the descriptors (compiles with protoc)."""
        return {fdp.name: render_proto(fdp, f"xdm-sim served schema {self.name!r}") for fdp in self.files}

    def emit(self, directory: Path) -> list[Path]:
        """Write the ``.proto`` files and ``descriptor_set.pb`` into ``directory``."""
        directory.mkdir(parents=True, exist_ok=True)
        written: list[Path] = []
        for name, text in self.render_protos().items():
            path = directory / name
            path.write_text(text)
            written.append(path)
        path = directory / DESCRIPTOR_SET_FILE
        path.write_bytes(self.descriptor_set().SerializeToString())
        written.append(path)
        return written


def _decode(schema: ServedSchema, builtin_cls: type[Message], served_cls: type[Message], data: bytes) -> Message:
    return schema.to_builtin(served_cls.FromString(data), builtin_cls)


@functools.cache
def served_schema(name: str) -> ServedSchema:
    """The (cached, immutable) :class:`ServedSchema` called ``name``; ValueError if unknown."""
    return ServedSchema(name)


_SCALAR, _SCALAR_LIST, _SCALAR_MAP, _MESSAGE_MAP, _MESSAGE_LIST, _MESSAGE = range(6)
_kinds: dict[str, int] = {}  # field full name -> how to copy it (descriptor options are slow to ask)


def _kind(fd: FieldDescriptor) -> int:
    kind = _kinds.get(fd.full_name)
    if kind is None:
        msg = fd.message_type
        if msg is None:
            kind = _SCALAR_LIST if fd.is_repeated else _SCALAR
        elif msg.GetOptions().map_entry:
            kind = _SCALAR_MAP if msg.fields_by_name["value"].message_type is None else _MESSAGE_MAP
        else:
            kind = _MESSAGE_LIST if fd.is_repeated else _MESSAGE
        _kinds[fd.full_name] = kind
    return kind


def copy_by_name(src: Message, dst: Message) -> None:
    """Copy every set field of ``src`` into ``dst`` by field name (types must agree)."""
    for fd, value in src.ListFields():
        kind = _kind(fd)
        if kind == _SCALAR:
            setattr(dst, fd.name, value)
            continue
        target: Any = getattr(dst, fd.name)
        if kind == _SCALAR_LIST:
            target.extend(value)
        elif kind == _SCALAR_MAP:
            target.update(value)
        elif kind == _MESSAGE_LIST:
            for item in value:
                copy_by_name(item, target.add())
        elif kind == _MESSAGE:
            target.SetInParent()
            copy_by_name(value, target)
        else:
            for key, item in value.items():
                copy_by_name(item, target[key])


# ---------------------------------------------------------------- .proto rendering
_SCALARS = {
    FieldDescriptor.TYPE_DOUBLE: "double", FieldDescriptor.TYPE_FLOAT: "float", FieldDescriptor.TYPE_INT64: "int64",
    FieldDescriptor.TYPE_UINT64: "uint64", FieldDescriptor.TYPE_INT32: "int32", FieldDescriptor.TYPE_FIXED64: "fixed64",
    FieldDescriptor.TYPE_FIXED32: "fixed32", FieldDescriptor.TYPE_BOOL: "bool", FieldDescriptor.TYPE_STRING: "string",
    FieldDescriptor.TYPE_BYTES: "bytes", FieldDescriptor.TYPE_UINT32: "uint32", FieldDescriptor.TYPE_SFIXED32: "sfixed32",
    FieldDescriptor.TYPE_SFIXED64: "sfixed64", FieldDescriptor.TYPE_SINT32: "sint32", FieldDescriptor.TYPE_SINT64: "sint64",
}  # fmt: skip


def _type_ref(field: descriptor_pb2.FieldDescriptorProto, package: str) -> str:
    if field.type in (FieldDescriptor.TYPE_MESSAGE, FieldDescriptor.TYPE_ENUM):
        prefix = f".{package}."
        name = field.type_name
        return name[len(prefix) :] if name.startswith(prefix) else name
    return _SCALARS[field.type]


def _render_message(msg: descriptor_pb2.DescriptorProto, package: str, indent: str) -> list[str]:
    entries = {n.name: n for n in msg.nested_type if n.options.map_entry}
    lines = [f"{indent}message {msg.name} {{"]
    for nested in msg.nested_type:
        if not nested.options.map_entry:
            lines.extend(_render_message(nested, package, indent + "  "))
    for enum in msg.enum_type:
        lines.extend(_render_enum(enum, indent + "  "))
    for field in msg.field:
        entry_name = field.type_name.rsplit(".", 1)[-1]
        if field.type == FieldDescriptor.TYPE_MESSAGE and entry_name in entries and field.label == field.LABEL_REPEATED:
            key, value = entries[entry_name].field
            decl = f"map<{_type_ref(key, package)}, {_type_ref(value, package)}>"
        else:
            label = "repeated " if field.label == field.LABEL_REPEATED else ""
            if field.proto3_optional:
                label = "optional "
            elif field.HasField("oneof_index"):
                raise ValueError(f"{msg.name}.{field.name}: real oneofs are not rendered")
            decl = label + _type_ref(field, package)
        lines.append(f"{indent}  {decl} {field.name} = {field.number};")
    lines.append(f"{indent}}}")
    return lines


def _render_enum(enum: descriptor_pb2.EnumDescriptorProto, indent: str) -> list[str]:
    body = [f"{indent}  {v.name} = {v.number};" for v in enum.value]
    return [f"{indent}enum {enum.name} {{", *body, f"{indent}}}"]


def render_proto(fdp: descriptor_pb2.FileDescriptorProto, origin: str) -> str:
    """``.proto`` source for a proto3 file descriptor without options beyond go_package."""
    lines = [f"// Generated from descriptors: {origin}.", 'syntax = "proto3";', ""]
    if fdp.package:
        lines += [f"package {fdp.package};", ""]
    lines += [f'import "{dep}";' for dep in fdp.dependency]
    if fdp.options.HasField("go_package"):
        lines += [f'option go_package = "{fdp.options.go_package}";', ""]
    for service in fdp.service:
        lines.append(f"service {service.name} {{")
        for m in service.method:
            req = ("stream " if m.client_streaming else "") + _short(m.input_type, fdp.package)
            resp = ("stream " if m.server_streaming else "") + _short(m.output_type, fdp.package)
            lines.append(f"  rpc {m.name}({req}) returns ({resp});")
        lines += ["}", ""]
    for enum in fdp.enum_type:
        lines += [*_render_enum(enum, ""), ""]
    for msg in fdp.message_type:
        lines += [*_render_message(msg, fdp.package, ""), ""]
    return "\n".join(lines)


def _short(type_name: str, package: str) -> str:
    prefix = f".{package}."
    return type_name[len(prefix) :] if type_name.startswith(prefix) else type_name


def field_numbers(schema: ServedSchema, messages: Iterable[str] = RENUMBER) -> dict[str, dict[str, int]]:
    """message -> field -> number in ``schema`` (for reports and tests)."""
    out: dict[str, dict[str, int]] = {}
    for name in messages:
        config = name in ("EnableResponse", "DisableResponse", "QueryStatusResponse")
        desc = schema.message_class(name, config=config).DESCRIPTOR
        out[name] = {f.name: f.number for f in desc.fields}
    return out


# ------------------------------------------------------------ (from wire.py)
# Protobuf wire-format helpers: hand-encoding for the schema-drift modes,
# and a raw decoder (like ``protoc --decode_raw``) for checking what went out.


__all__ = ["I32", "I64", "LEN", "VARINT", "RawField", "bytes_field", "decode_raw", "tag", "varint", "varint_field"]


def varint_field(number: int, value: int) -> bytes:
    return tag(number, VARINT) + varint(value)


def bytes_field(number: int, value: bytes | str) -> bytes:
    data = value.encode() if isinstance(value, str) else value
    return tag(number, LEN) + varint(len(data)) + data


@dataclass(frozen=True)
class RawField:
    number: int
    wire_type: int
    value: int | bytes


def decode_raw(data: bytes) -> list[RawField]:
    """Top-level fields of a serialised message, in wire order."""
    return [RawField(number, wire_type, value) for number, wire_type, value in iter_fields(data)]


# ------------------------------------------------------------ (from drift.py)
# Schema-drift modes (xdm-api.md §5.8): answer in a shape the reconstructed
# proto does not expect, so the client's R1-R4 defences get exercised.
#
# Modes (combine with commas, e.g. ``split-services,extra-fields``):
#
# - ``package=<name>``: serve the dp2mgr service under package ``<name>``
#   (``package=`` or ``package=none``: no package at all).
# - ``split-services``: the five monitoring RPCs move to ``<pkg>.XpuExporterService``.
# - ``extra-fields``: every response message (and every nested message) gets
#   unknown fields 1000 (varint 1) and 1001 (string "xdm-sim-extra").
# - ``type-clash``: ``Device.health`` as a bool varint (1 = healthy) at field 5,
#   ``Device.totalMemory`` / ``GpuInfo.totalMemory`` as decimal strings,
#   ``MetricData.metricId`` as a decimal string.
# - ``status-shift``: a failing response carries its status at field 15 and its
#   message at field 16 instead of the declared fields (so it looks like success).
# - ``minor-omit-zero``: Allocate treats ``minor: 0`` as "left empty" (auto-assign).
#
# Implemented by moving values into unknown fields (clear the declared field,
# merge hand-encoded bytes); protobuf keeps unknown fields when serialising.


DEFAULT_PACKAGE = "xdm"
MODES = ("package=<name>", "split-services", "extra-fields", "type-clash", "status-shift", "minor-omit-zero")
EXTRA_FIELDS = varint_field(1000, 1) + bytes_field(1001, "xdm-sim-extra")
SHIFTED_STATUS_FIELD = 15
SHIFTED_MESSAGE_FIELD = 16


@dataclass(frozen=True)
class Drift:
    package: str = DEFAULT_PACKAGE
    split_services: bool = False
    extra_fields: bool = False
    type_clash: bool = False
    status_shift: bool = False
    minor_omit_zero: bool = False

    @property
    def active(self) -> bool:
        return self != Drift()

    def describe(self) -> str:
        parts = []
        if self.package != DEFAULT_PACKAGE:
            parts.append(f"package={self.package}")
        for flag, name in (
            (self.split_services, "split-services"),
            (self.extra_fields, "extra-fields"),
            (self.type_clash, "type-clash"),
            (self.status_shift, "status-shift"),
            (self.minor_omit_zero, "minor-omit-zero"),
        ):
            if flag:
                parts.append(name)
        return ",".join(parts) or "none"

    def service(self, name: str) -> str:
        return f"{self.package}.{name}" if self.package else name


def parse_drift(spec: str | None) -> Drift:
    """``"extra-fields,package=api"`` -> Drift; None/""/"none" = no drift; unknown mode -> ValueError."""
    if spec is None or spec.strip() in ("", "none"):
        return Drift()
    kwargs: dict[str, object] = {}
    for raw in spec.split(","):
        item = raw.strip()
        if item.startswith("package="):
            pkg = item.split("=", 1)[1].strip()
            kwargs["package"] = "" if pkg in ("", "none") else pkg
        elif item in ("split-services", "extra-fields", "type-clash", "status-shift", "minor-omit-zero"):
            kwargs[item.replace("-", "_")] = True
        else:
            raise ValueError(f"drift: unknown mode {item!r} (known: {', '.join(MODES)})")
    return Drift(**kwargs)  # type: ignore[arg-type]


def _move(msg: Message, field_name: str, raw: bytes) -> None:
    msg.ClearField(field_name)
    msg.MergeFromString(raw)


def _clash(msg: Message) -> None:
    name = msg.DESCRIPTOR.full_name.rsplit(".", 1)[-1]
    fields = msg.DESCRIPTOR.fields_by_name
    if name == "Device":
        healthy = getattr(msg, "health", "") == "Healthy"
        total = int(getattr(msg, "totalMemory", 0))
        _move(msg, "health", varint_field(fields["health"].number, int(healthy)))
        _move(msg, "totalMemory", bytes_field(fields["totalMemory"].number, str(total)))
    elif name == "GpuInfo":
        total = int(getattr(msg, "totalMemory", 0))
        _move(msg, "totalMemory", bytes_field(fields["totalMemory"].number, str(total)))
    elif name == "MetricData":
        mid = int(getattr(msg, "metricId", 0))
        _move(msg, "metricId", bytes_field(fields["metricId"].number, str(mid)))


def _walk(msg: Message, drift: Drift) -> None:
    for fd, value in msg.ListFields():
        if fd.message_type is None or fd.message_type.GetOptions().map_entry:
            continue
        children = value if fd.is_repeated else [value]
        for child in children:
            _walk(child, drift)
    if drift.type_clash:
        _clash(msg)
    if drift.extra_fields:
        msg.MergeFromString(EXTRA_FIELDS)


def apply(msg: Message, drift: Drift) -> bytes:
    """Serialise ``msg`` with ``drift`` applied (the original is left untouched)."""
    if not (drift.extra_fields or drift.type_clash or drift.status_shift):
        return msg.SerializeToString()
    out = type(msg)()
    out.CopyFrom(msg)
    fields = out.DESCRIPTOR.fields_by_name
    if drift.status_shift and "status" in fields and getattr(out, "status", 0) != 0:
        status = int(getattr(out, "status", 0))
        message = str(getattr(out, "message", ""))
        out.ClearField("status")
        if "message" in fields:
            out.ClearField("message")
        out.MergeFromString(varint_field(SHIFTED_STATUS_FIELD, status) + bytes_field(SHIFTED_MESSAGE_FIELD, message))
    _walk(out, drift)
    return out.SerializeToString()
