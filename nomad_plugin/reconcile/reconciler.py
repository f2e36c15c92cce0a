"""The reconciler thread: watch this node's allocations, release ended grants.

One thread. Each round: retry failed releases, then one blocking query on
``/v1/node/<id>/allocations`` (returns when the allocations change or after
``wait``; ``wait`` shrinks so a grace deadline is checked on time), then
``decide``. Any API failure (down, slow, 403, odd answer) is logged and
backed off; nothing is released without a fresh successful answer.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from nomad_plugin.model.instances import Catalog
from nomad_plugin.nomad.reserve import Reserver
from nomad_plugin.reconcile.counters import LifecycleCounters
from nomad_plugin.reconcile.decide import Timers, decide
from nomad_plugin.reconcile.nomad_api import AllocPage, NomadApiError, NomadClient
from nomad_plugin.util.backoff import Backoff

log = logging.getLogger(__name__)


class Reconciler:
    def __init__(
        self,
        reserver: Reserver,
        client: NomadClient | None,
        catalog_source: Callable[[], Catalog],
        *,
        grace: float,
        node_id: str = "",
        max_wait: float = 10.0,
        idle_period: float = 5.0,
        backoff: Backoff | None = None,
        clock: Callable[[], float] = time.monotonic,
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
        self.index = 0
        self.last_error: str = ""
        self.rounds = 0
        self._next_deadline: float | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def counters(self) -> LifecycleCounters:
        return self.reserver.counters

    def start(self) -> None:
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
        page = self.client.node_allocations(self.node_id, self.index, self._wait())
        self.backoff.reset()
        self.last_error = ""
        self.index = page.index if page.index >= self.index else 0
        self.observe(page)

    def _wait(self) -> float:
        if self._next_deadline is None:
            return self.max_wait
        return max(0.0, min(self.max_wait, self._next_deadline - self.clock() + 0.01))

    def observe(self, page: AllocPage) -> None:
        self.rounds += 1
        now = self.clock()
        decision = decide(
            self.reserver.entries(),
            page.allocs,
            self.catalog_source().all_ids(),
            now,
            self.grace,
            self.timers,
        )
        self._next_deadline = decision.next_deadline
        for grant_id in decision.release:
            if self.reserver.release_grant(grant_id, "its Nomad allocation ended"):
                self.reserver.counters.inc("grants_released_by_reconcile")
                self.timers.orphaned_since.pop(grant_id, None)
        for alloc in decision.new_leaks:
            self.reserver.counters.inc("leaked_grants_found")
            log.error(
                "allocation %s is running with devices %s but the journal has no grant for them "
                "(journal lost or corrupt?); its XDM grant cannot be released by the plugin",
                alloc.id,
                ", ".join(sorted(alloc.device_ids)),
            )
