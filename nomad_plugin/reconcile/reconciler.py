"""The reconciler thread: watch this node's allocations, release ended grants.

One thread. Each round: retry failed releases, re-check (at start and every
``visibility_period``) that the node exists and is this host, and whether the
token sees every namespace, then one
blocking query on ``/v1/node/<id>/allocations`` (returns when the
allocations change or after ``wait``; ``wait`` shrinks so a grace deadline
is checked on time), then ``decide``. Any API failure (down, slow, 403, odd
answer) is logged and backed off; nothing is released without a fresh
successful answer, and with an incomplete view nothing is released on
absence (``decide.py``).

Why the node check: Nomad answers ``200 []`` for the allocations of a node it
does not know, so a wrong ``nomad_node_id`` looked like a node where nothing
runs, and every grant was released after the grace period. An empty list
means "nothing runs here" only once ``GET /v1/node/<id>`` (``node:read``, the
capability the allocation list needs anyway) has shown the node exists and
its ``unique.hostname`` is this host's: a 404 or another host is an error
like an unreachable API (logged, backed off, nothing released).

After each observation the thread writes ``<data_dir>/reconciler-state.json``
(``state.py``): what ``grants`` shows while the plugin runs, and the claims
that survive a plugin restart as evidence.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path

from nomad_plugin.goplugin.logging import get_logger
from nomad_plugin.model.instances import Catalog
from nomad_plugin.reconcile.counters import LifecycleCounters
from nomad_plugin.reconcile.decide import Timers, decide
from nomad_plugin.reconcile.nomad_api import AllocPage, AllocView, NomadApiError, NomadClient
from nomad_plugin.reconcile.release_port import GrantReleaser
from nomad_plugin.reconcile.state import ReconcilerState, load_state, save_state
from nomad_plugin.reconcile.visibility import RECOMMENDED_POLICY, Visibility, check_visibility
from nomad_plugin.util.threads import Backoff

log = get_logger(__name__)

#: How often the token's visibility is re-checked (policies can change at any time).
VISIBILITY_PERIOD = 300.0


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
    ) -> None:
        self.reserver = reserver
        self.client = client
        self.catalog_source = catalog_source
        self.grace = grace
        self.node_id = node_id
        self.max_wait = max_wait
        self.idle_period = idle_period
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
        self.last_error: str = ""
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
        if self.state_path is not None:
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
                self.reserver.counters.inc("nomad_api_errors")
                delay = self.backoff.next_delay()
                log.warning("reconciler: %s; retrying in %.1fs (no grant is released meanwhile)", exc, delay)
                self._stop.wait(delay)
            except Exception:
                log.exception("reconciler round failed")
                self._stop.wait(self.backoff.next_delay())

    def round(self) -> None:
        """One observation and its releases (also called directly by tests)."""
        self.reserver.retry_pending()
        if self.client is None:
            self._stop.wait(self.idle_period)
            return
        if not self.node_id:
            self.node_id = self.client.node_id()
            log.info("reconciler: watching allocations of Nomad node %s", self.node_id)
        self._prove_node()
        self._refresh_visibility()
        page = self.client.node_allocations(self.node_id, self.index, self._wait())
        self.backoff.reset()
        self.last_error = ""
        # An index that goes backwards (a server restored from a snapshot, a
        # new leader behind) would make every later blocking query wait out
        # its full wait: start over from 0.
        self.index = page.index if page.index >= self.index else 0
        page.holders  # noqa: B018 - built here, not in the first Reserve that looks a task up in this page
        self.observe(page)

    def _prove_node(self) -> None:
        """At start and every ``visibility_period``: the node exists, and it is this host (module docstring)."""
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
        """At start and every ``visibility_period``: can the token see every allocation?"""
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
                "until it can, grants are released only on evidence"
                if not self.view_complete
                else "keeping the last answer",
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
        decision = decide(
            self.reserver.entries(),
            allocs,
            self.catalog_source().all_ids(),
            now,
            self.grace,
            self.timers,
            complete=complete,
            unconfirmed=unconfirmed,
        )
        self._next_deadline = decision.next_deadline
        for grant_id, why in decision.release:
            if self.reserver.release_grant(grant_id, why):
                self.reserver.counters.inc("grants_released_by_reconcile")
                self.timers.orphaned_since.pop(grant_id, None)
                self.timers.claims.pop(grant_id, None)
        self.unverifiable = decision.unverifiable
        self.counters.set("unverifiable_grants", len(decision.unverifiable))
        for grant_id in decision.unverifiable:
            if grant_id not in self._warned_unverifiable:
                self._warned_unverifiable.add(grant_id)
                log.warning(
                    "grant %s is kept: no allocation visible to the token has claimed its devices and the view is "
                    "incomplete, so its end cannot be seen (check it with `nomad-device-lingjun grants`)",
                    grant_id,
                )
        self._warned_unverifiable.intersection_update(decision.unverifiable)
        for alloc in decision.new_leaks:
            self.reserver.counters.inc("leaked_grants_found")
            log.error(
                "allocation %s is running with devices %s but the journal has no grant for them "
                "(journal lost or corrupt?); its XDM grant cannot be released by the plugin",
                alloc.id,
                ", ".join(sorted(alloc.device_ids)),
            )
        self._save_state(now)

    def _confirm_missing_claims(self, allocs: list[AllocView]) -> tuple[list[AllocView], frozenset[str]]:
        """With an incomplete view, ask Nomad about each claimed allocation missing from the list.

        ``GET /v1/allocation/<id>``: 404 means garbage-collected (evidence);
        an answer is used like a list entry; anything else (403 after a
        policy change, an error) leaves it unconfirmed: no evidence.
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
        page = self.last_page
        state = ReconcilerState(
            updated_at=wall,
            grace=self.grace,
            view_complete=self.view_complete,
            view_reason=self.visibility.reason if self.visibility else "not checked yet",
            claims=dict(self.timers.claims),
            release_at={g: wall + (since + self.grace - now) for g, since in self.timers.orphaned_since.items()},
            unverifiable=list(self.unverifiable),
            allocs=list(page.allocs) if page else [],
            leaked=sorted(self.timers.reported_leaks),
        )
        try:
            save_state(self.state_path, state)
        except OSError as exc:
            log.warning("reconciler: could not write %s: %s", self.state_path, exc)

    def _restore_claims(self) -> None:
        """Claims of the previous process: evidence that survives a restart (see decide.py)."""
        assert self.state_path is not None
        state = load_state(self.state_path)
        if state is None:
            return
        known = {e.grant_id for e in self.reserver.entries()}
        for grant_id, claim in state.claims.items():
            if grant_id in known:
                self.timers.claims.setdefault(grant_id, claim)
