"""What the simulator puts on the wire: the served schema.

The simulator serves the reconstruction (``proto/lingjun/``). A :class:`ServedSchema` is built from file
descriptors, so a caller may hand the simulator another schema with the same message names (other
numbers, other packages) and the node's logic stays on the reconstruction's classes; ``emit`` writes a
schema as ``.proto`` files and a descriptor set (for grpcurl or protoc).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path

from google.protobuf import descriptor_pb2, descriptor_pool, json_format, message_factory
from google.protobuf.message import Message

from nomad_plugin._proto.lingjun import api_outer_pb2 as pb
from nomad_plugin._proto.lingjun import config_service_pb2 as cfg

DEVICE_FILE = "api_outer.proto"
CONFIG_FILE = "config_service.proto"
DESCRIPTOR_SET_FILE = "descriptor_set.pb"
BUILTIN = "builtin"


def _copy(msg: Message, cls: type[Message]) -> Message:
    """``msg`` as a ``cls``, field by field by name (protobuf's JSON mapping does the walk)."""
    return json_format.ParseDict(json_format.MessageToDict(msg, preserving_proto_field_name=True), cls())


def builtin_files() -> tuple[descriptor_pb2.FileDescriptorProto, descriptor_pb2.FileDescriptorProto]:
    """The reconstruction's two files (fresh copies), named as the emitted ``.proto`` files are."""
    files = []
    for module, name in ((pb, DEVICE_FILE), (cfg, CONFIG_FILE)):
        fdp = descriptor_pb2.FileDescriptorProto.FromString(module.DESCRIPTOR.serialized_pb)
        fdp.name = name
        files.append(fdp)
    return files[0], files[1]


class ServedSchema:
    """One served schema: its file descriptors, descriptor pool and the conversions at the gRPC edge.

    ``files`` are the dp2mgr file and the config-daemon file; their messages carry the reconstruction's
    names (the simulator's logic speaks the reconstruction), whatever their numbers and packages.
    """

    def __init__(
        self, name: str, files: tuple[descriptor_pb2.FileDescriptorProto, descriptor_pb2.FileDescriptorProto]
    ) -> None:
        self.name = name
        self.files = files
        self.device_package, self.config_package = files[0].package, files[1].package
        self.converts = [f.SerializeToString() for f in files] != [f.SerializeToString() for f in builtin_files()]
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
        return self.message_class(desc.name, config=desc.file.package == cfg.DESCRIPTOR.package)

    def to_served(self, msg: Message) -> Message:
        """A builtin message as the served schema's message."""
        return _copy(msg, self._served_class(type(msg))) if self.converts else msg

    def decoder(self, builtin_cls: type[Message]) -> Callable[[bytes], Message]:
        """A request deserialiser: served wire bytes -> builtin message."""
        if not self.converts:
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
def builtin_schema() -> ServedSchema:
    """The reconstruction as served (immutable, shared): what ``xdm-sim`` serves."""
    return ServedSchema(BUILTIN, builtin_files())


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
