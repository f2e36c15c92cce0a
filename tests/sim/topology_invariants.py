"""The oracle for the simulator's topology data: what every profile's per-card topology must satisfy."""

from __future__ import annotations

from typing import Any

Level = dict[str, Any]


def check_invariants(topologies: dict[int, dict[str, Any]]) -> list[str]:
    """Problems in a node's topology ([] = consistent): per level name, no level is null, every card
    is in its own ``peers``, peer sets are symmetric and peers share the card's ``topoN`` value."""
    problems: list[str] = []
    by_name: dict[str, dict[int, Level]] = {}
    for minor, topo in topologies.items():
        for lvl in topo.get("levels", []):
            if lvl.get(f"topo{lvl.get('level')}") is None:
                problems.append(f"card {minor}: level {lvl.get('name')} has no topo{lvl.get('level')}")
            else:
                by_name.setdefault(str(lvl["name"]), {})[minor] = lvl
    for name, levels in by_name.items():
        for minor, lvl in levels.items():
            peers = lvl.get("peers")
            if peers is None:
                continue
            if minor not in peers:
                problems.append(f"card {minor}: {name} peers {peers} do not include the card itself")
            for peer in peers:
                other = levels.get(peer)
                if other is None:
                    problems.append(f"card {minor}: {name} peer {peer} has no such level")
                    continue
                if minor not in other.get("peers", []):
                    problems.append(f"card {minor}: {name} peer {peer} does not list {minor} back")
                if other[f"topo{other['level']}"] != lvl[f"topo{lvl['level']}"]:
                    problems.append(f"card {minor}: {name} peer {peer} is in another domain")
    return problems
