"""Schema-drift detection on parsed XDM responses (R2, R16).

The XDM proto is a reconstruction: field numbers and types are guesses. With
protobuf, a field the reconstruction does not know, or one whose wire type
clashes with the declared type, silently lands in the message's unknown
fields. This module walks every parsed response (recursively) and sorts what
it finds:

- a number the reconstruction does not declare: an *additive* change (a newer
  XDM added a field). Harmless; logged once at info.
- a number the reconstruction declares: a *wire-type clash*, i.e. the
  reconstructed schema is wrong for that field. Logged once at warning as
  "possible schema drift" per message type and field; never fatal.

Generic over any protobuf message, so it imports no generated code.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message
from google.protobuf.unknown_fields import UnknownFieldSet

from nomad_plugin.goplugin.logging import get_logger

log = get_logger(__name__)

WIRE_TYPE_NAMES = {0: "varint", 1: "fixed64", 2: "length-delimited", 3: "start-group", 4: "end-group", 5: "fixed32"}


@dataclass(frozen=True)
class UnknownField:
    """One unknown field found in a parsed message."""

    message_type: str  # full proto name, e.g. "xdm.Device"
    number: int
    wire_type: int
    value: int | bytes | object
    clash: bool  # True: the reconstruction declares this number (wire-type clash)

    @property
    def key(self) -> tuple[str, int, bool]:
        return (self.message_type, self.number, self.clash)

    def describe(self) -> str:
        kind = "wire-type clash" if self.clash else "additive field"
        wire = WIRE_TYPE_NAMES.get(self.wire_type, str(self.wire_type))
        return f"{self.message_type} field {self.number} ({wire}): {kind}, value {_short(self.value)}"


def unknown_fields(msg: Message) -> list[UnknownField]:
    """All unknown fields of ``msg`` and of every message nested in it."""
    found: list[UnknownField] = []
    if has_unknown_fields(msg):
        _walk(msg, found)
    return found


def has_unknown_fields(msg: Message) -> bool:
    """Whether ``msg`` or anything nested in it holds an unknown field, decided in C.

    Why: every XDM response is checked, the exporter's every second (hundreds of
    nested samples), and walking them in Python cost more than the rest of the
    stream path (issue 14). Unknown fields are kept when a message is serialised,
    and each takes at least one byte, so a copy with them discarded (recursively,
    map values included) is smaller exactly when there were any.
    """
    bare = type(msg)()
    bare.CopyFrom(msg)
    bare.DiscardUnknownFields()
    return bare.ByteSize() != msg.ByteSize()


def top_level_unknown_varints(msg: Message) -> list[UnknownField]:
    """Unknown varint fields directly on ``msg`` (R3: a possible error code)."""
    return [u for u in own_unknown_fields(msg) if u.wire_type == 0]


def own_unknown_fields(msg: Message) -> list[UnknownField]:
    """Unknown fields directly on ``msg`` (not in nested messages)."""
    desc = msg.DESCRIPTOR
    declared = {f.number for f in desc.fields}
    out: list[UnknownField] = []
    fields = UnknownFieldSet(msg)
    for index in range(len(fields)):
        item = fields[index]
        out.append(
            UnknownField(desc.full_name, item.field_number, item.wire_type, item.data, item.field_number in declared)
        )
    return out


def _walk(msg: Message, found: list[UnknownField]) -> None:
    found.extend(own_unknown_fields(msg))
    for field, value in msg.ListFields():
        if field.type != FieldDescriptor.TYPE_MESSAGE:
            continue
        entry = field.message_type
        if entry is not None and entry.GetOptions().map_entry:
            value_field = entry.fields_by_name["value"]
            if value_field.type == FieldDescriptor.TYPE_MESSAGE:
                for sub in value.values():
                    _walk(sub, found)
        elif field.is_repeated:
            for sub in value:
                _walk(sub, found)
        else:
            _walk(value, found)


class DriftLog:
    """Remembers what was already reported so each finding is logged once.

    One instance per client. ``findings()`` lets health reporting and tests
    see what was seen (first value kept).
    """

    def __init__(self, logger: logging.Logger | None = None) -> None:
        self._log = logger or log
        self._lock = threading.Lock()
        self._seen: dict[tuple[str, int, bool], UnknownField] = {}

    def inspect(self, msg: Message) -> list[UnknownField]:
        """Walk ``msg``; log new findings; return every unknown field found."""
        found = unknown_fields(msg)
        for item in found:
            self.note(item)
        return found

    def note(self, item: UnknownField) -> None:
        with self._lock:
            if item.key in self._seen:
                return
            self._seen[item.key] = item
        if item.clash:
            self._log.warning("XDM possible schema drift: %s", item.describe())
        else:
            self._log.info("XDM response carries a field the reconstruction lacks: %s", item.describe())

    def warn_once(self, key: str, text: str) -> None:
        """Log a free-form drift warning once per ``key`` (e.g. health unreadable)."""
        with self._lock:
            marker = (key, -1, True)
            if marker in self._seen:
                return
            self._seen[marker] = UnknownField(key, -1, -1, text, True)
        self._log.warning("XDM possible schema drift: %s", text)

    def findings(self) -> list[UnknownField]:
        with self._lock:
            return list(self._seen.values())

    def has_clash(self) -> bool:
        with self._lock:
            return any(item.clash for item in self._seen.values())


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
