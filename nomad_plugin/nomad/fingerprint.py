"""Catalog + health verdicts -> Nomad ``FingerprintResponse`` (pure).

Output order is fixed (groups in catalog order, devices in instance order,
attributes by key) so that equal content serialises to equal bytes with
``SerializeToString(deterministic=True)``; the engine relies on that to send
a response only when something changed.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import lru_cache

from nomad_plugin._proto.nomad import attribute_pb2, device_pb2
from nomad_plugin.model.health import HEALTHY, Verdict
from nomad_plugin.model.instances import Attr, AttrValue, Catalog


def to_proto_attribute(attr: Attr) -> attribute_pb2.Attribute:
    """One typed Nomad attribute; the result is shared, callers copy it and never modify it."""
    # The type is part of the cache key: Attr(True) == Attr(1) and they hash alike.
    return _typed_attribute(type(attr.value).__name__, attr.value, attr.unit)


@lru_cache(maxsize=4096)
def _typed_attribute(_type_name: str, value: AttrValue, unit: str) -> attribute_pb2.Attribute:
    # bool before int: bool is an int in Python.
    if isinstance(value, bool):
        return attribute_pb2.Attribute(bool_val=value, unit=unit)
    if isinstance(value, int):
        return attribute_pb2.Attribute(int_val=value, unit=unit)
    if isinstance(value, float):
        return attribute_pb2.Attribute(float_val=value, unit=unit)
    return attribute_pb2.Attribute(string_val=str(value), unit=unit)


def build_response(catalog: Catalog, verdicts: Mapping[str, Verdict]) -> device_pb2.FingerprintResponse:
    """All groups of ``catalog``; an instance without a verdict is healthy."""
    response = device_pb2.FingerprintResponse()
    for group in catalog.groups:
        out = response.device_group.add(
            vendor=group.key.vendor, device_type=group.key.device_type, device_name=group.key.name
        )
        for inst in group.instances:
            verdict = verdicts.get(inst.id, HEALTHY)
            device = out.devices.add(ID=inst.id, healthy=verdict.healthy, health_description=verdict.description)
            if inst.pci_bus_id:
                device.hw_locality.pci_bus_id = inst.pci_bus_id
        for key in sorted(group.attributes):
            out.attributes[key].CopyFrom(to_proto_attribute(group.attributes[key]))
    return response


def serialize(response: device_pb2.FingerprintResponse) -> bytes:
    """Canonical bytes used to decide whether a response changed."""
    return response.SerializeToString(deterministic=True)
