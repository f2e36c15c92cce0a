"""The Prometheus endpoint over real HTTP, parsed back with prometheus_client's parser."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from nomad_plugin.config.model import PluginConfig
from nomad_plugin.metrics import PluginMetrics
from nomad_plugin.metrics.prometheus import MetricsEndpoint, start_endpoint
from nomad_plugin.model.card import Inventory
from nomad_plugin.stats.feed import MetricsCache
from tests.doubles.stats_fakes import card, sample


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def scrape(port: int) -> dict[str, list[tuple[str, dict[str, str], float]]]:
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    out: dict[str, list[tuple[str, dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        out[family.name] = [(s.name, dict(s.labels), s.value) for s in family.samples]
    return out


def value(fams, family: str, **labels: str) -> float:  # type: ignore[no-untyped-def]
    hits = [v for _n, lab, v in fams[family] if all(lab.get(k) == want for k, want in labels.items())]
    assert len(hits) == 1, (family, labels, fams.get(family))
    return hits[0]


@pytest.fixture
def served() -> Iterator[tuple[MetricsEndpoint, PluginMetrics, MetricsCache, list[float]]]:
    now = [1000.0]
    cache = MetricsCache(clock=lambda: now[0])
    inventory = Inventory(cards=(card(0), card(1, model="PPU-810E", memory_mib=98304)))
    config = PluginConfig(metrics_port=free_port())
    metrics = PluginMetrics.for_config(config)
    endpoint = start_endpoint(config, metrics, cache, lambda: inventory, source=lambda: "stream")
    assert endpoint is not None
    # the collector judges freshness on the monotonic clock (the cache's); keep readings "now"
    now[0] = time.monotonic()
    yield endpoint, metrics, cache, now
    endpoint.stop()


def test_device_metrics_in_base_units(served) -> None:  # type: ignore[no-untyped-def]
    endpoint, _metrics, cache, _now = served
    cache.update(
        [
            sample("0", "memory_used_mib", 2048),
            sample("GPU-0", "memory_total_mib", 81920),
            sample("GPU-0", "core_util_percent", 40),
            sample("GPU-0", "temperature_c", 61.5),
            sample("GPU-0", "power_w", 300),
            sample("GPU-0", "sm_clock_mhz", 1980),
            sample("GPU-0", "xid_errors", 3),
            sample("GPU-0", "throttle_reasons", 0x4),
            sample("1", "ecc_dbe_total", 2),
            sample("1", "memory_used_mib", 512, grant="g-1"),
        ]
    )
    fams = scrape(endpoint.port)
    gpu0 = {"uuid": "GPU-0", "minor": "0", "model": "H100"}
    assert value(fams, "lingjun_device_memory_used_bytes", **gpu0) == 2048 * 1024 * 1024
    assert value(fams, "lingjun_device_memory_total_bytes", **gpu0) == 81920 * 1024 * 1024
    assert value(fams, "lingjun_device_utilization_ratio", **gpu0) == pytest.approx(0.40)
    assert value(fams, "lingjun_device_temperature_celsius", **gpu0) == 61.5
    assert value(fams, "lingjun_device_power_watts", **gpu0) == 300
    assert value(fams, "lingjun_device_sm_clock_hertz", **gpu0) == 1.98e9
    assert value(fams, "lingjun_device_xid_errors", **gpu0) == 3
    assert fams["lingjun_device_xid_errors"][0][0] == "lingjun_device_xid_errors_total"  # a counter
    assert value(fams, "lingjun_device_clocks_throttled", uuid="GPU-0", reason="sw_power_cap") == 1
    assert value(fams, "lingjun_device_clocks_throttled", uuid="GPU-0", reason="hw_thermal") == 0
    assert value(fams, "lingjun_device_ecc_uncorrected_errors", uuid="GPU-1", model="PPU-810E") == 2
    assert value(fams, "lingjun_grant_memory_used_bytes", grant_id="g-1") == 512 * 1024 * 1024
    assert value(fams, "lingjun_plugin_metrics_source", source="stream") == 1
    assert value(fams, "lingjun_plugin_metrics_source", source="poll") == 0
    assert "lingjun_device_metrics_age_seconds" in fams
    # per-grant samples do not leak into the card's own series
    assert not any(lab.get("uuid") == "GPU-1" for _n, lab, _v in fams["lingjun_device_memory_used_bytes"])


def test_values_are_read_at_scrape_time_and_stale_ones_dropped(served) -> None:  # type: ignore[no-untyped-def]
    endpoint, _metrics, cache, now = served
    cache.update([sample("GPU-0", "temperature_c", 50)])
    assert value(scrape(endpoint.port), "lingjun_device_temperature_celsius", uuid="GPU-0") == 50
    cache.update([sample("GPU-0", "temperature_c", 51)])
    assert value(scrape(endpoint.port), "lingjun_device_temperature_celsius", uuid="GPU-0") == 51
    now[0] = time.monotonic() - 3600  # an hour-old reading
    cache.update([sample("GPU-1", "temperature_c", 70)])
    fams = scrape(endpoint.port)
    assert not any(lab.get("uuid") == "GPU-1" for _n, lab, _v in fams["lingjun_device_temperature_celsius"])
    assert value(fams, "lingjun_device_metrics_age_seconds", uuid="GPU-1") > 3000


def test_plugin_self_metrics(served) -> None:  # type: ignore[no-untyped-def]
    endpoint, metrics, _cache, _now = served
    metrics.xdm_state(True)
    metrics.xdm_reconnect()
    metrics.xdm_reconnect()
    metrics.fingerprint_sent()
    metrics.observe_reserve(0.02)
    metrics.observe_reserve(0.3)
    metrics.reserve_error("unknown device IDs")
    metrics.journal_size(5)
    metrics.grant_released_by_reconcile()
    metrics.leaked_grant_found()
    metrics.nomad_view(True, 3)
    fams = scrape(endpoint.port)
    assert value(fams, "lingjun_plugin_xdm_up") == 1
    assert value(fams, "lingjun_plugin_xdm_reconnects") == 2
    assert value(fams, "lingjun_plugin_fingerprints_sent") == 1
    hist = {n: v for n, lab, v in fams["lingjun_plugin_reserve_duration_seconds"] if not lab}
    assert hist["lingjun_plugin_reserve_duration_seconds_count"] == 2
    assert hist["lingjun_plugin_reserve_duration_seconds_sum"] == pytest.approx(0.32)
    assert value(fams, "lingjun_plugin_reserve_errors", kind="unknown_device_IDs") == 1
    assert value(fams, "lingjun_plugin_journal_entries") == 5
    assert value(fams, "lingjun_plugin_reconcile_released_grants") == 1
    assert value(fams, "lingjun_plugin_leaked_grants_found") == 1
    assert value(fams, "lingjun_plugin_nomad_view_incomplete") == 1
    assert value(fams, "lingjun_plugin_unverifiable_grants") == 3
    assert "process_resident_memory_bytes" in fams
    metrics.xdm_state(False)
    assert value(scrape(endpoint.port), "lingjun_plugin_xdm_up") == 0


def test_off_by_default_and_loopback_by_default() -> None:
    config = PluginConfig()
    assert config.metrics_port == 0
    assert config.metrics_bind == "127.0.0.1"
    metrics = PluginMetrics.for_config(config)
    assert not metrics.enabled
    # every method is a cheap no-op and nothing is registered
    metrics.observe_reserve(1.0)
    metrics.reserve_error("x")
    metrics.fingerprint_sent()
    metrics.xdm_state(True)
    metrics.xdm_reconnect()
    metrics.journal_size(3)
    metrics.grant_released_by_reconcile()
    metrics.leaked_grant_found()
    assert list(metrics.registry.collect()) == []
    assert start_endpoint(config, metrics, MetricsCache(), Inventory) is None


def test_endpoint_binds_loopback_only() -> None:
    port = free_port()
    config = PluginConfig(metrics_port=port)
    endpoint = start_endpoint(config, PluginMetrics.for_config(config), MetricsCache(), Inventory)
    assert endpoint is not None
    try:
        assert endpoint.address == "127.0.0.1"
        assert endpoint.port == port
        assert httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).status_code == 200
    finally:
        endpoint.stop()
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2)


def test_bad_port_is_named() -> None:
    config = PluginConfig(metrics_port=70000)
    with pytest.raises(ValueError, match="metrics_port"):
        start_endpoint(config, PluginMetrics.for_config(config), MetricsCache(), Inventory)
