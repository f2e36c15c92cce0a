"""What reconcile/ needs from the reserve layer: a narrow release port.

The reconciler and the operator-request watcher only look at journalled
grants and release them; they do not reserve. ``nomad.reserve.Reserver``
satisfies this Protocol and the composition root (``app.py``) passes it in,
so reconcile/ never imports the Nomad services (docs/architecture.md).
"""

from __future__ import annotations

from typing import Protocol

from nomad_plugin.journal import JournalEntry
from nomad_plugin.reconcile.counters import LifecycleCounters


class GrantLookup(Protocol):
    """The journal, read one grant at a time."""

    def get(self, grant_id: str) -> JournalEntry | None: ...


class GrantReleaser(Protocol):
    """Journalled grants: list them, release one, retry releases XDM has not confirmed."""

    @property
    def counters(self) -> LifecycleCounters: ...

    @property
    def journal(self) -> GrantLookup: ...

    def entries(self) -> list[JournalEntry]: ...

    def release_grant(self, grant_id: str, reason: str) -> bool:
        """Release through the backend, journalled; False while XDM has not confirmed it."""
        ...

    def retry_pending(self) -> int: ...
