"""XDM's per-card topology (``extenderResources["topology"]``), as plain data.

Levels are keyed by *name* (e.g. ``numaNodes``, ``leafSwitch``), never by their
number: level numbers differ between models (R9). The parser lives in
``nomad_plugin/model/topology_parse.py``; this module only holds the types.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TopologyLevel:
    level: int
    name: str
    # ``topo<level>`` value: an int tuple for intra-node levels, a string
    # for rack and network levels.
    domain: tuple[int, ...] | str
    peers: tuple[int, ...] | None = None

    @property
    def domain_text(self) -> str:
        """The domain as one attribute-friendly string ("0", "0,1", "asw-001")."""
        if isinstance(self.domain, str):
            return self.domain
        return ",".join(str(v) for v in self.domain)


@dataclass(frozen=True)
class Topology:
    levels: tuple[TopologyLevel, ...] = ()
    # Set when the JSON could not be (fully) parsed; the card is kept anyway.
    error: str = ""

    def level(self, name: str) -> TopologyLevel | None:
        for lvl in self.levels:
            if lvl.name == name:
                return lvl
        return None

    def domain(self, name: str) -> str | None:
        lvl = self.level(name)
        return None if lvl is None else lvl.domain_text
