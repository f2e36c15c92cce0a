"""Which grants to release, which allocations look leaked: pure, given one observation.

A grant is *claimed* by a live allocation on this node that holds any of its
device IDs ("live" = any client status but complete, failed and lost, so
``pending`` and ``unknown`` are live). The claim is remembered. A grant with
no live holder is *orphaned* and released once that has held in every
observation for ``grace`` seconds, but only on evidence:

- its claiming allocation was seen live and is now terminal, or gone from
  the answer (garbage-collected): released, with that allocation as the
  reason; or
- nothing ever claimed it, and the view is *complete* (the token reads every
  namespace, see ``visibility.py``): absence is then evidence.

With an incomplete view an unclaimed grant is never released: it is
*unverifiable* (kept and reported). A live allocation whose *started* tasks
use this plugin's devices without a journal entry is *leaked* once that has
held for ``grace`` seconds (a Reserve may be in flight for a new
allocation). Tasks not started yet are left out: Nomad reserves a task's
devices only in its prestart, after its artifacts and the group's prestart
tasks, so an allocation can hold IDs for minutes before it asks for them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from nomad_plugin.journal import EntryState, JournalEntry
from nomad_plugin.reconcile.nomad_api import AllocView


@dataclass(frozen=True)
class Claim:
    """The allocation last seen live holding a grant's devices."""

    alloc_id: str
    namespace: str
    job: str

    def describe(self) -> str:
        return f"allocation {self.alloc_id} of job {self.namespace}/{self.job}"


@dataclass
class Timers:
    """First time (monotonic seconds) each condition was seen; kept between observations."""

    orphaned_since: dict[str, float] = field(default_factory=dict)  # grant id
    unjournalled_since: dict[str, float] = field(default_factory=dict)  # alloc id
    reported_leaks: set[str] = field(default_factory=set)  # alloc ids
    claims: dict[str, Claim] = field(default_factory=dict)  # grant id -> last live holder


@dataclass(frozen=True)
class Decision:
    release: tuple[tuple[str, str], ...]  # (grant id, why)
    new_leaks: tuple[AllocView, ...]
    next_deadline: float | None  # earliest time a pending timer expires
    unverifiable: tuple[str, ...] = ()  # unclaimed grants kept because the view is incomplete


def decide(
    entries: Iterable[JournalEntry],
    allocs: Iterable[AllocView],
    our_ids: frozenset[str],
    now: float,
    grace: float,
    timers: Timers,
    complete: bool = True,
    unconfirmed: frozenset[str] = frozenset(),
) -> Decision:
    """``unconfirmed``: claimed allocation ids missing from ``allocs`` that Nomad did not confirm gone."""
    entries = list(entries)
    allocs = list(allocs)
    by_id = {a.id: a for a in allocs}
    live = [a for a in allocs if a.live]
    release: list[tuple[str, str]] = []
    unverifiable: list[str] = []
    deadlines: list[float] = []
    for entry in (e for e in entries if e.state is EntryState.GRANTED):
        holders = [a for a in live if a.device_ids.intersection(entry.device_ids)]
        if holders:
            holder = holders[0]
            timers.claims[entry.grant_id] = Claim(holder.id, holder.namespace, holder.job)
            timers.orphaned_since.pop(entry.grant_id, None)
            continue
        why = _evidence(timers.claims.get(entry.grant_id), by_id, complete, unconfirmed)
        if why is None:
            timers.orphaned_since.pop(entry.grant_id, None)
            unverifiable.append(entry.grant_id)
            continue
        since = timers.orphaned_since.setdefault(entry.grant_id, now)
        if now - since >= grace:
            release.append((entry.grant_id, why))
        else:
            deadlines.append(since + grace)
    known = {e.grant_id for e in entries}
    for table in (timers.orphaned_since, timers.claims):
        for grant_id in [g for g in table if g not in known]:
            del table[grant_id]

    journalled = frozenset().union(*(e.device_ids for e in entries)) if entries else frozenset()
    new_leaks: list[AllocView] = []
    live_alloc_ids = set()
    for alloc in live:
        live_alloc_ids.add(alloc.id)
        # A task that has not started has not asked for its devices yet (task_started): however
        # long its artifacts or the group's prestart tasks take, no entry is expected for them.
        ours = (alloc.device_ids - alloc.unstarted_ids) & our_ids
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
    return Decision(tuple(release), tuple(new_leaks), min(deadlines) if deadlines else None, tuple(unverifiable))


def _evidence(
    claim: Claim | None, by_id: dict[str, AllocView], complete: bool, unconfirmed: frozenset[str]
) -> str | None:
    """Why an orphaned grant may be released, or None when there is no evidence."""
    if claim is not None:
        seen = by_id.get(claim.alloc_id)
        if seen is not None:
            return f"{claim.describe()} ended ({seen.client_status})"
        if claim.alloc_id in unconfirmed and not complete:
            return None  # gone from the list, but Nomad did not say it was garbage-collected
        return f"{claim.describe()} ended (garbage-collected)"
    if complete:
        return "no live allocation on this node holds its devices (the token sees every namespace)"
    return None
