"""NVML beside XDM: one session serving enrichment, the metrics fallback and the extra stats.

XDM reports NVIDIA cards without PCI bus IDs, NUMA nodes or clocks, and its exporter lacks some of
nomad-device-nvidia's stats (encoder, decoder, BAR1, ECC by location). With ``nvml_enrich`` on,
``NvmlCompanion`` fills those gaps from one NVML session: it enriches inventories (cards matched by
UUID, else, for NVIDIA cards, by minor; XDM's own values win), reads the cards when XDM has no
exporter, and feeds the extra stats each interval. Any NVML failure closes the session until a
``Backoff`` has passed (each distinct failure logged once); meanwhile inventories pass unchanged,
the fallback raises ``BackendUnavailable`` and the extra stats show "N/A".
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from nomad_plugin.model.card import CUDA_VERSION, Backend, Inventory, InventoryListener
from nomad_plugin.model.errors import BackendUnavailable
from nomad_plugin.model.metrics import MetricSample
from nomad_plugin.nvml import devices, lib
from nomad_plugin.nvml.lib import Nvml
from nomad_plugin.util.threads import Backoff

log = logging.getLogger(__name__)

EXTRAS_SOURCE = "nvml-extras"
T = TypeVar("T")


@dataclass(frozen=True)
class CardFacts:
    uuid: str
    minor: int
    pci_bus_id: str = ""
    numa_node: int | None = None
    extra: Mapping[str, str] = field(default_factory=dict)


def read_facts(nvml: Nvml, sysfs_root: str = "/sys", first: devices.FirstReadings | None = None) -> list[CardFacts]:
    refs, failed = devices.list_devices(nvml)
    for index, message in failed.items():
        log.warning("enrichment skips GPU index %d: %s", index, message)
    facts = []
    cuda = devices.cuda_version(nvml)
    for ref in refs:
        try:
            pci = devices.bus_id(nvml, ref.handle)
            extras = devices.card_extras(nvml, ref.handle)
            numa = devices.numa_node(nvml, ref.handle, pci, sysfs_root)
        except (nvml.NVMLError, ValueError) as exc:
            log.warning("enrichment skips %s: %s", ref.uuid, exc)
            continue
        extras = {**extras, CUDA_VERSION: cuda} if cuda else extras
        facts.append(CardFacts(ref.uuid, ref.minor, pci, numa, first.apply(ref.uuid, extras) if first else extras))
    return facts


def apply_facts(inventory: Inventory, facts: Sequence[CardFacts]) -> Inventory:
    by_uuid = {f.uuid: f for f in facts}
    by_minor = {f.minor: f for f in facts}
    cards = []
    for card in inventory.cards:
        # A non-NVIDIA card's minor says nothing about NVML's cards.
        found = by_uuid.get(card.uuid) or (by_minor.get(card.minor) if card.vendor in ("", "nvidia") else None)
        if found is not None:
            numa = card.numa_node if card.numa_node is not None else found.numa_node
            extra = {**found.extra, **card.extra}
            card = replace(card, pci_bus_id=card.pci_bus_id or found.pci_bus_id, numa_node=numa, extra=extra)
        cards.append(card)
    return inventory if tuple(cards) == inventory.cards else replace(inventory, cards=tuple(cards))


class NvmlCompanion:
    """The one NVML session of an XDM node; every NVML call goes through ``_use``, one at a time."""

    def __init__(
        self,
        loader: Callable[[], Nvml] = lib.load_if_library,
        sysfs_root: str = "/sys",
        interval: float = 1.0,
        backoff: Backoff | None = None,
    ) -> None:
        self._loader = loader
        self._sysfs_root = sysfs_root
        self._interval = interval
        self._backoff = backoff or Backoff(initial=interval, cap=300.0)
        self._first = devices.FirstReadings()
        self._lock = threading.Lock()
        self._nvml: Nvml | None = None  # the open session
        self._retry_at = 0.0
        self._logged = ""
        self.last_error = ""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def open(self) -> str:
        """Open the session now: "" when NVML works here, else why not (not logged)."""
        with self._lock:
            return "" if self._session() is not None else self.last_error

    def enrich(self, inventory: Inventory) -> Inventory:
        facts = self._use(lambda nvml: read_facts(nvml, self._sysfs_root, self._first))
        return inventory if facts is None else apply_facts(inventory, facts)

    def metrics_snapshot(self) -> list[MetricSample]:
        """NVML's readings of every card, for when XDM has no exporter."""
        samples = self._use(self._readings)
        if samples is None:
            raise BackendUnavailable(f"NVML is not available: {self.last_error}")
        return samples

    def start_extras(self, sink: Callable[[list[MetricSample]], object]) -> None:
        """Hand ``sink`` the stats only NVML has, once per interval, until ``stop``."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._feed, args=(sink,), name="lingjun-nvml-extras", daemon=True)
            self._thread.start()

    def stop(self, timeout: float = 1.0) -> None:
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
        with self._lock:
            self._close()

    def _feed(self, sink: Callable[[list[MetricSample]], object]) -> None:
        while not self._stop.is_set():
            samples = self._use(self._extras)
            if samples is not None:
                sink(samples)
            self._stop.wait(self._interval)

    @staticmethod
    def _extras(nvml: Nvml) -> list[MetricSample]:
        ts_ms = int(time.time() * 1000)
        refs, _ = devices.list_devices(nvml)
        return [
            devices.sample(r.uuid, k, v, ts_ms)
            for r in refs
            for k, v in devices.official_values(nvml, r.handle).items()
        ]

    @staticmethod
    def _readings(nvml: Nvml) -> list[MetricSample]:
        refs = [(ref, devices.mig_mode(nvml, ref.handle)[1]) for ref in devices.list_devices(nvml)[0]]
        result = devices.poll(nvml, refs, int(time.time() * 1000))
        if result.fatal:
            raise BackendUnavailable(result.fatal)
        return result.samples

    def _use(self, read: Callable[[Nvml], T]) -> T | None:
        """``read`` on the open session; None while NVML cannot be had."""
        with self._lock:
            nvml, result = self._session(), None
            try:
                result = read(nvml) if nvml is not None else None
            except Exception as exc:  # NVML gone, a card lost mid-call: close, retry later, never raise
                self._failed(nvml, exc)
            if result is not None:
                self._backoff.reset()
                if self._logged:
                    log.info("NVML on this XDM node works again")
                self._logged = ""
            elif self.last_error != self._logged:
                log.warning("NVML on this XDM node (enrichment, extra stats) unavailable: %s", self.last_error)
                self._logged = self.last_error
            return result

    def _session(self) -> Nvml | None:
        if self._nvml is None and time.monotonic() >= self._retry_at:
            nvml = None
            try:
                nvml = self._loader()
                nvml.nvmlInit()
                self._nvml, self.last_error = nvml, ""
            except Exception as exc:
                self._failed(nvml, exc)
        return self._nvml

    def _failed(self, nvml: Nvml | None, exc: Exception) -> None:
        self.last_error = lib.describe(nvml, exc) if nvml is not None else str(exc)
        self._close()
        self._retry_at = time.monotonic() + self._backoff.next_delay()

    def _close(self) -> None:
        nvml, self._nvml = self._nvml, None
        if nvml is not None:
            try:
                nvml.nvmlShutdown()
            except Exception as exc:  # shutting down a broken NVML may fail too; nothing to do
                log.debug("nvmlShutdown: %s", exc)


class EnrichedBackend:
    """An XDM backend whose inventories pass through the companion's enrichment."""

    def __init__(self, inner: Backend, companion: NvmlCompanion) -> None:
        self._inner = inner
        self._companion = companion
        self.name = inner.name

    def __getattr__(self, attr: str) -> Any:
        return getattr(self._inner, attr)

    def stop(self) -> None:
        self._inner.stop()
        self._companion.stop()

    def inventory(self) -> Inventory:
        return self._companion.enrich(self._inner.inventory())

    def subscribe(self, listener: InventoryListener) -> Callable[[], None]:
        return self._inner.subscribe(lambda inv: listener(self._companion.enrich(inv)))
