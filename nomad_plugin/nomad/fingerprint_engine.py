"""The stateful Fingerprint loop: inventory pushes -> FingerprintResponses.

Nomad's Fingerprint stream must send its first message promptly, then one per
change, and must never end or fail (either drops the plugin until the agent
restarts, nomad-protocol.md §5.2). So:

- the first response goes out at once, even empty, before the backend answered;
- every backend push is turned into a response in the pushing thread and
  published under a Condition; each stream wakes on it (no polling in the hot
  path) and sends only when the canonical bytes differ from what it last sent;
- a background timer re-evaluates exactly when a card's recovery delay
  expires and right after :meth:`notify_grants_changed` (done on the timer
  thread, so a caller that holds its own lock while notifying cannot deadlock
  with ``grants_view``); besides, every ``tick`` seconds (10 s) as a safety
  net: everything the response depends on either pushes or notifies, so a
  shorter tick only cost CPU for the plugin's whole life (issue 14);
- any failure while rebuilding is logged and the last good response is kept;
- every response passes :func:`nomad_plugin.nomad.validate.sanitize`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import replace

from nomad_plugin._proto.nomad import device_pb2
from nomad_plugin.config.model import PluginConfig
from nomad_plugin.goplugin.logging import get_logger
from nomad_plugin.model.backend_port import Backend
from nomad_plugin.model.card import Inventory
from nomad_plugin.model.catalog import build_catalog, check_modes
from nomad_plugin.model.health import (
    Clock,
    HealthTracker,
    Verdict,
    conflict_reasons,
    instance_verdicts,
    outage_verdict,
)
from nomad_plugin.model.instances import Catalog, Kind
from nomad_plugin.nomad.fingerprint import build_response, serialize
from nomad_plugin.nomad.validate import sanitize
from nomad_plugin.util.threads import CancelEvent

log = get_logger(__name__)

GrantsView = Callable[[], Mapping[str, frozenset[Kind]]]

# The timer's longest sleep: nothing should need it (see the module docstring).
SAFETY_TICK_S = 10.0

# How often a waiting stream re-checks its cancel event (cancel is not a wake-up source).
_CANCEL_POLL_S = 0.25


def _no_grants() -> Mapping[str, frozenset[Kind]]:
    return {}


class FingerprintEngine:
    def __init__(
        self,
        backend: Backend,
        config: PluginConfig,
        grants_view: GrantsView = _no_grants,
        clock: Clock = time.monotonic,
        wall_clock: Clock = time.time,
        tick: float = SAFETY_TICK_S,
    ) -> None:
        self._backend = backend
        self._config = config
        self._grants_view = grants_view
        self._wall_clock = wall_clock
        self._clock = clock
        self._tick = tick
        self._tracker = HealthTracker(config.health_recovery_checks, config.health_recovery_delay, clock)

        self._lock = threading.RLock()  # serialises rebuilds and the state below
        self._cards: Inventory | None = None  # last inventory that had cards (kept during outages)
        self._observed: Inventory | None = None
        self._outage: Verdict | None = None
        self._outage_since: float | None = None
        self._last_problems: tuple[str, ...] = ()
        self._last_config_problems: tuple[str, ...] = ()
        # What the last rebuild was made from: (inventory, config, its catalog) and (conflicts, verdicts, outage).
        self._built_from: tuple[Inventory | None, PluginConfig | None, Catalog | None] = (None, None, None)
        self._inputs: object = None
        self._raw_inputs: object = None

        self._published = threading.Condition(threading.Lock())
        self._version = 0
        self._response = device_pb2.FingerprintResponse()
        self._bytes = serialize(self._response)
        self._catalog = Catalog()
        self._response_catalog = Catalog()

        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._timer: threading.Thread | None = None
        self._unsubscribe: Callable[[], None] | None = None

    # --- lifecycle --------------------------------------------------------------

    def start(self) -> None:
        """Subscribe to the backend and start the timer; never blocks on the device."""
        if self._timer is not None:
            return
        self._unsubscribe = self._backend.subscribe(self._on_inventory)
        with self._lock:
            need_initial = self._observed is None and self._cards is None
        if need_initial:
            try:
                self._on_inventory(self._backend.inventory())
            except Exception:
                log.exception("reading the backend's first inventory failed; advertising none yet")
        self._timer = threading.Thread(target=self._run_timer, name="fingerprint-timer", daemon=True)
        self._timer.start()

    def stop(self, timeout: float = 1.0) -> None:
        """Unsubscribe and stop the timer (idempotent). Open streams keep their last response.

        Waits at most ``timeout`` seconds for the timer thread (a daemon).
        """
        if self._unsubscribe is not None:
            try:
                self._unsubscribe()
            except Exception:
                log.exception("unsubscribing from the backend failed")
            self._unsubscribe = None
        self._stopping.set()
        self._wake.set()
        if self._timer is not None:
            self._timer.join(timeout=timeout)
            self._timer = None

    # --- inputs -----------------------------------------------------------------

    def notify_grants_changed(self) -> None:
        """Re-evaluate conflict marking soon (on the timer thread, not the caller's)."""
        self._wake.set()

    def update_config(self, config: PluginConfig) -> None:
        with self._lock:
            self._config = config
            self._tracker.recovery_checks = max(1, config.health_recovery_checks)
            self._tracker.recovery_delay = max(0.0, config.health_recovery_delay)
            self._rebuild()

    def reevaluate(self) -> None:
        """Rebuild now (hysteresis expiry, grants); publishes only if content changed.

        Calls ``grants_view`` on this thread: never call it while holding a lock
        that ``grants_view`` takes; use :meth:`notify_grants_changed` there.
        """
        with self._lock:
            self._rebuild()

    def _on_inventory(self, inventory: Inventory) -> None:
        """Backend listener: never raises (it runs on the backend's thread)."""
        try:
            with self._lock:
                self._absorb(inventory)
                self._rebuild()
            if self._tracker.next_deadline() is not None:
                self._wake.set()  # a recovery delay may have started: the sleeping timer must aim at it
        except Exception:
            log.exception("handling a backend inventory failed; keeping the last fingerprint")

    def _absorb(self, inventory: Inventory) -> None:
        if inventory.reachable:
            if inventory is not self._observed:
                self._tracker.observe({c.uuid: (c.healthy, c.health_reason) for c in inventory.cards})
                self._observed = inventory
            self._cards = inventory
            if self._outage is not None:
                log.info("%s reachable again; instances follow card health", self._backend.name)
            self._outage, self._outage_since = None, None
            return
        if self._outage_since is None:
            self._outage_since = inventory.unreachable_since or self._wall_clock()
            # Before the first answer this is start-up, not an outage worth a warning.
            level = logging.WARNING if self._observed is not None else logging.INFO
            reason = inventory.unreachable_reason or "no reason given"
            log.log(level, "%s unreachable: %s", self._backend.name, reason)
        self._outage = outage_verdict(self._backend.name, inventory.unreachable_reason, self._outage_since)
        if inventory.cards or self._cards is None:
            self._cards = inventory
        else:
            self._cards = replace(self._cards, reachable=False)

    # --- the rebuild --------------------------------------------------------------

    def _rebuild(self) -> None:
        """Catalog -> verdicts -> sanitised response; publish if the bytes changed.

        The response is a pure function of the inventory, the config, the card
        verdicts, the outage and the conflicts that grants in other modes cause.
        When none of them changed since the last rebuild (the timer, a Reserve
        that blocks no other mode), nothing is rebuilt: at 256 cards a rebuild
        costs ~190 ms of CPU, and it used to run every second and after every
        Reserve (issue 14). The catalog is rebuilt only when the inventory or the
        config changed.
        """
        try:
            inventory = self._cards or Inventory()
            last_inventory, last_config, catalog = self._built_from
            same_source = (inventory is last_inventory or inventory == last_inventory) and (
                self._config is last_config or self._config == last_config
            )
            if not same_source or catalog is None:
                catalog = build_catalog(inventory, self._config)
            grants = self._grants_view()
            card_verdicts = self._tracker.verdicts()
            raw_inputs = (grants, card_verdicts, self._outage)
            if same_source and raw_inputs == self._raw_inputs:
                return  # the common case (a tick, a Reserve on a card already granted): O(cards), no scan
            conflicts = conflict_reasons(catalog, grants)
            inputs = (conflicts, card_verdicts, self._outage)
            if same_source and inputs == self._inputs:
                self._raw_inputs = raw_inputs
                return
            verdicts = instance_verdicts(catalog, card_verdicts, conflicts, self._outage)
            response, problems = sanitize(build_response(catalog, verdicts))
            data = serialize(response)
        except Exception:
            log.exception("fingerprint rebuild failed; keeping the last good response")
            return
        if tuple(problems) != self._last_problems:
            self._last_problems = tuple(problems)
            for problem in problems:
                log.error("fingerprint: %s (not sent to Nomad)", problem)
        self._log_config_problems(inventory)
        self._built_from, self._inputs, self._raw_inputs = (inventory, self._config, catalog), inputs, raw_inputs
        with self._published:
            self._catalog = catalog
            if data != self._bytes:
                self._response, self._bytes = response, data
                self._response_catalog = catalog
                self._version += 1
                self._published.notify_all()

    def _log_config_problems(self, inventory: Inventory) -> None:
        """Say once (per change) which cards run other than configured, e.g. mig on a non-MIG model."""
        if not inventory.cards:
            return
        try:
            found = tuple(check_modes(inventory, self._config))
        except Exception:
            log.exception("checking the configured card modes failed")
            return
        if found != self._last_config_problems:
            self._last_config_problems = found
            for problem in found:
                log.warning("config: %s", problem)

    def _run_timer(self) -> None:
        while not self._stopping.is_set():
            wait = self._tick
            deadline = self._tracker.next_deadline()
            if deadline is not None:
                wait = min(wait, max(0.0, deadline - self._clock()) + 0.001)
            self._wake.wait(wait)
            self._wake.clear()
            if self._stopping.is_set():
                return
            try:
                self.reevaluate()
            except Exception:
                log.exception("periodic fingerprint re-evaluation failed")

    # --- outputs ------------------------------------------------------------------

    def catalog(self) -> Catalog:
        """The catalog behind the last advertised fingerprint (what Reserve resolves)."""
        with self._published:
            return self._catalog

    def catalog_of(self, response: device_pb2.FingerprintResponse) -> Catalog | None:
        """The catalog a published response was built from; None once a newer one replaced it.

        Stats use this so they never mention a group before the fingerprint
        that introduces it has been sent.
        """
        with self._published:
            return self._response_catalog if response is self._response else None

    def current(self) -> device_pb2.FingerprintResponse:
        with self._published:
            return self._response

    def config_problems(self) -> list[str]:
        """check_modes on the inventory currently advertised."""
        with self._lock:
            return check_modes(self._cards or Inventory(), self._config)

    def responses(self, cancel: threading.Event) -> Iterator[device_pb2.FingerprintResponse]:
        """The first response at once, then one per content change, until ``cancel``.

        Never raises and never ends on its own. Yielded messages are shared
        between streams and must not be modified.
        """
        seen_version = -1
        sent: bytes | None = None
        poll: float | None = _CANCEL_POLL_S
        forget: Callable[[], None] | None = None
        if isinstance(cancel, CancelEvent):  # woken when cancelled: no need to poll the event
            forget = cancel.on_set(self._wake_streams)
            poll = None
        try:
            while True:
                with self._published:
                    while self._version == seen_version and not cancel.is_set():
                        self._published.wait(poll)
                    if cancel.is_set():
                        return
                    seen_version = self._version
                    response, data = self._response, self._bytes
                if data != sent:
                    sent = data
                    yield response
        finally:
            if forget is not None:
                forget()

    def _wake_streams(self) -> None:
        with self._published:
            self._published.notify_all()
