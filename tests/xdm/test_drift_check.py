"""Drift detection finds an unknown field however deep it sits: at the top, in a repeated
message, in a map's message value; a clean message has none."""

from __future__ import annotations

import pytest
from google.protobuf.message import Message

from nomad_plugin._proto.lingjun import api_outer_pb2 as pb
from nomad_plugin._proto.nomad import stats_pb2
from nomad_plugin.xdm.adapter import unknown_fields

UNKNOWN_VARINT = b"\xf8\x07\x01"  # field 127, varint 1: declared nowhere here


def _with_unknown(msg: Message) -> Message:
    return type(msg).FromString(msg.SerializeToString() + UNKNOWN_VARINT)


def _top() -> Message:
    return _with_unknown(pb.ExporterDataResponse(dataList=[pb.MetricData(device="0", metricId=1, value=2.0)]))


def _in_repeated() -> Message:
    resp = pb.ExporterDataResponse(dataList=[pb.MetricData(device="0", metricId=1, value=2.0)])
    resp.dataList.append(_with_unknown(pb.MetricData(device="1", metricId=2, labels={"allocation_id": "a"})))
    return resp


def _in_map_value() -> Message:
    obj = stats_pb2.StatObject()
    obj.nested["xdm"].attributes["Health"].CopyFrom(_with_unknown(stats_pb2.StatValue(unit="%", desc="d")))
    return obj


def _clash() -> Message:
    # field 1 (device, a string) sent as a varint: lands in the unknown fields as a wire-type clash
    inner = b"\x08\x05"
    return pb.ExporterDataResponse.FromString(b"\x1a" + bytes([len(inner)]) + inner)


@pytest.mark.parametrize(
    ("build", "where", "clash"),
    [
        (_top, "xdm.ExporterDataResponse", False),
        (_in_repeated, "xdm.MetricData", False),
        (_in_map_value, "hashicorp.nomad.plugins.shared.structs.StatValue", False),
        (_clash, "xdm.MetricData", True),
    ],
)
def test_an_unknown_field_anywhere_is_seen(build: object, where: str, clash: bool) -> None:
    (found,) = unknown_fields(build())  # type: ignore[operator]
    assert (found.message_type, found.clash) == (where, clash)
    assert found.number == (1 if clash else 127)


def test_a_clean_message_has_none() -> None:
    resp = pb.ExporterDataResponse(
        dataList=[
            pb.MetricData(device=str(i), metricId=i, value=i / 3, labels={"allocation_id": f"g{i}"}) for i in range(50)
        ]
    )
    obj = stats_pb2.StatObject()
    obj.nested["xdm"].attributes["Health"].CopyFrom(stats_pb2.StatValue(unit="%", desc="d"))
    for msg in (resp, obj, pb.ExporterDataResponse()):
        assert unknown_fields(msg) == []
