"""Optional Prometheus endpoint: per-device readings and the plugin's own health.

Off by default (``metrics_port = 0``); when on, it binds ``metrics_bind``
(127.0.0.1 by default: the node's own scraper, not the network). It is
served by prometheus-client's HTTP server on the plugin's private registry.

Device values are pulled from the stats cache at scrape time by a custom
collector, so nothing is pushed per sample and a scrape never calls XDM.
Units are Prometheus base units: bytes, celsius, watts, hertz, ratio (0..1).
Readings older than ``stale_after`` seconds are left out (Prometheus then
marks the series stale) and ``lingjun_device_metrics_age_seconds`` says how
old the newest reading of each card is.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from wsgiref.simple_server import WSGIServer

from prometheus_client import start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from nomad_plugin.config.model import PluginConfig
from nomad_plugin.metrics import PluginMetrics
from nomad_plugin.model.card import Inventory
from nomad_plugin.stats.cache import Clock, MetricsCache, Reading
from nomad_plugin.stats.engine import THROTTLE_REASONS

MIB = 1024 * 1024
DEVICE_LABELS = ("uuid", "minor", "model")
DEFAULT_STALE_AFTER = 60.0


@dataclass(frozen=True)
class _Spec:
    cache_name: str
    prom_name: str
    help: str
    scale: float = 1.0
    counter: bool = False


DEVICE_SPECS: tuple[_Spec, ...] = (
    _Spec("core_util_percent", "lingjun_device_utilization_ratio", "Share of time the compute units were busy.", 0.01),
    _Spec("memory_used_mib", "lingjun_device_memory_used_bytes", "Device memory in use.", MIB),
    _Spec("memory_total_mib", "lingjun_device_memory_total_bytes", "Device memory in total.", MIB),
    _Spec("memory_util_percent", "lingjun_device_memory_utilization_ratio", "Memory bandwidth in use.", 0.01),
    _Spec("temperature_c", "lingjun_device_temperature_celsius", "Card temperature."),
    _Spec("power_w", "lingjun_device_power_watts", "Power draw."),
    _Spec("power_limit_w", "lingjun_device_power_limit_watts", "Power limit."),
    _Spec("sm_clock_mhz", "lingjun_device_sm_clock_hertz", "Compute clock.", 1e6),
    _Spec("memory_clock_mhz", "lingjun_device_memory_clock_hertz", "Memory clock.", 1e6),
    _Spec("health", "lingjun_device_healthy", "XDM's health verdict: 1 healthy, 0 not."),
    _Spec("remapped_rows_total", "lingjun_device_remapped_rows", "Memory rows remapped on the card."),
    _Spec("ecc_sbe_total", "lingjun_device_ecc_corrected_errors", "Corrected (single-bit) ECC errors.", counter=True),
    _Spec(
        "ecc_dbe_total", "lingjun_device_ecc_uncorrected_errors", "Uncorrected (double-bit) ECC errors.", counter=True
    ),
    _Spec("xid_errors", "lingjun_device_xid_errors", "Driver XID error events.", counter=True),
    _Spec("nvlink_errors_total", "lingjun_device_nvlink_errors", "NVLink errors.", counter=True),
)
GRANT_SPECS: tuple[_Spec, ...] = (
    _Spec("memory_used_mib", "lingjun_grant_memory_used_bytes", "Device memory used by one grant.", MIB),
    _Spec("core_util_percent", "lingjun_grant_utilization_ratio", "Compute used by one grant.", 0.01),
)
SOURCES = ("stream", "poll", "nvml", "none")


def _device_targets(cache: MetricsCache, inventory: Inventory) -> list[tuple[tuple[str, str, str], list[str]]]:
    """(labels, cache keys) per card: inventory cards first, then keys no card explains."""
    targets: list[tuple[tuple[str, str, str], list[str]]] = []
    known: set[str] = set()
    for card in inventory.cards:
        keys = [card.uuid, str(card.minor)]
        known.update(keys)
        targets.append(((card.uuid, str(card.minor), card.model), keys))
    for key in cache.devices():
        if key not in known:
            labels = ("", key, "") if key.isdigit() else (key, "", "")
            targets.append((labels, [key]))
    return targets


class DeviceCollector(Collector):
    """Reads the cache when Prometheus scrapes; registered on the plugin's registry."""

    def __init__(
        self,
        cache: MetricsCache,
        inventory_source: Callable[[], Inventory],
        source: Callable[[], str] | None = None,
        clock: Clock = time.monotonic,  # the cache's clock (ages only)
        stale_after: float = DEFAULT_STALE_AFTER,
    ) -> None:
        self._cache = cache
        self._inventory = inventory_source
        self._source = source
        self._clock = clock
        self._stale_after = stale_after

    def describe(self) -> Iterable[Metric]:
        return []  # dynamic label sets: skip registration-time checks

    def _family(self, spec: _Spec, labels: Iterable[str]) -> GaugeMetricFamily | CounterMetricFamily:
        if spec.counter:
            return CounterMetricFamily(spec.prom_name, spec.help, labels=list(labels))
        return GaugeMetricFamily(spec.prom_name, spec.help, labels=list(labels))

    def collect(self) -> Iterator[Metric]:
        now = self._clock()

        def fresh(reading: Reading) -> bool:
            return now - reading.received <= self._stale_after

        families = {s.cache_name: self._family(s, DEVICE_LABELS) for s in DEVICE_SPECS}
        throttled = GaugeMetricFamily(
            "lingjun_device_clocks_throttled",
            "1 while this reason holds the clocks down.",
            labels=[*DEVICE_LABELS, "reason"],
        )
        age = GaugeMetricFamily(
            "lingjun_device_metrics_age_seconds",
            "Seconds since the newest reading for the card.",
            labels=list(DEVICE_LABELS),
        )
        for labels, keys in _device_targets(self._cache, self._inventory()):
            readings: Mapping[str, Reading] = self._cache.card_readings(keys)
            if readings:
                age.add_metric(labels, max(0.0, now - max(r.received for r in readings.values())))
            for spec in DEVICE_SPECS:
                reading = readings.get(spec.cache_name)
                if reading is not None and fresh(reading):
                    families[spec.cache_name].add_metric(labels, reading.value * spec.scale)
            mask_reading = readings.get("throttle_reasons")
            if mask_reading is not None and fresh(mask_reading):
                mask = int(mask_reading.value)
                for bit, name in THROTTLE_REASONS:
                    throttled.add_metric([*labels, name], 1.0 if mask & bit else 0.0)
        yield from families.values()
        yield throttled
        yield age
        yield from self._grant_families(now)
        if self._source is not None:
            current = self._source()
            src = GaugeMetricFamily(
                "lingjun_plugin_metrics_source", "Where device readings come from now (1 = current).", labels=["source"]
            )
            for name in SOURCES:
                src.add_metric([name], 1.0 if name == current else 0.0)
            yield src

    def _grant_families(self, now: float) -> Iterator[Metric]:
        families = {s.cache_name: self._family(s, ["grant_id"]) for s in GRANT_SPECS}
        for grant_id in self._cache.grants():
            readings = self._cache.grant_readings(grant_id)
            for spec in GRANT_SPECS:
                reading = readings.get(spec.cache_name)
                if reading is not None and now - reading.received <= self._stale_after:
                    families[spec.cache_name].add_metric([grant_id], reading.value * spec.scale)
        yield from families.values()


class MetricsEndpoint:
    """prometheus-client's HTTP server on a private registry, with a clean stop."""

    def __init__(self, metrics: PluginMetrics, bind: str = "127.0.0.1", port: int = 0) -> None:
        if not 0 <= port <= 65535:
            raise ValueError(f"metrics_port must be 0..65535, got {port}")
        self._metrics = metrics
        self._bind = bind
        self._want_port = port
        self._server: WSGIServer | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._server, self._thread = start_http_server(
            self._want_port, addr=self._bind, registry=self._metrics.registry
        )

    @property
    def port(self) -> int:
        """The bound port (useful when started with port 0 in tests)."""
        return int(self._server.server_port) if self._server is not None else 0

    @property
    def address(self) -> str:
        return str(self._server.server_address[0]) if self._server is not None else ""

    def stop(self) -> None:
        server, thread = self._server, self._thread
        self._server = self._thread = None
        if server is not None:
            server.shutdown()
            server.server_close()
        if thread is not None:
            thread.join(5.0)


def start_endpoint(
    config: PluginConfig,
    metrics: PluginMetrics,
    cache: MetricsCache,
    inventory_source: Callable[[], Inventory],
    source: Callable[[], str] | None = None,
) -> MetricsEndpoint | None:
    """Serve ``/metrics`` if ``config.metrics_port`` is set; None (nothing bound) when it is 0."""
    if config.metrics_port == 0:
        return None
    if not metrics.enabled:
        raise ValueError("metrics_port is set but PluginMetrics was created disabled")
    metrics.registry.register(DeviceCollector(cache, inventory_source, source))
    endpoint = MetricsEndpoint(metrics, config.metrics_bind, config.metrics_port)
    endpoint.start()
    return endpoint
