"""Schema drift for the simulator: answers in shapes no schema declares, to test the client's defences.

:class:`Drift` (``parse_drift("extra-fields,package=api")``) is applied by
:class:`tests.doubles.drifted_sim.DriftedSimulator` on top of the served schema:

- ``package=<name>``: dp2mgr's services under another proto package (``none``: no package);
- ``split-services``: the five monitoring RPCs under ``<pkg>.XpuExporterService``;
- ``extra-fields``: unknown fields 1000 and 1001 in every response message, nested ones too;
- ``type-clash``: ``Device.health`` as a bool varint, ``totalMemory`` and ``MetricData.metricId`` as strings;
- ``status-shift``: a failure's status and message at fields 15 and 16, so that it looks like success;
- ``minor-omit-zero``: Allocate reads ``minor: 0`` as "left empty" (auto-assign).

Protobuf has no public encoder for a field no message declares, hence the few wire helpers here; reading
such fields is protobuf's own (``google.protobuf.unknown_fields``).
"""

from __future__ import annotations

from dataclasses import dataclass

from google.protobuf.message import Message

from nomad_plugin.sim.schema import ServedSchema

VARINT, LEN = 0, 2
EXPORTER_RPCS = ("ListGpuInfo", "ExporterGetDataList", "ExporterDataStream", "ExporterGetConfig", "ExporterGetStatus")


def tag(number: int, wire_type: int) -> bytes:
    return varint(number << 3 | wire_type)


def varint(value: int) -> bytes:
    if value < 0:
        value &= (1 << 64) - 1  # a negative int32/int64 is sent as its 64-bit two's complement
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    return bytes([*out, value])


def encode_len_field(number: int, payload: bytes) -> bytes:
    return tag(number, LEN) + varint(len(payload)) + payload


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
