"""build_catalog / check_modes: modes, names, attributes, topology, filters."""

from __future__ import annotations

from dataclasses import replace

import pytest

from nomad_plugin.config.model import CardRule, PluginConfig
from nomad_plugin.model.card import Card, Inventory, MigInstance
from nomad_plugin.model.instances import Attr, GroupKey, Kind
from nomad_plugin.nomad.catalog import build_catalog, check_modes, normalize_pci_bus_id

from .helpers import h800_node, m890p_node, ppu810e_node


def keys(catalog) -> list[str]:
    return [str(g.key) for g in catalog.groups]


def group(catalog, key: str):
    for g in catalog.groups:
        if str(g.key) == key:
            return g
    raise AssertionError(f"no group {key}; have {keys(catalog)}")


# --- whole cards ------------------------------------------------------------------


def test_whole_nvidia_is_drop_in_for_the_official_plugin():
    cat = build_catalog(h800_node(), PluginConfig())
    assert keys(cat) == ["nvidia/gpu/NVIDIA H800"]
    g = cat.groups[0]
    assert [i.id for i in g.instances] == [f"GPU-{i:08x}-aaaa-bbbb-cccc-000000000000" for i in range(8)]
    assert all(i.kind is Kind.WHOLE and i.core == 100 and i.memory_gib == 0 for i in g.instances)
    assert g.attributes["memory"] == Attr(81559, "MiB")
    assert g.attributes["driver_version"] == Attr("535.161.08")
    assert g.attributes["model"] == Attr("NVIDIA H800")
    assert g.attributes["vendor"] == Attr("nvidia")
    # node-wide network level by name, on the multi-card group
    assert g.attributes["leaf_switch"] == Attr("asw-007")
    assert g.attributes["topology.leafSwitch"] == Attr("asw-007")
    # per-card facts never on a multi-card group; differing domains dropped
    for key in ("minor", "uuid", "pci_bus_id", "topology.numaNodes", "topology.pcieSwitches", "numa_node"):
        assert key not in g.attributes


def test_whole_ppu_group_and_node_facts():
    cat = build_catalog(m890p_node(), PluginConfig())
    assert keys(cat) == ["alibaba/ppu/PPU M890P"]
    attrs = cat.groups[0].attributes
    assert attrs["memory"] == Attr(147456, "MiB")
    assert attrs["hyper_node"] == Attr("hypernode-001")
    assert attrs["leaf_switch"] == Attr("asw-001")
    assert attrs["point_of_delivery"] == Attr("pod-g13-p1")
    assert attrs["runtime_kit"] == Attr("enabled")
    assert attrs["xpu_type"] == Attr("ppu")


def test_pci_bus_id_normalised_for_nomad():
    assert normalize_pci_bus_id("00000000:3B:00.0") == "0000:3b:00.0"
    assert normalize_pci_bus_id("0000:3b:00.1") == "0000:3b:00.1"
    assert normalize_pci_bus_id("3B:00.0") == "0000:3b:00.0"
    assert normalize_pci_bus_id("00010000:01:00.0") == "10000:01:00.0"  # a VMD domain, as the kernel names it
    assert normalize_pci_bus_id("PCI slot 3") == normalize_pci_bus_id("") == ""  # no address rather than a wrong one
    cat = build_catalog(h800_node(2), PluginConfig())
    assert [i.pci_bus_id for i in cat.groups[0].instances] == ["0000:18:00.0", "0000:28:00.0"]


# --- tdm shares -------------------------------------------------------------------


def test_tdm_default_shares_one_group_per_card():
    inv = m890p_node(2)
    cat = build_catalog(inv, PluginConfig(default_mode="tdm", tdm_shares=10))
    assert keys(cat) == ["alibaba/ppu-share/PPU M890P card0", "alibaba/ppu-share/PPU M890P card1"]
    g = cat.groups[0]
    assert [i.id for i in g.instances] == [f"PPU-m890p-0000-share-{i}" for i in range(10)]
    assert {(i.core, i.memory_gib, i.kind) for i in g.instances} == {(10, 14, Kind.SHARE)}  # 144 GiB // 10
    assert g.attributes["share_core_percent"] == Attr(10)
    assert g.attributes["share_memory"] == Attr(14, "GiB")
    assert g.attributes["share_count"] == Attr(10)
    assert g.attributes["minor"] == Attr(0)
    assert g.attributes["uuid"] == Attr("PPU-m890p-0000")
    assert g.attributes["topology.numaNodes"] == Attr(0)
    assert g.attributes["topology.cpuSockets"] == Attr(0)
    assert g.attributes["hyper_node"] == Attr("hypernode-001")


@pytest.mark.parametrize(
    ("rule", "count", "core", "mem"),
    [
        (CardRule("1", "tdm", shares=4), 4, 25, 36),
        (CardRule("1", "tdm", share_percent=20), 5, 20, 28),
        (CardRule("1", "tdm"), 10, 10, 14),  # falls back to tdm_shares
    ],
)
def test_tdm_share_count_from_rule(rule, count, core, mem):
    cat = build_catalog(m890p_node(2), PluginConfig(cards=(rule,)))
    assert keys(cat) == ["alibaba/ppu/PPU M890P", "alibaba/ppu-share/PPU M890P card1"]
    shares = group(cat, "alibaba/ppu-share/PPU M890P card1").instances
    assert len(shares) == count
    assert {(i.core, i.memory_gib) for i in shares} == {(core, mem)}
    assert [i.id for i in group(cat, "alibaba/ppu/PPU M890P").instances] == ["PPU-m890p-0000"]


def test_nvidia_share_group_names_sort_by_minor():
    cat = build_catalog(h800_node(12), PluginConfig(default_mode="tdm"))
    assert keys(cat)[:3] == [
        "nvidia/gpu-share/NVIDIA H800 card0",
        "nvidia/gpu-share/NVIDIA H800 card1",
        "nvidia/gpu-share/NVIDIA H800 card2",
    ]
    assert keys(cat)[-1] == "nvidia/gpu-share/NVIDIA H800 card11"


def test_tdm_with_too_little_memory_falls_back_to_whole_and_is_reported():
    inv = h800_node(1, memory_mib=4096)  # 4 GiB, 10 shares
    cfg = PluginConfig(default_mode="tdm")
    assert keys(build_catalog(inv, cfg)) == ["nvidia/gpu/NVIDIA H800"]
    assert any("a share needs at least 1 GiB" in p for p in check_modes(inv, cfg))


# --- MIG --------------------------------------------------------------------------


def test_mig_units_on_mig_capable_model():
    inv = h800_node(2)
    cat = build_catalog(inv, PluginConfig(default_mode="mig"))
    assert keys(cat) == ["nvidia/gpu-mig/NVIDIA H800 card0", "nvidia/gpu-mig/NVIDIA H800 card1"]
    g = cat.groups[1]
    assert [i.id for i in g.instances] == [f"{inv.cards[1].uuid}-mig-{i}" for i in range(7)]
    # 81559 MiB -> 79 GiB; memory in eighths -> 9 GiB per unit
    assert {(i.kind, i.slices, i.memory_gib, i.core) for i in g.instances} == {(Kind.MIG, 1, 9, 0)}
    assert g.attributes["slice_units"] == Attr(7)
    assert g.attributes["slice_memory"] == Attr(9, "GiB")
    assert g.attributes["slice_sizes"] == Attr("1,2,3,4,7")
    assert check_modes(inv, PluginConfig(default_mode="mig")) == []


def test_mig_on_non_mig_model_is_rejected_and_advertised_whole():
    inv = h800_node(2, model="NVIDIA L20", memory_mib=46068)
    cfg = PluginConfig(cards=(CardRule("NVIDIA L20", "mig"),))
    assert keys(build_catalog(inv, cfg)) == ["nvidia/gpu/NVIDIA L20"]
    problems = check_modes(inv, cfg)
    assert len(problems) == 2
    assert all("not MIG-capable" in p and "NVIDIA L20" in p for p in problems)


def test_mig_capable_flag_or_model_substring():
    card = h800_node(1, model="Mystery X").cards[0]
    inv = Inventory(cards=(replace(card, mig_capable=True),))
    assert keys(build_catalog(inv, PluginConfig(default_mode="mig"))) == ["nvidia/gpu-mig/Mystery X card0"]
    cfg = PluginConfig(default_mode="mig", mig_models=("mystery",))
    assert keys(build_catalog(h800_node(1, model="Mystery X"), cfg)) == ["nvidia/gpu-mig/Mystery X card0"]


def test_existing_mig_instances_follow_the_official_plugin():
    card = h800_node(1, model="NVIDIA A100-SXM4-80GB", memory_mib=81920).cards[0]
    migs = (
        MigInstance("MIG-aaaa", "3g.40gb", 3, 40192),
        MigInstance("MIG-bbbb", "3g.40gb", 3, 40192),
    )
    cat = build_catalog(Inventory(cards=(replace(card, mig_instances=migs),)), PluginConfig())
    assert keys(cat) == ["nvidia/gpu/NVIDIA A100-SXM4-80GB MIG 3g.40gb"]
    g = cat.groups[0]
    assert [i.id for i in g.instances] == ["MIG-aaaa", "MIG-bbbb"]
    assert all(i.kind is Kind.MIG_INSTANCE and i.mig_uuid == i.id for i in g.instances)
    assert g.attributes["memory"] == Attr(40192, "MiB")


# --- rule precedence and conflicts ---------------------------------------------------


def test_rule_precedence_uuid_over_minor_over_model():
    inv = h800_node(3)
    uuid0 = inv.cards[0].uuid
    cfg = PluginConfig(
        cards=(
            CardRule("NVIDIA H800", "mig"),
            CardRule("0", "tdm", shares=2),
            CardRule(uuid0, "whole"),
            CardRule("1", "tdm", shares=5),
        )
    )
    cat = build_catalog(inv, cfg)
    assert keys(cat) == [
        "nvidia/gpu/NVIDIA H800",
        "nvidia/gpu-mig/NVIDIA H800 card2",
        "nvidia/gpu-share/NVIDIA H800 card1",
    ]
    assert [i.id for i in group(cat, "nvidia/gpu/NVIDIA H800").instances] == [uuid0]
    assert len(group(cat, "nvidia/gpu-share/NVIDIA H800 card1").instances) == 5
    problems = check_modes(inv, cfg)
    assert len(problems) == 1 and "card 0" in problems[0] and "conflicting card rules" in problems[0]


def test_duplicate_model_rules_with_different_modes_are_reported():
    cfg = PluginConfig(cards=(CardRule("NVIDIA H800", "tdm"), CardRule("NVIDIA H800", "mig")))
    problems = check_modes(h800_node(1), cfg)
    assert problems and "conflicting card rules" in problems[0]
    assert keys(build_catalog(h800_node(1), cfg)) == ["nvidia/gpu-share/NVIDIA H800 card0"]


def test_model_rule_with_card_exception_is_not_a_conflict():
    cfg = PluginConfig(cards=(CardRule("NVIDIA H800", "mig"), CardRule("3", "whole")))
    assert check_modes(h800_node(4), cfg) == []


def test_one_mode_per_card_never_tdm_and_mig_together():
    inv = h800_node(4)
    cfg = PluginConfig(default_mode="mig", cards=(CardRule("1", "tdm"),))
    per_card: dict[str, set[Kind]] = {}
    for g in build_catalog(inv, cfg).groups:
        for i in g.instances:
            per_card.setdefault(i.card_uuid, set()).add(i.kind)
    assert all(len(kinds) == 1 for kinds in per_card.values())


# --- grouping by topology -----------------------------------------------------------


def test_group_by_numa_on_810e_seed_topology():
    cat = build_catalog(ppu810e_node(), PluginConfig(group_by="numaNodes"))
    assert keys(cat) == ["alibaba/ppu/PPU 810E numa1", "alibaba/ppu/PPU 810E numa0"]
    numa1 = cat.groups[0]
    assert [i.minor for i in numa1.instances] == [0, 1, 2, 3, 8, 9, 10, 11]
    assert numa1.attributes["topology.numaNodes"] == Attr(1)
    assert numa1.attributes["leaf_switch"] == Attr("ASW-VM-SQA-G10-P2-S25")
    assert numa1.attributes["point_of_delivery"] == Attr("VM-SQA-G10-P2")
    assert "hyper_node" not in numa1.attributes  # 810E has no hyperNode level
    assert "topology.pcieSwitches" not in numa1.attributes  # differs inside the domain
    assert numa1.attributes["driver_version"] == Attr("2.0.1")  # from Inventory.node


def test_810e_per_card_topology_by_name_not_number():
    cat = build_catalog(ppu810e_node(1), PluginConfig(default_mode="tdm"))
    attrs = cat.groups[0].attributes
    assert attrs["topology.icnLink2"] == Attr(0)
    assert attrs["topology.pcieSwitches"] == Attr(4)  # level 4 on 810E, level 1 on M890P
    assert attrs["topology.numaNodes"] == Attr(1)
    assert attrs["topology.cpuSockets"] == Attr(0)


def test_group_by_alias_and_pcie_on_m890p():
    cat = build_catalog(m890p_node(), PluginConfig(group_by="numa"))
    assert keys(cat) == [f"alibaba/ppu/PPU M890P numa{d}" for d in range(4)]
    cat = build_catalog(m890p_node(), PluginConfig(group_by="pcieSwitches"))
    assert keys(cat)[0] == "alibaba/ppu/PPU M890P pcie0"
    assert cat.groups[0].attributes["topology.pcieSwitches"] == Attr(0)
    assert cat.groups[0].attributes["topology.cpuSockets"] == Attr(0)


def test_group_by_unknown_level_falls_back_and_is_reported():
    inv = m890p_node()
    cfg = PluginConfig(group_by="rack9")
    assert keys(build_catalog(inv, cfg)) == ["alibaba/ppu/PPU M890P"]
    assert any("group_by 'rack9'" in p for p in check_modes(inv, cfg))


def test_group_by_only_affects_whole_cards():
    cfg = PluginConfig(group_by="numaNodes", cards=(CardRule("0", "tdm"),))
    assert keys(build_catalog(h800_node(), cfg)) == [
        "nvidia/gpu/NVIDIA H800 numa0",
        "nvidia/gpu/NVIDIA H800 numa1",
        "nvidia/gpu-share/NVIDIA H800 card0",
    ]


# --- filters ------------------------------------------------------------------------


def test_ignored_ids_by_uuid_or_minor():
    inv = h800_node(4)
    cfg = PluginConfig(ignored_ids=(inv.cards[1].uuid.lower(), "3"))
    assert [i.minor for i in build_catalog(inv, cfg).groups[0].instances] == [0, 2]


def test_vendor_and_type_filters():
    mixed = Inventory(cards=h800_node(2).cards + tuple(replace(c, minor=c.minor + 10) for c in m890p_node(2).cards))
    assert keys(build_catalog(mixed, PluginConfig())) == ["alibaba/ppu/PPU M890P", "nvidia/gpu/NVIDIA H800"]
    assert keys(build_catalog(mixed, PluginConfig(include_vendors=("NVIDIA",)))) == ["nvidia/gpu/NVIDIA H800"]
    assert keys(build_catalog(mixed, PluginConfig(exclude_vendors=("nvidia",)))) == ["alibaba/ppu/PPU M890P"]
    assert keys(build_catalog(mixed, PluginConfig(include_types=("ppu",)))) == ["alibaba/ppu/PPU M890P"]
    assert keys(build_catalog(mixed, PluginConfig(exclude_types=("ppu",)))) == ["nvidia/gpu/NVIDIA H800"]


# --- identity and determinism ---------------------------------------------------------


def test_ids_stable_across_rebuilds_and_order():
    inv = h800_node()
    cfg = PluginConfig(cards=(CardRule("1", "tdm"), CardRule("2", "mig")))
    first = build_catalog(inv, cfg)
    shuffled = replace(inv, cards=tuple(reversed(inv.cards)), generation=99)
    again = build_catalog(shuffled, cfg)
    assert first == again
    assert "GPU-00000001-aaaa-bbbb-cccc-000000000000-share-9" in first.all_ids()
    assert "GPU-00000002-aaaa-bbbb-cccc-000000000000-mig-6" in first.all_ids()


def test_group_keys_unique_even_with_duplicate_minors():
    inv = h800_node(2)
    broken = Inventory(cards=(inv.cards[0], replace(inv.cards[1], minor=0)))
    cat = build_catalog(broken, PluginConfig(default_mode="tdm"))
    assert len({g.key for g in cat.groups}) == len(cat.groups) == 2
    assert any("duplicate minor" in p for p in check_modes(broken, PluginConfig()))


def test_cards_without_uuid_or_with_duplicate_uuid_are_skipped():
    inv = h800_node(2)
    broken = Inventory(
        cards=(inv.cards[0], replace(inv.cards[1], uuid=inv.cards[0].uuid), replace(inv.cards[1], uuid="", minor=5))
    )
    cat = build_catalog(broken, PluginConfig())
    assert cat.all_ids() == {inv.cards[0].uuid}
    problems = check_modes(broken, PluginConfig())
    assert any("duplicate UUID" in p for p in problems) and any("no UUID" in p for p in problems)


def test_official_extra_attributes_pass_through_with_units():
    card = replace(h800_node(1).cards[0], extra={"power": "700", "cores_clock": "1980", "pci_bandwidth": "x"})
    attrs = build_catalog(Inventory(cards=(card,)), PluginConfig()).groups[0].attributes
    assert attrs["power"] == Attr(700, "W")
    assert attrs["cores_clock"] == Attr(1980, "MHz")
    assert "pci_bandwidth" not in attrs  # unparseable numbers are left out
    # older unit-suffixed keys map to the same names; a power *limit* is never `power` (a draw there)
    card = replace(
        h800_node(1).cards[0],
        extra={"power_limit_w": "700", "pci_bandwidth_mbps": "63015", "compute_capability": "9.0", "topology": "{}"},
    )
    attrs = build_catalog(Inventory(cards=(card,)), PluginConfig()).groups[0].attributes
    assert "power" not in attrs and attrs["power_limit"] == Attr(700, "W")
    assert attrs["pci_bandwidth"] == Attr(63015, "MB/s")
    assert attrs["compute_capability"] == Attr(9.0)  # a float, as Nomad reads a job's value = "8.0"
    assert "topology" not in attrs


def test_gpu_feature_discovery_attributes_have_the_types_jobs_compare_with():
    card = replace(
        h800_node(1).cards[0],
        sdk_version="12.2",
        extra={"compute_capability": "9.0", "architecture": "hopper", "mig_capable": "false"},
    )
    attrs = build_catalog(Inventory(cards=(card,)), PluginConfig()).groups[0].attributes
    assert attrs["compute_capability"] == Attr(9.0)
    assert attrs["architecture"] == Attr("hopper")
    assert attrs["mig_capable"] == Attr(False)  # NVML's reading wins over the card's flag
    assert attrs["cuda_driver_version"] == Attr("12.2")
    # A two-digit minor would not order as a float: it stays a string (compare it with operator = "version").
    odd = replace(card, extra={"compute_capability": "8.10"})
    assert build_catalog(Inventory(cards=(odd,)), PluginConfig()).groups[0].attributes["compute_capability"] == Attr(
        "8.10"
    )
    # A PPU's SDK version is no CUDA version.
    ppu = replace(card, vendor="alibaba", xpu_type="ppu", model="PPU M890P", extra={})
    assert "cuda_driver_version" not in build_catalog(Inventory(cards=(ppu,)), PluginConfig()).groups[0].attributes


def test_empty_inventory_gives_empty_catalog():
    assert build_catalog(Inventory(), PluginConfig(group_by="numa")).groups == ()
    assert check_modes(Inventory(), PluginConfig(group_by="numa")) == []


def test_group_key_str():
    assert str(GroupKey("nvidia", "gpu", "NVIDIA H800")) == "nvidia/gpu/NVIDIA H800"


def test_unknown_model_name_and_vendor():
    card = Card(minor=0, uuid="X-1", model="", vendor="", xpu_type="", memory_mib=0)
    assert keys(build_catalog(Inventory(cards=(card,)), PluginConfig())) == ["unknown/xpu/N/A"]


def test_multi_value_domain_is_text_single_value_is_int():
    from nomad_plugin.model.card import parse_topology

    topo = parse_topology(
        '{"levels": [{"level": 1, "name": "numaNodes", "topo1": [0, 1]},'
        '{"level": 2, "name": "cpuSockets", "topo2": [1]}]}'
    )
    card = replace(h800_node(1).cards[0], topology=topo)
    attrs = build_catalog(Inventory(cards=(card,)), PluginConfig(default_mode="tdm")).groups[0].attributes
    assert attrs["topology.numaNodes"] == Attr("0,1")
    assert attrs["topology.cpuSockets"] == Attr(1)
    assert keys(build_catalog(Inventory(cards=(card,)), PluginConfig(group_by="numa"))) == [
        "nvidia/gpu/NVIDIA H800 numa0-1"
    ]
