"""The durable grant journal: every XDM grant the plugin holds, on disk.

Nomad never tells a device plugin that a task ended, so the plugin must
remember each grant it made (grant id -> device IDs) to release it later,
across plugin, agent and node restarts. See ``docs/reserve.md``.
"""

from __future__ import annotations

from nomad_plugin.journal.datadir import OwnerLock, plugin_running
from nomad_plugin.journal.store import EntryState, Journal, JournalCorrupt, JournalEntry, JournalFull

__all__ = ["EntryState", "Journal", "JournalCorrupt", "JournalEntry", "JournalFull", "OwnerLock", "plugin_running"]
