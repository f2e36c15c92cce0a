"""NvmlBackend: the ``Backend`` contract on plain NVIDIA nodes, through NVML.

One watcher thread initialises NVML (retrying with ``Backoff``), reads the
cards, then waits on NVML events (XID, double-bit ECC) with a short timeout,
probes cards whose fault hold ended, and re-reads the inventory every
``inventory_resync_period``. Every snapshot change is pushed to subscribers.
``pynvml`` is imported only when the backend starts (or injected for tests).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace

from nomad_plugin.config.model import PluginConfig
from nomad_plugin.goplugin.logging import get_logger
from nomad_plugin.model.backend_port import InventoryListener
from nomad_plugin.model.card import Card, Inventory
from nomad_plugin.model.catalog import NODE_SOURCE, SOURCE_NVML
from nomad_plugin.model.errors import BackendUnavailable
from nomad_plugin.model.grant import Grant, GrantRequest
from nomad_plugin.model.metrics import MetricSample
from nomad_plugin.nvml import grants, lib
from nomad_plugin.nvml.devices import HOST_MEMORY_KEY, DeviceRef, FirstReadings, list_devices, node_facts, read_card
from nomad_plugin.nvml.events import Event, EventSet
from nomad_plugin.nvml.grants import build_grant
from nomad_plugin.nvml.health import HealthBook
from nomad_plugin.nvml.lib import Nvml
from nomad_plugin.nvml.readings import poll, sample
from nomad_plugin.util.threads import Backoff, Listeners

log = get_logger(__name__)

#: Default time a critical XID / DBE keeps a card unhealthy (seconds).
DEFAULT_XID_HOLD_S = 300.0
HEALTH_SOURCE_KEY = "health_source"
STREAM_PERIOD_S = 1.0
#: Said once per start: where this backend differs on purpose from nomad-device-nvidia.
DROP_IN_NOTE = (
    "NVML backend, a drop-in for nomad-device-nvidia except on purpose: cards are healthy only while NVML "
    "reads them and no critical XID/ECC fault holds them; a reading that fails keeps the card (unhealthy or "
    "without that attribute) instead of failing the whole fingerprint; the Fingerprint stream stays open when "
    "NVML is missing or enabled = false; MIG instances have stats. See docs/nvidia-dropin.md"
)


class NvmlBackend:
    name = "nvml"

    def __init__(
        self,
        config: PluginConfig | None = None,
        *,
        nvml: Nvml | None = None,
        loader: Callable[[], Nvml] = lib.load,
        sysfs_root: str = "/sys",
        proc_root: str | None = None,
        dev_root: str = "/dev",
        xid_hold_s: float = DEFAULT_XID_HOLD_S,
        event_timeout_ms: int = 500,
        probe_period_s: float = 10.0,
        clock: Callable[[], float] = time.time,
        backoff: Backoff | None = None,
    ) -> None:
        self.config = config or PluginConfig()
        self._nvml_injected = nvml
        self._loader = loader
        self._nvml: Nvml | None = None
        # proc_root None: ``grants.PROC_ROOT`` when a grant is built (/proc; a test shim may move it)
        self.sysfs_root, self.proc_root, self.dev_root = sysfs_root, proc_root, dev_root
        self._timeout_ms = event_timeout_ms
        self._probe_period = probe_period_s
        self._clock = clock
        self._backoff = backoff or Backoff()
        self._health = HealthBook(self.config.xid_ignore, xid_hold_s)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread: threading.Thread | None = None
        self._listeners: Listeners[Inventory] = Listeners()
        self._refs: dict[str, DeviceRef] = {}
        self._static: dict[str, Card] = {}
        self._first = FirstReadings()
        self._node: dict[str, str] = {}
        self._watch_note: dict[str, str] = {}
        self._snapshot = Inventory(reachable=False, unreachable_reason="NVML backend not started")
        self._initialised = False
        self._last_error = ""

    # --- lifecycle ----------------------------------------------------------------
    def start(self) -> None:
        """Start the watcher thread; NVML is initialised there, never here."""
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="nvml-watch", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout=max(5.0, self._timeout_ms / 1000 * 4))
        with self._lock:
            initialised, self._initialised = self._initialised, False
        if initialised and self._nvml is not None:
            try:
                self._nvml.nvmlShutdown()
            except self._nvml.NVMLError as exc:
                log.warning("nvmlShutdown failed: %s", lib.describe(self._nvml, exc))

    def wait_ready(self, timeout: float) -> bool:
        """True once the first inventory was read (for tools and tests)."""
        return self._ready.wait(timeout)

    # --- Backend contract -----------------------------------------------------------
    def inventory(self) -> Inventory:
        with self._lock:
            return self._snapshot

    def subscribe(self, listener: InventoryListener) -> Callable[[], None]:
        return self._listeners.add(listener)

    def allocate(self, request: GrantRequest) -> Grant:
        snapshot = self.inventory()
        if not snapshot.reachable:
            raise BackendUnavailable(f"NVML is not available: {snapshot.unreachable_reason}")
        proc_root = self.proc_root if self.proc_root is not None else grants.PROC_ROOT
        return build_grant(request, snapshot, proc_root, self.dev_root)

    def release(self, grant_id: str) -> None:
        """Nothing to release: NVML grants hold no server-side state."""

    def metrics_snapshot(self) -> Sequence[MetricSample]:
        nvml = self._require_nvml()
        with self._lock:
            refs = [(ref, bool(self._static[u].mig_instances)) for u, ref in self._refs.items() if u in self._static]
        now = self._clock()
        ts_ms = int(now * 1000)
        result = poll(nvml, refs, ts_ms)
        if result.fatal:
            raise BackendUnavailable(f"NVML is not available: {result.fatal}")
        changed = False
        with self._lock:
            for uuid, message in result.lost.items():
                changed |= self._health.record_lost(uuid, message, now)
            verdicts = {ref.uuid: self._health.verdict(ref.uuid)[0] for ref, _ in refs}
            counts = {ref.uuid: self._health.xid_count(ref.uuid) for ref, _ in refs}
        for uuid, message in result.errors.items():
            log.warning("NVML readings for %s failed: %s", uuid, message)
        if changed:
            self._publish()
        samples = list(result.samples)
        for uuid, healthy in verdicts.items():
            samples.append(sample(uuid, "health", 1.0 if healthy else 0.0, ts_ms))
            samples.append(sample(uuid, "xid_errors", counts[uuid], ts_ms))
        return samples

    def metrics_stream(self, cancel: threading.Event) -> Iterator[Sequence[MetricSample]]:
        """NVML has no push: poll once a second until ``cancel`` is set."""
        while not cancel.is_set() and not self._stop.is_set():
            yield self.metrics_snapshot()
            cancel.wait(STREAM_PERIOD_S)

    # --- watcher thread ---------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                nvml = self._ensure_init()
                self._rescan(nvml)
                self._ready.set()
                self._backoff.reset()
                self._watch(nvml)
            except lib.NvmlMissing as exc:
                self._set_unreachable(str(exc), kind="unavailable")
            except Exception as exc:
                self._on_failure(exc)
            self._stop.wait(self._backoff.next_delay())

    def _ensure_init(self) -> Nvml:
        with self._lock:
            if self._initialised and self._nvml is not None:
                return self._nvml
        nvml = self._nvml_injected if self._nvml_injected is not None else self._loader()
        self._nvml = nvml
        nvml.nvmlInit()
        with self._lock:
            self._initialised = True
            self._last_error = ""
        return nvml

    def _reinit(self, nvml: Nvml) -> None:
        """NVML lost its driver: shut down so the next attempt calls nvmlInit again."""
        with self._lock:
            was, self._initialised = self._initialised, False
        if was:
            try:
                nvml.nvmlShutdown()
            except nvml.NVMLError as exc:
                log.warning("nvmlShutdown after NVML loss failed: %s", lib.describe(nvml, exc))

    def _require_nvml(self) -> Nvml:
        with self._lock:
            if self._initialised and self._nvml is not None:
                return self._nvml
            reason = self._last_error or self._snapshot.unreachable_reason or "NVML not initialised yet"
        raise BackendUnavailable(f"NVML is not available: {reason}")

    def _on_failure(self, exc: Exception) -> None:
        """The loop broke: cards it watched are unhealthy until it runs again."""
        nvml = self._nvml
        message = lib.describe(nvml, exc) if nvml is not None else str(exc)
        log.error("NVML watcher failed: %s", message)
        with self._lock:
            self._last_error = message
        if nvml is not None and lib.error_code(nvml, exc) in lib.NVML_GONE_CODES:
            self._reinit(nvml)
        with self._lock:
            have_cards = bool(self._static)
            self._health.record_loop_failure(list(self._static), message, self._clock())
        if have_cards:
            self._publish()
        else:
            self._set_unreachable(message, kind="unavailable")

    def _watch(self, nvml: Nvml) -> None:
        events = EventSet(nvml)
        try:
            for ref in list(self._refs.values()):
                events.register(ref)
            with self._lock:
                self._watch_note = {u: "none" for u in events.unsupported}
            for uuid, why in events.unsupported.items():
                log.warning("NVML cannot deliver XID/ECC events for %s: %s", uuid, why)
            self._publish()
            self._loop(nvml, events)
        finally:
            events.close()

    def _loop(self, nvml: Nvml, events: EventSet) -> None:
        resync = max(1.0, float(self.config.inventory_resync_period))
        next_resync = self._clock() + resync
        next_probe = self._clock() + self._probe_period
        confirmed = False
        while not self._stop.is_set():
            event = events.wait(self._timeout_ms)
            if event is not None:
                self._on_event(event)
            now = self._clock()
            with self._lock:
                # Only a wait that returned proves the loop works again.
                recovered = not confirmed and self._health.clear_loop_failure()
                ended = self._health.expire(now)
            confirmed = True
            to_probe = set(ended)
            if now >= next_probe:
                to_probe |= set(self._refs)
                next_probe = now + self._probe_period
            changed = self._probe(nvml, to_probe, now) or bool(ended) or recovered
            if now >= next_resync:
                self._rescan(nvml)
                next_resync = now + resync
                if set(self._refs) != set(events.watched) | set(events.unsupported):
                    return  # cards came or went: register a fresh event set
            elif changed:
                self._publish()

    def _on_event(self, event: Event) -> None:
        now = self._clock()
        if not event.uuid:
            log.warning("NVML %s event for an unknown device (xid=%s)", event.kind, event.xid)
            return
        with self._lock:
            if event.kind == "xid":
                changed = self._health.record_xid(event.uuid, event.xid, now, event.where)
            else:
                changed = self._health.record_dbe(event.uuid, now)
        log.warning("NVML %s on %s (xid=%s, %s)", event.kind, event.uuid, event.xid, event.where or "whole card")
        if changed:
            self._publish()

    def _probe(self, nvml: Nvml, uuids: set[str], now: float) -> bool:
        """Cheap liveness read; GPU-lost / reset-required keeps a card unhealthy."""
        changed = False
        for uuid in uuids:
            ref = self._refs.get(uuid)
            if ref is None:
                continue
            try:
                nvml.nvmlDeviceGetMemoryInfo(ref.handle)
            except nvml.NVMLError as exc:
                if lib.error_code(nvml, exc) in lib.CARD_FAULT_CODES:
                    with self._lock:
                        changed |= self._health.record_lost(uuid, lib.describe(nvml, exc), now)
                continue
            with self._lock:
                changed |= self._health.record_probe_ok(uuid)
        return changed

    def _rescan(self, nvml: Nvml) -> None:
        """Re-read cards; a card that cannot be read keeps its last known facts, unhealthy."""
        node = {**node_facts(nvml), NODE_SOURCE: SOURCE_NVML}
        refs, failed = list_devices(nvml)
        now = self._clock()
        static: dict[str, Card] = {}
        with self._lock:
            old_refs = {r.index: r for r in self._refs.values()}
            old_static = dict(self._static)
        lost: dict[str, str] = {}
        for index, message in failed.items():
            old = old_refs.get(index)
            if old is not None and old.uuid in old_static:
                refs.append(old)
                lost[old.uuid] = message
            else:
                log.error("NVML cannot read GPU index %d: %s", index, message)
        for ref in refs:
            if ref.uuid in lost:
                static[ref.uuid] = old_static[ref.uuid]
                continue
            try:
                static[ref.uuid] = read_card(nvml, ref, node, self.sysfs_root, self._first)
            except nvml.NVMLError as exc:
                if ref.uuid in old_static:
                    static[ref.uuid] = old_static[ref.uuid]
                else:
                    static[ref.uuid] = _placeholder(nvml, ref, node)
                lost[ref.uuid] = lib.describe(nvml, exc)
                continue
            card = static[ref.uuid]
            if card.extra.get(HOST_MEMORY_KEY) and ref.uuid not in old_static:
                log.info(
                    "card %d (%s, %s): NVML has no framebuffer memory reading (unified memory); its memory is the "
                    "host's RAM, %d MiB, as nomad-device-nvidia reports it",
                    card.minor,
                    card.uuid,
                    card.model,
                    card.memory_mib,
                )
        with self._lock:
            self._node = node
            self._refs = {r.uuid: r for r in sorted(refs, key=lambda r: r.index)}
            self._static = static
            for uuid, message in lost.items():
                self._health.record_lost(uuid, f"cannot read card: {message}", now)
        self._publish()

    # --- snapshots --------------------------------------------------------------------
    def _compose(self) -> Inventory:
        cards = []
        for uuid, card in self._static.items():
            healthy, reason = self._health.verdict(uuid)
            extra = dict(card.extra)
            extra[HEALTH_SOURCE_KEY] = "none" if self._watch_note.get(uuid) else "nvml-events"
            cards.append(replace(card, healthy=healthy, health_reason=reason, extra=extra))
        cards.sort(key=lambda c: c.minor)
        return Inventory(cards=tuple(cards), reachable=True, node=dict(self._node))

    def _publish(self) -> None:
        with self._lock:
            fresh = self._compose()
            if replace(fresh, generation=self._snapshot.generation) == self._snapshot:
                return
            self._snapshot = replace(fresh, generation=self._snapshot.generation + 1)
            snapshot = self._snapshot
        self._listeners.notify(snapshot)

    def _set_unreachable(self, reason: str, kind: str) -> None:
        log.error("NVML unavailable (%s): %s", kind, reason)
        with self._lock:
            prev = self._snapshot
            if not prev.reachable and prev.unreachable_reason == reason:
                return
            since = prev.unreachable_since if not prev.reachable and prev.unreachable_since else self._clock()
            self._snapshot = replace(
                prev,
                reachable=False,
                unreachable_reason=reason,
                unreachable_since=since,
                generation=prev.generation + 1,
            )
            snapshot = self._snapshot
        self._listeners.notify(snapshot)


def _placeholder(nvml: Nvml, ref: DeviceRef, node: dict[str, str]) -> Card:
    """A card NVML enumerates but cannot describe: kept visible (in its model's group) so it can be unhealthy."""
    try:
        model = lib.text(nvml.nvmlDeviceGetName(ref.handle))
    except nvml.NVMLError:
        model = "unknown"
    return Card(
        minor=ref.minor,
        uuid=ref.uuid,
        model=model,
        vendor="nvidia",
        xpu_type="gpu",
        memory_mib=0,
        driver_version=node.get("driver_version", ""),
    )
