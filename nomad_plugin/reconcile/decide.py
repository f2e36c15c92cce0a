"""Which grants to release, which allocations look leaked: pure, given one observation.

A grant is *orphaned* when no live (non client-terminal) allocation on this
node holds any of its device IDs. It is released once it has been orphaned
in every observation for ``grace`` seconds. A live allocation that uses
this plugin's devices without a journal entry is *leaked* once that has
held for ``grace`` seconds (a Reserve may be in flight for a new allocation).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from nomad_plugin.journal import EntryState, JournalEntry
from nomad_plugin.reconcile.nomad_api import AllocView


@dataclass
class Timers:
    """First time (monotonic seconds) each condition was seen; kept between observations."""

    orphaned_since: dict[str, float] = field(default_factory=dict)  # grant id
    unjournalled_since: dict[str, float] = field(default_factory=dict)  # alloc id
    reported_leaks: set[str] = field(default_factory=set)  # alloc ids


@dataclass(frozen=True)
class Decision:
    release: tuple[str, ...]
    new_leaks: tuple[AllocView, ...]
    next_deadline: float | None  # earliest time a pending timer expires


def decide(
    entries: Iterable[JournalEntry],
    allocs: Iterable[AllocView],
    our_ids: frozenset[str],
    now: float,
    grace: float,
    timers: Timers,
) -> Decision:
    entries = list(entries)
    live = [a for a in allocs if a.live]
    live_ids = frozenset().union(*(a.device_ids for a in live)) if live else frozenset()
    release: list[str] = []
    deadlines: list[float] = []
    granted = [e for e in entries if e.state is EntryState.GRANTED]
    for entry in granted:
        if live_ids.intersection(entry.device_ids):
            timers.orphaned_since.pop(entry.grant_id, None)
            continue
        since = timers.orphaned_since.setdefault(entry.grant_id, now)
        if now - since >= grace:
            release.append(entry.grant_id)
        else:
            deadlines.append(since + grace)
    known = {e.grant_id for e in entries}
    for grant_id in list(timers.orphaned_since):
        if grant_id not in known:
            del timers.orphaned_since[grant_id]

    journalled = frozenset().union(*(e.device_ids for e in entries)) if entries else frozenset()
    new_leaks: list[AllocView] = []
    live_alloc_ids = set()
    for alloc in live:
        live_alloc_ids.add(alloc.id)
        ours = alloc.device_ids & our_ids
        if not ours or ours <= journalled:
            timers.unjournalled_since.pop(alloc.id, None)
            continue
        since = timers.unjournalled_since.setdefault(alloc.id, now)
        if now - since >= grace:
            if alloc.id not in timers.reported_leaks:
                timers.reported_leaks.add(alloc.id)
                new_leaks.append(alloc)
        else:
            deadlines.append(since + grace)
    for alloc_id in list(timers.unjournalled_since):
        if alloc_id not in live_alloc_ids:
            del timers.unjournalled_since[alloc_id]
            timers.reported_leaks.discard(alloc_id)
    return Decision(tuple(release), tuple(new_leaks), min(deadlines) if deadlines else None)
