"""The byte-assembled StatsResponse is exactly the message ``build_stats`` builds, tick after tick."""

from __future__ import annotations

from nomad_plugin._proto.nomad import device_pb2
from nomad_plugin.model.card import Inventory, MigInstance
from nomad_plugin.model.instances import Catalog, GroupKey, Instance, InstanceGroup, Kind
from nomad_plugin.model.metrics import METRIC_NAMES
from nomad_plugin.stats import assemble
from nomad_plugin.stats.assemble import StatsAssembler
from nomad_plugin.stats.cache import MetricsCache
from nomad_plugin.stats.layout import GrantInfo, build_stats
from tests.doubles.stats_fakes import card, mig_group, sample, share_group, whole_group


def node() -> tuple[Catalog, Inventory]:
    mig = MigInstance(uuid="MIG-abc", profile="1g.10gb", slices=1, memory_mib=9856)
    cards = (card(0), card(1), card(2), card(3), card(4, mig=(mig,)))
    existing = InstanceGroup(
        GroupKey("nvidia", "gpu", "H100-mig-existing"),
        (Instance("MIG-abc", Kind.MIG_INSTANCE, cards[4].uuid, 4, slices=1, mig_uuid="MIG-abc"),),
    )
    groups = (
        whole_group(cards[:2]),
        share_group(cards[2], 4, 20),
        mig_group(cards[3]),
        existing,
    )
    return Catalog(groups=groups), Inventory(cards=cards)


def feed(cache: MetricsCache, devices: list[str], base: float, grants: list[str]) -> None:
    samples = [sample(dev, name, base + i) for dev in devices for i, name in enumerate(METRIC_NAMES.values())]
    samples += [sample("2", "memory_used_mib", base * 10 + n, grant=g) for n, g in enumerate(grants)]
    samples += [sample("2", "core_util_percent", base + n, grant=g) for n, g in enumerate(grants)]
    cache.update(samples)


def same(assembler: StatsAssembler, catalog, inventory, cache, grant_of, now, interval=1.0, offset=0.0) -> None:
    expected = build_stats(catalog, inventory, cache, grant_of, now, interval, wall_offset=offset)
    got = device_pb2.StatsResponse.FromString(
        assembler.build(catalog, inventory, cache, grant_of, now, interval, offset)
    )
    assert got == expected
    assert len(got.groups) == len(catalog.groups)


def test_assembled_bytes_equal_build_stats_across_ticks_grants_and_staleness():
    catalog, inventory = node()
    clock = {"now": 100.0}
    cache = MetricsCache(clock=lambda: clock["now"])
    share_ids = [i.id for i in catalog.groups[1].instances]
    mig_ids = [i.id for i in catalog.groups[2].instances]
    grants = {
        share_ids[0]: GrantInfo("g-share", 25, 20),
        mig_ids[1]: GrantInfo("g-mig", 0, 10, 1),
    }
    assembler = StatsAssembler()
    empty = MetricsCache(clock=lambda: clock["now"])
    same(assembler, catalog, inventory, empty, lambda _id: None, 100.0)  # no readings at all: every value N/A
    feed(cache, ["GPU-0", "1", "GPU-2", "3", "MIG-abc"], 1.0, ["g-share"])
    same(assembler, catalog, inventory, cache, grants.get, 100.5, offset=1.7e9)
    clock["now"] = 101.0
    feed(cache, ["GPU-0", "GPU-2"], 2.0, ["g-share", "g-mig"])  # cards 1 and 3 stop reporting
    same(assembler, catalog, inventory, cache, grants.get, 101.2, offset=1.7e9)
    same(assembler, catalog, inventory, cache, grants.get, 109.0, offset=1.7e9)  # now mostly stale
    grants.pop(share_ids[0])
    grants[share_ids[3]] = GrantInfo("g-other", 25, 0)
    same(assembler, catalog, inventory, cache, grants.get, 109.5, interval=0.0)


def test_a_new_catalog_drops_the_cached_parts():
    catalog, inventory = node()
    cache = MetricsCache(clock=lambda: 5.0)
    assembler = StatsAssembler()
    same(assembler, catalog, inventory, cache, lambda _id: None, 5.0)
    smaller = Catalog(groups=(share_group(card(2), 2, 40),))
    same(assembler, smaller, inventory, cache, lambda _id: None, 5.0)


def test_timestamps_on_whole_seconds_and_before_1970_are_encoded_as_protobuf_does():
    catalog, inventory = node()
    cache = MetricsCache(clock=lambda: 50.0)
    feed(cache, ["GPU-0", "1", "GPU-2", "3", "MIG-abc"], 1.0, ["g-share"])
    assembler = StatsAssembler()
    for offset in (1.7e9, 1.7e9 + 0.25, -100.0, -49.5, -50.0, 0.0):  # whole, fraction, negative, zero
        same(assembler, catalog, inventory, cache, lambda _id: None, 50.0, offset=offset)


def test_the_memo_is_bounded_while_every_tick_brings_new_values(monkeypatch):
    monkeypatch.setattr(assemble, "_MEMO_SLACK", 10)
    catalog, inventory = node()
    clock = {"now": 10.0}
    cache = MetricsCache(clock=lambda: clock["now"])
    assembler = StatsAssembler()
    sizes = []
    for tick in range(40):
        clock["now"] = 10.0 + tick
        feed(cache, ["GPU-0", "1", "GPU-2", "3", "MIG-abc"], 100.0 + tick, ["g-share"])  # all new values
        same(assembler, catalog, inventory, cache, lambda _id: None, clock["now"])
        sizes.append(len(assembler._memo) + len(assembler._values))
    one_build = sizes[0]
    assert max(sizes) <= 3 * one_build + 10, sizes  # emptied when over twice one build plus the slack
    assert min(sizes[1:]) < max(sizes), "never emptied"


def test_stats_age_parts_and_entry_heads_are_bounded_on_a_node_whose_readings_went_stale(monkeypatch):
    monkeypatch.setattr(assemble, "_MAX_AGES", 8)
    monkeypatch.setattr(assemble, "_MAX_HEADS", 4)
    catalog, inventory = node()
    cache = MetricsCache(clock=lambda: 1.0)
    feed(cache, ["GPU-0", "1", "GPU-2", "3", "MIG-abc"], 1.0, [])
    assembler = StatsAssembler()
    for tick in range(30):  # a new age every tick
        same(assembler, catalog, inventory, cache, lambda _id: None, 5.0 + tick * 0.5, offset=tick * 0.37)
        assert len(assembler._ages) <= 8 and len(assembler._heads) <= 4


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
    cache.clear()
    assert cache.card_readings(["GPU-0"]) == {} and cache.grant_readings("g") == {}


def test_the_cache_drops_the_least_recently_updated_reading_not_the_first_stored():
    cache = MetricsCache(clock=lambda: 1.0, max_entries=3)
    cache.update([sample("0", "temperature_c", 40), sample("0", "power_w", 90), sample("0", "xid_errors", 0)])
    cache.update([sample("0", "temperature_c", 41)])  # the first one stored is now the freshest
    cache.update([sample("1", "power_w", 80)])
    assert set(cache.card_readings(["0"])) == {"temperature_c", "xid_errors"}  # power_w went first
    cache.update([sample("1", "xid_errors", 1)])
    assert set(cache.card_readings(["0"])) == {"temperature_c"}
    assert cache.card("0", "temperature_c").value == 41 and len(cache) == 3
