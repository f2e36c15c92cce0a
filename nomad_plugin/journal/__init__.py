"""The durable grant journal (``store.py``) and the plugin's own data directory (``datadir.py``)."""

from __future__ import annotations

from nomad_plugin.journal.datadir import OwnerLock, plugin_running
from nomad_plugin.journal.store import EntryState, Journal, JournalCorrupt, JournalEntry, JournalFull

__all__ = ["EntryState", "Journal", "JournalCorrupt", "JournalEntry", "JournalFull", "OwnerLock", "plugin_running"]
