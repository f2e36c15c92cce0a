"""The latest metric readings, kept between XDM's pushes and Nomad's ticks.

Nomad asks for stats at its own ``collection_interval``; XDM pushes (or we
poll) at the exporter's interval. The cache decouples the two: the feed
writes, the Stats stream and the Prometheus collector read, and neither
ever calls XDM for a read. Each reading keeps the time *we* received it, so
a value that stopped arriving is shown as stale rather than as fresh.

Keys: per card by the device string exactly as the sample named it (a card
minor such as ``"3"`` or a UUID; the stats layout resolves both through the
inventory), and per grant by the sample's ``allocation_id`` label. The
number of readings is bounded: the least recently updated go first.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from typing import NamedTuple

from nomad_plugin.model.metrics import ALL_METRIC_NAMES, GRANT_LABEL, MetricSample

Clock = Callable[[], float]
DEFAULT_MAX_ENTRIES = 16384
_KNOWN_NAMES = frozenset(ALL_METRIC_NAMES.values())


class Reading(NamedTuple):
    """One cached value: ``received`` is the cache's clock (seconds) when it arrived.

    The clock is monotonic in the plugin, so ages and staleness survive wall
    clock jumps; the stats layout turns ``received`` into wall time only for
    timestamps.
    """

    value: float
    received: float
    timestamp_ms: int = 0


class MetricsCache:
    """Thread-safe map (scope, key, metric name) -> latest ``Reading``; scope is "card" or "grant"."""

    def __init__(self, clock: Clock = time.monotonic, max_entries: int = DEFAULT_MAX_ENTRIES) -> None:
        if max_entries < 1:
            raise ValueError(f"max_entries must be >= 1, got {max_entries}")
        self._clock = clock
        self._max = max_entries
        self._lock = threading.Lock()
        # Every reading; a dict keeps insertion order and an update re-inserts its key at the end,
        # so the least recently updated come first.
        self._data: dict[tuple[str, str, str], Reading] = {}
        # The readings of the known metrics again, by (scope, key): what the layout asks for.
        self._by_key: dict[tuple[str, str], dict[str, Reading]] = {}
        self._source = ""
        self._updates = 0

    def update(self, samples: Iterable[MetricSample], source: str = "") -> int:
        """Store a batch (one snapshot or one pushed message); returns how many were kept."""
        now = self._clock()
        kept = 0
        data, by_key = self._data, self._by_key
        with self._lock:
            for device, metric_id, name, value, timestamp_ms, labels in samples:
                name = name or ALL_METRIC_NAMES.get(metric_id, "")
                if not name:
                    continue
                grant = labels.get(GRANT_LABEL, "") if labels else ""
                owner = ("grant", grant) if grant else ("card", device)
                key = (owner[0], owner[1], name)
                reading = Reading(float(value), now, timestamp_ms)
                data.pop(key, None)  # re-inserted last: the least recently updated stay first
                data[key] = reading
                if name in _KNOWN_NAMES:
                    by_key.setdefault(owner, {})[name] = reading
                kept += 1
            while len(self._data) > self._max:
                scope, who, name = oldest = next(iter(self._data))
                del self._data[oldest]
                group = self._by_key.get((scope, who))
                if group is not None:
                    group.pop(name, None)
                    if not group:
                        del self._by_key[(scope, who)]
            self._updates += 1
            if source:
                self._source = source
        return kept

    def card(self, device: str, name: str) -> Reading | None:
        with self._lock:
            return self._data.get(("card", device, name))

    def card_readings(self, devices: Iterable[str]) -> dict[str, Reading]:
        """Every known metric of one card (named by minor and/or UUID), the freshest per name."""
        out: dict[str, Reading] = {}
        with self._lock:
            for device in devices:
                for name, found in self._by_key.get(("card", device), {}).items() if device else ():
                    seen = out.get(name)
                    if seen is None or found.received > seen.received:
                        out[name] = found
        return out

    def grant_readings(self, grant_id: str) -> dict[str, Reading]:
        """Every known metric of one grant (samples labelled with its allocation id)."""
        with self._lock:
            return dict(self._by_key.get(("grant", grant_id), {}))

    def devices(self) -> list[str]:
        """Every card key with at least one reading, in first-seen order."""
        with self._lock:
            return list(dict.fromkeys(key for scope, key, _ in self._data if scope == "card"))

    def grants(self) -> list[str]:
        with self._lock:
            return list(dict.fromkeys(key for scope, key, _ in self._data if scope == "grant"))

    def __len__(self) -> int:
        with self._lock:
            return len(self._data)

    @property
    def source(self) -> str:
        """Where the last batch came from: "stream", "poll", "nvml", "nvml-extras" or ""."""
        with self._lock:
            return self._source

    @property
    def update_count(self) -> int:
        with self._lock:
            return self._updates
