"""XdmBackend: the ``nomad_plugin.model.card.Backend`` over XDM.

The *watcher* thread subscribes ListAndWatch (each push is the complete list) and resubscribes with
``Backoff``. The *resync* thread calls ListGpuInfo (a first push is not guaranteed, R12), the xPU
types and QueryStatus at start and every ``inventory_resync_period``. An unreachable XDM keeps the
last cards, ``reachable=False``. An "XDM schema mismatch" is no outage: every card is published
unhealthy with it (with no card, it reads as unreachable), and Allocate is refused.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path

from nomad_plugin.config.model import PluginConfig
from nomad_plugin.model.card import Card, Inventory, InventoryListener
from nomad_plugin.model.errors import BackendUnavailable, PluginError, SchemaMismatch
from nomad_plugin.model.grant import Grant, GrantRequest
from nomad_plugin.model.metrics import MetricSample
from nomad_plugin.util.threads import Backoff, CancelEvent, Listeners
from nomad_plugin.xdm.adapter import GpuFacts
from nomad_plugin.xdm.client import Subscription, XdmClient, relax_stream_waits
from nomad_plugin.xdm.guesses import vendor_of, xpu_type_of

log = logging.getLogger(__name__)

_DOWN_KINDS = frozenset({"socket-missing", "connection-refused", "permission-denied"})  # XDM is down, not slow
HEALTH_NOT_YET_REPORTED = "health not yet reported by ListAndWatch"


def compose_cards(stream_cards: Sequence[Card] | None, facts: Sequence[GpuFacts]) -> tuple[Card, ...]:
    """The cards to publish: the last push (health, topology) filled in from ListGpuInfo (driver,
    NUMA node, PCI address, MIG state), else ListGpuInfo alone; a fact never overrides health."""
    if stream_cards is None:
        cards = [_merge(_blank(f), f) for f in facts]
    else:
        by_uuid = {f.uuid: f for f in facts if f.uuid}
        by_minor = {f.minor: f for f in facts}
        cards = [_merge(c, by_uuid.get(c.uuid) or by_minor.get(c.minor)) for c in stream_cards]
    return tuple(sorted(cards, key=lambda c: c.minor))


def driver_bus_ids(proc_root: str = "/proc") -> dict[int, str]:
    """Card minor -> PCI address as NVIDIA's kernel driver sees its device nodes: one directory per
    card under ``/proc/driver/nvidia/gpus``, named by its address, whose ``information`` says
    ``Device Minor: N`` (the N of ``/dev/nvidiaN``). Empty where there is no such driver."""
    found: dict[int, str] = {}
    try:
        entries = sorted(Path(proc_root, "driver", "nvidia", "gpus").iterdir())
    except OSError:
        return found
    for entry in entries:
        try:
            text = (entry / "information").read_text(errors="replace")
        except OSError:
            continue
        minor = next(
            (line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("Device Minor:")), ""
        )
        if minor.isdigit():
            found[int(minor)] = entry.name
    return found


def with_driver_bus_ids(cards: Sequence[Card], proc_root: str) -> tuple[Card, ...]:
    """XDM may report an NVIDIA card without its PCI address: the driver's view fills it in, so Nomad's
    NUMA matcher can place the card (an NVML companion, where present, fills it earlier)."""
    if all(c.pci_bus_id or c.vendor_name != "nvidia" for c in cards):
        return tuple(cards)
    known = driver_bus_ids(proc_root)
    return tuple(
        replace(c, pci_bus_id=known.get(c.minor, "")) if not c.pci_bus_id and c.vendor_name == "nvidia" else c
        for c in cards
    )


def _merge(card: Card, facts: GpuFacts | None) -> Card:
    if facts is None:
        return card
    return replace(
        card,
        uuid=card.uuid or facts.uuid,
        model=card.model or facts.model,
        memory_mib=card.memory_mib or facts.memory_mib,
        pci_bus_id=card.pci_bus_id or facts.pci_bus_id,
        driver_version=facts.driver_version or card.driver_version,
        sdk_version=facts.sdk_version or card.sdk_version,
        numa_node=facts.numa_node if facts.numa_node is not None else card.numa_node,
        mig_capable=card.mig_capable or facts.mig_enabled,
    )


def _blank(facts: GpuFacts) -> Card:
    """A card known from ListGpuInfo alone, before any push: healthy until told otherwise."""
    vendor = vendor_of(facts.xpu_type or facts.vendor, facts.model)
    return Card(
        facts.minor, "", "", vendor, xpu_type_of(facts.xpu_type, vendor), 0, health_reason=HEALTH_NOT_YET_REPORTED
    )


class XdmBackend:
    """Inventory, grants and metrics from XDM; ``backoff`` and ``sleep(delay) -> stop?`` may be replaced."""

    name = "xdm"

    def __init__(
        self,
        config: PluginConfig,
        *,
        backoff: Backoff | None = None,
        sleep: Callable[[float], bool] | None = None,
        proc_root: str = "/proc",
    ) -> None:
        self.client = XdmClient(config)
        self._proc_root = proc_root
        self._resync_period = max(0.05, float(config.inventory_resync_period))
        self._backoff = backoff or Backoff()
        self._stop = threading.Event()
        self._sleep = sleep or self._stop.wait
        # Cards are first published once the first resync and the first push are in, or after a bounded
        # wait (R12: a push may never come unprompted): Nomad never sees a half-described node.
        self._first_push = threading.Event()
        self._settle_wait = max(0.1, float(config.xdm_call_timeout))
        self._settled = False
        self._reach_hint: bool | None = None  # the latest verdict, kept while publication waits
        self._lock = threading.Lock()
        self._notify_lock = threading.RLock()
        self._listeners: Listeners[Inventory] = Listeners()
        self._threads: list[threading.Thread] = []
        self._subs: set[Subscription[list[Card]] | Subscription[list[MetricSample]]] = set()
        self._stream_cards: list[Card] | None = None
        self._facts: list[GpuFacts] = []
        self._node: dict[str, str] = {"driver_version": "", "xpu_types": "", "runtime_kit": "unknown"}
        self._inventory = Inventory(reachable=False, unreachable_reason="not yet connected", node=dict(self._node))
        self._schema_problem = ""  # "XDM schema mismatch: ..." while the schema is not trusted
        self._runtime_problem = ""  # why QueryStatus last failed ("" = it answered)
        self.resubscribes = 0  # how many times ListAndWatch was (re)opened

    def start(self) -> None:
        with self._lock:
            if self._threads:
                return
            self._stop.clear()
            loops = ((self._resync_loop, "xdm-resync"), (self._watch_loop, "xdm-watch"))
            self._threads = [threading.Thread(target=loop, name=name, daemon=True) for loop, name in loops]
            relax_stream_waits()  # process-wide: every stream of the plugin is read by a background thread
            for thread in self._threads:
                thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._first_push.set()
        with self._lock:
            subs, threads, self._threads = list(self._subs), self._threads, []
        for sub in subs:
            sub.cancel()
        for thread in threads:
            thread.join(timeout=10)
        self.client.close()

    def inventory(self) -> Inventory:
        with self._lock:
            return self._inventory

    def subscribe(self, listener: InventoryListener) -> Callable[[], None]:
        return self._listeners.add(listener)

    def _watch_loop(self) -> None:
        while not self._stop.is_set():
            error: PluginError
            sub: Subscription[list[Card]] | None = None
            try:
                sub = self.client.list_and_watch()
                with self._lock:
                    self._subs.add(sub)
                    self.resubscribes += 1
                if self._stop.is_set():
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
                if sub is not None:
                    sub.cancel()
                    with self._lock:
                        self._subs.discard(sub)
            if self._stop.is_set():
                break
            self.client.invalidate_binding("ListAndWatch ended")  # XDM may come back with another schema
            self._mark_unreachable(error)
            delay = self._backoff.next_delay()
            # an oversized message is not an outage that ends by itself: say so where operators look
            level = logging.ERROR if getattr(error, "kind", "") == "message-too-large" else logging.INFO
            log.log(level, "xdm unreachable: %s; resubscribing in %.1fs", error, delay)
            if self._sleep(delay):
                break

    def _resync_loop(self) -> None:
        while not self._stop.is_set():
            self._resync_once()
            if not self._settled:
                self._first_push.wait(self._settle_wait)
                with self._notify_lock:
                    self._settled = True
                    self._publish(reachable=self._reach_hint)
            self._stop.wait(self._resync_period)

    def _resync_once(self) -> None:
        facts: list[GpuFacts] | None = None
        node: dict[str, str] = {}
        try:
            found = self.client.list_gpu_info()
            node["xpu_types"] = ",".join(self.client.list_supported_xpu_types())
            facts = found
        except SchemaMismatch as exc:
            self._mark_unreachable(exc)
        except BackendUnavailable as exc:
            if exc.kind in _DOWN_KINDS:
                self._mark_unreachable(exc)
            else:
                log.info("XDM resync skipped: %s", exc)
        except PluginError as exc:
            log.warning("XDM resync refused: %s", exc)
        node["runtime_kit"] = self._runtime_kit()
        with self._notify_lock:
            with self._lock:
                if facts is not None:
                    self._facts = facts
                    self._schema_problem = self.client.schema_finding()
                self._node.update(node)
            self._publish(reachable=True if facts is not None else None)

    def _runtime_kit(self) -> str:
        try:
            status = self.client.query_status()
            problem = status.doubt
        except PluginError as exc:
            status, problem = None, str(exc)
        if status is None or problem:
            if problem != self._runtime_problem:  # asked every period: said once per cause
                log.info("XDM QueryStatus unavailable or unreadable: %s", problem)
            self._runtime_problem = problem
            return "unknown"
        self._runtime_problem = ""
        return status.word

    def _on_push(self, cards: list[Card]) -> None:
        with self._notify_lock:
            with self._lock:
                self._stream_cards = cards
                self._schema_problem = self.client.schema_finding()
            self._first_push.set()
            self._publish(reachable=True)

    def _mark_unreachable(self, error: PluginError) -> None:
        with self._notify_lock:
            if isinstance(error, SchemaMismatch):
                with self._lock:
                    self._schema_problem = str(error)
                self._publish(reachable=True, reason=str(error))
                return
            kind = getattr(error, "kind", "")
            self._publish(reachable=False, reason=f"{kind}: {error}" if kind else str(error))

    def _publish(self, reachable: bool | None, reason: str = "") -> None:
        """Recompute the inventory and notify listeners of a change; before start-up has settled,
        only an unreachable XDM is published (so an outage shows at once)."""
        with self._notify_lock:
            if reachable is not None:
                self._reach_hint = reachable
            if not self._settled and reachable is not False:
                return
            with self._lock:
                old = self._inventory
                cards = with_driver_bus_ids(compose_cards(self._stream_cards, self._facts), self._proc_root)
                versions = {f.driver_version for f in self._facts} | {c.driver_version for c in cards}
                self._node["driver_version"] = ",".join(sorted(v for v in versions if v))
                is_reachable = old.reachable if reachable is None else reachable
                if self._schema_problem:
                    # never a healthy card on an untrusted schema; with no card, say it as an outage
                    cards = tuple(replace(c, healthy=False, health_reason=self._schema_problem) for c in cards)
                    if not cards:
                        is_reachable, reason = False, self._schema_problem
                since = old.unreachable_since if not old.reachable and old.unreachable_since else time.time()
                new = Inventory(
                    cards=cards,
                    reachable=is_reachable,
                    unreachable_reason="" if is_reachable else (reason or old.unreachable_reason),
                    unreachable_since=0.0 if is_reachable else since,
                    node=dict(self._node),
                    generation=old.generation,
                )
                if new == old:
                    return
                self._inventory = new = replace(new, generation=old.generation + 1)
            self._listeners.notify(new)

    def allocate(self, request: GrantRequest) -> Grant:
        return self.client.allocate(request)

    def release(self, grant_id: str) -> None:
        self.client.release(grant_id)

    def metrics_snapshot(self) -> Sequence[MetricSample]:
        return self.client.exporter_get_data_list()

    def metrics_stream(self, cancel: threading.Event) -> Iterator[Sequence[MetricSample]]:
        """The exporter's pushes until ``cancel`` is set or the backend stops; a ``CancelEvent`` cancels
        the stream the moment it is set, a plain Event is seen between pushes."""
        sub = self.client.exporter_data_stream()
        with self._lock:
            self._subs.add(sub)
        if self._stop.is_set():  # stopped while subscribing: ``stop`` may have missed this one
            sub.cancel()
        forget = cancel.on_set(sub.cancel) if isinstance(cancel, CancelEvent) else None
        try:
            for batch in sub:
                if cancel.is_set():
                    break
                yield batch
        finally:
            if forget is not None:
                forget()
            sub.cancel()
            with self._lock:
                self._subs.discard(sub)
