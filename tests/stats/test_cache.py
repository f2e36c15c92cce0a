"""MetricsCache: lookups by card and by grant, freshest reading per name, bounded by least recent update."""

from __future__ import annotations

from nomad_plugin.stats.feed import MetricsCache
from tests.doubles.stats_fakes import sample


def test_cache_lookups_by_card_and_grant_follow_updates_and_eviction():
    clock = {"now": 1.0}
    cache = MetricsCache(clock=lambda: clock["now"], max_entries=4)
    cache.update([sample("GPU-0", "temperature_c", 40)])
    clock["now"] = 2.0
    cache.update([sample("0", "temperature_c", 41), sample("0", "memory_used_mib", 5, grant="g")])
    readings = cache.card_readings(["GPU-0", "0"])
    assert readings["temperature_c"].value == 41  # the freshest of the card's two names
    assert cache.grant_readings("g")["memory_used_mib"].value == 5
    clock["now"] = 3.0
    cache.update([sample("GPU-0", "power_w", 90), sample("1", "power_w", 1), sample("1", "xid_errors", 0)])
    # Four entries at most: the two oldest (GPU-0 and 0 temperatures) are gone.
    assert cache.card_readings(["GPU-0", "0"]) == {"power_w": cache.card("GPU-0", "power_w")}
    assert cache.grant_readings("g")["memory_used_mib"].value == 5
    assert cache.grant_readings("") == {} and cache.card_readings([""]) == {}


def test_the_cache_drops_the_least_recently_updated_reading_not_the_first_stored():
    cache = MetricsCache(clock=lambda: 1.0, max_entries=3)
    cache.update([sample("0", "temperature_c", 40), sample("0", "power_w", 90), sample("0", "xid_errors", 0)])
    cache.update([sample("0", "temperature_c", 41)])  # the first one stored is now the freshest
    cache.update([sample("1", "power_w", 80)])
    assert set(cache.card_readings(["0"])) == {"temperature_c", "xid_errors"}  # power_w went first
    cache.update([sample("1", "xid_errors", 1)])
    assert set(cache.card_readings(["0"])) == {"temperature_c"}
    assert cache.card("0", "temperature_c").value == 41 and len(cache) == 3
