"""Parse XDM's per-card topology JSON (``extenderResources["topology"]``).

The contract (xdm-api.md §1.5, R9) is loose on purpose: levels may come in any
order, level numbers differ per model, ``peers`` is optional, ``topo<level>``
is an int list for intra-node levels and a string for rack/network levels.
A bad topology must never drop the card, so :func:`parse_topology` never
raises: it returns what it could read plus an ``error`` text.
"""

from __future__ import annotations

import json
from typing import Any

from nomad_plugin.model.topology import Topology, TopologyLevel

_MAX_TEXT = 1 << 20  # 1 MiB: a topology is a few hundred bytes; refuse absurd input


def parse_topology(text: str | None) -> Topology:
    """Return the levels sorted by ``level`` (nearest first); never raises."""
    if text is None or not str(text).strip():
        return Topology()
    if len(text) > _MAX_TEXT:
        return Topology(error=f"topology JSON too large ({len(text)} chars)")
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError) as exc:
        return Topology(error=f"topology is not valid JSON: {exc}")
    if not isinstance(doc, dict):
        return Topology(error=f"topology must be a JSON object, got {type(doc).__name__}")
    raw_levels = doc.get("levels")
    if raw_levels is None:
        return Topology(error='topology has no "levels" list')
    if not isinstance(raw_levels, list):
        return Topology(error=f'topology "levels" must be a list, got {type(raw_levels).__name__}')
    levels: list[TopologyLevel] = []
    problems: list[str] = []
    for index, raw in enumerate(raw_levels):
        level, problem = _parse_level(raw)
        if level is not None:
            levels.append(level)
        if problem:
            problems.append(f"levels[{index}]: {problem}")
    levels.sort(key=lambda lvl: (lvl.level, lvl.name))
    return Topology(levels=tuple(levels), error="; ".join(problems))


def _parse_level(raw: Any) -> tuple[TopologyLevel | None, str]:
    """One level element -> (level or None when skipped, problem text)."""
    if not isinstance(raw, dict):
        return None, f"not an object ({type(raw).__name__}), skipped"
    number = _as_int(raw.get("level"))
    name = raw.get("name")
    if number is None:
        return None, f"missing or non-integer level {raw.get('level')!r}, skipped"
    if not isinstance(name, str) or not name.strip():
        return None, f"level {number} has no name, skipped"
    key = f"topo{number}"
    domain, problem = _parse_domain(raw.get(key), key)
    peers, peer_problem = _parse_peers(raw.get("peers"))
    text = "; ".join(p for p in (problem, peer_problem) if p)
    return TopologyLevel(level=number, name=name, domain=domain, peers=peers), text


def _parse_domain(value: Any, key: str) -> tuple[tuple[int, ...] | str, str]:
    if value is None:
        return (), f"{key} missing"
    if isinstance(value, str):
        return value, ""
    single = _as_int(value)
    if single is not None:
        return (single,), ""
    if isinstance(value, list):
        ints = tuple(i for i in (_as_int(v) for v in value) if i is not None)
        if len(ints) != len(value):
            return ints, f"{key} has non-integer entries {value!r}"
        return ints, ""
    return (), f"{key} has unsupported type {type(value).__name__}"


def _parse_peers(value: Any) -> tuple[tuple[int, ...] | None, str]:
    if value is None:
        return None, ""
    single = _as_int(value)
    if single is not None:
        return (single,), ""
    if not isinstance(value, list):
        return None, f"peers has unsupported type {type(value).__name__}"
    ints = tuple(i for i in (_as_int(v) for v in value) if i is not None)
    if len(ints) != len(value):
        return ints, f"peers has non-integer entries {value!r}"
    return ints, ""


def _as_int(value: Any) -> int | None:
    """An int (not bool); integral floats and digit strings are accepted too."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value.strip())
    return None
