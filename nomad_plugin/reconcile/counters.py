"""Counters the stats/Prometheus layer reads to show the release lifecycle."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field


@dataclass
class LifecycleCounters:
    """Monotonic counters plus the current journal size (a gauge).

    ``leaked_grants_found``: live allocations using this plugin's devices
    with no journal entry (the grant id is unknown, so it cannot be
    released; see docs/reserve.md). ``view_incomplete`` (gauge, 0/1): the
    Nomad token cannot read every namespace; ``unverifiable_grants`` (gauge):
    grants kept because no visible allocation ever claimed them while the
    view is incomplete. Read with ``snapshot()``.
    """

    grants_released_by_reconcile: int = 0
    grants_released_by_reserve: int = 0
    grants_released_at_startup: int = 0
    leaked_grants_found: int = 0
    grants_released_by_hand: int = 0
    nomad_api_errors: int = 0
    journal_size: int = 0
    view_incomplete: int = 0
    unverifiable_grants: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def inc(self, name: str, by: int = 1) -> None:
        with self._lock:
            setattr(self, name, getattr(self, name) + by)

    def set(self, name: str, value: int) -> None:
        """Set a gauge."""
        with self._lock:
            setattr(self, name, value)

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return {
                "grants_released_by_reconcile": self.grants_released_by_reconcile,
                "grants_released_by_reserve": self.grants_released_by_reserve,
                "grants_released_at_startup": self.grants_released_at_startup,
                "leaked_grants_found": self.leaked_grants_found,
                "grants_released_by_hand": self.grants_released_by_hand,
                "nomad_api_errors": self.nomad_api_errors,
                "journal_size": self.journal_size,
                "view_incomplete": self.view_incomplete,
                "unverifiable_grants": self.unverifiable_grants,
            }
