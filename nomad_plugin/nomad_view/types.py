"""Plain views of what the plugin sends Nomad, and their text as the Nomad CLI prints it.

The launcher converts protobuf into these, so the operator commands and the job-spec evaluator
never import generated code. Text follows Nomad's command/node_status.go and alloc_status.go.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any, TextIO

AttrValue = int | float | str | bool


@dataclass(frozen=True)
class Attribute:
    """A device-group attribute: a value and an optional Nomad unit (MiB, GiB, MHz, W, ...)."""

    value: AttrValue
    unit: str = ""

    def render(self) -> str:
        """``key = value unit`` right-hand side, as ``nomad node status -verbose`` prints it."""
        text = ("true" if self.value else "false") if isinstance(self.value, bool) else str(self.value)
        return f"{text} {self.unit}" if self.unit else text


@dataclass(frozen=True)
class Device:
    id: str
    healthy: bool
    health_description: str = ""
    pci_bus_id: str = ""


@dataclass(frozen=True)
class DeviceGroup:
    """One fingerprinted group: Nomad fills a job's ``device`` request from one of these."""

    vendor: str
    type: str
    name: str
    devices: tuple[Device, ...] = ()
    attributes: dict[str, Attribute] = field(default_factory=dict)

    @property
    def full_name(self) -> str:
        return f"{self.vendor}/{self.type}/{self.name}"

    @property
    def healthy_ids(self) -> list[str]:
        return [d.id for d in self.devices if d.healthy]

    def to_json(self) -> dict[str, Any]:
        return {
            "vendor": self.vendor,
            "type": self.type,
            "name": self.name,
            "attributes": {k: asdict(a) for k, a in sorted(self.attributes.items())},
            "devices": [asdict(d) for d in self.devices],
        }


def group_from_json(data: dict[str, Any]) -> DeviceGroup:
    """The inverse of :meth:`DeviceGroup.to_json` (fingerprints saved by ``fingerprint --json``)."""
    attrs = {k: Attribute(v["value"], v.get("unit", "")) for k, v in data.get("attributes", {}).items()}
    devices = tuple(
        Device(d["id"], bool(d.get("healthy", True)), d.get("health_description", ""), d.get("pci_bus_id", ""))
        for d in data.get("devices", [])
    )
    return DeviceGroup(data["vendor"], data["type"], data["name"], devices, attrs)


@dataclass(frozen=True)
class StatValue:
    """One stats value: numerator (number, string or bool), optional denominator, unit."""

    value: float | int | str | bool | None
    denominator: float | int | None = None
    unit: str = ""

    def render(self) -> str:
        """As the Nomad CLI prints it: floats with 3 decimals, ``a / b``, unit after a space."""
        if self.value is None:
            text = "N/A"
        elif isinstance(self.value, bool):
            text = "true" if self.value else "false"
        elif isinstance(self.value, float):
            text = f"{self.value:.3f}"
        else:
            text = str(self.value)
        if self.denominator is not None:
            den = f"{self.denominator:.3f}" if isinstance(self.denominator, float) else str(self.denominator)
            text = f"{text} / {den}"
        return f"{text} {self.unit}" if self.unit else text

    def to_json(self) -> dict[str, Any]:
        return {"value": self.value, "denominator": self.denominator, "unit": self.unit, "text": self.render()}


@dataclass(frozen=True)
class InstanceStats:
    """One instance's stats: the summary and every attribute flattened with ``.``."""

    group: str
    device_id: str
    summary: StatValue | None
    stats: dict[str, StatValue]
    timestamp: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "group": self.group,
            "device_id": self.device_id,
            "summary": self.summary.to_json() if self.summary else None,
            "stats": {k: v.to_json() for k, v in sorted(self.stats.items())},
            "timestamp": self.timestamp,
        }


@dataclass(frozen=True)
class Reservation:
    """What Reserve returned: the task's environment, mounts and device nodes."""

    envs: dict[str, str]
    mounts: tuple[tuple[str, str, bool], ...] = ()  # (task_path, host_path, read_only)
    devices: tuple[tuple[str, str, str], ...] = ()  # (task_path, host_path, permissions)

    def to_json(self) -> dict[str, Any]:
        return {
            "envs": dict(sorted(self.envs.items())),
            "mounts": [{"task_path": t, "host_path": h, "read_only": r} for t, h, r in self.mounts],
            "devices": [{"task_path": t, "host_path": h, "permissions": p} for t, h, p in self.devices],
        }


_CODES = {"bold": "1", "dim": "2", "red": "31", "green": "32", "yellow": "33", "cyan": "36"}


class Style:
    """ANSI styling that turns itself off for pipes, files and NO_COLOR."""

    def __init__(self, stream: TextIO) -> None:
        self.enabled = stream.isatty() and not os.environ.get("NO_COLOR")

    def __call__(self, text: str, *names: str) -> str:
        if not self.enabled or not names:
            return text
        return f"\x1b[{';'.join(_CODES[n] for n in names)}m{text}\x1b[0m"


def aligned(pairs: Iterable[tuple[str, str]], indent: str = "") -> list[str]:
    items = list(pairs)
    width = max((len(k) for k, _ in items), default=0)
    return [f"{indent}{k:<{width}} = {v}" for k, v in items]


def table(rows: list[list[str]]) -> list[str]:
    """Columns padded to their widest cell, two spaces apart; the last column is not padded."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    return ["  ".join([*(c.ljust(w) for c, w in zip(r, widths, strict=False)), r[-1]]).rstrip() for r in rows]


def fingerprint_text(groups: list[DeviceGroup], style: Style, with_devices: bool = True) -> list[str]:
    """Each group as "Device Group Attributes", then its instances with health and locality."""
    if not groups:
        return ["(no devices fingerprinted)"]
    lines: list[str] = []
    for g in groups:
        healthy = f"  ({len(g.healthy_ids)}/{len(g.devices)} healthy)"
        lines.append(style(f"Device Group Attributes: {g.full_name}", "bold") + style(healthy, "dim"))
        lines += aligned(((k, a.render()) for k, a in sorted(g.attributes.items())), "  ")
        for d in g.devices if with_devices else ():
            mark = style("healthy", "green") if d.healthy else style(f"unhealthy: {d.health_description}", "red")
            lines.append(f"  {g.full_name}[{d.id}]{f' pci {d.pci_bus_id}' if d.pci_bus_id else ''}  {mark}")
        lines.append("")
    return lines


SUMMARY_ATTRIBUTES = ("memory", "share_memory", "share_core_percent", "mig_slices", "numa_node", "pci_bus_id")


def fingerprint_summary(groups: list[DeviceGroup], style: Style) -> list[str]:
    """One line per group with the attributes jobs constrain on most, then the unhealthy instances."""
    if not groups:
        return ["(no devices fingerprinted)"]
    shown = [a for a in SUMMARY_ATTRIBUTES if any(a in g.attributes for g in groups)]
    rows = [["GROUP", "INSTANCES", "HEALTHY", *shown]] + [
        [g.full_name, str(len(g.devices)), str(len(g.healthy_ids))]
        + [g.attributes[a].render() if a in g.attributes else "-" for a in shown]
        for g in groups
    ]
    header, *lines = table(rows)
    lines = [style(header, "bold"), *lines]
    sick = [(g, d) for g in groups for d in g.devices if not d.healthy]
    if sick:
        lines += ["", style(f"{len(sick)} unhealthy instance(s):", "red")]
        lines += [f"  {g.full_name}[{d.id}]: {d.health_description or 'no reason given'}" for g, d in sick]
    return lines


def stats_text(instances: list[InstanceStats], style: Style) -> list[str]:
    """Per instance: the summary line, then "Device Stats" (flattened, sorted)."""
    lines: list[str] = []
    for inst in instances:
        summary = inst.summary.render() if inst.summary else "<none>"
        lines.append(style(f"{inst.group}[{inst.device_id}]", "bold") + f"  {summary}")
        lines += aligned(((k, v.render()) for k, v in sorted(inst.stats.items())), "  ")
    return lines
