"""``build_stats`` builds the very message the oracle builds, whatever the readings, grants and clocks."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nomad_plugin.model.card import Inventory, MigInstance
from nomad_plugin.model.instances import Catalog, GroupKey, Instance, InstanceGroup, Kind
from nomad_plugin.model.metrics import ALL_METRIC_NAMES, UNSUPPORTED_BITS
from nomad_plugin.stats.engine import GrantInfo, build_stats
from nomad_plugin.stats.feed import MetricsCache
from tests.doubles.stats_fakes import card, mig_group, sample, share_group, whole_group
from tests.stats import stats_oracle

MIG = MigInstance(uuid="MIG-abc", profile="1g.10gb", slices=1, memory_mib=9856)
CARDS = (card(0), card(1), card(2), card(3), card(4, mig=(MIG,)), card(5, memory_mib=0))
UNLIMITED = Instance("GPU-5-share-0", Kind.SHARE, CARDS[5].uuid, 5, core=50, memory_gib=0)
SMALLER = [
    Instance(f"GPU-5-share-{i}", Kind.SHARE, CARDS[5].uuid, 5, core=25, memory_gib=m) for i, m in ((1, 0), (2, 8))
]
ORPHAN = Instance("GPU-9-share-0", Kind.SHARE, "GPU-9", 9, core=25, memory_gib=4)  # a card the inventory lacks
CATALOG = Catalog(
    groups=(
        whole_group(CARDS[:2]),
        share_group(CARDS[2], 4, 20),
        mig_group(CARDS[3]),
        InstanceGroup(
            GroupKey("nvidia", "gpu", "H100-mig-existing"),
            (Instance("MIG-abc", Kind.MIG_INSTANCE, CARDS[4].uuid, 4, slices=1, mig_uuid="MIG-abc"),),
        ),
        InstanceGroup(GroupKey("nvidia", "gpu", "odd"), (UNLIMITED, *SMALLER, ORPHAN)),  # shares of two sizes
        InstanceGroup(GroupKey("nvidia", "gpu", "empty"), ()),
    )
)
INVENTORY = Inventory(cards=CARDS)
INSTANCES = [i.id for g in CATALOG.groups for i in g.instances]
DEVICES = ["GPU-0", "1", "GPU-2", "2", "3", "GPU-3", "MIG-abc", "GPU-4", "5", "GPU-9", "GPU-99"]
GRANT_IDS = ["g-1", "g-2", "g-3"]
NAMES = sorted(ALL_METRIC_NAMES.values())

values = st.one_of(
    st.integers(-5, 100_000).map(float), st.floats(-10, 1e6, allow_nan=False), st.sampled_from([0.5, 1.5, 2.5, 0.0])
)
readings = st.lists(
    st.tuples(
        st.sampled_from(DEVICES + GRANT_IDS),
        st.sampled_from([*NAMES, "unknown_metric"]),
        values,
        st.floats(0, 30),  # arrival, seconds after the start
    ),
    max_size=60,
)
masks = st.dictionaries(st.sampled_from(DEVICES), st.integers(0, sum(UNSUPPORTED_BITS.values())), max_size=4)
grants = st.dictionaries(
    st.sampled_from(INSTANCES),
    st.builds(GrantInfo, st.sampled_from(GRANT_IDS), st.integers(0, 100), st.integers(0, 80), st.integers(0, 7)),
    max_size=5,
)


def fill(arrivals: list[tuple[str, str, float, float]], unsupported: dict[str, int]) -> MetricsCache:
    clock = {"now": 0.0}
    cache = MetricsCache(clock=lambda: clock["now"])
    for device, name, value, at in sorted(arrivals, key=lambda a: a[3]):
        clock["now"] = at
        grant = device if device in GRANT_IDS else ""
        cache.update([sample("2" if grant else device, name, value, grant=grant)] if name in NAMES else [])
    for device, mask in unsupported.items():
        cache.update([sample(device, "nvml_unsupported", mask)])
    return cache


def agree(cache: MetricsCache, grant_of: dict[str, GrantInfo], now: float, interval: float, offset: float) -> None:
    ours = build_stats(CATALOG, INVENTORY, cache, grant_of.get, now, interval, wall_offset=offset)
    theirs = stats_oracle.build_stats(CATALOG, INVENTORY, cache, grant_of.get, now, interval, wall_offset=offset)
    assert ours == theirs
    assert ours.SerializeToString(deterministic=True) == theirs.SerializeToString(deterministic=True)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    readings,
    masks,
    grants,
    st.floats(0, 60),
    st.sampled_from([0.0, 0.5, 1.0, 10.0]),
    st.sampled_from([0.0, 1.7e9, 1.7e9 + 0.25, -100.0, -49.5]),
)
def test_build_stats_equals_the_oracle(arrivals, unsupported, grant_of, now, interval, offset) -> None:  # type: ignore[no-untyped-def]
    agree(fill(arrivals, unsupported), grant_of, now, interval, offset)


def test_every_reading_of_every_card_and_grant_equals_the_oracle() -> None:
    """The full house: every metric on every device name, grants on shares and MIG units, some stale."""
    arrivals = [(d, n, 10.0 + i, 1.0 if d.endswith("3") else 20.0) for d in DEVICES for i, n in enumerate(NAMES)]
    arrivals += [(g, n, 7.0, 19.5) for g in GRANT_IDS for n in ("memory_used_mib", "core_util_percent")]
    cache = fill([a for a in arrivals if a[1] != "nvml_unsupported"], {})
    grant_of = {
        "GPU-2-share-0": GrantInfo("g-1", 25, 20),
        "GPU-3-mig-1": GrantInfo("g-2", 0, 10, 1),
        "MIG-abc": GrantInfo("g-3", 0, 0, 1),
    }
    for now, interval in ((20.0, 1.0), (21.5, 1.0), (25.0, 0.0), (80.0, 10.0)):
        agree(cache, grant_of, now, interval, 1.7e9)
    agree(MetricsCache(), {}, 5.0, 1.0, 1.7e9)  # no reading at all
