"""The Stats stream's engine: one response per Nomad collection interval.

Each tick reads the cache only (never XDM), so a slow or dead XDM cannot
stall Nomad's stats. The iterator ends only when ``cancel`` is set: Nomad
stops collecting stats for good when the stream ends cleanly (protocol
§5.4), so nothing here may raise either. When a build fails, the engine
logs it and sends the layout with no readings (every value "N/A") so Nomad
replaces its copy instead of keeping stale numbers.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

from nomad_plugin._proto.nomad import device_pb2
from nomad_plugin.goplugin.logging import get_logger
from nomad_plugin.model.card import Inventory
from nomad_plugin.model.instances import Catalog
from nomad_plugin.stats.cache import Clock, MetricsCache
from nomad_plugin.stats.layout import GrantLookup, build_stats, no_grants

log = get_logger(__name__)

MIN_INTERVAL = 1.0  # Nomad's SDK treats a zero collection interval as 1 s


def effective_interval(interval: float) -> float:
    """Nomad's ``collection_interval`` in seconds; zero or negative means 1 s."""
    return interval if interval > 0 else MIN_INTERVAL


class StatsEngine:
    def __init__(
        self,
        cache: MetricsCache,
        catalog_source: Callable[[], Catalog],
        inventory_source: Callable[[], Inventory],
        grant_of: GrantLookup = no_grants,
        clock: Clock = time.monotonic,
        wall_clock: Clock = time.time,
    ) -> None:
        self._cache = cache
        self._catalog = catalog_source
        self._inventory = inventory_source
        self._grant_of = grant_of
        self._clock = clock  # the cache's clock: ages and staleness
        self._wall_clock = wall_clock  # only for the timestamps Nomad shows
        self._empty = MetricsCache(clock=clock, max_entries=1)

    def _now(self) -> tuple[float, float]:
        """(age-clock now, offset that turns age-clock times into wall time)."""
        now = self._clock()
        return now, self._wall_clock() - now

    def build(self, interval: float) -> device_pb2.StatsResponse:
        """One response from the cache (may raise; ``responses`` guards it)."""
        now, offset = self._now()
        return build_stats(
            self._catalog(),
            self._inventory(),
            self._cache,
            self._grant_of,
            now,
            effective_interval(interval),
            wall_offset=offset,
        )

    def _safe_build(self, interval: float) -> device_pb2.StatsResponse:
        try:
            return self.build(interval)
        except Exception:
            log.exception("building stats failed; sending N/A values")
        try:
            now, offset = self._now()
            return build_stats(
                self._catalog(),
                self._inventory(),
                self._empty,
                lambda _id: None,
                now,
                effective_interval(interval),
                wall_offset=offset,
            )
        except Exception:
            log.exception("building N/A stats failed; sending an empty response")
            return device_pb2.StatsResponse()

    def responses(self, interval: float, cancel: threading.Event) -> Iterator[device_pb2.StatsResponse]:
        """The first response at once, then one per interval, until ``cancel`` is set."""
        period = effective_interval(interval)
        next_tick = time.monotonic()
        while not cancel.is_set():
            yield self._safe_build(interval)
            next_tick += period
            delay = next_tick - time.monotonic()
            if delay < 0:  # a slow consumer: skip missed ticks rather than burst
                next_tick = time.monotonic() + period
                delay = period
            if cancel.wait(delay):
                return
