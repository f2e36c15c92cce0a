"""The latest metric readings, kept between XDM's pushes and Nomad's ticks.

Nomad asks for stats at its own ``collection_interval``; XDM pushes (or we
poll) at the exporter's interval. The cache decouples the two: the feed
writes, the Stats stream and the Prometheus collector read, and neither
ever calls XDM for a read. Each reading keeps the time *we* received it, so
a value that stopped arriving is shown as stale rather than as fresh.

Keys: per card by the device string exactly as the sample named it (a card
minor such as ``"3"`` or a UUID; the layout resolves both through the
inventory), and per grant by the sample's ``allocation_id`` label. The
number of keys is bounded: the least recently updated are dropped first.
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
_new_reading = tuple.__new__  # Reading's fields without its Python-level __new__


class Reading(NamedTuple):
    """One cached value: ``received`` is the cache's clock (seconds) when it arrived.

    The clock is monotonic in the plugin, so ages and staleness survive wall
    clock jumps; layouts turn ``received`` into wall time only for timestamps.
    A named tuple, not a dataclass: thousands are replaced every second, and a
    tuple of numbers is cheap to make and invisible to the cyclic garbage
    collector (whose full passes showed up as Reserve latency spikes; issue 14).
    """

    value: float
    received: float
    timestamp_ms: int = 0


class MetricsCache:
    """Thread-safe map (scope, key, metric name) -> latest ``Reading``."""

    def __init__(self, clock: Clock = time.monotonic, max_entries: int = DEFAULT_MAX_ENTRIES) -> None:
        if max_entries < 1:
            raise ValueError(f"max_entries must be >= 1, got {max_entries}")
        self._clock = clock
        self._max = max_entries
        self._lock = threading.Lock()
        # ("card" | "grant", key, metric name) -> Reading; order = least recently updated first
        # (a plain dict keeps insertion order, and an update re-inserts its key at the end).
        self._data: dict[tuple[str, str, str], Reading] = {}
        # The same readings of the known metrics by (scope, key): one lookup per card or grant
        # instead of one per metric name (the layout asks for every instance, every tick).
        self._by_key: dict[tuple[str, str], dict[str, Reading]] = {}
        self._last_update: float | None = None
        self._source = ""
        self._updates = 0

    def update(self, samples: Iterable[MetricSample], source: str = "") -> int:
        """Store a batch (one snapshot or one pushed message); returns how many were kept."""
        now = self._clock()
        kept = 0
        names = ALL_METRIC_NAMES
        known = _KNOWN_NAMES
        make = _new_reading
        with self._lock:
            data = self._data
            by_key = self._by_key
            pop = data.pop
            # Runs for every sample of every push (hundreds a second): unpacked, with one
            # tuple per key and one per reading, no method lookups inside the loop.
            for device, metric_id, name, value, timestamp_ms, labels in samples:
                if not name:
                    name = names.get(metric_id, "")
                    if not name:
                        continue
                grant = labels.get(GRANT_LABEL, "") if labels else ""
                owner = ("grant", grant) if grant else ("card", device)
                key = (owner[0], owner[1], name)
                reading = make(Reading, (float(value), now, timestamp_ms))
                pop(key, None)  # re-inserted last: the least recently updated stay first
                data[key] = reading
                if name in known:
                    group = by_key.get(owner)
                    if group is None:
                        group = by_key[owner] = {}
                    group[name] = reading
                kept += 1
            while len(data) > self._max:
                scope, who, metric = oldest = next(iter(data))
                del data[oldest]
                group = by_key.get((scope, who))
                if group is not None:
                    group.pop(metric, None)
                    if not group:
                        del by_key[(scope, who)]
            self._last_update = now
            self._updates += 1
            if source:
                self._source = source
        return kept

    def card(self, device: str, name: str) -> Reading | None:
        with self._lock:
            return self._data.get(("card", device, name))

    def card_any(self, devices: Iterable[str], name: str) -> Reading | None:
        """The freshest reading among several names for one card (minor, UUID)."""
        best: Reading | None = None
        with self._lock:
            for device in devices:
                if not device:
                    continue
                found = self._data.get(("card", device, name))
                if found is not None and (best is None or found.received > best.received):
                    best = found
        return best

    def card_readings(self, devices: Iterable[str]) -> dict[str, Reading]:
        """Every metric for one card (named by minor and/or UUID), freshest per name."""
        out: dict[str, Reading] = {}
        with self._lock:
            for device in devices:
                group = self._by_key.get(("card", device)) if device else None
                if not group:
                    continue
                if not out:
                    out.update(group)
                    continue
                for name, found in group.items():
                    seen = out.get(name)
                    if seen is None or found.received > seen.received:
                        out[name] = found
        return out

    def grant_readings(self, grant_id: str) -> dict[str, Reading]:
        """Every metric for one grant (samples labelled with its allocation id)."""
        if not grant_id:
            return {}
        with self._lock:
            return dict(self._by_key.get(("grant", grant_id), ()))

    def grant(self, grant_id: str, name: str) -> Reading | None:
        with self._lock:
            return self._data.get(("grant", grant_id, name))

    def devices(self) -> list[str]:
        """Every card key with at least one reading, in first-seen order."""
        with self._lock:
            return list(dict.fromkeys(dev for scope, dev, _ in self._data if scope == "card"))

    def grants(self) -> list[str]:
        with self._lock:
            return list(dict.fromkeys(g for scope, g, _ in self._data if scope == "grant"))

    def clear(self) -> None:
        with self._lock:
            self._data.clear()
            self._by_key.clear()

    def __len__(self) -> int:
        with self._lock:
            return len(self._data)

    @property
    def last_update(self) -> float | None:
        """Our clock at the last batch stored (None before the first)."""
        with self._lock:
            return self._last_update

    @property
    def source(self) -> str:
        """Where the last batch came from: "stream", "poll", "nvml" or ""."""
        with self._lock:
            return self._source

    @property
    def update_count(self) -> int:
        with self._lock:
            return self._updates
