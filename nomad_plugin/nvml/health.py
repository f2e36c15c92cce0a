"""What makes an NVIDIA card unhealthy: NVML's XID and ECC events, and the verdict per card.

Policy (docs/nvml.md, "Health policy"): a critical XID (one not in
``xid_ignore``) or a double-bit ECC event holds the card unhealthy for
``hold_s``; a new fault restarts the hold. A card NVML reports lost (GPU is
lost, reset required) stays unhealthy until a probe succeeds. If the event
loop itself fails, every card it watched is unhealthy until the loop runs
again: we cannot see their faults, so we do not vouch for them. Ignored XIDs
are logged, never acted on. Hysteresis before a card is schedulable again
is the fingerprint layer's, from ``Card.healthy``.
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
LOST, LOOP, EVENT = "lost", "loop", "event"
_PRIORITY = (LOST, LOOP, EVENT)
#: NVML's "not a MIG instance" marker in event data.
NO_INSTANCE = 0xFFFFFFFF


def stamp(now: float) -> str:
    """Unix seconds as an ISO-8601 UTC time for reasons ("2024-05-01T10:00:00Z")."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now))


class HealthBook:
    """Faults per card UUID, each a reason and an end time (None: until cleared).

    Every ``record_*`` returns True when the card's verdict changed.
    """

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
