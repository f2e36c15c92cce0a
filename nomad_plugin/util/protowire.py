"""Protobuf wire bytes for fields no message declares (the simulator's schema-drift modes send them).

Protobuf has no public encoder for such a field; reading them is protobuf's own
(``google.protobuf.unknown_fields``).
"""

from __future__ import annotations

VARINT, LEN = 0, 2


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
