"""``protoc --decode_raw`` for XDM responses: field numbers, wire types, best-guess values.

The XDM proto is a reconstruction (xdm-api.md, risk R2); on a real node an
engineer re-derives the schema from the raw bytes. Length-delimited fields
are shown as a nested message when they parse as one, else as a string when
they are printable UTF-8, else as hex; fixed32/64 also show their float
reading.
"""

from __future__ import annotations

import struct

from nomad_plugin.util.protowire import WireError, iter_fields

WIRE_NAMES = {0: "varint", 1: "fixed64", 2: "len", 5: "fixed32"}
MAX_DEPTH = 12


def _printable(data: bytes) -> str | None:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return None
    return text if all(ch.isprintable() or ch in "\n\t" for ch in text) else None


def _as_message(data: bytes) -> list[tuple[int, int, int | bytes]] | None:
    if not data:
        return None
    try:
        fields = list(iter_fields(data))
    except WireError:
        return None
    return fields if fields and all(0 < n < 1 << 29 for n, _, _ in fields) else None


def decode_raw(data: bytes, indent: str = "", depth: int = 0) -> list[str]:
    """Lines like ``3 (len) {`` / ``  1 (varint): 7`` / ``}``; an error line for malformed bytes."""
    try:
        fields = list(iter_fields(data))
    except WireError as exc:
        return [f"{indent}<not a protobuf message: {exc}; {len(data)} bytes: {data[:32].hex()}>"]
    lines: list[str] = []
    for number, wire, value in fields:
        head = f"{indent}{number} ({WIRE_NAMES.get(wire, wire)})"
        if isinstance(value, int):
            signed = value - (1 << 64) if value >= 1 << 63 else value
            lines.append(f"{head}: {value}" + (f"  (int64 {signed})" if signed != value else ""))
        elif wire == 1:
            lines.append(
                f"{head}: 0x{value.hex()}  (fixed64 {struct.unpack('<q', value)[0]}, double {struct.unpack('<d', value)[0]!r})"
            )
        elif wire == 5:
            lines.append(
                f"{head}: 0x{value.hex()}  (fixed32 {struct.unpack('<i', value)[0]}, float {struct.unpack('<f', value)[0]!r})"
            )
        else:
            text = _printable(value)
            nested = _as_message(value) if depth < MAX_DEPTH else None
            if nested is not None and (text is None or len(text) < 2 or not text.isprintable()):
                lines.append(f"{head} {{")
                lines += decode_raw(value, indent + "  ", depth + 1)
                lines.append(f"{indent}}}")
            elif text is not None:
                lines.append(f"{head}: {text!r}")
            else:
                lines.append(f"{head}: <{len(value)} bytes> {value[:64].hex()}")
    return lines
