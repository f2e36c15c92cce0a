"""The C-side check that lets drift detection skip its Python walk (issue 14).

``has_unknown_fields`` must say True exactly when the walk would find
something, however deep the unknown field sits: at the top, in a repeated
message, in a map's message value.
"""

from __future__ import annotations

import pytest
from google.protobuf.message import Message

from nomad_plugin._proto.lingjun import api_outer_pb2 as pb
from nomad_plugin._proto.nomad import stats_pb2
from nomad_plugin.xdm.adapter import _walk, has_unknown_fields, unknown_fields

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


@pytest.mark.parametrize("build", [_top, _in_repeated, _in_map_value, _clash])
def test_an_unknown_field_anywhere_is_seen(build: object) -> None:
    msg = build()  # type: ignore[operator]
    walked: list[object] = []
    _walk(msg, walked)  # type: ignore[arg-type]
    assert walked, "the test message must really carry an unknown field"
    assert has_unknown_fields(msg)
    assert unknown_fields(msg) == walked


def test_a_clean_message_needs_no_walk() -> None:
    resp = pb.ExporterDataResponse(
        dataList=[
            pb.MetricData(device=str(i), metricId=i, value=i / 3, labels={"allocation_id": f"g{i}"}) for i in range(50)
        ]
    )
    obj = stats_pb2.StatObject()
    obj.nested["xdm"].attributes["Health"].CopyFrom(stats_pb2.StatValue(unit="%", desc="d"))
    for msg in (resp, obj, pb.ExporterDataResponse()):
        assert not has_unknown_fields(msg)
        assert unknown_fields(msg) == []
