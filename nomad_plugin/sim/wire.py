"""Protobuf wire-format helpers: hand-encoding for the schema-drift modes,
and a raw decoder (like ``protoc --decode_raw``) for checking what went out."""

from __future__ import annotations

from dataclasses import dataclass

from nomad_plugin.util.protowire import I32, I64, LEN, VARINT, iter_fields, tag, varint

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
