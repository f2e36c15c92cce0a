"""The optional ``/metrics`` endpoint (``metrics_port``): per-device readings beside the plugin's own health.

It binds ``metrics_bind`` (127.0.0.1 by default: the node's own scraper).
Device values are read from the stats cache at scrape time, never from XDM,
in Prometheus base units (bytes, celsius, watts, hertz, ratio 0..1); those
older than ``STALE_AFTER`` are left out, so Prometheus marks them stale.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import TypeGuard
from wsgiref.simple_server import WSGIServer

from prometheus_client import start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from nomad_plugin.config.model import PluginConfig
from nomad_plugin.metrics import PluginMetrics
from nomad_plugin.model.card import Inventory
from nomad_plugin.stats.engine import THROTTLE_REASONS
from nomad_plugin.stats.feed import MetricsCache, Reading

MIB = 1024 * 1024
DEVICE_LABELS = ["uuid", "minor", "model"]
STALE_AFTER = 60.0  # seconds: an older reading is left out
SOURCES = ("stream", "poll", "nvml", "none")

# Cache name -> (Prometheus name, help, scale to base units); the COUNTERS are counters, the rest gauges.
Series = dict[str, tuple[str, str, float]]
DEVICE_SERIES: Series = {
    "core_util_percent": ("lingjun_device_utilization_ratio", "Share of time the compute units were busy.", 0.01),
    "memory_used_mib": ("lingjun_device_memory_used_bytes", "Device memory in use.", MIB),
    "memory_total_mib": ("lingjun_device_memory_total_bytes", "Device memory in total.", MIB),
    "memory_util_percent": ("lingjun_device_memory_utilization_ratio", "Memory bandwidth in use.", 0.01),
    "temperature_c": ("lingjun_device_temperature_celsius", "Card temperature.", 1.0),
    "power_w": ("lingjun_device_power_watts", "Power draw.", 1.0),
    "power_limit_w": ("lingjun_device_power_limit_watts", "Power limit.", 1.0),
    "sm_clock_mhz": ("lingjun_device_sm_clock_hertz", "Compute clock.", 1e6),
    "memory_clock_mhz": ("lingjun_device_memory_clock_hertz", "Memory clock.", 1e6),
    "health": ("lingjun_device_healthy", "XDM's health verdict: 1 healthy, 0 not.", 1.0),
    "remapped_rows_total": ("lingjun_device_remapped_rows", "Memory rows remapped on the card.", 1.0),
    "ecc_sbe_total": ("lingjun_device_ecc_corrected_errors", "Corrected (single-bit) ECC errors.", 1.0),
    "ecc_dbe_total": ("lingjun_device_ecc_uncorrected_errors", "Uncorrected (double-bit) ECC errors.", 1.0),
    "xid_errors": ("lingjun_device_xid_errors", "Driver XID error events.", 1.0),
    "nvlink_errors_total": ("lingjun_device_nvlink_errors", "NVLink errors.", 1.0),
}
COUNTERS = frozenset({"ecc_sbe_total", "ecc_dbe_total", "xid_errors", "nvlink_errors_total"})
GRANT_SERIES: Series = {
    "memory_used_mib": ("lingjun_grant_memory_used_bytes", "Device memory used by one grant.", MIB),
    "core_util_percent": ("lingjun_grant_utilization_ratio", "Compute used by one grant.", 0.01),
}
Rows = list[tuple[list[str], Mapping[str, Reading]]]  # (label values, readings) per card or grant


class DeviceCollector(Collector):
    """Reads the cache (on its monotonic clock) when Prometheus scrapes."""

    def __init__(
        self, cache: MetricsCache, inventory_source: Callable[[], Inventory], source: Callable[[], str] | None = None
    ) -> None:
        self._cache = cache
        self._inventory = inventory_source
        self._source = source

    def describe(self) -> Iterable[Metric]:
        return []  # dynamic label sets: skip registration-time checks

    def _cards(self) -> Rows:
        """Inventory cards first (read by UUID and minor), then cache keys no card explains."""
        rows: Rows = []
        for card in self._inventory().cards:
            keys = [card.uuid, str(card.minor)]
            rows.append(([*keys, card.model], self._cache.card_readings(keys)))
        known = {key for labels, _ in rows for key in labels[:2]}
        for key in self._cache.devices():
            if key not in known:
                rows.append((["", key, ""] if key.isdigit() else [key, "", ""], self._cache.card_readings([key])))
        return rows

    def collect(self) -> Iterator[Metric]:
        now = time.monotonic()

        def fresh(reading: Reading | None) -> TypeGuard[Reading]:
            return reading is not None and now - reading.received <= STALE_AFTER

        def families(series: Series, labels: list[str], rows: Rows) -> Iterator[Metric]:
            for cache_name, (name, doc, scale) in series.items():
                family = (CounterMetricFamily if cache_name in COUNTERS else GaugeMetricFamily)(
                    name, doc, labels=labels
                )
                for values, readings in rows:
                    if fresh(reading := readings.get(cache_name)):
                        family.add_metric(values, reading.value * scale)
                yield family

        cards = self._cards()
        yield from families(DEVICE_SERIES, DEVICE_LABELS, cards)
        doc = "1 while this reason holds the clocks down."
        throttled = GaugeMetricFamily("lingjun_device_clocks_throttled", doc, labels=[*DEVICE_LABELS, "reason"])
        doc = "Seconds since the newest reading for the card."
        age = GaugeMetricFamily("lingjun_device_metrics_age_seconds", doc, labels=DEVICE_LABELS)
        for labels, readings in cards:
            if readings:
                age.add_metric(labels, max(0.0, now - max(r.received for r in readings.values())))
            if fresh(mask := readings.get("throttle_reasons")):
                for bit, reason in THROTTLE_REASONS:
                    throttled.add_metric([*labels, reason], 1.0 if int(mask.value) & bit else 0.0)
        yield throttled
        yield age
        yield from families(
            GRANT_SERIES, ["grant_id"], [([g], self._cache.grant_readings(g)) for g in self._cache.grants()]
        )
        if self._source is not None:
            current = self._source()
            doc = "Where device readings come from now (1 = current)."
            src = GaugeMetricFamily("lingjun_plugin_metrics_source", doc, labels=["source"])
            for name in SOURCES:
                src.add_metric([name], 1.0 if name == current else 0.0)
            yield src


@dataclass(frozen=True)
class MetricsEndpoint:
    server: WSGIServer
    thread: threading.Thread

    @property
    def port(self) -> int:
        return int(self.server.server_port)

    @property
    def address(self) -> str:
        return str(self.server.server_address[0])

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5.0)


def start_endpoint(
    config: PluginConfig,
    metrics: PluginMetrics,
    cache: MetricsCache,
    inventory_source: Callable[[], Inventory],
    source: Callable[[], str] | None = None,
) -> MetricsEndpoint | None:
    """Serve ``/metrics`` if ``config.metrics_port`` is set; None (nothing bound) when it is 0."""
    port = config.metrics_port
    if port == 0:
        return None
    if not 0 < port <= 65535:
        raise ValueError(f"metrics_port must be 0..65535, got {port}")
    if not metrics.enabled:
        raise ValueError("metrics_port is set but PluginMetrics was created disabled")
    metrics.registry.register(DeviceCollector(cache, inventory_source, source))
    return MetricsEndpoint(*start_http_server(port, config.metrics_bind, metrics.registry))
