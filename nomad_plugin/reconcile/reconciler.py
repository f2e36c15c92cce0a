"""The reconciler: watch this node's allocations, release the grants whose allocation ended.

One thread. Each round: retry failed releases; at start and every
``visibility_period`` prove the node (Nomad answers ``200 []`` for a node it
does not know, so an empty list means "nothing runs here" only once
``GET /v1/node/<id>`` showed the node on this host) and check what the token
sees; then one blocking query and ``decide``. An API failure is backed off:
nothing is released without a fresh answer. ``reconciler-state.json`` is
what ``grants`` shows, and the claims a restarted plugin reads back as
evidence (a cache, never the source of truth).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Protocol

from nomad_plugin.journal import EntryState, JournalEntry
from nomad_plugin.journal.datadir import write_state
from nomad_plugin.model.instances import Catalog
from nomad_plugin.reconcile.nomad_api import (
    RECOMMENDED_POLICY,
    AllocPage,
    AllocView,
    NomadApiError,
    NomadClient,
    Visibility,
    check_visibility,
)
from nomad_plugin.util.threads import Backoff

log = logging.getLogger(__name__)

#: How often the node and the token's visibility are checked again (policies can change at any time).
VISIBILITY_PERIOD = 300.0
#: The least time between two answers acted on: a burst of allocation changes (tasks starting, each
#: with a Reserve) makes one round, not one per change. Releases wait on a grace period of seconds,
#: so half a second later changes no outcome.
MIN_ROUND_INTERVAL = 0.5


@dataclass
class LifecycleCounters:
    """Monotonic counters, and gauges (``journal_size``, ``view_incomplete`` 0/1, ``unverifiable_grants``)."""

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
        with self._lock:
            setattr(self, name, value)

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "_lock"}


class GrantReleaser(Protocol):
    """What reconcile/ needs of ``nomad.reserve.Reserver``, which it never imports (docs/architecture.md)."""

    @property
    def counters(self) -> LifecycleCounters: ...

    def entries(self) -> list[JournalEntry]: ...

    def release_grant(self, grant_id: str, reason: str) -> bool: ...  # False until XDM confirms it

    def retry_pending(self) -> int: ...


# -- the decision: pure, given one observation -------------------------------------------------------
# A grant is *claimed* by a live allocation on this node that holds any of its device IDs
# ("live": any client status but complete, failed and lost). The claim is remembered. A grant with
# no live holder is *orphaned*, and released once that has held in every observation for ``grace``
# seconds, but only on evidence: its claiming allocation was seen live and is now terminal or gone
# (garbage-collected), or nothing ever claimed it and the view is *complete* (``nomad_api.check_visibility``).
# With an incomplete view an unclaimed grant is *unverifiable*: kept and reported. A live allocation
# whose *started* tasks use this plugin's devices without a journal entry is *leaked* once that has
# held for ``grace`` (a Reserve may be in flight); tasks not started yet have not asked for their
# devices (Nomad reserves them in the task's prestart, after artifacts and prestart tasks).


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
    unverifiable: tuple[str, ...] = ()


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
    entries, allocs = list(entries), list(allocs)
    by_id = {a.id: a for a in allocs}
    live = [a for a in allocs if a.live]
    first_holder: dict[str, int] = {}  # device id -> index in ``live`` of the first allocation holding it
    for n, alloc in enumerate(live):
        for device_id in alloc.device_ids:
            first_holder.setdefault(device_id, n)
    release: list[tuple[str, str]] = []
    unverifiable: list[str] = []
    deadlines: list[float] = []
    for entry in (e for e in entries if e.state is EntryState.GRANTED):
        held = [first_holder[d] for d in entry.device_ids if d in first_holder]
        holder = live[min(held)] if held else None
        if holder is not None:
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

    journalled = frozenset().union(*(e.device_ids for e in entries))
    new_leaks: list[AllocView] = []
    for alloc in live:
        ours = (alloc.device_ids - alloc.unstarted_ids) & our_ids
        if not ours or ours <= journalled:
            timers.unjournalled_since.pop(alloc.id, None)
            continue
        since = timers.unjournalled_since.setdefault(alloc.id, now)
        if now - since < grace:
            deadlines.append(since + grace)
        elif alloc.id not in timers.reported_leaks:
            timers.reported_leaks.add(alloc.id)
            new_leaks.append(alloc)
    live_ids = {a.id for a in live}
    for alloc_id in [a for a in timers.unjournalled_since if a not in live_ids]:
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


# -- the saved state -----------------------------------------------------------------------------------
@dataclass
class ReconcilerState:
    updated_at: float  # unix seconds
    grace: float
    view_complete: bool
    view_reason: str
    claims: dict[str, Claim] = field(default_factory=dict)
    release_at: dict[str, float] = field(default_factory=dict)  # grant id -> unix seconds
    unverifiable: list[str] = field(default_factory=list)
    allocs: list[AllocView] = field(default_factory=list)
    leaked: list[str] = field(default_factory=list)  # live allocation ids using our devices without a grant
    pid: int = field(default_factory=os.getpid)

    def to_json(self) -> dict[str, Any]:
        raw = {f.name: getattr(self, f.name) for f in fields(self)}
        raw.update(version=1, claims={g: asdict(c) for g, c in self.claims.items()})
        keys = ("id", "namespace", "job", "client_status", "modify_time")
        raw["allocs"] = [{k: getattr(a, k) for k in keys} | {"device_ids": sorted(a.device_ids)} for a in self.allocs]
        return raw

    @classmethod
    def from_json(cls, raw: Any) -> ReconcilerState:
        if not isinstance(raw, dict) or raw.get("version") != 1:
            raise ValueError("not a reconciler state of version 1")
        return cls(
            pid=int(raw["pid"]),
            updated_at=float(raw["updated_at"]),
            grace=float(raw["grace"]),
            view_complete=bool(raw["view_complete"]),
            view_reason=str(raw["view_reason"]),
            claims={
                str(g): Claim(*(str(c[k]) for k in ("alloc_id", "namespace", "job"))) for g, c in raw["claims"].items()
            },
            release_at={str(g): float(t) for g, t in dict(raw["release_at"]).items()},
            unverifiable=[str(g) for g in raw["unverifiable"]],
            leaked=[str(a) for a in raw.get("leaked", [])],
            allocs=[
                AllocView(
                    id=str(a["id"]),
                    client_status=str(a["client_status"]),
                    device_ids=frozenset(str(d) for d in a["device_ids"]),
                    namespace=str(a["namespace"]),
                    job=str(a["job"]),
                    modify_time=float(a["modify_time"]),
                )
                for a in raw["allocs"]
            ],
        )

    def save(self, path: Path) -> None:
        write_state(path, self.to_json())

    @classmethod
    def load(cls, path: Path) -> ReconcilerState | None:
        try:
            return cls.from_json(json.loads(path.read_bytes()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return None


def reconciler_state_path(data_dir: str | os.PathLike[str]) -> Path:
    return Path(data_dir) / "reconciler-state.json"


class Reconciler:
    def __init__(
        self,
        reserver: GrantReleaser,
        client: NomadClient | None,
        catalog_source: Callable[[], Catalog],
        *,
        grace: float,
        node_id: str = "",
        max_wait: float = 10.0,
        idle_period: float = 5.0,
        backoff: Backoff | None = None,
        clock: Callable[[], float] = time.monotonic,
        visibility_period: float = VISIBILITY_PERIOD,
        state_path: str | Path | None = None,
        wall_clock: Callable[[], float] = time.time,
        hostname: str | None = None,
        min_round_interval: float = 0.0,
    ) -> None:
        self.reserver = reserver
        self.client = client
        self.catalog_source = catalog_source
        self.grace = grace
        self.node_id = node_id
        self.max_wait = max_wait
        self.idle_period = idle_period
        self.min_round_interval = min_round_interval
        self._answered_at = float("-inf")
        self._saved: ReconcilerState | None = None  # the state last written, ``updated_at`` aside
        self.backoff = backoff or Backoff()
        self.clock = clock
        self.timers = Timers()
        self.visibility_period = visibility_period
        self.visibility: Visibility | None = None  # None: not established yet (= incomplete)
        self._next_visibility = float("-inf")
        self._next_node_check = float("-inf")  # the node is proven until then
        self.hostname = hostname if hostname is not None else socket.gethostname()
        self.state_path = Path(state_path) if state_path is not None else None
        self.wall_clock = wall_clock
        self.last_page: AllocPage | None = None
        self.unverifiable: tuple[str, ...] = ()
        self._warned_unverifiable: set[str] = set()
        self.index = 0
        self.last_error = ""
        self.rounds = 0
        self._next_deadline: float | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def counters(self) -> LifecycleCounters:
        return self.reserver.counters

    @property
    def view_complete(self) -> bool:
        return self.visibility is not None and self.visibility.complete

    def start(self) -> None:
        self._restore_claims()
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="grant-reconciler", daemon=True)
            self._thread.start()

    def stop(self, timeout: float | None = None) -> None:
        """Stop and join; returns within about one blocking-query wait."""
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout if timeout is not None else self.max_wait + 10)
        if self.client is not None:
            self.client.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.round()
            except NomadApiError as exc:
                self.last_error = str(exc)
                self.counters.inc("nomad_api_errors")
                delay = self.backoff.next_delay()
                log.warning("reconciler: %s; retrying in %.1fs (no grant is released meanwhile)", exc, delay)
                self._stop.wait(delay)
            except Exception:
                log.exception("reconciler round failed")
                self._stop.wait(self.backoff.next_delay())

    def round(self) -> None:
        self.reserver.retry_pending()
        if self.client is None:
            self._stop.wait(self.idle_period)
            return
        if not self.node_id:
            self.node_id = self.client.node_id()
            log.info("reconciler: watching allocations of Nomad node %s", self.node_id)
        self._prove_node()
        self._refresh_visibility()
        pause = self._answered_at + self.min_round_interval - self.clock()
        if pause > 0 and self._stop.wait(pause):
            return
        page = self.client.node_allocations(self.node_id, self.index, self._wait(), known=self.last_page)
        self._answered_at = self.clock()
        self.backoff.reset()
        self.last_error = ""
        # An index that goes backwards (a server restored from a snapshot, a new leader behind) would make
        # every later blocking query wait out its full wait: start over from 0.
        self.index = page.index if page.index >= self.index else 0
        self.observe(page)

    def _prove_node(self) -> None:
        assert self.client is not None
        now = self.clock()
        if now < self._next_node_check:
            return
        node = self.client.node(self.node_id)
        if node is None:
            raise NomadApiError(
                f"Nomad has no node {self.node_id} (GET /v1/node/{self.node_id}: 404 node not found): "
                "nomad_node_id names no node of this cluster, and its empty allocation list proves nothing; "
                "no grant is released until it names this node (or is left empty to ask the agent)",
                "no-such-node",
                404,
            )
        if node.hostname and self.hostname and node.hostname != self.hostname:
            raise NomadApiError(
                f"Nomad node {self.node_id} ({node.name!r}) runs on host {node.hostname!r}, not on this host "
                f"{self.hostname!r}: nomad_node_id names another node, whose allocations say nothing of this "
                "node's grants; no grant is released until it names this node (or is left empty)",
                "wrong-node",
            )
        if self._next_node_check == float("-inf"):
            log.info("reconciler: Nomad node %s (%s) is this host", self.node_id, node.name or node.hostname)
        self._next_node_check = now + self.visibility_period

    def _refresh_visibility(self) -> None:
        assert self.client is not None
        now = self.clock()
        if now < self._next_visibility:
            return
        try:
            visibility = check_visibility(self.client)
        except NomadApiError as exc:
            # Keep what we knew (nothing = incomplete); try again soon.
            self._next_visibility = now + min(30.0, self.visibility_period)
            if self.visibility is None:
                self.counters.set("view_incomplete", 1)
            log.warning(
                "reconciler: could not check what the Nomad token can see (%s); %s",
                exc,
                "keeping the last answer"
                if self.view_complete
                else "until it can, grants are released only on evidence",
            )
            return
        self._next_visibility = now + self.visibility_period
        changed = self.visibility is None or self.visibility.complete != visibility.complete
        self.visibility = visibility
        self.counters.set("view_incomplete", 0 if visibility.complete else 1)
        if not changed:
            return
        if visibility.complete:
            log.info("reconciler: the allocation view is complete (%s)", visibility.reason)
        else:
            log.warning(
                "reconciler: the allocation view is INCOMPLETE (%s): Nomad leaves out allocations in namespaces "
                "the token cannot read, so a grant is released only after the allocation that held it is seen to "
                "end, never because it is absent. Give the token this policy: %s",
                visibility.reason,
                " ".join(RECOMMENDED_POLICY.split()),
            )

    def _wait(self) -> float:
        if self._next_deadline is None:
            return self.max_wait
        return max(0.0, min(self.max_wait, self._next_deadline - self.clock() + 0.01))

    def observe(self, page: AllocPage) -> None:
        self.rounds += 1
        now = self.clock()
        self.last_page = page
        complete = self.client is None or self.view_complete
        allocs, unconfirmed = list(page.allocs), frozenset[str]()
        if not complete:
            allocs, unconfirmed = self._confirm_missing_claims(allocs)
        our_ids = self.catalog_source().all_ids()
        decision = decide(self.reserver.entries(), allocs, our_ids, now, self.grace, self.timers, complete, unconfirmed)
        self._next_deadline = decision.next_deadline
        for grant_id, why in decision.release:
            if self.reserver.release_grant(grant_id, why):
                self.counters.inc("grants_released_by_reconcile")
                self.timers.orphaned_since.pop(grant_id, None)
                self.timers.claims.pop(grant_id, None)
        self.unverifiable = decision.unverifiable
        self.counters.set("unverifiable_grants", len(decision.unverifiable))
        for grant_id in [g for g in decision.unverifiable if g not in self._warned_unverifiable]:
            log.warning(
                "grant %s is kept: no allocation visible to the token has claimed its devices and the view is "
                "incomplete, so its end cannot be seen (check it with `nomad-device-lingjun grants`)",
                grant_id,
            )
        self._warned_unverifiable = set(decision.unverifiable)
        for alloc in decision.new_leaks:
            self.counters.inc("leaked_grants_found")
            log.error(
                "allocation %s is running with devices %s but the journal has no grant for them "
                "(journal lost or corrupt?); its XDM grant cannot be released by the plugin",
                alloc.id,
                ", ".join(sorted(alloc.device_ids)),
            )
        self._save_state(now)

    def _confirm_missing_claims(self, allocs: list[AllocView]) -> tuple[list[AllocView], frozenset[str]]:
        """With an incomplete view, ask Nomad about each claimed allocation missing from the list.

        ``GET /v1/allocation/<id>``: 404 means garbage-collected (evidence); an answer is used like a
        list entry; anything else (403 after a policy change, an error) leaves it unconfirmed.
        """
        assert self.client is not None
        present = {a.id for a in allocs}
        unconfirmed: set[str] = set()
        for claim in {c.alloc_id for c in self.timers.claims.values()} - present:
            try:
                found = self.client.allocation(claim)
            except NomadApiError as exc:
                log.info("reconciler: allocation %s left the list but Nomad did not confirm it ended: %s", claim, exc)
                unconfirmed.add(claim)
                continue
            if found is not None:
                allocs.append(found)
        return allocs, frozenset(unconfirmed)

    def _save_state(self, now: float) -> None:
        if self.state_path is None:
            return
        wall = self.wall_clock()
        state = ReconcilerState(
            updated_at=wall,
            grace=self.grace,
            view_complete=self.view_complete,
            view_reason=self.visibility.reason if self.visibility else "not checked yet",
            claims=dict(self.timers.claims),
            release_at={g: wall + (since + self.grace - now) for g, since in self.timers.orphaned_since.items()},
            unverifiable=list(self.unverifiable),
            allocs=list(self.last_page.allocs) if self.last_page else [],
            leaked=sorted(self.timers.reported_leaks),
        )
        content = replace(state, updated_at=0.0)
        if content == self._saved:  # a blocking query that timed out, with no timer moved: nothing to tell
            return
        try:
            state.save(self.state_path)
            self._saved = content
        except OSError as exc:
            log.warning("reconciler: could not write %s: %s", self.state_path, exc)

    def _restore_claims(self) -> None:
        """Claims of the previous process: evidence that survives a restart."""
        state = ReconcilerState.load(self.state_path) if self.state_path is not None else None
        if state is None:
            return
        known = {e.grant_id for e in self.reserver.entries()}
        for grant_id, claim in state.claims.items():
            if grant_id in known:
                self.timers.claims.setdefault(grant_id, claim)
