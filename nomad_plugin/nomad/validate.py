"""Nomad's fingerprint validation rules, applied before anything is sent.

Nomad drops a device plugin until the agent restarts when one fingerprint
fails validation (nomad-protocol.md §5.2): an empty vendor/type/name, a device
without ID, an attribute with no value, or a unit Nomad does not know. So
every outgoing ``FingerprintResponse`` goes through :func:`sanitize`, which
removes what Nomad would reject and reports it, instead of losing the node.

Beyond Nomad's own checks this also drops duplicate instance IDs inside a
group and duplicate vendor/type/name triples (the scheduler keys on both, so
a duplicate would silently shadow the other), empty attribute keys and
non-finite floats (they cannot be compared by constraints).
"""

from __future__ import annotations

import math

from nomad_plugin._proto.nomad import attribute_pb2, device_pb2
from nomad_plugin.util.text import has_unsafe, printable

# Nomad's ``plugins/shared/structs/units.go``: every unit an attribute may carry.
_BYTE_UNITS = ("KiB", "MiB", "GiB", "TiB", "PiB", "EiB", "kB", "KB", "MB", "GB", "TB", "PB", "EB")
KNOWN_UNITS: frozenset[str] = frozenset(
    (
        *_BYTE_UNITS,
        *(f"{u}/s" for u in _BYTE_UNITS),
        "MHz",
        "GHz",
        "mW",
        "W",
        "kW",
        "MW",
        "GW",
    )
)

_VALUE_FIELDS = ("float_val", "int_val", "string_val", "bool_val")


def attribute_problem(key: str, attr: attribute_pb2.Attribute) -> str | None:
    """Why Nomad would reject this attribute, or None if it is valid."""
    if not key:
        return "empty attribute key"
    which = attr.WhichOneof("value")
    if which is None:
        return f"attribute {key!r}: no attribute value set"
    if which == "float_val" and not math.isfinite(attr.float_val):
        return f"attribute {key!r}: non-finite float {attr.float_val!r}"
    if attr.unit:
        if attr.unit not in KNOWN_UNITS:
            return f"attribute {key!r}: unknown unit {attr.unit!r}"
        if which not in ("int_val", "float_val"):
            return f"attribute {key!r}: unit {attr.unit!r} on a non-numeric {which}"
    return None


def group_problem(group: device_pb2.DeviceGroup) -> str | None:
    """Why Nomad would reject the whole group (missing vendor/type/name)."""
    for field in ("vendor", "device_type", "device_name"):
        value = getattr(group, field)
        if not value:
            return f"device group {_group_label(group)}: empty {field}"
        if "/" in value or has_unsafe(value):
            # Nomad names a group vendor/type/name in job specs; a control character would also
            # forge lines in the agent's log (the backends clean names: this is the last guard).
            return f"device group {_group_label(group)}: {field} {value!r} holds '/' or a control character"
    return None


def _group_label(group: device_pb2.DeviceGroup) -> str:
    return printable(f"{group.vendor}/{group.device_type}/{group.device_name}", 200)


def problems(response: device_pb2.FingerprintResponse) -> list[str]:
    """Every rule violation in ``response`` (empty list = Nomad accepts it)."""
    return sanitize(response)[1]


def _is_valid(response: device_pb2.FingerprintResponse) -> bool:
    keys: set[tuple[str, str, str]] = set()
    for group in response.device_group:
        key = (group.vendor, group.device_type, group.device_name)
        if group_problem(group) is not None or key in keys:
            return False
        keys.add(key)
        ids = [device.ID for device in group.devices]
        if not all(ids) or len(set(ids)) != len(ids):
            return False
        if any(attribute_problem(k, a) is not None for k, a in group.attributes.items()):
            return False
    return True


def sanitize(
    response: device_pb2.FingerprintResponse,
) -> tuple[device_pb2.FingerprintResponse, list[str]]:
    """Return a response without anything Nomad would reject, and what was removed.

    The input is never modified: a valid response is returned as is (the
    common case, so no copy is made), an invalid one as a cleaned copy.
    """
    if _is_valid(response):
        return response, []
    found: list[str] = []
    out = device_pb2.FingerprintResponse()
    seen_keys: set[tuple[str, str, str]] = set()
    for group in response.device_group:
        reason = group_problem(group)
        if reason is not None:
            found.append(f"dropped {reason}")
            continue
        key = (group.vendor, group.device_type, group.device_name)
        if key in seen_keys:
            found.append(f"dropped duplicate device group {_group_label(group)}")
            continue
        seen_keys.add(key)
        clean = out.device_group.add(vendor=group.vendor, device_type=group.device_type, device_name=group.device_name)
        seen_ids: set[str] = set()
        for device in group.devices:
            if not device.ID:
                found.append(f"dropped a device without ID in {_group_label(group)}")
                continue
            if device.ID in seen_ids:
                found.append(f"dropped duplicate device ID {device.ID!r} in {_group_label(group)}")
                continue
            seen_ids.add(device.ID)
            clean.devices.append(device)
        for attr_key in sorted(group.attributes):
            attr = group.attributes[attr_key]
            reason = attribute_problem(attr_key, attr)
            if reason is not None:
                found.append(f"dropped {reason} in {_group_label(group)}")
                continue
            clean.attributes[attr_key].CopyFrom(attr)
    return out, found
