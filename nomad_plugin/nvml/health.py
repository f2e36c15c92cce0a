"""The NVML backend's raw health verdict per card, as a pure state machine.

Policy (documented in docs/nvml.md):

- a critical XID (one not in ``xid_ignore``) or a double-bit ECC event makes
  the card unhealthy for ``hold_s`` seconds ("XID 79 at <time>"); a new fault
  during the hold restarts it. When the hold ends the card is healthy again
  *unless* a probe finds it lost (GPU is lost / reset required), which keeps
  it unhealthy until a probe succeeds;
- if the event loop itself fails, every card it watched is unhealthy until
  the loop runs again (we cannot see their faults, so we do not vouch for them);
- ignored XIDs are counted, never acted on.

Hysteresis (N healthy checks before a card is schedulable again) is applied
upstream by the fingerprint layer from ``Card.healthy``.
"""

from __future__ import annotations

import ctypes
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from nomad_plugin.nvml import lib
from nomad_plugin.nvml.devices import DeviceRef
from nomad_plugin.nvml.lib import Nvml

# Fault kinds, in the order their reason is shown.
LOST = "lost"
LOOP = "loop"
EVENT = "event"
_PRIORITY = (LOST, LOOP, EVENT)


def stamp(now: float) -> str:
    """Unix seconds as an ISO-8601 UTC time for reasons ("2024-05-01T10:00:00Z")."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now))


@dataclass
class _Fault:
    reason: str
    until: float | None  # None: until explicitly cleared


class HealthBook:
    """Faults per card UUID; every ``record_*`` returns True when a verdict changed."""

    def __init__(self, xid_ignore: Iterable[int] = (), hold_s: float = 300.0) -> None:
        if hold_s < 0:
            raise ValueError(f"xid_hold: {hold_s!r} must be >= 0 seconds")
        self.xid_ignore = frozenset(int(x) for x in xid_ignore)
        self.hold_s = float(hold_s)
        self._faults: dict[str, dict[str, _Fault]] = {}
        self._xids: dict[str, int] = {}
        self._ignored: dict[str, int] = {}

    # --- verdicts ---------------------------------------------------------------
    def verdict(self, uuid: str) -> tuple[bool, str]:
        faults = self._faults.get(uuid, {})
        for kind in _PRIORITY:
            if kind in faults:
                return False, faults[kind].reason
        return True, ""

    def xid_count(self, uuid: str) -> int:
        """Critical XIDs and DBEs seen on this card since start."""
        return self._xids.get(uuid, 0)

    def ignored_count(self, uuid: str) -> int:
        return self._ignored.get(uuid, 0)

    def held_until(self, uuid: str) -> float | None:
        fault = self._faults.get(uuid, {}).get(EVENT)
        return fault.until if fault else None

    # --- events -----------------------------------------------------------------
    def record_xid(self, uuid: str, xid: int, now: float, where: str = "") -> bool:
        """An XID event; ``where`` names a MIG instance when NVML gives one."""
        if xid in self.xid_ignore:
            self._ignored[uuid] = self._ignored.get(uuid, 0) + 1
            return False
        suffix = f" on {where}" if where else ""
        return self._hold(uuid, f"XID {xid} at {stamp(now)}{suffix}", now)

    def record_dbe(self, uuid: str, now: float) -> bool:
        return self._hold(uuid, f"double-bit ECC error at {stamp(now)}", now)

    def _hold(self, uuid: str, reason: str, now: float) -> bool:
        self._xids[uuid] = self._xids.get(uuid, 0) + 1
        return self._set(uuid, EVENT, _Fault(reason, now + self.hold_s))

    def record_loop_failure(self, uuids: Iterable[str], message: str, now: float) -> bool:
        reason = f"NVML event loop failed at {stamp(now)}: {message}"
        changed = False
        for uuid in uuids:
            changed |= self._set(uuid, LOOP, _Fault(reason, None))
        return changed

    def clear_loop_failure(self) -> bool:
        return self._clear_kind(LOOP)

    def record_lost(self, uuid: str, message: str, now: float) -> bool:
        return self._set(uuid, LOST, _Fault(f"{message} (seen at {stamp(now)})", None))

    def record_probe_ok(self, uuid: str) -> bool:
        return self._clear(uuid, LOST)

    def expire(self, now: float) -> list[str]:
        """End finished holds; returns the UUIDs whose hold ended (probe them)."""
        ended = [u for u, f in self._faults.items() if EVENT in f and (f[EVENT].until or 0.0) <= now]
        for uuid in ended:
            self._clear(uuid, EVENT)
        return ended

    # --- internals --------------------------------------------------------------
    def _set(self, uuid: str, kind: str, fault: _Fault) -> bool:
        before = self.verdict(uuid)
        self._faults.setdefault(uuid, {})[kind] = fault
        return self.verdict(uuid) != before

    def _clear(self, uuid: str, kind: str) -> bool:
        faults = self._faults.get(uuid)
        if not faults or kind not in faults:
            return False
        before = self.verdict(uuid)
        del faults[kind]
        if not faults:
            del self._faults[uuid]
        return self.verdict(uuid) != before

    def _clear_kind(self, kind: str) -> bool:
        changed = False
        for uuid in [u for u, f in self._faults.items() if kind in f]:
            changed |= self._clear(uuid, kind)
        return changed


#: NVML's "not a MIG instance" marker in event data.
NO_INSTANCE = 0xFFFFFFFF


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
    """A stable identity for an NVML handle (ctypes pointer address, else object id)."""
    try:
        value = ctypes.cast(handle, ctypes.c_void_p).value
    except (TypeError, ctypes.ArgumentError):
        return id(handle)
    return int(value) if value is not None else id(handle)


class EventSet:
    """Owns one NVML event set; not thread-safe (used by the watcher thread only)."""

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
        """The next relevant event, or None on timeout / an event we do not act on."""
        nvml = self._nvml
        try:
            data = nvml.nvmlEventSetWait_v2(self._set, timeout_ms)
        except nvml.NVMLError as exc:
            if lib.error_code(nvml, exc) == lib.ERROR_TIMEOUT:
                return None
            raise
        uuid = self._uuid_of(data.device)
        gi, ci = int(getattr(data, "gpuInstanceId", NO_INSTANCE)), int(getattr(data, "computeInstanceId", NO_INSTANCE))
        event_type = int(data.eventType)
        if event_type & int(nvml.nvmlEventTypeXidCriticalError):
            return Event("xid", uuid, int(data.eventData), gi, ci)
        if event_type & int(nvml.nvmlEventTypeDoubleBitEccError):
            return Event("dbe", uuid, 0, gi, ci)
        return None

    def _uuid_of(self, handle: Any) -> str:
        known = self._by_handle.get(handle_key(handle))
        if known:
            return known
        try:
            return lib.text(self._nvml.nvmlDeviceGetUUID(handle))
        except self._nvml.NVMLError:
            return ""

    def close(self) -> None:
        try:
            self._nvml.nvmlEventSetFree(self._set)
        except self._nvml.NVMLError:
            pass  # freeing a set after an NVML failure may fail too; nothing to do
