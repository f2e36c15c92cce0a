"""The contract every device backend (XDM, NVML) fulfils for the Nomad layer.

A backend owns its I/O and threads; the Nomad-facing services only see the
plain types of ``nomad_plugin.model``. Implementations: ``nomad_plugin.xdm.backend``
and ``nomad_plugin.nvml.backend``; ``nomad_plugin.backend_select.select_backend`` picks one.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Protocol

from nomad_plugin.model.card import Inventory
from nomad_plugin.model.grant import Grant, GrantRequest
from nomad_plugin.model.metrics import MetricSample

InventoryListener = Callable[[Inventory], None]


class Backend(Protocol):
    #: "xdm" or "nvml": goes into attributes and logs.
    name: str

    def start(self) -> None:
        """Begin watching (threads, streams). Must not block on the device."""

    def stop(self) -> None:
        """Stop all threads and close channels; idempotent."""

    def inventory(self) -> Inventory:
        """The latest complete snapshot (possibly stale, see ``reachable``)."""

    def subscribe(self, listener: InventoryListener) -> Callable[[], None]:
        """Call ``listener`` with every new snapshot; returns an unsubscribe."""

    def allocate(self, request: GrantRequest) -> Grant:
        """Grant exactly what is asked, verified, or raise a ``PluginError``.

        On any mismatch the backend releases what it got before raising.
        """

    def release(self, grant_id: str) -> None:
        """Release a grant; "not found" counts as released (idempotent)."""

    def metrics_snapshot(self) -> Sequence[MetricSample]:
        """One poll of current metrics; raises ``BackendUnavailable``."""

    def metrics_stream(self, cancel: threading.Event) -> Iterator[Sequence[MetricSample]]:
        """One metrics subscription; ends or raises when it breaks.

        The caller resubscribes with ``nomad_plugin.util.threads.Backoff``.
        """
