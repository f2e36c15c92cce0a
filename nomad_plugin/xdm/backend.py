"""XdmBackend: the ``nomad_plugin.model.backend_port.Backend`` over XDM.

Two threads, both waiting on events (no busy loop):

- the *watcher* subscribes ListAndWatch (each push is the complete list) and
  resubscribes with ``Backoff`` (1 s, x2, cap 30 s, jitter; reset after a
  push) whenever the stream breaks;
- the *resync* thread calls ListGpuInfo at start (a first push is not
  guaranteed, R12) and every ``inventory_resync_period``, plus the node-wide
  facts (xpu types, and the Runtime Kit status from config-daemon's
  QueryStatus, so the ``runtime_kit`` attribute follows an Enable or Disable
  within one period).

When XDM is unreachable the last cards are kept and the inventory says
``reachable=False`` with the classified reason and since when.

An "XDM schema mismatch" (``SchemaMismatch``: the schema did not bind, or
decoded data failed the plausibility guards) is not an outage: XDM answers,
but the plugin cannot trust what it says. Every card is then published
unhealthy with the mismatch text (none at all if no card was ever decoded
plausibly: the inventory says unreachable with that reason), the streams keep
being retried, and the client refuses Allocate. When the ListAndWatch stream
ends the client's binding is dropped, so a restarted XDM is bound afresh.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace

from nomad_plugin.config.model import PluginConfig
from nomad_plugin.goplugin.logging import get_logger
from nomad_plugin.model.backend_port import InventoryListener
from nomad_plugin.model.card import Card, Inventory
from nomad_plugin.model.errors import BackendUnavailable, PluginError, SchemaMismatch
from nomad_plugin.model.grant import Grant, GrantRequest
from nomad_plugin.model.metrics import MetricSample
from nomad_plugin.util.threads import Backoff, CancelEvent, Listeners
from nomad_plugin.xdm.client import Subscription, XdmClient, relax_stream_waits
from nomad_plugin.xdm.inventory import compose_cards, driver_versions
from nomad_plugin.xdm.types import GpuFacts

log = get_logger(__name__)

# Kinds that prove XDM is down (as opposed to slow or missing an RPC).
_DOWN_KINDS = frozenset({"socket-missing", "connection-refused", "permission-denied"})


class XdmBackend:
    """Inventory, grants and metrics from XDM. ``sleep(delay) -> stop?`` and
    ``clock`` are injectable for tests; by default they wait on the stop event
    and read ``time.time``."""

    name = "xdm"

    def __init__(
        self,
        config: PluginConfig,
        client: XdmClient | None = None,
        *,
        clock: Callable[[], float] = time.time,
        backoff: Backoff | None = None,
        sleep: Callable[[float], bool] | None = None,
    ) -> None:
        self._client = client or XdmClient(config)
        self._resync_period = max(0.05, float(config.inventory_resync_period))
        self._clock = clock
        self._backoff = backoff or Backoff()
        self._stop = threading.Event()
        # Start-up settling: cards are first published once both the first
        # resync (ListGpuInfo: driver version; QueryStatus: runtime kit) and the
        # first ListAndWatch push (health, topology) have arrived, or after a
        # bounded wait for the one that is missing (R12: a push may never come
        # unprompted). Nomad then never sees a half-described node.
        self._first_resync = threading.Event()
        self._first_push = threading.Event()
        self._settle_wait = max(0.1, float(config.xdm_call_timeout))
        self._settled = False
        self._reach_hint: bool | None = None  # latest verdict, kept while publication waits
        self._sleep = sleep or self._stop.wait
        self._lock = threading.Lock()
        self._notify_lock = threading.RLock()
        self._listeners: Listeners[Inventory] = Listeners()
        self._threads: list[threading.Thread] = []
        self._sub: Subscription[list[Card]] | None = None
        self._metric_subs: set[Subscription[list[MetricSample]]] = set()
        # state behind the published inventory
        self._stream_cards: list[Card] | None = None
        self._facts: list[GpuFacts] = []
        self._node: dict[str, str] = {"driver_version": "", "xpu_types": "", "runtime_kit": "unknown"}
        self._inventory = Inventory(reachable=False, unreachable_reason="not yet connected", node=dict(self._node))
        self._schema_problem = ""  # "XDM schema mismatch: ..." while the schema is not trusted
        self._runtime_problem = ""  # why QueryStatus last failed ("" = it answered)
        self.resubscribes = 0  # how many times ListAndWatch was (re)opened; for tests and health

    @property
    def client(self) -> XdmClient:
        return self._client

    # ------------------------------------------------------------ lifecycle
    def start(self) -> None:
        with self._lock:
            if self._threads:
                return
            self._stop.clear()
            self._threads = [
                threading.Thread(target=self._resync_loop, name="xdm-resync", daemon=True),
                threading.Thread(target=self._watch_loop, name="xdm-watch", daemon=True),
            ]
            threads = list(self._threads)
        relax_stream_waits()  # process-wide; safe because every stream of the plugin is read by a background thread
        for thread in threads:
            thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._first_resync.set()
        self._first_push.set()
        with self._lock:
            subs = [s for s in (self._sub, *self._metric_subs) if s is not None]
            threads, self._threads = self._threads, []
        for sub in subs:
            sub.cancel()
        for thread in threads:
            thread.join(timeout=10)
        self._client.close()

    # ------------------------------------------------------------ inventory
    def inventory(self) -> Inventory:
        with self._lock:
            return self._inventory

    def subscribe(self, listener: InventoryListener) -> Callable[[], None]:
        return self._listeners.add(listener)

    def _watch_loop(self) -> None:
        while not self._stop.is_set():
            error: PluginError
            try:
                sub = self._client.list_and_watch()
                with self._lock:
                    self._sub = sub
                    self.resubscribes += 1
                if self._stop.is_set():
                    sub.cancel()
                    break
                for cards in sub:
                    self._backoff.reset()
                    self._on_push(cards)
                error = BackendUnavailable("XDM closed the ListAndWatch stream", kind="unavailable")
            except PluginError as exc:
                error = exc
            except Exception as exc:  # a bug must not kill the watcher
                log.exception("XDM ListAndWatch failed unexpectedly")
                error = BackendUnavailable(f"unexpected error: {exc}", kind="unavailable")
            finally:
                with self._lock:
                    self._sub = None
            if self._stop.is_set():
                break
            self._client.invalidate_binding("ListAndWatch ended")  # XDM may come back with another schema
            self._mark_unreachable(error)
            delay = self._backoff.next_delay()
            # An oversized message is not an outage that ends by itself: say so where operators look.
            level = logging.ERROR if getattr(error, "kind", "") == "message-too-large" else logging.INFO
            log.log(level, "xdm unreachable: %s; resubscribing in %.1fs", error, delay)
            if self._sleep(delay):
                break

    def _resync_loop(self) -> None:
        while not self._stop.is_set():
            self._resync_once()
            if not self._settled:
                self._settle()
            if self._stop.wait(self._resync_period):
                break

    def _resync_once(self) -> None:
        node: dict[str, str] = {}
        try:
            facts = self._client.list_gpu_info()
            types = self._client.list_supported_xpu_types()
        except SchemaMismatch as exc:
            self._mark_unreachable(exc)
            facts, types = None, None
        except BackendUnavailable as exc:
            if exc.kind in _DOWN_KINDS:
                self._mark_unreachable(exc)
            else:
                log.info("XDM resync skipped: %s", exc)
            facts, types = None, None
        except PluginError as exc:
            log.warning("XDM resync refused: %s", exc)
            facts, types = None, None
        if types is not None:
            node["xpu_types"] = ",".join(types)
        node["runtime_kit"] = self._runtime_kit()
        with self._notify_lock:
            with self._lock:
                if facts is not None:
                    self._facts = facts
                    self._schema_problem = self._client.schema_finding()
                self._node.update(node)
            self._publish(reachable=True if facts is not None else None)

    def _settle(self) -> None:
        """End start-up: wait (bounded) for the first push, then publish what is known."""
        self._first_resync.set()
        self._first_push.wait(self._settle_wait)
        with self._notify_lock:
            self._settled = True
            self._publish(reachable=self._reach_hint)

    def _runtime_kit(self) -> str:
        try:
            status = "enabled" if self._client.query_status().enabled else "disabled"
        except PluginError as exc:
            if str(exc) != self._runtime_problem:  # asked every period: said once per cause
                log.info("XDM QueryStatus unavailable: %s", exc)
            self._runtime_problem = str(exc)
            return "unknown"
        self._runtime_problem = ""
        return status

    def _on_push(self, cards: list[Card]) -> None:
        with self._notify_lock:
            with self._lock:
                self._stream_cards = cards
                self._schema_problem = self._client.schema_finding()
            self._first_push.set()
            self._publish(reachable=True)

    def _mark_unreachable(self, error: PluginError) -> None:
        with self._notify_lock:
            if isinstance(error, SchemaMismatch):
                with self._lock:
                    self._schema_problem = str(error)
                self._publish(reachable=True, reason=str(error))
                return
            self._publish(reachable=False, reason=_reason(error))

    def _publish(self, reachable: bool | None, reason: str = "") -> None:
        """Recompute the inventory; notify listeners if anything changed.

        Before start-up has settled only an unreachable XDM is published (so an
        outage shows at once); cards wait for ``_settle``.
        """
        with self._notify_lock:
            if reachable is not None:
                self._reach_hint = reachable
            if not self._settled and reachable is not False:
                return
            with self._lock:
                old = self._inventory
                cards = compose_cards(self._stream_cards, self._facts)
                self._node["driver_version"] = driver_versions(self._facts, cards)
                is_reachable = old.reachable if reachable is None else reachable
                problem = self._schema_problem
                if problem:
                    # Never a healthy card on an untrusted schema; with no card
                    # at all, say it where Nomad shows an outage.
                    cards = tuple(replace(c, healthy=False, health_reason=problem) for c in cards)
                    if not cards:
                        is_reachable, reason = False, problem
                since = 0.0
                if not is_reachable:
                    since = old.unreachable_since if not old.reachable and old.unreachable_since else self._clock()
                new = Inventory(
                    cards=cards,
                    reachable=is_reachable,
                    unreachable_reason="" if is_reachable else (reason or old.unreachable_reason),
                    unreachable_since=since,
                    node=dict(self._node),
                    generation=old.generation,
                )
                if new == old:
                    return
                new = replace(new, generation=old.generation + 1)
                self._inventory = new
            self._listeners.notify(new)

    # ------------------------------------------------------------ grants and metrics
    def allocate(self, request: GrantRequest) -> Grant:
        return self._client.allocate(request)

    def release(self, grant_id: str) -> None:
        self._client.release(grant_id)

    def metrics_snapshot(self) -> Sequence[MetricSample]:
        return self._client.exporter_get_data_list()

    def metrics_stream(self, cancel: threading.Event) -> Iterator[Sequence[MetricSample]]:
        sub = self._client.exporter_data_stream()
        done = threading.Event()
        with self._lock:
            self._metric_subs.add(sub)
        if self._stop.is_set():  # stopped while subscribing: ``stop`` may have missed this one
            sub.cancel()
        forget: Callable[[], None] | None = None
        if isinstance(cancel, CancelEvent):
            forget = cancel.on_set(sub.cancel)  # no watcher thread; ``stop`` cancels the rest
        else:

            def watch_cancel() -> None:
                while not done.is_set():
                    if cancel.wait(0.2) or self._stop.is_set():
                        sub.cancel()
                        return

            threading.Thread(target=watch_cancel, name="xdm-metrics-cancel", daemon=True).start()
        try:
            for batch in sub:
                if cancel.is_set():
                    break
                yield batch
        finally:
            done.set()
            if forget is not None:
                forget()
            sub.cancel()
            with self._lock:
                self._metric_subs.discard(sub)


def _reason(error: PluginError) -> str:
    kind = getattr(error, "kind", "")
    return f"{kind}: {error}" if kind else str(error)
