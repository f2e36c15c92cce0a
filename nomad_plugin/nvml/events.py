"""One NVML event set: register cards for XID/DBE events, wait with a timeout.

Waiting uses ``nvmlEventSetWait_v2`` with a short timeout so the watcher
thread notices ``stop`` promptly; a timeout is not an error.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any

from nomad_plugin.nvml import lib
from nomad_plugin.nvml.devices import DeviceRef
from nomad_plugin.nvml.lib import Nvml

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
