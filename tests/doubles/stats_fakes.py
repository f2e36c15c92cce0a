"""Fakes for the stats tests: a metrics backend and hand-built device groups."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from nomad_plugin.model.card import Card, MigInstance
from nomad_plugin.model.errors import BackendUnavailable
from nomad_plugin.model.instances import (
    GroupKey,
    Instance,
    InstanceGroup,
    Kind,
    mig_unit_id,
    share_id,
)
from nomad_plugin.model.metrics import METRIC_IDS, MetricSample


def sample(device: str, name: str, value: float, grant: str = "") -> MetricSample:
    labels = {"allocation_id": grant} if grant else {}
    return MetricSample(
        device=device, metric_id=METRIC_IDS[name], name=name, value=value, timestamp_ms=0, labels=labels
    )


class FakeBackend:
    """Metrics side of a Backend whose stream and snapshot can be switched at run time.

    Modes: "ok", "down" (connection refused) or "unimplemented". ``break_stream``
    makes a running stream raise once, like XDM's UNAVAILABLE on restart.
    """

    name = "fake"

    def __init__(self, push_interval: float = 0.01) -> None:
        self.stream_mode = "ok"
        self.snapshot_mode = "ok"
        self.push_interval = push_interval
        self.stream_value = 10.0
        self.snapshot_value = 20.0
        self.stream_calls = 0
        self.snapshot_calls = 0
        self.break_stream = threading.Event()
        self.streams_open = 0
        self._lock = threading.Lock()

    def _raise_for(self, mode: str) -> None:
        if mode == "down":
            raise BackendUnavailable("connection refused", "connection-refused")
        if mode == "unimplemented":
            raise BackendUnavailable("no exporter", "unimplemented")

    def metrics_snapshot(self) -> Sequence[MetricSample]:
        with self._lock:
            self.snapshot_calls += 1
        self._raise_for(self.snapshot_mode)
        return [sample("0", "core_util_percent", self.snapshot_value)]

    def metrics_stream(self, cancel: threading.Event) -> Iterator[Sequence[MetricSample]]:
        with self._lock:
            self.stream_calls += 1
        self._raise_for(self.stream_mode)
        self.streams_open += 1
        try:
            while not cancel.is_set():
                if self.break_stream.is_set() or self.stream_mode != "ok":
                    self.break_stream.clear()
                    raise BackendUnavailable("exporter restarting", "unavailable")
                yield [sample("GPU-0", "core_util_percent", self.stream_value)]
                cancel.wait(self.push_interval)
        finally:
            self.streams_open -= 1


def card(minor: int, model: str = "H100", memory_mib: int = 81920, mig: tuple[MigInstance, ...] = ()) -> Card:
    return Card(
        minor=minor,
        uuid=f"GPU-{minor}",
        model=model,
        vendor="nvidia",
        xpu_type="gpu",
        memory_mib=memory_mib,
        mig_instances=mig,
    )


def whole_group(cards: Sequence[Card]) -> InstanceGroup:
    insts = tuple(Instance(c.uuid, Kind.WHOLE, c.uuid, c.minor) for c in cards)
    return InstanceGroup(GroupKey("nvidia", "gpu", cards[0].model), insts)


def share_group(c: Card, shares: int, memory_gib: int) -> InstanceGroup:
    insts = tuple(
        Instance(share_id(c.uuid, i), Kind.SHARE, c.uuid, c.minor, index=i, core=100 // shares, memory_gib=memory_gib)
        for i in range(shares)
    )
    return InstanceGroup(GroupKey("nvidia", "gpu", f"{c.model}-share"), insts)


def mig_group(c: Card, units: int = 7, memory_gib: int = 10) -> InstanceGroup:
    insts = tuple(
        Instance(mig_unit_id(c.uuid, i), Kind.MIG, c.uuid, c.minor, index=i, core=0, memory_gib=memory_gib, slices=1)
        for i in range(units)
    )
    return InstanceGroup(GroupKey("nvidia", "gpu", f"{c.model}-mig"), insts)


def count_updates(cache: Any) -> Callable[[], int]:
    """How many batches ``cache`` has stored since this call: a spy on its ``update``, set before the feed starts."""
    seen = [0]
    store = cache.update

    def counted(*args: Any, **kwargs: Any) -> int:
        kept: int = store(*args, **kwargs)
        seen[0] += 1
        return kept

    cache.update = counted
    return lambda: seen[0]
