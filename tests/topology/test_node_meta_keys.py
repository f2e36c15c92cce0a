"""The node metadata keys (model/card.py), against the simulator's own topology JSON.

The oracle reads each profile's per-card topology JSON with ``json`` and a
hand-written name table, not with the plugin's parser or its snake_case
function, so a shared mistake cannot pass.
"""

from __future__ import annotations

import json
from dataclasses import replace

import hcl2
import pytest

from nomad_plugin.config.decode import decode_config
from nomad_plugin.config.model import ConfigError, PluginConfig
from nomad_plugin.launcher.config import full_config, msgpack_config
from nomad_plugin.model.card import (
    Card,
    Inventory,
    client_meta_block,
    level_key,
    meta_changes,
    node_meta,
    parse_topology,
)
from nomad_plugin.sim.profiles import PROFILES, build_cards

#: XDM level names of the simulator's string levels -> the meta key the issue names.
SNAKE = {
    "leafSwitch": "leaf_switch",
    "pointOfDelivery": "point_of_delivery",
    "hyperNode": "hyper_node",
    "rack2": "rack2",
}


def expected_keys(profile: str, variant: str = "normal", prefix: str = "lingjun.") -> dict[str, str]:
    """What the issue asks for, read straight from the simulator's topology JSON."""
    cards = build_cards(PROFILES[profile], variant)
    values: dict[str, set[str]] = {}
    for card in cards:
        for level in json.loads(card.topology_json)["levels"]:
            value = level[f"topo{level['level']}"]
            if isinstance(value, str):
                values.setdefault(SNAKE[level["name"]], set()).add(value)
    out = {f"{prefix}{k}": ",".join(sorted(v)) for k, v in values.items()}
    out[f"{prefix}model"] = cards[0].model
    out[f"{prefix}card_count"] = str(len(cards))
    out[f"{prefix}runtime_kit"] = "enabled"
    return out


def sim_inventory(profile: str, variant: str = "normal") -> Inventory:
    cards = tuple(
        Card(
            minor=c.minor,
            uuid=c.uuid,
            model=c.model,
            vendor=c.vendor,
            xpu_type=c.xpu_type,
            memory_mib=c.memory_mib,
            topology=parse_topology(c.topology_json),
        )
        for c in build_cards(PROFILES[profile], variant)
    )
    return Inventory(cards=cards, node={"runtime_kit": "enabled"})


@pytest.mark.parametrize("variant", ["normal", "extra-level"])
@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_keys_equal_the_simulators_topology_json(profile: str, variant: str) -> None:
    found = node_meta(sim_inventory(profile, variant), PluginConfig())
    assert dict(found.keys) == expected_keys(profile, variant)
    assert not found.problems


def test_h800_sits_behind_two_leaf_switches_joined_for_set_contains() -> None:
    keys = node_meta(sim_inventory("h800-8"), PluginConfig()).keys
    assert keys["lingjun.leaf_switch"] == "asw-001,asw-002"
    assert keys["lingjun.point_of_delivery"] == "pod-a01-p1"
    assert "lingjun.hyper_node" not in keys  # the NVIDIA shape has no hyper node level


def test_filtered_cards_do_not_count_and_a_disabled_plugin_offers_none() -> None:
    inventory = sim_inventory("h800-8")
    four = [c.uuid for c in inventory.cards[4:]]  # the asw-002 half
    keys = node_meta(inventory, PluginConfig(ignored_ids=tuple(four))).keys
    assert keys["lingjun.card_count"] == "4" and keys["lingjun.leaf_switch"] == "asw-001"
    off = node_meta(inventory, PluginConfig(enabled=False)).keys
    assert off == {"lingjun.card_count": "0", "lingjun.runtime_kit": "enabled"}


def test_prefix_and_mixed_models() -> None:
    inventory = sim_inventory("h800-8")
    cards = (*inventory.cards[:7], replace(inventory.cards[7], model="NVIDIA H20"))
    keys = node_meta(replace(inventory, cards=cards), PluginConfig(node_meta_prefix="site.xdm.")).keys
    assert keys["site.xdm.model"] == "NVIDIA H20,NVIDIA H800"
    assert all(k.startswith("site.xdm.") for k in keys)


def test_level_names_become_snake_case_identifiers_or_are_left_out() -> None:
    assert [level_key(n) for n in ("leafSwitch", "pointOfDelivery", "hyperNode", "rack-id", "ICNLink")] == [
        "leaf_switch",
        "point_of_delivery",
        "hyper_node",
        "rack_id",
        "icn_link",
    ]
    topo = json.dumps({"levels": [{"level": 30, "name": "9th-floor", "topo30": "x"}]})
    card = Card(0, "GPU-0", "m", "nvidia", "gpu", 1024, topology=parse_topology(topo))
    found = node_meta(Inventory(cards=(card,)), PluginConfig())
    assert "9th-floor" in found.problems[0] and not any("floor" in k for k in found.keys)
    clash = json.dumps({"levels": [{"level": 30, "name": "model", "topo30": "x"}]})
    card = replace(card, topology=parse_topology(clash))
    found = node_meta(Inventory(cards=(card,)), PluginConfig())
    assert found.keys["lingjun.model"] == "m" and "summary key" in found.problems[0]


def test_an_inventory_without_any_topology_says_so() -> None:
    inventory = sim_inventory("h800-8")
    bare = replace(inventory, cards=tuple(replace(c, topology=parse_topology(None)) for c in inventory.cards))
    assert node_meta(inventory, PluginConfig()).topology_known is True
    found = node_meta(bare, PluginConfig())
    assert found.topology_known is False and "lingjun.leaf_switch" not in found.keys


def test_no_runtime_kit_key_without_a_status() -> None:
    inventory = replace(sim_inventory("l20-8"), node={})
    assert "lingjun.runtime_kit" not in node_meta(inventory, PluginConfig()).keys


def test_changes_write_only_what_differs_and_unset_only_under_the_prefix() -> None:
    current = {
        "connect.log_level": "info",
        "lingjun.card_count": "8",
        "lingjun.hyper_node": "hypernode-001",
        "lingjun.leaf_switch": "asw-001",
        "lingjunx.other": "kept",
        "rack": "r1",
    }
    wanted = {"lingjun.card_count": "8", "lingjun.leaf_switch": "asw-002", "lingjun.model": "M"}
    assert meta_changes(wanted, current, "lingjun.") == {
        "lingjun.hyper_node": None,
        "lingjun.leaf_switch": "asw-002",
        "lingjun.model": "M",
    }
    assert meta_changes(wanted, {**current, **wanted, "lingjun.hyper_node": "x"}, "lingjun.") == {
        "lingjun.hyper_node": None
    }
    assert meta_changes(wanted, {**wanted}, "lingjun.") == {}
    # Before XDM's first push no card has a topology: level keys are kept, summary keys still follow.
    stale = {"lingjun.leaf_switch": "asw-001", "lingjun.model": "M", "lingjun.runtime_kit": "enabled"}
    assert meta_changes({"lingjun.model": "M"}, stale, "lingjun.", topology_known=False) == {
        "lingjun.runtime_kit": None
    }


def test_client_meta_block_parses_back_to_the_keys() -> None:
    keys = dict(node_meta(sim_inventory("m890p-8"), PluginConfig()).keys)
    keys["lingjun.odd"] = 'a "quoted" \\ value'
    text = client_meta_block(keys)
    parsed = hcl2.loads(text)
    meta = parsed["client"][0]["meta"]
    unquoted = {k.strip('"'): v for k, v in meta.items() if not k.startswith("__")}
    assert {k: v[1:-1].replace('\\"', '"').replace("\\\\", "\\") for k, v in unquoted.items()} == keys


@pytest.mark.parametrize("prefix", ["lingjun.", "site.lingjun.", "a-b_c."])
def test_prefix_option_accepts_dotted_identifiers(prefix: str) -> None:
    config = decode_config(msgpack_config(full_config({"node_meta": True, "node_meta_prefix": prefix})))
    assert config.node_meta is True and config.node_meta_prefix == prefix


@pytest.mark.parametrize(
    "prefix", ["", "lingjun", ".lingjun.", "lingjun..", "9x.", "ling jun.", "lj*.", "x" * 70 + "."]
)
def test_prefix_option_refuses_what_nomad_would_refuse(prefix: str) -> None:
    with pytest.raises(ConfigError, match='"node_meta_prefix"'):
        decode_config(msgpack_config(full_config({"node_meta_prefix": prefix})))
