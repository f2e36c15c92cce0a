"""build_stats: official names, XDM extras, share/MIG grants, summaries, stale marking, keys."""

from __future__ import annotations

import pytest

from nomad_plugin._proto.nomad import stats_pb2
from nomad_plugin.model.card import Inventory, MigInstance
from nomad_plugin.model.instances import Catalog, GroupKey, Instance, InstanceGroup, Kind
from nomad_plugin.stats.engine import GrantInfo, build_stats, decode_throttle, no_grants
from nomad_plugin.stats.feed import MetricsCache
from tests.doubles.stats_fakes import card, sample, whole_group

NOW = 10_000.0
OFFICIAL = {
    "Memory state",
    "GPU utilization",
    "Memory utilization",
    "Temperature",
    "Power usage",
    "ECC L1 errors",
    "ECC L2 errors",
    "ECC memory errors",
    "Encoder utilization",
    "Decoder utilization",
    "BAR1 buffer state",
}


class Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def full_card(cache: MetricsCache, device: str, grant: str = "") -> None:
    cache.update(
        [
            sample(device, "memory_used_mib", 2048),
            sample(device, "memory_total_mib", 81920),
            sample(device, "core_util_percent", 37.6),
            sample(device, "memory_util_percent", 12),
            sample(device, "temperature_c", 61),
            sample(device, "power_w", 312.4),
            sample(device, "power_limit_w", 700),
            sample(device, "ecc_sbe_total", 5),
            sample(device, "ecc_dbe_total", 1),
            sample(device, "xid_errors", 2),
            sample(device, "throttle_reasons", 0x4 | 0x40),
            sample(device, "nvlink_errors_total", 3),
            sample(device, "remapped_rows_total", 4),
            sample(device, "sm_clock_mhz", 1980),
            sample(device, "memory_clock_mhz", 2619),
            sample(device, "health", 1),
        ]
    )


def by_id(response, instance_id):  # type: ignore[no-untyped-def]
    for group in response.groups:
        if instance_id in group.instance_stats:
            return group.instance_stats[instance_id]
    raise KeyError(instance_id)


def num(value: stats_pb2.StatValue) -> tuple[int, int | None]:
    den = value.int_denominator_val.value if value.HasField("int_denominator_val") else None
    return value.int_numerator_val.value, den


def test_whole_card_official_names_and_xdm_extras(three_cards) -> None:  # type: ignore[no-untyped-def]
    catalog, inventory = three_cards
    cache = MetricsCache(clock=Clock(NOW))
    full_card(cache, "GPU-0")
    resp = build_stats(catalog, inventory, cache, no_grants, NOW, 1.0)
    st = by_id(resp, "GPU-0")
    attrs = st.stats.attributes
    assert OFFICIAL <= set(attrs)
    assert num(attrs["Memory state"]) == (2048, 81920) and attrs["Memory state"].unit == "MiB"
    assert num(attrs["GPU utilization"]) == (38, None) and attrs["GPU utilization"].unit == "%"
    assert num(attrs["Temperature"]) == (61, None) and attrs["Temperature"].unit == "C"
    # nomad-device-nvidia's meaning (1.1.0 on): the draw in mW over the draw in whole W; the limit is in xdm.
    assert num(attrs["Power usage"]) == (312400, 312) and attrs["Power usage"].unit == "W"
    power = st.stats.nested["xdm"].attributes
    assert num(power["Power draw"]) == (312, None) and num(power["Power limit"]) == (700, None)
    assert num(attrs["ECC memory errors"]) == (5, None)  # XDM: the corrected total, as the official kind
    assert "all locations" in attrs["ECC memory errors"].desc
    for name in ("Encoder utilization", "Decoder utilization", "BAR1 buffer state"):
        assert attrs[name].string_val.value == "N/A"  # XDM's exporter has no such reading
    assert attrs["ECC L1 errors"].string_val.value == "N/A" and attrs["ECC L1 errors"].unit == "#"
    xdm = st.stats.nested["xdm"].attributes
    assert xdm["Throttle reasons"].string_val.value == "sw_power_cap, hw_thermal"
    assert num(xdm["XID errors"]) == (2, None)
    assert num(xdm["NVLink errors"]) == (3, None)
    assert num(xdm["Remapped rows"]) == (4, None)
    assert num(xdm["ECC corrected errors"]) == (5, None)
    assert num(xdm["SM clock"]) == (1980, None) and xdm["SM clock"].unit == "MHz"
    assert xdm["Health"].bool_val.value is True
    assert st.summary == attrs["Memory state"]
    assert st.timestamp.seconds == int(NOW)
    assert "stale" not in attrs["Memory state"].desc


def test_device_named_by_minor_is_mapped_to_card(three_cards) -> None:  # type: ignore[no-untyped-def]
    catalog, inventory = three_cards
    cache = MetricsCache(clock=Clock(NOW))
    full_card(cache, "0")  # minor, not UUID
    st = by_id(build_stats(catalog, inventory, cache, no_grants, NOW, 1.0), "GPU-0")
    assert num(st.stats.attributes["Memory state"]) == (2048, 81920)


def test_missing_values_are_na_with_unit_and_total_from_inventory(three_cards) -> None:  # type: ignore[no-untyped-def]
    catalog, inventory = three_cards
    cache = MetricsCache(clock=Clock(NOW))
    cache.update([sample("GPU-0", "memory_used_mib", 100)])
    st = by_id(build_stats(catalog, inventory, cache, no_grants, NOW, 1.0), "GPU-0")
    attrs = st.stats.attributes
    assert num(attrs["Memory state"]) == (100, 81920)  # total from the inventory card
    for name, unit in [("Temperature", "C"), ("GPU utilization", "%"), ("Power usage", "W")]:
        assert attrs[name].string_val.value == "N/A"
        assert attrs[name].unit == unit
    assert st.stats.nested["xdm"].attributes["Throttle reasons"].string_val.value == "N/A"


def test_stale_values_are_marked_not_repeated_as_fresh(three_cards) -> None:  # type: ignore[no-untyped-def]
    catalog, inventory = three_cards
    clock = Clock(NOW)
    cache = MetricsCache(clock=clock)
    full_card(cache, "GPU-0")
    clock.t = NOW + 12.3
    cache.update([sample("GPU-0", "temperature_c", 70)])  # one fresh value
    resp = build_stats(catalog, inventory, cache, no_grants, NOW + 12.3, 1.0)
    attrs = by_id(resp, "GPU-0").stats.attributes
    assert attrs["Memory state"].desc.startswith("stale: last update 12.3 s ago")
    assert by_id(resp, "GPU-0").summary.desc.startswith("stale: last update 12.3 s ago")
    assert "stale" not in attrs["Temperature"].desc
    assert attrs["Stats age"].float_numerator_val.value == 0.0
    # two intervals is the threshold: 1.9 s old at a 1 s interval is fresh, at 0.5 s it is stale
    resp = build_stats(catalog, inventory, cache, no_grants, NOW + 12.3 + 1.9, 1.0)
    assert "stale" not in by_id(resp, "GPU-0").stats.attributes["Temperature"].desc
    resp = build_stats(catalog, inventory, cache, no_grants, NOW + 12.3 + 1.9, 0.5)
    assert by_id(resp, "GPU-0").stats.attributes["Temperature"].desc.startswith("stale: last update 1.9 s ago")


def test_no_data_at_all_gives_na_everywhere_and_timestamp_now(three_cards) -> None:  # type: ignore[no-untyped-def]
    catalog, inventory = three_cards
    resp = build_stats(catalog, inventory, MetricsCache(), no_grants, NOW, 1.0)
    st = by_id(resp, "GPU-0")
    assert st.stats.attributes["Memory state"].string_val.value == "N/A"
    assert st.stats.attributes["Stats age"].string_val.value == "N/A"
    assert st.summary.string_val.value == "N/A"
    assert st.timestamp.seconds == int(NOW)


def test_every_key_is_a_catalog_id_one_group_per_catalog_group(three_cards) -> None:  # type: ignore[no-untyped-def]
    catalog, inventory = three_cards
    cache = MetricsCache(clock=Clock(NOW))
    cache.update([sample("GPU-99", "temperature_c", 50)])  # a card not in the catalog
    resp = build_stats(catalog, inventory, cache, no_grants, NOW, 1.0)
    assert [(g.vendor, g.type, g.name) for g in resp.groups] == [
        (g.key.vendor, g.key.device_type, g.key.name) for g in catalog.groups
    ]
    keys = [k for g in resp.groups for k in g.instance_stats]
    assert sorted(keys) == sorted(catalog.all_ids())
    assert all(g.instance_stats[k].HasField("timestamp") for g in resp.groups for k in g.instance_stats)


def test_share_limits_beside_use_and_summary(three_cards) -> None:  # type: ignore[no-untyped-def]
    catalog, inventory = three_cards
    cache = MetricsCache(clock=Clock(NOW))
    full_card(cache, "1")
    cache.update(
        [
            sample("1", "memory_used_mib", 3000, grant="g-share"),
            sample("1", "core_util_percent", 22, grant="g-share"),
        ]
    )
    grants = {"GPU-1-share-0": GrantInfo("g-share", core_limit_percent=25, memory_limit_gib=20)}
    resp = build_stats(catalog, inventory, cache, grants.get, NOW, 1.0)
    granted = by_id(resp, "GPU-1-share-0")
    share = granted.stats.nested["share"].attributes
    assert share["Grant"].string_val.value == "g-share"
    assert num(share["Compute limit"]) == (25, None) and share["Compute limit"].unit == "%"
    assert num(share["Memory limit"]) == (20, None) and share["Memory limit"].unit == "GiB"
    assert num(share["Memory used"]) == (3000, None) and share["Memory used"].unit == "MiB"
    assert num(share["Compute utilization"]) == (22, None)
    assert num(granted.summary) == (3000, 20 * 1024) and granted.summary.unit == "MiB"
    # the card-wide official values are there too
    assert num(granted.stats.attributes["Memory state"]) == (2048, 81920)

    idle = by_id(resp, "GPU-1-share-1")
    assert idle.stats.nested["share"].attributes["Grant"].string_val.value == "none"
    assert num(idle.stats.nested["share"].attributes["Compute limit"]) == (25, None)  # what the share is worth
    assert num(idle.summary) == (0, 20 * 1024)
    assert idle.summary.desc == "not reserved"


def test_granted_share_without_grant_samples_is_na(three_cards) -> None:  # type: ignore[no-untyped-def]
    catalog, inventory = three_cards
    grants = {"GPU-1-share-2": GrantInfo("g2", 25, 20)}
    resp = build_stats(catalog, inventory, MetricsCache(), grants.get, NOW, 1.0)
    st = by_id(resp, "GPU-1-share-2")
    assert st.stats.nested["share"].attributes["Memory used"].string_val.value == "N/A"
    assert st.summary.string_val.value == "N/A" and st.summary.unit == "MiB"


def test_unlimited_share_is_allotted_the_whole_card() -> None:
    c = card(3, memory_mib=98304)
    inst = Instance("GPU-3-share-0", Kind.SHARE, c.uuid, 3, core=50, memory_gib=0)
    catalog = Catalog(groups=(InstanceGroup(GroupKey("nvidia", "gpu", "x"), (inst,)),))
    resp = build_stats(catalog, Inventory(cards=(c,)), MetricsCache(), no_grants, NOW, 1.0)
    assert num(by_id(resp, inst.id).summary) == (0, 98304)


def test_mig_units_slice_and_per_instance_metrics(three_cards) -> None:  # type: ignore[no-untyped-def]
    catalog, inventory = three_cards
    cache = MetricsCache(clock=Clock(NOW))
    cache.update([sample("GPU-2", "memory_used_mib", 4000, grant="g-mig")])
    grants = {"GPU-2-mig-3": GrantInfo("g-mig", memory_limit_gib=10, slices=1)}
    resp = build_stats(catalog, inventory, cache, grants.get, NOW, 1.0)
    st = by_id(resp, "GPU-2-mig-3")
    mig = st.stats.nested["mig"].attributes
    assert num(mig["Slice"]) == (3, None)
    assert num(mig["Slices"]) == (1, None)
    assert num(mig["Memory limit"]) == (10, None)
    assert num(mig["Memory used"]) == (4000, None)
    assert num(st.summary) == (4000, 10240)
    assert "share" not in st.stats.nested
    other = by_id(resp, "GPU-2-mig-0")
    assert num(other.summary) == (0, 10240)


def test_existing_mig_instance_from_nvml() -> None:
    mig = MigInstance(uuid="MIG-abc", profile="1g.10gb", slices=1, memory_mib=9856)
    c = card(4, mig=(mig,))
    inst = Instance("MIG-abc", Kind.MIG_INSTANCE, c.uuid, 4, slices=1, mig_uuid="MIG-abc")
    catalog = Catalog(groups=(InstanceGroup(GroupKey("nvidia", "gpu", "H100 1g.10gb"), (inst,)),))
    cache = MetricsCache(clock=Clock(NOW))
    cache.update([sample("MIG-abc", "memory_used_mib", 512), sample("GPU-4", "temperature_c", 40)])
    st = by_id(build_stats(catalog, Inventory(cards=(c,)), cache, no_grants, NOW, 1.0), "MIG-abc")
    assert num(st.summary) == (512, 9856)
    assert num(st.stats.nested["mig"].attributes["Memory used"]) == (512, None)
    assert num(st.stats.attributes["Temperature"]) == (40, None)  # the parent card's sensor


def test_whole_group_of_many_cards_reads_each_card() -> None:
    cards = tuple(card(i) for i in range(4))
    catalog = Catalog(groups=(whole_group(cards),))
    cache = MetricsCache(clock=Clock(NOW))
    cache.update([sample(str(i), "temperature_c", 50 + i) for i in range(4)])
    resp = build_stats(catalog, Inventory(cards=cards), cache, no_grants, NOW, 1.0)
    assert [num(by_id(resp, f"GPU-{i}").stats.attributes["Temperature"])[0] for i in range(4)] == [50, 51, 52, 53]


@pytest.mark.parametrize(
    ("mask", "names"),
    [
        (0, []),
        (0x1, ["gpu_idle"]),
        (0x4 | 0x8, ["sw_power_cap", "hw_slowdown"]),
        (0x80 | 0x1000, ["power_brake", "bit_0x1000"]),
    ],
)
def test_decode_throttle(mask: int, names: list[str]) -> None:
    assert decode_throttle(mask) == names


def test_nvml_readings_fill_every_official_stat(three_cards) -> None:  # type: ignore[no-untyped-def]
    """With NVML's readings the official plugin's stats carry its meanings (corrected ECC per location)."""
    catalog, inventory = three_cards
    cache = MetricsCache(clock=Clock(NOW))
    full_card(cache, "GPU-0")
    cache.update(
        [
            sample("GPU-0", "encoder_util_percent", 7),
            sample("GPU-0", "decoder_util_percent", 9),
            sample("GPU-0", "bar1_used_mib", 2),
            sample("GPU-0", "bar1_total_mib", 131072),
            sample("GPU-0", "ecc_l1_corrected", 1),
            sample("GPU-0", "ecc_l2_corrected", 2),
            sample("GPU-0", "ecc_memory_corrected", 3),
        ]
    )
    attrs = by_id(build_stats(catalog, inventory, cache, no_grants, NOW, 1.0), "GPU-0").stats.attributes
    assert num(attrs["Encoder utilization"]) == (7, None) and attrs["Encoder utilization"].unit == "%"
    assert num(attrs["Decoder utilization"]) == (9, None)
    assert num(attrs["BAR1 buffer state"]) == (2, 131072) and attrs["BAR1 buffer state"].unit == "MiB"
    assert [num(attrs[f"ECC {w} errors"])[0] for w in ("L1", "L2", "memory")] == [1, 2, 3]
    assert attrs["ECC memory errors"].desc == "Requested memory error counter for the device"  # the official's text
