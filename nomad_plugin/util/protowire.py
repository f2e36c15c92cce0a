"""Protobuf's wire format for messages the plugin has no classes for.

Reading is protobuf's own: the bytes parse as an ``Empty``, whose unknown fields are all of them
(``google.protobuf.unknown_fields``). The XDM client's reflection probe, ``xdm-probe --raw`` and the
XDM capture read raw fields so. Protobuf has no public encoder for a field that no message declares,
so the few bytes the reflection probe and the simulator's schema-drift modes send are written here.
"""

from __future__ import annotations

from collections.abc import Iterator

VARINT, I64, LEN, I32 = 0, 1, 2, 5


class WireError(ValueError):
    """The bytes are not a well-formed protobuf message."""


def iter_fields(data: bytes) -> Iterator[tuple[int, int, int | bytes]]:
    """(field number, wire type, value) in wire order: an int for a varint, the raw bytes otherwise."""
    from google.protobuf import empty_pb2, message, unknown_fields

    holder = empty_pb2.Empty()
    try:
        holder.ParseFromString(data)
    except message.DecodeError as exc:
        raise WireError(str(exc)) from None
    fields = unknown_fields.UnknownFieldSet(holder)
    for index in range(len(fields)):
        number, wire, value = fields[index].field_number, fields[index].wire_type, fields[index].data
        if wire in (VARINT, LEN):
            yield number, wire, value
        elif wire in (I64, I32):
            yield number, wire, value.to_bytes(8 if wire == I64 else 4, "little")
        else:
            raise WireError(f"unsupported wire type {wire}")  # a group: proto3 has none


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
