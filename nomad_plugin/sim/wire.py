"""Protobuf wire-format helpers: hand-encoding for the schema-drift modes,
and a raw decoder (like ``protoc --decode_raw``) for checking what went out."""

from __future__ import annotations

from dataclasses import dataclass

VARINT, I64, LEN, I32 = 0, 1, 2, 5


def varint(value: int) -> bytes:
    if value < 0:
        value &= (1 << 64) - 1  # two's complement, as int32/int64 negatives are sent
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def tag(number: int, wire_type: int) -> bytes:
    return varint(number << 3 | wire_type)


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


def _read_varint(data: bytes, pos: int) -> tuple[int, int]:
    shift = result = 0
    while True:
        if pos >= len(data):
            raise ValueError("truncated varint")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7


def decode_raw(data: bytes) -> list[RawField]:
    """Top-level fields of a serialised message, in wire order."""
    fields: list[RawField] = []
    pos = 0
    while pos < len(data):
        key, pos = _read_varint(data, pos)
        number, wire_type = key >> 3, key & 7
        value: int | bytes
        if wire_type == VARINT:
            value, pos = _read_varint(data, pos)
        elif wire_type == I64:
            value, pos = data[pos : pos + 8], pos + 8
        elif wire_type == I32:
            value, pos = data[pos : pos + 4], pos + 4
        elif wire_type == LEN:
            length, pos = _read_varint(data, pos)
            value, pos = data[pos : pos + length], pos + length
        else:
            raise ValueError(f"unsupported wire type {wire_type} at field {number}")
        fields.append(RawField(number, wire_type, value))
    return fields
