"""The seam between the go-plugin transport and the plugin's engines.

``nomad_plugin/nomad/device_service.py`` (the gRPC servicer) calls only these
methods. SetConfig builds the engines; Fingerprint, Reserve and Stats delegate
to them. Until SetConfig arrives the app serves an empty, healthy plugin.

This placeholder keeps Nomad's contract (streams never end, Reserve always
returns ``container_res``); the real wiring of backend, fingerprint engine,
reserver and stats feed replaces the bodies, not the signatures.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence

from nomad_plugin._proto.nomad import device_pb2
from nomad_plugin.config.model import PluginConfig
from nomad_plugin.model.errors import ReservationRejected


class PluginApp:
    def __init__(self) -> None:
        self.config: PluginConfig | None = None
        self._lock = threading.Lock()

    def set_config(self, config: PluginConfig) -> None:
        """Apply a validated config; idempotent for an equal config."""
        with self._lock:
            self.config = config

    def fingerprints(self, cancel: threading.Event) -> Iterator[device_pb2.FingerprintResponse]:
        """Yield the first response at once, then one per change, until cancelled."""
        yield device_pb2.FingerprintResponse()
        cancel.wait()

    def reserve(self, device_ids: Sequence[str]) -> device_pb2.ReserveResponse:
        if not device_ids:
            return device_pb2.ReserveResponse(container_res=device_pb2.ContainerReservation())
        raise ReservationRejected(f"unknown device IDs: {', '.join(device_ids)}")

    def stats(self, interval: float, cancel: threading.Event) -> Iterator[device_pb2.StatsResponse]:
        """Yield one response per interval from cached data, until cancelled."""
        while not cancel.is_set():
            yield device_pb2.StatsResponse()
            cancel.wait(interval)

    def close(self) -> None:
        """Stop engines and backend threads; called on Shutdown/SIGTERM."""
