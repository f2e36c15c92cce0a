"""NvmlBackend: the ``Backend`` contract on plain NVIDIA nodes, through NVML.

One watcher thread initialises NVML (retrying with ``Backoff``), reads the cards, waits on XID and
double-bit ECC events, probes cards whose fault hold ended and re-reads the cards every
``inventory_resync_period``; each change of the snapshot goes to subscribers.

Health (docs/nvml.md, "Health policy"): a critical XID (one not in ``xid_ignore``) or a DBE holds
the card unhealthy for ``hold_s``, a new fault restarting the hold; a card NVML reports lost stays
unhealthy until a probe succeeds; while the event loop fails every card it watched is unhealthy, as
we cannot see their faults.

A grant is ``NVIDIA_VISIBLE_DEVICES`` plus the device nodes the NVIDIA container toolkit gives:
``/dev/nvidia<minor>``, ``/dev/nvidiactl``, ``/dev/nvidia-uvm(-tools)`` where they exist, and per
MIG instance ``/dev/nvidia-caps/nvidia-cap<N>`` of its GPU and compute instance, ``N`` being the
``DeviceFileMinor`` in ``/proc/driver/nvidia/capabilities/gpu<minor>/mig/gi<g>[/ci<c>]/access``
(NVIDIA's MIG user guide, "Device Nodes and Capabilities"). NVML can neither share a card nor
create MIG instances.
"""

from __future__ import annotations

import ctypes
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from nomad_plugin.config.model import PluginConfig
from nomad_plugin.model.card import NODE_SOURCE, SOURCE_NVML, Card, Inventory, InventoryListener, MigInstance
from nomad_plugin.model.errors import BackendRefused, BackendUnavailable, GrantMismatch, ReservationRejected
from nomad_plugin.model.grant import DeviceAsk, DeviceNode, Grant, GrantedDevice, GrantRequest
from nomad_plugin.model.metrics import MetricSample
from nomad_plugin.nvml import devices, lib
from nomad_plugin.nvml.devices import DeviceRef
from nomad_plugin.nvml.lib import Nvml
from nomad_plugin.util.threads import Backoff, Listeners

# Fault kinds, in the order their reason is shown.
LOST, LOOP, EVENT = "lost", "loop", "event"
_PRIORITY = (LOST, LOOP, EVENT)
#: NVML's "not a MIG instance" marker in event data.
NO_INSTANCE = 0xFFFFFFFF


def stamp(now: float) -> str:
    """Unix seconds as an ISO-8601 UTC time for reasons ("2024-05-01T10:00:00Z")."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now))


class HealthBook:
    """Faults per card UUID, each a reason and an end time (None: until cleared); every ``record_*``
    returns True when the card's verdict changed."""

    def __init__(self, xid_ignore: Iterable[int] = (), hold_s: float = 300.0) -> None:
        if hold_s < 0:
            raise ValueError(f"xid_hold: {hold_s!r} must be >= 0 seconds")
        self.xid_ignore = frozenset(int(x) for x in xid_ignore)
        self.hold_s = float(hold_s)
        self._faults: dict[str, dict[str, tuple[str, float | None]]] = {}
        self._xids: dict[str, int] = {}

    def verdict(self, uuid: str) -> tuple[bool, str]:
        faults = self._faults.get(uuid, {})
        reason = next((faults[kind][0] for kind in _PRIORITY if kind in faults), None)
        return (True, "") if reason is None else (False, reason)

    def xid_count(self, uuid: str) -> int:
        """Critical XIDs and DBEs seen on this card since start."""
        return self._xids.get(uuid, 0)

    def record_xid(self, uuid: str, xid: int, now: float, where: str = "") -> bool:
        """An XID event; ``where`` names a MIG instance when NVML gives one."""
        if xid in self.xid_ignore:
            return False
        return self._hold(uuid, f"XID {xid} at {stamp(now)}{f' on {where}' if where else ''}", now)

    def record_dbe(self, uuid: str, now: float) -> bool:
        return self._hold(uuid, f"double-bit ECC error at {stamp(now)}", now)

    def _hold(self, uuid: str, reason: str, now: float) -> bool:
        self._xids[uuid] = self._xids.get(uuid, 0) + 1
        return self._set(uuid, EVENT, reason, now + self.hold_s)

    def record_loop_failure(self, uuids: Iterable[str], message: str, now: float) -> bool:
        reason = f"NVML event loop failed at {stamp(now)}: {message}"
        return any([self._set(uuid, LOOP, reason, None) for uuid in uuids])

    def clear_loop_failure(self) -> bool:
        return any([self._clear(uuid, LOOP) for uuid in list(self._faults)])

    def record_lost(self, uuid: str, message: str, now: float) -> bool:
        return self._set(uuid, LOST, f"{message} (seen at {stamp(now)})", None)

    def record_probe_ok(self, uuid: str) -> bool:
        return self._clear(uuid, LOST)

    def expire(self, now: float) -> list[str]:
        """End finished holds; returns the UUIDs whose hold ended (probe them)."""
        ended = [u for u, f in self._faults.items() if EVENT in f and (f[EVENT][1] or 0.0) <= now]
        for uuid in ended:
            self._clear(uuid, EVENT)
        return ended

    def _set(self, uuid: str, kind: str, reason: str, until: float | None) -> bool:
        before = self.verdict(uuid)
        self._faults.setdefault(uuid, {})[kind] = (reason, until)
        return self.verdict(uuid) != before

    def _clear(self, uuid: str, kind: str) -> bool:
        faults = self._faults.get(uuid, {})
        if kind not in faults:
            return False
        before = self.verdict(uuid)
        del faults[kind]
        if not faults:
            del self._faults[uuid]
        return self.verdict(uuid) != before


@dataclass(frozen=True)
class Event:
    """An event we act on: ``kind`` is "xid" or "dbe"; ``uuid`` "" if unmatched."""

    kind: str
    uuid: str
    xid: int = 0
    gpu_instance_id: int = NO_INSTANCE
    compute_instance_id: int = NO_INSTANCE

    @property
    def where(self) -> str:
        if self.gpu_instance_id == NO_INSTANCE:
            return ""
        return f"MIG GPU instance {self.gpu_instance_id}/compute instance {self.compute_instance_id}"


def handle_key(handle: Any) -> int:
    """A stable identity for an NVML handle: events carry a new pointer object to the same device."""
    try:
        value = ctypes.cast(handle, ctypes.c_void_p).value
    except (TypeError, ctypes.ArgumentError):
        return id(handle)
    return int(value) if value is not None else id(handle)


class EventSet:
    """One NVML event set for XID and double-bit ECC events; used by the watcher thread only."""

    def __init__(self, nvml: Nvml) -> None:
        self._nvml = nvml
        self._set: Any = nvml.nvmlEventSetCreate()
        self._by_handle: dict[int, str] = {}
        self.watched: list[str] = []
        #: cards whose XID/DBE events this driver cannot deliver, with the reason
        self.unsupported: dict[str, str] = {}

    def register(self, ref: DeviceRef) -> None:
        """Watch one card; NOT_SUPPORTED lands in ``unsupported``, other errors raise."""
        nvml = self._nvml
        wanted = int(nvml.nvmlEventTypeXidCriticalError) | int(nvml.nvmlEventTypeDoubleBitEccError)
        supported = lib.optional(nvml, "nvmlDeviceGetSupportedEventTypes", ref.handle)
        mask = wanted if supported is None else wanted & int(supported)
        if mask == 0:
            self.unsupported[ref.uuid] = "driver reports no XID/ECC events for this card"
            return
        try:
            nvml.nvmlDeviceRegisterEvents(ref.handle, mask, self._set)
        except nvml.NVMLError as exc:
            if lib.error_code(nvml, exc) != lib.ERROR_NOT_SUPPORTED:
                raise
            self.unsupported[ref.uuid] = lib.describe(nvml, exc)
            return
        self._by_handle[handle_key(ref.handle)] = ref.uuid
        self.watched.append(ref.uuid)

    def wait(self, timeout_ms: int) -> Event | None:
        """The next XID or DBE event; None on timeout (a short one, so the thread sees ``stop``) or another event."""
        nvml = self._nvml
        try:
            data = nvml.nvmlEventSetWait_v2(self._set, timeout_ms)
        except nvml.NVMLError as exc:
            if lib.error_code(nvml, exc) == lib.ERROR_TIMEOUT:
                return None
            raise
        uuid = self._by_handle.get(handle_key(data.device)) or self._uuid_of(data.device)
        gi, ci = int(getattr(data, "gpuInstanceId", NO_INSTANCE)), int(getattr(data, "computeInstanceId", NO_INSTANCE))
        if int(data.eventType) & int(nvml.nvmlEventTypeXidCriticalError):
            return Event("xid", uuid, int(data.eventData), gi, ci)
        if int(data.eventType) & int(nvml.nvmlEventTypeDoubleBitEccError):
            return Event("dbe", uuid, 0, gi, ci)
        return None

    def _uuid_of(self, handle: Any) -> str:
        try:
            return lib.text(self._nvml.nvmlDeviceGetUUID(handle))
        except self._nvml.NVMLError:
            return ""

    def close(self) -> None:
        try:
            self._nvml.nvmlEventSetFree(self._set)
        except self._nvml.NVMLError:
            pass  # freeing a set after an NVML failure may fail too; nothing to do


log = logging.getLogger(__name__)

DEFAULT_XID_HOLD_S = 300.0
HEALTH_SOURCE_KEY = "health_source"
STREAM_PERIOD_S = 1.0
VISIBLE_DEVICES_ENV = "NVIDIA_VISIBLE_DEVICES"
#: Where the driver's capability files are; a test shim may point this elsewhere.
PROC_ROOT = "/proc"
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
        proc_root: str | None = None,  # None: ``PROC_ROOT`` when a grant is built
        dev_root: str = "/dev",
        xid_hold_s: float = DEFAULT_XID_HOLD_S,
        event_timeout_ms: int = 500,
        probe_period_s: float = 10.0,
        clock: Callable[[], float] = time.time,
        backoff: Backoff | None = None,
    ) -> None:
        self.config = config or PluginConfig()
        self._loader: Callable[[], Nvml] = (lambda: nvml) if nvml is not None else loader
        self._nvml: Nvml | None = None  # the loaded bindings; open while ``_initialised``
        self._initialised = False
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
        self._refs: dict[str, devices.DeviceRef] = {}
        self._static: dict[str, Card] = {}
        self._first = devices.FirstReadings()
        self._node: dict[str, str] = {}
        self._unwatched: set[str] = set()
        self._snapshot = Inventory(reachable=False, unreachable_reason="NVML backend not started")
        self._last_error = ""

    def start(self) -> None:
        if self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="nvml-watch", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout=max(5.0, self._timeout_ms / 1000 * 4))
        self._shutdown("nvmlShutdown")

    def wait_ready(self, timeout: float) -> bool:
        """True once the first inventory was read."""
        return self._ready.wait(timeout)

    def inventory(self) -> Inventory:
        with self._lock:
            return self._snapshot

    def subscribe(self, listener: InventoryListener) -> Callable[[], None]:
        return self._listeners.add(listener)

    def allocate(self, request: GrantRequest) -> Grant:
        snapshot = self.inventory()
        if not snapshot.reachable:
            raise BackendUnavailable(f"NVML is not available: {snapshot.unreachable_reason}")
        return build_grant(request, snapshot, self.proc_root or PROC_ROOT, self.dev_root)

    def release(self, grant_id: str) -> None:
        """Nothing to release: NVML grants hold no server-side state."""

    def metrics_snapshot(self) -> Sequence[MetricSample]:
        with self._lock:
            nvml = self._nvml if self._initialised else None
            reason = self._last_error or self._snapshot.unreachable_reason or "NVML not initialised yet"
            refs = [(ref, bool(self._static[u].mig_instances)) for u, ref in self._refs.items() if u in self._static]
        if nvml is None:
            raise BackendUnavailable(f"NVML is not available: {reason}")
        now = self._clock()
        ts_ms = int(now * 1000)
        result = devices.poll(nvml, refs, ts_ms)
        if result.fatal:
            raise BackendUnavailable(f"NVML is not available: {result.fatal}")
        with self._lock:
            changed = any([self._health.record_lost(uuid, message, now) for uuid, message in result.lost.items()])
            health = {
                ref.uuid: (self._health.verdict(ref.uuid)[0], self._health.xid_count(ref.uuid)) for ref, _ in refs
            }
        for uuid, message in result.errors.items():
            log.warning("NVML readings for %s failed: %s", uuid, message)
        if changed:
            self._publish()
        samples = list(result.samples)
        for uuid, (healthy, xids) in health.items():
            samples.append(devices.sample(uuid, "health", 1.0 if healthy else 0.0, ts_ms))
            samples.append(devices.sample(uuid, "xid_errors", xids, ts_ms))
        return samples

    def metrics_stream(self, cancel: threading.Event) -> Iterator[Sequence[MetricSample]]:
        """NVML has no push: a poll a second until ``cancel`` is set."""
        while not cancel.is_set() and not self._stop.is_set():
            yield self.metrics_snapshot()
            cancel.wait(STREAM_PERIOD_S)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                nvml = self._ensure_init()
                self._rescan(nvml)
                self._ready.set()
                self._backoff.reset()
                self._watch(nvml)
            except lib.NvmlMissing as exc:
                self._set_unreachable(str(exc))
            except Exception as exc:
                self._on_failure(exc)
            self._stop.wait(self._backoff.next_delay())

    def _ensure_init(self) -> Nvml:
        with self._lock:
            if self._initialised and self._nvml is not None:
                return self._nvml
        nvml = self._nvml = self._loader()
        nvml.nvmlInit()
        with self._lock:
            self._initialised, self._last_error = True, ""
        return nvml

    def _shutdown(self, what: str) -> None:
        """Close NVML, so that the next attempt calls nvmlInit again."""
        with self._lock:
            was, self._initialised = self._initialised, False
        nvml = self._nvml
        if was and nvml is not None:
            try:
                nvml.nvmlShutdown()
            except nvml.NVMLError as exc:
                log.warning("%s failed: %s", what, lib.describe(nvml, exc))

    def _on_failure(self, exc: Exception) -> None:
        """The loop broke: cards it watched are unhealthy until it runs again."""
        nvml = self._nvml
        message = lib.describe(nvml, exc) if nvml is not None else str(exc)
        log.error("NVML watcher failed: %s", message)
        if nvml is not None and lib.error_code(nvml, exc) in lib.NVML_GONE_CODES:
            self._shutdown("nvmlShutdown after NVML loss")
        with self._lock:
            self._last_error = message
            have_cards = bool(self._static)
            self._health.record_loop_failure(list(self._static), message, self._clock())
        if have_cards:
            self._publish()
        else:
            self._set_unreachable(message)

    def _watch(self, nvml: Nvml) -> None:
        events = EventSet(nvml)
        try:
            for ref in list(self._refs.values()):
                events.register(ref)
            with self._lock:
                self._unwatched = set(events.unsupported)
            for uuid, why in events.unsupported.items():
                log.warning("NVML cannot deliver XID/ECC events for %s: %s", uuid, why)
            self._publish()
            self._loop(nvml, events)
        finally:
            events.close()

    def _loop(self, nvml: Nvml, events: EventSet) -> None:
        """Wait for events; probe, expire holds and resync on time; return when cards came or went."""
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
        if not event.uuid:
            log.warning("NVML %s event for an unknown device (xid=%s)", event.kind, event.xid)
            return
        now = self._clock()
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
        node = {**devices.node_facts(nvml), NODE_SOURCE: SOURCE_NVML}
        refs, failed = devices.list_devices(nvml)
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
        static: dict[str, Card] = {}
        for ref in refs:
            if ref.uuid in lost:
                static[ref.uuid] = old_static[ref.uuid]
                continue
            try:
                card = static[ref.uuid] = devices.read_card(nvml, ref, node, self.sysfs_root, self._first)
            except nvml.NVMLError as exc:
                static[ref.uuid] = old_static.get(ref.uuid) or _placeholder(nvml, ref, node)
                lost[ref.uuid] = lib.describe(nvml, exc)
                continue
            if card.extra.get(devices.HOST_MEMORY_KEY) and ref.uuid not in old_static:
                what = f"card {card.minor} ({card.uuid}, {card.model})"
                log.info(
                    "%s: no framebuffer memory reading (unified memory); as nomad-device-nvidia, its memory "
                    "is the host's RAM, %d MiB",
                    what,
                    card.memory_mib,
                )
        now = self._clock()
        with self._lock:
            self._node = node
            self._refs = {r.uuid: r for r in sorted(refs, key=lambda r: r.index)}
            self._static = static
            for uuid, message in lost.items():
                self._health.record_lost(uuid, f"cannot read card: {message}", now)
        self._publish()

    def _publish(self) -> None:
        with self._lock:
            cards = []
            for uuid, card in self._static.items():
                healthy, reason = self._health.verdict(uuid)
                source = "none" if uuid in self._unwatched else "nvml-events"
                extra = {**card.extra, HEALTH_SOURCE_KEY: source}
                cards.append(replace(card, healthy=healthy, health_reason=reason, extra=extra))
            cards.sort(key=lambda c: c.minor)
            fresh = Inventory(cards=tuple(cards), reachable=True, node=dict(self._node))
            if replace(fresh, generation=self._snapshot.generation) == self._snapshot:
                return
            snapshot = self._snapshot = replace(fresh, generation=self._snapshot.generation + 1)
        self._listeners.notify(snapshot)

    def _set_unreachable(self, reason: str) -> None:
        log.error("NVML unavailable: %s", reason)
        with self._lock:
            prev = self._snapshot
            if not prev.reachable and prev.unreachable_reason == reason:
                return
            since = prev.unreachable_since if not prev.reachable and prev.unreachable_since else self._clock()
            snapshot = self._snapshot = replace(
                prev,
                reachable=False,
                unreachable_reason=reason,
                unreachable_since=since,
                generation=prev.generation + 1,
            )
        self._listeners.notify(snapshot)


def _placeholder(nvml: Nvml, ref: devices.DeviceRef, node: dict[str, str]) -> Card:
    """A card NVML enumerates but cannot describe: kept visible (in its model's group) so it can be unhealthy."""
    try:
        model = lib.text(nvml.nvmlDeviceGetName(ref.handle))
    except nvml.NVMLError:
        model = "unknown"
    driver = node.get("driver_version", "")
    return Card(ref.minor, ref.uuid, model, vendor="nvidia", xpu_type="gpu", memory_mib=0, driver_version=driver)


def _card_of(ask: DeviceAsk, inventory: Inventory) -> Card:
    card = inventory.by_minor(ask.minor)
    if card is None:
        minors = sorted(c.minor for c in inventory.cards)
        raise ReservationRejected(f"minor: card {ask.minor} is not on this node (NVML sees {minors})")
    return card


def _mig_of(ask: DeviceAsk, card: Card, inventory: Inventory) -> MigInstance:
    for mig in card.mig_instances:
        if mig.uuid == ask.mig_uuid:
            return mig
    elsewhere = [c.minor for c in inventory.cards for m in c.mig_instances if m.uuid == ask.mig_uuid]
    if elsewhere:
        raise ReservationRejected(
            f"mig_uuid: MIG instance {ask.mig_uuid} is on card {elsewhere[0]}, not on card {card.minor} as asked"
        )
    raise ReservationRejected(
        f"mig_uuid: unknown MIG instance {ask.mig_uuid} on card {card.minor} "
        f"(NVML sees {', '.join(m.uuid for m in card.mig_instances) or 'none'}); it was removed since the job was placed"
    )


def read_cap_minor(path: Path) -> int:
    """The ``DeviceFileMinor:`` value of one NVIDIA capability ``access`` file."""
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise GrantMismatch(f"MIG capability file {path} cannot be read: {exc.strerror or exc}") from exc
    for line in lines:
        key, _, value = line.partition(":")
        if key.strip() == "DeviceFileMinor" and value.strip().isdigit():
            return int(value.strip())
    raise GrantMismatch(f"MIG capability file {path} has no DeviceFileMinor line")


def _node(dev_root: str, name: str) -> DeviceNode:
    return DeviceNode(container_path=f"/dev/{name}", host_path=f"{dev_root}/{name}")


def build_grant(
    request: GrantRequest, inventory: Inventory, proc_root: str = PROC_ROOT, dev_root: str = "/dev"
) -> Grant:
    """Exactly what was asked, in the asks' order, or a ``PluginError`` naming the offending field. A
    MIG instance is asked for by its UUID; the memory and slices of the ask are not limits to check."""
    if not request.asks:
        return Grant(grant_id=request.grant_id)
    devices: list[GrantedDevice] = []
    visible: list[str] = []
    nodes: list[DeviceNode] = []
    for ask in request.asks:
        card = _card_of(ask, inventory)
        nodes.append(_node(dev_root, f"nvidia{card.minor}"))
        if ask.mig_uuid:
            mig = _mig_of(ask, card, inventory)
            if mig.uuid not in visible:
                devices.append(
                    GrantedDevice(
                        card.minor, card.uuid, memory_gib=mig.memory_mib // 1024, slices=mig.slices, mig_uuid=mig.uuid
                    )
                )
                visible.append(mig.uuid)
                caps = Path(
                    proc_root, "driver/nvidia/capabilities", f"gpu{card.minor}", "mig", f"gi{mig.gpu_instance_id}"
                )
                for access in (caps / "access", caps / f"ci{mig.compute_instance_id}" / "access"):
                    nodes.append(_node(dev_root, f"nvidia-caps/nvidia-cap{read_cap_minor(access)}"))
            continue
        if ask.core or ask.memory_gib:
            raise BackendRefused(
                f"card {ask.minor}: shares are not available with the NVML backend "
                f"(asked core={ask.core}%, memory_gib={ask.memory_gib}); NVML has no time-division "
                "sharing, ask for a whole card or an existing MIG instance, or use the XDM backend"
            )
        if ask.slices:
            raise BackendRefused(
                f"card {ask.minor}: asked for {ask.slices} MIG slice(s) without naming an existing MIG "
                "instance; NVML cannot create MIG instances (create them with nvidia-smi mig)"
            )
        if card.mig_enabled:
            raise BackendRefused(
                f"card {card.minor} ({card.uuid}) is in MIG mode: only its MIG instances can be handed out"
            )
        if card.uuid not in visible:
            devices.append(GrantedDevice(minor=card.minor, uuid=card.uuid))
            visible.append(card.uuid)
    nodes.append(_node(dev_root, "nvidiactl"))
    nodes.extend(_node(dev_root, name) for name in ("nvidia-uvm", "nvidia-uvm-tools") if Path(dev_root, name).exists())
    return Grant(
        grant_id=request.grant_id,
        devices=tuple(devices),
        envs={VISIBLE_DEVICES_ENV: ",".join(visible)},
        device_nodes=tuple(dict.fromkeys(nodes)),
    )
