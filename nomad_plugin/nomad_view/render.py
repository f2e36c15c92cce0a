"""Show fingerprints and stats the way the Nomad CLI shows them.

``nomad node status -verbose`` prints "Device Group Attributes" as
``key = value unit`` per group; ``nomad node status -stats`` /
``nomad alloc status -stats`` print "Device Stats" with every attribute
flattened by ``.`` and sorted (nomad-protocol.md §5.7). Colour is used only
when the stream is a terminal (and ``NO_COLOR`` is unset).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import TextIO

from nomad_plugin.nomad_view.types import DeviceGroup, InstanceStats

_CODES = {"bold": "1", "dim": "2", "red": "31", "green": "32", "yellow": "33", "cyan": "36"}


class Style:
    """ANSI styling that turns itself off for pipes, files and NO_COLOR."""

    def __init__(self, stream: TextIO) -> None:
        self.enabled = stream.isatty() and not os.environ.get("NO_COLOR")

    def __call__(self, text: str, *names: str) -> str:
        if not self.enabled or not names:
            return text
        codes = ";".join(_CODES[n] for n in names)
        return f"\x1b[{codes}m{text}\x1b[0m"


def aligned(pairs: Iterable[tuple[str, str]], indent: str = "") -> list[str]:
    items = list(pairs)
    width = max((len(k) for k, _ in items), default=0)
    return [f"{indent}{k:<{width}} = {v}" for k, v in items]


def group_attributes(group: DeviceGroup, style: Style) -> list[str]:
    """One group in "Device Group Attributes" style."""
    healthy = sum(1 for d in group.devices if d.healthy)
    lines = [
        style(f"Device Group Attributes: {group.full_name}", "bold")
        + style(f"  ({healthy}/{len(group.devices)} healthy)", "dim")
    ]
    lines += aligned(((k, a.render()) for k, a in sorted(group.attributes.items())), "  ")
    return lines


def device_lines(group: DeviceGroup, style: Style) -> list[str]:
    """Each instance as ``vendor/type/name[ID]`` with health, like "Device Resource Utilization"."""
    out = []
    for d in group.devices:
        mark = style("healthy", "green") if d.healthy else style(f"unhealthy: {d.health_description}", "red")
        locality = f" pci {d.pci_bus_id}" if d.pci_bus_id else ""
        out.append(f"  {group.full_name}[{d.id}]{locality}  {mark}")
    return out


def fingerprint_text(groups: list[DeviceGroup], style: Style, with_devices: bool = True) -> list[str]:
    if not groups:
        return ["(no devices fingerprinted)"]
    lines: list[str] = []
    for group in groups:
        lines += group_attributes(group, style)
        if with_devices:
            lines += device_lines(group, style)
        lines.append("")
    return lines


SUMMARY_ATTRIBUTES = ("memory", "share_memory", "share_core_percent", "mig_slices", "numa_node", "pci_bus_id")


def fingerprint_summary(groups: list[DeviceGroup], style: Style) -> list[str]:
    """One line per group (instances, healthy, the attributes a job constrains on most), then
    every unhealthy instance with its reason: the answer without the 80-instance listing."""
    if not groups:
        return ["(no devices fingerprinted)"]
    shown = [a for a in SUMMARY_ATTRIBUTES if any(a in g.attributes for g in groups)]
    header = ["GROUP", "INSTANCES", "HEALTHY", *shown]
    rows = [
        [
            g.full_name,
            str(len(g.devices)),
            str(sum(1 for d in g.devices if d.healthy)),
            *(g.attributes[a].render() if a in g.attributes else "-" for a in shown),
        ]
        for g in groups
    ]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = [style("  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)).rstrip(), "bold")]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
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
