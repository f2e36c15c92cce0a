"""Protobuf wire format by hand, for messages we have no classes for.

Used by the XDM client's reflection probe, by ``xdm-probe --raw`` (decode
like ``protoc --decode_raw``) and by the simulator's schema-drift modes
(encode fields the reconstructed proto does not declare).
"""

from __future__ import annotations

from collections.abc import Iterator

VARINT, I64, LEN, I32 = 0, 1, 2, 5


class WireError(ValueError):
    """The bytes are not a well-formed protobuf message."""


def read_varint(data: bytes, pos: int) -> tuple[int, int]:
    result = 0
    shift = 0
    while True:
        if pos >= len(data):
            raise WireError("truncated varint")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise WireError("varint too long")


def iter_fields(data: bytes) -> Iterator[tuple[int, int, int | bytes]]:
    """Yield (field number, wire type, value); value is int or bytes."""
    pos = 0
    while pos < len(data):
        key, pos = read_varint(data, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = read_varint(data, pos)
            yield number, wire, value
        elif wire == 1:
            if pos + 8 > len(data):
                raise WireError("truncated fixed64")
            yield number, wire, data[pos : pos + 8]
            pos += 8
        elif wire == 2:
            size, pos = read_varint(data, pos)
            if pos + size > len(data):
                raise WireError("truncated length-delimited field")
            yield number, wire, data[pos : pos + size]
            pos += size
        elif wire == 5:
            if pos + 4 > len(data):
                raise WireError("truncated fixed32")
            yield number, wire, data[pos : pos + 4]
            pos += 4
        else:
            raise WireError(f"unsupported wire type {wire}")


def encode_len_field(number: int, payload: bytes) -> bytes:
    return tag(number, LEN) + varint(len(payload)) + payload


def tag(number: int, wire_type: int) -> bytes:
    return varint(number << 3 | wire_type)


def varint(value: int) -> bytes:
    if value < 0:
        value &= (1 << 64) - 1  # two's complement, as int32/int64 negatives are sent
    out = bytearray()
    while True:
        bits = value & 0x7F
        value >>= 7
        if value:
            out.append(bits | 0x80)
        else:
            out.append(bits)
            return bytes(out)
