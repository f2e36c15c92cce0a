"""Enriching the XDM backend's cards with what only NVML knows.

XDM reports NVIDIA cards without PCI bus IDs, NUMA nodes or clocks. With
NVML on the node we fill those gaps, matching cards by UUID (fallback: the
minor number), and never overwrite what XDM already gave.

``read_facts`` does the NVML I/O; ``apply_facts`` is pure; ``enrich`` is the
two together. ``Enricher`` keeps NVML initialised between calls for the XDM
backend's resync loop and turns every NVML failure into "no enrichment".
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace

from nomad_plugin.goplugin.logging import get_logger
from nomad_plugin.model.backend_port import Backend, InventoryListener
from nomad_plugin.model.card import Card, Inventory
from nomad_plugin.model.grant import Grant, GrantRequest
from nomad_plugin.model.metrics import MetricSample
from nomad_plugin.nvml import lib
from nomad_plugin.nvml.devices import (
    DeviceRef,
    FirstReadings,
    bus_id,
    card_extras,
    list_devices,
    numa_node,
    official_values,
    sample,
)
from nomad_plugin.nvml.lib import Nvml
from nomad_plugin.stats.cache import MetricsCache
from nomad_plugin.util.backoff import Backoff

log = get_logger(__name__)


@dataclass(frozen=True)
class CardFacts:
    """What NVML says about one physical card."""

    uuid: str
    minor: int
    pci_bus_id: str = ""
    numa_node: int | None = None
    extra: Mapping[str, str] = field(default_factory=dict)


def read_facts(nvml: Nvml, sysfs_root: str = "/sys", first: FirstReadings | None = None) -> list[CardFacts]:
    """One pass over an initialised NVML; a card that fails to read is skipped."""
    refs, failed = list_devices(nvml)
    for index, message in failed.items():
        log.warning("enrichment skips GPU index %d: %s", index, message)
    facts = []
    for ref in refs:
        try:
            pci = bus_id(nvml, ref.handle)
            extras = card_extras(nvml, ref.handle)
            facts.append(
                CardFacts(
                    uuid=ref.uuid,
                    minor=ref.minor,
                    pci_bus_id=pci,
                    numa_node=numa_node(nvml, ref.handle, pci, sysfs_root),
                    extra=first.apply(ref.uuid, extras) if first is not None else extras,
                )
            )
        except (nvml.NVMLError, ValueError) as exc:
            log.warning("enrichment skips %s: %s", ref.uuid, exc)
    return facts


def _match(card: Card, by_uuid: Mapping[str, CardFacts], by_minor: Mapping[int, CardFacts]) -> CardFacts | None:
    if card.uuid and card.uuid in by_uuid:
        return by_uuid[card.uuid]
    if card.vendor not in ("", "nvidia"):
        return None  # a non-NVIDIA card's minor says nothing about NVML's cards
    return by_minor.get(card.minor)


def apply_facts(inventory: Inventory, facts: Sequence[CardFacts]) -> Inventory:
    """Fill empty PCI/NUMA fields and missing extra keys; XDM's own values win."""
    by_uuid = {f.uuid: f for f in facts}
    by_minor = {f.minor: f for f in facts}
    cards = []
    changed = False
    for card in inventory.cards:
        found = _match(card, by_uuid, by_minor)
        if found is None:
            cards.append(card)
            continue
        extra = {**found.extra, **card.extra}
        new = replace(
            card,
            pci_bus_id=card.pci_bus_id or found.pci_bus_id,
            numa_node=card.numa_node if card.numa_node is not None else found.numa_node,
            extra=extra,
        )
        changed |= new != card
        cards.append(new)
    return replace(inventory, cards=tuple(cards)) if changed else inventory


def enrich(inventory: Inventory, nvml: Nvml, sysfs_root: str = "/sys", first: FirstReadings | None = None) -> Inventory:
    """``inventory`` with NVML's facts applied (``nvml`` already initialised)."""
    return apply_facts(inventory, read_facts(nvml, sysfs_root, first))


class Enricher:
    """Keeps NVML open for repeated enrichment; a failure returns the input unchanged."""

    def __init__(self, nvml: Nvml | None = None, loader: Callable[[], Nvml] = lib.load, sysfs_root: str = "/sys"):
        self._nvml = nvml
        self._loader = loader
        self._sysfs_root = sysfs_root
        self._open = False
        self._first = FirstReadings()
        self.last_error = ""

    def __call__(self, inventory: Inventory) -> Inventory:
        try:
            if not self._open:
                if self._nvml is None:
                    self._nvml = self._loader()
                self._nvml.nvmlInit()
                self._open = True
            result = enrich(inventory, self._nvml, self._sysfs_root, self._first)
        except lib.NvmlMissing as exc:
            self.last_error = str(exc)
            return inventory
        except Exception as exc:
            nvml = self._nvml
            self.last_error = lib.describe(nvml, exc) if nvml is not None else str(exc)
            log.warning("NVML enrichment failed: %s", self.last_error)
            return inventory
        self.last_error = ""
        return result

    def close(self) -> None:
        if self._open and self._nvml is not None:
            self._open = False
            try:
                self._nvml.nvmlShutdown()
            except self._nvml.NVMLError as exc:
                log.warning("nvmlShutdown failed: %s", exc)


log = get_logger(__name__)

SOURCE = "nvml-extras"
RESCAN_EVERY = 60  # intervals between re-enumerating cards (hot-plug is rare)


class NvmlExtrasFeed:
    """One daemon thread; ``stop()`` ends it within one interval."""

    def __init__(
        self,
        cache: MetricsCache,
        interval: float = 1.0,
        loader: Callable[[], Nvml] = lib.load,
        backoff: Backoff | None = None,
    ) -> None:
        self._cache = cache
        self._interval = interval
        self._loader = loader
        self._backoff = backoff or Backoff(initial=interval, cap=300.0)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_error = ""
        self.polls = 0

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="lingjun-nvml-extras", daemon=True)
            self._thread.start()

    def stop(self, timeout: float = 1.0) -> None:
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    def _run(self) -> None:
        nvml: Nvml | None = None
        refs: list[DeviceRef] = []
        polls_since_scan = 0
        while not self._stop.is_set():
            try:
                if nvml is None:
                    nvml = self._loader()
                    nvml.nvmlInit()
                    refs, polls_since_scan = [], RESCAN_EVERY
                if polls_since_scan >= RESCAN_EVERY:
                    refs, _ = list_devices(nvml)
                    polls_since_scan = 0
                self._poll(nvml, refs)
                polls_since_scan += 1
                self._backoff.reset()
                self._last_error = ""
                self._stop.wait(self._interval)
            except Exception as exc:  # NVML gone, a card lost: retry later, never die
                message = lib.describe(nvml, exc) if nvml is not None else str(exc)
                if message != self._last_error:
                    log.warning("NVML extras for stats (encoder, decoder, BAR1, ECC) unavailable: %s", message)
                    self._last_error = message
                nvml = self._shutdown(nvml)
                self._stop.wait(self._backoff.next_delay())
        self._shutdown(nvml)

    def _poll(self, nvml: Nvml, refs: list[DeviceRef]) -> None:
        ts_ms = int(time.time() * 1000)
        samples = []
        for ref in refs:
            for name, value in official_values(nvml, ref.handle).items():
                samples.append(sample(ref.uuid, name, value, ts_ms))
        self._cache.update(samples, SOURCE)
        self.polls += 1

    @staticmethod
    def _shutdown(nvml: Nvml | None) -> None:
        if nvml is not None:
            try:
                nvml.nvmlShutdown()
            except Exception as exc:  # shutting down a broken NVML may fail too; nothing to do
                log.debug("nvmlShutdown: %s", exc)
        return None


class EnrichedBackend:
    """An XDM backend whose inventories pass through an enrichment function."""

    def __init__(self, inner: Backend, enrich: Callable[[Inventory], Inventory]) -> None:
        self._inner = inner
        self._enrich = enrich
        self.name = inner.name

    def start(self) -> None:
        self._inner.start()

    def stop(self) -> None:
        self._inner.stop()
        close = getattr(self._enrich, "close", None)
        if callable(close):
            close()

    def inventory(self) -> Inventory:
        return self._enrich(self._inner.inventory())

    def subscribe(self, listener: InventoryListener) -> Callable[[], None]:
        return self._inner.subscribe(lambda inv: listener(self._enrich(inv)))

    def allocate(self, request: GrantRequest) -> Grant:
        return self._inner.allocate(request)

    def release(self, grant_id: str) -> None:
        self._inner.release(grant_id)

    def metrics_snapshot(self) -> Sequence[MetricSample]:
        return self._inner.metrics_snapshot()

    def metrics_stream(self, cancel: threading.Event) -> Iterator[Sequence[MetricSample]]:
        return self._inner.metrics_stream(cancel)
