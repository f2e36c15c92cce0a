"""Per-card topology objects (``extenderResources["topology"]``), by family.

GPU 0 of the M890P and 810E families reproduces the two examples of the XDM
API reference exactly (§3.4 of the seed; xdm-api.md §1.5); the other cards
generalise them as xdm-api.md §5.2 describes. NVIDIA has no seed example:
its shape (pcieSwitches / numaNodes / cpuSockets + network levels) is a GUESS.
:func:`check_invariants` is the simulator's self-check on its own data.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

Level = dict[str, Any]

# 810E: hand-written table (the ICN links are not consecutive, as the seed says).
_810E_ICN2 = ((0, 3), (1, 2), (4, 7), (5, 6), (8, 11), (9, 10), (12, 15), (13, 14))
_810E_PCIE_ID = {0: 4, 1: 5, 2: 6, 3: 7}  # quad index -> PCIe switch id (GPU 0 sits on switch 4)
_810E_NUMA = ((1, (0, 1, 2, 3, 8, 9, 10, 11)), (0, (4, 5, 6, 7, 12, 13, 14, 15)))
_810E_SOCKET_OF_NUMA = {1: 0, 0: 1}


def _intra(level: int, name: str, domain: int, peers: Sequence[int] | None) -> Level:
    out: Level = {"level": level, "name": name, f"topo{level}": [domain]}
    if peers is not None:
        out["peers"] = list(peers)
    return out


def _named(level: int, name: str, value: str) -> Level:
    return {"level": level, "name": name, f"topo{level}": value}


def _group(index: int, size: int, count: int) -> list[int]:
    start = (index // size) * size
    return list(range(start, min(start + size, count)))


def m890p_topology(minor: int, count: int) -> dict[str, Any]:
    return {
        "levels": [
            _intra(1, "pcieSwitches", minor // 2, _group(minor, 2, count)),
            _intra(2, "numaNodes", minor // 2, _group(minor, 2, count)),
            _intra(3, "cpuSockets", minor // 4, _group(minor, 4, count)),
            _named(11, "hyperNode", "hypernode-001"),
            _named(21, "leafSwitch", "asw-001"),
            _named(22, "pointOfDelivery", "pod-g13-p1"),
        ]
    }


def e810_topology(minor: int, count: int) -> dict[str, Any]:
    if count != 16:
        raise ValueError(f"810e topology: the hand-written table covers 16 cards, not {count}")
    pair_index = next(i for i, pair in enumerate(_810E_ICN2) if minor in pair)
    numa_id, numa_peers = next((nid, peers) for nid, peers in _810E_NUMA if minor in peers)
    return {
        "levels": [
            _intra(1, "icnLink2", pair_index, sorted(_810E_ICN2[pair_index])),
            _intra(2, "icnLink4", minor // 4, _group(minor, 4, count)),
            _intra(3, "icnLink8", minor // 8, _group(minor, 8, count)),
            _intra(4, "pcieSwitches", _810E_PCIE_ID[minor // 4], _group(minor, 4, count)),
            _intra(5, "numaNodes", numa_id, numa_peers),
            _intra(6, "cpuSockets", _810E_SOCKET_OF_NUMA[numa_id], None),
            _named(21, "leafSwitch", "ASW-VM-SQA-G10-P2-S25"),
            _named(22, "pointOfDelivery", "VM-SQA-G10-P2"),
        ]
    }


def nvidia_topology(minor: int, count: int) -> dict[str, Any]:
    return {
        "levels": [
            _intra(1, "pcieSwitches", minor // 2, _group(minor, 2, count)),
            _intra(2, "numaNodes", minor // 4, _group(minor, 4, count)),
            _intra(3, "cpuSockets", minor // 4, _group(minor, 4, count)),
            _named(21, "leafSwitch", f"asw-{1 + minor // 4:03d}"),
            _named(22, "pointOfDelivery", "pod-a01-p1"),
        ]
    }


_FAMILIES = {"m890p": m890p_topology, "810e": e810_topology, "nvidia": nvidia_topology}


def topology_for(family: str, minor: int, count: int, *, sorted_levels: bool = True) -> dict[str, Any]:
    """The topology object of card ``minor``; levels scrambled when not ``sorted_levels``
    (real emitters need not sort; clients must sort by ``level`` themselves)."""
    try:
        builder = _FAMILIES[family]
    except KeyError:
        raise ValueError(f"topology family: unknown {family!r} (known: {', '.join(_FAMILIES)})") from None
    topo = builder(minor, count)
    if not sorted_levels:
        levels = topo["levels"]
        # Deterministic scramble: network levels first, then intra-node levels reversed.
        topo["levels"] = [lvl for lvl in levels if isinstance(lvl[f"topo{lvl['level']}"], str)] + [
            lvl for lvl in reversed(levels) if not isinstance(lvl[f"topo{lvl['level']}"], str)
        ]
    return topo


def check_invariants(topologies: dict[int, dict[str, Any]]) -> list[str]:
    """Problems in a node's topology (empty list = consistent).

    Checks, per level name: every card is in its own ``peers``; peer sets are
    symmetric; all peers share the same ``topoN`` value; no level is null.
    """
    problems: list[str] = []
    by_name: dict[str, dict[int, Level]] = {}
    for minor, topo in topologies.items():
        for lvl in topo.get("levels", []):
            key = f"topo{lvl.get('level')}"
            if lvl.get(key) is None:
                problems.append(f"card {minor}: level {lvl.get('name')} has no {key}")
                continue
            by_name.setdefault(str(lvl["name"]), {})[minor] = lvl
    for name, levels in by_name.items():
        for minor, lvl in levels.items():
            peers = lvl.get("peers")
            if peers is None:
                continue
            if minor not in peers:
                problems.append(f"card {minor}: {name} peers {peers} do not include the card itself")
            domain = lvl[f"topo{lvl['level']}"]
            for peer in peers:
                other = levels.get(peer)
                if other is None:
                    problems.append(f"card {minor}: {name} peer {peer} has no such level")
                    continue
                if minor not in other.get("peers", []):
                    problems.append(f"card {minor}: {name} peer {peer} does not list {minor} back")
                if other[f"topo{other['level']}"] != domain:
                    problems.append(f"card {minor}: {name} peer {peer} is in another domain")
    return problems
