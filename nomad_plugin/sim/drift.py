"""Schema-drift modes (xdm-api.md §5.8): answer in a shape the reconstructed
proto does not expect, so the client's R1-R4 defences get exercised.

Modes (combine with commas, e.g. ``split-services,extra-fields``):

- ``package=<name>``: serve the dp2mgr service under package ``<name>``
  (``package=`` or ``package=none``: no package at all).
- ``split-services``: the five monitoring RPCs move to ``<pkg>.XpuExporterService``.
- ``extra-fields``: every response message (and every nested message) gets
  unknown fields 1000 (varint 1) and 1001 (string "xdm-sim-extra").
- ``type-clash``: ``Device.health`` as a bool varint (1 = healthy) at field 5,
  ``Device.totalMemory`` / ``GpuInfo.totalMemory`` as decimal strings,
  ``MetricData.metricId`` as a decimal string.
- ``status-shift``: a failing response carries its status at field 15 and its
  message at field 16 instead of the declared fields (so it looks like success).
- ``minor-omit-zero``: Allocate treats ``minor: 0`` as "left empty" (auto-assign).

Implemented by moving values into unknown fields (clear the declared field,
merge hand-encoded bytes); protobuf keeps unknown fields when serialising.
"""

from __future__ import annotations

from dataclasses import dataclass

from google.protobuf.message import Message

from nomad_plugin.sim import wire

DEFAULT_PACKAGE = "xdm"
MODES = ("package=<name>", "split-services", "extra-fields", "type-clash", "status-shift", "minor-omit-zero")
EXTRA_FIELDS = wire.varint_field(1000, 1) + wire.bytes_field(1001, "xdm-sim-extra")
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
        _move(msg, "health", wire.varint_field(fields["health"].number, int(healthy)))
        _move(msg, "totalMemory", wire.bytes_field(fields["totalMemory"].number, str(total)))
    elif name == "GpuInfo":
        total = int(getattr(msg, "totalMemory", 0))
        _move(msg, "totalMemory", wire.bytes_field(fields["totalMemory"].number, str(total)))
    elif name == "MetricData":
        mid = int(getattr(msg, "metricId", 0))
        _move(msg, "metricId", wire.bytes_field(fields["metricId"].number, str(mid)))


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
        out.MergeFromString(
            wire.varint_field(SHIFTED_STATUS_FIELD, status) + wire.bytes_field(SHIFTED_MESSAGE_FIELD, message)
        )
    _walk(out, drift)
    return out.SerializeToString()
