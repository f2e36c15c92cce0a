"""Fingerprint: the stream through which Nomad learns the node's devices and their health.

Health says "not now" without wiping the node: an unhealthy card recovers only
after ``recovery_checks`` healthy observations or ``recovery_delay`` seconds of
health; an unreachable backend makes every instance unhealthy, saying since
when; an instance blocked by a grant in another mode is unhealthy with why.

Nomad drops a plugin until the agent restarts when this stream ends, fails or
carries a group ``DeviceGroup.Validate`` rejects (``handleFingerprint`` in
Nomad's ``client/devicemanager/instance.go``, ``plugins/device/device.go``).
So every response goes through :func:`sanitize`, which removes and reports what
Nomad would reject, plus duplicate IDs and groups, empty keys and non-finite
floats. Streams send only when the canonical bytes change; a timer thread
re-evaluates at recovery deadlines and on ``notify_grants_changed`` (so a caller
holding its own lock cannot deadlock with ``grants_view``); a failed rebuild
keeps the last good response.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timezone

from nomad_plugin._proto.nomad import attribute_pb2, device_pb2
from nomad_plugin.config.model import PluginConfig
from nomad_plugin.model.card import Backend, Inventory
from nomad_plugin.model.instances import Attr, Catalog, Kind
from nomad_plugin.nomad.catalog import build_catalog, check_modes
from nomad_plugin.util.text import has_unsafe, printable
from nomad_plugin.util.threads import CancelEvent

log = logging.getLogger(__name__)

Clock = Callable[[], float]


# --- health -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Verdict:
    healthy: bool
    description: str = ""


HEALTHY = Verdict(True)


@dataclass
class _CardState:
    eligible: bool
    reason: str = ""
    ok_count: int = 0
    ok_since: float | None = None


class HealthTracker:
    """Per-card hysteresis over raw backend health (thread-safe): ``observe`` counts one
    observation per report, ``verdicts`` applies time-based recovery without counting one."""

    def __init__(self, recovery_checks: int = 3, recovery_delay: float = 30.0, clock: Clock = time.monotonic) -> None:
        self.recovery_checks = max(1, recovery_checks)
        self.recovery_delay = max(0.0, recovery_delay)
        self._clock = clock
        self._states: dict[str, _CardState] = {}
        self._lock = threading.Lock()

    def observe(self, raw: Mapping[str, tuple[bool, str]]) -> None:
        """One backend report: card key -> (healthy, reason). Absent keys are forgotten."""
        now = self._clock()
        with self._lock:
            for key, (healthy, reason) in raw.items():
                state = self._states.get(key)
                if not healthy:
                    self._states[key] = _CardState(False, reason.strip() or "reported unhealthy")
                elif state is None or state.eligible:
                    self._states[key] = _CardState(True)
                else:
                    state.ok_count += 1
                    if state.ok_since is None:
                        state.ok_since = now
                    self._maybe_recover(state, now)
            for key in [k for k in self._states if k not in raw]:
                del self._states[key]

    def _maybe_recover(self, state: _CardState, now: float) -> None:
        if state.eligible or state.ok_since is None:
            return
        if state.ok_count >= self.recovery_checks or now - state.ok_since >= self.recovery_delay:
            state.eligible, state.reason, state.ok_count, state.ok_since = True, "", 0, None

    def _describe(self, state: _CardState) -> str:
        if state.ok_since is None:
            return state.reason
        return (
            f"recovering from: {state.reason} (healthy {state.ok_count}/{self.recovery_checks} checks; "
            f"eligible after {self.recovery_checks} checks or {self.recovery_delay:g}s healthy)"
        )

    def verdicts(self) -> dict[str, Verdict]:
        """Current verdict per card key, after time-based recovery."""
        now = self._clock()
        with self._lock:
            out: dict[str, Verdict] = {}
            for key, state in self._states.items():
                self._maybe_recover(state, now)
                out[key] = HEALTHY if state.eligible else Verdict(False, self._describe(state))
            return out

    def next_deadline(self) -> float | None:
        """Clock time at which a recovering card becomes eligible by delay (None if none)."""
        with self._lock:
            times = [s.ok_since + self.recovery_delay for s in self._states.values() if s.ok_since is not None]
        return min(times) if times else None


def iso_time(unix_seconds: float) -> str:
    """``2026-10-10T08:00:00Z``: how descriptions say *since when*."""
    stamp = datetime.fromtimestamp(unix_seconds, tz=timezone.utc).isoformat(timespec="seconds")
    return stamp.replace("+00:00", "Z")


def outage_verdict(backend: str, reason: str, since_unix: float) -> Verdict:
    detail = f": {reason.strip()}" if reason.strip() else ""
    return Verdict(False, f"{backend} unreachable since {iso_time(since_unix)}{detail}")


_KIND_USE = {
    Kind.WHOLE: "held whole",
    Kind.SHARE: "has tdm shares granted",
    Kind.MIG: "has MIG slices granted",
    Kind.MIG_INSTANCE: "has MIG instances granted",
}


def conflict_reasons(catalog: Catalog, grants: Mapping[str, frozenset[Kind]]) -> dict[str, str]:
    """Instance ID -> why grants in another mode block it (card uuid -> granted kinds)."""
    reasons: dict[str, str] = {}
    for group in catalog.groups:
        for inst in group.instances:
            others = grants.get(inst.card_uuid, frozenset()) - {inst.kind}
            if others:
                uses = " and ".join(_KIND_USE[k] for k in sorted(others, key=lambda k: k.value))
                reasons[inst.id] = f"card {inst.minor} {uses} (another mode); unavailable as {inst.kind.value}"
    return reasons


def instance_verdicts(
    catalog: Catalog,
    card_verdicts: Mapping[str, Verdict],
    conflicts: Mapping[str, str],
    outage: Verdict | None = None,
) -> dict[str, Verdict]:
    """Combine outage, card health and conflicts into one verdict per instance ID."""
    out: dict[str, Verdict] = {}
    for group in catalog.groups:
        for inst in group.instances:
            card = card_verdicts.get(inst.card_uuid, HEALTHY)
            reasons = [
                *([outage.description] if outage is not None and not outage.healthy else []),
                *([card.description] if not card.healthy else []),
                *([conflicts[inst.id]] if conflicts.get(inst.id) else []),
            ]
            out[inst.id] = Verdict(False, "; ".join(reasons)) if reasons else HEALTHY
    return out


# --- the response ---------------------------------------------------------------------------


def to_proto_attribute(attr: Attr) -> attribute_pb2.Attribute:
    """One typed Nomad attribute (bool before int: a bool is an int in Python)."""
    value = attr.value
    if isinstance(value, bool):
        return attribute_pb2.Attribute(bool_val=value, unit=attr.unit)
    if isinstance(value, int):
        return attribute_pb2.Attribute(int_val=value, unit=attr.unit)
    if isinstance(value, float):
        return attribute_pb2.Attribute(float_val=value, unit=attr.unit)
    return attribute_pb2.Attribute(string_val=str(value), unit=attr.unit)


def build_response(catalog: Catalog, verdicts: Mapping[str, Verdict]) -> device_pb2.FingerprintResponse:
    """All groups of ``catalog``; an instance without a verdict is healthy."""
    response = device_pb2.FingerprintResponse()
    for group in catalog.groups:
        out = response.device_group.add(
            vendor=group.key.vendor, device_type=group.key.device_type, device_name=group.key.name
        )
        for inst in group.instances:
            verdict = verdicts.get(inst.id, HEALTHY)
            device = out.devices.add(ID=inst.id, healthy=verdict.healthy, health_description=verdict.description)
            if inst.pci_bus_id:
                device.hw_locality.pci_bus_id = inst.pci_bus_id
        for key in sorted(group.attributes):
            out.attributes[key].CopyFrom(to_proto_attribute(group.attributes[key]))
    return response


def serialize(response: device_pb2.FingerprintResponse) -> bytes:
    """Canonical bytes used to decide whether a response changed."""
    return response.SerializeToString(deterministic=True)


# --- Nomad's validation rules ---------------------------------------------------------------

# Nomad's ``plugins/shared/structs/units.go``: every unit an attribute may carry.
_BYTE_UNITS = ("KiB", "MiB", "GiB", "TiB", "PiB", "EiB", "kB", "KB", "MB", "GB", "TB", "PB", "EB")
KNOWN_UNITS: frozenset[str] = frozenset(
    (*_BYTE_UNITS, *(f"{u}/s" for u in _BYTE_UNITS), "MHz", "GHz", "mW", "W", "kW", "MW", "GW")
)


def attribute_problem(key: str, attr: attribute_pb2.Attribute) -> str | None:
    """Why Nomad would reject this attribute, or None if it is valid."""
    if not key:
        return "empty attribute key"
    which = attr.WhichOneof("value")
    if which is None:
        return f"attribute {key!r}: no attribute value set"
    if which == "float_val" and not math.isfinite(attr.float_val):
        return f"attribute {key!r}: non-finite float {attr.float_val!r}"
    if attr.unit:
        if attr.unit not in KNOWN_UNITS:
            return f"attribute {key!r}: unknown unit {attr.unit!r}"
        if which not in ("int_val", "float_val"):
            return f"attribute {key!r}: unit {attr.unit!r} on a non-numeric {which}"
    return None


def group_problem(group: device_pb2.DeviceGroup) -> str | None:
    """Why Nomad would reject the whole group (missing vendor/type/name)."""
    for field in ("vendor", "device_type", "device_name"):
        value = getattr(group, field)
        if not value:
            return f"device group {_group_label(group)}: empty {field}"
        if "/" in value or has_unsafe(value):
            # Nomad names a group vendor/type/name in job specs; a control character would also
            # forge lines in the agent's log (the backends clean names: this is the last guard).
            return f"device group {_group_label(group)}: {field} {value!r} holds '/' or a control character"
    return None


def _group_label(group: device_pb2.DeviceGroup) -> str:
    return printable(f"{group.vendor}/{group.device_type}/{group.device_name}", 200)


def sanitize(
    response: device_pb2.FingerprintResponse,
) -> tuple[device_pb2.FingerprintResponse, list[str]]:
    """A response without anything Nomad would reject (a cleaned copy; the input is never modified),
    and what was removed."""
    found: list[str] = []
    out = device_pb2.FingerprintResponse()
    seen_keys: set[tuple[str, str, str]] = set()
    for group in response.device_group:
        reason = group_problem(group)
        if reason is not None:
            found.append(f"dropped {reason}")
            continue
        key = (group.vendor, group.device_type, group.device_name)
        if key in seen_keys:
            found.append(f"dropped duplicate device group {_group_label(group)}")
            continue
        seen_keys.add(key)
        clean = out.device_group.add(vendor=group.vendor, device_type=group.device_type, device_name=group.device_name)
        seen_ids: set[str] = set()
        for device in group.devices:
            if not device.ID:
                found.append(f"dropped a device without ID in {_group_label(group)}")
            elif device.ID in seen_ids:
                found.append(f"dropped duplicate device ID {device.ID!r} in {_group_label(group)}")
            else:
                seen_ids.add(device.ID)
                clean.devices.append(device)
        for attr_key in sorted(group.attributes):
            attr = group.attributes[attr_key]
            reason = attribute_problem(attr_key, attr)
            if reason is not None:
                found.append(f"dropped {reason} in {_group_label(group)}")
            else:
                clean.attributes[attr_key].CopyFrom(attr)
    return (out, found) if found else (response, found)


# --- the engine -------------------------------------------------------------------------------

GrantsView = Callable[[], Mapping[str, frozenset[Kind]]]

# The timer's longest sleep: a safety net, since everything the response depends on pushes or notifies.
SAFETY_TICK_S = 10.0

# How often a waiting stream re-checks a plain Event for cancellation (a CancelEvent wakes it instead).
_CANCEL_POLL_S = 0.25


class FingerprintEngine:
    def __init__(
        self,
        backend: Backend,
        config: PluginConfig,
        grants_view: GrantsView = dict,
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
        self._last_problems: list[str] = []
        self._last_config_problems: list[str] = []

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
        """Unsubscribe and stop the timer (idempotent; waits at most ``timeout`` s). Open streams keep their last response."""
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
        """Rebuild now; calls ``grants_view`` on this thread (never call it holding a lock that
        ``grants_view`` takes: :meth:`notify_grants_changed` is for that)."""
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
        """Catalog -> verdicts -> sanitised response; publish if the bytes changed."""
        try:
            inventory = self._cards or Inventory()
            catalog = build_catalog(inventory, self._config)
            conflicts = conflict_reasons(catalog, self._grants_view())
            verdicts = instance_verdicts(catalog, self._tracker.verdicts(), conflicts, self._outage)
            response, problems = sanitize(build_response(catalog, verdicts))
            data = serialize(response)
        except Exception:
            log.exception("fingerprint rebuild failed; keeping the last good response")
            return
        try:
            config_problems = check_modes(inventory, self._config) if inventory.cards else self._last_config_problems
        except Exception:
            log.exception("checking the configured card modes failed")
            config_problems = self._last_config_problems
        if problems != self._last_problems:
            self._last_problems = problems
            for problem in problems:
                log.error("fingerprint: %s (not sent to Nomad)", problem)
        if config_problems != self._last_config_problems:  # once per change: e.g. mig on a non-MIG model
            self._last_config_problems = config_problems
            for problem in config_problems:
                log.warning("config: %s", problem)
        with self._published:
            self._catalog = catalog
            if data != self._bytes:
                self._response, self._bytes = response, data
                self._response_catalog = catalog
                self._version += 1
                self._published.notify_all()

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
        """The catalog a published response was built from (None once replaced): Stats never name a
        group before the fingerprint that introduces it."""
        with self._published:
            return self._response_catalog if response is self._response else None

    def responses(self, cancel: threading.Event) -> Iterator[device_pb2.FingerprintResponse]:
        """The first response at once, then one per content change, until ``cancel``; never raises
        or ends on its own. Yielded messages are shared between streams: never modify them."""
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
