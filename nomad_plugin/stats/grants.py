"""Which grant holds an instance, remembered until the grant journal changes.

Why: the stats layout asks once per instance per tick (112 times a second on
a 16-card tdm node), and each answer went through the journal's lock and
built a fresh ``GrantInfo``, for an answer that changes only when a grant is
made or released (issue 14). The journal's ``generation`` moves after every
change it knows of, so a table keyed by it is exact.
"""

from __future__ import annotations

from collections.abc import Callable

from nomad_plugin.stats.layout import GrantInfo, GrantLookup

_UNKNOWN = object()


class GrantTable:
    """A ``GrantLookup`` that asks ``lookup`` once per instance per journal generation."""

    def __init__(self, generation: Callable[[], int], lookup: GrantLookup) -> None:
        self._generation = generation
        self._lookup = lookup
        self._table: tuple[int, dict[str, GrantInfo | None]] = (-1, {})

    def __call__(self, instance_id: str) -> GrantInfo | None:
        generation = self._generation()
        seen, table = self._table
        if seen != generation:
            table = {}
            self._table = (generation, table)
        found = table.get(instance_id, _UNKNOWN)
        if found is not _UNKNOWN:
            return found  # type: ignore[return-value]
        info = self._lookup(instance_id)
        # The journal bumps its generation after each change: if it moved while we looked,
        # this answer may predate the change, so it is used once and not kept.
        if self._generation() == generation:
            table[instance_id] = info
        return info
