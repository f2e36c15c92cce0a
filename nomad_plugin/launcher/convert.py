"""Protobuf messages from the plugin -> :mod:`nomad_plugin.nomad_view.types` values."""

from __future__ import annotations

from typing import Any

from nomad_plugin.nomad_view.types import (
    Attribute,
    Device,
    DeviceGroup,
    InstanceStats,
    Reservation,
    StatValue,
)


def attribute(msg: Any) -> Attribute:
    kind = msg.WhichOneof("value")
    value = getattr(msg, kind) if kind else ""
    return Attribute(value, msg.unit)


def device_groups(resp: Any) -> list[DeviceGroup]:
    """A FingerprintResponse -> groups (in the order the plugin sent them)."""
    groups = []
    for g in resp.device_group:
        devices = tuple(
            Device(d.ID, d.healthy, d.health_description, d.hw_locality.pci_bus_id if d.HasField("hw_locality") else "")
            for d in g.devices
        )
        attrs = {key: attribute(a) for key, a in g.attributes.items()}
        groups.append(DeviceGroup(g.vendor, g.device_type, g.device_name, devices, attrs))
    return groups


def stat_value(msg: Any) -> StatValue:
    """Nomad's rendering priority: bool, string, float, int (nomad-protocol.md §5.7)."""
    value: Any = None
    denominator: Any = None
    if msg.HasField("bool_val"):
        value = msg.bool_val.value
    elif msg.HasField("string_val"):
        value = msg.string_val.value
    elif msg.HasField("float_numerator_val"):
        value = msg.float_numerator_val.value
        if msg.HasField("float_denominator_val"):
            denominator = msg.float_denominator_val.value
    elif msg.HasField("int_numerator_val"):
        value = msg.int_numerator_val.value
        if msg.HasField("int_denominator_val"):
            denominator = msg.int_denominator_val.value
    return StatValue(value, denominator, msg.unit)


def flatten(obj: Any, prefix: str = "") -> dict[str, StatValue]:
    """A StatObject -> ``{"xdm.SM clock": value, ...}`` (nested names joined with ``.``)."""
    out = {f"{prefix}{key}": stat_value(v) for key, v in obj.attributes.items()}
    for name, nested in obj.nested.items():
        out.update(flatten(nested, f"{prefix}{name}."))
    return out


def stats(resp: Any) -> list[InstanceStats]:
    """A StatsResponse -> one entry per instance."""
    out = []
    for g in resp.groups:
        group = f"{g.vendor}/{g.type}/{g.name}"
        for device_id, ds in sorted(g.instance_stats.items()):
            summary = stat_value(ds.summary) if ds.HasField("summary") else None
            flat = flatten(ds.stats) if ds.HasField("stats") else {}
            when = ds.timestamp.seconds + ds.timestamp.nanos / 1e9 if ds.HasField("timestamp") else 0.0
            out.append(InstanceStats(group, device_id, summary, flat, when))
    return out


def reservation(resp: Any) -> Reservation:
    res = resp.container_res
    return Reservation(
        envs=dict(res.envs),
        mounts=tuple((m.task_path, m.host_path, m.read_only) for m in res.mounts),
        devices=tuple((d.task_path, d.host_path, d.permissions) for d in res.devices),
    )
