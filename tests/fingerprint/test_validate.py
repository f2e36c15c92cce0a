"""validate.sanitize and fingerprint.build_response: nothing invalid reaches Nomad."""

from __future__ import annotations

import math

from nomad_plugin._proto.nomad import attribute_pb2, device_pb2
from nomad_plugin.config.model import CardRule, PluginConfig
from nomad_plugin.model.instances import Attr, Catalog, GroupKey, Instance, InstanceGroup, Kind
from nomad_plugin.nomad.catalog import build_catalog
from nomad_plugin.nomad.fingerprint import (
    KNOWN_UNITS,
    Verdict,
    attribute_problem,
    build_response,
    sanitize,
    serialize,
    to_proto_attribute,
)

from .helpers import h800_node, m890p_node


def _group(**attrs: attribute_pb2.Attribute) -> device_pb2.FingerprintResponse:
    resp = device_pb2.FingerprintResponse()
    g = resp.device_group.add(vendor="nvidia", device_type="gpu", device_name="X")
    g.devices.add(ID="a", healthy=True)
    for key, value in attrs.items():
        g.attributes[key].CopyFrom(value)
    return resp


def test_invalid_unit_is_caught_before_sending():
    resp = _group(
        util=attribute_pb2.Attribute(int_val=50, unit="%"),
        temp=attribute_pb2.Attribute(int_val=40, unit="C"),
        clock=attribute_pb2.Attribute(int_val=1, unit="Hz"),
        memory=attribute_pb2.Attribute(int_val=80, unit="GiB"),
    )
    clean, found = sanitize(resp)
    assert sorted(clean.device_group[0].attributes) == ["memory"]
    assert len(found) == 3 and all("unknown unit" in p for p in found)
    assert "'%'" in " ".join(found)
    # the input is untouched
    assert len(resp.device_group[0].attributes) == 4


def test_attribute_rules():
    assert attribute_problem("x", attribute_pb2.Attribute()) == "attribute 'x': no attribute value set"
    assert "non-numeric" in (attribute_problem("x", attribute_pb2.Attribute(string_val="80", unit="GiB")) or "")
    assert "non-numeric" in (attribute_problem("x", attribute_pb2.Attribute(bool_val=True, unit="W")) or "")
    assert "non-finite" in (attribute_problem("x", attribute_pb2.Attribute(float_val=math.nan)) or "")
    assert attribute_problem("", attribute_pb2.Attribute(int_val=1)) == "empty attribute key"
    assert attribute_problem("x", attribute_pb2.Attribute(float_val=1.5, unit="GHz")) is None
    assert attribute_problem("x", attribute_pb2.Attribute(int_val=9, unit="MB/s")) is None
    assert attribute_problem("x", attribute_pb2.Attribute(string_val="")) is None  # oneof set to ""
    assert {"MiB", "GiB", "MHz", "W", "MB/s", "KiB/s", "mW"} <= KNOWN_UNITS
    assert not {"%", "C", "Hz", "B", ""} & KNOWN_UNITS


def test_groups_and_devices_rules():
    resp = device_pb2.FingerprintResponse()
    resp.device_group.add(vendor="", device_type="gpu", device_name="A").devices.add(ID="1")
    resp.device_group.add(vendor="v", device_type="gpu", device_name="").devices.add(ID="2")
    ok = resp.device_group.add(vendor="v", device_type="gpu", device_name="B")
    ok.devices.add(ID="")
    ok.devices.add(ID="3", healthy=True)
    ok.devices.add(ID="3", healthy=False)
    resp.device_group.add(vendor="v", device_type="gpu", device_name="B").devices.add(ID="4")
    clean, found = sanitize(resp)
    assert [(g.device_name, [d.ID for d in g.devices]) for g in clean.device_group] == [("B", ["3"])]
    assert clean.device_group[0].devices[0].healthy is True
    assert len(found) == 5
    assert any("empty vendor" in p for p in found) and any("empty device_name" in p for p in found)
    assert any("without ID" in p for p in found) and any("duplicate device ID '3'" in p for p in found)
    assert any("duplicate device group v/gpu/B" in p for p in found)


def test_valid_response_passes_unchanged():
    cfg = PluginConfig(group_by="numa", cards=(CardRule("1", "tdm"), CardRule("2", "mig")))
    resp = build_response(build_catalog(h800_node(), cfg), {})
    clean, found = sanitize(resp)
    assert found == []
    assert serialize(clean) == serialize(resp)
    assert sanitize(build_response(build_catalog(m890p_node(), PluginConfig(default_mode="tdm")), {}))[1] == []


def test_build_response_shape():
    inv = h800_node(2)
    cat = build_catalog(inv, PluginConfig())
    uuid1 = inv.cards[1].uuid
    resp = build_response(cat, {uuid1: Verdict(False, "XID 79")})
    (g,) = resp.device_group
    assert (g.vendor, g.device_type, g.device_name) == ("nvidia", "gpu", "NVIDIA H800")
    assert [(d.ID, d.healthy, d.health_description) for d in g.devices] == [
        (inv.cards[0].uuid, True, ""),
        (uuid1, False, "XID 79"),
    ]
    assert g.devices[0].hw_locality.pci_bus_id == "0000:18:00.0"
    assert g.attributes["memory"].int_val == 81559 and g.attributes["memory"].unit == "MiB"
    assert g.attributes["driver_version"].string_val == "535.161.08"


def test_attribute_types_bool_before_int():
    assert to_proto_attribute(Attr(True)).WhichOneof("value") == "bool_val"
    assert to_proto_attribute(Attr(3, "GiB")).WhichOneof("value") == "int_val"
    assert to_proto_attribute(Attr(1.5)).WhichOneof("value") == "float_val"
    assert to_proto_attribute(Attr("x")).WhichOneof("value") == "string_val"


def test_unchanged_content_serialises_identically():
    cfg = PluginConfig(default_mode="tdm")
    a = serialize(build_response(build_catalog(h800_node(), cfg), {}))
    b = serialize(build_response(build_catalog(h800_node(), cfg), {}))
    assert a == b


def test_catalog_attribute_with_bad_unit_is_dropped_not_sent():
    inst = Instance("id-1", Kind.WHOLE, "id-1", 0)
    cat = Catalog(
        (InstanceGroup(GroupKey("nvidia", "gpu", "X"), (inst,), {"temp": Attr(41, "C"), "memory": Attr(1, "MiB")}),)
    )
    clean, found = sanitize(build_response(cat, {}))
    assert list(clean.device_group[0].attributes) == ["memory"]
    assert found == ["dropped attribute 'temp': unknown unit 'C' in nvidia/gpu/X"]


def test_attribute_cache_keeps_equal_values_of_different_types_apart():
    # True == 1 == 1.0 and they hash alike; each must keep its own Nomad type.
    assert to_proto_attribute(Attr(1)).WhichOneof("value") == "int_val"
    assert to_proto_attribute(Attr(True)).WhichOneof("value") == "bool_val"
    assert to_proto_attribute(Attr(1.0)).WhichOneof("value") == "float_val"
    assert to_proto_attribute(Attr(1, "GiB")).unit == "GiB"


def _two_groups() -> device_pb2.FingerprintResponse:
    resp = device_pb2.FingerprintResponse()
    for name in ("A", "B"):
        g = resp.device_group.add(vendor="nvidia", device_type="gpu", device_name=name)
        g.devices.add(ID=f"{name}-0", healthy=True)
        g.devices.add(ID=f"{name}-1", healthy=True)
        g.attributes["memory"].CopyFrom(attribute_pb2.Attribute(int_val=80, unit="GiB"))
    return resp


def test_a_valid_response_is_returned_as_is_without_a_copy():
    resp = _two_groups()
    clean, found = sanitize(resp)
    assert clean is resp and found == []


def _fault(name: str) -> device_pb2.FingerprintResponse:
    resp = _two_groups()
    a = resp.device_group[0]
    if name == "empty vendor":
        a.vendor = ""
    elif name == "empty device_type":
        a.device_type = ""
    elif name == "empty device_name":
        a.device_name = ""
    elif name == "duplicate group":
        resp.device_group[1].device_name = "A"
    elif name == "device without ID":
        a.devices[1].ID = ""
    elif name == "duplicate ID":
        a.devices[1].ID = "A-0"
    elif name == "empty attribute key":
        a.attributes[""].CopyFrom(attribute_pb2.Attribute(int_val=1))
    return resp


FAULTS = (
    "empty vendor",
    "empty device_type",
    "empty device_name",
    "duplicate group",
    "device without ID",
    "duplicate ID",
    "empty attribute key",
)


def test_each_rule_alone_is_caught():
    """One fault at a time, so no other rule can hide a rule that stopped working."""
    for name in FAULTS:
        resp = _fault(name)
        clean, found = sanitize(resp)
        assert len(found) == 1, (name, found)
        assert sanitize(clean)[1] == [], name
        assert clean is not resp, name


def test_cleaning_keeps_every_valid_group_and_its_identity():
    resp = _fault("device without ID")
    resp.device_group.add(vendor="nvidia", device_type="gpu", device_name="A").devices.add(ID="dup")  # duplicate
    resp.device_group.add(vendor="amd", device_type="gpu", device_name="C").devices.add(ID="C-0")
    clean, found = sanitize(resp)
    assert [(g.vendor, g.device_type, g.device_name) for g in clean.device_group] == [
        ("nvidia", "gpu", "A"),
        ("nvidia", "gpu", "B"),
        ("amd", "gpu", "C"),
    ]
    assert [[d.ID for d in g.devices] for g in clean.device_group] == [["A-0"], ["B-0", "B-1"], ["C-0"]]
    assert found == [
        "dropped a device without ID in nvidia/gpu/A",
        "dropped duplicate device group nvidia/gpu/A",
    ]


def test_a_dropped_attribute_does_not_take_the_later_ones_with_it():
    resp = _two_groups()
    g = resp.device_group[0]
    g.attributes["a_bad"].CopyFrom(attribute_pb2.Attribute(int_val=1, unit="C"))
    g.attributes["z_good"].CopyFrom(attribute_pb2.Attribute(bool_val=True))
    clean, found = sanitize(resp)
    assert sorted(clean.device_group[0].attributes) == ["memory", "z_good"]
    assert found == ["dropped attribute 'a_bad': unknown unit 'C' in nvidia/gpu/A"]


def test_a_dropped_duplicate_device_does_not_take_the_later_ones_with_it():
    resp = _two_groups()
    resp.device_group[0].devices.add(ID="A-0", healthy=False)
    resp.device_group[0].devices.add(ID="A-2", healthy=True)
    clean, found = sanitize(resp)
    assert [d.ID for d in clean.device_group[0].devices] == ["A-0", "A-1", "A-2"]
    assert found == ["dropped duplicate device ID 'A-0' in nvidia/gpu/A"]
