"""What the simulator puts on the wire: the served schema, and schema drift on top of it.

Every field number of the reconstructed proto (``proto/lingjun/``) is a guess (docs/xdm-risks.md): an
XDM that keeps the names but numbers the fields otherwise decodes silently wrong in a client that trusts
the guess. The served schemas, built from the reconstruction's descriptors, make that trap reproducible;
drift modes answer in shapes no schema declares (both listed in this package's README.md).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from google.protobuf import descriptor_pb2, descriptor_pool, json_format, message_factory
from google.protobuf.message import Message

from nomad_plugin._proto.lingjun import api_outer_pb2 as pb
from nomad_plugin._proto.lingjun import config_service_pb2 as cfg
from nomad_plugin.util.protowire import VARINT, encode_len_field, tag, varint

SCHEMAS = ("builtin", "renumbered", "foreign")
DEVICE_FILE = "api_outer.proto"
CONFIG_FILE = "config_service.proto"
DESCRIPTOR_SET_FILE = "descriptor_set.pb"
BUILTIN_PACKAGES = ("xdm", "config")
FOREIGN_PACKAGES = ("ljrk.dp2mgr.v1", "ljrk.controller.v1")  # not among the plugin's probed package names

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


def _transform(
    fdp: descriptor_pb2.FileDescriptorProto, filename: str, package: str, renumber: bool
) -> descriptor_pb2.FileDescriptorProto:
    out = descriptor_pb2.FileDescriptorProto()
    out.CopyFrom(fdp)
    out.name, out.package = filename, package
    old, new = f".{fdp.package}.", f".{package}."

    def retype(name: str) -> str:
        return new + name[len(old) :] if name.startswith(old) else name

    for msg in out.message_type:
        table = RENUMBER.get(msg.name, {}) if renumber else {}
        for fd in msg.field:
            fd.number = table.get(fd.name, fd.number)
        msg.field.sort(key=lambda f: f.number)  # declared in number order, as protoc would list them
        for fd in [*msg.field, *(f for nested in msg.nested_type for f in nested.field)]:
            if fd.type_name:
                fd.type_name = retype(fd.type_name)
    for method in (m for service in out.service for m in service.method):
        method.input_type, method.output_type = retype(method.input_type), retype(method.output_type)
    return out


def _copy(msg: Message, cls: type[Message]) -> Message:
    """``msg`` as a ``cls``, field by field by name (protobuf's JSON mapping does the walk)."""
    return json_format.ParseDict(json_format.MessageToDict(msg, preserving_proto_field_name=True), cls())


class ServedSchema:
    """One served schema: its file descriptors, descriptor pool and the conversions at the gRPC edge."""

    def __init__(self, name: str) -> None:
        if name not in SCHEMAS:
            raise ValueError(f"schema: {name!r} is not one of {', '.join(SCHEMAS)}")
        self.name = name
        self.device_package, self.config_package = FOREIGN_PACKAGES if name == "foreign" else BUILTIN_PACKAGES
        renumber = name != "builtin"
        self.files = (
            _transform(descriptor_pb2.FileDescriptorProto.FromString(pb.DESCRIPTOR.serialized_pb), DEVICE_FILE,
                       self.device_package, renumber),
            _transform(descriptor_pb2.FileDescriptorProto.FromString(cfg.DESCRIPTOR.serialized_pb), CONFIG_FILE,
                       self.config_package, renumber),
        )  # fmt: skip
        self.pool = descriptor_pool.DescriptorPool()
        for fdp in self.files:
            self.pool.Add(fdp)
        # A real server's reflection also describes itself (grpcurl describe works on it).
        from grpc_reflection.v1alpha import reflection_pb2

        self.pool.AddSerializedFile(reflection_pb2.DESCRIPTOR.serialized_pb)

    @property
    def device_service(self) -> str:
        return f"{self.device_package}.XpuDeviceManagerService"

    @property
    def config_service(self) -> str:
        return f"{self.config_package}.AmpConfigService"

    def message_class(self, short_name: str, config: bool = False) -> type[Message]:
        """The served class of a message named as in the reconstruction (e.g. ``"Device"``)."""
        full = f"{self.config_package if config else self.device_package}.{short_name}"
        return message_factory.GetMessageClass(self.pool.FindMessageTypeByName(full))

    def _served_class(self, builtin_cls: type[Message]) -> type[Message]:
        desc = builtin_cls.DESCRIPTOR
        return self.message_class(desc.name, config=desc.file.package == BUILTIN_PACKAGES[1])

    def to_served(self, msg: Message) -> Message:
        """A builtin message as the served schema's message."""
        return msg if self.name == "builtin" else _copy(msg, self._served_class(type(msg)))

    def decoder(self, builtin_cls: type[Message]) -> Callable[[bytes], Message]:
        """A request deserialiser: served wire bytes -> builtin message."""
        if self.name == "builtin":
            return builtin_cls.FromString
        served_cls = self._served_class(builtin_cls)
        return lambda data: _copy(served_cls.FromString(data), builtin_cls)

    def emit(self, directory: Path) -> list[Path]:
        """Write the ``.proto`` files (they compile with protoc) and ``descriptor_set.pb`` into ``directory``.

        The set is what ``protoc --include_imports --descriptor_set_out`` writes (the files import nothing).
        """
        directory.mkdir(parents=True, exist_ok=True)
        for fdp in self.files:
            (directory / fdp.name).write_text(render_proto(fdp, f"xdm-sim served schema {self.name!r}"))
        (directory / DESCRIPTOR_SET_FILE).write_bytes(
            descriptor_pb2.FileDescriptorSet(file=self.files).SerializeToString()
        )
        return [*(directory / fdp.name for fdp in self.files), directory / DESCRIPTOR_SET_FILE]


@functools.cache
def served_schema(name: str) -> ServedSchema:
    """The (immutable, shared) schema called ``name``; ValueError if unknown."""
    return ServedSchema(name)


def render_proto(fdp: descriptor_pb2.FileDescriptorProto, origin: str) -> str:
    """``.proto`` source of a proto3 file of services and flat messages (maps, optional, repeated)."""

    def short(type_name: str) -> str:
        return type_name.removeprefix(f".{fdp.package}.")

    def type_of(fd: descriptor_pb2.FieldDescriptorProto) -> str:
        return short(fd.type_name) if fd.type_name else fd.Type.Name(fd.type).removeprefix("TYPE_").lower()

    lines = [f"// Generated from descriptors: {origin}.", 'syntax = "proto3";', "", f"package {fdp.package};", ""]
    if fdp.options.HasField("go_package"):
        lines += [f'option go_package = "{fdp.options.go_package}";', ""]
    for service in fdp.service:
        lines.append(f"service {service.name} {{")
        for m in service.method:
            stream = "stream " if m.server_streaming else ""
            lines.append(f"  rpc {m.name}({short(m.input_type)}) returns ({stream}{short(m.output_type)});")
        lines += ["}", ""]
    for msg in fdp.message_type:
        entries = {f".{fdp.package}.{msg.name}.{n.name}": n for n in msg.nested_type if n.options.map_entry}
        lines.append(f"message {msg.name} {{")
        for fd in msg.field:
            if fd.type_name in entries:
                key, value = entries[fd.type_name].field
                decl = f"map<{type_of(key)}, {type_of(value)}>"
            else:
                label = "optional " if fd.proto3_optional else "repeated " if fd.label == fd.LABEL_REPEATED else ""
                decl = label + type_of(fd)
            lines.append(f"  {decl} {fd.name} = {fd.number};")
        lines += ["}", ""]
    return "\n".join(lines)


# ---------------------------------------------------------------- drift

DEFAULT_PACKAGE = "xdm"
_FLAGS = ("split-services", "extra-fields", "type-clash", "status-shift", "minor-omit-zero")
EXTRA_FIELDS = tag(1000, VARINT) + varint(1) + encode_len_field(1001, b"xdm-sim-extra")
SHIFTED_STATUS_FIELD, SHIFTED_MESSAGE_FIELD = 15, 16


@dataclass(frozen=True)
class Drift:
    package: str = DEFAULT_PACKAGE
    split_services: bool = False
    extra_fields: bool = False
    type_clash: bool = False
    status_shift: bool = False
    minor_omit_zero: bool = False

    def describe(self) -> str:
        flags = [name for name in _FLAGS if getattr(self, name.replace("-", "_"))]
        return ",".join(([f"package={self.package}"] if self.package != DEFAULT_PACKAGE else []) + flags) or "none"

    def service(self, schema: ServedSchema, name: str) -> str:
        """The full name of dp2mgr service ``name``: drift's package, else the served schema's."""
        if self.package == DEFAULT_PACKAGE:
            return f"{schema.device_package}.{name}"
        return f"{self.package}.{name}" if self.package else name

    def serialize(self, msg: Message) -> bytes:
        """``msg`` on the wire with the drift applied (the message itself is left untouched)."""
        if not (self.extra_fields or self.type_clash or self.status_shift):
            return msg.SerializeToString()
        out = type(msg)()
        out.CopyFrom(msg)
        declared = out.DESCRIPTOR.fields_by_name
        if self.status_shift and "status" in declared and getattr(out, "status", 0) != 0:
            shifted = tag(SHIFTED_STATUS_FIELD, VARINT) + varint(getattr(out, "status", 0))
            shifted += encode_len_field(SHIFTED_MESSAGE_FIELD, str(getattr(out, "message", "")).encode())
            out.ClearField("status")
            if "message" in declared:
                out.ClearField("message")
            out.MergeFromString(shifted)
        self._walk(out)
        return out.SerializeToString()

    def _walk(self, msg: Message) -> None:
        for fd, value in msg.ListFields():
            if fd.message_type is not None and not fd.message_type.GetOptions().map_entry:
                for child in value if fd.is_repeated else [value]:
                    self._walk(child)
        if self.type_clash:
            _clash(msg)
        if self.extra_fields:
            msg.MergeFromString(EXTRA_FIELDS)


def _clash(msg: Message) -> None:
    """Move a declared value into an unknown field of the other wire type (clear it, merge hand-made bytes)."""
    numbers = {f.name: f.number for f in msg.DESCRIPTOR.fields}
    moved: dict[str, bytes] = {}
    name = msg.DESCRIPTOR.name
    if name == "Device":
        moved["health"] = tag(numbers["health"], VARINT) + varint(int(getattr(msg, "health", "") == "Healthy"))
    if name in ("Device", "GpuInfo"):
        moved["totalMemory"] = encode_len_field(numbers["totalMemory"], str(getattr(msg, "totalMemory", 0)).encode())
    if name == "MetricData":
        moved["metricId"] = encode_len_field(numbers["metricId"], str(getattr(msg, "metricId", 0)).encode())
    for field_name, raw in moved.items():
        msg.ClearField(field_name)
        msg.MergeFromString(raw)


def parse_drift(spec: str | None) -> Drift:
    """``"extra-fields,package=api"`` -> Drift; None, "" or "none": no drift; an unknown mode: ValueError."""
    if spec is None or spec.strip() in ("", "none"):
        return Drift()
    changes: dict[str, str | bool] = {}
    for raw in spec.split(","):
        item = raw.strip()
        if item.startswith("package="):
            package = item.split("=", 1)[1].strip()
            changes["package"] = "" if package in ("", "none") else package
        elif item in _FLAGS:
            changes[item.replace("-", "_")] = True
        else:
            known = ", ".join(("package=<name>", *_FLAGS))
            raise ValueError(f"drift: unknown mode {item!r} (known: {known})")
    return Drift(**changes)  # type: ignore[arg-type]
