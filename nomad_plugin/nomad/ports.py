"""What Nomad's services need from the engines behind them: two narrow ports.

``BaseService`` and ``DeviceService`` are adapters from gRPC onto these
Protocols; ``app.PluginApp`` satisfies both, and the composition root
(``serve`` in ``cli/main.py``) hands it over. The services therefore never import the
application that imports them (docs/architecture.md).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Protocol

from nomad_plugin._proto.nomad import device_pb2
from nomad_plugin.config.model import PluginConfig

#: Runs a function once the reply has gone out (gRPC's ``context.add_callback``); False if it cannot.
AfterReply = Callable[[Callable[[], None]], bool]


class ConfigTarget(Protocol):
    """Where a validated SetConfig goes (idempotent; raises a ``PluginError`` to refuse)."""

    def set_config(self, config: PluginConfig) -> None: ...


class DeviceEngines(Protocol):
    """The three DevicePlugin calls, as plain iterators and values.

    An implementation may also offer ``stats_bytes(interval, cancel)`` yielding
    already serialised StatsResponses; ``DeviceService`` prefers it when present.
    """

    def fingerprints(self, cancel: threading.Event) -> Iterator[device_pb2.FingerprintResponse]: ...

    def reserve(
        self, device_ids: Sequence[str], after_reply: AfterReply | None = None
    ) -> device_pb2.ReserveResponse: ...

    def stats(self, interval: float, cancel: threading.Event) -> Iterator[device_pb2.StatsResponse]: ...
